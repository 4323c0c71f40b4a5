"""kohakuclip.gulp.transforms: geometry on coordinate-coded frames, determinism, same geometry
on every frame of a clip."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from kohakuclip.gulp.transforms import (
    CenterCrop,
    Compose,
    ComposeVideo,
    JitterCrop,
    JitterCropVideo,
    Normalize,
    RandHorFlipVideo,
    RandomCrop,
    RandomCropVideo,
    RandVerFlipVideo,
    Scale,
    UnitNorm,
)


def coded_clip(t: int = 5, h: int = 60, w: int = 100) -> list[np.ndarray]:
    """Pixel (y, x) of frame i holds (y, x, i): a crop tells where it came from."""
    yy, xx = np.mgrid[0:h, 0:w]
    return [np.dstack([yy, xx, np.full((h, w), i)]).astype(np.uint8) for i in range(t)]


def window_of(crop: np.ndarray) -> tuple[int, int, int, int]:
    """(x, y, w, h) of a crop of a coded frame, checking it is one contiguous window."""
    y0, x0 = int(crop[0, 0, 0]), int(crop[0, 0, 1])
    h, w = crop.shape[:2]
    yy, xx = np.mgrid[y0 : y0 + h, x0 : x0 + w]
    assert np.array_equal(crop[:, :, 0], yy) and np.array_equal(crop[:, :, 1], xx)
    return x0, y0, w, h


def test_scale():
    image = coded_clip(1)[0]  # 60 x 100
    assert Scale(30)(image).shape == (30, 50, 3)
    assert Scale(30)(image.transpose(1, 0, 2)).shape == (50, 30, 3)
    assert Scale((40, 20))(image).shape == (20, 40, 3)  # (w, h), as in GulpIO
    assert Scale(60)(image) is image
    smooth = cv2.GaussianBlur(
        np.random.default_rng(0).integers(0, 255, (60, 100, 3), np.uint8), (9, 9), 3
    )
    np.testing.assert_array_equal(
        Scale(30)(smooth), cv2.resize(smooth, (50, 30), interpolation=cv2.INTER_AREA)
    )
    for side, out_w in ((120, 200), (45, 75)):  # enlarging, or shrinking by less than half
        np.testing.assert_array_equal(
            Scale(side)(smooth), cv2.resize(smooth, (out_w, side), interpolation=cv2.INTER_LINEAR)
        )


def test_center_crop():
    image = coded_clip(1)[0]
    assert window_of(CenterCrop(40)(image)) == (30, 10, 40, 40)
    assert window_of(CenterCrop((30, 20))(image)) == (35, 20, 30, 20)
    small = CenterCrop(80)(image)  # 60 x 100 is enlarged to cover 80 x 80 first
    assert small.shape == (80, 80, 3)


def test_random_crop_windows_cover_the_frame_and_repeat_with_the_seed():
    image = coded_clip(1)[0]
    crop = RandomCrop(32)
    windows = {window_of(crop(image, rng=np.random.default_rng(s))) for s in range(200)}
    xs, ys = {w[0] for w in windows}, {w[1] for w in windows}
    assert min(xs) >= 0 and max(xs) <= 68 and min(ys) >= 0 and max(ys) <= 28
    assert len(xs) > 30 and len(ys) > 15
    same = [window_of(RandomCrop(32, seed=5)(image)) for _ in range(2)]
    assert same[0] == same[1]
    own = RandomCrop(32, seed=5)
    assert [window_of(own(image)) for _ in range(3)] != [same[0]] * 3  # its generator advances
    padded = RandomCrop((110, 70), padding=5)(image, rng=np.random.default_rng(1))
    assert padded.shape == (70, 110, 3)
    assert (padded[:, :, 2] == 0).all() and padded.sum() > 0
    with pytest.raises(ValueError, match="larger"):
        RandomCrop(61)(coded_clip(1, h=60, w=60)[0])


@pytest.mark.parametrize("as_array", [False, True])
def test_video_crops_use_one_window_for_every_frame(as_array):
    clip = coded_clip()
    data = np.stack(clip) if as_array else clip
    for transform in (RandomCropVideo(24), JitterCropVideo((16, 24, 40))):
        for seed in range(20):
            out = transform(data, rng=np.random.default_rng(seed))
            assert isinstance(out, np.ndarray) == as_array and len(out) == 5
            windows = {window_of(f) for f in out}
            assert len(windows) == 1
            assert [int(f[0, 0, 2]) for f in out] == list(range(5))
            if isinstance(transform, JitterCropVideo):
                _, _, w, h = windows.pop()
                assert w in (16, 24, 40) and h in (16, 24, 40)


def test_jitter_crop_sizes_and_caps():
    image = coded_clip(1, h=30, w=50)[0]
    sizes = {
        window_of(JitterCrop((20, 40))(image, rng=np.random.default_rng(s)))[2:] for s in range(40)
    }
    assert sizes == {(20, 20), (40, 20), (20, 30), (40, 30)}  # 40 high is capped at 30


def test_flips():
    clip = coded_clip()
    always = RandHorFlipVideo(p=1.0)(clip)
    assert all(np.array_equal(a, b[:, ::-1]) for a, b in zip(always, clip, strict=True))
    assert RandHorFlipVideo(p=0.0)(clip) is clip
    upside = RandVerFlipVideo(p=1.0)(np.stack(clip))
    assert np.array_equal(upside, np.stack(clip)[:, ::-1])
    outcomes = []
    for seed in range(40):
        out = RandHorFlipVideo()(clip, rng=np.random.default_rng(seed))
        flipped = [int(f[0, 0, 1]) == 99 for f in out]
        assert len(set(flipped)) == 1  # all frames or none
        outcomes.append(flipped[0])
    assert 5 < sum(outcomes) < 35


def test_compose_video_gives_random_image_transforms_one_geometry():
    clip = coded_clip()
    transform = ComposeVideo([RandomCrop(30), Scale(15)], [RandHorFlipVideo(p=1.0)])
    for seed in range(10):
        out = transform(clip, rng=np.random.default_rng(seed))
        assert all(f.shape == (15, 15, 3) for f in out)
        assert all(np.array_equal(f[:, :, :2], out[0][:, :, :2]) for f in out)
    first = transform(clip, rng=np.random.default_rng(3))
    second = transform(clip, rng=np.random.default_rng(3))
    assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))


def test_compose_and_normalisation():
    image = coded_clip(1)[0]
    pipeline = Compose([Scale(30), CenterCrop(28), UnitNorm()])
    out = pipeline(image)
    assert out.shape == (28, 28, 3) and out.dtype == np.float32
    assert abs(float(out.mean())) < 1e-5 and abs(float(out.std()) - 1) < 1e-3
    norm = Normalize(mean=(10, 20, 30), std=(2, 4, 5))(image)
    assert norm.dtype == np.float32
    np.testing.assert_allclose(norm[7, 9], [(7 - 10) / 2, (9 - 20) / 4, (0 - 30) / 5])
    listed = Normalize((0, 0, 0), (1, 1, 1))(coded_clip(2))
    assert isinstance(listed, list) and len(listed) == 2
    assert [float(np.mean(x)) for x in UnitNorm()(coded_clip(2))] == pytest.approx([0, 0], abs=1e-5)
    plain_callable = Compose([lambda x: x[:10]])
    assert plain_callable(image).shape == (10, 100, 3)

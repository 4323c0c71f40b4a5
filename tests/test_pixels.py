"""PixelWriter's rgb path: the numba conversion against numpy (planes resized by the shared filter,
which tests/test_resize.py checks against Pillow), the fused 2x box against exact means and
OpenCV's area filter, flips against numpy flips, and the fallbacks for views and odd crops; RGB
pictures in every mode against the resize and OpenCV's conversion and area filter composed."""

from __future__ import annotations

import av
import cv2
import numpy as np
import pytest

from kohakuclip.decode._resize import resize
from kohakuclip.decode.pixels import Crop, PixelWriter, frame_planes, yuv_to_rgb_matrix

S = 32
COLOURS = [("bt601", False), ("bt709", False), ("bt601", True), ("bt709", True)]


def _planes(rng: np.random.Generator, h: int, w: int, pad: int = 0) -> tuple[np.ndarray, ...]:
    """Random 4:2:0 planes with ``pad`` bytes of line padding (like a decoder's frames)."""
    ch, cw = (h + 1) // 2, (w + 1) // 2
    return (
        rng.integers(0, 256, (h, w + pad), dtype=np.uint8),
        rng.integers(0, 256, (ch, cw + pad), dtype=np.uint8),
        rng.integers(0, 256, (ch, cw + pad), dtype=np.uint8),
    )


def _box2(plane: np.ndarray) -> np.ndarray:
    """Exact float means of 2x2 boxes."""
    p = plane.astype(np.float64)
    return (p[0::2, 0::2] + p[0::2, 1::2] + p[1::2, 0::2] + p[1::2, 1::2]) / 4


def _numpy_rgb(y: np.ndarray, u: np.ndarray, v: np.ndarray, colour: tuple[str, bool]) -> np.ndarray:
    """Planes already at the output size, converted in float64 with the same matrix."""
    m = yuv_to_rgb_matrix(*colour).astype(np.float64)
    yuv1 = np.stack([y, u, v, np.ones(y.shape)]).astype(np.float64)
    return np.clip(np.rint(np.einsum("ij,jhw->ihw", m, yuv1)), 0, 255).astype(np.uint8)


def _write(planes: tuple[np.ndarray, ...], crop: Crop, colour=("bt709", False), h=False, v=False):
    out = np.empty((3, S, S), np.uint8)
    PixelWriter(S).write(planes, crop, h, v, colour[0], colour[1], out)
    return out


@pytest.mark.parametrize("colour", COLOURS)
def test_conversion_matches_numpy_on_a_luma_window_of_the_output_size(
    colour: tuple[str, bool],
) -> None:
    rng = np.random.default_rng(0)
    y, u, v = _planes(rng, S, 2 * S, pad=16)
    got = _write((y, u, v), Crop(10, 0, S, S), colour)
    # luma is read in place; chroma (half the window) is upscaled by the shared filter first
    upscaled = [resize(c[: S // 2, 5 : 5 + S // 2], S, S) for c in (u, v)]
    want = _numpy_rgb(y[:, 10 : 10 + S], upscaled[0], upscaled[1], colour)
    assert np.abs(got.astype(int) - want).max() <= 1


@pytest.mark.parametrize("colour", COLOURS)
def test_fused_2x_box_matches_numpy_and_opencv_area_resize(colour: tuple[str, bool]) -> None:
    rng = np.random.default_rng(1)
    y, u, v = _planes(rng, 2 * S, 3 * S, pad=8)
    crop = Crop(12, 0, 2 * S, 2 * S)  # luma exactly twice the output, chroma exactly the output
    got = _write((y, u, v), crop, colour)
    chroma = u[:S, 6 : 6 + S], v[:S, 6 : 6 + S]
    exact = _numpy_rgb(_box2(y[:, 12 : 12 + 2 * S]), *chroma, colour)
    assert np.abs(got.astype(int) - exact).max() <= 1
    assert (got != exact).mean() < 0.01  # float32 rounding only
    # OpenCV's area filter rounds the box means to integers first: within one step of that too
    luma = cv2.resize(y[:, 12 : 12 + 2 * S], (S, S), interpolation=cv2.INTER_AREA)
    assert np.abs(got.astype(int) - _numpy_rgb(luma, *chroma, colour)).max() <= 1


@pytest.mark.parametrize("side", [2 * S, S, 3 * S + 6])
@pytest.mark.parametrize(("hflip", "vflip"), [(True, False), (False, True), (True, True)])
def test_flips_are_numpy_flips_of_the_unflipped_output(side: int, hflip: bool, vflip: bool) -> None:
    rng = np.random.default_rng(2)
    planes = _planes(rng, side, side + 20, pad=4)
    crop = Crop(8, 0, side, side)
    plain = _write(planes, crop)
    flipped = _write(planes, crop, h=hflip, v=vflip)
    want = plain[:, ::-1] if vflip else plain
    want = want[:, :, ::-1] if hflip else want
    np.testing.assert_array_equal(flipped, want)


def test_views_and_odd_crops_take_the_general_path_with_the_same_result() -> None:
    rng = np.random.default_rng(3)
    y, u, v = _planes(rng, 2 * S, 2 * S + 10, pad=6)
    crop = Crop(4, 0, 2 * S, 2 * S)
    fused = _write((y, u, v), crop)
    # strided views (not C-contiguous) go through the shared filter's 2x box: within rounding
    views = _write((y[:, : 2 * S + 10], u[:, : S + 5], v[:, : S + 5]), crop)
    assert np.abs(fused.astype(int) - views).max() <= 1
    # an odd luma column cannot be read as pixel pairs: the general path, same picture (its
    # chroma window is one column wider, so resized)
    odd = _write((y, u, v), Crop(5, 0, 2 * S, 2 * S))
    chroma = [resize(c[:S, 2:35], S, S) for c in (u, v)]
    want = _numpy_rgb(_box2(y[:, 5 : 5 + 2 * S]), *chroma, ("bt709", False))
    assert np.abs(odd.astype(int) - want).max() <= 1


def test_frame_planes_are_whole_rows_of_the_decoded_frame() -> None:
    frame = av.VideoFrame.from_ndarray(
        np.random.default_rng(4).integers(0, 256, (3 * 30 // 2, 50), dtype=np.uint8),
        format="yuv420p",
    )
    y, u, v, shifts = frame_planes(frame)
    assert shifts == (1, 1)
    assert all(p.flags.c_contiguous for p in (y, u, v))
    assert y.shape[0] == 30 and y.shape[1] >= 50 and u.shape[0] == 15 and u.shape[1] >= 25
    packed = frame.to_ndarray()
    np.testing.assert_array_equal(y[:, :50], packed[:30])
    np.testing.assert_array_equal(u[:, :25].ravel(), packed[30:].ravel()[: 15 * 25])
    np.testing.assert_array_equal(v[:, :25].ravel(), packed[30:].ravel()[15 * 25 :])


def test_frame_planes_of_full_chroma_and_gray_frames() -> None:
    rng = np.random.default_rng(5)
    planes = rng.integers(0, 256, (3, 20, 30), dtype=np.uint8)
    frame = av.VideoFrame.from_ndarray(planes, format="yuv444p")
    y, u, v, shifts = frame_planes(frame)
    assert shifts == (0, 0)
    for got, want in zip((y, u, v), planes):
        np.testing.assert_array_equal(got[:20, :30], want)
    y, u, v, shifts = frame_planes(av.VideoFrame.from_ndarray(planes[0], format="gray"))
    assert shifts == (0, 0)
    np.testing.assert_array_equal(y[:20, :30], planes[0])
    assert (u == 128).all() and (v == 128).all() and u.shape == y.shape


def _reference_rgb_frame(rgb: np.ndarray, crop: Crop, mode: str, side: int, window: int, flips):
    """What ``write_rgb`` must give, built from the pieces each tested on its own: the window's
    channels resized (``resize``) and flipped; OpenCV's JFIF conversion after the resize
    (yuv_resized, chroma halved by ``resize``) or at stored resolution, its chroma halved by
    OpenCV's area filter over edge-replicated planes (yuv: unflipped, top left of the square)."""
    hflip, vflip = flips
    pixels = rgb[crop.y : crop.y + crop.h, crop.x : crop.x + crop.w]
    if mode == "yuv":
        ycrcb = cv2.cvtColor(np.ascontiguousarray(pixels), cv2.COLOR_RGB2YCrCb)
        h, w, ch, cw = crop.h, crop.w, (crop.h + 1) // 2, (crop.w + 1) // 2
        c = (window + 1) // 2
        y, u, v = (
            np.zeros((window, window), np.uint8),
            np.zeros((c, c), np.uint8),
            np.zeros((c, c), np.uint8),
        )
        y[:h, :w] = ycrcb[..., 0]
        for plane, k in ((u, 2), (v, 1)):
            edged = cv2.copyMakeBorder(
                ycrcb[..., k], 0, 2 * ch - h, 0, 2 * cw - w, cv2.BORDER_REPLICATE
            )
            plane[:ch, :cw] = cv2.resize(edged, (cw, ch), interpolation=cv2.INTER_AREA)
        return np.concatenate([y.ravel(), u.ravel(), v.ravel()])
    channels = np.stack(
        [resize(np.ascontiguousarray(pixels[..., k]), side, side) for k in range(3)]
    )
    channels = channels[:, ::-1] if vflip else channels
    channels = channels[:, :, ::-1] if hflip else channels
    if mode == "rgb":
        return channels
    ycrcb = cv2.cvtColor(np.ascontiguousarray(channels.transpose(1, 2, 0)), cv2.COLOR_RGB2YCrCb)
    c = (side + 1) // 2
    cb, cr = resize(ycrcb[..., 2], c, c), resize(ycrcb[..., 1], c, c)
    return np.concatenate([ycrcb[..., 0].ravel(), cb.ravel(), cr.ravel()])


@pytest.mark.parametrize("mode", ["rgb", "yuv_resized", "yuv"])
@pytest.mark.parametrize(
    ("crop", "side"),
    [
        (Crop(3, 5, 70, 61), 32),
        (Crop(0, 0, 64, 64), 32),
        (Crop(1, 2, 31, 31), 31),
        (Crop(8, 9, 17, 23), 40),
        (Crop(4, 4, 5, 5), 33),  # a window under a third of an odd output: the halving's scratch
    ],
)
@pytest.mark.parametrize("flips", [(False, False), (True, True), (True, False)])
def test_rgb_pictures_write_as_their_pieces_compose(mode, crop, side, flips) -> None:
    rng = np.random.default_rng(21)
    rgb = rng.integers(0, 256, (80, 90, 3), dtype=np.uint8)
    writer = PixelWriter(side, mode, 96)
    dst = np.full(PixelWriter.frame_shape(side, mode, 96), 9, np.uint8)
    writer.write_rgb(rgb, crop, *flips, dst)
    want = _reference_rgb_frame(rgb, crop, mode, side, 96, flips)
    np.testing.assert_array_equal(dst.reshape(want.shape), want)

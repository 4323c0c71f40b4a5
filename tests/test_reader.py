"""Reader: clips against an independent PyAV + numpy + Pillow reference, and fast paths vs slow."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import numpy as np
import pytest
from PIL import Image

import kohakuclip
from kohakuclip import ClipError, Reader, SourceError
from kohakuclip.decode.pixels import yuv420_planes, yuv_to_rgb_matrix
from kohakuclip.formats import FRAME_RECORD
from kohakuclip.read.reader import _shares_by_video
from kohakuclip.write.pack import ShardWriter, pack
from tests.media import VideoSpec, decode_planes, make_video, psnr

SPECS = {
    "av1": VideoSpec(codec="av1", width=160, height=96, frames=48, blur=1.5),
    "h264": VideoSpec(codec="h264", width=160, height=96, frames=48, seed=1, blur=1.5),
    "hevc": VideoSpec(codec="hevc", width=128, height=96, frames=40, seed=2, blur=1.5),
    "h264_tall_odd_chroma": VideoSpec(
        codec="h264", width=98, height=134, frames=33, seed=3, blur=1.5
    ),
    "h264_bt709": VideoSpec(
        codec="h264",
        width=160,
        height=96,
        frames=24,
        seed=4,
        blur=1.5,
        options={"colorspace": "bt709", "color_primaries": "bt709", "color_trc": "bt709"},
    ),
}


@dataclass(frozen=True)
class Corpus:
    root: str
    names: list[str]  # member names, in reader order
    data: dict[str, bytes]

    @property
    def zip(self) -> str:
        return os.path.join(self.root, "shard.zip")

    @property
    def tar(self) -> str:
        return os.path.join(self.root, "shard.tar")

    @property
    def folder(self) -> str:
        return os.path.join(self.root, "folder")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    root = str(tmp_path_factory.mktemp("reader"))
    data = {f"{k}.mp4": make_video(spec) for k, spec in SPECS.items()}
    names = sorted(data)
    members = [(n, data[n]) for n in names]
    pack(os.path.join(root, "shard.zip"), members)
    pack(os.path.join(root, "shard.tar"), members)
    os.makedirs(os.path.join(root, "folder", "sub"))
    for n in names:
        with open(os.path.join(root, "folder", "sub", n), "wb") as f:
            f.write(data[n])
    return Corpus(root, names, data)


def _bilinear(plane: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Plain numpy bilinear resampling with pixel-centre alignment (for chroma upsampling)."""
    h, w = plane.shape
    ys = np.clip((np.arange(out_h) + 0.5) * h / out_h - 0.5, 0, h - 1)
    xs = np.clip((np.arange(out_w) + 0.5) * w / out_w - 0.5, 0, w - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    p = plane.astype(np.float64)
    top = p[y0][:, x0] * (1 - fx) + p[y0][:, x1] * fx
    bottom = p[y1][:, x0] * (1 - fx) + p[y1][:, x1] * fx
    return top * (1 - fy) + bottom * fy


def reference_clip(
    data: bytes, frames: list[int], crop: np.ndarray, flips: np.ndarray, size: int, bt709: bool
) -> np.ndarray:
    """PyAV decode (display order) -> numpy YUV->RGB -> crop -> Pillow antialiased resize."""
    planes = decode_planes(data)
    kr, kb = (0.2126, 0.0722) if bt709 else (0.299, 0.114)
    kg = 1 - kr - kb
    x, y, w, h = (int(v) for v in crop)
    out = []
    for f in frames:
        yp, up, vp = planes[f]
        hh, ww = yp.shape
        u = _bilinear(up, 2 * up.shape[0], 2 * up.shape[1])[:hh, :ww]
        v = _bilinear(vp, 2 * vp.shape[0], 2 * vp.shape[1])[:hh, :ww]
        luma = (yp.astype(np.float64) - 16) * 255 / 219
        cb, cr = (u - 128) * 255 / 224, (v - 128) * 255 / 224
        r = luma + 2 * (1 - kr) * cr
        b = luma + 2 * (1 - kb) * cb
        g = (luma - kr * r - kb * b) / kg
        rgb = np.stack([r, g, b])[:, y : y + h, x : x + w]
        chans = [
            np.asarray(
                Image.fromarray(c.astype(np.float32), "F").resize((size, size), Image.BILINEAR)
            )
            for c in rgb
        ]
        img = np.clip(np.round(np.stack(chans)), 0, 255).astype(np.uint8)
        if flips[0]:
            img = img[:, :, ::-1]
        if flips[1]:
            img = img[:, ::-1, :]
        out.append(img)
    return np.stack(out)


# Sizes: 64 resizes every plane (1.5x); 48 (49 for the 98-wide video) halves luma exactly, so the
# chroma window is used as it is; 30 shrinks luma 3.2x (box prefilter, then bilinear). At 2x and
# more, the box prefilter and Pillow's wider triangle filter part on these noise-like 96-pixel
# frames (37-38 dB); on natural 512p content they agree at 52 dB. A misplaced window or a
# half-pixel shift falls far below either bound.
SIZES = [(name, 64) for name in SPECS] + [("av1", 48), ("h264_tall_odd_chroma", 49), ("h264", 30)]
MIN_PSNR = {64: 40, 48: 36, 49: 36, 30: 36}


@pytest.mark.parametrize(("name", "size"), SIZES)
def test_clips_match_reference(corpus: Corpus, name: str, size: int) -> None:
    member = f"{name}.mp4"
    vid = corpus.names.index(member)
    with Reader(corpus.zip, size=size, threads=2, hflip=0.5, vflip=0.5, seed=3) as reader:
        info = reader.info(vid)
        assert info.member == member
        rng = np.random.default_rng(0)
        items = [(vid, kohakuclip.random_frames(info.n, 6, rng)) for _ in range(3)]
        items.append((vid, [info.n - 1, 0, info.n // 2, 0]))  # unsorted with a repeat
        items[-1] = (vid, items[-1][1] + items[-1][1][:2])
        batch = reader.read(items)
    assert batch.video.shape == (4, 6, 3, size, size)
    assert batch.flips.any(), "with p=0.5 some of 4 clips should flip"
    bt709 = name.endswith("bt709")
    assert batch.colorspaces[0] == ("bt709" if bt709 else "bt601")
    for i, (_, frames) in enumerate(items):
        ref = reference_clip(
            corpus.data[member], frames, batch.crops[i], batch.flips[i], size, bt709
        )
        for t in range(len(frames)):
            assert psnr(batch.video[i, t], ref[t]) >= MIN_PSNR[size], (name, i, t, frames[t])


def test_display_order_is_exact_on_b_frames(corpus: Corpus) -> None:
    """Luma at the stored size (no resize) equals PyAV's display-order decode bit for bit."""
    for name in ("h264.mp4", "hevc.mp4", "av1.mp4"):
        vid = corpus.names.index(name)
        planes = decode_planes(corpus.data[name])
        with Reader(corpus.zip, size=96, crop="center", mode="yuv_resized") as reader:
            frames = [len(planes) - 1, 3, 1, 2, 0, 17, 9, 30]
            batch = reader.read([(vid, frames)])
        x, y, w, h = batch.crops[0]
        for t, f in enumerate(frames):
            luma = batch.video[0, t, : 96 * 96].reshape(96, 96)
            assert np.array_equal(luma, planes[f][0][y : y + h, x : x + w]), (name, f)


def _all_clips(reader: Reader, seed: int = 5) -> tuple[np.ndarray, list]:
    items = reader.sample(2 * len(reader), 8, fps=6.0, seed=seed)
    batch = reader.read(items, seed=seed)
    return batch.video, items


def test_zip_tar_folder_and_moov_fallback_agree(corpus: Corpus) -> None:
    outputs = []
    for sources, use_index in [
        (corpus.zip, True),
        (corpus.zip, False),
        (corpus.tar, True),
        (corpus.tar, False),
        (corpus.folder, True),
    ]:
        with Reader(sources, size=48, threads=2, seed=1, use_index=use_index) as reader:
            assert [os.path.basename(reader.info(v).member) for v in range(len(reader))] == (
                corpus.names
            )
            outputs.append(_all_clips(reader))
    video0, items0 = outputs[0]
    for video, items in outputs[1:]:
        assert items == items0
        assert np.array_equal(video, video0)


def test_skip_equals_full_decode_and_threads_agree(corpus: Corpus) -> None:
    results = []
    for skip, threads in [(True, 1), (False, 1), (True, 3), ("keep", 2)]:
        with Reader(corpus.zip, size=40, threads=threads, skip=skip, seed=2) as reader:
            rng = np.random.default_rng(9)
            items = [
                (v, kohakuclip.random_frames(reader.info(v).n, 5, rng))
                for v in range(len(reader))
                for _ in range(3)
            ]
            results.append(reader.read(items, seed=11).video)
            if skip:
                assert reader.stats()["packets"] > 0
    for other in results[1:]:
        assert np.array_equal(results[0], other)


CLIP_SPECS = {  # the four benchmark shapes, scaled to the 48-frame test video at 24 fps
    "8 @ 6 fps": dict(frames=8, fps=6.0),
    "8 @ 24 fps": dict(frames=8, fps=24.0),
    "16 @ 6 fps": dict(frames=16, fps=12.0),
    "8 random": dict(frames=8, fps=None),
}


def _zip_without_dependency_table(corpus: Corpus) -> str:
    """The corpus as a zip shard whose index has no KCAV1D table (as KohakuClip 1.0.0 packs)."""
    path = os.path.join(corpus.root, "no_table.zip")
    if not os.path.exists(path):
        with ShardWriter(path) as writer:
            for name in corpus.names:
                writer.add(name, corpus.data[name])
            writer._av1.clear()
        assert writer.index().av1deps is None
    return path


@pytest.mark.parametrize("shape", list(CLIP_SPECS))
@pytest.mark.parametrize("source", ["zip", "folder", "zip without table"])
def test_closure_keep_and_full_decode_agree_on_av1(corpus: Corpus, shape: str, source: str) -> None:
    """Feeding only the dependency closure (or keep bytes) gives the full decode's pixels, and
    decodes fewer frames: full > keep > closure. Folders (no index) and shards whose index
    has no dependency table build the same table from the samples on first use."""
    vid = corpus.names.index("av1.mp4")
    path = {"zip": corpus.zip, "folder": corpus.folder}.get(source)
    path = path or _zip_without_dependency_table(corpus)
    spec = CLIP_SPECS[shape]
    rng = np.random.default_rng(len(shape))
    items = []
    for _ in range(6):
        if spec["fps"] is None:
            items.append((vid, kohakuclip.random_frames(48, spec["frames"], rng)))
        else:
            items.append((vid, kohakuclip.clip(48, spec["frames"], rng, spec["fps"], 24.0)))
    videos, decoded = {}, {}
    for skip in (True, "keep", False):
        with Reader(path, size=40, mode="yuv_resized", skip=skip) as reader:
            videos[skip] = reader.read(items, seed=0).video
            decoded[skip] = reader.stats()["decoded_per_output"]
    assert np.array_equal(videos[True], videos[False])
    assert np.array_equal(videos["keep"], videos[False])
    assert decoded[False] > decoded["keep"] >= decoded[True], decoded
    if source != "zip":
        with Reader(corpus.zip, size=40, mode="yuv_resized") as reader:
            assert np.array_equal(reader.read(items, seed=0).video, videos[True])
            assert reader.stats()["decoded_per_output"] == decoded[True]


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_folders_skip_non_reference_pictures_like_shards(corpus: Corpus, codec: str) -> None:
    """An mp4 folder (no index) builds the keep column on first use: skipping gives the full
    decode's pixels and decodes as few frames as the shard whose index stores it."""
    vid = corpus.names.index(f"{codec}.mp4")
    n = Reader(corpus.zip).info(vid).n
    rng = np.random.default_rng(5)
    items = [(vid, kohakuclip.random_frames(n, 6, rng)) for _ in range(6)]
    videos, decoded = {}, {}
    for path in (corpus.zip, corpus.folder):
        for skip in (True, False):
            with Reader(path, size=40, mode="yuv_resized", skip=skip) as reader:
                videos[path, skip] = reader.read(items, seed=0).video
                decoded[path, skip] = reader.stats()["decoded_per_output"]
    for key in videos:
        assert np.array_equal(videos[key], videos[corpus.zip, False])
    assert decoded[corpus.folder, True] == decoded[corpus.zip, True], decoded
    assert decoded[corpus.folder, True] < decoded[corpus.folder, False], decoded


def test_videos_over_the_table_limit_are_read_without_skipping(
    corpus: Corpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder video larger than ``TABLE_READ_LIMIT`` is not read whole for its skip tables:
    it decodes every sample from the keyframe, with the same pixels."""
    from kohakuclip.storage import video_resolve

    vid = corpus.names.index("h264.mp4")
    items = [(vid, [3, 17, 30])] * 2
    with Reader(corpus.folder, size=40, mode="yuv_resized", skip=False) as reader:
        full, decoded_full = reader.read(items, seed=0).video, reader.stats()["decoded_per_output"]
    monkeypatch.setattr(video_resolve, "TABLE_READ_LIMIT", len(corpus.data["h264.mp4"]) // 2)
    with Reader(corpus.folder, size=40, mode="yuv_resized", skip=True) as reader:
        assert np.array_equal(reader.read(items, seed=0).video, full)
        assert reader.stats()["decoded_per_output"] == decoded_full


def test_same_seed_same_batch_and_crops_vary(corpus: Corpus) -> None:
    with Reader(corpus.zip, size=32, hflip=0.5, seed=0) as reader:
        items = [(0, [0, 1, 2])] * 8
        a = reader.read(items, seed=42)
        b = reader.read(items, seed=42)
        c = reader.read(items, seed=43)
    assert np.array_equal(a.video, b.video) and np.array_equal(a.crops, b.crops)
    assert len({tuple(x) for x in a.crops}) > 1, "random crops should move"
    assert not (np.array_equal(a.crops, c.crops) and np.array_equal(a.flips, c.flips))


def test_out_buffer_and_pending_queueing(corpus: Corpus) -> None:
    with Reader(corpus.zip, size=32, threads=2, seed=0) as reader:
        items = reader.sample(4, 4, seed=1)
        out = np.zeros(reader.batch_shape(4, 4), np.uint8)
        pendings = [reader.submit(items, out=out if i == 0 else None, seed=7) for i in range(3)]
        results = [p.result(timeout=60) for p in pendings]
    assert results[0].video is out
    assert np.array_equal(results[0].video, results[2].video)
    with pytest.raises(ValueError, match="shape"):
        Reader(corpus.zip, size=32).submit(items, out=np.zeros((1, 2, 3), np.uint8))


def test_the_options_of_1_0_0_may_come_by_position(corpus: Corpus) -> None:
    """KohakuClip 1.0.0's Reader took size, mode, threads, crop, hflip, vflip, seed, skip,
    use_index, open_files and moov_cache by position: the same batch either way; the options
    1.0.0 did not have are keywords only."""
    items = [(0, [0, 3, 6]), (1, [1, 2, 4])]
    with Reader(corpus.zip, 32, "rgb", 1, "center", 1.0, 0.0, 5, True, True, 64, 64) as reader:
        by_position = reader.read(items, seed=2)
    with Reader(corpus.zip, size=32, crop="center", hflip=1.0, seed=5, open_files=64) as reader:
        by_keyword = reader.read(items, seed=2)
    np.testing.assert_array_equal(by_position.video, by_keyword.video)
    assert by_position.flips[:, 0].all()
    with pytest.raises(TypeError):
        Reader(corpus.zip, 32, "rgb", 1, "center", 0.0, 0.0, 5, True, True, 64, 64, 64)  # type: ignore[misc]


def test_sample_policy_on_short_videos(corpus: Corpus) -> None:
    with Reader(corpus.zip, size=32) as reader:
        for vid in range(len(reader)):
            n = reader.info(vid).n
            for frames, fps in [(8, 6.0), (n + 5, None), (3 * n, 1.0)]:
                (item,) = reader.sample(1, frames, fps=fps, videos=[vid], seed=vid)
                assert item[0] == vid and len(item[1]) == frames
                assert all(0 <= f < n for f in item[1])
                assert item[1] == sorted(item[1])
        items = reader.sample(3, 4, spread=True, seed=0)
        assert all(len(f) == 4 for _, f in items)
        for fps in (0.0, -1.0, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="fps must be a positive number"):
                reader.sample(1, 4, fps=fps)


def test_bad_requests_raise_clear_errors(corpus: Corpus) -> None:
    with Reader(corpus.zip, size=32) as reader:
        with pytest.raises(IndexError, match="out of range"):
            reader.read([(len(reader), [0])])
        n = reader.info(0).n
        with pytest.raises(ClipError, match=rf"shard.zip:{corpus.names[0]}.*out of range"):
            reader.read([(0, [0, n])])
        with pytest.raises(ValueError, match="same number of frames"):
            reader.read([(0, [0, 1]), (1, [0])])
        assert reader.read([(0, [0, 1])]).video.shape[0] == 1  # still serving
        with pytest.raises(ValueError, match="whole frame indices"):
            reader.read([(0, [0, 1.7])])
        with pytest.raises(IndexError, match="video id True out of range"):
            reader.read([(True, [0])])
        whole = reader.read([(0, [0, 1])], seed=3).video
        for frames in (np.array([0.0, 1.0]), (f for f in (0, 1)), np.arange(2)):
            np.testing.assert_array_equal(reader.read([(0, frames)], seed=3).video, whole)
        # a seed outside [0, 2**64) is the caller's error, at once, not a data error at result()
        for seed, error in ((-5, ValueError), (2**64, ValueError), (1.5, TypeError)):
            with pytest.raises(error, match="seed parts"):
                reader.submit([(0, [0])], seed=seed)  # type: ignore[arg-type]
    for kwargs in [
        dict(mode="bgr"),
        dict(crop="left"),
        dict(hflip=2.0),
        dict(threads=0),
        dict(threads=2.5),
        dict(size=True),
    ]:
        with pytest.raises(ValueError):
            Reader(corpus.zip, **kwargs)  # type: ignore[arg-type]
    with Reader(corpus.zip, size=np.int64(32)) as reader:  # a numpy int is an int
        assert reader.read([(0, [0])]).video.shape[-1] == 32


def test_stage_clocks_keep_counting_across_close(corpus: Corpus) -> None:
    """``stats()`` counts since the reader was made: its stage seconds too, not only since the
    threads a ``close()`` ended were started again."""
    with Reader(corpus.zip, size=32) as reader:
        for _ in range(3):
            reader.read([(0, [0, 1, 2])] * 2, seed=1)
        before = reader.stats()
    reader.read([(0, [0])], seed=1)
    after = reader.stats()
    reader.close()
    assert after["clips"] == before["clips"] + 1
    for stage in ("seconds_decode", "seconds_plan"):
        assert after[stage] >= before[stage] > 0, stage


def test_corrupt_sample_names_file_and_pool_keeps_working(corpus: Corpus, tmp_path) -> None:
    bad = str(tmp_path / "bad.zip")
    shutil.copy(corpus.zip, bad)
    with Reader(bad, size=32) as probe:
        vid = corpus.names.index("h264.mp4")
        track = probe._catalog.track(vid)
        start = int(track.offsets[0])
        length = int(track.sizes[0])
    with open(bad, "r+b") as f:  # overwrite the first keyframe with garbage
        f.seek(start)
        f.write(np.random.default_rng(0).integers(0, 256, length, dtype=np.uint8).tobytes())
    with Reader(bad, size=32, threads=2) as reader:
        with pytest.raises(ClipError, match=r"bad.zip:h264.mp4"):
            reader.read([(vid, [0, 1, 2])])
        for _ in range(3):  # later batches on the same pool are fine
            good = [v for v in range(len(reader)) if v != vid]
            batch = reader.read([(v, [0, 1]) for v in good])
            assert batch.video.shape[0] == len(good)


@pytest.mark.parametrize("field, value", [("size", 0xFFFFFFF0), ("offset", 1 << 62)])
def test_a_damaged_index_record_names_the_member(
    corpus: Corpus, tmp_path, field: str, value: int
) -> None:
    """A frame record pointing past the file (a flipped bit in the index) is a ClipError naming
    the shard and the member, not a 4 PiB allocation; the other videos still read."""
    bad = str(tmp_path / "bad.zip")
    shutil.copy(corpus.zip, bad)
    vid = corpus.names.index("h264.mp4")
    with Reader(bad, size=32) as probe:
        src = probe._catalog.sources[0]
        row = probe._catalog.videos[vid].entry.row
        record = src.records_start + (row + 3) * FRAME_RECORD.itemsize
    with open(bad, "r+b") as f:
        f.seek(record + FRAME_RECORD.fields[field][1])
        f.write(np.array(value, FRAME_RECORD.fields[field][0]).tobytes())
    with Reader(bad, size=32, threads=2) as reader:
        with pytest.raises(ClipError, match=r"bad.zip:h264.mp4.*damaged index: frame record 3"):
            reader.read([(vid, [0, 3])])
        good = [v for v in range(len(reader)) if v != vid]
        assert reader.read([(v, [0, 1]) for v in good]).video.shape[0] == len(good)


def test_missing_and_bad_sources(tmp_path) -> None:
    with pytest.raises(ValueError, match="no such file"):
        Reader(str(tmp_path / "nope.zip"))
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"not a zip at all" * 10)
    with pytest.raises(ValueError, match=r"junk\.zip"):
        Reader(str(junk))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SourceError, match=r"empty: no videos found"):
        Reader(str(empty))
    with pytest.raises(SourceError, match=r"empty, .*empty and 1 more: no videos found"):
        Reader([empty] * 3)


def test_yuv_mode_is_the_stored_window(corpus: Corpus) -> None:
    name = "h264_tall_odd_chroma.mp4"
    vid = corpus.names.index(name)
    planes = decode_planes(corpus.data[name])
    with Reader(corpus.zip, size=32, mode="yuv", hflip=1.0, seed=4) as reader:
        assert reader.yuv_size == max(min(s.width, s.height) for s in SPECS.values())
        frames = [5, 0, 32]
        batch = reader.read([(vid, frames)])
    assert batch.video.shape == reader.batch_shape(1, 3)
    assert batch.flips[0, 0], "flips are recorded for the GPU, not applied"
    x, y, w, h = (int(v) for v in batch.crops[0])
    for t, f in enumerate(frames):
        out_y, out_u, out_v = yuv420_planes(batch.video[0, t], reader.yuv_size)
        ref_y, ref_u, ref_v = planes[f]
        assert np.array_equal(out_y[:h, :w], ref_y[y : y + h, x : x + w])
        cy, cx, ch, cw = y // 2, x // 2, (h + 1) // 2, (w + 1) // 2
        assert np.array_equal(out_u[:ch, :cw], ref_u[cy : cy + ch, cx : cx + cw])
        assert np.array_equal(out_v[:ch, :cw], ref_v[cy : cy + ch, cx : cx + cw])


def test_window_is_the_deprecated_name_of_yuv_size(corpus: Corpus) -> None:
    with pytest.warns(DeprecationWarning, match="yuv_size"):
        reader = Reader(corpus.zip, size=32, mode="yuv", crop="center", window=160)
    with reader:
        assert reader.yuv_size == 160
        with pytest.warns(DeprecationWarning, match="yuv_size"):
            assert reader.window == 160
        batch = reader.read([(0, [0])])
    assert batch.video.shape == (1, 1, 160 * 160 + 2 * 80 * 80)
    with pytest.raises(ValueError, match="yuv_size must be even"):
        Reader(corpus.zip, yuv_size=97)


def test_1_0_0s_names_of_info_and_batch_fields(corpus: Corpus) -> None:
    with Reader(corpus.zip, size=32) as reader:
        info = reader.info(0)
        batch = reader.read([(0, [0])])
    for old, new in (("h", "height"), ("w", "width"), ("name", "member")):
        with pytest.warns(DeprecationWarning, match=f"VideoInfo.{old} is deprecated: use {new}"):
            assert getattr(info, old) == getattr(info, new)
    with pytest.warns(DeprecationWarning, match="colorspaces"):
        assert batch.colorspace == batch.colorspaces


def test_yuv_resized_converts_to_the_rgb_output(tmp_path) -> None:
    """yuv_resized planes, upsampled and converted in numpy, match the rgb mode. Chroma is at half
    the output resolution, so this is a PSNR bound, not equality: the synthetic hue ramps carry
    far more chroma detail than real video (33.9 dB on the worst channel here, 52 dB at the
    stored size; a wrong layout or matrix lands near 10-15 dB)."""
    for seed, codec in enumerate(("av1", "h264")):
        spec = VideoSpec(codec=codec, width=192, height=108, frames=12, seed=seed, blur=3.0)
        make_video(spec, str(tmp_path / f"{codec}.mp4"))
    items = [(v, [0, 3, 7]) for v in range(2)]
    outs = {}
    for mode in ("rgb", "yuv_resized"):
        with Reader(str(tmp_path), size=48, mode=mode, hflip=0.5, seed=8) as reader:
            outs[mode] = reader.read(items, seed=1)
    rgb, yuv = outs["rgb"], outs["yuv_resized"]
    assert np.array_equal(rgb.crops, yuv.crops) and np.array_equal(rgb.flips, yuv.flips)
    for i in range(len(items)):
        m = yuv_to_rgb_matrix(yuv.colorspaces[i], False).astype(np.float64)
        for t in range(3):
            py, pu, pv = yuv420_planes(yuv.video[i, t], 48)
            u, v = _bilinear(pu, 48, 48), _bilinear(pv, 48, 48)
            stacked = np.stack([py.astype(np.float64), u, v, np.ones_like(u)])
            converted = np.clip(np.round(np.tensordot(m, stacked, axes=1)), 0, 255)
            assert psnr(rgb.video[i, t], converted) >= 32, (i, t)


@pytest.mark.parametrize(
    ("vids", "threads"),
    [
        ([0, 1, 0, 2, 1, 0, 3, 3], 2),
        ([5] * 16, 2),
        ([0, 1, 2, 3, 4, 5, 6], 3),
        ([0, 0, 0, 1], 8),
        ([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4], 2),
        ([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2], 2),
        ([3, 1, 3, 2, 1, 3, 0, 2, 1, 3], 3),
    ],
)
def test_threads_take_a_video_s_clips_together_and_balanced(vids: list[int], threads: int):
    shares = _shares_by_video(vids, threads)
    n, count = len(vids), min(threads, len(vids))
    assert sorted(i for share in shares for i in share) == list(range(n))
    assert all(share == sorted(share) for share in shares)
    most = -(-n // count)
    assert len(shares) == count and max(map(len, shares)) <= most  # as even as array_split
    # a video's clips are cut into runs of at most `most`, and a run is cut at most where
    # it fills a thread (each thread once, the last never)
    splits = sum(sum(any(vids[i] == v for i in s) for s in shares) - 1 for v in set(vids))
    runs = sum(-(-vids.count(v) // most) - 1 for v in set(vids))
    assert splits <= runs + count - 1

"""Reader sources beyond mp4 shards: GulpIO directories, and metadata from shard manifests."""

from __future__ import annotations

import errno
import os
import shutil
import warnings
from contextlib import nullcontext

import numpy as np
import pytest
from PIL import Image

from kohakuclip import ClipError, Reader, SourceError, SourceWarning, write_videos
from kohakuclip.gulp import GulpDirectory
from kohakuclip.gulp.chunk import ChunkBuilder
from tests.image_media import APPLE_DOUBLE
from tests.media import VideoSpec, broken_gulp_copy, frame_rgb, make_video, psnr
from tests.paths import run_locked_out


@pytest.fixture(scope="module")
def gulp_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("gulp"))
    for chunk in range(2):
        with ChunkBuilder(
            os.path.join(root, f"data_{chunk}.gulp"), os.path.join(root, f"meta_{chunk}.gmeta")
        ) as builder:
            for k in range(2):
                spec = VideoSpec(width=120, height=90, seed=chunk * 2 + k, blur=1.5)
                frames = [frame_rgb(spec, i) for i in range(10 + 3 * k)]
                meta = {"label": f"class {k}", "fps": 12}
                if chunk == 1 and k == 1:
                    meta = {"label": "no fps"}
                builder.add(f"vid{chunk}{k}", meta, frames)
    return root


def _reference(frames: list[np.ndarray], crop: np.ndarray, flips: np.ndarray, size: int):
    x, y, w, h = (int(v) for v in crop)
    out = []
    for f in frames:
        window = Image.fromarray(f[y : y + h, x : x + w])
        img = np.asarray(window.resize((size, size), Image.BILINEAR)).transpose(2, 0, 1)
        if flips[0]:
            img = img[:, :, ::-1]
        if flips[1]:
            img = img[:, ::-1]
        out.append(img)
    return np.stack(out)


def test_gulp_clips_match_gulp_directory(gulp_dir: str) -> None:
    gd = GulpDirectory(gulp_dir)
    with Reader(gulp_dir, size=48, threads=2, hflip=0.5, seed=1) as reader:
        assert len(reader) == 4
        ids = [reader.info(v).member for v in range(4)]
        assert sorted(ids) == ["vid00", "vid01", "vid10", "vid11"]
        items = [(v, [0, 4, 2, 4, reader.info(v).n - 1]) for v in range(4)]
        batch = reader.read(items)
        assert batch.video.shape == (4, 5, 3, 48, 48)
        for i, (vid, frames) in enumerate(items):
            stored, meta = gd[ids[vid], frames]
            assert reader.info(vid).meta == meta
            ref = _reference(stored, batch.crops[i], batch.flips[i], 48)
            for t in range(len(frames)):
                assert psnr(batch.video[i, t], ref[t]) >= 40, (ids[vid], frames[t])
            assert np.array_equal(batch.video[i, 1], batch.video[i, 3])  # repeated frame


def test_a_corrupt_gulp_frame_names_the_data_file_the_id_and_the_frame(
    gulp_dir: str, tmp_path
) -> None:
    broken = broken_gulp_copy(gulp_dir, str(tmp_path / "broken"), "vid11", 3)
    with Reader(broken, size=32, threads=2) as reader:
        vid = [reader.info(v).member for v in range(len(reader))].index("vid11")
        with pytest.raises(
            ClipError, match=r"data_1\.gulp: id 'vid11': frames \[0, 3, 5\]: frame 3"
        ):
            reader.read([(vid, [0, 3, 5])])
        assert reader.read([(vid, [0, 5])]).video.shape[:2] == (1, 2)  # the other frames read


def test_gulp_fps_from_meta_or_given(gulp_dir: str) -> None:
    with Reader(gulp_dir, size=16) as reader:
        fps = {reader.info(v).member: reader.info(v).fps for v in range(len(reader))}
        assert fps == {"vid00": 12.0, "vid01": 12.0, "vid10": 12.0, "vid11": 0.0}
        (item,) = reader.sample(1, 4, fps=6.0, videos=[0], seed=0)
        assert np.all(np.diff(item[1]) == 2)  # 12 fps video, clip at 6 fps
        with pytest.raises(ClipError, match=r"vid00.*out of range"):
            reader.read([(0, [0, 99])])
    with Reader(gulp_dir, size=16, gulp_fps=24.0) as reader:
        assert {reader.info(v).fps for v in range(len(reader))} == {24.0}


def test_gulp_yuv_modes_follow_rgb(gulp_dir: str) -> None:
    with Reader(gulp_dir, size=32, mode="yuv_resized", seed=2) as reader:
        batch = reader.read([(0, [1, 2])])
    assert batch.video.shape == reader.batch_shape(1, 2)
    assert batch.colorspaces == ["bt601"] and bool(batch.full_range[0])


def test_shard_manifest_metadata_reaches_info(tmp_path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    make_video(VideoSpec(codec="h264", width=64, height=48, frames=8), str(src / "a.mp4"))
    (src / "a.txt").write_text("a caption")
    make_video(VideoSpec(codec="h264", width=64, height=48, frames=8), str(src / "b.mp4"))
    (src / "b.json").write_text('{"label": "cat", "score": 3}')
    result = write_videos(str(tmp_path / "out"), [str(src)], codec="h264", progress=False)
    shards = [str(tmp_path / "out" / s) for s in result.shards]
    with Reader(shards, size=16) as reader:
        metas = {reader.info(v).member: reader.info(v).meta for v in range(len(reader))}
    assert metas["a.mp4"] == {"caption": "a caption"}
    assert metas["b.mp4"]["label"] == "cat" and metas["b.mp4"]["score"] == 3


def test_rotated_sources_read_upright(tmp_path) -> None:
    """A source with a 90-degree display matrix is written upright and read upright: the clip
    matches the source's frames as shown (rotated), not as coded."""
    from tests.writer_media import tagged_video, upright_reference

    spec = VideoSpec(codec="h264", width=128, height=80, frames=12, blur=1.5)
    source = tagged_video(spec, rotation=90)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "rot.mp4").write_bytes(source)
    out = str(tmp_path / "out")
    result = write_videos(out, [str(tmp_path / "src")], codec="h264", crf=12, progress=False)
    upright = upright_reference(source, 90)
    with Reader([str(tmp_path / "out" / s) for s in result.shards], size=64, crop="center") as r:
        info = r.info(0)
        assert (info.width, info.height) == (80, 128)  # portrait once upright
        batch = r.read([(0, [0, 5, 11])])
    x, y, w, h = (int(v) for v in batch.crops[0])
    for t, f in enumerate([0, 5, 11]):
        window = Image.fromarray(upright[f][y : y + h, x : x + w])
        ref = np.asarray(window.resize((64, 64), Image.BILINEAR)).transpose(2, 0, 1)
        assert psnr(batch.video[0, t], ref) >= 38, f
        unrotated = np.rot90(upright[f], -1)[: min(h, 80), : min(w, 80)]
        wrong = np.asarray(Image.fromarray(np.ascontiguousarray(unrotated)).resize((64, 64)))
        assert psnr(batch.video[0, t], wrong.transpose(2, 0, 1)) < 25


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_edit_list_trims_are_read_as_shown(tmp_path, codec: str) -> None:
    """Samples an edit list hides are decoded (later frames need them) but never counted or
    returned: frame i is PyAV's i-th shown frame (luma at stored size, bit for bit)."""
    import struct

    from tests.media import decode_planes
    from tests.test_mp4 import frame_ms, video, with_edits

    data = video(codec)
    at = data.find(b"elst")
    total, shift = struct.unpack_from(">Ii", data, at + 12)
    edited = with_edits(data, [(total - frame_ms(5), shift + 5 * 512)])
    (tmp_path / "trimmed.mp4").write_bytes(edited)
    shown = decode_planes(edited)
    with Reader(str(tmp_path), size=96, crop="center", mode="yuv_resized") as reader:
        info = reader.info(0)
        assert info.n == len(shown) < 40
        frames = [0, 1, info.n - 1, 7]
        batch = reader.read([(0, frames)])
    x, y, w, h = (int(v) for v in batch.crops[0])
    assert (w, h) == (96, 96)
    for t, f in enumerate(frames):
        luma = batch.video[0, t, : 96 * 96].reshape(96, 96)
        assert np.array_equal(luma, shown[f][0][y : y + h, x : x + w]), f


def test_a_folder_of_shards_and_a_single_file_are_sources(tmp_path) -> None:
    from kohakuclip.write.pack import pack
    from tests.media import VideoSpec, make_video

    videos = [make_video(VideoSpec(frames=12, seed=s)) for s in range(3)]
    out = tmp_path / "out"
    out.mkdir()
    pack(str(out / "shard_00000.zip"), [("a.mp4", videos[0]), ("b.mp4", videos[1])])
    pack(str(out / "shard_00001.zip"), [("c.mp4", videos[2])])
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "c.mp4").write_bytes(videos[2])
    items = [(0, [1, 5]), (1, [0, 11]), (2, [3, 4])]
    with Reader(str(out), size=16, crop="center") as folder:
        assert [folder.info(v).member for v in range(3)] == ["a.mp4", "b.mp4", "c.mp4"]
        from_folder = folder.read(items).video
    shards = [str(out / "shard_00000.zip"), str(out / "shard_00001.zip")]
    with Reader(shards, size=16, crop="center") as listed:
        np.testing.assert_array_equal(listed.read(items).video, from_folder)
    with Reader(str(tmp_path / "one" / "c.mp4"), size=16, crop="center") as single:
        assert len(single) == 1 and single.info(0).member == "c.mp4"
        np.testing.assert_array_equal(single.read([(0, [3, 4])]).video, from_folder[2:])
    truncated = tmp_path / "one" / "bad.mp4"
    truncated.write_bytes(videos[0][:1000])
    with Reader(str(truncated)) as single, pytest.raises(SourceError) as error:
        single.info(0)  # a file's errors name the file itself
    assert str(error.value).startswith(f"{truncated}: ")
    (tmp_path / "one" / "c.ts").write_bytes(videos[2])  # a container the writer takes, by name
    with pytest.raises(SourceError, match=r"c\.ts: .*the reader opens \.mp4, \.m4v, \.mov files"):
        Reader(str(tmp_path / "one" / "c.ts"))
    (out / "stray.mp4").write_bytes(videos[0])  # a folder of shards and a loose video
    with pytest.raises(SourceError, match=r"out: holds both media files \(1, e.g. stray.mp4\)"):
        Reader(str(out))


def test_videos_only_the_writer_takes_are_left_out_with_a_warning(tmp_path) -> None:
    """An .avi, .mkv or .ts beside mp4 files (a folder, a tar without an index) is named in one
    warning per source instead of vanishing; a folder of nothing else reads no videos."""
    import tarfile

    video = make_video(VideoSpec(frames=12, seed=1))
    folder = tmp_path / "raw"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.mp4").write_bytes(video)
    (folder / "sub" / "b.mkv").write_bytes(video)
    (folder / "c.avi").write_bytes(video)
    left_out = r"raw: 2 videos left out \(e\.g\. c\.avi\).*\.mov files"
    with pytest.warns(SourceWarning, match=left_out), Reader(str(folder)) as reader:
        assert [reader.info(v).member for v in range(len(reader))] == ["a.mp4"]
    with warnings.catch_warnings():  # named once per source and process
        warnings.simplefilter("error")
        Reader(str(folder)).close()
    archive = tmp_path / "raw.tar"
    (tmp_path / "apple").write_bytes(APPLE_DOUBLE)
    with tarfile.open(archive, "w") as tar:
        tar.add(folder / "a.mp4", "a.mp4")
        tar.add(tmp_path / "apple", "._a.mp4")  # macOS's resource member: no video, no count
        tar.add(folder / "c.avi", "clips/c.ts")
    left_out = r"raw\.tar: 1 video left out \(e\.g\. clips/c\.ts\)"
    with pytest.warns(SourceWarning, match=left_out), Reader(str(archive)) as reader:
        assert len(reader) == 1
    shards = tmp_path / "shards"  # a writer's output with its source beside it
    shards.mkdir()
    with tarfile.open(shards / "shard_00000.tar", "w") as tar:
        tar.add(folder / "a.mp4", "a.mp4")
    (shards / "source.avi").write_bytes(video)
    with pytest.warns(SourceWarning, match="shards: 1 video left out"), Reader(str(shards)) as r:
        assert len(r) == 1
    (folder / "a.mp4").unlink()
    only_others = tmp_path / "only"
    shutil.copytree(folder, only_others)
    with (
        pytest.warns(SourceWarning, match="2 videos left out"),
        pytest.raises(SourceError, match="no videos found"),
    ):
        Reader(str(only_others))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_named_like_a_video_raises_instead_of_waiting(tmp_path) -> None:
    folder = tmp_path / "clips"
    folder.mkdir()
    (folder / "a.mp4").write_bytes(make_video(VideoSpec(frames=12, seed=1)))
    os.mkfifo(folder / "b.mp4")  # opening it for reading would wait for a writer forever
    with Reader(str(folder), size=16, threads=1) as reader:
        assert [reader.info(v).member for v in range(len(reader)) if v == 0] == ["a.mp4"]
        with pytest.raises(ClipError, match=r"clips/b.mp4.*not a regular file"):
            reader.read([(1, [0])])
        assert reader.read([(0, [0, 3])]).video.shape[:2] == (1, 2)


UNREADABLE = """
import sys
from kohakuclip import ImageReader, KohakuClipError, Reader

for reader in (Reader, ImageReader):
    try:
        reader([sys.argv[1]])
    except KohakuClipError as e:
        print(type(e).__name__, e)
"""


def test_a_folder_the_process_may_not_read_is_a_source_error(tmp_path) -> None:
    import sys

    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "a.mp4").write_bytes(b"x")
    done = run_locked_out([sys.executable, "-c", UNREADABLE, str(locked)], locked, 120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines == [
        f"SourceError {locked}: Permission denied",
        f"ImageSourceError {locked}: Permission denied",
    ]


def test_sample_skips_a_video_it_cannot_read_and_says_so_once(tmp_path) -> None:
    good = make_video(VideoSpec(frames=12, seed=1))
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "a.mp4").write_bytes(good)
    (folder / "b.mp4").write_bytes(good[:1000])  # truncated
    with Reader(str(folder), size=16) as reader:
        bad = 1  # the listing is sorted: a.mp4, b.mp4
        with pytest.warns(UserWarning, match=r"cannot read: .*raw/b\.mp4") as caught:
            first = reader.sample(20, 4, fps=6.0, seed=3)
            second = reader.sample(20, 4, fps=6.0, seed=3)  # known bad: no second warning
        assert len(caught) == 1
        assert first == second and len(first) == 20 and {v for v, _ in first} == {0}
        reader.read(first[:4])
        with pytest.raises(SourceError, match=r"raw/b\.mp4"):
            reader.sample(1, 4, videos=[bad])  # named, not drawn: raises
    (folder / "a.mp4").write_bytes(good[:900])
    with Reader(str(folder), size=16) as reader:
        for attempt in range(2):  # and again, once all are known bad (no endless redrawing)
            with (
                pytest.warns(UserWarning) if attempt == 0 else nullcontext(),
                pytest.raises(SourceError, match="no video of the sources can be read"),
            ):
                reader.sample(4, 4)


def test_sample_does_not_skip_a_video_for_a_passing_failure(tmp_path, monkeypatch) -> None:
    """Out of descriptors (or any failure of the system rather than the file) raises and
    leaves the video drawable: the next call gives the items the seed gives."""
    folder = tmp_path / "raw"
    folder.mkdir()
    for name in ("a.mp4", "b.mp4"):
        (folder / name).write_bytes(make_video(VideoSpec(frames=12, seed=1)))
    with Reader(str(folder), size=16) as reader:
        want = reader.sample(6, 4, seed=7)
    with Reader(str(folder), size=16) as reader:
        info = reader._catalog.info

        def out_of_descriptors(vid):
            try:
                raise OSError(errno.EMFILE, "Too many open files")
            except OSError as e:
                raise SourceError(f"raw/b.mp4: {e.strerror}") from None

        monkeypatch.setattr(reader._catalog, "info", out_of_descriptors)
        with pytest.raises(SourceError, match="Too many open files"):
            reader.sample(6, 4, seed=7)
        monkeypatch.setattr(reader._catalog, "info", info)
        assert reader.sample(6, 4, seed=7) == want

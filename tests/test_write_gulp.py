"""GulpIO directories as writer sources: every id one stored video, read back through Reader;
labels in the manifest and in VideoInfo.meta; the frame rate; broken chunks and frames skipped."""

from __future__ import annotations

import json
import os
import shutil

import cv2
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from kohakuclip import Reader, WriteError, write_videos
from kohakuclip.gulp import ChunkBuilder, GulpDirectory, open_gulp_source
from kohakuclip.write import cli
from kohakuclip.write.gulp_videos import DEFAULT_GULP_FPS, encode_gulp_video, list_gulp_videos
from kohakuclip.write.settings import EncodeSettings
from tests.media import VideoSpec, decode_rgb, frame_rgb, make_video, psnr

FAST = {"codec": "av1", "preset": 12, "crf": 20, "progress": False}
SIZE = 64

# id -> (chunk, frames, meta_data[0])
VIDEOS = {
    "vid00": (0, 12, {"label": "class 0", "fps": 8}),
    "vid01": (0, 10, {"label": "class 1"}),
    "v.2": (1, 9, {"label": {"verb": 3}, "frame_rate": 6, "caption": "a caption"}),
}


def _frames(id_: str) -> list[np.ndarray]:
    seed = list(VIDEOS).index(id_)
    spec = VideoSpec(width=120, height=90, seed=seed, blur=1.5)
    return [frame_rgb(spec, i) for i in range(VIDEOS[id_][1])]


@pytest.fixture(scope="module")
def gulp_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("gulp"))
    for chunk in (0, 1):
        with ChunkBuilder(
            os.path.join(root, f"data_{chunk}.gulp"), os.path.join(root, f"meta_{chunk}.gmeta")
        ) as builder:
            for id_, (c, _, meta) in VIDEOS.items():
                if c == chunk:
                    builder.add(id_, meta, _frames(id_))
    return root


@pytest.fixture(scope="module")
def written(gulp_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The gulp directory and one ordinary video written into one folder of shards."""
    out = str(tmp_path_factory.mktemp("shards"))
    extra = make_video(VideoSpec(codec="h264", width=96, height=64, frames=8))
    result = write_videos(out, [gulp_dir, ("plain.mp4", extra)], per_shard=2, **FAST)
    assert (result.videos, result.skipped, len(result.shards)) == (4, 0, 2)
    return out


def _shards(out: str) -> list[str]:
    return sorted(os.path.join(out, n) for n in os.listdir(out) if n.startswith("shard_"))


def _reference(frames: list[np.ndarray], crop: np.ndarray) -> np.ndarray:
    x, y, w, h = (int(v) for v in crop)
    resized = [
        np.asarray(Image.fromarray(f[y : y + h, x : x + w]).resize((SIZE, SIZE), Image.BILINEAR))
        for f in frames
    ]
    return np.stack(resized).transpose(0, 3, 1, 2)


def _luma(planar_rgb: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(np.ascontiguousarray(planar_rgb.transpose(1, 2, 0)), cv2.COLOR_RGB2GRAY)


def _soft(planar_rgb: np.ndarray) -> np.ndarray:
    return cv2.GaussianBlur(np.ascontiguousarray(planar_rgb.transpose(1, 2, 0)), (0, 0), 2.0)


def test_gulp_videos_read_back_like_the_gulp_frames(gulp_dir: str, written: str) -> None:
    gd = GulpDirectory(gulp_dir)
    with Reader(_shards(written), size=SIZE, crop="center") as reader:
        infos = {reader.info(v).member: (v, reader.info(v)) for v in range(len(reader))}
        assert sorted(infos) == ["plain.mp4", "v.2.mp4", "vid00.mp4", "vid01.mp4"]
        for id_, (_, count, _) in VIDEOS.items():
            vid, info = infos[f"{id_}.mp4"]
            assert (info.n, info.width, info.height, info.colorspace) == (count, 120, 90, "bt601")
            batch = reader.read([(vid, list(range(count)))])
            stored, _ = gd[id_]
            ref = _reference(stored, batch.crops[0])
            for t in range(count):
                # The stored 4:2:0 chroma loses the test pattern's sharp colour edges: luma is
                # checked as it is, colour (and so the matrix) a little blurred.
                assert psnr(_luma(batch.video[0, t]), _luma(ref[t])) >= 40, (id_, t)
                assert psnr(_soft(batch.video[0, t]), _soft(ref[t])) >= 37, (id_, t)


def test_labels_reach_the_manifest_and_reader_info(gulp_dir: str, written: str) -> None:
    table = pq.read_table(os.path.join(written, "manifest.parquet"))
    rows = {r["member"]: r for r in table.to_pylist()}
    index = open_gulp_source(gulp_dir)
    for id_, (_, count, meta) in VIDEOS.items():
        row = rows[f"{id_}.mp4"]
        assert row["source"] == f"{gulp_dir}::{id_}" and row["frames"] == count
        assert row["source_bytes"] == index.frames(index.position(id_))[2].sum()
        assert json.loads(row["meta"]) == meta
    assert rows["vid00.mp4"]["label"] == "class 0" and rows["vid00.mp4"]["caption"] is None
    assert rows["v.2.mp4"]["label"] == '{"verb": 3}'  # a label that is not text, as JSON
    assert rows["v.2.mp4"]["caption"] == "a caption"
    with Reader(_shards(written), size=16) as reader:
        metas = {reader.info(v).member: reader.info(v).meta for v in range(len(reader))}
    for id_, (_, _, meta) in VIDEOS.items():
        assert metas[f"{id_}.mp4"] == meta
    assert metas["plain.mp4"] == {}


def test_frame_rate_from_meta_default_or_option(gulp_dir: str, written: str, tmp_path) -> None:
    with Reader(_shards(written), size=16) as reader:
        fps = {reader.info(v).member: reader.info(v).fps for v in range(len(reader))}
    assert fps["vid00.mp4"] == 8.0 and fps["v.2.mp4"] == 6.0
    assert fps["vid01.mp4"] == DEFAULT_GULP_FPS == 12.0
    out = str(tmp_path / "at24")
    assert cli.main([out, gulp_dir, "--gulp-fps", "24", "--codec", "av1", "--preset", "12",
                     "--quiet"]) == 0  # fmt: skip
    with Reader(_shards(out), size=16) as reader:
        assert {reader.info(v).fps for v in range(len(reader))} == {24.0}
        assert sorted(reader.info(v).n for v in range(len(reader))) == [9, 10, 12]
    with open(os.path.join(out, "encoding.json")) as f:
        assert json.load(f)["gulp_fps"] == 24.0
    again = write_videos(out, [gulp_dir], gulp_fps=24, resume=True, codec="av1", preset=12,
                  progress=False)  # fmt: skip
    assert (again.videos, again.resumed_videos) == (0, 3)
    with pytest.raises(WriteError, match="gulp_fps"):
        write_videos(out, [gulp_dir], resume=True, codec="av1", preset=12, progress=False)
    with pytest.raises(ValueError, match="gulp_fps"):
        write_videos(str(tmp_path / "bad"), [gulp_dir], gulp_fps=0, progress=False)


def test_broken_chunks_and_frames_are_skipped_with_the_reason(gulp_dir: str, tmp_path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(gulp_dir, broken)
    index = open_gulp_source(str(broken))
    path, offsets, sizes = index.frames(index.position("vid01"))
    with open(path, "r+b") as f:  # frame 3 of vid01: not a JPEG any more
        f.seek(int(offsets[3]))
        f.write(b"\0" * int(sizes[3]))
    with open(broken / "data_1.gulp", "r+b") as f:  # chunk 1: its data file cut short
        f.truncate(100)
    shutil.copy(broken / "data_0.gulp", broken / "data_7.gulp")  # a data file without meta
    out = tmp_path / "out"
    result = write_videos(str(out), [str(broken)], **FAST)
    assert (result.videos, result.skipped) == (1, 3)
    with open(out / "skipped.jsonl") as f:
        skipped = {r["source"]: r["reason"] for r in map(json.loads, f)}
    assert "id 'vid01' frame 3" in skipped[f"{broken}::vid01"]
    assert "data_0.gulp" in skipped[f"{broken}::vid01"]
    meta_1 = str(broken / "meta_1.gmeta")
    assert "data_1.gulp: 100 bytes" in skipped[meta_1]
    assert "without its meta file" in skipped[str(broken / "data_7.gulp")]
    with Reader(_shards(str(out)), size=16) as reader:
        assert [reader.info(v).member for v in range(len(reader))] == ["vid00.mp4"]


def test_gray_odd_sized_frames_and_the_short_side_cap(tmp_path) -> None:
    spec = VideoSpec(width=101, height=75, seed=5, blur=2.0)
    gray = [cv2.cvtColor(frame_rgb(spec, i), cv2.COLOR_RGB2GRAY) for i in range(6)]
    root = str(tmp_path)
    with ChunkBuilder(f"{root}/data_0.gulp", f"{root}/meta_0.gmeta") as builder:
        builder.add("g", {}, gray)
    (video,) = list_gulp_videos(root)[0]
    assert video.fps == DEFAULT_GULP_FPS
    settings = EncodeSettings("av1", crf=20, preset=12, max_short=50)
    encoded = encode_gulp_video(video, settings)
    assert (encoded.width, encoded.height, encoded.frames) == (68, 50, 6)  # even, capped
    assert (encoded.source_width, encoded.source_height, encoded.colorspace) == (101, 75, "bt601")
    stored, _ = GulpDirectory(root)["g"]
    for decoded, frame in zip(decode_rgb(encoded.data), stored, strict=True):
        ref = cv2.resize(frame, (68, 50), interpolation=cv2.INTER_AREA)
        assert psnr(decoded, ref) >= 35
        assert np.abs(decoded.astype(int) - decoded[..., :1]).max() <= 6  # stays gray

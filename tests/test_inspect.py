"""``kohakuclip inspect``: the table, its JSON (against Reader.info and a PyAV probe), and the
contact sheet (against PyAV frames resized with Pillow)."""

from __future__ import annotations

import io
import json
import os
import threading

import av
import numpy as np
import pytest
from PIL import Image

from kohakuclip import Reader
from kohakuclip.cli import main
from kohakuclip.gulp import GulpDirectory
from kohakuclip.sheet import SheetLayout
from tests.media import psnr
from tests.shard_media import CAPTIONS, Corpus, make_corpus, probe


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return make_corpus(str(tmp_path_factory.mktemp("inspect")))


def _inspect_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["inspect", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_matches_reader_info_and_pyav(
    corpus: Corpus, capsys: pytest.CaptureFixture[str]
) -> None:
    sources = [corpus.zip, corpus.tar, corpus.folder, corpus.gulp]
    doc = _inspect_json(capsys, *sources)
    videos = doc["videos"]
    assert [v["source"] for v in videos] == [s for s in sources for _ in range(2)]
    for source in sources:
        mine = [v for v in videos if v["source"] == source]
        with Reader(source) as reader:
            assert len(mine) == len(reader)
            for vid, v in enumerate(mine):
                info = reader.info(vid)
                assert v["error"] is None
                assert (v["member"], v["frames"], v["fps"]) == (info.member, info.n, info.fps)
                assert (v["width"], v["height"]) == (info.width, info.height)
                assert (v["codec"], v["colorspace"]) == (info.codec, info.colorspace)
                assert v["meta"] == info.meta
                assert v["duration"] == pytest.approx(info.n / info.fps)
    for v in videos:
        name = os.path.basename(v["member"])
        if v["source"] == corpus.gulp:
            continue
        p = probe(corpus.data[name])
        assert (v["codec"], v["width"], v["height"]) == (p.codec, p.width, p.height)
        assert v["frames"] == p.frames
        assert v["fps"] == pytest.approx(p.fps)
        assert (v["bytes"], v["keyframes"], v["gop"]) == (p.bytes, p.keyframes, p.gop)
    captions = {v["member"]: v["meta"].get("caption") for v in videos if v["source"] == corpus.zip}
    assert captions == CAPTIONS  # from the manifest beside the zip shard
    gulp = GulpDirectory(corpus.gulp)
    for v in (v for v in videos if v["source"] == corpus.gulp):
        frames, meta = gulp[v["member"]]
        assert (v["frames"], v["keyframes"], v["gop"], v["codec"]) == (
            len(frames),
            len(frames),
            1,
            "jpeg",
        )
        assert v["meta"] == meta
    totals = doc["totals"]
    assert totals["videos"] == len(videos) and totals["errors"] == 0
    assert totals["frames"] == sum(v["frames"] for v in videos)
    assert totals["bytes"] == sum(v["bytes"] for v in videos)
    assert totals["codecs"] == {"av1": 3, "h264": 3, "jpeg": 2}


def test_table_rows_totals_and_unreadable_sources(
    corpus: Corpus, capsys: pytest.CaptureFixture[str], tmp_path: str
) -> None:
    assert main(["inspect", corpus.zip, corpus.folder]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for name, spec_frames in (("av1.mp4", "40"), ("h264.mp4", "36")):
        row = next(line for line in lines if line.startswith(name))
        assert spec_frames in row.split() and CAPTIONS[name][:20] in row
        assert any(line.startswith(f"sub/{name}") for line in lines)
    assert lines[-1].startswith("total: 4 videos (2 av1, 2 h264), 152 frames")

    broken = os.path.join(tmp_path, "broken")
    os.makedirs(broken)
    with open(os.path.join(broken, "cut.mp4"), "wb") as f:
        f.write(corpus.data["av1.mp4"][:2000])
    missing = os.path.join(tmp_path, "missing.zip")
    assert main(["inspect", corpus.zip, broken, missing]) == 1
    out = capsys.readouterr().out
    assert "cut.mp4  error:" in out and "truncated" in out
    assert f"{missing}: error:" in out
    # the missing shard is a source, not a video
    assert "total: 3 videos (1 av1, 1 h264, 1 unreadable), 1 source unreadable, 76 frames" in out

    empty = os.path.join(tmp_path, "empty")
    os.makedirs(empty)
    assert main(["inspect", empty]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{empty}: error: no videos found\n")
    assert "total: 0 videos (none), 1 source unreadable," in out


def _pyav_frames(data: bytes) -> list[np.ndarray]:
    with av.open(io.BytesIO(data)) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def test_contact_sheet(corpus: Corpus, capsys: pytest.CaptureFixture[str], tmp_path: str) -> None:
    out = os.path.join(tmp_path, "sheet.png")
    columns, thumb = 5, 40
    args = ["inspect", corpus.zip, "--sheet", out, "--columns", str(columns), "--thumb", str(thumb)]
    before = set(threading.enumerate())
    assert main([*args, "--threads", "2"]) == 0
    assert set(threading.enumerate()) <= before
    capsys.readouterr()
    layout = SheetLayout(columns, thumb)
    sheet = np.asarray(Image.open(out).convert("RGB"))
    with Image.open(out) as img:
        assert img.format == "PNG"
        assert img.size == layout.size(2)
        assert img.size == (layout.pad + columns * (thumb + layout.pad), sheet.shape[0])
    for row, name in enumerate(sorted(corpus.data)):
        frames = _pyav_frames(corpus.data[name])
        n = len(frames)
        for k in range(columns):
            frame = frames[int((k + 0.5) * n / columns)]
            h, w = frame.shape[:2]
            side = min(h, w)
            x0, y0 = ((w - side) // 2) & ~1, ((h - side) // 2) & ~1
            ref = Image.fromarray(frame[y0 : y0 + side, x0 : x0 + side])
            ref = np.asarray(ref.resize((thumb, thumb), Image.BILINEAR))
            x, y = layout.tile(row, k)
            assert psnr(sheet[y : y + thumb, x : x + thumb], ref) > 28, (name, k)
        x, y = layout.label(row, 0)
        text = sheet[y : y + layout.lines * layout.line, x : sheet.shape[1] - layout.pad]
        assert (text.min(axis=2) < 100).sum() > 50  # dark text under the row
    assert (sheet[: layout.pad] == 255).all()  # the margin stays blank

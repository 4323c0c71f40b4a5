"""``kohakuclip verify``: good sources pass; a flipped sample, a truncated member, an index that
disagrees with the moov and a wrong ``keep`` table are each reported naming the shard, the
member and the frame."""

from __future__ import annotations

import os
import struct
import threading
import zipfile

import numpy as np
import pytest

from kohakuclip import merge, pack, write_videos
from kohakuclip.check import Problem, verify
from kohakuclip.cli import main
from kohakuclip.formats import FRAME_RECORD, INDEX_MEMBER
from kohakuclip.mp4.faststart import faststart
from kohakuclip.storage.index import VideoIndex
from kohakuclip.storage.tar import list_tar
from kohakuclip.storage.zip import find_zip_member, list_zip
from tests.media import VideoSpec, make_video
from tests.shard_media import Corpus, copy_of, make_corpus, probe


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return make_corpus(str(tmp_path_factory.mktemp("verify")))


def _index(shard: str) -> tuple[VideoIndex, int]:
    """The shard's index and the absolute offset of its first frame record."""
    if shard.endswith(".tar"):
        member = next(m for m in list_tar(shard) if m.name == INDEX_MEMBER)
    else:
        member = find_zip_member(shard, INDEX_MEMBER)
    assert member is not None
    with open(shard, "rb") as f:
        f.seek(member.offset)
        raw = f.read(member.size)
    (length,) = struct.unpack("<Q", raw[8:16])
    return VideoIndex.from_buffer(raw), member.offset + (16 + length + 7) // 8 * 8


def _records(shard: str, name: str) -> tuple[np.ndarray, int]:
    """A video's records (a copy) and the absolute offset of its first one."""
    index, first = _index(shard)
    entry = next(v for v in index.videos if v.member == name)
    rows = index.frames[entry.row : entry.row + entry.n].copy()
    return rows, first + entry.row * FRAME_RECORD.itemsize


def _flip(path: str, offset: int, count: int = 4) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(count)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


def _at(problems: list[Problem], source: str, member: str) -> list[Problem]:
    return [p for p in problems if p.source == source and p.member == member]


def test_good_sources_pass(corpus: Corpus, capsys: pytest.CaptureFixture[str]) -> None:
    sources = [corpus.zip, corpus.tar, corpus.folder, corpus.gulp]
    before = set(threading.enumerate())
    report = verify(sources, threads=2, progress=False)
    assert set(threading.enumerate()) <= before  # every reader's threads joined
    assert report.problems == []
    assert (report.sources, report.videos) == (4, 8)
    assert report.frames == 3 * (40 + 36) + 6 + 7
    sampled = verify([corpus.zip, corpus.gulp], sample=5, seed=3, progress=False)
    assert sampled.ok and sampled.frames == 4 * 5
    assert main(["verify", corpus.zip, corpus.folder, "--sample", "6", "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert "verified 4 videos (24 frames) in 2 sources: no problems" in captured.out
    assert "24/24 frames" in captured.err  # the progress bar


@pytest.mark.parametrize(("shard", "name"), [("zip", "av1.mp4"), ("tar", "h264.mp4")])
def test_corrupted_sample_is_named(
    corpus: Corpus, tmp_path: str, capsys: pytest.CaptureFixture[str], shard: str, name: str
) -> None:
    source = getattr(corpus, shard)
    bad = copy_of(source, str(tmp_path), f"bad.{shard}")
    rows, _ = _records(bad, name)
    sample = 5  # a non-key sample: inside an AV1 frame's tile data, an H.264 NAL length field
    assert not rows["flags"][sample] & 1
    _flip(bad, int(rows["offset"][sample]) + (rows["size"][sample] // 2 if shard == "zip" else 0))
    frame = probe(corpus.data[name]).display[sample]
    report = verify(bad, progress=False)
    mine = _at(report.problems, bad, name)
    assert frame in {p.frame for p in mine}, [str(p) for p in mine]
    other = "h264.mp4" if name == "av1.mp4" else "av1.mp4"
    assert _at(report.problems, bad, other) == []
    if shard == "zip":  # the zip's CRC-32 of the member no longer matches
        assert any(p.frame is None and "CRC" in p.message for p in mine)
    assert main(["verify", bad, "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert f"{bad}: {name}: frame {frame}: " in out
    assert out.splitlines()[-1].endswith(f"{len(report.problems)} problems")


def test_truncated_member(corpus: Corpus, tmp_path: str) -> None:
    data = faststart(corpus.data["h264.mp4"])  # the moov survives the cut
    p = probe(data)
    cut = len(data) * 3 // 4
    expected = min(d for d, (pos, size) in zip(p.display, p.positions) if pos + size > cut)
    folder = os.path.join(tmp_path, "folder")
    os.makedirs(folder)
    with open(os.path.join(folder, "cut.mp4"), "wb") as f:
        f.write(data[:cut])
    with open(os.path.join(folder, "whole.mp4"), "wb") as f:
        f.write(data)
    archive = os.path.join(tmp_path, "noindex.zip")
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        z.writestr("a/cut.mp4", data[:cut])
        z.writestr("a/whole.mp4", data)
        z.writestr("a/moov_lost.mp4", corpus.data["av1.mp4"][:-200])  # moov at the end, cut
    for source, member in ((folder, "cut.mp4"), (archive, "a/cut.mp4")):
        report = verify(source, progress=False)
        problems = [p for p in report.problems if p.member != "a/moov_lost.mp4"]
        assert {p.member for p in problems} == {member}, [str(p) for p in report.problems]
        (problem,) = problems
        assert problem.frame == expected and "truncated" in problem.message
        assert report.frames == p.frames  # the whole copy was still checked
    (lost,) = [p for p in report.problems if p.member == "a/moov_lost.mp4"]
    assert lost.frame is None and "moov" in lost.message and lost.source == archive


def test_truncated_member_of_an_indexed_shard(corpus: Corpus, tmp_path: str) -> None:
    data = faststart(corpus.data["h264.mp4"])
    p = probe(data)
    whole = os.path.join(tmp_path, "whole.zip")
    pack(whole, [("a.mp4", faststart(corpus.data["av1.mp4"])), ("b.mp4", data)])
    with zipfile.ZipFile(whole) as z:
        index = z.read(INDEX_MEMBER)
    cut = len(data) // 2
    bad = os.path.join(tmp_path, "cut.zip")  # the same layout, b.mp4 cut short, the old index
    with zipfile.ZipFile(bad, "w", zipfile.ZIP_STORED) as z:
        for name, blob in (("a.mp4", faststart(corpus.data["av1.mp4"])), ("b.mp4", data[:cut])):
            z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), blob)
        z.writestr(zipfile.ZipInfo(INDEX_MEMBER, (1980, 1, 1, 0, 0, 0)), index)
    assert [m.offset for m in list_zip(bad)][:2] == [m.offset for m in list_zip(whole)][:2]
    past = {d for d, (pos, size) in zip(p.display, p.positions) if pos + size > cut}
    report = verify(bad, progress=False)
    assert _at(report.problems, bad, "a.mp4") == []
    mine = _at(report.problems, bad, "b.mp4")
    truncated = [q for q in mine if "truncated" in q.message]
    assert len(truncated) == 1 and truncated[0].frame == min(past)
    outside = {q.frame for q in mine if "outside the member" in q.message}
    assert outside and outside <= past


def test_index_that_disagrees_with_the_moov(corpus: Corpus, tmp_path: str) -> None:
    bad = copy_of(corpus.zip, str(tmp_path), "index.zip")
    rows, first = _records(bad, "h264.mp4")
    display = probe(corpus.data["h264.mp4"]).display
    size_at, flag_at = 7, 9
    with open(bad, "r+b") as f:
        record = FRAME_RECORD.itemsize
        f.seek(first + size_at * record + 8)
        f.write(struct.pack("<I", int(rows["size"][size_at]) + 1))
        f.seek(first + flag_at * record + 16)
        f.write(bytes([int(rows["flags"][flag_at]) | 1]))
    report = verify(bad, progress=False)
    mine = {(p.frame, p.message.split(" ")[1]) for p in _at(report.problems, bad, "h264.mp4")}
    assert (display[size_at], "size") in mine
    assert (display[flag_at], "keyframe") in mine
    index_crc = _at(report.problems, bad, INDEX_MEMBER)
    assert len(index_crc) == 1 and "CRC" in index_crc[0].message
    assert _at(report.problems, bad, "av1.mp4") == []


def test_wrong_keep_table_is_caught_by_the_full_decode(corpus: Corpus, tmp_path: str) -> None:
    bad = copy_of(corpus.tar, str(tmp_path), "keep.tar")  # tar: no CRC to give it away
    for name in ("av1.mp4", "h264.mp4"):
        rows, first = _records(bad, name)
        needed = np.flatnonzero((rows["keep"] > 0) & ((rows["flags"] & 1) == 0))
        assert len(needed)
        with open(bad, "r+b") as f:
            for i in needed.tolist():  # nothing would depend on these samples any more
                f.seek(first + i * FRAME_RECORD.itemsize + 12)
                f.write(struct.pack("<I", 0))
    report = verify(bad, progress=False)
    keep = [p for p in report.problems if "skip='keep'" in p.message]
    assert {p.member for p in keep} == {"av1.mp4", "h264.mp4"}
    assert all(p.frame is not None and p.source == bad for p in keep)
    # AV1 with its dependency table: skip=True follows the closure, not the keep table
    closure = [p for p in report.problems if "skip=True" in p.message]
    assert {p.member for p in closure} == {"h264.mp4"}
    assert not [p for p in report.problems if "reader:" in p.message or "PyAV" in p.message]


def test_problem_lines() -> None:
    assert str(Problem("s.zip", "a.mp4", 3, "bad")) == "s.zip: a.mp4: frame 3: bad"
    assert str(Problem("s.zip", "a.mp4", None, "bad")) == "s.zip: a.mp4: bad"
    assert str(Problem("dir", "", None, "gone")) == "dir: gone"


def test_unreadable_sources_are_problems(
    corpus: Corpus, tmp_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = os.path.join(tmp_path, "missing.zip")
    garbage = os.path.join(tmp_path, "garbage.zip")
    with open(garbage, "wb") as f:
        f.write(b"not a zip at all" * 100)
    report = verify([missing, garbage, corpus.zip], progress=False)
    assert [(p.source, p.member, p.frame) for p in report.problems] == [
        (missing, "", None),
        (garbage, "", None),
    ]
    assert "no such file" in report.problems[0].message
    assert "not a zip" in report.problems[1].message
    assert (report.sources, report.videos) == (3, 2)
    with pytest.raises(ValueError, match="sample must be at least 1"):
        verify(corpus.zip, sample=0)
    assert main(["verify", missing, "--no-progress"]) == 1
    assert capsys.readouterr().out.startswith(f"{missing}: no such file or directory")


def test_writer_output_folder_is_verified_shard_by_shard(
    tmp_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    videos = os.path.join(tmp_path, "videos")
    os.makedirs(videos)
    for i in range(3):
        spec = VideoSpec(width=48, height=32, frames=10 + i, seed=i)
        make_video(spec, os.path.join(videos, f"v{i}.mp4"))
    out = os.path.join(tmp_path, "out")
    write_videos(out, [videos], codec="h264", per_shard=2, workers=1, progress=False)
    shards = sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".zip"))
    assert len(shards) == 2
    report = verify(out, threads=1, progress=False)
    assert report.problems == []
    assert (report.sources, report.videos, report.frames) == (2, 3, 10 + 11 + 12)
    merge(out)  # the dataset view: the same shards
    assert verify(out, threads=1, progress=False) == report
    _flip(shards[1], find_zip_member(shards[1], "v2.mp4").offset + 2000)
    found = verify(out, threads=1, progress=False).problems
    assert found and {(p.source, p.member) for p in found} == {(shards[1], "v2.mp4")}
    assert main(["verify", out, "--no-progress", "--threads", "1"]) == 1
    assert "3 videos (33 frames) in 2 sources" in capsys.readouterr().out


@pytest.mark.parametrize("pix_fmt", ["yuv444p", "yuv422p"])
def test_non_420_h264_passes(tmp_path: str, pix_fmt: str) -> None:
    """The reader's ``yuv`` mode halves 4:4:4 and 4:2:2 chroma with a 2x2 (2x1) box; the
    reference must too (swscale's yuv420p conversion filters otherwise)."""
    path = os.path.join(tmp_path, f"{pix_fmt}.mp4")
    make_video(VideoSpec(width=64, height=48, frames=12, pix_fmt=pix_fmt), path)
    report = verify(path, threads=1, progress=False)
    assert report.problems == []
    assert (report.videos, report.frames) == (1, 12)


@pytest.mark.parametrize("pix_fmt, width", [("yuv444p", 97), ("yuv422p", 98)])
def test_odd_sized_444_and_422_h264_pass(tmp_path: str, pix_fmt: str, width: int) -> None:
    """The yuv mode's 4:2:0 chroma of an odd window: pairs halved inside the window (4:2:2
    needs an even width: its odd side is the height)."""
    path = os.path.join(tmp_path, "odd.mp4")
    make_video(VideoSpec(width=width, height=63, frames=12, pix_fmt=pix_fmt), path)
    assert verify(path, threads=1, progress=False).problems == []


def test_a_source_without_videos_is_a_problem(tmp_path: str) -> None:
    empty = os.path.join(tmp_path, "empty")
    os.makedirs(empty)
    report = verify(empty, progress=False)
    assert report.problems == [Problem(empty, "", None, "no videos found")]
    assert main(["verify", empty, "--no-progress"]) == 1

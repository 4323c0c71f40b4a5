"""``write_videos``: folders, tars and in-memory sources into shards with a manifest; bad sources
skipped; refusing, resuming and interrupted runs; the command lines."""

from __future__ import annotations

import json
import os
import sys
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kohakuclip import Source, WriteError, write_videos
from kohakuclip import cli as demo_cli
from kohakuclip.write import cli, shards
from tests.image_media import write_tar
from tests.media import VideoSpec, make_video
from tests.paths import run_locked_out
from tests.writer_media import read_index

FAST = {"codec": "av1", "preset": 12, "progress": False}


@cache
def clip(seed: int, frames: int = 20, codec: str = "h264", container: str = "mp4") -> bytes:
    spec = VideoSpec(
        codec=codec, container=container, width=128, height=80, frames=frames, seed=seed
    )
    return make_video(spec)


SIDECARS = {
    "a.txt": b"a red square\n",
    "a.json": json.dumps({"label": 3, "tags": ["x"]}).encode(),
    "sub/b.json": json.dumps({"caption": "from json", "label": "cat"}).encode(),
}


def corpus() -> dict[str, bytes]:
    """Three videos (mp4, avi, mkv) and their sidecars, by relative path."""
    return {
        "a.mp4": clip(0),
        "sub/b.avi": clip(1, 12, "mpeg4", "avi"),
        "c.mkv": clip(2, 16),
        **SIDECARS,
    }


def make_folder(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def make_tar(path: Path, files: dict[str, bytes]) -> Path:
    write_tar(path, files)
    return path


@contextmanager
def encoding_stops_at(monkeypatch: pytest.MonkeyPatch, n: int) -> Iterator[None]:
    """The block's run stops at its ``n``-th encode, as Ctrl-C would stop it there (the block
    must raise that KeyboardInterrupt); encoding is as before after it."""
    real = shards.encode_video
    calls: list[str] = []

    def stopping(data, settings, name, **kw):  # type: ignore[no-untyped-def]
        calls.append(name)
        if len(calls) == n:
            raise KeyboardInterrupt
        return real(data, settings, name, **kw)

    monkeypatch.setattr(shards, "encode_video", stopping)
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        monkeypatch.setattr(shards, "encode_video", real)


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard_*"))}


def manifest(out: Path) -> list[dict]:
    return pq.read_table(out / "manifest.parquet").to_pylist()


def test_folder_tar_and_bytes_sources_give_identical_shards(tmp_path) -> None:
    files = corpus()
    folder = make_folder(tmp_path / "videos", files)
    # archive order differs from the folder's sorted order: order the tar the same way
    ordered = {k: files[k] for k in ("a.mp4", "c.mkv", "sub/b.avi")} | SIDECARS
    archive = make_tar(tmp_path / "videos.tar", ordered)
    in_memory = [
        Source.from_bytes(
            "a.mp4", files["a.mp4"], caption="a red square", meta={"label": 3, "tags": ["x"]}
        ),
        Source.from_bytes("c.mkv", files["c.mkv"]),
        Source.from_bytes(
            "sub/b.avi", files["sub/b.avi"], meta={"caption": "from json", "label": "cat"}
        ),
    ]
    runs = {
        "folder": write_videos(tmp_path / "o1", [folder], per_shard=2, workers=1, **FAST),
        "tar": write_videos(tmp_path / "o2", [archive], per_shard=2, workers=3, **FAST),
        "bytes": write_videos(tmp_path / "o3", in_memory, per_shard=2, workers=2, **FAST),
    }
    for result in runs.values():
        assert (result.videos, result.skipped, result.shards) == (
            3,
            0,
            ["shard_00000.zip", "shard_00001.zip"],
        )
    first = shard_bytes(tmp_path / "o1")
    assert shard_bytes(tmp_path / "o2") == first == shard_bytes(tmp_path / "o3")
    rows = {k: manifest(tmp_path / k) for k in ("o1", "o2", "o3")}
    strip = [{k: v for k, v in r.items() if k != "source"} for r in rows["o1"]]
    for other in ("o2", "o3"):
        assert [{k: v for k, v in r.items() if k != "source"} for r in rows[other]] == strip
    assert [r["source"] for r in rows["o2"]] == [
        f"{archive}::{m}" for m in ("a.mp4", "c.mkv", "sub/b.avi")
    ]


def test_manifest_rows_describe_each_video(tmp_path) -> None:
    folder = make_folder(tmp_path / "videos", corpus())
    out = tmp_path / "out"
    result = write_videos(out, folder, per_shard=2, container="tar", **FAST)  # one path, not a list
    assert result.seconds == pytest.approx(20 / 24 + 16 / 24 + 12 / 24)
    rows = manifest(out)
    assert [(r["shard"], r["index"], r["member"]) for r in rows] == [
        ("shard_00000.tar", 0, "a.mp4"),
        ("shard_00000.tar", 1, "c.mp4"),
        ("shard_00001.tar", 0, "sub/b.mp4"),
    ]
    a, c, b = rows
    assert (a["caption"], a["label"], json.loads(a["meta"])) == (
        "a red square",
        "3",
        {"label": 3, "tags": ["x"]},
    )
    assert (b["caption"], b["label"]) == ("from json", "cat")
    assert (c["caption"], c["label"], c["meta"]) == (None, None, None)
    assert a["source"] == str(folder / "a.mp4")
    for row, frames in ((a, 20), (c, 16), (b, 12)):
        index, _ = read_index(str(out / row["shard"]))
        entry = index.videos[row["index"]]
        assert entry.member == row["member"]
        assert (row["frames"], row["fps"], row["duration"]) == (frames, 24.0, frames / 24)
        assert (row["width"], row["height"], row["source_width"], row["source_height"]) == (
            128,
            80,
            128,
            80,
        )
        with tarfile.open(out / row["shard"]) as t:
            assert t.getmember(row["member"]).size == row["bytes"]
        assert row["source_bytes"] == os.path.getsize(row["source"])
        assert (row["codec"], row["colorspace"]) == ("av1", "bt601")
    settings = json.loads((out / "encoding.json").read_text())
    assert settings["settings"] == {
        "codec": "av1",
        "crf": 36,
        "gop": 16,
        "preset": 12,
        "max_short": 512,
        "loop_filters": False,
    }
    assert (settings["container"], settings["per_shard"], settings["backend"]) == (
        "tar",
        2,
        "native",
    )


def test_bad_sources_are_skipped_with_a_reason(tmp_path) -> None:
    folder = make_folder(
        tmp_path / "videos",
        {
            "good.mp4": clip(0),
            "garbage.mp4": b"definitely not a video" * 40,
            "empty.mkv": b"",
            "cut.mp4": clip(1)[:2000],
            "labelled.mp4": clip(2),
            "labelled.json": b"{not json",
        },
    )
    broken_tar = tmp_path / "broken.tar"
    broken_tar.write_bytes(b"\x00garbage" * 100)
    out = tmp_path / "out"
    result = write_videos(out, [folder, broken_tar, ("also.mp4", clip(3))], **FAST)
    assert result.videos == 2
    assert [r["member"] for r in manifest(out)] == ["good.mp4", "also.mp4"]
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    reasons = {Path(s["source"]).name: s["reason"] for s in skipped}
    assert set(reasons) == {"cut.mp4", "empty.mkv", "garbage.mp4", "labelled.mp4", "broken.tar"}
    assert result.skipped == 5
    for name, reason in reasons.items():
        assert name in reason
    assert "JSON" in reasons["labelled.mp4"]
    assert not list(out.glob("*.tmp")) and not (out / shards.PARTS_DIR).exists()


def test_missing_source_fails_before_anything_is_written(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nowhere\.mp4"):
        write_videos(tmp_path / "out", [tmp_path / "nowhere.mp4"], **FAST)
    assert not (tmp_path / "out").exists()


def test_member_names_stay_unique(tmp_path) -> None:
    one = make_folder(tmp_path / "one", {"a.mp4": clip(0)})
    two = make_folder(tmp_path / "two", {"a.mkv": clip(1)})
    write_videos(tmp_path / "out", [one, two], **FAST)
    assert [r["member"] for r in manifest(tmp_path / "out")] == ["a.mp4", "a_1.mp4"]


def test_refuses_or_resumes_never_overwrites(tmp_path) -> None:
    out = tmp_path / "out"
    write_videos(out, [("a.mp4", clip(0))], **FAST)
    before = shard_bytes(out)
    with pytest.raises(WriteError, match="resume"):
        write_videos(out, [("a.mp4", clip(0))], **FAST)
    with pytest.raises(WriteError, match="different"):
        write_videos(out, [("a.mp4", clip(0))], resume=True, crf=30, **FAST)
    again = write_videos(out, [("a.mp4", clip(0)), ("b.mp4", clip(1))], resume=True, **FAST)
    assert (again.videos, again.resumed_videos, again.shards) == (1, 1, ["shard_00001.zip"])
    assert shard_bytes(out)["shard_00000.zip"] == before["shard_00000.zip"]
    assert [r["member"] for r in manifest(out)] == ["a.mp4", "b.mp4"]
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "shard_00000.zip").write_bytes(b"x")
    with pytest.raises(WriteError, match=r"encoding\.json"):
        write_videos(foreign, [("a.mp4", clip(0))], **FAST)


def test_interrupted_run_resumes_to_the_same_shards(tmp_path, monkeypatch) -> None:
    sources = [(f"v{i}.mp4", clip(i, 12)) for i in range(5)]
    straight = tmp_path / "straight"
    write_videos(straight, sources, per_shard=2, workers=1, **FAST)
    out = tmp_path / "out"
    with encoding_stops_at(monkeypatch, 4):
        write_videos(out, sources, per_shard=2, workers=1, **FAST)
    assert sorted(p.name for p in out.glob("shard_*")) == ["shard_00000.zip"]  # nothing partial
    assert not (out / "manifest.parquet").exists()
    (out / "shard_00002.zip.tmp").write_bytes(b"left by a crash")
    resumed = write_videos(out, sources, per_shard=2, workers=2, resume=True, **FAST)
    assert (resumed.videos, resumed.resumed_videos) == (3, 2)
    assert shard_bytes(out) == shard_bytes(straight)
    assert manifest(out) == manifest(straight)
    assert not list(out.glob("*.tmp"))


def test_a_name_the_tar_repeats_is_its_own_video_on_resume(tmp_path, monkeypatch) -> None:
    """Two members named alike are two videos with two sources (the second marked ``#2``): a
    run stopped after the first resumes to the straight run's shards, the second not lost."""
    archive = tmp_path / "dup.tar"
    write_tar(archive, [("a.mp4", clip(0, 12)), ("a.mp4", clip(1, 12))])
    straight = tmp_path / "straight"
    write_videos(straight, [archive], per_shard=1, workers=1, **FAST)
    rows = manifest(straight)
    assert [r["member"] for r in rows] == ["a.mp4", "a_1.mp4"]
    assert [r["source"] for r in rows] == [f"{archive}::a.mp4", f"{archive}::a.mp4#2"]
    out = tmp_path / "out"
    with encoding_stops_at(monkeypatch, 2):
        write_videos(out, [archive], per_shard=1, workers=1, **FAST)
    resumed = write_videos(out, [archive], per_shard=1, workers=1, resume=True, **FAST)
    assert (resumed.videos, resumed.resumed_videos) == (1, 1)
    assert manifest(out) == rows and shard_bytes(out) == shard_bytes(straight)


def test_a_source_given_twice_is_stored_twice_on_resume_too(tmp_path, monkeypatch) -> None:
    """A video reached through two inputs (its folder, and the file itself) is stored twice by a
    straight run, and so by a run stopped after the first copy and resumed."""
    folder = make_folder(
        tmp_path / "videos", {f"{n}.mp4": clip(i, 12) for i, n in enumerate("abc")}
    )
    sources = [folder, folder / "a.mp4"]
    straight = tmp_path / "straight"
    write_videos(straight, sources, per_shard=1, workers=1, **FAST)
    rows = manifest(straight)
    assert [r["source"] for r in rows].count(str(folder / "a.mp4")) == 2
    out = tmp_path / "out"
    with encoding_stops_at(monkeypatch, 4):
        write_videos(out, sources, per_shard=1, workers=1, **FAST)
    resumed = write_videos(out, sources, per_shard=1, workers=1, resume=True, **FAST)
    assert (resumed.videos, resumed.resumed_videos) == (1, 3)
    assert manifest(out) == rows and shard_bytes(out) == shard_bytes(straight)


def test_a_shard_without_saved_rows_is_redone(tmp_path) -> None:
    out = tmp_path / "out"
    sources = [(f"v{i}.mp4", clip(i, 12)) for i in range(3)]
    write_videos(out, sources[:2], per_shard=1, **FAST)
    # a crash between renaming a shard and saving its rows leaves a shard the run never finished
    orphan = out / "shard_00002.zip"
    orphan.write_bytes(b"stale")
    result = write_videos(out, sources, per_shard=1, resume=True, **FAST)
    assert result.shards == ["shard_00002.zip"]
    assert orphan.read_bytes() != b"stale"
    index, _ = read_index(str(orphan))
    assert [v.member for v in index.videos] == ["v2.mp4"]


def test_ffmpeg_backend_writes_the_same_layout(tmp_path) -> None:
    out = tmp_path / "out"
    result = write_videos(out, [("a.mp4", clip(0))], backend="ffmpeg", codec="h264", progress=False)
    assert result.videos == 1
    row = manifest(out)[0]
    assert (row["frames"], row["width"], row["height"], row["codec"]) == (20, 128, 80, "h264")
    assert json.loads((out / "encoding.json").read_text())["backend"] == "ffmpeg"


def test_write_cli(tmp_path, capsys) -> None:
    folder = make_folder(tmp_path / "videos", {"a.mp4": clip(0), "b.mp4": clip(1)})
    out = tmp_path / "out"
    args = [str(out), str(folder), "--codec", "hevc", "--preset", "ultrafast", "--crf", "30"]
    args += ["--per-shard", "1", "--container", "tar", "--workers", "2", "--quiet"]
    assert cli.main(args) == 0
    assert "2 videos" in capsys.readouterr().out
    assert sorted(p.name for p in out.glob("shard_*")) == ["shard_00000.tar", "shard_00001.tar"]
    settings = json.loads((out / "encoding.json").read_text())["settings"]
    assert (settings["codec"], settings["crf"], settings["preset"]) == ("hevc", 30, "ultrafast")
    assert cli.main(args) == 2
    assert "--resume" in capsys.readouterr().err
    assert cli.main([*args, "--resume"]) == 0


def test_demo_cli(tmp_path, capsys) -> None:
    code = demo_cli.main(["demo", "--videos", "2", "--seconds", "0.5", "--out", str(tmp_path)])
    assert code == 0
    assert "wrote 2 videos" in capsys.readouterr().out
    rows = manifest(tmp_path / "shards")
    assert [r["frames"] for r in rows] == [12, 12]
    assert all(r["caption"].startswith("sample video") for r in rows)


@pytest.mark.timeout(120)  # a FIFO read as a video would block forever
def test_dangling_links_fifos_and_symlink_loops_in_a_folder(tmp_path) -> None:
    src = make_folder(tmp_path / "src", {"a.mp4": clip(0)})
    (src / "dangling.mp4").symlink_to(tmp_path / "gone.mp4")
    os.mkfifo(src / "pipe.mp4")
    (src / "sub").mkdir()
    (src / "sub" / "loop").symlink_to(src)  # src/sub/loop/sub/loop/... is src again
    out = tmp_path / "out"
    result = write_videos(out, [src], **FAST)
    assert (result.videos, result.skipped) == (1, 2)
    assert [r["member"] for r in manifest(out)] == ["a.mp4"]
    lines = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    reasons = {Path(line["source"]).name: line["reason"] for line in lines}
    assert "cannot read" in reasons["dangling.mp4"]
    assert "not a regular file" in reasons["pipe.mp4"]


UNLISTABLE = """
import sys
from kohakuclip import write_videos

result = write_videos(sys.argv[2], [sys.argv[1]], codec="av1", preset=12, progress=False)
print(result.videos, result.skipped)
"""


@pytest.mark.timeout(300)
def test_a_folder_the_writer_may_not_list_is_in_the_skip_log(tmp_path) -> None:
    src = make_folder(tmp_path / "src", {"ok.mp4": clip(0), "locked/hidden.mp4": clip(1)})
    command = [sys.executable, "-c", UNLISTABLE, str(src), str(tmp_path / "out")]
    done = run_locked_out(command, src / "locked", 240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "1"]
    assert [r["member"] for r in manifest(tmp_path / "out")] == ["ok.mp4"]
    lines = [json.loads(x) for x in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    locked = str(src / "locked")
    assert [line["source"] for line in lines] == [locked]
    assert lines[0]["reason"].startswith(f"{locked}: cannot list (")


def test_a_corrupt_encoding_json_is_named(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    write_videos(out, [("a.mp4", clip(0))], **FAST)
    (out / "encoding.json").write_text("{oops")
    with pytest.raises(WriteError, match=r"encoding\.json: not a valid"):
        write_videos(out, [("a.mp4", clip(0))], resume=True, **FAST)
    folder = make_folder(tmp_path / "videos", {"a.mp4": clip(0)})
    assert cli.main([str(out), str(folder), "--resume", "--preset", "12", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith(f"kohakuclip-write: error: {out / 'encoding.json'}:")


def test_an_interrupt_while_a_shard_opens_leaves_no_partial_file(tmp_path, monkeypatch) -> None:
    """Ctrl-C landing after the shard's temporary file exists but before the writer holds the
    shard (an interrupt between two bytecodes) still removes that file."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.mp4").write_bytes(make_video(VideoSpec(frames=6, seed=1)))

    class Interrupted(shards.ShardWriter):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            raise KeyboardInterrupt

    monkeypatch.setattr(shards, "ShardWriter", Interrupted)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        write_videos(out, [src], preset=12, workers=1, progress=False)
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


def test_names_that_are_not_utf8_are_stored_escaped_and_resume(tmp_path) -> None:
    """A file and a tar member whose names are not UTF-8 are stored under their names with
    the bad bytes as ``\\xNN`` (zip members, manifest and skip log take only UTF-8); a resumed
    run finds them done."""
    raw = os.fsdecode(b"caf\xe9.mp4")  # Latin-1: a lone surrogate in Python
    folder = make_folder(tmp_path / "videos", {"good.mp4": clip(0)})
    (folder / raw).write_bytes(clip(1))
    archive = tmp_path / "videos.tar"
    write_tar(archive, [(raw, clip(2))])
    out = tmp_path / "out"
    result = write_videos(out, [folder, archive], **FAST)
    assert (result.videos, result.skipped) == (3, 0)
    rows = manifest(out)
    assert [r["member"] for r in rows] == ["caf\\xe9.mp4", "good.mp4", "caf\\xe9_1.mp4"]
    assert rows[0]["source"] == os.path.join(str(folder), "caf\\xe9.mp4")
    assert rows[2]["source"] == f"{archive}::caf\\xe9.mp4"
    again = write_videos(out, [folder, archive], resume=True, **FAST)
    assert (again.videos, again.resumed_videos) == (0, 3)

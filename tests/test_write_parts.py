"""Writing across machines: ``--part I/N`` runs as separate processes, ``kohakuclip merge`` and
the dataset view the readers use, a part killed mid-shard and resumed, and the Ray launcher, each
against a single run of the same job (the same AV1 bytes per video)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kohakuclip
from kohakuclip import (
    ClipError,
    MergeError,
    Part,
    Reader,
    Source,
    SourceError,
    WriteError,
    merge,
    write_videos,
)
from kohakuclip import cli as kohakuclip_cli
from kohakuclip.formats import INDEX_MEMBER
from kohakuclip.storage.index import VideoIndex
from kohakuclip.write import cli
from kohakuclip.write.parts import earlier_run, holds_run
from tests.media import VideoSpec, make_video

FAST = {"codec": "av1", "preset": 12, "per_shard": 2, "workers": 1, "progress": False}
FAST_ARGS = ["--codec", "av1", "--preset", "12", "--per-shard", "2", "--workers", "1", "--quiet"]
TIMEOUT = 120  # seconds any subprocess may take on a loaded machine


def _env() -> dict[str, str]:
    src = os.path.dirname(os.path.dirname(kohakuclip.__file__))
    paths = [src, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _part_command(out: Path, source: Path, part: str, *extra: str) -> list[str]:
    program = [sys.executable, "-m", "kohakuclip.write.cli", str(out), str(source)]
    return [*program, "--part", part, *FAST_ARGS, *extra]


def _run_all(commands: list[list[str]]) -> None:
    """Run the commands at once, as separate processes; each is killed past TIMEOUT."""
    procs = [
        subprocess.Popen(c, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for c in commands
    ]
    try:
        for p in procs:
            output, _ = p.communicate(timeout=TIMEOUT)
            assert p.returncode == 0, output.decode(errors="replace")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def _stored(out: Path) -> dict[str, tuple[int, bytes]]:
    """source -> (frames, the stored mp4's bytes), from the folder's manifest and shards."""
    found = {}
    for row in pq.read_table(out / "manifest.parquet").to_pylist():
        with zipfile.ZipFile(out / row["shard"]) as z:
            found[row["source"]] = (row["frames"], z.read(row["member"]))
    return found


def _skipped(path: Path) -> list[str]:
    return [json.loads(line)["source"] for line in path.read_text().splitlines() if line]


def _shards(out: Path, prefix: str = "") -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob(f"{prefix}*shard_*.zip"))}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    """Five tiny videos (96x64, 1 s), a caption, and a file that is no video."""
    root = tmp_path_factory.mktemp("sources")
    for i in range(5):
        make_video(VideoSpec(width=96, height=64, frames=24, seed=i), str(root / f"v{i}.mp4"))
    (root / "v3.txt").write_text("the fourth video")
    (root / "broken.mp4").write_bytes(b"not a video at all")
    return root


@pytest.fixture(scope="module")
def single(sources, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("single")
    result = write_videos(out, [sources], **FAST)
    assert result.videos == 5 and result.skipped == 1
    return out


@pytest.fixture(scope="module")
def parts(sources, tmp_path_factory) -> Path:
    """The job as two parts, run at once as separate processes, then merged."""
    out = tmp_path_factory.mktemp("parts")
    _run_all([_part_command(out, sources, f"{i}/2") for i in range(2)])
    assert kohakuclip_cli.main(["merge", str(out)]) == 0
    return out


@pytest.mark.timeout(300)
def test_parts_in_processes_merged_equal_a_single_run(single, parts, sources) -> None:
    assert _stored(parts) == _stored(single)  # same videos, frame counts and AV1 bytes
    names = sorted(p.name for p in parts.iterdir())
    for tag in ("part-00000-of-00002", "part-00001-of-00002"):
        assert f"{tag}.manifest.parquet" in names and f"{tag}.skipped.jsonl" in names
        assert any(n.startswith(f"{tag}.shard_") for n in names)
    # the broken file sorts first: part 0's skip log has it, the merged log too, nothing failed
    broken = str(sources / "broken.mp4")
    assert _skipped(parts / "part-00000-of-00002.skipped.jsonl") == [broken]
    assert _skipped(parts / "part-00001-of-00002.skipped.jsonl") == []
    assert _skipped(parts / "skipped.jsonl") == [broken]
    view = json.loads((parts / "dataset.json").read_text())
    shards = sorted(p.name for p in parts.glob("part-*.shard_*.zip"))
    assert [s["name"] for s in view["shards"]] == shards
    assert [s["bytes"] for s in view["shards"]] == [(parts / s).stat().st_size for s in shards]
    assert sum(s["count"] for s in view["shards"]) == view["count"] == 5
    rows = pq.read_table(parts / "manifest.parquet").to_pylist()
    assert next(r for r in rows if r["member"] == "v3.mp4")["caption"] == "the fourth video"


def test_rerunning_a_part_gives_byte_identical_shards(parts, sources, tmp_path) -> None:
    result = write_videos(tmp_path, [sources], part="1/2", **FAST)
    assert result.shards == sorted(_shards(parts, "part-00001"))
    assert _shards(tmp_path) == _shards(parts, "part-00001")


def test_reader_over_the_view_equals_the_listed_shards(parts, tmp_path) -> None:
    shards = sorted(str(p) for p in parts.glob("part-*.shard_*.zip"))
    elsewhere = tmp_path / "mounted-elsewhere"  # another machine's mount of the same folder
    shutil.copytree(parts, elsewhere)
    with (
        Reader(parts, size=32, seed=3) as view,
        Reader(shards, size=32, seed=3) as listed,
        Reader(elsewhere, size=32, seed=3) as other,
    ):
        assert len(view) == len(listed) == len(other) == 5
        for vid in range(5):
            a, b, c = view.info(vid), listed.info(vid), other.info(vid)
            assert (a.member, a.n, a.fps, a.width, a.height, a.codec, a.colorspace) == (
                b.member, b.n, b.fps, b.width, b.height, b.codec, b.colorspace
            )  # fmt: skip
            assert a.source == b.source and (c.member, c.n) == (a.member, a.n)
            assert a.meta == b.meta
        assert view.info(3).meta["caption"] == "the fourth video"
        spec = view.sample(4, 6, fps=12.0, seed=1)
        assert np.array_equal(view.read(spec).video, listed.read(spec).video)


def _mark_full_range(shard: Path, member: str) -> None:
    """Rewrite ``shard`` with its index saying ``member`` holds full-range samples."""
    with zipfile.ZipFile(shard) as z:
        stored = [(info.filename, z.read(info)) for info in z.infolist()]
    index = dict(stored)[INDEX_MEMBER]
    parsed = VideoIndex.from_buffer(index)
    videos = [replace(v, full_range=v.member == member) for v in parsed.videos]
    changed = replace(parsed, videos=videos).to_bytes()
    with zipfile.ZipFile(shard, "w", zipfile.ZIP_STORED) as z:
        for name, data in stored:
            z.writestr(name, changed if name == INDEX_MEMBER else data)


def test_a_full_range_video_reads_alike_through_the_view_and_its_shard(parts, tmp_path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(parts, copy)
    shard = sorted(copy.glob("part-*.shard_*.zip"))[0]
    member = VideoIndex.from_buffer(zipfile.ZipFile(shard).read(INDEX_MEMBER)).videos[0].member
    _mark_full_range(shard, member)
    merge(copy)
    merged = pq.read_table(copy / "manifest.parquet").to_pylist()
    assert [r["full_range"] for r in merged] == [r["member"] == member for r in merged]
    with (
        Reader(copy, size=32, crop="center") as view,
        Reader([shard], size=32, crop="center") as listed,
    ):
        vid = next(v for v in range(len(view)) if view.info(v).member == member)
        clip = [(vid, [0, 3, 5])]
        through_view, through_shard = view.read(clip), listed.read([(0, [0, 3, 5])])
        assert bool(through_view.full_range[0]) and bool(through_shard.full_range[0])
        assert np.array_equal(through_view.video, through_shard.video)
    older = pq.read_table(copy / "manifest.parquet").drop_columns(["full_range"])
    pq.write_table(older, copy / "manifest.parquet")  # merged before the column: limited range
    with Reader(copy, size=32) as view:
        assert not view.read(clip).full_range[0]


@pytest.mark.parametrize("column", ["fps", "frames", "codec", "member"])
def test_a_merged_manifest_with_a_missing_value_is_named(parts, tmp_path, column) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(parts, copy)
    table = pq.read_table(copy / "manifest.parquet")
    member = table.column("member")[2].as_py()
    values = table.column(column).to_pylist()
    values[2] = None
    where = table.column_names.index(column)
    table = table.set_column(where, column, pa.array(values, table.schema.field(column).type))
    pq.write_table(table, copy / "manifest.parquet")
    named = "a video without a name" if column == "member" else rf"video '{member}': a missing"
    with pytest.raises(SourceError, match=rf"copy: {named}"):
        Reader(copy, size=32)


def test_view_reader_names_a_shard_replaced_after_the_merge(parts, tmp_path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(parts, copy)
    victim = sorted(copy.glob("part-*.shard_*.zip"))[0]
    victim.write_bytes(victim.read_bytes() + b"\0")
    with Reader(copy, size=32) as reader, pytest.raises(ClipError, match=victim.name) as caught:
        reader.read([(0, [0, 1])])  # video 0 is in the first shard
    assert "merge again" in str(caught.value)


def test_merge_refuses_missing_or_unfinished_parts(sources, tmp_path) -> None:
    write_videos(tmp_path, [sources], part="0/3", **FAST)
    write_videos(tmp_path, [sources], part="2/3", **FAST)
    with pytest.raises(MergeError, match="missing 1/3"):
        merge(tmp_path)
    os.mkdir(tmp_path / ".part-00002-of-00003.manifest-parts")
    with pytest.raises(MergeError, match="unfinished 2/3"):
        merge(tmp_path)


def test_what_shows_an_earlier_run() -> None:
    """One rule for both writers, folders and URL prefixes: a whole run clashes with any
    writer's shard, manifest, skip log or settings; a part only with its own files, record,
    half-written files and unfinished manifest rows."""
    other, own, part = "part-00001-of-00002.", "part-00000-of-00002.", Part(0, 2)
    beside = [f"{other}{n}" for n in ("shard_00000.zip", "skipped.jsonl", "encoding.json")]
    beside += [f"{other}manifest.parquet.tmp", "dataset.json", "notes.txt"]
    assert earlier_run(beside, part) is None and not holds_run(beside, part)
    for name in ("shard_00003.tar", "manifest.parquet", "skipped.jsonl", "encoding.json"):
        assert earlier_run([*beside, own + name], part) == own + name
    for name in (f"{own}shard_00000.zip.tmp", f".{own}manifest-parts"):
        assert earlier_run([*beside, name], part) == name
    assert earlier_run(["notes.txt", "dataset.json", "x.tmp"], None) is None
    for name in ("shard_00000.zip", "manifest.parquet", "skipped.jsonl", "encoding.json"):
        assert earlier_run(["notes.txt", name], None) == name and holds_run([name], None)
    assert earlier_run(beside, None) == f"{other}shard_00000.zip"  # any writer's shard


def test_part_arguments_and_folders_that_do_not_fit(sources, tmp_path) -> None:
    for bad in ("2/2", "-1/2", "1/0", "1-2", "a/b"):
        with pytest.raises(ValueError, match="I/N"):
            Part.parse(bad)
    with pytest.raises(SystemExit) as usage:  # an argparse error, before anything is read
        cli.main([str(tmp_path / "x"), str(sources), "--part", "3/2", *FAST_ARGS])
    assert usage.value.code == 2
    write_videos(tmp_path, [sources], part="0/2", **FAST)
    with pytest.raises(WriteError, match="different parts"):
        write_videos(tmp_path, [sources], part="0/3", **FAST)
    with pytest.raises(WriteError, match="different settings"):
        write_videos(tmp_path, [sources], part="1/2", **{**FAST, "preset": 11})
    with pytest.raises(WriteError, match="part 0/2"):  # an earlier run of this part: --resume
        write_videos(tmp_path, [sources], part="0/2", **FAST)
    again = write_videos(tmp_path, [sources], part="0/2", resume=True, **FAST)
    assert again.videos == 0 and again.resumed_videos == 2
    with pytest.raises(ValueError, match="part or ray"):
        write_videos(tmp_path, [sources], part="0/2", ray=True, **FAST)


@pytest.mark.timeout(300)
def test_part_killed_mid_shard_leaves_no_finished_shard_and_resumes(tmp_path) -> None:
    source = tmp_path / "videos"
    source.mkdir()
    for i in range(4):
        spec = VideoSpec(width=128, height=80, frames=48, seed=10 + i)
        make_video(spec, str(source / f"k{i}.mp4"))
    out, straight = tmp_path / "out", tmp_path / "straight"
    command = _part_command(out, source, "0/1", "--per-shard", "4")
    proc = subprocess.Popen(command, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    temp = out / "part-00000-of-00001.shard_00000.zip.tmp"
    try:
        deadline = time.monotonic() + TIMEOUT
        while not temp.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert proc.poll() is None, "the part finished before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        assert proc.stderr is not None
        proc.stderr.close()
    assert temp.exists()  # killed while the shard was open
    assert not list(out.glob("part-*.shard_*.zip")) and not (out / "manifest.parquet").exists()
    with pytest.raises(MergeError):
        merge(out)
    settings = {**FAST, "per_shard": 4}
    result = write_videos(out, [source], part="0/1", resume=True, **settings)
    assert result.videos == 4 and not temp.exists()
    write_videos(straight, [source], part="0/1", **settings)
    assert _shards(out) == _shards(straight)
    merge(out)
    with Reader(out, size=32) as reader:
        assert sorted(reader.info(v).member for v in range(len(reader))) == [
            f"k{i}.mp4" for i in range(4)
        ]


@pytest.mark.timeout(300)
def test_ray_stores_the_same_videos_as_the_parts(
    local_ray, sources, single, parts, tmp_path, capsys
) -> None:
    result = write_videos(tmp_path, [sources], ray=True, ray_parts=2, **{**FAST, "progress": True})
    assert (result.videos, result.skipped) == (5, 1)
    assert "6/6" in capsys.readouterr().err  # one bar over both tasks: 5 videos and the broken file
    assert _stored(tmp_path) == _stored(parts) == _stored(single)
    assert _shards(tmp_path) == _shards(parts)
    assert json.loads((tmp_path / "dataset.json").read_text())["count"] == 5
    with pytest.raises(WriteError, match="earlier run"):
        write_videos(tmp_path, [sources], ray=True, ray_parts=2, **FAST)
    again = write_videos(tmp_path, [sources], ray=True, resume=True, **FAST)  # the split it had
    assert again.videos == 0 and again.resumed_videos == 5
    whole = shutil.copytree(single, tmp_path / "whole")  # a run not split into parts
    with pytest.raises(WriteError, match="not split into parts"):
        write_videos(whole, [sources], ray=True, resume=True, **FAST)


def test_clip_dataset_over_the_view_gives_the_listed_shards_batches(parts) -> None:
    torch_module = pytest.importorskip("kohakuclip.torch")
    shards = sorted(str(p) for p in parts.glob("part-*.shard_*.zip"))

    def batches(sources: object) -> list:
        ds = torch_module.ClipDataset(
            sources, 2, frames=4, fps=12.0, threads=1, size=32, with_meta=True
        )
        try:
            return [ds.read_batch(i) for i in range(2)]
        finally:
            ds.close()

    for (a, meta_a), (b, meta_b) in zip(batches(str(parts)), batches(shards), strict=True):
        assert np.array_equal(a.numpy(), b.numpy())
        assert meta_a["member"] == meta_b["member"] and meta_a["source"] == meta_b["source"]


@pytest.mark.timeout(300)
def test_ray_retries_a_part_whose_worker_died(local_ray, sources, single, tmp_path) -> None:
    marker = tmp_path / "crashed-once"

    class CrashOnce(Source):
        """Kills the Ray worker encoding it the first time it is read (pickled by value)."""

        def load(self) -> str | bytes:
            if not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)
            return super().load()

    videos = sorted(sources.glob("v*.mp4"))
    items: list = [str(p) for p in videos[:4]]
    last = videos[4]
    items.append(CrashOnce(last.name, str(last), last.stat().st_size, {}, path=str(last)))
    out = tmp_path / "out"
    result = write_videos(out, items, ray=True, ray_parts=2, **FAST)
    assert marker.exists() and result.videos == 5
    expected = {k: v for k, v in _stored(single).items() if "broken" not in k}
    assert _stored(out) == expected

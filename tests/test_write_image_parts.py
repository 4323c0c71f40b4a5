"""``kohakuclip-write-images --part I/N``: parts merged equal a single run, re-runs give the same
bytes, ``--resume`` keeps a finished part, ImageReader over the dataset view equals the listed
shards, and ``--ray`` (a local Ray) writes the same parts and merges them."""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from kohakuclip import ImageReader, Reader, WriteError
from kohakuclip import cli as kohakuclip_cli
from kohakuclip.storage.video_listing import SourceError
from kohakuclip.write import image_cli, image_sources
from kohakuclip.write.images import write_images
from kohakuclip.write.merge import MergeError, merge
from tests.image_media import encode, photo, write_tar

FAST = {"max_short": 64, "min_short": 32, "per_shard": 2, "workers": 1, "progress": False}


def _stored(out: Path) -> dict[str, bytes]:
    """source -> stored image bytes, from the folder's manifest and shards."""
    found = {}
    for row in pq.read_table(out / "manifest.parquet").to_pylist():
        with zipfile.ZipFile(out / row["shard"]) as z:
            found[row["source"]] = z.read(row["member"])
    return found


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """Five small photos (one with a caption) and one too small to store."""
    root = tmp_path_factory.mktemp("images")
    for i in range(5):
        data = encode(Image.fromarray(photo(48 + 8 * i, 80, seed=i)), "JPEG", quality=90)
        (root / f"p{i}.jpg").write_bytes(data)
    (root / "p2.txt").write_text("the third photo")
    (root / "tiny.png").write_bytes(encode(Image.fromarray(photo(16, 16, seed=9)), "PNG"))
    return root


@pytest.fixture(scope="module")
def single(images, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("single")
    summary = write_images(out, [images], **FAST)
    assert (summary.images, summary.skipped) == (5, 1)
    merge(out)
    return out


@pytest.fixture(scope="module")
def parts(images, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("parts")
    for i in range(2):
        args = [str(out), str(images), "--part", f"{i}/2", "--max-short", "64"]
        args += ["--min-short", "32", "--per-shard", "2", "--workers", "1", "--no-progress"]
        assert image_cli.main(args) == 0
    assert kohakuclip_cli.main(["merge", str(out)]) == 0
    return out


def test_image_parts_merged_equal_a_single_run(single, parts, images) -> None:
    assert _stored(parts) == _stored(single)
    for tag in ("part-00000-of-00002", "part-00001-of-00002"):
        for name in ("manifest.parquet", "skipped.jsonl", "encoding.json"):
            assert (parts / f"{tag}.{name}").is_file()
    skipped = [json.loads(line) for line in (parts / "skipped.jsonl").read_text().splitlines()]
    assert [(s["source"], s["reason"]) for s in skipped] == [
        (str(images / "tiny.png"), "too small")
    ]
    view = json.loads((parts / "dataset.json").read_text())
    assert view["kind"] == "image" and view["count"] == 5


def test_image_part_rerun_is_byte_identical_and_resume_keeps_it(parts, images, tmp_path) -> None:
    summary = write_images(tmp_path, [images], part="1/2", **FAST)
    names = sorted(p.name for p in parts.glob("part-00001-of-00002.shard_*.zip"))
    assert [Path(p).name for p in summary.shards] == names
    for name in names:
        assert (tmp_path / name).read_bytes() == (parts / name).read_bytes()
    stamps = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    again = write_images(tmp_path, [images], part="1/2", resume=True, **FAST)
    assert (again.images, again.skipped, again.shards) == (2, 1, summary.shards)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == stamps
    (tmp_path / "part-00001-of-00002.encoding.json").unlink()  # unfinished: written again
    (tmp_path / names[0]).write_bytes(b"half a shard")
    killed = tmp_path / f"{names[-1]}.tmp"  # what a kill leaves of the shard being written
    killed.write_bytes(b"cut short")
    write_images(tmp_path, [images], part="1/2", resume=True, **FAST)
    assert (tmp_path / names[0]).read_bytes() == (parts / names[0]).read_bytes()
    assert not killed.exists()
    with pytest.raises(ValueError, match="parts"):
        write_images(tmp_path, [images], part="0/3", **FAST)


def test_a_resume_clears_the_pending_rows_a_kill_left_after_the_record(images, tmp_path):
    """Killed between its record and the removal of its pending rows, a part is finished but
    ``merge`` takes it for unfinished: ``--resume`` keeps it and clears them."""
    for i in range(2):
        write_images(tmp_path, [images], part=f"{i}/2", **FAST)
    pending = tmp_path / ".part-00001-of-00002.manifest-parts"
    pending.mkdir()
    (pending / "part-00001-of-00002.shard_00000.zip.parquet").write_bytes(b"rows")
    with pytest.raises(MergeError, match="unfinished"):
        merge(tmp_path)
    again = write_images(tmp_path, [images], part="1/2", resume=True, **FAST)
    assert again.images == 2 and not pending.exists()
    merge(tmp_path)


def test_a_stopped_run_resumes_after_its_finished_shards(images, single, tmp_path, monkeypatch):
    from kohakuclip.write import images as writer

    encoded: list[str] = []
    job = writer._job

    def stopping(item, settings):
        encoded.append(Path(item.origin).name)
        if item.origin.endswith("p4.jpg") and not (tmp_path / "stopped").exists():
            (tmp_path / "stopped").touch()
            raise KeyboardInterrupt  # the run stops here, as Ctrl-C or a kill stops it
        return job(item, settings)

    monkeypatch.setattr(writer, "_job", stopping)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        write_images(out, [images], **FAST)
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("shard_*.zip")}
    assert sorted(kept) == ["shard_00000.zip", "shard_00001.zip"]  # p0 p1, p2 p3
    with pytest.raises(WriteError, match="cannot resume with different quality"):
        write_images(out, [images], resume=True, **{**FAST, "quality": 80})
    encoded.clear()
    summary = write_images(out, [images], resume=True, **FAST)
    assert encoded == ["p4.jpg", "tiny.png"]  # the kept shards' images are not encoded again
    assert (summary.images, summary.skipped, len(summary.shards)) == (5, 1, 3)
    assert {name: (out / name).stat().st_mtime_ns for name in kept} == kept
    assert _stored(out) == _stored(single)
    for name in ("skipped.jsonl", "encoding.json", "shard_00002.zip"):
        assert (out / name).read_bytes() == (single / name).read_bytes(), name
    rows = pq.read_table(out / "manifest.parquet").to_pylist()
    assert rows == pq.read_table(single / "manifest.parquet").to_pylist()  # merged: same rows
    assert not (out / ".manifest-parts").exists()
    with pytest.raises(WriteError, match="cannot resume with different quality"):
        write_images(out, [images], resume=True, **{**FAST, "quality": 80})  # finished, too


def test_a_killed_parts_leftover_alone_is_an_earlier_run_of_it(images, tmp_path) -> None:
    killed = "part-00001-of-00002.shard_00000.zip.tmp"
    (tmp_path / killed).write_bytes(b"cut short")
    with pytest.raises(WriteError, match=rf"part 1/2 \({re.escape(killed)}\)"):
        write_images(tmp_path, [images], part="1/2", **FAST)
    write_images(tmp_path, [images], part="0/2", **FAST)  # another part's is not
    assert (tmp_path / killed).read_bytes() == b"cut short"


def test_image_reader_over_the_view_equals_the_listed_shards(parts, single) -> None:
    shards = sorted(str(p) for p in parts.glob("part-*.shard_*.zip"))
    with (
        ImageReader(parts, size=32, crop="center") as view,
        ImageReader(shards, size=32, crop="center") as listed,
        ImageReader(single, size=32, crop="center") as whole,
    ):
        assert len(view) == len(listed) == len(whole) == 5
        for i in range(5):
            a, b = view.info(i), listed.info(i)
            assert (a.member, a.width, a.height, a.size, a.source) == (
                b.member, b.width, b.height, b.size, b.source
            )  # fmt: skip
            assert a.meta == b.meta
        ids = list(range(5))
        assert np.array_equal(view.read(ids, seed=0).video, listed.read(ids, seed=0).video)
        assert np.array_equal(view.read(ids, seed=0).video, whole.read(ids, seed=0).video)
        assert view.info(2).meta.get("caption") == "the third photo"


def test_a_video_reader_refuses_an_image_view_and_a_bad_view_is_named(parts, tmp_path) -> None:
    with pytest.raises(SourceError, match="dataset view of images"):
        Reader(parts)
    copy = tmp_path / "copy"
    shutil.copytree(parts, copy)
    (copy / "dataset.json").write_text("{}")
    with pytest.raises(ValueError, match=r"dataset\.json"):
        ImageReader(copy)


def _files(out: Path, pattern: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob(pattern))}


@pytest.mark.timeout(300)
def test_ray_stores_the_same_images_as_the_parts(local_ray, images, parts, tmp_path, capsys):
    args = [str(tmp_path), str(images), "--ray", "--ray-parts", "2", "--max-short", "64"]
    args += ["--min-short", "32", "--per-shard", "2", "--workers", "1"]
    assert image_cli.main(args) == 0
    err = capsys.readouterr().err
    assert "6/6" in err  # one bar over both tasks: 5 images and the one too small
    assert "5 images in 3 shards, 1 skipped" in err
    rows = pq.read_table(tmp_path / "manifest.parquet").to_pylist()
    assert rows == pq.read_table(parts / "manifest.parquet").to_pylist()
    assert _files(tmp_path, "part-*") == _files(parts, "part-*")  # shards, manifests, records
    for name in ("skipped.jsonl", "dataset.json"):
        assert (tmp_path / name).read_bytes() == (parts / name).read_bytes(), name
    with pytest.raises(WriteError, match="earlier run"):
        write_images(tmp_path, [images], ray=True, ray_parts=2, **FAST)


@pytest.mark.timeout(300)
def test_a_resumed_ray_run_keeps_a_finished_part(local_ray, images, parts, tmp_path) -> None:
    write_images(tmp_path, [images], part="0/3", **FAST)  # not the split 2 CPUs would choose
    kept = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("part-00000-of-00003.*")}
    summary = write_images(tmp_path, [images], ray=True, resume=True, **FAST)  # the split it had
    assert (summary.images, summary.skipped, len(summary.shards)) == (5, 1, 3)
    assert {name: (tmp_path / name).stat().st_mtime_ns for name in kept} == kept
    assert len(list(tmp_path.glob("part-0000[12]-of-00003.manifest.parquet"))) == 2
    assert _stored(tmp_path) == _stored(parts)  # the same image bytes, however split
    with pytest.raises(ValueError, match="part or ray"):
        write_images(tmp_path, [images], part="0/2", ray=True, **FAST)
    with pytest.raises(ValueError, match="needs ray"):
        write_images(tmp_path, [images], ray_parts=2, **FAST)


def _captioned(root: Path) -> list[str]:
    """Four photos with captions in a folder and two in a tar with caption members: the stems
    (tar members as ``wds.tar:<stem>``) in origin order."""
    folder = root / "folder"
    folder.mkdir()
    members = {}
    for i in range(6):
        data = encode(Image.fromarray(photo(48, 64, seed=20 + i)), "JPEG", quality=90)
        if i < 4:
            (folder / f"f{i}.jpg").write_bytes(data)
            (folder / f"f{i}.txt").write_text(f"photo {i}")
        else:
            members[f"t{i}.jpg"] = data
            members[f"t{i}.txt"] = f"member {i}".encode()
    write_tar(str(root / "wds.tar"), members)
    return ["f0", "f1", "f2", "f3", "wds.tar:t4", "wds.tar:t5"]


def _count_sidecar_reads(monkeypatch) -> list[str]:
    """The stems whose caption a source reads (a file's sidecar, a tar's caption member)."""
    read: list[str] = []
    sidecar, member = image_sources._sidecar, image_sources._read_member

    def counted_sidecar(path: str) -> str | None:
        if path.endswith(".txt"):
            read.append(Path(path).stem)
        return sidecar(path)

    def counted_member(path: str, m):  # only the caption members: images are read later
        if m.name.endswith(".txt"):
            read.append(f"{Path(path).name}:{m.name[:-4]}")
        return member(path, m)

    monkeypatch.setattr(image_sources, "_sidecar", counted_sidecar)
    monkeypatch.setattr(image_sources, "_read_member", counted_member)
    return read


def test_a_part_reads_only_its_own_images_sidecars(tmp_path, monkeypatch) -> None:
    stems = _captioned(tmp_path)
    read = _count_sidecar_reads(monkeypatch)
    sources = [tmp_path / "folder", tmp_path / "wds.tar"]
    for index, mine in ((0, stems[:3]), (1, stems[3:])):
        read.clear()
        summary = write_images(tmp_path / "out", sources, part=f"{index}/2", **FAST)
        assert summary.images == 3
        assert sorted(read) == mine  # each caption of the part once, none of the other's
    rows = []
    for index in range(2):
        rows += pq.read_table(tmp_path / "out" / f"part-{index:05d}-of-00002.manifest.parquet")[
            "caption"
        ].to_pylist()
    assert rows == [f"photo {i}" for i in range(4)] + ["member 4", "member 5"]


def test_the_ray_drivers_count_reads_no_sidecar(tmp_path, monkeypatch) -> None:
    _captioned(tmp_path)
    read = _count_sidecar_reads(monkeypatch)
    sources = [str(tmp_path / "folder"), str(tmp_path / "wds.tar")]
    assert image_sources.count_sources(sources) == 6
    assert read == []
    assert len(list(image_sources.iter_sources(sources))) == 6 and len(read) == 6

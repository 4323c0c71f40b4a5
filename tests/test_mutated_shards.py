"""Fuzzing: shards with random bytes changed in their samples, their index and their zip directory.

Every mutated shard (video: AV1, H.264, HEVC members; image: JPEG members of an indexed shard,
a plain tar, a folder and a zip made with compression, whose sizes compiled code reads from the
JPEG headers, inflating the zip's members first) and GulpIO
directory (JPEG records; ``.gmeta`` files, numbers changed as well as bytes, so that many stay
valid JSON) is opened and read in a child process, video batches holding several clips of one
video so that decoding groups are fuzzed too: a crash in compiled code (libdav1d, libavcodec,
the numba drivers) would kill it, a hang would run it past its time, any exception but a
``KohakuClipError`` (the errors about the data) would end it with a traceback. The intact
source must still read afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from PIL import Image

from kohakuclip.gulp.meta import find_chunks, frame_table, load_meta
from kohakuclip.write.images import write_images
from kohakuclip.write.pack import pack
from tests.image_media import photo
from tests.media import VideoSpec, make_video, write_gulp_dir

VIDEOS = {
    "av1.mp4": VideoSpec(codec="av1", width=96, height=64, frames=40, blur=1.5),
    "h264.mp4": VideoSpec(codec="h264", width=96, height=64, frames=40, seed=1, blur=1.5),
    "hevc.mp4": VideoSpec(codec="hevc", width=96, height=64, frames=30, seed=2, blur=1.5),
}
REGIONS = ("samples", "index", "directory")
MUTATIONS = 100  # per region
SECONDS = 300  # for the whole child run: a hang shows as running past it


Spans = list[tuple[str, int, int]]
"""(file, start, end): byte ranges of the files of a source (file "" for a one-file shard)."""


@dataclass(frozen=True)
class Regions:
    """Byte ranges of a source: its members' data, its index, and its directory (a zip's
    central directory and end record; a tar's member headers; none in a gulp directory, whose
    ``.gmeta`` files are its index)."""

    samples: Spans
    index: Spans
    directory: Spans


def _regions(path: str) -> Regions:
    if os.path.isdir(path) and any(name.endswith(".gmeta") for name in os.listdir(path)):
        return _gulp_regions(path)
    if os.path.isdir(path):  # a folder of image files: each file whole
        names = sorted(os.listdir(path))
        return Regions([(n, 0, os.path.getsize(os.path.join(path, n))) for n in names], [], [])
    spans: dict[str, tuple[str, int, int]] = {}
    if path.endswith(".tar"):
        with tarfile.open(path) as archive:
            members = archive.getmembers()
        for m in members:
            spans[m.name] = ("", m.offset_data, m.offset_data + m.size)
        headers = [("", m.offset, m.offset_data) for m in members]
    else:
        with zipfile.ZipFile(path) as archive, open(path, "rb") as f:
            for info in archive.infolist():
                f.seek(info.header_offset + 26)
                name_len, extra_len = np.frombuffer(f.read(4), "<u2").tolist()
                start = info.header_offset + 30 + name_len + extra_len
                spans[info.filename] = ("", start, start + info.compress_size)
            headers = [("", archive.start_dir, os.path.getsize(path))]
    index = spans.pop("__index__.bin", None)  # plain archives have none
    return Regions(list(spans.values()), [index] if index else [], headers)


def _gulp_regions(root: str) -> Regions:
    """Every JPEG record of the data files, and the whole of each meta file."""
    records: Spans = []
    metas: Spans = []
    for chunk in find_chunks(root):
        _, table = frame_table(load_meta(chunk.meta_path), chunk.meta_path)
        name = os.path.basename(chunk.data_path)
        records += [(name, offset, offset + length - pad) for offset, pad, length in table.tolist()]
        metas.append((os.path.basename(chunk.meta_path), 0, os.path.getsize(chunk.meta_path)))
    return Regions(records, metas, [])


def _load(source: str) -> dict[str, bytes]:
    """The files of a source by name (a one-file shard under "")."""
    if not os.path.isdir(source):
        return {"": open(source, "rb").read()}
    return {name: open(os.path.join(source, name), "rb").read() for name in os.listdir(source)}


def _save(files: dict[str, bytes], path: str) -> None:
    if "" in files:
        with open(path, "wb") as f:
            f.write(files[""])
        return
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    for name, data in files.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)


def mutate(
    files: dict[str, bytes], regions: Regions, region: str, rng: np.random.Generator
) -> dict[str, bytes]:
    """``files`` with 1-8 random bytes (or, a quarter of the time, a run of up to 64) changed
    inside one span of ``region``; in a JSON file, half of the time digits changed into other
    digits instead (a valid file with wrong numbers)."""
    spans = getattr(regions, region)
    name, start, end = spans[int(rng.integers(len(spans)))]
    out = bytearray(files[name])
    digits = np.flatnonzero(np.isin(np.frombuffer(out, np.uint8)[start:end], list(b"0123456789")))
    if name.endswith(".gmeta") and len(digits) and rng.random() < 0.5:
        for at in rng.choice(digits, min(int(rng.integers(1, 4)), len(digits))).tolist():
            out[start + at] = int(rng.integers(ord("0"), ord("9") + 1))
    elif rng.random() < 0.25:
        at = int(rng.integers(start, end))
        run = rng.integers(0, 256, min(int(rng.integers(1, 65)), end - at), dtype=np.uint8)
        out[at : at + len(run)] = run.tobytes()
    else:
        for at in rng.integers(start, end, int(rng.integers(1, 9))).tolist():
            out[at] = int(rng.integers(0, 256))
    return {**files, name: bytes(out)}


def _read_video(path: str, rng: np.random.Generator) -> None:
    import kohakuclip

    with kohakuclip.Reader(path, size=24, threads=2) as reader:
        for _ in range(2):
            items = []
            for vid in rng.integers(0, len(reader), 6).tolist():
                frames = np.sort(rng.integers(0, reader.info(vid).n, 4)).tolist()
                items.append((vid, frames))
            reader.read(items, seed=1)


def _read_images(path: str, rng: np.random.Generator) -> None:
    import kohakuclip

    with kohakuclip.ImageReader(path, size=24, threads=2) as reader:
        for _ in range(2):
            reader.read(rng.integers(0, len(reader), 8).tolist(), seed=1)


def _read_gulp(path: str, rng: np.random.Generator) -> None:
    """Every frame through the GulpIO API, then clips and single frames through the readers."""
    from kohakuclip.gulp import GulpDirectory

    for chunk in GulpDirectory(path):
        for _ in chunk:
            pass
    _read_video(path, rng)
    _read_images(path, rng)


def child(shard: str, work: str, seed: int) -> None:
    """Read every mutation of ``shard``; print one JSON line of outcomes (run in a child)."""
    import kohakuclip

    name = os.path.basename(shard)
    read = _read_gulp if "gulp" in name else _read_images if "image" in name else _read_video
    files = _load(shard)
    regions = _regions(shard)
    rng = np.random.default_rng(seed)
    outcomes: Counter[str] = Counter()
    path = os.path.join(work, "mutated" + os.path.splitext(shard)[1])
    for region in REGIONS:
        for _ in range(MUTATIONS if getattr(regions, region) else 0):
            _save(mutate(files, regions, region, rng), path)
            try:
                read(path, rng)
                outcomes[f"{region}: read"] += 1
            except kohakuclip.KohakuClipError as e:
                outcomes[f"{region}: {type(e).__name__}"] += 1
    read(shard, rng)  # the intact shard still reads
    print(json.dumps(outcomes))


@pytest.fixture(
    scope="module",
    params=[
        *("video zip", "video tar", "image zip", "image tar", "image folder", "image deflated"),
        *("image av1", "image webp", "image png", "gulp dir"),
    ],
)
def shard(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    kind, container = request.param.split()
    root = tmp_path_factory.mktemp(f"fuzz_{kind}_{container}")
    if kind == "gulp":
        lengths = {"v0": 12, "v1": 5, "v2": 9, "v3": 7}
        labels = dict(zip(lengths, ["a", "b", "a", "b"]))
        (root / "gulp").mkdir()
        return write_gulp_dir(str(root / "gulp"), lengths, labels, {"a": 0, "b": 1}, 2)
    if kind == "video":
        path = str(root / f"video_shard.{container}")
        pack(path, [(name, make_video(spec)) for name, spec in VIDEOS.items()])
        return path
    photos = root / "photos"
    photos.mkdir()
    for i, subsampling in enumerate([2, 1, 0, 2]):  # 4:2:0, 4:2:2, 4:4:4
        image = Image.fromarray(photo(60 + 8 * i, 90 - 6 * i, seed=i))
        image.save(photos / f"{i}.jpg", quality=90, subsampling=subsampling)
    if container == "folder":  # plain JPEG files: sized from their headers, compiled code
        os.rename(photos, root / "image_folder")
        return str(root / "image_folder")
    if container == "png":  # plain PNG files (RGB, gray, RGBA, palette): the same
        (root / "image_png").mkdir()
        for i, name in enumerate(sorted(os.listdir(photos))):
            image = Image.open(photos / name).convert(["RGB", "L", "RGBA", "P"][i])
            image.save(root / "image_png" / f"{i}.png")
        return str(root / "image_png")
    if container == "tar":  # a plain (WebDataset) tar: the same, its members without an index
        with tarfile.open(root / "image_plain.tar", "w") as tar:
            for name in sorted(os.listdir(photos)):
                tar.add(photos / name, arcname=name)
        return str(root / "image_plain.tar")
    if container == "deflated":  # a zip made with compression: inflated in compiled code
        with zipfile.ZipFile(root / "image_deflated.zip", "w", zipfile.ZIP_DEFLATED) as z:
            for name in sorted(os.listdir(photos)):
                z.write(photos / name, arcname=name)
        return str(root / "image_deflated.zip")
    codec = {"av1": "avif", "webp": "webp"}.get(container, "jpeg")  # all decoded compiled
    write_images(root / "out", [photos], codec=codec, max_short=64, min_short=0, progress=False)
    os.rename(root / "out" / "shard_00000.zip", root / "image_shard.zip")
    return str(root / "image_shard.zip")


def test_mutate_changes_bytes_only_inside_the_region(shard: str) -> None:
    files = _load(shard)
    regions = _regions(shard)
    rng = np.random.default_rng(0)
    for region in REGIONS:
        spans = getattr(regions, region)
        for _ in range(20 if spans else 0):
            mutated = mutate(files, regions, region, rng)
            for name, data in files.items():
                changed = np.flatnonzero(
                    np.frombuffer(mutated[name], np.uint8) != np.frombuffer(data, np.uint8)
                )
                inside = [(a, b) for n, a, b in spans if n == name]
                assert all(any(a <= at < b for a, b in inside) for at in changed.tolist())


def test_a_directory_cut_inside_an_entry_is_a_clear_error(tmp_path) -> None:
    """Found by the fuzzing below: a directory size too small by less than an entry left the
    last entry's fields short (a ``struct.error`` from the zip reader)."""
    import kohakuclip

    shard = str(tmp_path / "video_shard.zip")
    pack(shard, [("a.mp4", make_video(VIDEOS["h264.mp4"]))])
    data = bytearray(open(shard, "rb").read())
    eocd = data.rfind(b"PK\x05\x06")
    size = int.from_bytes(data[eocd + 12 : eocd + 16], "little")
    data[eocd + 12 : eocd + 16] = (size - 20).to_bytes(4, "little")
    bad = tmp_path / "bad.zip"
    bad.write_bytes(bytes(data))
    with pytest.raises(
        kohakuclip.KohakuClipError, match=r"bad\.zip: corrupt zip central directory"
    ):
        kohakuclip.Reader(str(bad))


def test_mutated_shards_raise_clear_errors_and_never_crash_or_hang(shard: str, tmp_path) -> None:
    code = "import sys; from tests.test_mutated_shards import child; child(*sys.argv[1:3], 7)"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", code, shard, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=SECONDS,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-3000:]  # a signal (crash) or an unexpected error
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    for region in REGIONS:  # every mutation was read; some of each region failed, cleanly
        if not getattr(_regions(shard), region):
            continue
        assert sum(n for k, n in outcomes.items() if k.startswith(region)) == MUTATIONS
        assert any(k.startswith(region) and not k.endswith(": read") for k in outcomes), outcomes
    assert outcomes.get("samples: read", 0) > 0, outcomes  # most changed samples still decode

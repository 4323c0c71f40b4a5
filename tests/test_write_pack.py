"""Packing shards: the KCIDX1 index against PyAV's demuxer, ``keep`` bit-exactness, stored
members, atomic writes, bad members, and interchangeability with KohakuClip 1.0.0."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import zipfile
from functools import cache

import av
import numpy as np
import pytest

from kohakuclip.codecs.av1 import Av1DepsIndex
from kohakuclip.formats import (
    AV1_DEPS_KEY,
    FLAG_KEYFRAME,
    INDEX_VERSION,
    VIDEO_INDEX_MAGIC,
    read_index_header,
)
from kohakuclip.storage.index import VideoIndex
from kohakuclip.write.pack import PackError, ShardWriter, pack
from kohakuclip.write.settings import EncodeSettings
from kohakuclip.write.video import encode_video
from tests.media import VideoSpec, make_video
from tests.reference import REFERENCE_ENV, REFERENCE_PYTHON, needs_reference
from tests.writer_media import read_index, video_records

CODECS = ["av1", "h264", "hevc"]
FAST = {"av1": 10, "h264": "veryfast", "hevc": "veryfast"}


@cache
def stored(codec: str, seed: int = 0, frames: int = 40) -> bytes:
    """A video re-encoded by the writer (small, fast preset)."""
    src = make_video(VideoSpec(width=160, height=96, frames=frames, seed=seed))
    settings = EncodeSettings(codec=codec, preset=FAST[codec])  # type: ignore[arg-type]
    return encode_video(src, settings).data


def demuxed(data: bytes) -> dict:
    """PyAV's view of an mp4: stream facts and every packet in decode order."""
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        packets = [p for p in c.demux(stream) if p.size]
        return {
            "fps": float(stream.average_rate),
            "w": stream.width,
            "h": stream.height,
            "extradata": bytes(stream.codec_context.extradata or b""),
            "payloads": [bytes(p) for p in packets],
            "keyframes": [p.is_keyframe for p in packets],
            "pts": [p.pts for p in packets],
        }


def check_index(path: str, members: dict[str, bytes], codecs: dict[str, str]) -> VideoIndex:
    """Every index field against PyAV's demuxer of the member's own bytes."""
    index, archive = read_index(path)
    assert [v.member for v in index.videos] == list(members)
    row = 0
    for entry in index.videos:
        ref = demuxed(members[entry.member])
        assert entry.row == row
        assert entry.n == len(ref["payloads"])
        assert (entry.fps, entry.w, entry.h, entry.codec) == (
            ref["fps"],
            ref["w"],
            ref["h"],
            codecs[entry.member],
        )
        assert entry.colorspace == "bt601"
        records = video_records(index, entry.member)
        for rec, payload, key in zip(records, ref["payloads"], ref["keyframes"], strict=True):
            start = int(rec["offset"])
            assert archive[start : start + int(rec["size"])] == payload
            assert bool(rec["flags"] & FLAG_KEYFRAME) == key
            assert 0 <= rec["keep"] <= rec["size"]
        prefix = bytes.fromhex(entry.prefix)
        if entry.codec == "av1":
            assert prefix == ref["extradata"][4:]  # av1C configOBUs: the sequence header
            assert prefix[0] >> 3 & 15 == 1  # OBU_SEQUENCE_HEADER
        else:
            # Annex B parameter sets, each one a NAL unit of the avcC / hvcC record
            units = prefix.split(b"\0\0\0\1")
            assert units[0] == b"" and len(units) >= 3
            for unit in units[1:]:
                assert unit and unit in ref["extradata"]
        row += entry.n
    assert row == len(index.frames)
    return index


@pytest.mark.parametrize("container", ["zip", "tar"])
@pytest.mark.parametrize("codec", CODECS)
def test_index_matches_pyav(tmp_path, codec: str, container: str) -> None:
    members = {"a.mp4": stored(codec, 0), "dir/b.mp4": stored(codec, 1, 24)}
    path = str(tmp_path / f"shard.{container}")
    written = pack(path, members.items())
    index = check_index(path, members, dict.fromkeys(members, codec))
    assert index.videos == written.videos
    assert os.listdir(tmp_path) == [f"shard.{container}"]
    if container == "zip":
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            assert all(i.compress_type == zipfile.ZIP_STORED for i in infos)
            assert infos[-1].filename == "__index__.bin"
            for name, data in members.items():
                assert z.read(name) == data
    else:
        with tarfile.open(path) as t:
            assert t.getnames()[-1] == "__index__.bin"
            for name, data in members.items():
                extracted = t.extractfile(name)
                assert extracted is not None and extracted.read() == data


def test_av1_dependency_table_follows_the_records(tmp_path) -> None:
    path = str(tmp_path / "s.zip")
    pack(path, [("a.mp4", stored("av1")), ("b.mp4", stored("av1", 1, 24))])
    index, _ = read_index(path)
    assert index.av1deps is not None
    deps = Av1DepsIndex.from_buffer(index.av1deps)
    for entry in index.videos:
        frames = deps.video_frames(entry.member)
        assert frames is not None and deps.videos[entry.member][2] == entry.n
        assert set(frames["sample"].tolist()) == set(range(entry.n))
    with zipfile.ZipFile(path) as z:  # no extra member: the reference counts members as videos
        assert [i.filename for i in z.infolist()] == ["a.mp4", "b.mp4", "__index__.bin"]
    h264 = str(tmp_path / "h.zip")
    pack(h264, [("a.mp4", stored("h264"))])
    plain, _ = read_index(h264)
    assert plain.av1deps is None
    assert AV1_DEPS_KEY not in plain.to_bytes()[:200].decode("latin-1")


def decode_with_keep(data: bytes, records: np.ndarray, wanted: set[int]) -> dict[int, np.ndarray]:
    """Decode feeding wanted samples whole and the others cut to ``keep`` (0: not at all);
    frames keyed by display position."""
    ref = demuxed(data)
    order = {pts: i for i, pts in enumerate(sorted(ref["pts"]))}
    with av.open(io.BytesIO(data)) as c:
        name = c.streams.video[0].codec_context.name
    decoder = av.CodecContext.create(name, "r")
    decoder.extradata = ref["extradata"]
    decoder.thread_count = 1
    out: dict[int, np.ndarray] = {}

    def take(frames) -> None:
        for f in frames:
            out[order[f.pts]] = f.to_ndarray()

    for payload, pts, rec in zip(ref["payloads"], ref["pts"], records, strict=True):
        keep = len(payload) if order[pts] in wanted else int(rec["keep"])
        if keep == 0:
            continue
        packet = av.Packet(payload[:keep])
        packet.pts = pts
        take(decoder.decode(packet))
    take(decoder.decode(None))
    return out


@pytest.mark.parametrize("codec", CODECS)
def test_keep_is_bit_exact(tmp_path, codec: str) -> None:
    data = stored(codec)
    path = str(tmp_path / "s.zip")
    pack(path, [("a.mp4", data)])
    index, _ = read_index(path)
    records = video_records(index, "a.mp4")
    keep, size = records["keep"], records["size"]
    assert (keep == 0).sum() > 0  # something is dropped, so the check means something
    if codec == "av1":
        assert ((keep > 0) & (keep < size)).sum() > 0  # and something truncated
    full = decode_with_keep(data, records, set(range(len(records))))
    for wanted in ({3, 4, 5, 6}, set(range(1, 40, 5)), {15, 31, 39}):
        partial = decode_with_keep(data, records, wanted)
        for i in wanted:
            np.testing.assert_array_equal(partial[i], full[i])


def test_bad_members_raise_and_leave_nothing(tmp_path) -> None:
    path = str(tmp_path / "s.zip")
    good = stored("h264")
    mpeg4 = make_video(VideoSpec(codec="mpeg4", width=96, height=64, frames=4))
    cases = [
        ([("a.mp4", good), ("junk.mp4", b"not an mp4" * 30)], r"s\.zip:junk\.mp4"),
        ([("old.mp4", mpeg4)], r"s\.zip:old\.mp4: a shard index holds .*, not 'mpeg4'"),
        ([("a.mp4", good), ("a.mp4", good)], r"s\.zip:a\.mp4: duplicate member name"),
        ([("__index__.bin", good)], r"s\.zip:__index__\.bin: not a valid member name"),
        ([("a.mp4", good[: len(good) // 3])], r"s\.zip:a\.mp4"),
    ]
    for members, message in cases:
        with pytest.raises(PackError, match=message):
            pack(path, members)
        assert os.listdir(tmp_path) == []


def test_an_interrupted_shard_leaves_no_file(tmp_path) -> None:
    path = str(tmp_path / "s.tar")
    with pytest.raises(KeyboardInterrupt), ShardWriter(path) as shard:
        shard.add("a.mp4", stored("h264"))
        assert os.listdir(tmp_path) == ["s.tar.tmp"]  # only ever under the temporary name
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


# --- KohakuClip 1.0.0 (black box) --------------------------------------------------------------


def run_reference(script: str, *args: str) -> str:
    done = subprocess.run(
        [REFERENCE_PYTHON, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=REFERENCE_ENV,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


READ_SCRIPT = """
import json, sys, kohakuclip
reader = kohakuclip.Reader(sys.argv[1:], size=64)
shapes = [list(reader.read([(i, [0, 1, 2])]).video.shape) for i in range(len(reader))]
print(json.dumps({"videos": len(reader), "shapes": shapes}))
"""


@pytest.mark.reference
@needs_reference
def test_reference_reader_opens_our_shards(tmp_path) -> None:
    """Our shards, whose index headers carry the ``version`` key KohakuClip 1.0.0 never wrote."""
    paths = []
    for codec, container in (("av1", "zip"), ("h264", "tar"), ("hevc", "zip")):
        path = str(tmp_path / f"{codec}.{container}")
        pack(path, [("a.mp4", stored(codec)), ("b.mp4", stored(codec, 1, 24))])
        paths.append(path)
        _, archive = read_index(path)
        member = archive[archive.index(VIDEO_INDEX_MAGIC) :]
        head = read_index_header(lambda at, n, m=member: m[at : at + n], VIDEO_INDEX_MAGIC)
        assert head.header["version"] == INDEX_VERSION
    seen = json.loads(run_reference(READ_SCRIPT, *paths))
    assert seen == {"videos": 6, "shapes": [[1, 3, 3, 64, 64]] * 6}


PACK_SCRIPT = """
import sys, kohakuclip._core as core
out, *videos = sys.argv[1:]
members = [(f"v{i}.mp4", open(p, "rb").read()) for i, p in enumerate(videos)]
core.pack(out, members)
core.pack(out + ".tar", members)
if len(videos) == 1:
    encoded = core.encode(videos[0], crf=40, preset=12)
    core.pack(out + ".own.zip", [("own.mp4", encoded)])
    open(out + ".own.mp4", "wb").write(encoded)
"""


@pytest.mark.reference
@needs_reference
@pytest.mark.parametrize("codec", CODECS)
def test_we_parse_reference_shards_and_match_its_index(tmp_path, codec: str) -> None:
    files = []
    for seed in (0, 1):
        files.append(tmp_path / f"{seed}.mp4")
        files[-1].write_bytes(stored(codec, seed, 40 - 16 * seed))
    theirs = str(tmp_path / "theirs.zip")
    run_reference(PACK_SCRIPT, theirs, *map(str, files))
    members = {f"v{i}.mp4": f.read_bytes() for i, f in enumerate(files)}
    ours = str(tmp_path / "ours.zip")
    pack(ours, members.items())
    for their_path, our_path in ((theirs, ours), (theirs + ".tar", None)):
        their_index = check_index(their_path, members, dict.fromkeys(members, codec))
        if our_path is None:
            continue
        our_index, _ = read_index(our_path)
        assert their_index.videos == our_index.videos
        for field in ("offset", "size", "flags"):
            np.testing.assert_array_equal(their_index.frames[field], our_index.frames[field])
        if codec != "av1":
            # byte for byte the same index once our per-sample keep is replaced by theirs
            frames = our_index.frames.copy()
            frames["keep"] = their_index.frames["keep"]
            assert VideoIndex(our_index.videos, frames).to_bytes() == their_index.to_bytes()


@pytest.mark.reference
@needs_reference
def test_reference_encoded_video_packs_the_same(tmp_path) -> None:
    src = tmp_path / "src.mp4"
    src.write_bytes(make_video(VideoSpec(width=160, height=96, frames=20)))
    base = str(tmp_path / "theirs.zip")
    run_reference(PACK_SCRIPT, base, str(src))
    encoded = (tmp_path / "theirs.zip.own.mp4").read_bytes()
    their_index = check_index(base + ".own.zip", {"own.mp4": encoded}, {"own.mp4": "av1"})
    ours = str(tmp_path / "ours.zip")
    pack(ours, [("own.mp4", encoded)])
    our_index, _ = read_index(ours)
    assert our_index.videos == their_index.videos
    np.testing.assert_array_equal(our_index.frames["offset"], their_index.frames["offset"])

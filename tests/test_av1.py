"""AV1 dependency analysis on real SVT-AV1 output: frame headers against FFmpeg's own parser,
``keep`` and per-clip closures decoded with libdav1d against a full decode, bit for bit."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import struct
import subprocess
import zipfile
import zlib
from dataclasses import dataclass
from functools import cached_property

import av
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kohakuclip.codecs.av1 import (
    Av1Deps,
    Av1DepsIndex,
    Av1ParseError,
    analyze,
    closure,
    feed_packets,
    find_sequence_header,
    sample_rows,
)
from kohakuclip.codecs.av1_syntax import (
    KEY_FRAME,
    OBU_FRAME,
    OBU_SEQUENCE_HEADER,
    OBU_TILE_GROUP,
    iter_obus,
)
from kohakuclip.formats import (
    AV1_FRAME_RECORD,
    AV1_SHOW_EXISTING,
    AV1_SHOW_FRAME,
    INDEX_MEMBER,
    VIDEO_INDEX_MAGIC,
    IndexFormatError,
    read_index_header,
)
from kohakuclip.storage.index import VideoIndex
from tests.media import VideoSpec, decode_planes, make_video
from tests.reference import REFERENCE_ENV, REFERENCE_PYTHON, needs_reference
from tests.test_av1_syntax import ffmpeg_trace, obu

_FILTERS_OFF = "enable-dlf=0:enable-cdef=0"
STREAMS = {
    # tests/media.py's default: preset 10, GOP 16, hierarchical mini-GOPs with hidden ARFs
    "p10_k16": VideoSpec(codec="av1", frames=72),
    "p8_k32_h4": VideoSpec(
        codec="av1",
        frames=72,
        options={"preset": "8", "svtav1-params": "keyint=32:hierarchical-levels=4"},
    ),
    "p6_k16_h3_odd": VideoSpec(
        codec="av1",
        width=126,
        height=70,
        frames=64,
        options={"preset": "6", "svtav1-params": f"keyint=16:hierarchical-levels=3:{_FILTERS_OFF}"},
    ),
    "p10_k64_h5": VideoSpec(
        codec="av1",
        width=98,
        height=66,
        frames=72,
        options={"preset": "10", "svtav1-params": "keyint=64:hierarchical-levels=5"},
    ),
    "overlays": VideoSpec(
        codec="av1",
        frames=64,
        options={"svtav1-params": f"keyint=16:enable-overlays=1:{_FILTERS_OFF}"},
    ),
    "low_delay": VideoSpec(
        codec="av1", frames=64, options={"svtav1-params": f"keyint=16:pred-struct=1:{_FILTERS_OFF}"}
    ),
}

Planes = tuple[np.ndarray, ...]


def frame_planes(frame: av.VideoFrame) -> Planes:
    return tuple(
        np.frombuffer(p, np.uint8).reshape(p.height, p.line_size)[:, : p.width].copy()
        for p in frame.planes
    )


def decode(packets: list[tuple[int, bytes | memoryview]]) -> list[tuple[int, Planes]]:
    """Decode with libdav1d, one thread; packet pts = sample index, so outputs map back."""
    ctx = av.CodecContext.create("libdav1d", "r")
    ctx.thread_count = 1
    out = []
    for sample, data in packets:
        packet = av.Packet(bytes(data))
        packet.pts = sample
        out += [(f.pts, frame_planes(f)) for f in ctx.decode(packet)]
    out += [(f.pts, frame_planes(f)) for f in ctx.decode(None)]
    return out


@dataclass
class Stream:
    name: str
    mp4: bytes
    samples: list[bytes]
    keys: list[int]  # samples the mp4 marks as sync samples
    extradata: bytes  # av1C

    @cached_property
    def deps(self) -> Av1Deps:
        return analyze(self.samples, self.extradata[4:], where=f"{self.name}.mp4")

    @cached_property
    def full(self) -> list[Planes]:
        out = decode(list(enumerate(self.samples)))
        assert [pts for pts, _ in out] == list(range(len(self.samples)))
        return [planes for _, planes in out]

    def gop_of(self, sample: int) -> int:
        return max(k for k in self.keys if k <= sample)


def load(name: str, mp4: bytes) -> Stream:
    with av.open(io.BytesIO(mp4)) as c:
        s = c.streams.video[0]
        packets = [p for p in c.demux(s) if p.size]
        return Stream(
            name,
            mp4,
            [bytes(p) for p in packets],
            [i for i, p in enumerate(packets) if p.is_keyframe],
            bytes(s.codec_context.extradata),
        )


@pytest.fixture(scope="module", params=list(STREAMS))
def stream(request) -> Stream:
    return load(request.param, make_video(STREAMS[request.param]))


@pytest.fixture(scope="module")
def default_stream() -> Stream:
    return load("p10_k16", make_video(STREAMS["p10_k16"]))


# --- plans ----------------------------------------------------------------------------------


def by_gop(stream: Stream, wanted) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for w in sorted(set(wanted)):
        groups.setdefault(stream.gop_of(w), []).append(w)
    return groups


def full_count(stream: Stream, wanted) -> int:
    """Frames decoded when decoding every sample from the key frame to the last wanted one."""
    f = stream.deps.frames
    decodes = (f["flags"] & AV1_SHOW_EXISTING) == 0
    return sum(
        int((decodes & (f["sample"] >= key) & (f["sample"] <= ws[-1])).sum())
        for key, ws in by_gop(stream, wanted).items()
    )


def keep_plan(stream: Stream, wanted) -> tuple[list[tuple[int, bytes]], int]:
    """Wanted samples whole, the others truncated to ``keep`` (dropped at 0); frames decoded."""
    f = stream.deps.frames
    packets, decoded = [], 0
    for key, ws in by_gop(stream, wanted).items():
        for i in range(key, ws[-1] + 1):
            size = len(stream.samples[i]) if i in ws else int(stream.deps.keep[i])
            if size:
                packets.append((i, stream.samples[i][:size]))
                mine = f[(f["sample"] == i) & ((f["flags"] & AV1_SHOW_EXISTING) == 0)]
                decoded += int((mine["end"] <= size).sum())
    return packets, decoded


def closure_plan(
    stream: Stream, wanted
) -> tuple[list[tuple[int, bytes | memoryview]], list[int], int]:
    packets, outputs, decoded = [], [], 0
    for key, ws in by_gop(stream, wanted).items():
        feed = closure(stream.deps.frames, key, ws)
        packets += feed_packets(feed, stream.samples)
        outputs += feed.outputs
        decoded += feed.decoded
    return packets, outputs, decoded


def check_outputs(stream: Stream, out: list[tuple[int, Planes]], wanted) -> None:
    """Every wanted sample comes out exactly once; every output equals the full decode."""
    pts = [p for p, _ in out]
    for w in set(wanted):
        assert pts.count(w) == 1, (stream.name, w, pts)
    for p, planes in out:
        for mine, full in zip(planes, stream.full[p], strict=True):
            assert np.array_equal(mine, full), (stream.name, p)


def clip_specs(n: int, seed: int, count: int = 3) -> list[tuple[str, list[int]]]:
    """The four clip shapes at a source rate of 24 fps: 8 @ 6 fps, 8 @ 24, 16 @ 6, 8 random."""
    rng = np.random.default_rng(seed)
    clips = []
    for name, length, stride in (("8@6fps", 8, 4), ("8@24fps", 8, 1), ("16@6fps", 16, 4)):
        span = (length - 1) * stride + 1
        for start in rng.integers(0, n - span + 1, count):
            clips.append((name, [int(start) + stride * i for i in range(length)]))
    for _ in range(count):
        clips.append(("8 random", sorted(rng.choice(n, 8, replace=False).tolist())))
    return clips


# --- parsing against FFmpeg -----------------------------------------------------------------


def test_frame_headers_match_ffmpeg(stream):
    """Per frame OBU: show_existing_frame and its slot, frame type, show_frame, refresh and the
    slots of ref_frame_idx, as FFmpeg's AV1 parser reads them from the same samples."""
    sections, errors = ffmpeg_trace(stream.samples)
    assert not errors
    headers = [s for s in sections if s["_kind"] == "Frame Header"]
    frames = stream.deps.frames
    assert len(headers) == len(frames)
    for h, rec in zip(headers, frames, strict=True):
        if h["show_existing_frame"]:
            assert rec["flags"] & AV1_SHOW_EXISTING
            assert rec["reads"] == 1 << h["frame_to_show_map_idx"]
            continue
        assert not rec["flags"] & AV1_SHOW_EXISTING
        assert rec["frame_type"] == h["frame_type"]
        assert bool(rec["flags"] & AV1_SHOW_FRAME) == bool(h["show_frame"])
        shown_key = h["frame_type"] == KEY_FRAME and h["show_frame"]
        assert rec["refresh"] == h.get("refresh_frame_flags", 255 if shown_key else None)
        assert not h.get("frame_refs_short_signaling", 0)
        slots = {h[f"ref_frame_idx[{i}]"] for i in range(7) if f"ref_frame_idx[{i}]" in h}
        assert rec["reads"] == sum(1 << s for s in slots)


def test_records_cover_the_samples(stream):
    """Frame byte ranges tile each sample after its head; key frames sit at the sync samples."""
    f = stream.deps.frames
    assert f.dtype == AV1_FRAME_RECORD
    for i, data in enumerate(stream.samples):
        mine = f[f["sample"] == i]
        assert len(mine) >= 1
        assert mine["end"][-1] == len(data)
        assert (mine["start"][1:] == mine["end"][:-1]).all()
        head = [o.type for o in iter_obus(data) if o.end <= mine["start"][0]]
        assert OBU_FRAME not in head
        shown = mine[(mine["flags"] & AV1_SHOW_FRAME) != 0]
        assert len(shown) == 1  # one shown frame per temporal unit
    shown_keys = f[(f["frame_type"] == KEY_FRAME) & ((f["flags"] & AV1_SHOW_FRAME) != 0)]
    assert shown_keys["sample"].tolist() == stream.keys
    assert stream.deps.sequence_header == find_sequence_header(stream.samples[0])


def test_full_decode_matches_container_decode(stream):
    planes = decode_planes(stream.mp4)
    assert len(planes) == len(stream.full)
    for mine, ref in zip(stream.full, planes, strict=True):
        for a, b in zip(mine, ref, strict=True):
            assert np.array_equal(a, b)


# --- keep -----------------------------------------------------------------------------------


def test_keep_drops_and_truncates(stream):
    keep = stream.deps.keep.astype(np.int64)
    sizes = np.array([len(s) for s in stream.samples])
    assert len(keep) == len(sizes) and (keep <= sizes).all()
    ends = set(zip(stream.deps.frames["sample"].tolist(), stream.deps.frames["end"].tolist()))
    assert all((i, k) in ends for i, k in enumerate(keep.tolist()) if k)  # cut at frame ends
    assert (keep[stream.keys] == sizes[stream.keys]).all()
    dropped, truncated = int((keep == 0).sum()), int(((keep > 0) & (keep < sizes)).sum())
    print(f"{stream.name}: {len(keep)} samples, {dropped} dropped, {truncated} truncated")
    assert dropped > 0
    if stream.name != "low_delay":  # no hidden frames there, so nothing to truncate
        assert truncated > 0


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_keep_decodes_wanted_frames_exactly(stream, data):
    n = len(stream.samples)
    wanted = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=10))
    packets, _ = keep_plan(stream, wanted)
    check_outputs(stream, decode(packets), wanted)


# --- closure --------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_closure_decodes_wanted_frames_exactly(stream, data):
    n = len(stream.samples)
    wanted = data.draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=10))
    packets, outputs, decoded = closure_plan(stream, wanted)
    out = decode(packets)
    assert [p for p, _ in out] == outputs
    check_outputs(stream, out, wanted)
    assert decoded <= keep_plan(stream, wanted)[1]


def test_clip_specs(stream):
    """The four clip shapes: closure and keep both exact; closure <= keep <= full decode."""
    totals: dict[str, list[int]] = {}
    for name, wanted in clip_specs(len(stream.samples), seed=len(stream.name)):
        packets, outputs, by_closure = closure_plan(stream, wanted)
        out = decode(packets)
        assert [p for p, _ in out] == outputs
        check_outputs(stream, out, wanted)
        keep_packets, by_keep = keep_plan(stream, wanted)
        check_outputs(stream, decode(keep_packets), wanted)
        by_full = full_count(stream, wanted)
        assert by_closure <= by_keep <= by_full
        t = totals.setdefault(name, [0, 0, 0, 0])
        for k, v in enumerate((by_full, by_keep, by_closure, len(wanted))):
            t[k] += v
    for name, (full, keep, clos, n) in totals.items():
        rates = f"full {full / n:.2f}, keep {keep / n:.2f}, closure {clos / n:.2f}"
        print(f"{stream.name} {name}: frames decoded per output frame: {rates}")


def test_one_closure_across_gops_equals_per_gop(default_stream):
    s = default_stream
    wanted = [3, 17, 20, 40, 41, 70]
    whole = closure(s.deps.frames, 0, wanted)
    packets, outputs, decoded = closure_plan(s, wanted)
    assert whole.outputs == tuple(outputs) and whole.decoded == decoded
    assert feed_packets(whole, s.samples) == packets


def test_row_table_gives_the_same_closure_as_binary_search(default_stream):
    frames = default_stream.deps.frames
    samples = int(frames["sample"].max()) + 1
    rows = sample_rows(frames, samples)
    rng = np.random.default_rng(0)
    for key in range(0, samples, 16):
        for _ in range(5):
            wanted = rng.choice(np.arange(key, min(key + 16, samples)), 3, replace=False)
            assert closure(frames, key, wanted, rows) == closure(frames, key, wanted)
    assert closure(frames, 0, [samples - 1], rows) == closure(frames, 0, [samples - 1])


def test_feed_from_a_mapping_of_samples(default_stream):
    s = default_stream
    feed = closure(s.deps.frames, 16, [22, 27])
    used = {sample: s.samples[sample] for sample, _, _ in feed.ranges}
    assert feed_packets(feed, used) == feed_packets(feed, s.samples)
    f = s.deps.frames
    in_range = (f["sample"] >= 16) & (f["sample"] <= 27)
    assert feed.total == int((in_range & ((f["flags"] & AV1_SHOW_EXISTING) == 0)).sum())
    assert closure(s.deps.frames, 16, []).ranges == ()


def test_out_of_band_sequence_header(default_stream):
    """Samples without in-band sequence headers analyse the same given the av1C configOBUs."""
    s = default_stream

    def strip(data: bytes) -> bytes:
        return b"".join(
            data[o.start : o.end] for o in iter_obus(data) if o.type != OBU_SEQUENCE_HEADER
        )

    stripped = [strip(d) for d in s.samples]
    deps = analyze(stripped, s.extradata[4:])
    shift = np.array([len(a) - len(b) for a, b in zip(s.samples, stripped, strict=True)])
    f, g = s.deps.frames, deps.frames
    assert (g["start"] == f["start"] - shift[f["sample"]]).all()
    assert (g["end"] == f["end"] - shift[f["sample"]]).all()
    assert (
        g[["frame_type", "flags", "refresh", "reads"]]
        == f[["frame_type", "flags", "refresh", "reads"]]
    ).all()
    assert deps.sequence_header == find_sequence_header(s.extradata[4:])
    with pytest.raises(
        Av1ParseError, match=r"clip\.mp4: sample 0: frame header before any sequence"
    ):
        analyze(stripped, where="clip.mp4")


# --- the reference wheel --------------------------------------------------------------------


@pytest.mark.reference
@needs_reference
def test_keep_against_reference(stream, tmp_path):
    """The KohakuClip 1.0.0 wheel's keep (black box) is never smaller than ours: it keeps
    show_existing_frame samples whole and every frame that refreshes a slot, while ours drops
    frames whose slots no later frame reads before they are overwritten."""
    (tmp_path / "a.mp4").write_bytes(stream.mp4)
    script = (
        "import sys, kohakuclip._core as c; "
        "c.pack(sys.argv[1], [('a.mp4', open(sys.argv[2], 'rb').read())])"
    )
    subprocess.run(
        [REFERENCE_PYTHON, "-c", script, str(tmp_path / "s.zip"), str(tmp_path / "a.mp4")],
        check=True,
        capture_output=True,
        env=REFERENCE_ENV,
    )
    with zipfile.ZipFile(tmp_path / "s.zip") as z:
        index = VideoIndex.from_buffer(z.read(INDEX_MEMBER))
    theirs = index.frames["keep"].astype(np.int64)
    sizes = index.frames["size"].astype(np.int64)
    ours = stream.deps.keep.astype(np.int64)
    assert sizes.tolist() == [len(d) for d in stream.samples]
    assert (ours <= theirs).all()
    f = stream.deps.frames
    existing = np.zeros(len(ours), dtype=bool)
    existing[f["sample"][(f["flags"] & AV1_SHOW_EXISTING) != 0]] = True
    assert (theirs[existing] == sizes[existing]).all() and (ours[existing] == 0).all()
    less = ours < theirs
    print(
        f"{stream.name}: ours drops {int((ours == 0).sum())} / truncates "
        f"{int(((ours > 0) & (ours < sizes)).sum())}, reference drops {int((theirs == 0).sum())} "
        f"/ truncates {int(((theirs > 0) & (theirs < sizes)).sum())}; ours is smaller on "
        f"{int(less.sum())} samples ({int(existing.sum())} show_existing), "
        f"{int((theirs - ours).sum())} of {int(sizes.sum())} bytes"
    )


def _replace_keep(shard: str, keep: np.ndarray) -> None:
    """Overwrite the keep column of a zip shard's (stored) index in place, fixing its CRCs."""
    with zipfile.ZipFile(shard) as z:
        info = z.getinfo(INDEX_MEMBER)
    with open(shard, "r+b") as f:
        raw = bytearray(f.read())
        names = struct.unpack_from("<HH", raw, info.header_offset + 26)
        start = info.header_offset + 30 + sum(names)
        member = bytes(raw[start : start + info.file_size])
        index = VideoIndex.from_buffer(member)
        frames = index.frames.copy()
        frames["keep"] = keep
        records = (
            start + read_index_header(lambda at, n: member[at : at + n], VIDEO_INDEX_MAGIC).records
        )
        raw[records : records + frames.nbytes] = frames.tobytes()  # the reference's header kept
        data = bytes(raw[start : start + info.file_size])
        crc = zlib.crc32(data)
        struct.pack_into("<I", raw, info.header_offset + 14, crc)
        name = INDEX_MEMBER.encode()
        entry = raw.find(b"PK\x01\x02")  # central directory entries: the index's one
        while raw[entry + 46 : entry + 46 + len(name)] != name:
            entry = raw.find(b"PK\x01\x02", entry + 4)
            assert entry >= 0
        struct.pack_into("<I", raw, entry + 16, crc)
        f.seek(0)
        f.write(raw)


@pytest.mark.reference
@needs_reference
def test_reference_reader_with_our_keep(tmp_path):
    """Our keep in a KohakuClip 1.0.0 shard: its reader, skipping, returns the frames of its
    own full decode (yuv, native planes) for 8 @ 6 fps and 8 random frame clips."""
    stream = load("p8_k32_h4", make_video(dataclasses.replace(STREAMS["p8_k32_h4"], frames=96)))
    (tmp_path / "a.mp4").write_bytes(stream.mp4)
    clips = [c for name, c in clip_specs(96, seed=1, count=16) if name in ("8@6fps", "8 random")]
    script = """if True:
        import sys, json, numpy as np, kohakuclip._core as c
        shard, ours, items = sys.argv[1], sys.argv[2], [(0, w) for w in json.loads(sys.argv[3])]
        c.pack(shard, [("a.mp4", open(sys.argv[4], "rb").read())])
        if ours == "-":
            sys.exit()
        def read(path, skip):
            r = c.Reader([path], size=64, mode="yuv", crop="center", skip=skip)
            return np.concatenate([np.array(r.read(items[k : k + 8], None, 0).video)
                                   for k in range(0, len(items), 8)])
        print(np.array_equal(read(ours, True), read(shard, False)))
    """
    run = [REFERENCE_PYTHON, "-c", script, str(tmp_path / "s.zip")]
    tail = [json.dumps(clips), str(tmp_path / "a.mp4")]
    subprocess.run([*run, "-", *tail], check=True, capture_output=True, env=REFERENCE_ENV)
    shutil.copy(tmp_path / "s.zip", tmp_path / "ours.zip")
    _replace_keep(str(tmp_path / "ours.zip"), stream.deps.keep)
    done = subprocess.run(
        [*run, str(tmp_path / "ours.zip"), *tail],
        check=True,
        capture_output=True,
        env=REFERENCE_ENV,
    )
    assert done.stdout.split()[-1] == b"True"


# --- bad input ------------------------------------------------------------------------------


def test_truncated_sample_names_video_and_sample(default_stream):
    samples = list(default_stream.samples)
    samples[5] = samples[5][:-7]
    with pytest.raises(Av1ParseError, match=r"clip\.mp4: sample 5: OBU at byte \d+: \d+ payload"):
        analyze(samples, where="clip.mp4")


def test_corrupt_samples():
    seq = find_sequence_header(load("p", make_video(VideoSpec(codec="av1", frames=2))).samples[0])
    assert seq is not None
    cases = {
        b"\x80": "forbidden bit",
        obu(OBU_FRAME, b""): "ends before",
        obu(OBU_TILE_GROUP, b"\x00"): "outside a frame",
    }
    for data, message in cases.items():
        with pytest.raises(Av1ParseError, match=rf"v\.mp4: sample 0: .*{message}"):
            analyze([data], seq, where="v.mp4")
    with pytest.raises(Av1ParseError, match=r"v\.mp4: sequence header: "):
        analyze([], obu(OBU_SEQUENCE_HEADER, b"\x00"), where="v.mp4")


def test_stream_not_starting_at_a_key_frame(default_stream):
    s = default_stream
    with pytest.raises(Av1ParseError, match=r"clip\.mp4: sample 0: reads reference slot"):
        analyze(s.samples[1:], s.extradata[4:], where="clip.mp4")


def test_closure_rejects_bad_requests(default_stream):
    frames = default_stream.deps.frames
    with pytest.raises(ValueError, match="must start at a key frame"):
        closure(frames, 1, [5])
    with pytest.raises(ValueError, match="comes before the start"):
        closure(frames, 16, [3])
    with pytest.raises(ValueError, match="holds no shown frame"):
        closure(frames, 64, [999])


# --- the KCAV1D table ----------------------------------------------------------------------


def test_deps_index_round_trip(default_stream):
    deps = default_stream.deps
    half = Av1Deps(deps.keep[:16], deps.frames[deps.frames["sample"] < 16], b"")
    index = Av1DepsIndex.build([("a.mp4", deps), ("b.mp4", half)])
    back = Av1DepsIndex.from_buffer(index.to_bytes())
    assert back.videos == {
        "a.mp4": (0, len(deps.frames), 72),
        "b.mp4": (len(deps.frames), len(half.frames), 16),
    }
    a, b = back.video_frames("a.mp4"), back.video_frames("b.mp4")
    assert a is not None and b is not None
    assert a.tobytes() == deps.frames.tobytes() and b.tobytes() == half.frames.tobytes()
    assert back.video_frames("c.mp4") is None
    assert Av1DepsIndex.from_buffer(Av1DepsIndex.build([]).to_bytes()).videos == {}


def test_deps_index_rejects_bad_members(default_stream):
    good = Av1DepsIndex.build([("a.mp4", default_stream.deps)]).to_bytes()
    with pytest.raises(IndexFormatError, match=r"shard\.zip: not a KCAV1D index"):
        Av1DepsIndex.from_buffer(b"KCIDX1\0\0" + good[8:], where="shard.zip")
    short = good[: -AV1_FRAME_RECORD.itemsize]
    with pytest.raises(IndexFormatError, match="rows exceed"):
        Av1DepsIndex.from_buffer(short, where="shard.zip")
    with pytest.raises(IndexFormatError, match="not a multiple"):
        Av1DepsIndex.from_buffer(good[:-3], where="shard.zip")

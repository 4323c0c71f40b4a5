"""Parse an mp4's moov box into the first video track's sample table (numpy, decode order).

Reads are few: the top-level box headers (the first 64 KiB in one read, which holds a
faststart file's whole moov), then the moov in one read. The tables are decoded with numpy
straight from the box payloads. Edit lists are honoured as FFmpeg does (see ``mp4.edits``).
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from kohakuclip.codecs.annexb import AnnexBError, nal_length_size, parameter_sets_annexb
from kohakuclip.mp4.boxes import Box, Mp4Error, ReadAt, children, iter_boxes, top_level_boxes
from kohakuclip.mp4.edits import Edit, apply_edits

_SAMPLE_ENTRY_CODECS = {
    b"av01": "av1",
    b"avc1": "h264",
    b"avc3": "h264",
    b"hvc1": "hevc",
    b"hev1": "hevc",
    b"mp4v": "mpeg4",
    b"encv": "encrypted",
}
_CONFIG_BOX = {"av1": b"av1C", "h264": b"avcC", "hevc": b"hvcC"}
"""The decoder configuration box each codec's sample entry must carry."""
_VISUAL_SAMPLE_ENTRY = 78
"""Bytes of a VisualSampleEntry before its child boxes (after the 8-byte box header)."""

_MATRIX_NAMES = {1: "bt709", 5: "bt601", 6: "bt601"}
"""ISO/IEC 23091-2 matrix coefficients: BT.709, BT.470BG and SMPTE 170M (both BT.601)."""

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

_STTS = np.dtype([("count", ">u4"), ("delta", ">u4")])
_CTTS = np.dtype([("count", ">u4"), ("offset", ">i4")])  # signed in both versions, as FFmpeg
_STSC = np.dtype([("first_chunk", ">u4"), ("per_chunk", ">u4"), ("entry", ">u4")])
_ELST0 = np.dtype([("duration", ">u4"), ("media_time", ">i4"), ("rate", ">i4")])
_ELST1 = np.dtype([("duration", ">u8"), ("media_time", ">i8"), ("rate", ">i4")])


class UnsupportedVideo(ValueError):
    """A well-formed mp4 whose video kohakuclip cannot read (codec, encryption, fragments)."""

    def __init__(self, where: str, codec: str, detail: str = "") -> None:
        what = detail or f"unsupported video codec {codec!r} (kohakuclip reads av1, h264, hevc)"
        super().__init__(f"{where or '<mp4>'}: {what}")
        self.where = where
        self.codec = codec


@dataclass(frozen=True, eq=False)
class Mp4Track:
    """The first supported video track of an mp4: per-sample arrays in decode order.

    Arrays are read-only. ``display[i]`` is the display index of sample ``i`` (0..n-1), or -1
    for a sample that the edit list hides (decoded because later samples need it, never
    shown). ``n`` counts shown frames, so ``n <= len(offsets)``.
    """

    codec: Literal["av1", "h264", "hevc"]
    width: int
    height: int
    fps: float  # samples per second over the media duration (FFmpeg's avg_frame_rate)
    timescale: int  # mdhd ticks per second
    n: int  # frames shown
    offsets: np.ndarray  # uint64: absolute (base + position in the mp4)
    sizes: np.ndarray  # uint32
    keyframes: np.ndarray  # bool
    display: np.ndarray  # int32
    config: bytes  # raw av1C / avcC / hvcC payload
    nal_length_size: int  # h264 / hevc length field size; 0 for av1
    prefix: bytes  # av1: av1C configOBUs (sequence header); h264 / hevc: Annex B VPS/SPS/PPS
    matrix: Literal["bt601", "bt709"] | None  # from colr nclx / nclc
    full_range: bool | None  # from colr nclx
    rotation: int  # 0 / 90 / 180 / 270: clockwise turn that shows the frames upright
    track_id: int


def parse_mp4(read_at: ReadAt, size: int, base: int = 0, where: str = "") -> Mp4Track:
    """Parse the mp4 of ``size`` bytes that ``read_at(offset, length)`` reads.

    ``base`` is where the mp4 starts in its file or archive (added to every sample offset);
    ``where`` names it in errors. Raises Mp4Error for corrupt or truncated input and
    UnsupportedVideo when no video track has a supported codec.
    """
    boxes, head = top_level_boxes(read_at, size, where, until=b"moov")
    moov = boxes[-1] if boxes and boxes[-1].type == b"moov" else None
    if moov is None:
        raise Mp4Error(where, "no moov box (not an mp4, or truncated before its moov)")
    if moov.end <= len(head):
        data = head[moov.start : moov.end]
    else:
        data = read_at(moov.start, moov.end - moov.start)
        if len(data) != moov.end - moov.start:
            raise Mp4Error(where, f"short read of the moov box ({len(data)} bytes)")
    return _parse_moov(memoryview(data), size, base, where)


def parse_mp4_bytes(
    data: bytes | bytearray | memoryview, base: int = 0, where: str = ""
) -> Mp4Track:
    """``parse_mp4`` on an mp4 held in memory."""
    view = memoryview(data).cast("B")
    return parse_mp4(
        lambda offset, length: bytes(view[offset : offset + length]), len(view), base, where
    )


def parse_mp4_file(path: str | os.PathLike[str]) -> Mp4Track:
    """``parse_mp4`` on an mp4 file (offsets are file offsets; errors name the path)."""
    where = os.fspath(path)
    with open(path, "rb") as f:
        fd = f.fileno()
        return parse_mp4(
            lambda offset, length: os.pread(fd, length, offset), os.fstat(fd).st_size, 0, where
        )


def _name(box: Box) -> str:
    return box.type.decode("latin-1")


def _full_box(buf: memoryview, box: Box, need: int, where: str) -> int:
    """Version of a full box whose payload must hold at least ``need`` bytes."""
    if box.end - box.body < max(need, 4):
        raise Mp4Error(where, f"{_name(box)} box too short ({box.end - box.body} bytes)")
    return buf[box.body]


def _table(buf: memoryview, box: Box, dtype: np.dtype | str, where: str) -> np.ndarray:
    """The entries of a sample table box: version/flags, a u32 count, then the entries."""
    _full_box(buf, box, 8, where)
    count = _U32.unpack_from(buf, box.body + 4)[0]
    dtype = np.dtype(dtype)
    if box.body + 8 + count * dtype.itemsize > box.end:
        raise Mp4Error(where, f"{_name(box)} table truncated ({count} entries)")
    return np.frombuffer(buf, dtype, count, box.body + 8)


def _run_lengths(counts: np.ndarray, values: np.ndarray, n: int, fill: int) -> np.ndarray:
    """Expand (count, value) runs to exactly ``n`` int64 values, padding with ``fill``."""
    ends = np.minimum(np.cumsum(counts.astype(np.int64)), n)
    out = np.repeat(values.astype(np.int64), np.diff(ends, prepend=0))
    if len(out) < n:
        out = np.concatenate([out, np.full(n - len(out), fill, np.int64)])
    return out


def _sample_sizes(buf: memoryview, stbl: dict[bytes, Box], size: int, where: str) -> np.ndarray:
    box = stbl.get(b"stsz")
    if box is not None:
        _full_box(buf, box, 12, where)
        constant, count = struct.unpack_from(">II", buf, box.body + 4)
        if constant:
            if constant * count > size:
                raise Mp4Error(where, f"stsz: {count} samples of {constant} bytes exceed the file")
            return np.full(count, constant, np.uint32)
        if box.body + 12 + 4 * count > box.end:
            raise Mp4Error(where, f"stsz table truncated ({count} entries)")
        return np.frombuffer(buf, ">u4", count, box.body + 12).astype(np.uint32)
    box = stbl.get(b"stz2")
    if box is None:
        raise Mp4Error(where, "video track has no sample size table (stsz)")
    _full_box(buf, box, 12, where)
    field = buf[box.body + 7]
    count = _U32.unpack_from(buf, box.body + 8)[0]
    nbytes = (count * field + 7) // 8
    if field not in (4, 8, 16) or box.body + 12 + nbytes > box.end:
        raise Mp4Error(where, f"bad stz2 table (field size {field}, {count} entries)")
    if field == 4:
        packed = np.frombuffer(buf, np.uint8, nbytes, box.body + 12)
        return np.stack([packed >> 4, packed & 15], axis=1).reshape(-1)[:count].astype(np.uint32)
    return np.frombuffer(buf, ">u1" if field == 8 else ">u2", count, box.body + 12).astype(
        np.uint32
    )


def _chunk_offsets(buf: memoryview, stbl: dict[bytes, Box], where: str) -> np.ndarray:
    if b"co64" in stbl:
        return _table(buf, stbl[b"co64"], ">u8", where).astype(np.uint64)
    if b"stco" in stbl:
        return _table(buf, stbl[b"stco"], ">u4", where).astype(np.uint64)
    raise Mp4Error(where, "video track has no chunk offset table (stco / co64)")


def _sample_offsets(
    chunk_offsets: np.ndarray, stsc: np.ndarray, sizes: np.ndarray, where: str
) -> np.ndarray:
    """Each sample's offset in the mp4, from chunk offsets, sample-to-chunk runs and sizes."""
    n = len(sizes)
    chunks = len(chunk_offsets)
    if n == 0:
        return np.zeros(0, np.uint64)
    if len(stsc) == 0 or chunks == 0:
        raise Mp4Error(where, "empty sample-to-chunk or chunk offset table")
    first_chunk = stsc["first_chunk"].astype(np.int64) - 1
    if first_chunk[0] != 0 or np.any(np.diff(first_chunk) <= 0) or first_chunk[-1] >= chunks:
        raise Mp4Error(where, "bad sample-to-chunk table (stsc)")
    per_chunk = np.repeat(stsc["per_chunk"].astype(np.int64), np.diff(first_chunk, append=chunks))
    filled = np.cumsum(per_chunk)
    if filled[-1] < n:
        raise Mp4Error(where, f"chunks hold {int(filled[-1])} samples, the track has {n}")
    used = int(np.searchsorted(filled, n)) + 1
    per_chunk = per_chunk[:used].copy()
    per_chunk[-1] -= filled[used - 1] - n  # the last chunk may claim more samples than exist
    chunk_of = np.repeat(np.arange(used), per_chunk)
    sizes64 = sizes.astype(np.uint64)
    before = np.cumsum(sizes64) - sizes64  # bytes of all earlier samples
    chunk_first = (np.cumsum(per_chunk) - per_chunk)[chunk_of]
    return chunk_offsets[chunk_of] + (before - before[chunk_first])


def _times(
    buf: memoryview, stbl: dict[bytes, Box], n: int, where: str
) -> tuple[np.ndarray, np.ndarray, bool, float]:
    """(dts, pts, has_ctts, fps): decode and presentation times per sample, in media ticks.

    Composition offsets are signed in both ctts versions, as FFmpeg reads them. ``fps`` is the
    stts sample count over the stts duration, in samples per tick.
    """
    if b"stts" not in stbl:
        raise Mp4Error(where, "video track has no decoding time table (stts)")
    stts = _table(buf, stbl[b"stts"], _STTS, where)
    if len(stts) == 0:
        raise Mp4Error(where, "empty decoding time table (stts)")
    deltas = _run_lengths(stts["count"], stts["delta"], n, int(stts["delta"][-1]))
    dts = np.cumsum(deltas) - deltas
    counts = stts["count"].astype(np.int64)
    ticks = int(counts @ stts["delta"].astype(np.int64))
    rate = int(counts.sum()) / ticks if ticks else 0.0
    ctts_box = stbl.get(b"ctts")
    if ctts_box is None:
        return dts, dts, False, rate
    ctts = _table(buf, ctts_box, _CTTS, where)
    return dts, dts + _run_lengths(ctts["count"], ctts["offset"], n, 0), True, rate


def _edits(buf: memoryview, trak: dict[bytes, Box], where: str) -> list[Edit]:
    edts = trak.get(b"edts")
    elst = children(buf, edts, where).get(b"elst") if edts is not None else None
    if elst is None:
        return []
    version = _full_box(buf, elst, 8, where)
    table = _table(buf, elst, _ELST1 if version == 1 else _ELST0, where)
    return [Edit(int(d), int(t)) for d, t in zip(table["duration"], table["media_time"])]


def _rotation(buf: memoryview, tkhd: Box, where: str) -> int:
    version = _full_box(buf, tkhd, 84, where)
    at = tkhd.body + (52 if version == 1 else 40)
    if at + 36 > tkhd.end:
        raise Mp4Error(where, "tkhd box too short")
    a, b = struct.unpack_from(">ii", buf, at)
    if a == 0 and b == 0:
        return 0
    return round(math.degrees(math.atan2(b, a)) / 90) % 4 * 90


def _colour(buf: memoryview, entry: dict[bytes, Box]) -> tuple[str | None, bool | None]:
    colr = entry.get(b"colr")
    if colr is None or colr.end - colr.body < 10:
        return None, None
    kind = bytes(buf[colr.body : colr.body + 4])
    if kind not in (b"nclx", b"nclc"):
        return None, None
    matrix = _MATRIX_NAMES.get(_U16.unpack_from(buf, colr.body + 8)[0])
    full_range = None
    if kind == b"nclx" and colr.end - colr.body >= 11:
        full_range = bool(buf[colr.body + 10] & 0x80)
    return matrix, full_range


def _track_id(buf: memoryview, tkhd: Box, where: str) -> int:
    version = _full_box(buf, tkhd, 24, where)
    return int(_U32.unpack_from(buf, tkhd.body + (20 if version == 1 else 12))[0])


def _parse_moov(moov: memoryview, size: int, base: int, where: str) -> Mp4Track:
    top = next(iter_boxes(moov, 0, len(moov), where))
    boxes = list(iter_boxes(moov, top.body, top.end, where))
    fragmented = any(box.type == b"mvex" for box in boxes)  # samples live in moof boxes
    movie_timescale = 1  # FFmpeg reads a missing or zero mvhd timescale as 1
    mvhd = next((box for box in boxes if box.type == b"mvhd"), None)
    if mvhd is not None:
        version = _full_box(moov, mvhd, 24, where)
        movie_timescale = _U32.unpack_from(moov, mvhd.body + (20 if version == 1 else 12))[0] or 1
    unsupported: str | None = None
    for box in boxes:
        if box.type == b"trak":
            track = _video_track(moov, box, movie_timescale, size, base, where, fragmented)
            if isinstance(track, Mp4Track):
                return track
            unsupported = unsupported or track
    if unsupported is not None:
        raise UnsupportedVideo(where, unsupported)
    raise Mp4Error(where, "no video track")


class _SampleEntry(NamedTuple):
    codec: str
    width: int
    height: int
    config: bytes
    nal_length_size: int
    prefix: bytes
    matrix: str | None
    full_range: bool | None


def _video_track(
    buf: memoryview,
    trak_box: Box,
    movie_timescale: int,
    size: int,
    base: int,
    where: str,
    fragmented: bool,
) -> Mp4Track | str | None:
    """The track as Mp4Track; its codec name when it is video we cannot read; None if not video."""
    trak = children(buf, trak_box, where)
    if b"mdia" not in trak or b"tkhd" not in trak:
        raise Mp4Error(where, "track without mdia or tkhd box")
    mdia = children(buf, trak[b"mdia"], where)
    hdlr = mdia.get(b"hdlr")
    if hdlr is None or bytes(buf[hdlr.body + 8 : hdlr.body + 12]) != b"vide":
        return None
    if b"mdhd" not in mdia or b"minf" not in mdia:
        raise Mp4Error(where, "video track without mdhd or minf box")
    minf = children(buf, mdia[b"minf"], where)
    if b"stbl" not in minf:
        raise Mp4Error(where, "video track without a sample table (stbl)")
    stbl = children(buf, minf[b"stbl"], where)
    entry = _sample_entry(buf, stbl, where)
    if isinstance(entry, str):
        return entry
    mdhd = mdia[b"mdhd"]
    version = _full_box(buf, mdhd, 24, where)
    timescale = _U32.unpack_from(buf, mdhd.body + (20 if version == 1 else 12))[0]
    if timescale == 0:
        raise Mp4Error(where, "video track has timescale 0 (mdhd)")

    sizes = _sample_sizes(buf, stbl, size, where)
    n = len(sizes)
    if n == 0:
        if fragmented:
            raise UnsupportedVideo(where, entry.codec, "fragmented mp4 (moof) is not supported")
        raise Mp4Error(where, "video track has no samples")
    if b"stsc" not in stbl:
        raise Mp4Error(where, "video track has no sample-to-chunk table (stsc)")
    stsc = _table(buf, stbl[b"stsc"], _STSC, where)
    offsets = _sample_offsets(_chunk_offsets(buf, stbl, where), stsc, sizes, where)
    if int((offsets + sizes).max()) > size:
        raise Mp4Error(where, f"samples run past the end of the file ({size} bytes): truncated")
    keyframes = _keyframes(buf, stbl, n, where)
    dts, pts, has_ctts, rate = _times(buf, stbl, n, where)
    edits = _edits(buf, trak, where)
    edited = apply_edits(edits, dts, pts, keyframes, has_ctts, movie_timescale, timescale)
    if edited is None:
        display = np.empty(n, np.int32)
        display[np.argsort(pts, kind="stable")] = np.arange(n, dtype=np.int32)
    else:
        picked = edited.samples
        offsets, sizes, keyframes = offsets[picked], sizes[picked], keyframes[picked]
        display = edited.display
    shown = int((display >= 0).sum())
    if shown == 0:
        raise Mp4Error(where, "the edit list shows no frame of the video track")
    offsets = offsets + np.uint64(base)
    for array in (offsets, sizes, keyframes, display):
        array.setflags(write=False)
    return Mp4Track(
        codec=entry.codec,  # type: ignore[arg-type]
        width=entry.width,
        height=entry.height,
        fps=rate * timescale,
        timescale=timescale,
        n=shown,
        offsets=offsets,
        sizes=sizes,
        keyframes=keyframes,
        display=display,
        config=entry.config,
        nal_length_size=entry.nal_length_size,
        prefix=entry.prefix,
        matrix=entry.matrix,  # type: ignore[arg-type]
        full_range=entry.full_range,
        rotation=_rotation(buf, trak[b"tkhd"], where),
        track_id=_track_id(buf, trak[b"tkhd"], where),
    )


def _sample_entry(buf: memoryview, stbl: dict[bytes, Box], where: str) -> _SampleEntry | str:
    """The first sample description; only its codec name when kohakuclip cannot decode it."""
    stsd = stbl.get(b"stsd")
    if stsd is None:
        raise Mp4Error(where, "video track without a sample description (stsd)")
    _full_box(buf, stsd, 8, where)
    if _U32.unpack_from(buf, stsd.body + 4)[0] == 0 or stsd.end - stsd.body < 16:
        raise Mp4Error(where, "empty sample description (stsd)")
    box = next(iter_boxes(buf, stsd.body + 8, stsd.end, where))
    codec = _SAMPLE_ENTRY_CODECS.get(box.type, _name(box).strip())
    if codec not in _CONFIG_BOX:
        return codec
    if box.end - box.body < _VISUAL_SAMPLE_ENTRY:
        raise Mp4Error(where, f"{_name(box)} sample entry too short")
    width, height = struct.unpack_from(">HH", buf, box.body + 24)
    inner = children(buf, box._replace(body=box.body + _VISUAL_SAMPLE_ENTRY), where)
    config_box = inner.get(_CONFIG_BOX[codec])
    if config_box is None:
        wanted = _CONFIG_BOX[codec].decode()
        raise Mp4Error(where, f"{_name(box)} sample entry lacks its {wanted} box")
    config = bytes(buf[config_box.body : config_box.end])
    try:
        if codec == "av1":
            length_size, prefix = 0, config[4:]
        else:
            length_size = nal_length_size(codec, config)
            prefix = parameter_sets_annexb(codec, config)
    except AnnexBError as e:
        raise Mp4Error(where, str(e)) from None
    matrix, full_range = _colour(buf, inner)
    return _SampleEntry(codec, width, height, config, length_size, prefix, matrix, full_range)


def _keyframes(buf: memoryview, stbl: dict[bytes, Box], n: int, where: str) -> np.ndarray:
    """Sync samples from stss (every sample when there is none)."""
    if b"stss" not in stbl:
        return np.ones(n, bool)
    sync = _table(buf, stbl[b"stss"], ">u4", where).astype(np.int64) - 1
    keyframes = np.zeros(n, bool)
    keyframes[sync[(sync >= 0) & (sync < n)]] = True
    keyframes[0] |= len(sync) == 0  # an empty stss: decoding can still only start at the top
    return keyframes

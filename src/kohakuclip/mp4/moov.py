"""Parse an mp4's moov box into the first video track's sample table (numpy, decode order).

Reads are few: the top-level box headers (the first 64 KiB in one read, which holds a
faststart file's whole moov), then the moov in one read. The tables are decoded with numpy
straight from the box payloads. Edit lists are honoured as FFmpeg does (see ``mp4.edits``).
A fragmented mp4 (an ``mvex`` in its moov) adds the samples of its movie fragments after the
moov's own (see ``mp4.fragments``); as in FFmpeg, its edit list hides no sample then, and a
fragment's sample whose decode time does not pass the previous one's is never shown.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

import numpy as np

from kohakuclip.codecs.annexb import AnnexBError, nal_length_size, parameter_sets_annexb
from kohakuclip.codecs.colour import MATRIX_NAMES, completed_colour
from kohakuclip.errors import KohakuClipError
from kohakuclip.mp4.boxes import Box, Mp4Error, ReadAt, children, iter_boxes, top_level_boxes
from kohakuclip.mp4.edits import Edit, apply_edits
from kohakuclip.mp4.fragments import FragmentSamples, fragment_samples, track_defaults

__all__ = ["Mp4Track", "UnsupportedVideo", "parse_mp4", "parse_mp4_bytes", "parse_mp4_file"]


Mp4Codec = Literal["av1", "h264", "hevc", "vp9", "mpeg4"]
"""Video codecs kohakuclip reads from mp4 (vp9 and mpeg4 only through PyAV)."""

_SAMPLE_ENTRY_CODECS = {
    b"av01": "av1",
    b"avc1": "h264",
    b"avc3": "h264",
    b"hvc1": "hevc",
    b"hev1": "hevc",
    b"mp4v": "mpeg4",
    b"vp09": "vp9",
    b"encv": "encrypted",
}
_CONFIG_BOX = {"av1": b"av1C", "h264": b"avcC", "hevc": b"hvcC", "vp9": b"vpcC", "mpeg4": b"esds"}
"""The decoder configuration box each codec's sample entry carries (vp9 may go without)."""
_MPEG4_VISUAL = 0x20
"""esds objectTypeIndication of MPEG-4 Part 2 video; others in an mp4v entry are named below."""
_OBJECT_TYPES = {
    **{oti: "mpeg2video" for oti in range(0x60, 0x66)},
    0x6A: "mpeg1video",
    0x6C: "mjpeg",
    0x6E: "jpeg2000",
}
_VISUAL_SAMPLE_ENTRY = 78
"""Bytes of a VisualSampleEntry before its child boxes (after the 8-byte box header)."""

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")

_STTS = np.dtype([("count", ">u4"), ("delta", ">u4")])
_CTTS = np.dtype([("count", ">u4"), ("offset", ">i4")])  # signed in both versions, as FFmpeg
_STSC = np.dtype([("first_chunk", ">u4"), ("per_chunk", ">u4"), ("entry", ">u4")])
_ELST0 = np.dtype([("duration", ">u4"), ("media_time", ">i4"), ("rate", ">i4")])
_ELST1 = np.dtype([("duration", ">u8"), ("media_time", ">i8"), ("rate", ">i4")])


class UnsupportedVideo(KohakuClipError, ValueError):
    """A well-formed mp4 whose video kohakuclip cannot read (codec, encryption)."""

    def __init__(self, where: str, codec: str, detail: str = "") -> None:
        readable = ", ".join(get_args(Mp4Codec))
        what = detail or f"unsupported video codec {codec!r} (kohakuclip reads {readable})"
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

    codec: Mp4Codec
    width: int
    height: int
    fps: float  # samples per second over the media duration (FFmpeg's avg_frame_rate)
    timescale: int  # mdhd ticks per second
    n: int  # frames shown
    offsets: np.ndarray  # uint64: absolute (base + position in the mp4)
    sizes: np.ndarray  # uint32
    keyframes: np.ndarray  # bool
    display: np.ndarray  # int32
    # raw av1C / avcC / hvcC / vpcC payload; mpeg4: the esds DecoderSpecificInfo (VOL headers)
    config: bytes
    nal_length_size: int  # h264 / hevc length field size; 0 for the others
    # av1: av1C configOBUs (sequence header); h264 / hevc: Annex B VPS/SPS/PPS; else empty
    prefix: bytes
    matrix: Literal["bt601", "bt709"] | None  # from colr nclx / nclc
    full_range: bool | None  # from colr nclx
    rotation: int  # 0 / 90 / 180 / 270: clockwise turn that shows the frames upright
    track_id: int

    def colour(
        self, first_sample: Callable[[], bytes | memoryview]
    ) -> tuple[Literal["bt601", "bt709"], bool]:
        """The matrix and range to convert with: the ``colr`` box's, completed from the stream
        (``first_sample`` returns the first sample, called only when the box is silent), else
        the size guess and limited range (``codecs.colour.completed_colour``)."""
        return completed_colour(
            self.matrix,
            self.full_range,
            (self.width, self.height),
            self.codec,
            self.prefix,
            first_sample,
            self.nal_length_size,
        )


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
    view = memoryview(data)
    top = next(iter_boxes(view, 0, len(view), where))
    mvex = next((b for b in iter_boxes(view, top.body, top.end, where) if b.type == b"mvex"), None)
    fragments: _Fragments | None = None
    if mvex is not None:  # samples (also) live in moof boxes after the moov
        defaults = track_defaults(view, mvex, where)

        def fragments(track_id: int, next_dts: int) -> FragmentSamples:
            return fragment_samples(
                read_at, size, boxes[:-1], moov.end, track_id, defaults, next_dts, where
            )

    return _parse_moov(view, size, base, where, fragments)


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
) -> tuple[np.ndarray, np.ndarray, bool, int, int]:
    """(dts, pts, has_ctts, count, ticks): decode and presentation times per sample, in media
    ticks, and the stts sample count and duration (their ratio is FFmpeg's frame rate).

    Composition offsets are signed in both ctts versions, as FFmpeg reads them.
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
    count = int(counts.sum())
    ctts_box = stbl.get(b"ctts")
    if ctts_box is None:
        return dts, dts, False, count, ticks
    ctts = _table(buf, ctts_box, _CTTS, where)
    return dts, dts + _run_lengths(ctts["count"], ctts["offset"], n, 0), True, count, ticks


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
    matrix = MATRIX_NAMES.get(_U16.unpack_from(buf, colr.body + 8)[0])
    full_range = None
    if kind == b"nclx" and colr.end - colr.body >= 11:
        full_range = bool(buf[colr.body + 10] & 0x80)
    return matrix, full_range


def _track_id(buf: memoryview, tkhd: Box, where: str) -> int:
    version = _full_box(buf, tkhd, 24, where)
    return int(_U32.unpack_from(buf, tkhd.body + (20 if version == 1 else 12))[0])


_Fragments = Callable[[int, int], FragmentSamples]
"""``fragments(track_id, next_dts)``: a track's samples in the movie fragments."""


def _parse_moov(
    moov: memoryview, size: int, base: int, where: str, fragments: _Fragments | None
) -> Mp4Track:
    top = next(iter_boxes(moov, 0, len(moov), where))
    boxes = list(iter_boxes(moov, top.body, top.end, where))
    movie_timescale = 1  # FFmpeg reads a missing or zero mvhd timescale as 1
    mvhd = next((box for box in boxes if box.type == b"mvhd"), None)
    if mvhd is not None:
        version = _full_box(moov, mvhd, 24, where)
        movie_timescale = _U32.unpack_from(moov, mvhd.body + (20 if version == 1 else 12))[0] or 1
    unsupported: str | None = None
    for box in boxes:
        if box.type == b"trak":
            track = _video_track(moov, box, movie_timescale, size, base, where, fragments)
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
    fragments: _Fragments | None,
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

    samples = _stbl_samples(buf, stbl, size, where, fragments is not None)
    track_id = _track_id(buf, trak[b"tkhd"], where)
    if fragments is None:
        edits = _edits(buf, trak, where)
    else:
        samples = _with_fragments(samples, fragments(track_id, samples.ticks))
        edits = []  # FFmpeg shows every sample of a fragmented track
    offsets, sizes, keyframes = samples.offsets, samples.sizes, samples.keyframes
    n = len(sizes)
    if n == 0:
        raise Mp4Error(where, "video track has no samples")
    if int((offsets + sizes).max()) > size:
        raise Mp4Error(where, f"samples run past the end of the file ({size} bytes): truncated")
    edited = apply_edits(
        edits, samples.dts, samples.pts, keyframes, samples.has_ctts, movie_timescale, timescale
    )
    if edited is None:
        display = np.full(n, -1, np.int32)
        visible = np.arange(n) if samples.shown is None else np.flatnonzero(samples.shown)
        order = visible[np.argsort(samples.pts[visible], kind="stable")]
        display[order] = np.arange(len(order), dtype=np.int32)
    else:
        picked = edited.samples
        offsets, sizes, keyframes = offsets[picked], sizes[picked], keyframes[picked]
        display = edited.display
    shown = int((display >= 0).sum())
    if shown == 0:
        raise Mp4Error(where, "the edit list shows no frame of the video track")
    offsets = offsets.astype(np.uint64) + np.uint64(base)
    sizes = sizes.astype(np.uint32)
    for array in (offsets, sizes, keyframes, display):
        array.setflags(write=False)
    return Mp4Track(
        codec=entry.codec,  # type: ignore[arg-type]
        width=entry.width,
        height=entry.height,
        fps=samples.n / samples.ticks * timescale if samples.ticks else 0.0,
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
        track_id=track_id,
    )


class _Samples(NamedTuple):
    """A track's samples before edits, in decode order."""

    offsets: np.ndarray  # uint64 or int64, in the mp4
    sizes: np.ndarray
    keyframes: np.ndarray
    dts: np.ndarray  # int64 media ticks
    pts: np.ndarray
    has_ctts: bool
    n: int  # samples and ...
    ticks: int  # ... their total duration (FFmpeg's frame rate is the ratio)
    shown: np.ndarray | None = None  # bool per sample, None: all (edit lists aside)


def _stbl_samples(
    buf: memoryview, stbl: dict[bytes, Box], size: int, where: str, fragmented: bool
) -> _Samples:
    """The samples the moov's own tables hold (none is fine when fragments follow)."""
    sizes = _sample_sizes(buf, stbl, size, where)
    n = len(sizes)
    if n == 0:
        if not fragmented:
            raise Mp4Error(where, "video track has no samples")
        empty = np.zeros(0, np.int64)
        return _Samples(empty, empty, np.zeros(0, bool), empty, empty, False, 0, 0)
    if b"stsc" not in stbl:
        raise Mp4Error(where, "video track has no sample-to-chunk table (stsc)")
    stsc = _table(buf, stbl[b"stsc"], _STSC, where)
    offsets = _sample_offsets(_chunk_offsets(buf, stbl, where), stsc, sizes, where)
    keyframes = _keyframes(buf, stbl, n, where)
    dts, pts, has_ctts, count, ticks = _times(buf, stbl, n, where)
    return _Samples(offsets, sizes, keyframes, dts, pts, has_ctts, count, ticks)


def _with_fragments(samples: _Samples, more: FragmentSamples) -> _Samples:
    """The moov's samples followed by the fragments' ones. As in FFmpeg, a fragment's sample
    whose decode time does not pass the previous sample's is decoded but never shown."""
    n = len(more.sizes)
    if n == 0:
        return samples
    dts = np.concatenate([samples.dts, more.dts])
    shown = np.ones(len(dts), bool)
    shown[1:] = dts[1:] > dts[:-1]
    shown[: len(samples.dts)] = True
    return _Samples(
        np.concatenate([samples.offsets.astype(np.int64), more.offsets]),
        np.concatenate([samples.sizes.astype(np.int64), more.sizes]),
        np.concatenate([samples.keyframes, more.keyframes]),
        dts,
        np.concatenate([samples.pts, more.dts + more.cts]),
        samples.has_ctts or more.has_cts,
        samples.n + n,
        samples.ticks + more.ticks,
        shown,
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
    if config_box is None and codec != "vp9":
        wanted = _CONFIG_BOX[codec].decode()
        raise Mp4Error(where, f"{_name(box)} sample entry lacks its {wanted} box")
    config = b"" if config_box is None else bytes(buf[config_box.body : config_box.end])
    matrix, full_range = _colour(buf, inner)
    length_size, prefix = 0, b""
    try:
        if codec == "av1":
            prefix = config[4:]
        elif codec in ("h264", "hevc"):
            length_size = nal_length_size(codec, config)
            prefix = parameter_sets_annexb(codec, config)
    except AnnexBError as e:
        raise Mp4Error(where, str(e)) from None
    if codec == "mpeg4":
        object_type, config = _decoder_config(config, where)
        if object_type != _MPEG4_VISUAL:
            return _OBJECT_TYPES.get(object_type, f"mp4v (object type 0x{object_type:02x})")
    if codec == "vp9" and matrix is None and len(config) >= 10 and config[0] == 1:
        matrix = MATRIX_NAMES.get(config[9])  # vpcC version 1: matrix_coefficients
        full_range = bool(config[6] & 1)
    return _SampleEntry(codec, width, height, config, length_size, prefix, matrix, full_range)


def _descriptor(data: bytes, pos: int, where: str) -> tuple[int, int, int]:
    """An MPEG-4 descriptor at ``pos``: (tag, where its payload starts, where it ends)."""
    if pos >= len(data):
        raise Mp4Error(where, "esds box truncated")
    tag, length, pos = data[pos], 0, pos + 1
    for _ in range(4):  # expandable size: 7 bits a byte, high bit set while more follow
        if pos >= len(data):
            raise Mp4Error(where, "esds box truncated")
        length = (length << 7) | (data[pos] & 0x7F)
        pos += 1
        if not data[pos - 1] & 0x80:
            break
    if pos + length > len(data):
        raise Mp4Error(where, f"esds descriptor 0x{tag:02x} runs past its box")
    return tag, pos, pos + length


def _decoder_config(esds: bytes, where: str) -> tuple[int, bytes]:
    """(objectTypeIndication, DecoderSpecificInfo) of an esds payload (after version/flags)."""
    tag, pos, end = _descriptor(esds, 4, where)
    if tag != 0x03 or end - pos < 3:
        raise Mp4Error(where, "esds box without an ES descriptor")
    flags = esds[pos + 2]
    pos += 3 + (2 if flags & 0x80 else 0)  # ES_ID, flags, dependsOn_ES_ID
    if flags & 0x40:  # URL
        pos += 1 + (esds[pos] if pos < end else 0)
    pos += 2 if flags & 0x20 else 0  # OCR_ES_ID
    tag, pos, end = _descriptor(esds, pos, where)
    if tag != 0x04 or end - pos < 13:
        raise Mp4Error(where, "esds box without a decoder configuration descriptor")
    object_type = esds[pos]
    pos += 13
    while pos < end:
        tag, start, stop = _descriptor(esds, pos, where)
        if tag == 0x05:
            return object_type, esds[start:stop]
        pos = stop
    return object_type, b""


def _keyframes(buf: memoryview, stbl: dict[bytes, Box], n: int, where: str) -> np.ndarray:
    """Sync samples from stss (every sample when there is none)."""
    if b"stss" not in stbl:
        return np.ones(n, bool)
    sync = _table(buf, stbl[b"stss"], ">u4", where).astype(np.int64) - 1
    keyframes = np.zeros(n, bool)
    keyframes[sync[(sync >= 0) & (sync < n)]] = True
    keyframes[0] |= len(sync) == 0  # an empty stss: decoding can still only start at the top
    return keyframes

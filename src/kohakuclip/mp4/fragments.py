"""Fragmented mp4: the samples a track keeps in movie fragments (moof / traf / tfhd / tfdt / trun).

A fragmented file announces itself with an ``mvex`` box in its moov (holding one ``trex`` of
default sample values per track); its samples follow in ``moof`` boxes, each describing the
samples of the ``mdat`` after it. The moov may hold samples of its own (they come first) or
none at all (``empty_moov``). ``sidx``, ``mfra`` and any other top-level box are skipped.

Per sample, duration, size and flags come from the ``trun`` entry, else the ``tfhd`` defaults,
else the ``trex`` defaults. Data offsets follow ISO/IEC 14496-12: a ``trun`` data offset is
relative to the ``tfhd`` base-data-offset when given, else to the moof's start when
default-base-is-moof is set or for the first ``traf`` of a moof, else to where the previous
``traf``'s data ended; a ``trun`` without a data offset continues after the previous run.
Decode times start at the ``tfdt`` time when given, else where the previous fragment ended.
As in FFmpeg, composition offsets are signed in both ``trun`` versions and a sample is a
keyframe when its flags mark it neither non-sync nor dependent on other samples.

The file is walked with few reads: box headers and moofs come from 4 KiB windows, so small
fragments (one per frame) cost about one read each.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from itertools import accumulate
from typing import NamedTuple

import numpy as np

from kohakuclip.mp4.boxes import Box, Mp4Error, ReadAt, box_header, iter_boxes

__all__ = ["FragmentSamples", "fragment_samples", "track_defaults"]


_WINDOW = 4096
"""Bytes read at a time while walking the fragments."""

_NON_SYNC = 0x00010000  # sample_is_non_sync_sample
_DEPENDS_YES = 0x01000000  # sample_depends_on == 1: not an I picture

# tfhd flags
_BASE_DATA_OFFSET = 0x000001
_DESCRIPTION_INDEX = 0x000002
_DEFAULT_DURATION = 0x000008
_DEFAULT_SIZE = 0x000010
_DEFAULT_FLAGS = 0x000020
_DEFAULT_BASE_IS_MOOF = 0x020000
_TFHD_FIELDS = {
    _BASE_DATA_OFFSET: 8,
    _DESCRIPTION_INDEX: 4,
    _DEFAULT_DURATION: 4,
    _DEFAULT_SIZE: 4,
    _DEFAULT_FLAGS: 4,
}
"""The optional tfhd fields after the track id, in order, and their sizes."""
_TFHD_DEFAULTS = {_DEFAULT_DURATION: 0, _DEFAULT_SIZE: 1, _DEFAULT_FLAGS: 2}
"""Where each tfhd default goes in a TrackDefaults."""

# trun flags
_DATA_OFFSET = 0x000001
_FIRST_SAMPLE_FLAGS = 0x000004
_SAMPLE_DURATION = 0x000100
_SAMPLE_SIZE = 0x000200
_SAMPLE_FLAGS = 0x000400
_SAMPLE_CTS = 0x000800

_U32 = struct.Struct(">I")


class TrackDefaults(NamedTuple):
    """A track's ``trex``: the sample values its fragments fall back on."""

    duration: int
    size: int
    flags: int


class FragmentSamples(NamedTuple):
    """The samples of one track's fragments, in decode order."""

    offsets: np.ndarray  # int64, relative to the start of the mp4
    sizes: np.ndarray  # int64
    keyframes: np.ndarray  # bool
    dts: np.ndarray  # int64 media ticks
    cts: np.ndarray  # int64 composition offsets (pts = dts + cts)
    has_cts: bool  # some run carried composition offsets
    ticks: int  # the samples' total duration


def track_defaults(moov: memoryview, mvex: Box, where: str) -> dict[int, TrackDefaults]:
    """The ``trex`` boxes of an ``mvex``, by track id."""
    found: dict[int, TrackDefaults] = {}
    for box in iter_boxes(moov, mvex.body, mvex.end, where):
        if box.type != b"trex":
            continue
        if box.end - box.body < 24:
            raise Mp4Error(where, f"trex box too short ({box.end - box.body} bytes)")
        track_id, _, duration, size, flags = struct.unpack_from(">5I", moov, box.body + 4)
        found[track_id] = TrackDefaults(duration, size, flags)
    return found


class _Window:
    """Reads of a file through a small moving window (one read serves neighbouring boxes)."""

    def __init__(self, read_at: ReadAt, size: int, where: str) -> None:
        self._read_at, self._size, self._where = read_at, size, where
        self._start, self._data = 0, b""

    def read(self, offset: int, length: int) -> bytes | memoryview:
        rel = offset - self._start
        if rel < 0 or rel + length > len(self._data):
            want = min(max(length, _WINDOW), self._size - offset)
            self._data, self._start, rel = self._read_at(offset, want), offset, 0
            if len(self._data) < length:
                raise Mp4Error(self._where, f"short read at byte {offset} (truncated?)")
        return memoryview(self._data)[rel : rel + length]


def _moofs(
    read_at: ReadAt, size: int, before: list[Box], first: int, where: str
) -> Iterator[tuple[int, bytes | memoryview]]:
    """Each top-level ``moof`` as (its offset in the file, its bytes): those among ``before``
    (boxes already listed), then those from byte ``first`` to the end of the file."""
    window = _Window(read_at, size, where)
    for box in before:
        if box.type == b"moof":
            yield box.start, window.read(box.start, box.end - box.start)
    pos = first
    while pos < size:
        if size - pos < 8:
            raise Mp4Error(where, f"{size - pos} stray bytes at byte {pos}")
        box = box_header(window.read(pos, min(16, size - pos)), 0, size - pos, where, origin=pos)
        if box.type == b"moof":
            yield box.start, window.read(box.start, box.end - box.start)
        pos = box.end


_TRUN_FIELDS = (
    (_SAMPLE_DURATION, "I"),
    (_SAMPLE_SIZE, "I"),
    (_SAMPLE_FLAGS, "I"),
    (_SAMPLE_CTS, "i"),
)
"""The optional per-sample trun fields, in order, and their struct codes (cts signed)."""


class _Run(NamedTuple):
    """One trun's samples (tuples: runs are often a sample or a few, numpy would cost more)."""

    start: int  # where its data starts in the file
    sizes: tuple[int, ...]
    durations: tuple[int, ...]
    flags: tuple[int, ...]
    cts: tuple[int, ...] | None


def _trun(
    buf: bytes | memoryview,
    box: Box,
    base: int,
    after: int,
    defaults: TrackDefaults,
    limit: int,
    where: str,
) -> _Run:
    """One ``trun`` (``box`` lies in ``buf``): its data starts at ``base`` plus its data offset,
    or at ``after`` (where the previous run ended) when it gives none. ``limit``: the file's
    size."""
    if box.end - box.body < 8:
        raise Mp4Error(where, "trun box too short")
    version_flags, count = struct.unpack_from(">II", buf, box.body)
    flags = version_flags & 0xFFFFFF
    if count > limit:  # every sample takes a byte of the file at least
        raise Mp4Error(where, f"trun claims {count} samples in a {limit}-byte file")
    pos = box.body + 8
    data_start = after
    if flags & _DATA_OFFSET:
        if pos + 4 > box.end:
            raise Mp4Error(where, "trun box too short")
        data_start = base + struct.unpack_from(">i", buf, pos)[0]
        pos += 4
    first_flags = None
    if flags & _FIRST_SAMPLE_FLAGS:
        first_flags = _U32.unpack_from(buf, pos)[0] if pos + 4 <= box.end else None
        pos += 4
    present = [(bit, code) for bit, code in _TRUN_FIELDS if flags & bit]
    width = len(present)
    if pos > box.end or pos + 4 * width * count > box.end:
        raise Mp4Error(where, f"trun table truncated ({count} entries)")
    table = struct.unpack_from(">" + "".join(c for _, c in present) * count, buf, pos)
    columns = {bit: table[j::width] for j, (bit, _) in enumerate(present)}

    def column(bit: int, default: int) -> tuple[int, ...]:
        return columns[bit] if bit in columns else (default,) * count

    sample_flags = column(_SAMPLE_FLAGS, defaults.flags)
    if first_flags is not None and count:
        sample_flags = (first_flags, *sample_flags[1:])
    return _Run(
        data_start,
        column(_SAMPLE_SIZE, defaults.size),
        column(_SAMPLE_DURATION, defaults.duration),
        sample_flags,
        columns.get(_SAMPLE_CTS),
    )


def _tfhd(
    buf: bytes | memoryview, box: Box, defaults: TrackDefaults, where: str
) -> tuple[int | None, bool, TrackDefaults]:
    """(base data offset or None, default-base-is-moof, the fragment's sample defaults)."""
    flags = _U32.unpack_from(buf, box.body)[0] & 0xFFFFFF if box.end - box.body >= 4 else 0
    present = [bit for bit in _TFHD_FIELDS if flags & bit]
    if box.end - box.body < 8 + sum(_TFHD_FIELDS[bit] for bit in present):
        raise Mp4Error(where, "tfhd box too short for its flags")
    values = list(defaults)
    base = None
    pos = box.body + 8
    for bit in present:
        if bit == _BASE_DATA_OFFSET:
            base = int(struct.unpack_from(">Q", buf, pos)[0])
        elif bit != _DESCRIPTION_INDEX:
            values[_TFHD_DEFAULTS[bit]] = _U32.unpack_from(buf, pos)[0]
        pos += _TFHD_FIELDS[bit]
    return base, bool(flags & _DEFAULT_BASE_IS_MOOF), TrackDefaults(*values)


def _tfdt(buf: bytes | memoryview, box: Box, where: str) -> int:
    if box.end - box.body < 8:
        raise Mp4Error(where, "tfdt box too short")
    if buf[box.body] == 1:
        if box.end - box.body < 12:
            raise Mp4Error(where, "tfdt box too short")
        return int(struct.unpack_from(">Q", buf, box.body + 4)[0])
    return int(_U32.unpack_from(buf, box.body + 4)[0])


def fragment_samples(
    read_at: ReadAt,
    size: int,
    before: list[Box],
    first: int,
    track_id: int,
    defaults: dict[int, TrackDefaults],
    next_dts: int,
    where: str,
) -> FragmentSamples:
    """The samples of track ``track_id`` in the fragments of an mp4 of ``size`` bytes.

    ``before``: the top-level boxes already listed (up to the moov); the rest of the file is
    walked from byte ``first``. ``defaults``: every track's ``trex`` (other tracks' runs place
    the data of the next ``traf`` when it has no base of its own). ``next_dts``: the decode time
    after the moov's own samples.
    """
    if track_id not in defaults:
        raise Mp4Error(where, f"fragmented mp4 without a trex box for track {track_id}")
    offsets: list[int] = []
    sizes: list[int] = []
    flags: list[int] = []
    dts: list[int] = []
    cts: list[int] = []
    has_cts = False
    ticks = 0
    for moof_start, data in _moofs(read_at, size, before, first, where):
        implicit = moof_start  # where the previous traf's data ended (first traf: the moof)
        moof = box_header(data, 0, len(data), where)
        for traf in iter_boxes(data, moof.body, moof.end, where):
            if traf.type != b"traf":
                continue
            boxes = list(iter_boxes(data, traf.body, traf.end, where))
            tfhd = next((b for b in boxes if b.type == b"tfhd"), None)
            if tfhd is None:
                raise Mp4Error(where, f"traf without a tfhd box in the moof at byte {moof_start}")
            tid = _U32.unpack_from(data, tfhd.body + 4)[0] if tfhd.end - tfhd.body >= 8 else -1
            if tid not in defaults:
                raise Mp4Error(where, f"fragment of track {tid}, which the moov lacks (trex)")
            base, moof_base, frag_defaults = _tfhd(data, tfhd, defaults[tid], where)
            if base is None:
                base = moof_start if moof_base else implicit
            if tid == track_id:
                next_dts = next(
                    (_tfdt(data, b, where) for b in boxes if b.type == b"tfdt"), next_dts
                )
            after = base
            for box in boxes:
                if box.type != b"trun":
                    continue
                run = _trun(data, box, base, after, frag_defaults, size, where)
                starts = list(accumulate(run.sizes, initial=run.start))
                after = starts.pop()
                if tid != track_id:
                    continue
                times = list(accumulate(run.durations, initial=next_dts))
                next_dts = times.pop()
                offsets += starts
                sizes += run.sizes
                flags += run.flags
                dts += times
                cts += run.cts or (0,) * len(run.sizes)
                has_cts |= run.cts is not None
                ticks += sum(run.durations)
            implicit = after
    sample_flags = np.array(flags, np.int64)
    return FragmentSamples(
        offsets=np.array(offsets, np.int64),
        sizes=np.array(sizes, np.int64),
        keyframes=(sample_flags & (_NON_SYNC | _DEPENDS_YES)) == 0,
        dts=np.array(dts, np.int64),
        cts=np.array(cts, np.int64),
        has_cts=has_cts,
        ticks=ticks,
    )

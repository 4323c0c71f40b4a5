"""Fragmented mp4 made from a plain one: remuxed by FFmpeg (movflags), or written by hand with
each way ISO/IEC 14496-12 lets fragments place their data and give their sample values."""

from __future__ import annotations

import io
import itertools
import os
import struct
import tempfile
from typing import NamedTuple

import av

from kohakuclip.mp4.boxes import iter_boxes

NON_SYNC = 0x01010000  # sample_depends_on = 1, sample_is_non_sync_sample
SYNC = 0x02000000  # sample_depends_on = 2 (an I picture)

HAND_LAYOUTS = ("trex_defaults", "tfhd_defaults", "two_runs", "two_trafs", "absolute_no_tfdt")
"""Hand-made layouts (see ``hand_fragmented``)."""


def remux(plain: bytes, movflags: str) -> bytes:
    """The same packets muxed again by FFmpeg's mp4 muxer with ``movflags``."""
    with tempfile.TemporaryDirectory() as work:  # global_sidx reads its output back
        path = os.path.join(work, "out.mp4")
        with av.open(io.BytesIO(plain)) as source:
            stream = source.streams.video[0]
            with av.open(path, "w", format="mp4", options={"movflags": movflags}) as out:
                target = out.add_stream_from_template(stream, opaque=True)
                for packet in source.demux(stream):
                    if packet.dts is None:
                        continue
                    packet.stream = target
                    out.mux(packet)
        with open(path, "rb") as f:
            return f.read()


class Sample(NamedTuple):
    data: bytes
    dts: int
    cts: int
    duration: int
    key: bool


def _samples(plain: bytes) -> list[Sample]:
    """The samples in decode order, decode times from 0."""
    with av.open(io.BytesIO(plain)) as source:
        packets = [p for p in source.demux(video=0) if p.dts is not None]
    start = packets[0].dts
    return [
        Sample(bytes(p), p.dts - start, p.pts - p.dts, p.duration, p.is_keyframe) for p in packets
    ]


def _box(kind: bytes, *payload: bytes) -> bytes:
    body = b"".join(payload)
    return struct.pack(">I", 8 + len(body)) + kind + body


def _full(kind: bytes, version: int, flags: int, *payload: bytes) -> bytes:
    return _box(kind, struct.pack(">I", version << 24 | flags), *payload)


def _with_trex(moov: bytes, duration: int, flags: int) -> bytes:
    """``moov`` with its (single) trex's default duration, size and flags replaced."""
    at = moov.find(b"trex")
    assert at > 0, "no trex"
    body = at + 4 + 4  # after the type and version / flags
    return (
        moov[:body]
        + moov[body : body + 8]
        + struct.pack(">III", duration, 0, flags)
        + moov[body + 20 :]
    )


def _trun(samples: list[Sample], data_offset: int | None, per_sample: bool) -> bytes:
    """A version-1 trun: sizes and composition offsets always; with ``per_sample`` durations and
    flags too, else the first sample's flags only (the rest from the defaults)."""
    flags = 0x200 | 0x800 | (0x100 | 0x400 if per_sample else 0x004)
    flags |= 0x001 if data_offset is not None else 0
    head = struct.pack(">I", len(samples))
    if data_offset is not None:
        head += struct.pack(">i", data_offset)
    if not per_sample:
        head += struct.pack(">I", SYNC if samples[0].key else NON_SYNC)
    rows = b""
    for s in samples:
        if per_sample:
            rows += struct.pack(">I", s.duration)
        rows += struct.pack(">I", len(s.data))
        if per_sample:
            rows += struct.pack(">I", SYNC if s.key else NON_SYNC)
        rows += struct.pack(">i", s.cts)
    return _full(b"trun", 1, flags, head, rows)


def _tfdt(dts: int) -> bytes:
    return _full(b"tfdt", 1, 0, struct.pack(">Q", dts))


def _fragment(layout: str, seq: int, gop: list[Sample], at: int) -> bytes:
    """One moof + mdat for ``gop``, the moof starting at byte ``at`` of the file."""
    payload = b"".join(s.data for s in gop)
    half = max(1, len(gop) // 2)
    first, rest = gop[:half], gop[half:]
    first_bytes = sum(len(s.data) for s in first)

    def moof(data_offset: int) -> bytes:
        mfhd = _full(b"mfhd", 0, 0, struct.pack(">I", seq))
        track = struct.pack(">I", 1)
        if layout == "trex_defaults":  # durations and non-key flags from trex
            traf = _box(
                b"traf",
                _full(b"tfhd", 0, 0x020000, track),
                _tfdt(gop[0].dts),
                _trun(gop, data_offset, per_sample=False),
            )
            return _box(b"moof", mfhd, traf)
        if layout == "tfhd_defaults":  # tfhd defaults override (wrong) trex ones
            defaults = struct.pack(">II", gop[0].duration, NON_SYNC)
            traf = _box(
                b"traf",
                _full(b"tfhd", 0, 0x020000 | 0x08 | 0x20, track, defaults),
                _tfdt(gop[0].dts),
                _trun(gop, data_offset, per_sample=False),
            )
            return _box(b"moof", mfhd, traf)
        if layout == "two_runs":  # no base: the moof; the second run follows the first
            runs = [_trun(first, data_offset, per_sample=True)]
            if rest:
                runs.append(_trun(rest, None, per_sample=True))
            traf = _box(b"traf", _full(b"tfhd", 0, 0, track), _tfdt(gop[0].dts), *runs)
            return _box(b"moof", mfhd, traf)
        if layout == "two_trafs":  # the second traf's data starts where the first's ended
            trafs = [
                _box(
                    b"traf",
                    _full(b"tfhd", 0, 0, track),
                    _tfdt(gop[0].dts),
                    _trun(first, data_offset, per_sample=True),
                )
            ]
            if rest:
                trafs.append(
                    _box(
                        b"traf",
                        _full(b"tfhd", 0, 0, track),
                        _tfdt(rest[0].dts),
                        _trun(rest, None, per_sample=True),
                    )
                )
            return _box(b"moof", mfhd, *trafs)
        assert layout == "absolute_no_tfdt", layout  # tfhd base: the mdat payload, no tfdt
        base = struct.pack(">Q", at + data_offset)
        traf = _box(b"traf", _full(b"tfhd", 0, 0x01, track, base), _trun(gop, 0, per_sample=True))
        return _box(b"moof", mfhd, traf)

    size = len(moof(0))
    assert first_bytes <= len(payload)
    return moof(size + 8) + _box(b"mdat", payload)


def hand_fragmented(plain: bytes, layout: str) -> bytes:
    """``plain``'s samples in one fragment per GOP, written by hand in ``layout``: one of
    ``HAND_LAYOUTS``. The moov (no samples) is FFmpeg's, its trex defaults replaced."""
    template = remux(plain, "frag_keyframe+empty_moov+default_base_moof")
    boxes = {box.type: box for box in iter_boxes(template)}
    ftyp = template[boxes[b"ftyp"].start : boxes[b"ftyp"].end]
    moov = template[boxes[b"moov"].start : boxes[b"moov"].end]
    samples = _samples(plain)
    if layout == "tfhd_defaults":  # defaults that would misread every sample
        moov = _with_trex(moov, 7, 0)
    else:
        moov = _with_trex(moov, samples[0].duration, NON_SYNC)
    out = bytearray(ftyp + moov)
    starts = [i for i, s in enumerate(samples) if s.key] + [len(samples)]
    for seq, (a, b) in enumerate(itertools.pairwise(starts), 1):
        out += _fragment(layout, seq, samples[a:b], len(out))
    return bytes(out)


def with_edit_list(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    """A fragmented file (moof-relative data offsets, no samples in the moov) with an elst of
    (duration, media_time) edits put in its video trak: the moov grows, nothing else moves."""
    payload = struct.pack(">II", 0, len(edits))
    payload += b"".join(struct.pack(">Iii", d, m, 1 << 16) for d, m in edits)
    edts = _box(b"edts", _box(b"elst", payload))

    def rebuild(buf: bytes, start: int, end: int) -> bytes:
        out = b""
        for box in iter_boxes(buf, start, end):
            if box.type not in (b"moov", b"trak"):
                out += buf[box.start : box.end]
                continue
            body = rebuild(buf, box.body, box.end)
            if box.type == b"trak":
                tkhd = next(iter_boxes(body))
                body = body[: tkhd.end] + edts + body[tkhd.end :]
            out += _box(box.type, body)
        return out

    return rebuild(data, 0, len(data))

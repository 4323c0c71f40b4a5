"""Faststart: move the moov box in front of the media data, fixing every chunk offset.

PyAV cannot apply ``movflags=faststart`` when it muxes into memory, so it leaves the moov at
the end. Readers that parse the moov on first use then need two far-apart reads; after this,
the moov follows the ftyp and one read at the start of the file gets it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np

from kohakuclip.mp4.boxes import Box, Mp4Error, iter_boxes

__all__ = ["faststart"]


_PATH_TO_STBL = {b"moov", b"trak", b"mdia", b"minf", b"stbl"}
"""Containers on the way to the chunk offset tables: rebuilt; every other box is copied."""

_U32_MAX = 0xFFFFFFFF

_Shift = Callable[[np.ndarray], np.ndarray]
"""Maps chunk offsets of the old file to the new one."""


def _header(kind: bytes, payload_size: int) -> bytes:
    if payload_size + 8 <= _U32_MAX:
        return struct.pack(">I4s", payload_size + 8, kind)
    return struct.pack(">I4sQ", 1, kind, payload_size + 16)


def _chunk_table(data: bytes, box: Box, where: str) -> np.ndarray:
    if box.end - box.body < 8:
        raise Mp4Error(where, f"{box.type.decode()} box too short")
    count = struct.unpack_from(">I", data, box.body + 4)[0]
    dtype = ">u8" if box.type == b"co64" else ">u4"
    if box.body + 8 + count * np.dtype(dtype).itemsize > box.end:
        raise Mp4Error(where, f"{box.type.decode()} table truncated ({count} entries)")
    return np.frombuffer(data, dtype, count, box.body + 8).astype(np.int64)


class _MoovRewriter:
    """Rebuilds a moov with its chunk offsets moved by ``shift``, as stco or, if asked, co64."""

    def __init__(self, data: bytes, shift: _Shift, co64: bool, where: str):
        self.data, self.shift, self.co64, self.where = data, shift, co64, where
        self.overflow = False  # an stco table got an offset past 4 GiB

    def box(self, box: Box) -> bytes:
        if box.type in (b"stco", b"co64"):
            return self._offsets(box)
        if box.type not in _PATH_TO_STBL:
            return self.data[box.start : box.end]
        inner = iter_boxes(self.data, box.body, box.end, self.where)
        body = b"".join(self.box(child) for child in inner)
        return _header(box.type, len(body)) + body

    def _offsets(self, box: Box) -> bytes:
        offsets = self.shift(_chunk_table(self.data, box, self.where))
        wide = self.co64 or box.type == b"co64"
        if not wide and len(offsets) and int(offsets.max()) > _U32_MAX:
            self.overflow = True
        table = offsets.astype(">u8" if wide else ">u4").tobytes()
        flags_and_count = self.data[box.body : box.body + 4] + struct.pack(">I", len(offsets))
        return _header(b"co64" if wide else b"stco", 8 + len(table)) + flags_and_count + table


def _shift_boxes(kept: list[Box], new_starts: np.ndarray, where: str) -> _Shift:
    """Maps old file offsets to new ones when each box of ``kept`` moves to its new start."""
    old_starts = np.array([box.start for box in kept], np.int64)
    old_ends = np.array([box.end for box in kept], np.int64)
    deltas = new_starts - old_starts

    def shift(offsets: np.ndarray) -> np.ndarray:
        at = np.searchsorted(old_starts, offsets, side="right") - 1
        if len(offsets) and (at.min() < 0 or np.any(offsets >= old_ends[at])):
            raise Mp4Error(where, "a chunk offset points outside the media data")
        return offsets + deltas[at]

    return shift


def faststart(mp4: bytes, force_co64: bool = False, where: str = "") -> bytes:
    """The mp4 with its moov after the ftyp, in front of the mdat; chunk offsets fixed.

    Offsets switch from stco to co64 when 32-bit ones would overflow (or always with
    ``force_co64``). A file whose moov already precedes its media data is returned as is
    (unless ``force_co64`` has stco tables to widen, which then happens in place).
    """
    data = bytes(mp4)
    boxes = list(iter_boxes(data, where=where))
    moov = next((box for box in boxes if box.type == b"moov"), None)
    if moov is None:
        raise Mp4Error(where, "no moov box")
    first_mdat = next((box.start for box in boxes if box.type == b"mdat"), None)
    in_front = first_mdat is None or moov.start < first_mdat
    if in_front and not (force_co64 and b"stco" in data[moov.start : moov.end]):
        return data
    kept = [box for box in boxes if box is not moov]
    if in_front:
        at = sum(1 for box in kept if box.start < moov.start)
    else:
        at = 1 if boxes[0].type == b"ftyp" else 0
    for co64 in (force_co64, True):
        moov_size = len(_MoovRewriter(data, lambda offsets: offsets, co64, where).box(moov))
        new_starts = np.cumsum([0] + [box.end - box.start for box in kept[:-1]], dtype=np.int64)
        new_starts[at:] += moov_size
        rewriter = _MoovRewriter(data, _shift_boxes(kept, new_starts, where), co64, where)
        new_moov = rewriter.box(moov)
        if not rewriter.overflow:
            break
    pieces = [data[box.start : box.end] for box in kept]
    pieces.insert(at, new_moov)
    return b"".join(pieces)

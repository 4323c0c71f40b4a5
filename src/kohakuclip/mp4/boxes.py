"""ISO base media (mp4 / mov) box framing: walk boxes in a buffer or at the top level of a file.

A box is a 32-bit big-endian size and a four-character type; size 1 means a 64-bit size follows,
size 0 means the box runs to the end of its parent (or of the file).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import NamedTuple

from kohakuclip.errors import KohakuClipError

__all__ = ["Box", "Mp4Error", "ReadAt", "box_header", "children", "iter_boxes", "top_level_boxes"]


_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

ReadAt = Callable[[int, int], bytes]
"""``read_at(offset, length) -> bytes``: read from the start of the mp4."""

_FIRST_READ = 64 * 1024
"""Bytes read at the start of a file: the top-level headers and, for faststart files, the moov."""


class Mp4Error(KohakuClipError, ValueError):
    """An mp4 that cannot be parsed (corrupt, truncated, inconsistent tables); names the file."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where or '<mp4>'}: {problem}")
        self.where = where
        self.problem = problem


class Box(NamedTuple):
    """One box: its type and where it lies (``start``: its header, ``body``: its payload)."""

    type: bytes
    start: int
    body: int
    end: int


def box_header(buf: bytes | memoryview, pos: int, limit: int, where: str, origin: int = 0) -> Box:
    """Decode the box header at ``pos`` of ``buf``; ``limit`` is where the parent ends.

    ``origin`` is the offset of ``buf`` in the file (for the returned box and for messages).
    """
    at = origin + pos
    if pos + 8 > len(buf):
        raise Mp4Error(where, f"truncated box header at byte {at}")
    size = _U32.unpack_from(buf, pos)[0]
    kind = bytes(buf[pos + 4 : pos + 8])
    body = pos + 8
    if size == 1:
        if pos + 16 > len(buf):
            raise Mp4Error(where, f"truncated 64-bit box header at byte {at}")
        size = _U64.unpack_from(buf, pos + 8)[0]
        body = pos + 16
    elif size == 0:
        size = limit - pos
    if size < body - pos or pos + size > limit:
        name = kind.decode("latin-1")
        raise Mp4Error(where, f"box {name!r} at byte {at} has a bad size {size} (truncated?)")
    return Box(kind, at, origin + body, at + size)


def iter_boxes(
    buf: bytes | memoryview, start: int = 0, end: int | None = None, where: str = ""
) -> Iterator[Box]:
    """Yield the boxes lying in ``buf[start:end]`` (children of one parent), in order."""
    limit = len(buf) if end is None else end
    pos = start
    while pos < limit:
        if limit - pos < 8:
            raise Mp4Error(where, f"{limit - pos} stray bytes at byte {pos}")
        box = box_header(buf, pos, limit, where)
        yield box
        pos = box.end


def children(buf: bytes | memoryview, parent: Box, where: str = "") -> dict[bytes, Box]:
    """The children of ``parent`` by type (the first one of each type)."""
    found: dict[bytes, Box] = {}
    for box in iter_boxes(buf, parent.body, parent.end, where):
        found.setdefault(box.type, box)
    return found


def top_level_boxes(
    read_at: ReadAt, size: int, where: str = "", until: bytes | None = None
) -> tuple[list[Box], bytes]:
    """Top-level boxes of an mp4 of ``size`` bytes, reading only their headers.

    Stops after the first box of type ``until`` when given. Also returns the first bytes of the
    file (up to 64 KiB) so that a moov lying there needs no second read. Offsets are relative
    to the start of the mp4.
    """
    head = read_at(0, min(size, _FIRST_READ))
    if len(head) != min(size, _FIRST_READ):
        raise Mp4Error(where, f"short read: wanted {min(size, _FIRST_READ)} bytes, got {len(head)}")
    boxes: list[Box] = []
    pos = 0
    while pos < size:
        if size - pos < 8:
            raise Mp4Error(where, f"{size - pos} stray bytes at byte {pos}")
        if pos + 16 <= len(head) or len(head) == size:
            box = box_header(head, pos, size, where)
        else:
            box = box_header(read_at(pos, min(16, size - pos)), 0, size - pos, where, origin=pos)
        boxes.append(box)
        if box.type == until:
            break
        pos = box.end
    return boxes, head

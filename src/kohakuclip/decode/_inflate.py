"""Deflated zip members inflated in compiled code, with the GIL released.

Zips made with compression (``zip``, ``shutil.make_archive``) deflate every member, JPEGs too.
zlib's ``inflate``, called by name from the system's zlib (``libz.so.1`` on Linux, which PyAV's
libavcodec links too), inflates
a group of members in one compiled call, read with ``pread`` or taken from bytes fetched from
object storage, so that their images take the compiled JPEG decode without a GIL hand-off each
(``zlib.decompress`` releases and retakes the GIL per call, and each retake waits behind a busy
training thread).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import zlib
from collections.abc import Sequence
from functools import cache
from typing import Any

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import types

from kohakuclip.decode._copy import copy_bytes
from kohakuclip.decode._dav1d import _voidptr
from kohakuclip.decode._syscalls import load_libc, read_fully
from kohakuclip.formats import MAX_INFLATED_MEMBER

__all__ = ["inflate_members", "zlib_found"]

_Z_STREAM_WORDS = 14  # sizeof(z_stream) on LP64 platforms, in 8-byte words (112 bytes)
_NEXT_IN, _AVAIL_IN, _NEXT_OUT, _AVAIL_OUT = 0, 1, 3, 4  # z_stream fields, by word
_RAW_DEFLATE = -15  # windowBits: no zlib header, as zip members are stored
_Z_OK, _Z_STREAM_END, _Z_BUF_ERROR = 0, 1, -5
_LARGEST_CALL = 1 << 30  # avail_in / avail_out are 32-bit

_inflate_init: Any = types.ExternalFunction(
    "inflateInit2_", types.int32(types.voidptr, types.int32, types.voidptr, types.int32)
)
_inflate: Any = types.ExternalFunction("inflate", types.int32(types.voidptr, types.int32))
_inflate_reset: Any = types.ExternalFunction("inflateReset", types.int32(types.voidptr))
_inflate_end: Any = types.ExternalFunction("inflateEnd", types.int32(types.voidptr))
_VERSION = np.frombuffer(zlib.ZLIB_VERSION.encode() + b"\0", np.uint8)  # inflateInit2_ checks


@cache
def zlib_found() -> bool:
    """True when compiled code can call zlib (a little-endian LP64 platform whose libz
    loads: the z_stream fields are written as 8-byte words)."""
    if ctypes.sizeof(ctypes.c_long) != 8 or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    if sys.byteorder != "little":
        return False
    name = ctypes.util.find_library("z")
    if name is None:
        return False
    try:
        llvm.load_library_permanently(name)
    except RuntimeError:
        return False
    return True


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _inflate_all(
    fds: np.ndarray,
    offsets: np.ndarray,
    sizes: np.ndarray,
    source: np.ndarray,
    version: np.ndarray,
    limit: int,
    table: np.ndarray,
) -> np.ndarray:
    total, longest = 0, 1
    for i in range(len(fds)):
        table[i, 0] = table[i, 1] = -1
        if 0 < sizes[i] < _LARGEST_CALL:
            total += sizes[i]
            longest = max(longest, sizes[i])
    packed = np.empty(longest, np.uint8)
    out = np.empty(max(total + total // 4, 1 << 16), np.uint8)
    stream = np.zeros(_Z_STREAM_WORDS, np.int64)
    handle = _voidptr(stream.ctypes.data)
    used = 0
    if _inflate_init(handle, _RAW_DEFLATE, _voidptr(version.ctypes.data), 8 * _Z_STREAM_WORDS):
        return out[:used]
    for i in range(len(fds)):
        size, offset = sizes[i], offsets[i]
        if size <= 0 or size >= _LARGEST_CALL:
            continue
        if fds[i] >= 0:
            if not read_fully(fds[i], packed, size, offset):
                continue
            address = np.int64(packed.ctypes.data)
        elif offset >= 0 and offset + size <= len(source):
            address = np.int64(source.ctypes.data) + offset
        else:
            continue
        if _inflate_reset(handle) != _Z_OK:
            continue
        stream[_NEXT_IN], stream[_AVAIL_IN] = address, size
        start, done = used, False
        while used - start <= limit:
            if used == len(out):  # grow, never past what this member may inflate to
                grown = np.empty(min(2 * len(out), start + limit + 1), np.uint8)
                copy_bytes(grown, out[:used])
                out = grown
            room = min(len(out) - used, _LARGEST_CALL, start + limit + 1 - used)
            stream[_NEXT_OUT], stream[_AVAIL_OUT] = out.ctypes.data + used, room
            code = _inflate(handle, 0)
            used += room - stream[_AVAIL_OUT]
            if code == _Z_STREAM_END:
                done = used - start <= limit
                break
            if code == _Z_OK or (code == _Z_BUF_ERROR and stream[_AVAIL_OUT] == 0):
                continue  # more to come (out of room: grow)
            break  # damaged, or the member ends before its deflate stream does
        if done:
            table[i, 0], table[i, 1] = start, used - start
        else:
            used = start
    _inflate_end(handle)
    return out[:used]


def inflate_members(
    fds: Sequence[int],
    offsets: Sequence[int],
    sizes: Sequence[int],
    source: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Raw-deflate zip members inflated in one compiled call (no GIL): the bytes, one after
    another, and int64 [N, 2] (start, length) per member, -1 where it could not be read or
    inflated (damaged, truncated, larger than ``formats.MAX_INFLATED_MEMBER``: no more than
    one byte past that is inflated). Needs ``zlib_found()``.

    Args:
        fds: a descriptor per member, or -1: its bytes are in ``source``.
        offsets: where each member's compressed bytes start in its file (in ``source``).
        sizes: each member's compressed bytes.
        source: uint8, the bytes of the members whose descriptor is -1.
    """
    if not zlib_found():
        raise RuntimeError("zlib cannot be called from compiled code on this platform")
    load_libc()
    table = np.empty((len(fds), 2), np.int64)
    fd, offset, size = (np.asarray(a, np.int64).reshape(-1) for a in (fds, offsets, sizes))
    fetched = np.zeros(0, np.uint8) if source is None else source
    data = _inflate_all(fd, offset, size, fetched, _VERSION, MAX_INFLATED_MEMBER, table)
    return data, table

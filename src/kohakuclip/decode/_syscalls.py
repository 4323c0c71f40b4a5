"""C library calls compiled code makes by name: ``pread`` into arrays, with the GIL released."""

from __future__ import annotations

import ctypes.util
from functools import cache
from typing import Any

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import types

from kohakuclip.decode._dav1d import _voidptr

__all__ = ["load_libc", "read_fully"]


@cache
def load_libc() -> None:
    """Let compiled code call libc (``pread``, ``clock_gettime``, ``open`` ...) by name."""
    llvm.load_library_permanently(ctypes.util.find_library("c"))


_pread: Any = types.ExternalFunction(
    "pread", types.intp(types.int32, types.voidptr, types.uintp, types.int64)
)


@numba.njit(inline="always")
def read_fully(fd: int, buf: np.ndarray, length: int, offset: int) -> bool:
    """``length`` bytes at ``offset`` into ``buf``; False when the file ends first."""
    done = 0
    while done < length:
        got = _pread(fd, _voidptr(buf.ctypes.data + done), length - done, offset + done)
        if got <= 0:
            return False
        done += got
    return True

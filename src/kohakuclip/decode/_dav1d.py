"""AV1 through libdav1d's C API (the library PyAV's wheel ships), fed from compiled code.

PyAV costs a Python round trip per packet (a Packet, a decode call, a frame object), each one a
GIL hand-off beside a busy training thread. Here a context is opened from Python
(``Dav1dDecoder``) and the compiled share driver (``_clips.decode_dav1d``) calls libdav1d's
functions by name, without the GIL; ``_picture`` gives a picture's planes as arrays.

Only 8-bit 4:2:0 pictures take this path (video: the caller checks the sequence header; the
driver checks each picture too); struct layouts are those of dav1d 1.x (``dav1d/picture.h``,
``dav1d/data.h``, ``dav1d/dav1d.h``) on a 64-bit platform, checked against the library's
version at load.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import glob
import os
import sys
from functools import cache
from typing import Any

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import carray, types
from numba.core import cgutils
from numba.extending import intrinsic

from kohakuclip.errors import KohakuClipError

__all__ = ["LAYOUT_I420", "Dav1dDecoder", "Dav1dError", "library"]


# byte offsets of the fields used (dav1d 1.x, LP64 / LLP64 with 8-byte pointers)
_SETTINGS_BYTES = 256  # Dav1dSettings is 96 bytes; room to spare
_SETTINGS_THREADS, _SETTINGS_FRAME_DELAY, _SETTINGS_LOG_CALLBACK = 0, 4, 56
_DATA_BYTES = 128  # Dav1dData (72 bytes): data, sz, ref, m (timestamp first)
_DATA_POINTER, _DATA_SIZE, _DATA_TIMESTAMP = 0, 1, 3  # int64 words
_PICTURE_BYTES = 512  # Dav1dPicture is 272 bytes in 1.4-1.5; room to spare
_PICTURE_PLANES, _PICTURE_STRIDES, _PICTURE_TIMESTAMP = 2, 5, 9  # int64 words
_PICTURE_SIZE = 14  # int32 words: p.w, p.h, p.layout, p.bpc
LAYOUT_I420 = 1  # Dav1dPixelLayout of 4:2:0 pictures


class Dav1dError(KohakuClipError, RuntimeError):
    """libdav1d rejected the input (the message carries its error code)."""


def _voidptr_typing(typingctx: Any, address: Any) -> Any:
    """An integer address as a void pointer (numba has no cast for it)."""
    sig = types.voidptr(address)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return sig, codegen


_voidptr: Any = intrinsic(_voidptr_typing)


def _candidates() -> list[str]:
    """libdav1d next to PyAV's own libraries (manylinux, macOS and Windows wheels), then the
    system's."""
    import av

    package = os.path.dirname(av.__file__)
    found: list[str] = []
    for folder in (package + ".libs", os.path.join(package, ".dylibs"), package):
        for pattern in ("libdav1d*.so*", "libdav1d*.dylib", "*dav1d*.dll"):
            found += sorted(glob.glob(os.path.join(folder, pattern)))
    system = ctypes.util.find_library("dav1d")
    return [*found, *([system] if system else [])]


# the C functions the feeder calls, resolved by name in the library ``library()`` loads
# globally: unlike ctypes pointers, named symbols let numba cache the compiled feeder on disk
_send: Any = types.ExternalFunction("dav1d_send_data", types.int32(types.voidptr, types.voidptr))
_get: Any = types.ExternalFunction("dav1d_get_picture", types.int32(types.voidptr, types.voidptr))
_picture_unref: Any = types.ExternalFunction("dav1d_picture_unref", types.void(types.voidptr))
_create: Any = types.ExternalFunction(
    "dav1d_data_create", types.voidptr(types.voidptr, types.uintp)
)
_data_unref: Any = types.ExternalFunction("dav1d_data_unref", types.void(types.voidptr))
_EAGAIN, _ENOMEM = -errno.EAGAIN, -errno.ENOMEM


@cache
def library() -> Any:
    """A dav1d 1.x library (ctypes, its symbols loaded globally for the feeder), or None."""
    if sys.maxsize <= 2**32:
        return None
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
            lib.dav1d_version.restype = ctypes.c_char_p
            version = lib.dav1d_version().decode()
        except (OSError, AttributeError):
            continue
        if version.split(".")[0] == "1":
            llvm.load_library_permanently(path)
            vp = ctypes.c_void_p
            for name, args, result in (
                ("dav1d_default_settings", [vp], None),
                ("dav1d_open", [vp, vp], ctypes.c_int),
                ("dav1d_close", [vp], None),
                ("dav1d_flush", [vp], None),
            ):
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = args, result
            return lib
    return None


@numba.njit(cache=True)
def _picture(held: np.ndarray, k: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """Picture record ``k`` of ``held``: its timestamp and Y, U, V arrays over libdav1d's planes
    (whole rows; 4:2:0, 8-bit), valid while the picture is referenced."""
    words = held[k].view(np.int64)
    height = held[k].view(np.int32)[_PICTURE_SIZE + 1]
    luma_stride, chroma_stride = words[_PICTURE_STRIDES], words[_PICTURE_STRIDES + 1]
    chroma_rows = (height + 1) // 2
    y = carray(_voidptr(words[_PICTURE_PLANES]), (height, luma_stride), np.uint8)
    u = carray(_voidptr(words[_PICTURE_PLANES + 1]), (chroma_rows, chroma_stride), np.uint8)
    v = carray(_voidptr(words[_PICTURE_PLANES + 2]), (chroma_rows, chroma_stride), np.uint8)
    return words[_PICTURE_TIMESTAMP], y, u, v


class Dav1dDecoder:
    """One single-threaded libdav1d context, reused across videos (flushed between clips)."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        settings = np.zeros(_SETTINGS_BYTES, np.uint8)
        self._lib.dav1d_default_settings(settings.ctypes.data)
        fields = settings.view(np.int32)
        fields[_SETTINGS_THREADS // 4] = 1
        fields[_SETTINGS_FRAME_DELAY // 4] = 1
        settings.view(np.int64)[_SETTINGS_LOG_CALLBACK // 8] = 0  # errors come back as codes
        self._context = ctypes.c_void_p()
        status = self._lib.dav1d_open(ctypes.byref(self._context), settings.ctypes.data)
        if status < 0 or not self._context.value:
            raise Dav1dError(f"dav1d_open failed ({status})")
        self._handle: int = self._context.value
        self._data = np.zeros(_DATA_BYTES, np.uint8)
        self._picture = np.zeros(_PICTURE_BYTES, np.uint8)

    def flush(self) -> None:
        """Forget every reference frame (between clips, after errors)."""
        self._lib.dav1d_flush(self._handle)

    def __del__(self) -> None:
        context = getattr(self, "_context", None)
        if context is not None and context.value:
            self._lib.dav1d_close(ctypes.byref(context))

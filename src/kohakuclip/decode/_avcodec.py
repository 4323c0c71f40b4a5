"""H.264, HEVC, JPEG, WebP and PNG through libavcodec's send / receive API, callable from
compiled code.

The libraries are the ones inside PyAV's wheel (``av.libs`` / ``av/.dylibs``): loaded globally
with llvmlite so that numba code calls ``avcodec_send_packet`` and friends by symbol name (and
numba caches that code on disk), the same technique as ``_dav1d``. The primitives below hold
no GIL; a decoder is opened from Python (``AvcodecDecoder``) and handed to compiled code as an
int64 array of its pointers (``AvcodecDecoder.handle``).

The AVFrame and AVPacket fields read or written are plain struct offsets: those of libavutil 60
/ libavcodec 62 (FFmpeg 8, ``libavutil/frame.h``, ``libavcodec/packet.h``) on a 64-bit
platform, unchanged in libavutil 61 / libavcodec 63 (the build in PyAV 19, Python >= 3.12).
``library()`` checks them once per process: the library versions against PyAV's, the defaults
``av_frame_alloc`` / ``av_packet_alloc`` write, and a decode of a small x264 stream and of JPEG
pictures (4:2:0, 4:2:2, 4:4:4, gray; full size and lowres) and RGB PNGs compared with PyAV's
(``layout``).
On any mismatch it warns once and returns None: callers then use PyAV.

The ``library()`` call must come before any compiled code that uses the primitives runs (it
loads the symbols they resolve).
"""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Any, Literal

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import carray, types

from kohakuclip.decode._copy import copy_bytes
from kohakuclip.decode._dav1d import _voidptr
from kohakuclip.errors import KohakuClipError

__all__ = [
    "AGAIN",
    "CORRUPT",
    "END",
    "FORMAT",
    "FULL_RANGE",
    "GRAY",
    "GRAY_ALPHA",
    "HEIGHT",
    "OK",
    "OTHER",
    "PALETTE",
    "PICTURE_FIELDS",
    "PTS",
    "RGB",
    "RGBA",
    "U_ADDRESS",
    "V_ADDRESS",
    "WIDTH",
    "Y_ADDRESS",
    "Y_STRIDE",
    "AvcodecDecoder",
    "AvcodecError",
    "Codec",
    "annexb",
    "decode_packets",
    "error_text",
    "flush",
    "layout",
    "library",
    "receive_frame",
    "send_packet",
    "unref_frame",
]


# --- struct layouts (libavutil 60 / libavcodec 62, LP64 and LLP64) -------------------------
# (libavutil, libavcodec) majors whose AVFrame / AVPacket put the fields below at these offsets
_MAJORS = ((60, 62), (61, 63))
# AVFrame byte offsets
_F_DATA, _F_LINESIZE, _F_EXTENDED_DATA = 0, 64, 96
_F_WIDTH, _F_HEIGHT, _F_FORMAT = 104, 108, 116
_F_SAR, _F_PTS, _F_PKT_DTS, _F_TIME_BASE = 124, 136, 144, 152
_F_FLAGS, _F_COLOR_RANGE, _F_PRIMARIES, _F_TRC, _F_COLORSPACE = 276, 280, 284, 288, 292
_F_BEST_EFFORT, _F_DECODE_ERROR_FLAGS = 304, 320
_FRAME_BYTES = 328  # the fields read lie below this
# AVPacket byte offsets
_P_BUF, _P_PTS, _P_DTS, _P_DATA, _P_SIZE, _P_FLAGS = 0, 8, 16, 24, 32, 40
_P_POS, _P_TIME_BASE = 72, 96
_PKT_FLAG_KEY = 1  # AV_PKT_FLAG_KEY
_PACKET_BYTES = 104

_NOPTS = -(2**63)  # AV_NOPTS_VALUE
_EAGAIN = -errno.EAGAIN  # AVERROR(EAGAIN)
_EINVAL = -errno.EINVAL
_EOF = -(ord("E") | ord("O") << 8 | ord("F") << 16 | ord(" ") << 24)  # AVERROR_EOF
_RANGE_JPEG = 2  # AVCOL_RANGE_JPEG
_UNSPECIFIED = 2  # AVCOL_PRI / TRC / SPC_UNSPECIFIED
_FRAME_FLAG_CORRUPT = 1
_PALETTE_BYTES = 1024  # AVPALETTE_SIZE
# AVPixelFormat values (checked against av_get_pix_fmt at load) -> (our code, full range)
_PIX_FMTS = {
    "yuv420p": (0, 0, 0),
    "yuv422p": (4, 1, 0),
    "yuv444p": (5, 2, 0),
    "gray": (8, 3, 0),
    "rgb24": (2, 4, 0),
    "rgba": (26, 5, 0),
    "ya8": (56, 6, 0),
    "pal8": (11, 7, 0),
    "yuvj420p": (12, 0, 1),
    "yuvj422p": (13, 1, 1),
    "yuvj444p": (14, 2, 1),
}
_CODE_OF_FORMAT = np.full(64, -1, np.int64)
_FULL_OF_FORMAT = np.zeros(64, np.int64)
for _value, _code, _full in _PIX_FMTS.values():
    _CODE_OF_FORMAT[_value], _FULL_OF_FORMAT[_value] = _code, _full

# --- what the primitives return -----------------------------------------------------------
OK, AGAIN, END = 0, 1, 2
"""Statuses of ``send_packet`` / ``receive_frame``: done, EAGAIN (receive / send first), EOF
(drained). Negative values are AVERROR codes (``error_text`` names them)."""
YUV420, YUV422, YUV444, GRAY, RGB, RGBA, GRAY_ALPHA, PALETTE = 0, 1, 2, 3, 4, 5, 6, 7
OTHER = -1
"""Pixel-format codes in ``picture[FORMAT]``: 8-bit planar YUV or gray; packed 8-bit ``RGB``,
``RGBA`` and ``GRAY_ALPHA`` (one plane, in Y's place); ``PALETTE``, 8-bit indices in Y's place
and 256 native-endian 0xAARRGGBB words in U's; ``OTHER`` for anything else."""
_PACKED_BYTES = {RGB: 3, RGBA: 4, GRAY_ALPHA: 2}  # bytes per pixel of the packed formats
PTS, WIDTH, HEIGHT, FORMAT, FULL_RANGE = 0, 1, 2, 3, 4
Y_ADDRESS, Y_STRIDE, U_ADDRESS, U_STRIDE, V_ADDRESS, V_STRIDE, CORRUPT = range(5, 12)
PICTURE_FIELDS = 12
"""Length of the ``picture`` array ``receive_frame`` fills; the indices above name its fields
(``CORRUPT``: the decoder flagged the frame as damaged, PyAV's ``Frame.is_corrupt``)."""

Codec = Literal["h264", "hevc", "mjpeg", "webp", "png"]
_CODECS = ("h264", "hevc", "mjpeg", "webp", "png")
_STILL_CODECS = ("mjpeg", "webp", "png")  # one picture per packet, each a key frame


class AvcodecError(KohakuClipError, RuntimeError):
    """libavcodec could not be used or rejected the input (the message names the cause)."""


# the C functions, resolved by name in the libraries ``_open_libraries`` loads globally
_send: Any = types.ExternalFunction(
    "avcodec_send_packet", types.int32(types.voidptr, types.voidptr)
)
_receive: Any = types.ExternalFunction(
    "avcodec_receive_frame", types.int32(types.voidptr, types.voidptr)
)
_flush: Any = types.ExternalFunction("avcodec_flush_buffers", types.void(types.voidptr))
_frame_unref: Any = types.ExternalFunction("av_frame_unref", types.void(types.voidptr))
_version: Any = types.ExternalFunction("avcodec_version", types.uint32())


@numba.njit(nogil=True, cache=True)
def _status(code: int) -> int:
    """AVERROR -> our status (0, 1 EAGAIN, 2 EOF, else the negative code)."""
    if code == _EAGAIN:
        return AGAIN
    if code == _EOF:
        return END
    return code


@numba.njit(nogil=True, cache=True)
def send_packet(handle: np.ndarray, data_address: int, size: int, pts: int) -> int:
    """Send ``size`` bytes at ``data_address`` (a whole access unit / JPEG picture, Annex B for
    H.264 and HEVC) with timestamp ``pts``; ``size`` 0 sends the drain. libavcodec copies the
    bytes (into a padded buffer) before this returns.

    Returns 0, 1 (EAGAIN: receive frames first, then send again), 2 (EOF: drained, flush
    first) or a negative AVERROR.
    """
    if handle[0] == 0:
        return _EINVAL
    context = _voidptr(handle[0])
    if size == 0:
        return _status(_send(context, _voidptr(0)))
    if size < 0 or size > 2**31 - 1 or data_address == 0:
        return _EINVAL
    words = carray(_voidptr(handle[1]), (_PACKET_BYTES // 8,), np.int64)
    words[_P_BUF // 8] = 0  # not reference counted: libavcodec copies the data
    words[_P_PTS // 8] = pts
    words[_P_DTS // 8] = _NOPTS
    words[_P_DATA // 8] = data_address
    ints = carray(_voidptr(handle[1]), (_PACKET_BYTES // 4,), np.int32)
    ints[_P_SIZE // 4] = size
    status = _send(context, _voidptr(handle[1]))
    words[_P_DATA // 8] = 0
    ints[_P_SIZE // 4] = 0
    return _status(status)


@numba.njit(nogil=True, cache=True)
def receive_frame(handle: np.ndarray, picture: np.ndarray) -> int:
    """Take the next decoded frame (display order) into the decoder's AVFrame and describe it
    in ``picture`` (int64, ``PICTURE_FIELDS`` long): pts, width, height, pixel-format code,
    full range, then address and stride of the Y, U and V planes (U and V 0 for gray; for
    RGB, the one packed plane in Y's place), then the corrupt flag. A picture the decoder
    hands over bottom-up (negative strides: MJPEG after a "Metasoft MJPEG Codec" comment,
    which stays on in the decoder) is described by its rows in stored order, as Pillow
    decodes it. The planes stay valid until the next
    ``receive_frame``, ``unref_frame`` or ``flush``.

    Returns 0, 1 (EAGAIN: send more), 2 (EOF: fully drained) or a negative AVERROR.
    """
    if handle[0] == 0:
        return _EINVAL
    status = _receive(_voidptr(handle[0]), _voidptr(handle[2]))
    if status < 0:
        return _status(status)
    words = carray(_voidptr(handle[2]), (_FRAME_BYTES // 8,), np.int64)
    ints = carray(_voidptr(handle[2]), (_FRAME_BYTES // 4,), np.int32)
    pts = words[_F_PTS // 8]
    picture[PTS] = pts if pts != _NOPTS else words[_F_BEST_EFFORT // 8]
    picture[WIDTH] = ints[_F_WIDTH // 4]
    picture[HEIGHT] = ints[_F_HEIGHT // 4]
    fmt = ints[_F_FORMAT // 4]
    code = OTHER
    full = 0
    if 0 <= fmt < len(_CODE_OF_FORMAT):
        code = _CODE_OF_FORMAT[fmt]
        full = _FULL_OF_FORMAT[fmt]
    if ints[_F_COLOR_RANGE // 4] == _RANGE_JPEG:
        full = 1
    planes = 3 if code in (YUV420, YUV422, YUV444) else 2 if code == PALETTE else 1
    for k in range(3):
        address = words[_F_DATA // 8 + k] if k < planes else 0
        stride = ints[_F_LINESIZE // 4 + k] if k < planes else 0
        if code == PALETTE and k == 1:  # one row: 256 words (libavcodec leaves its linesize 0)
            stride = _PALETTE_BYTES
        if stride < 0:  # a picture the decoder turned upside down: its rows as stored
            rows = picture[HEIGHT] if k == 0 or code != YUV420 else (picture[HEIGHT] + 1) // 2
            address += (rows - 1) * stride
            stride = -stride
        if k < planes and (address == 0 or stride == 0):
            code = OTHER
        picture[Y_ADDRESS + 2 * k] = address
        picture[Y_STRIDE + 2 * k] = stride
    picture[FORMAT] = code
    picture[FULL_RANGE] = full
    damaged = ints[_F_DECODE_ERROR_FLAGS // 4] != 0 or ints[_F_FLAGS // 4] & _FRAME_FLAG_CORRUPT
    picture[CORRUPT] = 1 if damaged else 0
    return OK


@numba.njit(nogil=True, cache=True)
def unref_frame(handle: np.ndarray) -> None:
    """Release the decoder's reference to the last received frame."""
    if handle[0] != 0:
        _frame_unref(_voidptr(handle[2]))


@numba.njit(nogil=True, cache=True)
def flush(handle: np.ndarray) -> None:
    """Forget every buffered packet, frame and reference (``avcodec_flush_buffers``): the
    decoder then takes a new GOP, also after a drain or an error."""
    if handle[0] != 0:
        _frame_unref(_voidptr(handle[2]))
        _flush(_voidptr(handle[0]))


@numba.njit(nogil=True, cache=True)
def annexb(src_address: int, size: int, length_size: int, dst: np.ndarray) -> int:
    """Copy the length-prefixed NAL units of one mp4 sample (big-endian lengths of
    ``length_size`` bytes, 1 to 4) at ``src_address`` into ``dst``, each behind a 4-byte
    start code.

    Returns the bytes written, -1 when a length field or NAL unit runs past the sample
    (corrupt), -2 when ``dst`` is too small, -3 for an unsupported ``length_size``.
    """
    if length_size < 1 or length_size > 4:
        return -3
    if size <= 0:
        return 0
    src = carray(_voidptr(src_address), (size,), np.uint8)
    capacity = len(dst)
    pos = 0
    out = 0
    while pos < size:
        if pos + length_size > size:
            return -1
        length = 0
        for k in range(length_size):
            length = (length << 8) | int(src[pos + k])
        pos += length_size
        if length > size - pos:
            return -1
        if out + 4 + length > capacity:
            return -2
        dst[out] = 0
        dst[out + 1] = 0
        dst[out + 2] = 0
        dst[out + 3] = 1
        copy_bytes(dst[out + 4 :], src[pos : pos + length])
        out += 4 + length
        pos += length
    return out


@numba.njit(nogil=True, cache=True)
def _avcodec_version() -> int:
    return _version()


@numba.njit(cache=True)
def _plane(address: int, rows: int, stride: int) -> np.ndarray:
    return carray(_voidptr(address), (rows, stride), np.uint8)


def planes(picture: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The Y, U, V planes ``picture`` describes, as arrays over whole rows (stride wide; U
    and V None for gray and the packed formats, whose plane stands in Y's place; for a
    palette picture, U is the palette, one row of 1024 bytes), valid while the frame is.
    8-bit formats only."""
    code = int(picture[FORMAT])
    if code == OTHER:
        raise AvcodecError("not an 8-bit planar YUV, gray, RGB(A), gray + alpha or palette picture")
    height = int(picture[HEIGHT])
    y = _plane(int(picture[Y_ADDRESS]), height, int(picture[Y_STRIDE]))
    if code == PALETTE:
        return y, _plane(int(picture[U_ADDRESS]), 1, _PALETTE_BYTES), None
    if code in (GRAY, RGB, RGBA, GRAY_ALPHA):
        return y, None, None
    rows = (height + 1) // 2 if code == YUV420 else height
    u = _plane(int(picture[U_ADDRESS]), rows, int(picture[U_STRIDE]))
    v = _plane(int(picture[V_ADDRESS]), rows, int(picture[V_STRIDE]))
    return y, u, v


def chroma_width(picture: np.ndarray) -> int:
    """Visible width of the U and V planes of ``picture``."""
    width = int(picture[WIDTH])
    return width if int(picture[FORMAT]) == YUV444 else (width + 1) // 2


# --- loading ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Library:
    """PyAV's libavcodec and libavutil (ctypes), their symbols loaded globally."""

    avcodec: ctypes.CDLL
    avutil: ctypes.CDLL
    avcodec_path: str
    avutil_path: str
    version: tuple[int, int, int]  # libavcodec's


def _candidates(name: str) -> list[str]:
    """``name`` (avcodec / avutil) next to PyAV's own modules: manylinux, macOS, Windows."""
    import av

    package = os.path.dirname(av.__file__)
    found: list[str] = []
    for folder in (package + ".libs", os.path.join(package, ".dylibs"), package):
        for pattern in (f"lib{name}*.so*", f"lib{name}*.dylib", f"{name}*.dll"):
            found += sorted(glob.glob(os.path.join(folder, pattern)))
    return found


def _triple(packed: int) -> tuple[int, int, int]:
    return packed >> 16, (packed >> 8) & 0xFF, packed & 0xFF


def _declare(lib: Library) -> None:
    vp, c_int = ctypes.c_void_p, ctypes.c_int
    for cdll, name, args, result in (
        (lib.avcodec, "avcodec_find_decoder_by_name", [ctypes.c_char_p], vp),
        (lib.avcodec, "avcodec_alloc_context3", [vp], vp),
        (lib.avcodec, "avcodec_open2", [vp, vp, vp], c_int),
        (lib.avcodec, "avcodec_free_context", [vp], None),
        (lib.avcodec, "av_packet_alloc", [], vp),
        (lib.avcodec, "av_packet_free", [vp], None),
        (lib.avutil, "av_frame_alloc", [], vp),
        (lib.avutil, "av_frame_free", [vp], None),
        (lib.avutil, "av_dict_set", [vp, ctypes.c_char_p, ctypes.c_char_p, c_int], c_int),
        (lib.avutil, "av_dict_count", [vp], c_int),
        (lib.avutil, "av_dict_free", [vp], None),
        (lib.avutil, "av_opt_get_int", [vp, ctypes.c_char_p, c_int, vp], c_int),
        (lib.avutil, "av_strerror", [c_int, ctypes.c_char_p, ctypes.c_size_t], c_int),
        (lib.avutil, "av_get_pix_fmt", [ctypes.c_char_p], c_int),
    ):
        fn = getattr(cdll, name)
        fn.argtypes, fn.restype = args, result


def _address(cdll: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(cdll, name), ctypes.c_void_p).value or 0


def _check_defaults(lib: Library) -> str | None:
    """The defaults av_frame_alloc / av_packet_alloc write, read at our offsets."""
    frame = lib.avutil.av_frame_alloc()
    packet = lib.avcodec.av_packet_alloc()
    try:
        if not frame or not packet:
            return "av_frame_alloc / av_packet_alloc failed"
        f = bytes((ctypes.c_char * _FRAME_BYTES).from_address(frame))
        p = bytes((ctypes.c_char * _PACKET_BYTES).from_address(packet))
        f64 = np.frombuffer(f, np.int64)
        f32 = np.frombuffer(f, np.int32)
        p64 = np.frombuffer(p, np.int64)
        p32 = np.frombuffer(p, np.int32)
        expected = {
            "AVFrame.extended_data": (f64[_F_EXTENDED_DATA // 8], frame),
            "AVFrame.format": (f32[_F_FORMAT // 4], -1),
            "AVFrame.sample_aspect_ratio": (f32[_F_SAR // 4 + 1], 1),
            "AVFrame.pts": (f64[_F_PTS // 8], _NOPTS),
            "AVFrame.pkt_dts": (f64[_F_PKT_DTS // 8], _NOPTS),
            "AVFrame.time_base": (f32[_F_TIME_BASE // 4 + 1], 1),
            "AVFrame.flags": (f32[_F_FLAGS // 4], 0),
            "AVFrame.color_primaries": (f32[_F_PRIMARIES // 4], _UNSPECIFIED),
            "AVFrame.color_trc": (f32[_F_TRC // 4], _UNSPECIFIED),
            "AVFrame.colorspace": (f32[_F_COLORSPACE // 4], _UNSPECIFIED),
            "AVFrame.best_effort_timestamp": (f64[_F_BEST_EFFORT // 8], _NOPTS),
            "AVFrame.decode_error_flags": (f32[_F_DECODE_ERROR_FLAGS // 4], 0),
            "AVPacket.buf": (p64[_P_BUF // 8], 0),
            "AVPacket.pts": (p64[_P_PTS // 8], _NOPTS),
            "AVPacket.dts": (p64[_P_DTS // 8], _NOPTS),
            "AVPacket.data": (p64[_P_DATA // 8], 0),
            "AVPacket.flags": (p32[_P_FLAGS // 4], 0),
            "AVPacket.pos": (p64[_P_POS // 8], -1),
            "AVPacket.time_base": (p32[_P_TIME_BASE // 4 + 1], 1),
        }
        for field, (got, want) in expected.items():
            if int(got) != want:
                return f"{field} reads {int(got)} after allocation, expected {want}"
        return None
    finally:
        lib.avutil.av_frame_free(ctypes.byref(ctypes.c_void_p(frame)))
        lib.avcodec.av_packet_free(ctypes.byref(ctypes.c_void_p(packet)))


def _open_libraries() -> Library | str:
    """Load PyAV's libavcodec / libavutil globally and check versions, symbols and defaults.
    Returns the library or why it cannot be used."""
    if sys.maxsize <= 2**32:
        return "a 32-bit platform"
    import av

    versions = av.library_versions
    paths: dict[str, str] = {}
    cdlls: dict[str, ctypes.CDLL] = {}
    for name in ("avcodec", "avutil"):
        want = tuple(versions.get(f"lib{name}", ()))
        for path in _candidates(name):
            try:
                cdll = ctypes.CDLL(path)
                version = getattr(cdll, f"{name}_version")
                version.restype = ctypes.c_uint
                got = _triple(version())
            except (OSError, AttributeError):
                continue
            if got == want:
                paths[name], cdlls[name] = path, cdll
                break
        if name not in paths:
            return f"no lib{name} {'.'.join(map(str, want))} (PyAV's) next to the av package"
    codec_version = _triple(cdlls["avcodec"].avcodec_version())
    util_major = _triple(cdlls["avutil"].avutil_version())[0]
    if (util_major, codec_version[0]) not in _MAJORS:
        known = ", ".join(f"{u} / {c}" for u, c in _MAJORS)
        return (
            f"libavutil {util_major} / libavcodec {codec_version[0]}: the struct layouts "
            f"here are those of {known}"
        )
    lib = Library(
        cdlls["avcodec"], cdlls["avutil"], paths["avcodec"], paths["avutil"], codec_version
    )
    _declare(lib)
    for name, (value, _, _) in _PIX_FMTS.items():
        if lib.avutil.av_get_pix_fmt(name.encode()) != value:
            return f"pixel format {name} is not {value} in this libavutil"
    llvm.load_library_permanently(lib.avutil_path)
    llvm.load_library_permanently(lib.avcodec_path)
    for cdll, symbol in (
        (lib.avcodec, "avcodec_send_packet"),
        (lib.avcodec, "avcodec_receive_frame"),
        (lib.avcodec, "avcodec_flush_buffers"),
        (lib.avutil, "av_frame_unref"),
    ):
        if llvm.address_of_symbol(symbol) != _address(cdll, symbol):
            return f"{symbol} resolves to another library than PyAV's in compiled code"
    if _triple(_avcodec_version()) != codec_version:
        return "compiled code calls another libavcodec than PyAV's"
    return _check_defaults(lib) or lib


_load_lock, _check_lock = threading.Lock(), threading.Lock()
_loaded: list[Library | str] = []
_checked: list[Library | None] = []


def _libraries() -> Library | str:
    """``_open_libraries``, once per process."""
    with _load_lock:
        if not _loaded:
            _loaded.append(_open_libraries())
        return _loaded[0]


def library() -> Library | None:
    """PyAV's libavcodec when the direct path can use it (versions, symbols and struct
    layouts checked, see ``layout``), else None after one warning. Checked once per process;
    call it before compiled code that uses the primitives runs."""
    with _check_lock:
        if not _checked:
            lib = _libraries()
            problems = (lib,) if isinstance(lib, str) else layout()
            if problems:
                warnings.warn(
                    "kohakuclip: H.264 / HEVC / JPEG / WebP / PNG decode through PyAV, "
                    f"libavcodec's direct path is off: {problems[0]}",
                    RuntimeWarning,
                    stacklevel=2,
                )
            _checked.append(None if problems or isinstance(lib, str) else lib)
        return _checked[0]


def error_text(status: int) -> str:
    """What a negative status means (av_strerror)."""
    lib = _libraries()
    if isinstance(lib, str) or status >= 0:
        return f"status {status}"
    buf = ctypes.create_string_buffer(128)
    lib.avutil.av_strerror(status, buf, len(buf))
    return f"{buf.value.decode(errors='replace')} ({status})"


# --- the decoder --------------------------------------------------------------------------
def _free(lib: Library, handle: np.ndarray) -> None:
    context, packet, frame = (ctypes.c_void_p(int(p) or None) for p in handle)
    handle[:] = 0
    lib.avcodec.avcodec_free_context(ctypes.byref(context))
    lib.avcodec.av_packet_free(ctypes.byref(packet))
    lib.avutil.av_frame_free(ctypes.byref(frame))


class AvcodecDecoder:
    """One single-threaded libavcodec decoder (H.264, HEVC, MJPEG, WebP or PNG), for one
    thread at a time, reused across videos and GOPs (``flush`` between them).

    Args:
        codec: "h264" or "hevc" (Annex B access units, parameter sets in band), "mjpeg" (one
            JPEG picture per packet), "webp" or "png" (one file per packet).
        lowres: MJPEG only: decode at 1/2**lowres of the size (0-3, libjpeg-style DCT
            scaling inside libavcodec's decoder).
        lib: the library (default ``library()``).

    Raises AvcodecError when the direct path is unavailable or the decoder does not open.
    """

    def __init__(self, codec: Codec, lowres: int = 0, lib: Library | None = None) -> None:
        if codec not in _CODECS:
            raise ValueError(f"AvcodecDecoder decodes {' / '.join(_CODECS)}, not {codec!r}")
        if not 0 <= lowres <= (3 if codec == "mjpeg" else 0):
            raise ValueError(f"lowres {lowres} for {codec} (mjpeg takes 0-3, others 0)")
        lib = lib or library()
        if lib is None:
            raise AvcodecError("libavcodec's direct path is unavailable (see the warning)")
        self.codec, self.lowres = codec, lowres
        self.still = codec in _STILL_CODECS  # one picture per packet, none a reference
        decoder = lib.avcodec.avcodec_find_decoder_by_name(codec.encode())
        if not decoder:
            raise AvcodecError(f"this libavcodec has no {codec} decoder")
        self.handle = np.zeros(3, np.int64)
        """(AVCodecContext*, AVPacket*, AVFrame*) for the compiled primitives; zeros after
        ``close``."""
        self._finalizer = weakref.finalize(self, _free, lib, self.handle)
        context = lib.avcodec.avcodec_alloc_context3(decoder)
        packet, frame = lib.avcodec.av_packet_alloc(), lib.avutil.av_frame_alloc()
        self.handle[:] = [context or 0, packet or 0, frame or 0]
        if not self.handle.all():
            self.close()
            raise AvcodecError("out of memory opening a decoder")
        options = ctypes.c_void_p()
        wanted = {"threads": "1", "lowres": str(lowres)}
        # a truncated JPEG (WebP) is an error, not a picture with a grey bottom (as libjpeg);
        # a PNG chunk whose checksum fails too (Pillow, which then judges it, checks them), and
        # a PNG whose image data ends before its last row (by default up to 95 % may be missing)
        strict = {"err_detect": "explode"} if codec in ("mjpeg", "webp") else {}
        if codec == "png":
            strict = {"err_detect": "crccheck+explode", "discard_damaged_percentage": "0"}
        # H.264 single-threaded: "fast" only lets the NAL splitter read NAL units without
        # escapes in place (libavcodec's own padded copy of the packet) instead of copying them
        # again: the same pictures (tests, real footage), 4 % less CPU per frame
        fast = {"flags2": "+fast"} if codec == "h264" else {}
        for key, value in {**wanted, **strict, **fast}.items():
            lib.avutil.av_dict_set(ctypes.byref(options), key.encode(), value.encode(), 0)
        status = lib.avcodec.avcodec_open2(context, decoder, ctypes.byref(options))
        left = lib.avutil.av_dict_count(options)
        lib.avutil.av_dict_free(ctypes.byref(options))
        got = ctypes.c_int64()
        for key, value in wanted.items():
            if status >= 0:
                status = lib.avutil.av_opt_get_int(context, key.encode(), 0, ctypes.byref(got))
                if status >= 0 and got.value != int(value):
                    status = _EINVAL
        if status < 0 or left:
            self.close()
            raise AvcodecError(f"opening the {codec} decoder failed: {error_text(status)}")
        if codec in _STILL_CODECS:
            # every packet a key frame (send_packet leaves the flag): libavcodec's PNG decoder
            # takes a packet without it, of the last picture's size and format, as the
            # difference to that picture (PNG inter frames in MOV), whatever the file says
            ctypes.c_int32.from_address(int(self.handle[1]) + _P_FLAGS).value = _PKT_FLAG_KEY

    def close(self) -> None:
        """Free the decoder (also done when it is garbage collected)."""
        self._finalizer()

    def __enter__(self) -> AvcodecDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


Decoded = tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]


def _decode(
    decoder: AvcodecDecoder, packets: list[tuple[bytes, int]], prefix: bytes, length_size: int
) -> list[Decoded]:
    """``decode_packets`` with each frame's whole ``picture`` record in front of its planes."""
    handle = decoder.handle
    picture = np.zeros(PICTURE_FIELDS, np.int64)
    out: list[Decoded] = []

    def take() -> int:
        while True:
            status = receive_frame(handle, picture)
            if status != OK:
                return status
            y, u, v = planes(picture)
            width, cw = int(picture[WIDTH]), chroma_width(picture)
            width *= _PACKED_BYTES.get(int(picture[FORMAT]), 1)
            if picture[FORMAT] == PALETTE:
                cw = _PALETTE_BYTES
            out.append(
                (
                    picture.copy(),
                    y[:, :width].copy(),
                    None if u is None else u[:, :cw].copy(),
                    None if v is None else v[:, :cw].copy(),
                )
            )

    try:
        for k, (sample, pts) in enumerate(packets):
            head = prefix if k == 0 else b""
            if length_size:
                src = np.frombuffer(sample, np.uint8)
                buf = np.empty(len(head) + 4 * len(src) + 4, np.uint8)
                buf[: len(head)] = np.frombuffer(head, np.uint8)
                n = annexb(src.ctypes.data, len(src), length_size, buf[len(head) :])
                if n < 0:
                    raise AvcodecError(f"packet {k} (pts {pts}): broken NAL unit lengths")
                size = len(head) + n
            else:
                buf = np.frombuffer(head + sample, np.uint8)
                size = len(buf)
            while True:
                status = send_packet(handle, buf.ctypes.data, size, pts)
                if status != AGAIN:
                    break
                if (status := take()) < 0:
                    break
            if status < 0 or (status := take()) < 0:
                raise AvcodecError(f"packet {k} (pts {pts}): {error_text(status)}")
        status = send_packet(handle, 0, 0, 0)
        if status < 0 or (status := take()) < 0:
            raise AvcodecError(f"draining: {error_text(status)}")
    finally:
        flush(handle)
    return out


def decode_packets(
    decoder: AvcodecDecoder,
    packets: list[tuple[bytes, int]],
    prefix: bytes = b"",
    length_size: int = 4,
) -> list[tuple[int, np.ndarray, np.ndarray | None, np.ndarray | None]]:
    """Decode (sample, pts) packets through the primitives, drain, then flush the decoder.

    Args:
        decoder: an open decoder (left flushed, ready for the next GOP).
        packets: (sample, pts) in decode order.
        prefix: bytes put in front of the first packet (e.g. the parameter sets,
            ``Mp4Track.prefix``).
        length_size: H.264 / HEVC samples are length-prefixed (mp4) with NAL length fields
            of this many bytes and turned into Annex B; 0 sends them as they are (Annex B
            already, or JPEG).

    Returns (pts, Y, U, V) per frame in output order, copies cropped to the picture (U and V
    None for gray; for RGB, Y is the packed plane). Raises AvcodecError on a corrupt sample or
    a decoder error, and for formats other than 8-bit yuv420p / yuv422p / yuv444p / gray /
    rgb24 (``yuvj*`` included).
    """
    return [
        (int(picture[PTS]), y, u, v)
        for picture, y, u, v in _decode(decoder, packets, prefix, length_size)
    ]


# --- the start-up check against PyAV ------------------------------------------------------
def _pyav_frames(
    codec: str, packets: list[tuple[bytes, int]], lowres: int = 0
) -> list[tuple[int, str, int, tuple[np.ndarray, ...]]]:
    """PyAV's decode of the same packets: (pts, format name, color range, planes)."""
    import av

    ctx: Any = av.CodecContext.create(codec, "r")
    ctx.thread_count = 1
    if lowres:
        ctx.options = {"lowres": str(lowres)}
    frames = []
    for data, pts in [*packets, (b"", 0)]:
        packet = None
        if data:
            packet = av.Packet(len(data))  # a padded copy (see video.padded_packet)
            packet.update(data)
            packet.pts = pts
            packet.is_keyframe = codec != "h264"  # pictures: each a key frame
        for frame in ctx.decode(packet):
            arrays = []
            for k, plane in enumerate(frame.planes):
                if frame.format.name == "pal8" and k == 1:  # the palette: one 1024-byte row
                    arrays.append(np.frombuffer(plane, np.uint8)[:_PALETTE_BYTES][None].copy())
                    continue
                rows = frame.height if k == 0 else plane.height
                view = np.frombuffer(plane, np.uint8).reshape(rows, plane.line_size)
                packed = _PACKED_BYTES.get(_FORMAT_CODES.get(frame.format.name, OTHER), 1)
                columns = packed * frame.width if packed > 1 else plane.width
                arrays.append(view[:, :columns].copy())
            frames.append(
                (int(frame.pts), frame.format.name, int(frame.color_range), tuple(arrays))
            )
    return frames


def _layout_streams() -> list[tuple[str, int, list[tuple[bytes, int]]]]:
    """(codec, lowres, packets): a B-frame x264 stream with two GOPs at 98x70, JPEGs and PNGs
    (RGB, gray)."""
    import io

    import av
    from PIL import Image

    rng = np.random.default_rng(0)
    w, h = 98, 70
    yy, xx = np.mgrid[0:h, 0:w]
    encoder = av.CodecContext.create("libx264", "w")
    encoder.width, encoder.height, encoder.pix_fmt = w, h, "yuv420p"
    encoder.time_base = Fraction(1, 24)
    encoder.options = {"g": "6", "bf": "2", "preset": "veryfast", "crf": "30"}
    encoded: list[tuple[bytes, int]] = []
    for i in [*range(12), -1]:
        frame = None
        if i >= 0:
            luma = ((xx * 3 + yy + 9 * i) % 256).astype(np.uint8)
            chroma = rng.integers(0, 256, (h // 2, w), np.uint8)
            frame = av.VideoFrame.from_ndarray(np.vstack([luma, chroma]), format="yuv420p")
            frame.pts = i
        encoded += [(bytes(p), int(p.pts or 0)) for p in encoder.encode(frame)]
    pictures = []
    for k, (mode, subsampling) in enumerate((("RGB", 2), ("RGB", 1), ("RGB", 0), ("L", 0))):
        pixels = np.dstack([(xx * 5 + yy * 2) % 256, (yy * 7) % 256, rng.integers(0, 256, (h, w))])
        image = Image.fromarray(pixels.astype(np.uint8)).convert(mode)
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=90, subsampling=subsampling)
        pictures.append((buf.getvalue(), k))
    pngs = []  # two RGB pictures of one size: the second must not read as a difference
    for k, mode in enumerate(("RGB", "RGB", "L", "RGBA", "LA", "P")):
        pixels = np.dstack([(xx * 5 + yy * 2) % 256, (yy * 7) % 256, rng.integers(0, 256, (h, w))])
        buf = io.BytesIO()
        image = Image.fromarray(pixels.astype(np.uint8))
        if mode.endswith("A"):
            image.putalpha(Image.fromarray((xx * 11 % 256).astype(np.uint8)))
        image.convert(mode).save(buf, "PNG", **({"transparency": 3} if mode == "P" else {}))
        pngs.append((buf.getvalue(), k))
    return [
        ("h264", 0, encoded),
        ("mjpeg", 0, pictures),
        ("mjpeg", 1, pictures),
        ("png", 0, pngs),
    ]


_FORMAT_CODES = {name: code for name, (_, code, _) in _PIX_FMTS.items()}


@cache
def layout() -> tuple[str, ...]:
    """Check the struct offsets by decoding small streams (x264 with B-frames and two GOPs;
    JPEGs at 4:2:0, 4:2:2, 4:4:4 and gray, full size and lowres 1; RGB, gray, RGBA, gray +
    alpha and palette PNGs) with
    the primitives and with PyAV: planes, pts, size, pixel format and range must agree.
    Returns the mismatches (empty: the direct path is sound)."""
    lib = _libraries()
    if isinstance(lib, str):
        return (lib,)
    problems: list[str] = []
    for codec, lowres, packets in _layout_streams():
        name = f"{codec}{f' lowres {lowres}' if lowres else ''}"
        want = _pyav_frames(codec, packets, lowres)
        with AvcodecDecoder(codec, lowres, lib) as decoder:  # type: ignore[arg-type]
            try:
                got = _decode(decoder, packets, b"", 0)
            except AvcodecError as e:
                problems.append(f"{name}: {e}")
                break
        if len(got) != len(want):
            problems.append(f"{name}: {len(got)} frames, PyAV {len(want)}")
        for (picture, *ours), (pts, fmt, color_range, theirs) in zip(got, want):
            ours_planes = [p for p in ours if p is not None]
            fields = (
                int(picture[PTS]),
                int(picture[WIDTH]),
                int(picture[HEIGHT]),
                int(picture[FORMAT]),
                int(picture[FULL_RANGE]),
            )
            expected = (
                pts,
                theirs[0].shape[1] // _PACKED_BYTES.get(_FORMAT_CODES.get(fmt, OTHER), 1),
                theirs[0].shape[0],
                _FORMAT_CODES.get(fmt, OTHER),
                int(fmt.startswith("yuvj") or color_range == _RANGE_JPEG),
            )
            if fields != expected:
                problems.append(f"{name}: pts, size, format, range {fields}, PyAV {expected}")
            elif len(ours_planes) != len(theirs) or any(
                a.shape != b.shape or not np.array_equal(a, b) for a, b in zip(ours_planes, theirs)
            ):
                problems.append(f"{name}: planes differ from PyAV's at pts {pts} ({fmt})")
        if problems:
            break
    return tuple(problems)

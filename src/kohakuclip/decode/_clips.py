"""A thread's share of a batch, decoded in one compiled call that never takes the GIL.

Python plans each clip (``read.plan``) and flattens the plans into integer tables
(``ShareTables``); one numba call then reads every planned byte range (``pread``; for a clip
in object storage, descriptor -1, the range comes from ``fetched``: every remote range of the
share, fetched concurrently in Python before the call, ``ShareTables.fetch``), feeds the
packets to the decoder (libdav1d for 8-bit 4:2:0 AV1, ``_dav1d``; libavcodec for H.264, HEVC,
JPEG, WebP and PNG, ``_avcodec``), writes each wanted picture into its batch slots
(``_frame.write_frame``; ``write_rgb_frame`` for PNG's RGB, its alpha and palettes flattened
onto white first, ``_alpha``) and reports a status per clip. Beside a training thread that keeps
the GIL busy, a share costs a few GIL hand-offs instead of several per GOP, packet and frame.

Tables (int64):

- ``clips`` [C, CLIP_FIELDS]: descriptor, GOP and target ranges, batch slot, crop and flips,
  matrix row, prefix range, NAL length size, decoder row, the picture size the crop was
  planned in, followers: the clips after it (of the same video, with a crop window of the same
  size) that take their pictures from its decoding and read nothing themselves
  (``ShareTables.add``'s ``followers``). Clips of a batch that want frames of the same GOPs
  (several views of one video, or short videos) decode them once. When a group's decoding
  fails, its clips whose frames were all written are done, and the others report
  ``RETRY_ALONE``: the failure may lie in frames only another clip needs.
- ``gops`` [G, 5]: file offset, length, first and end packet of each read, and where the read
  starts in ``fetched`` (-1: ``pread`` from the clip's descriptor).
- ``packets`` [P, 3]: first and end piece, display index (the decoder's timestamp).
- ``pieces`` [Q, 2]: byte ranges inside the read.
- ``targets`` [T, 3]: display index, first and end row in ``positions`` (output frames).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numba
import numpy as np
from numba import carray, types

from kohakuclip.decode import _avcodec, _dav1d
from kohakuclip.decode._alpha import flatten_window
from kohakuclip.decode._copy import copy_bytes
from kohakuclip.decode._dav1d import _voidptr
from kohakuclip.decode._frame import (
    MODES,
    Scratch,
    frame_taps,
    new_scratch,
    write_frame,
    write_rgb_frame,
)
from kohakuclip.decode._syscalls import load_libc, read_fully

__all__ = [
    "MISSING_FRAME",
    "OK",
    "PROBED_CODECS",
    "RETRY_ALONE",
    "UNSUPPORTED_FORMAT",
    "AvcodecClips",
    "Dav1dClips",
    "Follower",
    "ShareTables",
    "close_files",
    "describe",
    "open_picture_files",
    "picture_sizes",
]


# clip table columns
FD, GOP_FIRST, GOP_END, TARGET_FIRST, TARGET_END, SLOT = 0, 1, 2, 3, 4, 5
CROP = 6  # x, y, w, h, hflip, vflip, chroma shift x, y: eight columns (``_frame.write_frame``)
MATRIX, PREFIX_FIRST, PREFIX_END, NAL_LENGTH_SIZE, DECODER, FOLLOWERS = 14, 15, 16, 17, 18, 19
PICTURE = 20  # the exact decoded size the crop was planned in (width * 65536 + height; 0: any)
CLIP_FIELDS = 21

GOP_FETCHED = 4  # gops column: start in ``fetched``
STILL = 3  # after a decoder's handle in ``decode_avcodec``'s table: 1 for still pictures

# per-clip status codes
OK = 0
SHORT_READ = 1  # the file ended before the planned bytes (truncated member)
DECODER_ERROR = 2  # the decoder rejected the data (detail: its error code)
MISSING_FRAME = 3  # a wanted frame never came out (detail: its display index)
UNSUPPORTED_FORMAT = 4  # a picture the compiled pixel stage cannot take: retry on PyAV
WRONG_SIZE = 5  # a picture smaller than the crop window, or not the PICTURE size planned
BAD_SAMPLE = 6  # an H.264 / HEVC sample whose NAL unit lengths run past it
AVCODEC_ERROR = 7  # as DECODER_ERROR, from libavcodec (detail: its AVERROR)
RETRY_ALONE = 8  # a decoding group failed before this clip's frames were out (detail: the
# first missing display index): decode it alone, as the fault may be in frames it never needed

STAGES = ("read", "decode", "pixels")

Share = tuple[np.ndarray, ...]
"""The tables (clips, gops, packets, pieces, targets, positions, prefixes, matrices, fetched)."""
Output = tuple[np.ndarray, Scratch, np.ndarray]
"""(the batch as uint8 [N, T, frame bytes], ``write_frame``'s scratch, [mode, size, window])."""


_clock_gettime: Any = types.ExternalFunction(
    "clock_gettime", types.int32(types.int32, types.voidptr)
)
_open: Any = types.ExternalFunction("open", types.int32(types.voidptr, types.int32))
_lseek: Any = types.ExternalFunction("lseek", types.int64(types.int32, types.int64, types.int32))
_close: Any = types.ExternalFunction("close", types.int32(types.int32))
_SEEK_END = 2
_dav1d_flush: Any = types.ExternalFunction("dav1d_flush", types.void(types.voidptr))
_THREAD_CPU_CLOCK = 3  # CLOCK_THREAD_CPUTIME_ID (Linux)
_SHIFTS = np.array([[1, 1], [1, 0], [0, 0], [0, 0]], np.int64)  # per _avcodec format code


@numba.njit(inline="always")
def _now(clock: np.ndarray) -> int:
    """Thread CPU time in nanoseconds."""
    _clock_gettime(_THREAD_CPU_CLOCK, _voidptr(clock.ctypes.data))
    return clock[0] * 1_000_000_000 + clock[1]


PROBED_CODECS = ("jpeg", "png")
"""The codecs ``picture_sizes`` and ``open_picture_files`` size, by the index they report."""
_PROBE_WINDOW = 4096  # bytes read at a time while walking a JPEG's marker segments
_SOF_FIRST, _SOF_LAST = 0xC0, 0xC2  # baseline, extended sequential, progressive (Huffman)


_PNG_SIGNATURE = np.frombuffer(b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR", np.uint8)
_PNG_TYPES = np.array([1, 0, 1, 1, 1, 0, 1], np.bool_)  # gray, RGB, palette, gray + alpha, RGBA
# (colour types 0, 2, 3, 4, 6): at 8 bits, what libavcodec gives as gray8, rgb24, pal8, ya8, rgba


@numba.njit(inline="always")
def _png_size(window: np.ndarray, have: int) -> tuple[int, int]:
    """(width, height) from the IHDR chunk of a PNG whose first ``have`` bytes are in
    ``window``; (0, 0) for anything but an 8-bit PNG (16-bit and 1- to 4-bit ones decode to
    other pixel formats), or sides past 65535."""
    if have < 29:
        return 0, 0
    for k in range(len(_PNG_SIGNATURE)):
        if window[k] != _PNG_SIGNATURE[k]:
            return 0, 0
    width, height = 0, 0
    for k in range(4):
        width = (width << 8) | int(window[16 + k])
        height = (height << 8) | int(window[20 + k])
    depth, colour, compression, filtering = window[24], window[25], window[26], window[27]
    interlace = window[28]
    if depth != 8 or colour >= len(_PNG_TYPES) or not _PNG_TYPES[colour]:
        return 0, 0
    if compression or filtering:
        return 0, 0
    if interlace > 1 or not (0 < width <= 65535 and 0 < height <= 65535):
        return 0, 0
    return width, height


@numba.njit(inline="always")
def _picture_size(
    fd: int, offset: int, size: int, window: np.ndarray, source: np.ndarray
) -> tuple[int, int, int]:
    """(width, height, codec: ``PROBED_CODECS`` index) from the header of the image at
    ``offset`` (``size`` bytes) of the descriptor ``fd``, or of ``source`` (bytes already
    fetched) when ``fd`` is -1: a PNG's IHDR (``_png_size``), or a JPEG's frame header; or
    (0, 0, 0): neither, or not one the compiled path takes, or a read error.

    JPEG: (0, 0) for a frame type libavcodec does not decode as every reader must (arithmetic
    coding, lossless, hierarchical, 12-bit, 2 or 4 components, a height given later), a
    header past the image's end, a read error. The walk goes on to the first scan, skipping
    only the segments libavcodec skips whole too (tables, restart interval, APPn, comments):
    in any other (reserved, JPGn, ...) libavcodec searches for markers, and a second frame
    header there or anywhere would be the one it decodes, of another size."""
    base, have = 0, 0  # the window holds bytes [base, base + have) of the image
    pos = 0
    found_width, found_height = 0, 0
    while pos + 10 <= size:
        if pos < base or pos + 10 > base + have:
            base = pos
            have = min(len(window), size - pos)
            if fd >= 0:
                if not read_fully(fd, window, have, offset + pos):
                    return 0, 0, 0
            elif offset + pos + have <= len(source):
                copy_bytes(window[:have], source[offset + pos : offset + pos + have])
            else:
                return 0, 0, 0
        at = pos - base
        if pos == 0:
            if window[0] == 0x89:
                width, height = _png_size(window, have)
                return width, height, (1 if width else 0)
            if window[0] != 0xFF or window[1] != 0xD8:
                return 0, 0, 0
            pos = 2
            continue
        if window[at] != 0xFF:
            return 0, 0, 0
        marker = window[at + 1]
        if marker == 0xFF:  # a fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # no length
            pos += 2
            continue
        if marker == 0xDA:  # the first scan: the frame header must have come
            return found_width, found_height, 0
        if _SOF_FIRST <= marker <= _SOF_LAST:
            height = (np.int64(window[at + 5]) << 8) | window[at + 6]
            width = (np.int64(window[at + 7]) << 8) | window[at + 8]
            components = window[at + 9]
            if found_width > 0 or window[at + 4] != 8 or height == 0:
                return 0, 0, 0  # a second frame header, 12-bit, a height given later
            if components != 1 and components != 3:
                return 0, 0, 0
            found_width, found_height = width, height
        elif not (marker in (0xC4, 0xDB, 0xDD, 0xFE) or 0xE0 <= marker <= 0xEF):
            return 0, 0, 0  # another frame type, a marker libavcodec does not skip whole
        length = (np.int64(window[at + 2]) << 8) | window[at + 3]
        if length < 2:
            return 0, 0, 0
        pos += 2 + length
    return 0, 0, 0


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _picture_sizes(
    fds: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, source: np.ndarray, out: np.ndarray
) -> None:
    window = np.empty(_PROBE_WINDOW, np.uint8)
    for i in range(len(fds)):
        out[i, 0], out[i, 1], out[i, 2] = _picture_size(
            fds[i], offsets[i], sizes[i], window, source
        )


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _open_and_probe(paths: np.ndarray, starts: np.ndarray, flags: int, out: np.ndarray) -> None:
    window = np.empty(_PROBE_WINDOW, np.uint8)
    nothing = np.zeros(0, np.uint8)
    for i in range(len(starts)):
        fd = _open(_voidptr(paths.ctypes.data + starts[i]), flags)
        out[i, :] = -1
        if fd < 0:
            continue
        size = _lseek(fd, 0, _SEEK_END)  # -1 for a FIFO, a socket or a device
        width, height, codec = 0, 0, 0
        if size > 0:
            width, height, codec = _picture_size(fd, 0, size, window, nothing)
        if width == 0:
            _close(fd)
            continue
        out[i, 0], out[i, 1], out[i, 2], out[i, 3], out[i, 4] = width, height, fd, size, codec


def open_picture_files(paths: Sequence[str]) -> np.ndarray:
    """Open image files and read their JPEG or PNG headers in one compiled call (no GIL): a
    folder's images then take the compiled decode without a GIL hand-off per file. int64
    [N, 5]: width, height, descriptor, size, codec (``PROBED_CODECS`` index); -1 in every
    column where the file did not open or is not an image ``picture_sizes`` sizes (nothing is
    left open there). Close the rest with ``close_files``.

    Args:
        paths: the files.
    """
    load_libc()
    encoded = [os.fsencode(p) + b"\0" for p in paths]
    starts = np.zeros(len(encoded), np.int64)
    starts[1:] = np.cumsum([len(e) for e in encoded[:-1]])
    blob = np.frombuffer(b"".join(encoded) or b"\0", np.uint8)
    out = np.empty((len(encoded), 5), np.int64)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    _open_and_probe(blob, starts, flags, out)
    return out


@numba.njit(nogil=True, cache=True)
def _close_all(fds: np.ndarray) -> None:
    for fd in fds:
        _close(fd)


def close_files(fds: Sequence[int]) -> None:
    """Close descriptors in one compiled call (no GIL hand-off per file).

    Args:
        fds: descriptors ``open_picture_files`` opened.
    """
    _close_all(np.asarray(fds, np.int64))


def picture_sizes(
    fds: Sequence[int],
    offsets: Sequence[int],
    sizes: Sequence[int],
    source: np.ndarray | None = None,
) -> np.ndarray:
    """The (width, height, codec) of JPEGs and PNGs read from descriptors, or from bytes
    already fetched, from their headers in one compiled call (no GIL; a few ``pread`` each):
    images whose sources record no size (archive members, gulp frames) can then take the
    compiled decode. int64 [N, 3], the codec as a ``PROBED_CODECS`` index; (0, 0, 0) where
    the bytes are not an image the compiled path decodes as every reader must (see
    ``_picture_size``).

    Args:
        fds: a descriptor per image, or -1: its bytes are in ``source``.
        offsets: where each image starts in its file (in ``source``).
        sizes: each image's stored bytes.
        source: uint8, the bytes of the images whose descriptor is -1.
    """
    load_libc()
    out = np.zeros((len(fds), 3), np.int64)
    fd, offset, size = (np.asarray(a, np.int64) for a in (fds, offsets, sizes))
    fetched = np.zeros(0, np.uint8) if source is None else source
    _picture_sizes(fd, offset, size, fetched, out)
    return out


@numba.njit(inline="always")
def _read_gop(fd: int, gop: np.ndarray, fetched: np.ndarray, buf: np.ndarray) -> bool:
    """A GOP's bytes into ``buf``: from the descriptor, or copied from ``fetched``."""
    length = gop[1]
    if fd >= 0:
        return read_fully(fd, buf, length, gop[0])
    start = gop[GOP_FETCHED]
    if start < 0 or start + length > len(fetched):
        return False
    copy_bytes(buf, fetched[start : start + length])
    return True


@numba.njit(inline="always")
def _starts_with_sequence_header(buf: np.ndarray, begin: int, end: int) -> bool:
    """True when the first OBU (after an optional temporal delimiter) is a sequence header."""
    pos = begin
    for _ in range(2):
        if pos >= end:
            return False
        header = buf[pos]
        obu_type = (header >> 3) & 0xF
        if obu_type == 1:
            return True
        if obu_type != 2:
            return False
        pos += 2 + ((header >> 2) & 1)
    return False


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _target(share: Share, c: int, display: int, written: np.ndarray) -> int:
    """The row of ``targets`` that wants display index ``display`` of clip ``c`` and is not
    written yet, or -1 (most decoded pictures are references nobody shows: they skip the
    pixel stage and its clock reads, a system call each)."""
    clips, targets = share[0], share[4]
    for t in range(clips[c, TARGET_FIRST], clips[c, TARGET_END]):
        if targets[t, 0] == display and not written[t]:
            return t
    return -1


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _place(
    share: Share,
    c: int,
    t: int,
    crop: np.ndarray,
    taps: Any,
    y: np.ndarray,
    u: np.ndarray,
    v: np.ndarray,
    written: np.ndarray,
    output: Output,
    rgb: bool = False,
) -> None:
    """Write a decoded picture into the output frames of target ``t`` of clip ``c`` (``rgb``:
    ``y`` is a packed RGB picture, ``u`` and ``v`` unused)."""
    clips, _, _, _, targets, positions, _, matrices, _ = share
    out, scratch, settings = output
    written[t] = True
    first = positions[targets[t, 1]]
    slot = clips[c, SLOT]
    if rgb:
        write_rgb_frame(
            y, crop, settings[0], settings[1], settings[2], taps[0], scratch, out[slot, first]
        )
    else:
        write_frame(
            y,
            u,
            v,
            crop,
            matrices[clips[c, MATRIX]],
            settings[0],
            settings[1],
            settings[2],
            taps[0],
            taps[1],
            scratch,
            out[slot, first],
        )
    for p in range(targets[t, 1] + 1, targets[t, 2]):
        copy_bytes(out[slot, positions[p]], out[slot, first])


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _missing(clips: np.ndarray, c: int, targets: np.ndarray, written: np.ndarray) -> int:
    """The first wanted display index of clip ``c`` never written, or -1."""
    for t in range(clips[c, TARGET_FIRST], clips[c, TARGET_END]):
        if not written[t]:
            return targets[t, 0]
    return -1


@numba.njit(nogil=True, cache=True, boundscheck=False)
def decode_dav1d(
    decoder: tuple[int, np.ndarray, np.ndarray],
    share: Share,
    output: Output,
    buf: np.ndarray,
    status: np.ndarray,
    seconds: np.ndarray,
) -> None:
    """Decode every clip of the share with libdav1d; see the module docstring.

    ``decoder``: (context, Dav1dData and Dav1dPicture records); ``share``: the tables
    (``ShareTables.arrays``); ``output``: (the batch as uint8 [N, T, frame bytes], the scratch
    of ``write_frame``, [mode, size, window]); ``buf``: the read buffer; ``status`` [C, 3]: code,
    detail, pictures produced (after an error: the display index of the sample being decoded,
    -1 when none was); ``seconds`` [3]: read, decode, pixels thread CPU nanoseconds
    (added to).
    """
    context, data, picture = decoder
    clips, gops, packets, pieces, targets, _, prefixes, _, fetched = share
    settings = output[2]
    ctx = _voidptr(context)
    data_ptr = _voidptr(data.ctypes.data)
    picture_ptr = _voidptr(picture.ctypes.data)
    data_words = data.view(np.int64)
    words = picture.view(np.int64)
    sizes = picture.view(np.int32)
    written = np.zeros(len(targets), np.bool_)
    clock = np.zeros(2, np.int64)
    c = 0
    while c < len(clips):
        end = c + 1 + clips[c, FOLLOWERS]
        code, detail, produced, failing = OK, 0, 0, -1
        crops = clips[c:end, CROP : CROP + 8].copy()
        taps = frame_taps(crops[0], settings[0], settings[1])
        width, height = _extent(crops)
        for g in range(clips[c, GOP_FIRST], clips[c, GOP_END]):
            start = _now(clock)
            if not _read_gop(clips[c, FD], gops[g], fetched, buf):
                code = SHORT_READ
                break
            mark = _now(clock)
            seconds[0] += mark - start
            in_pixels = 0
            for k in range(gops[g, 2], gops[g, 3]):
                first_piece, end_piece = packets[k, 0], packets[k, 1]
                lead = 0
                if k == gops[g, 2] and not _starts_with_sequence_header(
                    buf, pieces[first_piece, 0], pieces[first_piece, 1]
                ):
                    lead = clips[c, PREFIX_END] - clips[c, PREFIX_FIRST]
                size = lead
                for q in range(first_piece, end_piece):
                    size += pieces[q, 1] - pieces[q, 0]
                _dav1d._create(data_ptr, size)
                if data_words[_dav1d._DATA_POINTER] == 0:
                    code, detail = DECODER_ERROR, _dav1d._ENOMEM
                    break
                packet = carray(_voidptr(data_words[_dav1d._DATA_POINTER]), (size,), np.uint8)
                copy_bytes(packet, prefixes[clips[c, PREFIX_FIRST] : clips[c, PREFIX_FIRST] + lead])
                at = lead
                for q in range(first_piece, end_piece):
                    n = pieces[q, 1] - pieces[q, 0]
                    copy_bytes(packet[at:], buf[pieces[q, 0] : pieces[q, 1]])
                    at += n
                data_words[_dav1d._DATA_TIMESTAMP] = packets[k, 2]
                while code == OK:
                    sent = _dav1d._send(ctx, data_ptr)
                    if sent < 0 and sent != _dav1d._EAGAIN:
                        _dav1d._data_unref(data_ptr)
                        code, detail = DECODER_ERROR, sent
                        break
                    while True:
                        got = _dav1d._get(ctx, picture_ptr)
                        if got == _dav1d._EAGAIN:
                            break
                        if got < 0:
                            if data_words[_dav1d._DATA_SIZE] > 0:
                                _dav1d._data_unref(data_ptr)
                            code, detail = DECODER_ERROR, got
                            break
                        produced += 1
                        pw, ph = sizes[_dav1d._PICTURE_SIZE], sizes[_dav1d._PICTURE_SIZE + 1]
                        layout = sizes[_dav1d._PICTURE_SIZE + 2]
                        bits = sizes[_dav1d._PICTURE_SIZE + 3]
                        exact = clips[c, PICTURE]
                        if layout != _dav1d.LAYOUT_I420 or bits != 8:  # (images: any stream)
                            code, detail = UNSUPPORTED_FORMAT, layout * 256 + bits
                        elif pw < width or ph < height or (exact and pw * 65536 + ph != exact):
                            code, detail = WRONG_SIZE, pw * 65536 + ph
                        else:
                            display = words[_dav1d._PICTURE_TIMESTAMP]
                            for m in range(c, end):
                                t = _target(share, m, display, written)
                                if t >= 0:
                                    p0 = _now(clock)
                                    _, y, u, v = _dav1d._picture(picture.reshape((1, -1)), 0)
                                    crop = crops[m - c]
                                    _place(share, m, t, crop, taps, y, u, v, written, output)
                                    in_pixels += _now(clock) - p0
                        _dav1d._picture_unref(picture_ptr)
                        if code != OK:
                            break
                    if code != OK or data_words[_dav1d._DATA_SIZE] == 0:
                        break
                if code != OK:
                    failing = packets[k, 2]
                    break
            seconds[1] += _now(clock) - mark - in_pixels
            seconds[2] += in_pixels
            if code != OK:
                break
        _dav1d_flush(ctx)
        _report(clips, c, end, targets, written, code, detail, produced, failing, status)
        c = end


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _extent(crops: np.ndarray) -> tuple[int, int]:
    """The picture width and height every crop window of a decoding group needs."""
    width = height = 0
    for r in range(len(crops)):
        width = max(width, crops[r, 0] + crops[r, 2])
        height = max(height, crops[r, 1] + crops[r, 3])
    return width, height


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _report(
    clips: np.ndarray,
    first: int,
    end: int,
    targets: np.ndarray,
    written: np.ndarray,
    code: int,
    detail: int,
    produced: int,
    failing: int,
    status: np.ndarray,
) -> None:
    """The status of clips ``first`` to ``end`` (a decoding group). A clip whose frames were
    all written is OK (the pictures before a failure are those it would decode alone); one with
    a frame missing gets MISSING_FRAME when the decoding ended well, the failure when the group
    is that clip alone, and RETRY_ALONE when a group of several failed."""
    for c in range(first, end):
        clip_code, clip_detail = OK, 0
        missing = _missing(clips, c, targets, written)
        if missing >= 0:
            if code == OK:
                clip_code, clip_detail = MISSING_FRAME, missing
            elif end - first > 1 and code != UNSUPPORTED_FORMAT:
                clip_code, clip_detail = RETRY_ALONE, missing
            else:
                clip_code, clip_detail = code, detail
        status[c, 0], status[c, 1] = clip_code, clip_detail
        status[c, 2] = produced if clip_code == OK else failing


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _plane(picture: np.ndarray, field: int, rows: int) -> np.ndarray:
    """The plane whose address is ``picture[field]`` (its stride next), over whole rows."""
    return carray(_voidptr(picture[field]), (rows, picture[field + 1]), np.uint8)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _release(handle: np.ndarray, picture: np.ndarray) -> None:
    """Let the decoder have the frame back; from a still-picture decoder (``handle[STILL]``),
    a gray or packed picture's plane zeroed first.

    libavcodec's PNG decoder leaves the rows a short IDAT never reaches as its pooled buffer
    held them (another image's pixels), where Pillow leaves zeros. The pool allocates zeroed
    buffers; zeroing every one before it goes back keeps them so (cost: a memset of the
    picture, ~4 % of a PNG's decode). A video decoder's pictures are its references: never."""
    code = picture[_avcodec.FORMAT]
    if handle[STILL] and (code == _avcodec.GRAY or code >= _avcodec.RGB):
        rows, stride = picture[_avcodec.HEIGHT], picture[_avcodec.Y_STRIDE]
        plane = carray(_voidptr(picture[_avcodec.Y_ADDRESS]), (rows * stride,), np.uint8)
        plane[:] = 0
    _avcodec.unref_frame(handle)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _flattened(picture: np.ndarray, plane: np.ndarray, crop: np.ndarray) -> tuple[Any, Any]:
    """The crop window of an RGBA, gray + alpha or palette picture composited onto white, as
    packed RGB of the window's size, and the crop row that places the window at (0, 0)."""
    code = picture[_avcodec.FORMAT]
    palette = np.zeros(0, np.uint8)
    if code == _avcodec.PALETTE:
        palette = carray(_voidptr(picture[_avcodec.U_ADDRESS]), (1024,), np.uint8)
    window = np.empty((crop[3], 3 * crop[2]), np.uint8)
    flatten_window(plane, palette, code, crop[0], crop[1], window)
    moved = crop.copy()
    moved[0], moved[1] = 0, 0
    return window, moved


@numba.njit(nogil=True, cache=True, boundscheck=False)
def _take_frames(
    handle: np.ndarray,
    picture: np.ndarray,
    share: Share,
    c: int,
    crops: np.ndarray,
    taps: Any,
    written: np.ndarray,
    output: Output,
    neutral: np.ndarray,
    counts: np.ndarray,
) -> tuple[int, int, int, Any]:
    """Receive every frame the decoder has ready and place the wanted ones, for clip ``c`` and
    its followers (``crops``: their crop rows).

    Returns (receive status: AGAIN, END or an error; our code, its detail, the taps in use:
    they follow the pictures' chroma subsampling). ``counts``: [produced, pixel ns]."""
    clock = np.zeros(2, np.int64)
    width, height = _extent(crops)
    while True:
        got = _avcodec.receive_frame(handle, picture)
        if got != _avcodec.OK:
            return got, OK, 0, taps
        counts[0] += 1
        fmt = picture[_avcodec.FORMAT]
        pw, ph = picture[_avcodec.WIDTH], picture[_avcodec.HEIGHT]
        if fmt < 0 or (fmt == _avcodec.GRAY and (neutral.shape[0] < ph or neutral.shape[1] < pw)):
            _release(handle, picture)
            return got, UNSUPPORTED_FORMAT, fmt, taps
        exact = share[0][c, PICTURE]
        if pw < width or ph < height or (exact != 0 and pw * 65536 + ph != exact):
            _release(handle, picture)
            return got, WRONG_SIZE, pw * 65536 + ph, taps
        for m in range(c, c + len(crops)):
            t = _target(share, m, picture[_avcodec.PTS], written)
            if t < 0:
                continue
            start = _now(clock)
            y = _plane(picture, _avcodec.Y_ADDRESS, ph)
            crop = crops[m - c]
            if fmt >= _avcodec.RGBA:  # alpha or a palette: the window onto white, as RGB
                y, crop = _flattened(picture, y, crop)
            if fmt == _avcodec.GRAY or fmt >= _avcodec.RGB:
                u = v = neutral
                sx, sy = 0, 0
            else:
                sx, sy = _SHIFTS[fmt, 0], _SHIFTS[fmt, 1]
                u = _plane(picture, _avcodec.U_ADDRESS, (ph + sy) >> sy)
                v = _plane(picture, _avcodec.V_ADDRESS, (ph + sy) >> sy)
            if crops[0, 6] != sx or crops[0, 7] != sy:
                crops[:, 6], crops[:, 7] = sx, sy
                taps = frame_taps(crops[0], output[2][0], output[2][1])
            rgb = fmt >= _avcodec.RGB
            _place(share, m, t, crop, taps, y, u, v, written, output, rgb)
            counts[1] += _now(clock) - start
        _release(handle, picture)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def decode_avcodec(
    decoders: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    share: Share,
    output: Output,
    buf: np.ndarray,
    status: np.ndarray,
    seconds: np.ndarray,
) -> None:
    """Decode every clip of the share with libavcodec. ``decoders``: (handles [D, 4], one
    decoder per row (clip column ``DECODER``): its handle and whether it decodes still
    pictures (``STILL``); the picture record; a packet buffer of at least
    twice the longest read; a 128-filled plane for gray pictures). Samples with a NAL length
    size become Annex B (the prefix, the parameter sets, in front of each GOP), others are sent
    as they are (JPEG). The rest as ``decode_dav1d``."""
    handles, picture, packet, neutral = decoders
    clips, gops, packets, pieces, targets, _, prefixes, _, fetched = share
    settings = output[2]
    written = np.zeros(len(targets), np.bool_)
    clock = np.zeros(2, np.int64)
    counts = np.zeros(2, np.int64)
    c = 0
    while c < len(clips):
        end = c + 1 + clips[c, FOLLOWERS]
        code, detail, failing = OK, 0, -1
        counts[:] = 0
        handle = handles[clips[c, DECODER]]
        crops = clips[c:end, CROP : CROP + 8].copy()
        taps = frame_taps(crops[0], settings[0], settings[1])
        length_size = clips[c, NAL_LENGTH_SIZE]
        decode_ns = 0
        for g in range(clips[c, GOP_FIRST], clips[c, GOP_END]):
            start = _now(clock)
            if not _read_gop(clips[c, FD], gops[g], fetched, buf):
                code = SHORT_READ
                break
            mark = _now(clock)
            seconds[0] += mark - start
            for k in range(gops[g, 2], gops[g, 3]):
                at = 0
                if k == gops[g, 2]:
                    at = clips[c, PREFIX_END] - clips[c, PREFIX_FIRST]
                    copy_bytes(packet, prefixes[clips[c, PREFIX_FIRST] : clips[c, PREFIX_END]])
                for q in range(packets[k, 0], packets[k, 1]):
                    a, b = pieces[q, 0], pieces[q, 1]
                    if length_size:
                        n = _avcodec.annexb(buf.ctypes.data + a, b - a, length_size, packet[at:])
                        if n < 0:
                            code, detail = BAD_SAMPLE, packets[k, 2]
                            break
                    else:
                        n = b - a
                        copy_bytes(packet[at:], buf[a:b])
                    at += n
                if code != OK:
                    break
                while True:
                    sent = _avcodec.send_packet(handle, packet.ctypes.data, at, packets[k, 2])
                    got, code, detail, taps = _take_frames(
                        handle, picture, share, c, crops, taps, written, output, neutral, counts
                    )
                    if code == OK and got < 0:
                        code, detail = AVCODEC_ERROR, got
                    if code != OK or sent != _avcodec.AGAIN:
                        break
                if code == OK and sent < 0:
                    code, detail = AVCODEC_ERROR, sent
                if code != OK:
                    failing = packets[k, 2]
                    break
            decode_ns += _now(clock) - mark
            if code != OK:
                break
        if code == OK:
            mark = _now(clock)
            _avcodec.send_packet(handle, 0, 0, 0)
            got, code, detail, taps = _take_frames(
                handle, picture, share, c, crops, taps, written, output, neutral, counts
            )
            if code == OK and got < 0:
                code, detail = AVCODEC_ERROR, got
            decode_ns += _now(clock) - mark
        _avcodec.flush(handle)
        seconds[1] += decode_ns - counts[1]
        seconds[2] += counts[1]
        _report(clips, c, end, targets, written, code, detail, counts[0], failing, status)
        c = end


class Follower(NamedTuple):
    """A clip decoded with the clip it follows (``ShareTables.add``): batch ``slot``, its
    ``targets`` (display index -> output positions), crop window and flips."""

    slot: int
    targets: dict[int, list[int]]
    crop: tuple[int, int, int, int]
    flips: tuple[bool, bool]


@dataclass
class ShareTables:
    """A share's clips as the integer tables the compiled drivers read (module docstring)."""

    mode: str
    size: int
    window: int
    clips: list[list[int]] = field(default_factory=list)
    gops: list[list[int]] = field(default_factory=list)
    packets: list[tuple[int, int, int]] = field(default_factory=list)
    pieces: list[tuple[int, int]] = field(default_factory=list)
    targets: list[tuple[int, int, int]] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    prefixes: list[bytes] = field(default_factory=list)
    matrices: list[np.ndarray] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    remote: list[tuple[Any, int]] = field(default_factory=list)  # (object, gops row) to fetch
    given: list[tuple[Any, int]] = field(default_factory=list)  # (bytes, gops row) handed in
    fetched: np.ndarray = field(default_factory=lambda: np.zeros(1, np.uint8))
    longest_read: int = 0
    longest: int = 0  # the longest side of any crop window: rows of the resize scratch
    gray: tuple[int, int] = (1, 1)  # (height, width) a neutral chroma plane must cover
    _matrix_rows: dict[bytes, int] = field(default_factory=dict)
    _prefix_rows: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    _prefix_bytes: int = 0

    def __len__(self) -> int:
        return len(self.clips)

    def add(
        self,
        slot: int,
        fd: int,
        plan: Any,
        crop: tuple[int, int, int, int],
        flips: tuple[bool, bool],
        matrix: np.ndarray,
        prefix: bytes = b"",
        nal_length_size: int = 0,
        decoder: int = 0,
        remote: Any = None,
        followers: Sequence[Follower] = (),
        picture: tuple[int, int] | None = None,
        data: Any = None,
    ) -> None:
        """Append one planned clip (``plan``: a ``plan_types.ClipPlan``) bound for batch
        ``slot``; ``crop`` in the decoded picture's pixels; ``decoder``: the row of the
        driver's decoder table that takes it. ``remote``: the clip's object in object storage
        (a ``storage.remote.RemoteObject``; ``fd`` is then ignored): its ranges are read by
        ``fetch``. ``followers``: clips that read nothing and take their frames from this
        clip's decoding (``plan`` must cover theirs: a plan of all their frames); each crop
        must have ``crop``'s width, height and parity of x and y (the resize weights are
        computed once for the group). Raises ``ValueError``, adding nothing, when one has not.
        ``picture``: the (width, height) the decoder must output (libavcodec's drivers report
        ``WRONG_SIZE`` for any other): for sizes read from a header, which a damaged stream
        may contradict. ``data``: the bytes of the plan's one read, handed in (an image
        inflated from a deflated zip member; ``fd`` is then ignored), placed by ``fetch``.
        """
        if data is not None and len(plan.reads) != 1:
            raise ValueError("bytes handed in stand for exactly one read")
        for follower in followers:
            other = follower.crop
            if other[2:] != crop[2:] or other[0] % 2 != crop[0] % 2 or other[1] % 2 != crop[1] % 2:
                raise ValueError(f"a follower's crop {other} differs in size from {crop}")
        fd = -1 if remote is not None or data is not None else fd
        row = [0] * CLIP_FIELDS
        row[FD], row[SLOT] = fd, slot
        row[CROP : CROP + 8] = [*crop, int(flips[0]), int(flips[1]), 1, 1]
        row[MATRIX] = self._matrix_row(matrix)
        row[PREFIX_FIRST], row[PREFIX_END] = self._prefix_row(prefix)
        row[NAL_LENGTH_SIZE], row[DECODER] = nal_length_size, decoder
        if picture is not None:
            row[PICTURE] = picture[0] * 65536 + picture[1]
        row[GOP_FIRST] = len(self.gops)
        for gop in plan.reads:
            first_packet = len(self.packets)
            for piece_list, display in gop.packets:
                self.packets.append((len(self.pieces), len(self.pieces) + len(piece_list), display))
                self.pieces.extend(piece_list)
            if remote is not None:
                self.remote.append((remote, len(self.gops)))
            elif data is not None:
                self.given.append((data, len(self.gops)))
            self.gops.append([gop.offset, gop.length, first_packet, len(self.packets), -1])
            self.longest_read = max(self.longest_read, gop.length + len(prefix))
        row[GOP_END] = len(self.gops)
        row[FOLLOWERS] = len(followers)
        self._add_row(row, slot, plan.targets, crop)
        for follower in followers:
            joined = list(row)
            joined[SLOT] = follower.slot
            joined[CROP : CROP + 6] = [
                *follower.crop,
                int(follower.flips[0]),
                int(follower.flips[1]),
            ]
            joined[GOP_FIRST] = joined[GOP_END] = len(self.gops)
            joined[FOLLOWERS] = 0
            self._add_row(joined, follower.slot, follower.targets, follower.crop)

    def _add_row(
        self,
        row: list[int],
        slot: int,
        targets: dict[int, list[int]],
        crop: tuple[int, int, int, int],
    ) -> None:
        row[TARGET_FIRST] = len(self.targets)
        for display, where in targets.items():
            self.targets.append((display, len(self.positions), len(self.positions) + len(where)))
            self.positions.extend(where)
        row[TARGET_END] = len(self.targets)
        self.longest = max(self.longest, crop[2], crop[3])
        self.clips.append(row)
        self.slots.append(slot)

    def fetch(self, fetched: dict[tuple[str, int, int], Any] | None = None) -> int:
        """Read every remote GOP range of the share into ``fetched`` (concurrent ranged GETs,
        touching ranges coalesced; ranges found in ``fetched``, keyed by (URL, offset, length),
        are taken from it), the bytes handed in (``add``'s ``data``) after them; returns the
        bytes of the remote ranges. Raises ``ObjectStoreError``."""
        if not self.remote and not self.given:
            return 0
        from kohakuclip.storage.remote import gather_into

        wanted = [
            (obj, self.gops[row][0], self.gops[row][0] + self.gops[row][1])
            for obj, row in self.remote
        ]
        remote_bytes = sum(b - a for _, a, b in wanted)
        starts: list[int] = []
        if wanted:
            self.fetched, starts = gather_into(wanted, fetched)
        if self.given:
            end = remote_bytes
            for data, _ in self.given:
                starts.append(end)
                end += len(data)
            # one bytes.join: one GIL hand-off at most (CPython releases it for large joins),
            # where numpy's copies release and retake it once per image; a bytearray: writable
            parts = [self.fetched.data[:remote_bytes]] if wanted else []
            joined = bytearray().join([*parts, *(data for data, _ in self.given)])
            self.fetched = np.frombuffer(joined, np.uint8)
        for (_, row), start in zip(self.remote + self.given, starts):
            self.gops[row][GOP_FETCHED] = start
        return remote_bytes

    def _matrix_row(self, matrix: np.ndarray) -> int:
        key = matrix.tobytes()
        if key not in self._matrix_rows:
            self._matrix_rows[key] = len(self.matrices)
            self.matrices.append(matrix)
        return self._matrix_rows[key]

    def _prefix_row(self, prefix: bytes) -> tuple[int, int]:
        if prefix not in self._prefix_rows:
            self._prefix_rows[prefix] = (self._prefix_bytes, self._prefix_bytes + len(prefix))
            self.prefixes.append(prefix)
            self._prefix_bytes += len(prefix)
        return self._prefix_rows[prefix]

    def arrays(self) -> tuple[Share, np.ndarray]:
        """The tables as the drivers' ``share`` tuple, and the settings [mode, size, window]."""
        share = (
            np.array(self.clips, np.int64).reshape(-1, CLIP_FIELDS),
            np.array(self.gops, np.int64).reshape(-1, 5),
            np.array(self.packets, np.int64).reshape(-1, 3),
            np.array(self.pieces, np.int64).reshape(-1, 2),
            np.array(self.targets, np.int64).reshape(-1, 3),
            np.array(self.positions, np.int64),
            np.frombuffer(b"".join(self.prefixes) or b"\0", np.uint8),
            np.array(self.matrices, np.float32).reshape(-1, 3, 4),
            self.fetched,
        )
        return share, np.array([MODES.index(self.mode), self.size, self.window], np.int64)


class _Driver:
    """A read buffer that grows to the longest read, ``write_frame``'s scratch (kept from share
    to share), and thread CPU time per stage."""

    def __init__(self) -> None:
        load_libc()
        self.buf = np.zeros(1 << 20, np.uint8)
        self.seconds = np.zeros(len(STAGES), np.int64)
        self._scratch: Scratch | None = None

    def stage_seconds(self) -> dict[str, float]:
        """Thread CPU seconds per stage (``STAGES``) spent in this driver's share calls."""
        return {stage: ns / 1e9 for stage, ns in zip(STAGES, self.seconds.tolist(), strict=True)}

    def _room(self, tables: ShareTables) -> Scratch:
        """Grow the read buffer to the share's longest read; the scratch for its windows."""
        if len(self.buf) < tables.longest_read:
            self.buf = np.zeros(max(tables.longest_read, 2 * len(self.buf)), np.uint8)
        s, rows, cols = tables.size, max(tables.longest, 2), max(tables.size, tables.window)
        kept = self._scratch
        if kept is not None and kept[1].shape[0] == s and kept[0].shape[1] >= cols:
            if kept[0].shape[0] >= 3 * rows:  # new_scratch's tmp: three rows per window side
                return kept
            rows = max(rows, 2 * kept[0].shape[0] // 3)
        self._scratch = new_scratch(rows, s, tables.window)
        return self._scratch


class Dav1dClips(_Driver):
    """One thread's libdav1d context, decoding whole shares."""

    def __init__(self) -> None:
        super().__init__()
        lib = _dav1d.library()
        if lib is None:
            raise RuntimeError("libdav1d not found")
        self._decoder = _dav1d.Dav1dDecoder(lib)

    def run(self, tables: ShareTables, out: np.ndarray) -> np.ndarray:
        """Decode the share into ``out`` (the batch as uint8 [N, T, frame bytes]; images:
        T = 1); returns the status table [C, 3] (code, detail, pictures produced or, after an
        error, the display index of the sample being decoded)."""
        scratch = self._room(tables)
        status = np.zeros((len(tables), 3), np.int64)
        decoder = self._decoder
        share, settings = tables.arrays()
        decode_dav1d(
            (decoder._handle, decoder._data, decoder._picture),
            share,
            (out, scratch, settings),
            self.buf,
            status,
            self.seconds,
        )
        return status


class AvcodecClips(_Driver):
    """One thread's libavcodec decoders (one per entry of ``codecs``: (codec, lowres)),
    decoding whole shares."""

    def __init__(self, codecs: list[tuple[_avcodec.Codec, int]]) -> None:
        super().__init__()
        self.codecs = codecs
        self._decoders = [_avcodec.AvcodecDecoder(codec, lowres) for codec, lowres in codecs]
        self._handles = np.stack([np.append(d.handle, d.still) for d in self._decoders])
        self._picture = np.zeros(_avcodec.PICTURE_FIELDS, np.int64)
        self._packet = np.zeros(2 << 20, np.uint8)
        self._neutral = np.full((1, 1), 128, np.uint8)

    def run(self, tables: ShareTables, out: np.ndarray) -> np.ndarray:
        """As ``Dav1dClips.run``."""
        scratch = self._room(tables)
        if len(self._packet) < 2 * tables.longest_read + 64:
            self._packet = np.zeros(2 * len(self.buf) + 64, np.uint8)
        h, w = tables.gray
        if self._neutral.shape[0] < h or self._neutral.shape[1] < w:
            self._neutral = np.full((h, w), 128, np.uint8)
        status = np.zeros((len(tables), 3), np.int64)
        share, settings = tables.arrays()
        decode_avcodec(
            (self._handles, self._picture, self._packet, self._neutral),
            share,
            (out, scratch, settings),
            self.buf,
            status,
            self.seconds,
        )
        return status


def describe(code: int, detail: int, at: int = -1) -> str:
    """A status as words for an error message (``at``: the display index of the sample being
    decoded, when known)."""
    text = _status_text(code, detail)
    return f"frame {at}: {text}" if at >= 0 and code in (DECODER_ERROR, AVCODEC_ERROR) else text


def _status_text(code: int, detail: int) -> str:
    if code == SHORT_READ:
        return "short read: the file ends before the planned bytes"
    if code == DECODER_ERROR:
        return f"libdav1d error {detail}"
    if code == AVCODEC_ERROR:
        return f"libavcodec: {_avcodec.error_text(detail)}"
    if code == MISSING_FRAME:
        return f"decoder produced no frame for display index {detail}"
    if code == UNSUPPORTED_FORMAT:
        return f"unsupported picture format {detail}"
    if code == WRONG_SIZE:
        return (
            f"a picture of {detail >> 16}x{detail & 0xFFFF}, not the size its crop window was "
            "planned in"
        )
    if code == BAD_SAMPLE:
        return f"sample of display index {detail}: NAL unit lengths run past the sample"
    return "ok"

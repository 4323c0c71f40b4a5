"""A thread's share of a batch, decoded in one compiled call that never takes the GIL.

Python plans each clip (``read.plan``) and flattens the plans into integer tables
(``ShareTables``); one numba call then reads every planned byte range (``pread``), feeds the
packets to the decoder (libdav1d for 8-bit 4:2:0 AV1, ``_dav1d``), writes each wanted picture
into its batch slots (``_frame.write_frame``) and reports a status per clip. Beside a training
thread that keeps the GIL busy, a share costs a few GIL hand-offs instead of several per GOP,
packet and frame.

Tables (int64 unless noted):

- ``clips`` [C, CLIP_FIELDS]: descriptor, GOP and target ranges, batch slot, crop and flips,
  matrix and taps rows, prefix range.
- ``gops`` [G, 4]: file offset, length, first and end packet of each read.
- ``packets`` [P, 3]: first and end piece, display index (the decoder's timestamp).
- ``pieces`` [Q, 2]: byte ranges inside the read.
- ``targets`` [T, 3]: display index, first and end row in ``positions`` (output frames).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import llvmlite.binding as llvm
import numba
import numpy as np
from numba import carray, types

from kohakuclip.decode import _dav1d
from kohakuclip.decode._dav1d import _voidptr
from kohakuclip.decode._frame import MODES, write_frame
from kohakuclip.decode._resize import resize_taps

# clip table columns
FD, GOP_FIRST, GOP_END, TARGET_FIRST, TARGET_END, SLOT = 0, 1, 2, 3, 4, 5
CROP = 6  # x, y, w, h, hflip, vflip: six columns
MATRIX, LUMA_TAPS, CHROMA_TAPS, PREFIX_FIRST, PREFIX_END, NAL_LENGTH_SIZE = 12, 13, 14, 15, 16, 17
CLIP_FIELDS = 18

# per-clip status codes
OK = 0
SHORT_READ = 1  # the file ended before the planned bytes (truncated member)
DECODER_ERROR = 2  # the decoder rejected the data (detail: its error code)
MISSING_FRAME = 3  # a wanted frame never came out (detail: its display index)
UNSUPPORTED_FORMAT = 4  # a picture the compiled pixel stage cannot take: retry on PyAV
WRONG_SIZE = 5  # a picture smaller than the stored size the crop was planned for

STAGES = ("read", "decode", "pixels")


@cache
def _load_libc() -> None:
    """Let compiled code call ``pread`` and ``clock_gettime`` by name."""
    llvm.load_library_permanently(ctypes.util.find_library("c"))


_pread: Any = types.ExternalFunction(
    "pread", types.intp(types.int32, types.voidptr, types.uintp, types.int64)
)
_clock_gettime: Any = types.ExternalFunction(
    "clock_gettime", types.int32(types.int32, types.voidptr)
)
_dav1d_flush: Any = types.ExternalFunction("dav1d_flush", types.void(types.voidptr))
_THREAD_CPU_CLOCK = 3  # CLOCK_THREAD_CPUTIME_ID (Linux)


@numba.njit(inline="always")
def _now(clock: np.ndarray) -> int:
    """Thread CPU time in nanoseconds."""
    _clock_gettime(_THREAD_CPU_CLOCK, _voidptr(clock.ctypes.data))
    return clock[0] * 1_000_000_000 + clock[1]


@numba.njit(inline="always")
def _read_fully(fd: int, buf: np.ndarray, at: int, length: int, offset: int) -> bool:
    """``length`` bytes at ``offset`` into ``buf[at:]``; False when the file ends first."""
    done = 0
    while done < length:
        got = _pread(fd, _voidptr(buf.ctypes.data + at + done), length - done, offset + done)
        if got <= 0:
            return False
        done += got
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


@numba.njit(inline="always")
def _taps(
    starts: np.ndarray, weights: np.ndarray, shape: np.ndarray, row: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row ``row`` of the taps table: (h starts, h weights, v starts, v weights)."""
    n, k = shape[row, 0], shape[row, 1]
    return starts[row, :n], weights[row, :n, :k], starts[row, :n], weights[row, :n, :k]


@numba.njit(inline="always")
def _place(
    clips: np.ndarray,
    c: int,
    display: int,
    y: np.ndarray,
    u: np.ndarray,
    v: np.ndarray,
    targets: np.ndarray,
    positions: np.ndarray,
    written: np.ndarray,
    matrices: np.ndarray,
    taps: tuple[np.ndarray, np.ndarray, np.ndarray],
    scratch: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    settings: np.ndarray,
    out: np.ndarray,
) -> None:
    """Write a decoded picture into every output frame of clip ``c`` that shows it."""
    for t in range(clips[c, TARGET_FIRST], clips[c, TARGET_END]):
        if targets[t, 0] != display or written[t]:
            continue
        written[t] = True
        first = positions[targets[t, 1]]
        slot = clips[c, SLOT]
        starts, weights, shape = taps
        write_frame(
            y,
            u,
            v,
            clips[c, CROP : CROP + 6],
            matrices[clips[c, MATRIX]],
            settings[0],
            settings[1],
            settings[2],
            _taps(starts, weights, shape, clips[c, LUMA_TAPS]),
            _taps(starts, weights, shape, clips[c, CHROMA_TAPS]),
            scratch,
            out[slot, first],
        )
        for p in range(targets[t, 1] + 1, targets[t, 2]):
            out[slot, positions[p]] = out[slot, first]
        return


@numba.njit(nogil=True, cache=True, boundscheck=False)
def decode_dav1d(
    context: int,
    data: np.ndarray,
    picture: np.ndarray,
    clips: np.ndarray,
    gops: np.ndarray,
    packets: np.ndarray,
    pieces: np.ndarray,
    targets: np.ndarray,
    positions: np.ndarray,
    prefixes: np.ndarray,
    matrices: np.ndarray,
    taps: tuple[np.ndarray, np.ndarray, np.ndarray],
    scratch: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    settings: np.ndarray,
    buf: np.ndarray,
    out: np.ndarray,
    status: np.ndarray,
    seconds: np.ndarray,
) -> None:
    """Decode every clip of the share with libdav1d (``context``); see the module docstring.

    ``settings``: [mode, size, window]; ``out``: the batch as uint8 [N, T, frame bytes];
    ``status`` [C, 3]: code, detail, pictures produced; ``seconds`` [3]: read, decode, pixels
    thread CPU nanoseconds (added to).
    """
    ctx = _voidptr(context)
    data_ptr = _voidptr(data.ctypes.data)
    picture_ptr = _voidptr(picture.ctypes.data)
    data_words = data.view(np.int64)
    words = picture.view(np.int64)
    sizes = picture.view(np.int32)
    written = np.zeros(len(targets), np.bool_)
    clock = np.zeros(2, np.int64)
    for c in range(len(clips)):
        code, detail, produced = OK, 0, 0
        fd = clips[c, FD]
        width, height = clips[c, CROP] + clips[c, CROP + 2], clips[c, CROP + 1] + clips[c, CROP + 3]
        for g in range(clips[c, GOP_FIRST], clips[c, GOP_END]):
            start = _now(clock)
            if not _read_fully(fd, buf, 0, gops[g, 1], gops[g, 0]):
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
                packet[:lead] = prefixes[clips[c, PREFIX_FIRST] : clips[c, PREFIX_FIRST] + lead]
                at = lead
                for q in range(first_piece, end_piece):
                    n = pieces[q, 1] - pieces[q, 0]
                    packet[at : at + n] = buf[pieces[q, 0] : pieces[q, 1]]
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
                        if pw < width or ph < height:
                            code, detail = WRONG_SIZE, pw * 65536 + ph
                        else:
                            p0 = _now(clock)
                            _, y, u, v = _dav1d._picture(picture.reshape((1, -1)), 0)
                            _place(
                                clips,
                                c,
                                words[_dav1d._PICTURE_TIMESTAMP],
                                y,
                                u,
                                v,
                                targets,
                                positions,
                                written,
                                matrices,
                                taps,
                                scratch,
                                settings,
                                out,
                            )
                            in_pixels += _now(clock) - p0
                        _dav1d._picture_unref(picture_ptr)
                        if code != OK:
                            break
                    if code != OK or data_words[_dav1d._DATA_SIZE] == 0:
                        break
                if code != OK:
                    break
            end = _now(clock)
            seconds[1] += end - mark - in_pixels
            seconds[2] += in_pixels
            if code != OK:
                break
        _dav1d_flush(ctx)
        if code == OK:
            for t in range(clips[c, TARGET_FIRST], clips[c, TARGET_END]):
                if not written[t]:
                    code, detail = MISSING_FRAME, targets[t, 0]
                    break
        status[c, 0], status[c, 1], status[c, 2] = code, detail, produced


@dataclass
class ShareTables:
    """A share's clips as the integer tables the compiled drivers read (module docstring)."""

    mode: str
    size: int
    window: int
    clips: list[list[int]] = field(default_factory=list)
    gops: list[tuple[int, int, int, int]] = field(default_factory=list)
    packets: list[tuple[int, int, int]] = field(default_factory=list)
    pieces: list[tuple[int, int]] = field(default_factory=list)
    targets: list[tuple[int, int, int]] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    prefixes: list[bytes] = field(default_factory=list)
    matrices: list[np.ndarray] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    _matrix_rows: dict[bytes, int] = field(default_factory=dict)
    _taps_rows: dict[tuple[int, int], int] = field(default_factory=dict)
    _prefix_rows: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    _prefix_bytes: int = 0
    longest_read: int = 0
    tallest: int = 0

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
        prefix: bytes,
        nal_length_size: int,
    ) -> None:
        """Append one planned clip (``plan``: a ``read.plan.ClipPlan``) bound for batch ``slot``."""
        x, y, w, h = crop
        chroma_w = (x + w + 1) // 2 - x // 2
        chroma_out = self.size if self.mode == "rgb" else (self.size + 1) // 2
        row = [0] * CLIP_FIELDS
        row[FD], row[SLOT] = fd, slot
        row[CROP : CROP + 6] = [x, y, w, h, int(flips[0]), int(flips[1])]
        row[MATRIX] = self._matrix_row(matrix)
        row[LUMA_TAPS] = self._taps_row(w, self.size)
        row[CHROMA_TAPS] = self._taps_row(chroma_w, chroma_out)
        row[PREFIX_FIRST], row[PREFIX_END] = self._prefix_row(prefix)
        row[NAL_LENGTH_SIZE] = nal_length_size
        row[GOP_FIRST] = len(self.gops)
        for gop in plan.reads:
            first_packet = len(self.packets)
            for piece_list, display in gop.packets:
                self.packets.append((len(self.pieces), len(self.pieces) + len(piece_list), display))
                self.pieces.extend(piece_list)
            self.gops.append((gop.offset, gop.length, first_packet, len(self.packets)))
            self.longest_read = max(self.longest_read, gop.length)
        row[GOP_END] = len(self.gops)
        row[TARGET_FIRST] = len(self.targets)
        for display, where in plan.targets.items():
            self.targets.append((display, len(self.positions), len(self.positions) + len(where)))
            self.positions.extend(where)
        row[TARGET_END] = len(self.targets)
        self.tallest = max(self.tallest, h)
        self.clips.append(row)
        self.slots.append(slot)

    def _matrix_row(self, matrix: np.ndarray) -> int:
        key = matrix.tobytes()
        if key not in self._matrix_rows:
            self._matrix_rows[key] = len(self.matrices)
            self.matrices.append(matrix)
        return self._matrix_rows[key]

    def _taps_row(self, in_size: int, out_size: int) -> int:
        return self._taps_rows.setdefault((in_size, out_size), len(self._taps_rows))

    def _prefix_row(self, prefix: bytes) -> tuple[int, int]:
        if prefix not in self._prefix_rows:
            self._prefix_rows[prefix] = (self._prefix_bytes, self._prefix_bytes + len(prefix))
            self.prefixes.append(prefix)
            self._prefix_bytes += len(prefix)
        return self._prefix_rows[prefix]

    def arrays(self) -> dict[str, Any]:
        """The tables as arrays, the taps table and per-share scratch buffers."""
        sizes = list(self._taps_rows)
        built = [resize_taps(i, o) for i, o in sizes]
        longest = max(o for _, o in sizes)
        widest = max(w.shape[1] for _, w in built)
        starts = np.zeros((len(built), longest), np.int32)
        weights = np.zeros((len(built), longest, widest), np.int32)
        shape = np.zeros((len(built), 2), np.int64)
        for r, (first, w) in enumerate(built):
            starts[r, : len(first)] = first
            weights[r, : w.shape[0], : w.shape[1]] = w
            shape[r] = w.shape
        s = self.size
        return {
            "clips": np.array(self.clips, np.int64).reshape(-1, CLIP_FIELDS),
            "gops": np.array(self.gops, np.int64).reshape(-1, 4),
            "packets": np.array(self.packets, np.int64).reshape(-1, 3),
            "pieces": np.array(self.pieces, np.int64).reshape(-1, 2),
            "targets": np.array(self.targets, np.int64).reshape(-1, 3),
            "positions": np.array(self.positions, np.int64),
            "prefixes": np.frombuffer(b"".join(self.prefixes) or b"\0", np.uint8),
            "matrices": np.array(self.matrices, np.float32).reshape(-1, 3, 4),
            "taps": (starts, weights, shape),
            "scratch": (
                np.empty((max(self.tallest, 1), s), np.uint8),
                np.empty((s, s), np.uint8),
                np.empty((s, s), np.uint8),
                np.empty((s, s), np.uint8),
            ),
            "settings": np.array([MODES.index(self.mode), s, self.window], np.int64),
        }


class Dav1dClips:
    """One thread's libdav1d context and read buffer, decoding whole shares."""

    def __init__(self) -> None:
        _load_libc()
        lib = _dav1d.library()
        if lib is None:
            raise RuntimeError("libdav1d not found")
        self._decoder = _dav1d.Dav1dDecoder(lib)
        self._buf = np.zeros(1 << 20, np.uint8)
        self.seconds = np.zeros(len(STAGES), np.int64)

    def run(self, tables: ShareTables, out: np.ndarray) -> np.ndarray:
        """Decode the share into ``out`` (the batch, uint8 [N, T, ...]); returns the status
        table [C, 3] (code, detail, pictures produced)."""
        if len(self._buf) < tables.longest_read:
            self._buf = np.zeros(max(tables.longest_read, 2 * len(self._buf)), np.uint8)
        a = tables.arrays()
        status = np.zeros((len(tables), 3), np.int64)
        decode_dav1d(
            self._decoder._handle,
            self._decoder._data,
            self._decoder._picture,
            a["clips"],
            a["gops"],
            a["packets"],
            a["pieces"],
            a["targets"],
            a["positions"],
            a["prefixes"],
            a["matrices"],
            a["taps"],
            a["scratch"],
            a["settings"],
            self._buf,
            out.reshape(out.shape[0], out.shape[1], -1),
            status,
            self.seconds,
        )
        return status


def describe(code: int, detail: int) -> str:
    """A status as words for an error message."""
    if code == SHORT_READ:
        return "short read: the file ends before the planned bytes"
    if code == DECODER_ERROR:
        return f"decoder error {detail}"
    if code == MISSING_FRAME:
        return f"decoder produced no frame for display index {detail}"
    if code == UNSUPPORTED_FORMAT:
        return f"unsupported picture format {detail}"
    if code == WRONG_SIZE:
        return f"picture of {detail >> 16}x{detail & 0xFFFF} smaller than the stored size"
    return "ok"

"""One decoded 8-bit 4:2:0 frame into one output frame, in compiled code (numba, no GIL).

The same function serves the compiled clip drivers (``_clips``) and the PyAV path
(``pixels.PixelWriter``), so both give the same bytes: crop window, antialiased resize
(``_resize``), colour conversion (``_planar_rgb``) and flips, straight into the batch. Flips
cost nothing: the resize and the conversion store their rows and columns mirrored. A luma
window of exactly twice the output (the filter's 2x2 box) is averaged inside the conversion.

Modes (``MODES``): ``rgb`` planar [3, S, S]; ``yuv_resized`` packed 4:2:0 at S (chroma at
ceil(S/2)); ``yuv`` the stored-resolution window packed 4:2:0 in a ``window`` square
(zeros around it), unflipped.

``write_rgb_frame`` does the same for a picture decoded to interleaved RGB (PNG, and what the
Python path decodes with Pillow): in rgb mode its channels are resized straight into the
output; the yuv modes take its JFIF YCbCr (``_ycbcr``), converted after the resize
(``yuv_resized``) or at stored resolution (``yuv``).
"""

from __future__ import annotations

import numba
import numpy as np

from kohakuclip.decode import _resize
from kohakuclip.decode._copy import copy_bytes
from kohakuclip.decode._planar_rgb import planar_rgb, planar_rgb_box2
from kohakuclip.decode._resize import resize_rgb, resize_window, taps
from kohakuclip.decode._ycbcr import ycbcr_planes, ycbcr_window_420

__all__ = ["MODES", "Scratch", "frame_taps", "new_scratch", "write_frame", "write_rgb_frame"]


MODES = ("rgb", "yuv_resized", "yuv")
RGB, YUV_RESIZED, YUV = 0, 1, 2


@numba.njit(inline="always")
def _packed_planes(dst: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Y (side x side) and U, V (ceil(side/2) squared) views of a packed 4:2:0 frame."""
    c = (side + 1) // 2
    y = dst[: side * side].reshape((side, side))
    u = dst[side * side : side * side + c * c].reshape((c, c))
    v = dst[side * side + c * c : side * side + 2 * c * c].reshape((c, c))
    return y, u, v


@numba.njit(inline="always")
def _clear_margin(out: np.ndarray, rows: int, cols: int) -> None:
    """Zero what a ``rows`` x ``cols`` window leaves of a yuv-mode plane (batch buffers are
    reused: the margin must not show an earlier batch)."""
    width = out.shape[1]
    for r in range(rows):
        line = out[r, cols:]  # indices from 0: a loop from ``cols`` does not vectorise
        for x in range(width - cols):
            line[x] = 0
    for r in range(rows, out.shape[0]):
        line = out[r]
        for x in range(width):
            line[x] = 0


@numba.njit(inline="always")
def _copy_window(
    plane: np.ndarray, row: int, col: int, rows: int, cols: int, out: np.ndarray
) -> None:
    """``out[:rows, :cols] = plane[row : row + rows, col : col + cols]``, the rest of ``out``
    zeroed (row by row: a 2-D slice assignment runs numba's generic element loop, 6-9x
    slower)."""
    for r in range(rows):
        copy_bytes(out[r], plane[row + r, col : col + cols])
    _clear_margin(out, rows, cols)


@numba.njit(inline="always")
def _halve_window(src: np.ndarray, across: bool, down: bool, out: np.ndarray) -> None:
    """4:2:0 chroma of a 4:2:2 (``down``) or 4:4:4 (both) window into the top left of ``out``:
    the mean of each 2 or 2x2 samples, rounded half up, an odd last column or row counted
    twice (the window's own: nothing outside it is read)."""
    rows, cols = src.shape
    for r in range((rows + 1) // 2 if down else rows):
        top = src[2 * r if down else r]
        bottom = src[min(2 * r + 1, rows - 1) if down else r]
        line = out[r]
        if across:
            for x in range((cols + 1) // 2):
                a, b = 2 * x, min(2 * x + 1, cols - 1)
                total = np.uint16(top[a]) + np.uint16(top[b]) + np.uint16(bottom[a])
                line[x] = np.uint8((total + np.uint16(bottom[b]) + np.uint16(2)) >> 2)
        else:
            for x in range(cols):
                line[x] = np.uint8((np.uint16(top[x]) + np.uint16(bottom[x]) + np.uint16(1)) >> 1)


Taps = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
Scratch = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""``write_frame``'s uint8 buffers (tmp, y, u, v), from ``new_scratch``."""

_ROW_PAD = 64  # bytes past every scratch row (see new_scratch)


def new_scratch(rows: int, size: int, window: int) -> Scratch:
    """``write_frame``'s scratch for crop windows up to ``rows`` on a side: tmp [3 rows,
    max(size, window)] (an RGB window's three channels, ``write_rgb_frame``) and the y, u, v
    planes [size, size], each row padded by a cache line.

    The resize stores 8 rows at a time a row stride apart; at a stride that is a multiple of
    512 those all land in the same few cache sets (measured: the resize 10-15 % slower at
    512 and 1024 outputs). The planes stay C-contiguous (``write_frame`` resizes into their
    first ``size`` columns), so the conversion's row loops still vectorise.
    """
    tmp = np.empty((3 * rows, max(size, window) + _ROW_PAD), np.uint8)
    y, u, v = (np.empty((size, size + _ROW_PAD), np.uint8) for _ in range(3))
    return tmp, y, u, v


@numba.njit(nogil=True, cache=True)
def frame_taps(crop: np.ndarray, mode: int, size: int) -> tuple[Taps, Taps]:
    """Resize weights of the luma window to the output and of the chroma window to its output
    (see ``write_frame``), from the crop row [x, y, w, h, hflip, vflip, shift x, shift y]."""
    x0, y0, w, h, sx, sy = crop[0], crop[1], crop[2], crop[3], crop[6], crop[7]
    cw = ((x0 + w + (1 << sx) - 1) >> sx) - (x0 >> sx)
    ch = ((y0 + h + (1 << sy) - 1) >> sy) - (y0 >> sy)
    if mode == RGB:
        ow, oh = size, size
    elif mode == YUV_RESIZED:
        ow, oh = (size + 1) // 2, (size + 1) // 2
    else:
        ow, oh = (w + 1) // 2, (h + 1) // 2
    return (*taps(w, size), *taps(h, size)), (*taps(cw, ow), *taps(ch, oh))


@numba.njit(nogil=True, cache=True, boundscheck=False)
def write_frame(
    y: np.ndarray,
    u: np.ndarray,
    v: np.ndarray,
    crop: np.ndarray,
    matrix: np.ndarray,
    mode: int,
    size: int,
    window: int,
    taps: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    chroma_taps: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    scratch: Scratch,
    dst: np.ndarray,
) -> None:
    """Write one output frame into the flat uint8 ``dst``.

    ``y``, ``u``, ``v``: whole decoded planes (rows may be padded); ``crop``: int64 [x, y, w, h,
    hflip, vflip, chroma shift x, chroma shift y] in luma pixels (1, 1 for 4:2:0; x, y even
    there); ``matrix``: float32 3x4 (rgb mode); ``taps`` / ``chroma_taps``: (h starts,
    h weights, v starts, v weights) of the luma window to the output and of the chroma window
    to ``chroma_output``; ``scratch``: the caller's ``new_scratch`` for this frame's window.
    """
    x0, y0, w, h = crop[0], crop[1], crop[2], crop[3]
    hflip, vflip = crop[4] != 0, crop[5] != 0
    sx, sy = crop[6], crop[7]
    cx, cy = x0 >> sx, y0 >> sy
    cw = ((x0 + w + (1 << sx) - 1) >> sx) - cx
    ch = ((y0 + h + (1 << sy) - 1) >> sy) - cy
    luma = y[y0 : y0 + h, x0 : x0 + w]
    cb = u[cy : cy + ch, cx : cx + cw]
    cr = v[cy : cy + ch, cx : cx + cw]
    tmp, ybuf, ubuf, vbuf = scratch
    t = chroma_taps
    s = size
    if mode == RGB:
        out = dst.reshape((3, s, s))
        if cw == s and ch == s:
            plane_u, plane_v, row_c, col_c = u, v, cy, cx
        else:
            resize_window(cb, t[0], t[1], t[2], t[3], tmp[:cw, :s], ubuf[:, :s], False, False)
            resize_window(cr, t[0], t[1], t[2], t[3], tmp[:cw, :s], vbuf[:, :s], False, False)
            plane_u, plane_v, row_c, col_c = ubuf, vbuf, 0, 0
        if w == 2 * s and h == 2 * s and x0 % 2 == 0 and y.shape[1] % 2 == 0:
            y16 = y.view(np.uint16)  # pixel pairs, so the box's loads stay contiguous
            planar_rgb_box2(
                y16, y0, x0 // 2, plane_u, plane_v, row_c, col_c, matrix, vflip, hflip, out
            )
            return
        if w == s and h == s:
            plane_y, row_y, col_y = y, y0, x0
        else:
            resize_window(
                luma, taps[0], taps[1], taps[2], taps[3], tmp[:w, :s], ybuf[:, :s], False, False
            )
            plane_y, row_y, col_y = ybuf, 0, 0
        planar_rgb(plane_y, row_y, col_y, plane_u, plane_v, row_c, col_c, matrix, vflip, hflip, out)
    elif mode == YUV_RESIZED:
        out_y, out_u, out_v = _packed_planes(dst, s)
        sc = out_u.shape[0]
        resize_window(luma, taps[0], taps[1], taps[2], taps[3], tmp[:w, :s], out_y, hflip, vflip)
        resize_window(cb, t[0], t[1], t[2], t[3], tmp[:cw, :sc], out_u, hflip, vflip)
        resize_window(cr, t[0], t[1], t[2], t[3], tmp[:cw, :sc], out_v, hflip, vflip)
    else:
        out_y, out_u, out_v = _packed_planes(dst, window)
        _copy_window(y, y0, x0, h, w, out_y)
        if sx == 1 and sy == 1:
            _copy_window(u, cy, cx, ch, cw, out_u)
            _copy_window(v, cy, cx, ch, cw, out_v)
        else:  # 4:2:2, 4:4:4 (JPEG) stored as 4:2:0
            oh, ow = (h + 1) // 2, (w + 1) // 2
            _halve_window(cb, sx == 0, sy == 0, out_u)
            _halve_window(cr, sx == 0, sy == 0, out_v)
            _clear_margin(out_u, oh, ow)
            _clear_margin(out_v, oh, ow)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def write_rgb_frame(
    rgb: np.ndarray,
    crop: np.ndarray,
    mode: int,
    size: int,
    window: int,
    taps: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    scratch: Scratch,
    dst: np.ndarray,
) -> None:
    """Write one output frame of an RGB picture into the flat uint8 ``dst``.

    ``rgb``: the whole picture, uint8 [height, 3 width or more] (rows may be padded);
    ``crop``: int64 [x, y, w, h, hflip, vflip, ...] in pixels; ``taps``: (h starts, h weights,
    v starts, v weights) of the window to the output (``frame_taps``' first); ``scratch``:
    the caller's ``new_scratch`` for this frame's window.
    """
    x0, y0, w, h = crop[0], crop[1], crop[2], crop[3]
    hflip, vflip = crop[4] != 0, crop[5] != 0
    pixels = rgb[y0 : y0 + h, 3 * x0 : 3 * (x0 + w)]
    tmp, ybuf, ubuf, vbuf = scratch
    s = size
    if mode == RGB:
        out = dst.reshape((3, s, s))
        resize_rgb(pixels, *taps, tmp, out[0], out[1], out[2], hflip, vflip)
    elif mode == YUV_RESIZED:
        out_y, out_u, out_v = _packed_planes(dst, s)
        red, green, blue = ybuf[:, :s], ubuf[:, :s], vbuf[:, :s]
        resize_rgb(pixels, *taps, tmp, red, green, blue, hflip, vflip)
        ycbcr_planes(red, green, blue, out_y, green, blue)
        c = out_u.shape[0]
        starts, weights = _resize.taps(s, c)  # the chroma halved, as in the other modes
        half = ybuf[:s, :c]  # red is spent: its plane is the halving's scratch (tmp may be short)
        resize_window(green, starts, weights, starts, weights, half, out_u, False, False)
        resize_window(blue, starts, weights, starts, weights, half, out_v, False, False)
    else:
        out_y, out_u, out_v = _packed_planes(dst, window)
        ycbcr_window_420(pixels, out_y, out_u, out_v)
        _clear_margin(out_y, h, w)
        _clear_margin(out_u, (h + 1) // 2, (w + 1) // 2)
        _clear_margin(out_v, (h + 1) // 2, (w + 1) // 2)

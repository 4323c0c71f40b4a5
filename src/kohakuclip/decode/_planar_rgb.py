"""YUV planes to planar RGB in one pass (numba, no GIL): the last step of the rgb output mode.

Each output row is computed from one row of each input plane (two luma rows for the 2x box) and
written straight into the three output planes: no interleaved intermediate, one read of the
inputs and one write of the output, against four OpenCV passes (merge, transform, split).

Inputs are whole C-contiguous planes plus the window's first row and column: a C-contiguous row
with a unit stride is what lets LLVM vectorise the inner loop (a strided numpy view does not).
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["planar_rgb", "planar_rgb_box2"]


Row = tuple[np.float32, np.float32, np.float32, np.float32]


@numba.njit(inline="always")
def _row(matrix: np.ndarray, i: int) -> Row:
    """Row ``i`` of the matrix as float32 scalars (offset + 0.5, so that truncation rounds):
    scalars, not an array, so nothing in the inner loop can alias the output."""
    half = np.float32(0.5)
    return matrix[i, 0], matrix[i, 1], matrix[i, 2], matrix[i, 3] + half


@numba.njit(inline="always")
def _channel(row: Row, yy: np.float32, uu: np.float32, vv: np.float32) -> np.uint8:
    value = row[0] * yy + row[1] * uu + row[2] * vv + row[3]
    return np.uint8(min(max(value, np.float32(0.0)), np.float32(255.0)))


@numba.njit(nogil=True, fastmath=True, boundscheck=False, cache=True)
def planar_rgb(
    y: np.ndarray,
    y_row: int,
    y_col: int,
    u: np.ndarray,
    v: np.ndarray,
    c_row: int,
    c_col: int,
    matrix: np.ndarray,
    vflip: bool,
    hflip: bool,
    dst: np.ndarray,
) -> None:
    """``dst[:, r, c] = matrix @ [Y, U, V, 1]`` over the output square, rounded and clamped.

    ``y``: luma at output size, window at (``y_row``, ``y_col``); ``u``, ``v``: chroma at output
    size, window at (``c_row``, ``c_col``); ``matrix``: float32 3x4; ``vflip``: rows bottom up;
    ``hflip``: columns right to left.
    """
    n, w = dst.shape[1], dst.shape[2]
    r_row, g_row, b_row = _row(matrix, 0), _row(matrix, 1), _row(matrix, 2)
    last = np.uint64(w - 1)
    for r in range(n):
        out = n - 1 - r if vflip else r
        red, green, blue = dst[0, out], dst[1, out], dst[2, out]
        luma = y[y_row + r, y_col : y_col + w]
        cb = u[c_row + r, c_col : c_col + w]
        cr = v[c_row + r, c_col : c_col + w]
        if hflip:  # unsigned indices: no wraparound test, so the reversed stores vectorise
            for c in range(w):
                yy, uu, vv = np.float32(luma[c]), np.float32(cb[c]), np.float32(cr[c])
                at = last - np.uint64(c)
                red[at] = _channel(r_row, yy, uu, vv)
                green[at] = _channel(g_row, yy, uu, vv)
                blue[at] = _channel(b_row, yy, uu, vv)
        else:
            for c in range(w):
                yy, uu, vv = np.float32(luma[c]), np.float32(cb[c]), np.float32(cr[c])
                red[c] = _channel(r_row, yy, uu, vv)
                green[c] = _channel(g_row, yy, uu, vv)
                blue[c] = _channel(b_row, yy, uu, vv)


@numba.njit(nogil=True, fastmath=True, boundscheck=False, cache=True)
def planar_rgb_box2(
    y16: np.ndarray,
    y_row: int,
    y_col: int,
    u: np.ndarray,
    v: np.ndarray,
    c_row: int,
    c_col: int,
    matrix: np.ndarray,
    vflip: bool,
    hflip: bool,
    dst: np.ndarray,
) -> None:
    """As ``planar_rgb``, with luma at twice the output size averaged over 2x2 boxes.

    ``y16``: the luma plane viewed as uint16 (one horizontal pixel pair per element, so the
    loads stay contiguous); ``y_col`` counts pairs.
    """
    n, w = dst.shape[1], dst.shape[2]
    r_row, g_row, b_row = _row(matrix, 0), _row(matrix, 1), _row(matrix, 2)
    low, shift, quarter = np.uint16(255), np.uint16(8), np.float32(0.25)
    last = np.uint64(w - 1)
    for r in range(n):
        out = n - 1 - r if vflip else r
        red, green, blue = dst[0, out], dst[1, out], dst[2, out]
        top = y16[y_row + 2 * r, y_col : y_col + w]
        bottom = y16[y_row + 2 * r + 1, y_col : y_col + w]
        cb = u[c_row + r, c_col : c_col + w]
        cr = v[c_row + r, c_col : c_col + w]
        if hflip:
            for c in range(w):
                a, b = top[c], bottom[c]
                yy = np.float32((a & low) + (a >> shift) + (b & low) + (b >> shift)) * quarter
                uu, vv = np.float32(cb[c]), np.float32(cr[c])
                at = last - np.uint64(c)
                red[at] = _channel(r_row, yy, uu, vv)
                green[at] = _channel(g_row, yy, uu, vv)
                blue[at] = _channel(b_row, yy, uu, vv)
        else:
            for c in range(w):
                a, b = top[c], bottom[c]
                yy = np.float32((a & low) + (a >> shift) + (b & low) + (b >> shift)) * quarter
                uu, vv = np.float32(cb[c]), np.float32(cr[c])
                red[c] = _channel(r_row, yy, uu, vv)
                green[c] = _channel(g_row, yy, uu, vv)
                blue[c] = _channel(b_row, yy, uu, vv)

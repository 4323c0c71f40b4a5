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
    dst: np.ndarray,
) -> None:
    """``dst[:, r, c] = matrix @ [Y, U, V, 1]`` over the output square, rounded and clamped.

    ``y``: luma at output size, window at (``y_row``, ``y_col``); ``u``, ``v``: chroma at output
    size, window at (``c_row``, ``c_col``); ``matrix``: float32 3x4; ``vflip``: rows bottom up.
    """
    n, w = dst.shape[1], dst.shape[2]
    m00, m01, m02, m03 = matrix[0, 0], matrix[0, 1], matrix[0, 2], matrix[0, 3] + np.float32(0.5)
    m10, m11, m12, m13 = matrix[1, 0], matrix[1, 1], matrix[1, 2], matrix[1, 3] + np.float32(0.5)
    m20, m21, m22, m23 = matrix[2, 0], matrix[2, 1], matrix[2, 2], matrix[2, 3] + np.float32(0.5)
    lo, hi = np.float32(0.0), np.float32(255.0)
    for r in range(n):
        out = n - 1 - r if vflip else r
        red, green, blue = dst[0, out], dst[1, out], dst[2, out]
        luma = y[y_row + r, y_col : y_col + w]
        cb = u[c_row + r, c_col : c_col + w]
        cr = v[c_row + r, c_col : c_col + w]
        for c in range(w):
            yy, uu, vv = np.float32(luma[c]), np.float32(cb[c]), np.float32(cr[c])
            red[c] = np.uint8(min(max(m00 * yy + m01 * uu + m02 * vv + m03, lo), hi))
            green[c] = np.uint8(min(max(m10 * yy + m11 * uu + m12 * vv + m13, lo), hi))
            blue[c] = np.uint8(min(max(m20 * yy + m21 * uu + m22 * vv + m23, lo), hi))


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
    dst: np.ndarray,
) -> None:
    """As ``planar_rgb``, with luma at twice the output size averaged over 2x2 boxes.

    ``y16``: the luma plane viewed as uint16 (one horizontal pixel pair per element, so the
    loads stay contiguous); ``y_col`` counts pairs.
    """
    n, w = dst.shape[1], dst.shape[2]
    m00, m01, m02, m03 = matrix[0, 0], matrix[0, 1], matrix[0, 2], matrix[0, 3] + np.float32(0.5)
    m10, m11, m12, m13 = matrix[1, 0], matrix[1, 1], matrix[1, 2], matrix[1, 3] + np.float32(0.5)
    m20, m21, m22, m23 = matrix[2, 0], matrix[2, 1], matrix[2, 2], matrix[2, 3] + np.float32(0.5)
    lo, hi = np.float32(0.0), np.float32(255.0)
    low, shift, quarter = np.uint16(255), np.uint16(8), np.float32(0.25)
    for r in range(n):
        out = n - 1 - r if vflip else r
        red, green, blue = dst[0, out], dst[1, out], dst[2, out]
        top = y16[y_row + 2 * r, y_col : y_col + w]
        bottom = y16[y_row + 2 * r + 1, y_col : y_col + w]
        cb = u[c_row + r, c_col : c_col + w]
        cr = v[c_row + r, c_col : c_col + w]
        for c in range(w):
            a, b = top[c], bottom[c]
            yy = np.float32((a & low) + (a >> shift) + (b & low) + (b >> shift)) * quarter
            uu, vv = np.float32(cb[c]), np.float32(cr[c])
            red[c] = np.uint8(min(max(m00 * yy + m01 * uu + m02 * vv + m03, lo), hi))
            green[c] = np.uint8(min(max(m10 * yy + m11 * uu + m12 * vv + m13, lo), hi))
            blue[c] = np.uint8(min(max(m20 * yy + m21 * uu + m22 * vv + m23, lo), hi))

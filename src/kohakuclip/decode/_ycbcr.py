"""RGB to JFIF YCbCr (full-range BT.601) in compiled code (numba, no GIL): the yuv modes of
images that decode to RGB (PNG, and what Pillow decodes).

The arithmetic is OpenCV's for uint8 (``cv2.COLOR_RGB2YCrCb``: 14-bit fixed-point weights,
rounded half up, chroma clamped), bit for bit over every RGB triple (tested), so these planes
are those the reader gave when it converted with OpenCV.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["ycbcr_planes", "ycbcr_window_420"]


_SHIFT = 14
_ROUND = 1 << (_SHIFT - 1)
_KR, _KG, _KB = 4899, 9617, 1868  # 0.299, 0.587, 0.114 in 14-bit fixed point
_KCR, _KCB = 11682, 9241  # 0.713 = 0.5 / (1 - 0.299), 0.564 = 0.5 / (1 - 0.114)
_MID = (128 << _SHIFT) + _ROUND  # chroma's offset, plus the rounding


@numba.njit(inline="always")
def _ycbcr(r: np.uint8, g: np.uint8, b: np.uint8) -> tuple[np.int32, np.int32, np.int32]:
    """(Y, Cb, Cr) of one pixel, each in [0, 255]."""
    red, green, blue = np.int32(r), np.int32(g), np.int32(b)
    y = (red * np.int32(_KR) + green * np.int32(_KG) + blue * np.int32(_KB) + _ROUND) >> _SHIFT
    cb = ((blue - y) * np.int32(_KCB) + np.int32(_MID)) >> _SHIFT
    cr = ((red - y) * np.int32(_KCR) + np.int32(_MID)) >> _SHIFT
    low, high = np.int32(0), np.int32(255)
    return y, min(max(cb, low), high), min(max(cr, low), high)


@numba.njit(nogil=True, boundscheck=False, cache=True)
def ycbcr_planes(
    red: np.ndarray,
    green: np.ndarray,
    blue: np.ndarray,
    y: np.ndarray,
    cb: np.ndarray,
    cr: np.ndarray,
) -> None:
    """``y``, ``cb``, ``cr`` of the planes ``red``, ``green``, ``blue`` (uint8, all of ``y``'s
    shape). ``cb`` may be ``green`` and ``cr`` ``blue``: each pixel is read before it is
    written."""
    rows, cols = y.shape
    for r in range(rows):
        red_row, green_row, blue_row = red[r], green[r], blue[r]
        y_row, cb_row, cr_row = y[r], cb[r], cr[r]
        for x in range(cols):
            luma, blue_diff, red_diff = _ycbcr(red_row[x], green_row[x], blue_row[x])
            y_row[x] = np.uint8(luma)
            cb_row[x] = np.uint8(blue_diff)
            cr_row[x] = np.uint8(red_diff)


@numba.njit(nogil=True, boundscheck=False, cache=True)
def ycbcr_window_420(rgb: np.ndarray, y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> None:
    """The interleaved RGB window ``rgb`` (uint8 [h, 3 w]) as 4:2:0 planes in the top left of
    ``y`` (h x w) and of ``cb``, ``cr`` (ceil(h / 2) x ceil(w / 2)): each chroma sample the mean
    of its 2x2 pixels' values, rounded half up, an odd last row or column counted twice (as
    OpenCV's area filter halves an edge-replicated plane)."""
    h, w = rgb.shape[0], rgb.shape[1] // 3
    cw = (w + 1) // 2
    sums = np.zeros((2, 2 * cw), np.int32)  # per column: Cb, Cr of the row pair, summed
    for r in range((h + 1) // 2):
        sums[:] = 0
        for k in range(2):
            row = min(2 * r + k, h - 1)
            line = rgb[row]
            luma = y[row]
            for x in range(w):
                value, blue_diff, red_diff = _ycbcr(line[3 * x], line[3 * x + 1], line[3 * x + 2])
                luma[x] = np.uint8(value)
                sums[0, x] += blue_diff
                sums[1, x] += red_diff
        if w % 2:  # the odd last column, counted twice
            sums[0, w] = sums[0, w - 1]
            sums[1, w] = sums[1, w - 1]
        cb_row, cr_row = cb[r], cr[r]
        for x in range(cw):
            cb_row[x] = np.uint8((sums[0, 2 * x] + sums[0, 2 * x + 1] + 2) >> 2)
            cr_row[x] = np.uint8((sums[1, 2 * x] + sums[1, 2 * x + 1] + 2) >> 2)

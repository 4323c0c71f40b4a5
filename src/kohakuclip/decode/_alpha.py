"""Pictures with alpha or a palette flattened onto white, in compiled code (numba, no GIL): the
crop window of a PNG that libavcodec decodes to RGBA, gray + alpha or a palette, as the packed
RGB ``_frame.write_rgb_frame`` takes.

The composite is Pillow's ``Image.paste`` of the colours onto white with the alpha as mask,
what ``imaging.flatten`` does on the Python path: ``(255 (255 - a) + v a) / 255``, divided as
Pillow divides by 255, bit for bit (tested over every value and alpha).
"""

from __future__ import annotations

import numba
import numpy as np

from kohakuclip.decode import _avcodec

__all__ = ["flatten_window"]


@numba.njit(inline="always")
def _over_white(value: np.uint8, alpha: np.uint8) -> np.uint8:
    v, a = np.int32(value), np.int32(alpha)
    t = 255 * (255 - a) + v * a + 128
    return np.uint8(((t >> 8) + t) >> 8)


@numba.njit(nogil=True, boundscheck=False, cache=True)
def flatten_window(
    plane: np.ndarray,
    palette: np.ndarray,
    code: int,
    x0: int,
    y0: int,
    out: np.ndarray,
) -> None:
    """The window at (``x0``, ``y0``) of a decoded picture, as many pixels as ``out`` (uint8
    [h, 3 w]) holds, composited onto white into ``out``.

    Args:
        plane: the picture's plane, uint8 [height, stride]: RGBA or gray + alpha pixels, or
            palette indices.
        palette: for ``PALETTE``, 1024 bytes (256 little-endian 0xAARRGGBB words: B, G, R, A
            per entry); unused otherwise.
        code: the picture's ``_avcodec`` format code (RGBA, GRAY_ALPHA or PALETTE).
        x0, y0: the window's top left, in pixels.
        out: the window's RGB pixels.
    """
    h, w = out.shape[0], out.shape[1] // 3
    for r in range(h):
        line = plane[y0 + r]
        dst = out[r]
        if code == _avcodec.RGBA:
            for x in range(w):
                at = 4 * (x0 + x)
                alpha = line[at + 3]
                dst[3 * x] = _over_white(line[at], alpha)
                dst[3 * x + 1] = _over_white(line[at + 1], alpha)
                dst[3 * x + 2] = _over_white(line[at + 2], alpha)
        elif code == _avcodec.GRAY_ALPHA:
            for x in range(w):
                at = 2 * (x0 + x)
                gray = _over_white(line[at], line[at + 1])
                dst[3 * x] = gray
                dst[3 * x + 1] = gray
                dst[3 * x + 2] = gray
        else:
            for x in range(w):
                entry = 4 * np.int64(line[x0 + x])
                alpha = palette[entry + 3]
                dst[3 * x] = _over_white(palette[entry + 2], alpha)
                dst[3 * x + 1] = _over_white(palette[entry + 1], alpha)
                dst[3 * x + 2] = _over_white(palette[entry], alpha)

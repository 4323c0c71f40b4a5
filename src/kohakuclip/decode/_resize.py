"""Interim Pillow-BILINEAR resize (lead's stand-in until the resize module lands)."""

from __future__ import annotations

from functools import lru_cache

import numba
import numpy as np

_PRECISION = 22


@numba.njit(nogil=True, cache=True)
def taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Pillow BILINEAR weights: first input sample and int32 fixed-point weights per output."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = filterscale
    k = int(np.ceil(support)) * 2 + 1
    starts = np.zeros(out_size, np.int32)
    weights = np.zeros((out_size, k), np.int32)
    ws = np.zeros(k, np.float64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        total = 0.0
        for x in range(xmax):
            t = abs((x + xmin - center + 0.5) / filterscale)
            ws[x] = 1.0 - t if t < 1.0 else 0.0
            total += ws[x]
        starts[xx] = xmin
        for x in range(xmax):
            w = ws[x] / total if total != 0.0 else ws[x]
            weights[xx, x] = int(w * (1 << _PRECISION) + (0.5 if w >= 0 else -0.5))
    return starts, weights


@lru_cache(maxsize=256)
def resize_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    return taps(in_size, out_size)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def resize_window(
    src: np.ndarray,
    hstarts: np.ndarray,
    hweights: np.ndarray,
    vstarts: np.ndarray,
    vweights: np.ndarray,
    tmp: np.ndarray,
    dst: np.ndarray,
) -> None:
    oh, ow = dst.shape
    ih = src.shape[0]
    hk = hweights.shape[1]
    vk = vweights.shape[1]
    half = np.int32(1 << (_PRECISION - 1))
    for r in range(ih):
        row = src[r]
        out = tmp[r]
        for c in range(ow):
            s = hstarts[c]
            acc = half
            for j in range(hk):
                if s + j < row.shape[0]:
                    acc += np.int32(row[s + j]) * hweights[c, j]
            acc >>= _PRECISION
            out[c] = min(max(acc, 0), 255)
    for r in range(oh):
        s = vstarts[r]
        out = dst[r]
        for c in range(ow):
            acc = half
            for j in range(vk):
                if s + j < ih:
                    acc += np.int32(tmp[s + j, c]) * vweights[r, j]
            acc >>= _PRECISION
            out[c] = min(max(acc, 0), 255)

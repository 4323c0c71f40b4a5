"""Byte copies inside compiled code that run at memcpy speed.

numba's slice assignment (``dst[a:b] = src[c:d]``) goes through its generic array-assignment
loop: about 3 GB/s, 12x slower than an explicit loop over two 1-D views indexed from 0, which
LLVM turns into ``memcpy`` (measured: 65 against 5.4 us for 200 KB). The compiled drivers copy
every packet, repeated output frame and yuv-mode window through ``copy_bytes``.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["copy_bytes"]


@numba.njit(inline="always")
def copy_bytes(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:len(src)] = src`` for 1-D uint8 arrays (``dst`` at least as long)."""
    for i in range(len(src)):
        dst[i] = src[i]

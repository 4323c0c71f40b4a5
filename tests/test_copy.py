"""decode._copy: the compiled byte copy the drivers use for packets, repeated frames and windows."""

import numba
import numpy as np
import pytest

from kohakuclip.decode._copy import copy_bytes


@numba.njit
def _copy_at(dst: np.ndarray, at: int, src: np.ndarray, begin: int, end: int) -> None:
    copy_bytes(dst[at:], src[begin:end])


@pytest.mark.parametrize(
    "at,begin,end", [(0, 0, 0), (0, 0, 1), (3, 5, 70), (1, 0, 4096), (9, 17, 3000)]
)
def test_copy_bytes_matches_numpy(at: int, begin: int, end: int) -> None:
    rng = np.random.default_rng(at + end)
    src = rng.integers(0, 256, 5000, np.uint8)
    dst = rng.integers(0, 256, 5000, np.uint8)
    want = dst.copy()
    want[at : at + end - begin] = src[begin:end]
    _copy_at(dst, at, src, begin, end)
    np.testing.assert_array_equal(dst, want)

"""A seeded permutation of ``[0, n)`` evaluated one position at a time.

Epoch-mode datasets need "the k-th video of epoch e" for any k without storing an order of all
``n`` videos. A keyed Feistel network is a bijection on ``[0, 4**half)``; cycle-walking (re-applying
it while the value lands outside ``[0, n)``) restricts it to a bijection on ``[0, n)``. The domain
is less than ``4 n``, so a position needs a few walks on average. Memory is O(len(positions)).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kohakuclip.read.seeding import mix64, seed_sequence

__all__ = ["permute"]


_ROUNDS = 6
_MAX_N = 1 << 62


def _feistel(x: np.ndarray, keys: np.ndarray, half: int) -> np.ndarray:
    """One pass of the balanced Feistel network on ``2 * half``-bit values."""
    shift = np.uint64(half)
    mask = np.uint64((1 << half) - 1)
    left, right = x >> shift, x & mask
    for key in keys:
        left, right = right, left ^ (mix64(right ^ key) & mask)
    return (left << shift) | right


def permute(n: int, seed: int | Sequence[int], positions: object) -> np.ndarray:
    """Where each of ``positions`` goes under a seeded bijection of ``[0, n)``.

    ``permute(n, seed, np.arange(n))`` is a shuffled ``arange(n)``; asking for a few positions costs
    only those. ``seed`` is an int in ``[0, 2**64)`` or a tuple of them (e.g. ``(seed, epoch)``).
    Returns int64 values with the shape of ``positions``.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    n = int(n)
    if not 0 <= n <= _MAX_N:
        raise ValueError(f"n must be in [0, 2**62], got {n}")
    pos = np.asarray(positions)
    if pos.size and not np.issubdtype(pos.dtype, np.integer):
        raise TypeError(f"positions must be integers, got dtype {pos.dtype}")
    pos = pos.astype(np.int64, copy=False)
    if pos.size and (int(pos.min()) < 0 or int(pos.max()) >= n):
        raise ValueError(f"positions must lie in [0, {n}), got [{pos.min()}, {pos.max()}]")
    keys = seed_sequence(seed).generate_state(_ROUNDS, np.uint64)
    half = max(1, ((n - 1).bit_length() + 1) // 2) if n > 1 else 1
    limit = np.uint64(n)
    out = _feistel(pos.ravel().astype(np.uint64), keys, half)
    todo = np.flatnonzero(out >= limit)
    while todo.size:
        out[todo] = _feistel(out[todo], keys, half)
        todo = todo[out[todo] >= limit]
    return out.astype(np.int64).reshape(pos.shape)

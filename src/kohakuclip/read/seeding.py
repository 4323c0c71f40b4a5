"""Seeds made from tuples of integers, without collisions between different tuples.

numpy's ``SeedSequence`` splits large ints into 32-bit words and pads short entropy with zeros, so
``(5,)`` and ``(5, 0)``, or ``(2**32, 0)`` and ``(0, 1)``, seed the same stream. Encoding each part
as exactly two 32-bit words after a length word keeps every tuple distinct.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "derive_seed",
    "generator",
    "hashes",
    "mix64",
    "per_item_keys",
    "seed_sequence",
    "uniforms",
]


_WORD = (1 << 32) - 1


def seed_sequence(parts: int | Sequence[int]) -> np.random.SeedSequence:
    """A SeedSequence keyed by ``parts``: one int or a tuple of ints, each in ``[0, 2**64)``."""
    values = [parts] if isinstance(parts, (int, np.integer)) else list(parts)
    words = [len(values)]
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"seed parts must be ints, got {type(value).__name__}")
        value = int(value)
        if not 0 <= value < 1 << 64:
            raise ValueError(f"seed parts must lie in [0, 2**64), got {value}")
        words += [value & _WORD, value >> 32]
    return np.random.SeedSequence(np.array(words, dtype=np.uint32))


def generator(*parts: int) -> np.random.Generator:
    """A numpy Generator seeded by the tuple ``parts`` (e.g. seed, rank, batch, item)."""
    return np.random.Generator(np.random.PCG64(seed_sequence(parts)))


def derive_seed(*parts: int) -> int:
    """A 63-bit int seed derived from the tuple ``parts`` (for APIs that take a plain int)."""
    return int(seed_sequence(parts).generate_state(1, np.uint64)[0] >> np.uint64(1))


def mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on uint64 values: a fast, well-avalanched hash (wraps mod 2**64)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hashes(parts: int | Sequence[int], positions: np.ndarray) -> np.ndarray:
    """uint64 values, one per position: a keyed hash, a pure function of ``(parts, position)``.

    Costs nanoseconds per position (no Generator per position).

    Args:
        parts: the key (as for ``seed_sequence``).
        positions: non-negative integers (any shape).
    """
    keys = seed_sequence(parts).generate_state(2, np.uint64)
    x = np.asarray(positions).astype(np.uint64)
    with np.errstate(over="ignore"):
        return mix64(mix64(x ^ keys[0]) + keys[1])


def uniforms(parts: int | Sequence[int], positions: np.ndarray) -> np.ndarray:
    """Floats in ``[0, 1)``, one per position, from ``hashes(parts, positions)``."""
    return (hashes(parts, positions) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def per_item_keys(keys: Sequence[int] | None, n: int) -> list[int] | None:
    """Checked ``item_keys`` of a reader's submit: one int in ``[0, 2**64)`` per item.

    Args:
        keys: the keys, or None (then None).
        n: how many items the batch holds.
    """
    if keys is None:
        return None
    out = list(keys)
    if len(out) != n:
        raise ValueError(f"item_keys holds {len(out)} keys for {n} items")
    for key in out:
        seed_sequence(key)  # type and range check
    return [int(key) for key in out]

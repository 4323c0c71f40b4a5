"""The global sample stream: sample ``g`` of a run is a pure function of ``(seed, g)``.

A training run reads one stream of samples ``0, 1, 2, ...`` however it is split: step ``s`` of
rank ``r`` with per-rank batch ``B`` in a world of ``W`` ranks takes samples ``(s W + r) B + j``
for ``j < B``, so the ranks of one step hold together what one rank with batch ``W B`` would
read, and a run resumed on another world size or batch continues the same stream from the
number of samples consumed.

Sample ``g`` picks its source (when several are mixed) with a keyed hash of ``(seed, g)`` against
the weights, then an item of that source: at random from ``sample_rng(seed, g)`` (which also picks
the frames), or in epoch mode the next position of that source's seeded permutation for its
current epoch. A source's position is how many earlier samples chose it, so epoch mode counts
them (vectorised hashing, forward from the last count: under 0.1 us per sample). The crop and flips
of sample ``g`` come from ``sample_key(seed, g)`` (a reader's ``item_keys``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kohakuclip.read.permute import permute
from kohakuclip.read.seeding import derive_seed, generator, hashes, uniforms

__all__ = [
    "STREAM_VERSION",
    "Draw",
    "SampleStream",
    "mixture",
    "sample_key",
    "sample_keys",
    "sample_rng",
]


Spec = Any
"""What a reader takes as sources: one path, or a sequence of paths."""

_SOURCE_TAG, _ITEM_TAG, _CROP_TAG, _EPOCH_TAG = 0, 1, 2, 3
_BLOCK = 1 << 20  # samples hashed per numpy call when counting

STREAM_VERSION = 2
"""How epoch orders are keyed: 2, (seed, epoch tag, source, epoch); 1 (loader states saved
before 2026-12-04), (seed, source, epoch), which for source 1 was the key of sample ``epoch``'s
generator (``sample_rng``): the two draws were not independent. Resumed runs keep the version
they started with."""


def sample_rng(seed: int, g: int) -> np.random.Generator:
    """The Generator of sample ``g``: its item (random mode) and its frames."""
    return generator(seed, _ITEM_TAG, g)


def sample_keys(seed: int, start: int, count: int) -> list[int]:
    """The keys a reader gets for samples ``start .. start + count - 1`` (``item_keys``): each
    sample's crop and flips."""
    return [int(k) for k in hashes((seed, _CROP_TAG), np.arange(start, start + count))]


def sample_key(seed: int, g: int) -> int:
    """The key of sample ``g`` alone (see ``sample_keys``)."""
    return sample_keys(seed, g, 1)[0]


@dataclass(frozen=True)
class Mixture:
    """The sources of a stream: per source a name, its paths and its weight."""

    names: list[str]
    paths: list[list[str]]
    weights: list[float]

    @property
    def flat(self) -> list[str]:
        """Every path, source after source: one reader over them numbers items in this order."""
        return [p for paths in self.paths for p in paths]


def _paths(spec: Spec) -> list[str]:
    if isinstance(spec, (str, os.PathLike)):
        return [os.fspath(spec)]
    return [os.fspath(p) for p in spec]


def mixture(sources: Spec | Mapping[str, Spec], weights: Any = None) -> Mixture:
    """The sources of a dataset, mixed or not.

    Args:
        sources: one reader's sources (a path or a sequence of paths) when ``weights`` is None;
            with ``weights``, a sequence of such sources, or a mapping name -> sources.
        weights: None (one source), a sequence with one weight per source (in the mapping's order
            for a mapping), or a mapping name -> weight. Weights are finite, >= 0, not all 0.
    """
    if weights is None:
        if isinstance(sources, Mapping):
            raise TypeError("a mapping of sources needs weights (a mapping or a sequence)")
        return Mixture(["0"], [_paths(sources)], [1.0])
    if isinstance(sources, Mapping):
        names = [str(name) for name in sources]
        specs = list(sources.values())
    elif isinstance(sources, (str, os.PathLike)):
        raise TypeError("weights mix several sources: give a sequence or a mapping of sources")
    else:
        specs = list(sources)
        names = [str(i) for i in range(len(specs))]
    if isinstance(weights, Mapping):
        if not isinstance(sources, Mapping) or set(map(str, weights)) != set(names):
            raise ValueError(f"weights must name the sources exactly: {names}")
        by_name = {str(k): v for k, v in weights.items()}
        values = [by_name[name] for name in names]
    else:
        values = list(weights)
    if len(values) != len(specs) or not specs:
        raise ValueError(f"got {len(values)} weights for {len(specs)} sources")
    floats = [float(w) for w in values]
    if any(not math.isfinite(w) or w < 0 for w in floats) or sum(floats) <= 0:
        raise ValueError(f"weights must be finite, >= 0 and not all 0, got {values}")
    return Mixture(names, [_paths(spec) for spec in specs], floats)


@dataclass(frozen=True)
class Draw:
    """What one sample of the stream is."""

    sample: int  # g
    source: int  # which source of the mixture
    item: int  # id in the reader over all sources (source offset + index within it)
    rng: np.random.Generator  # sample_rng(seed, g), after any draw of the item


class SampleStream:
    """Samples ``g`` of one seed over sources of ``sizes`` items mixed by ``weights``.

    Args:
        seed: the run's seed.
        sizes: items per source (videos or images), in reader order.
        weights: per source (None: one source); a source with weight > 0 must hold items.
        epochs: each source walks a seeded permutation per epoch instead of drawing at random.
        names: per source, for error messages.
        version: how epoch orders are keyed (``STREAM_VERSION``; 1 for runs started before).
    """

    def __init__(
        self,
        seed: int,
        sizes: Sequence[int],
        weights: Sequence[float] | None = None,
        epochs: bool = False,
        names: Sequence[str] | None = None,
        version: int = STREAM_VERSION,
    ) -> None:
        derive_seed(seed)  # validates it
        if version not in (1, STREAM_VERSION):
            raise ValueError(f"sample stream version {version!r}: this kohakuclip has 1 and 2")
        self.seed = seed
        self.version = version
        self.sizes = np.array([int(n) for n in sizes], dtype=np.int64)
        self.epochs = epochs
        w = np.ones(len(self.sizes)) if weights is None else np.array(weights, dtype=np.float64)
        if len(w) != len(self.sizes) or not len(w):
            raise ValueError(f"got {len(w)} weights for {len(self.sizes)} sources")
        if int(self.sizes.sum()) < 1:
            raise ValueError("nothing to draw from: the sources hold no videos or images")
        labels = list(names) if names is not None else [str(i) for i in range(len(w))]
        for label, n, weight in zip(labels, self.sizes.tolist(), w.tolist()):
            if weight > 0 and n < 1:
                raise ValueError(f"source {label!r} has weight {weight} but holds no items")
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]]).astype(np.int64)
        cumulative = np.cumsum(w) / w.sum()
        # from the last source with weight on, exactly 1: rounding (0.1 ten times sums to
        # 0.9999999999999999) never leaves a sliver of [0, 1) to a source of weight 0 after it
        cumulative[np.flatnonzero(w > 0)[-1] :] = 1.0
        self._cumulative = cumulative
        self._origin = (0, np.zeros(len(w), dtype=np.int64))
        self._counted = self._origin

    def restart(self, samples: int, seen: Sequence[int]) -> None:
        """Count from a resume point: ``samples`` consumed, ``seen[k]`` of them from source k."""
        counts = np.array([int(c) for c in seen], dtype=np.int64)
        if samples < 0 or counts.shape != self.sizes.shape or counts.min() < 0:
            raise ValueError(f"a resume point of {len(self.sizes)} sources, got {samples}, {seen}")
        if int(counts.sum()) != samples:
            raise ValueError(f"per-source counts {list(seen)} do not add up to {samples} samples")
        self._origin = self._counted = (int(samples), counts)

    def sources(self, start: int, stop: int) -> np.ndarray:
        """The source of each sample in ``[start, stop)``, int64."""
        if len(self.sizes) == 1:
            return np.zeros(max(0, stop - start), dtype=np.int64)
        u = uniforms((self.seed, _SOURCE_TAG), np.arange(start, stop, dtype=np.int64))
        return self._choose(u)

    def _choose(self, u: np.ndarray) -> np.ndarray:
        """The source each uniform in ``[0, 1)`` picks: weight by weight along the interval."""
        return np.searchsorted(self._cumulative, u, side="right").astype(np.int64)

    def seen(self, g: int) -> np.ndarray:
        """Per source: how many of the samples before ``g`` chose it (int64)."""
        origin = self._origin[0]
        if g < origin:
            raise ValueError(f"sample {g} lies before the resume point {origin}")
        if len(self.sizes) == 1:
            return np.array([g], dtype=np.int64)
        at, counts = self._counted
        if at > g and at - g > g - origin:
            at, counts = self._origin  # nearer to count forward from the resume point
        counts = counts.copy()
        while at != g:  # forward from the last count, or back to g when it lies behind
            stop = min(g, at + _BLOCK) if at < g else max(g, at - _BLOCK)
            lo, hi = min(at, stop), max(at, stop)
            step = np.bincount(self.sources(lo, hi), minlength=len(self.sizes))
            counts += step if at < g else -step
            at = stop
        self._counted = (g, counts)
        return counts.copy()

    def draw(self, start: int, count: int) -> list[Draw]:
        """Samples ``start .. start + count - 1``."""
        if start < 0 or count < 0:
            raise ValueError(f"samples must be >= 0, got {start} (+{count})")
        g = np.arange(start, start + count, dtype=np.int64)
        source = self.sources(start, start + count)
        rngs = [sample_rng(self.seed, int(x)) for x in g]
        if self.epochs:
            local = self._epoch_positions(start, source)
        else:
            local = np.array([r.integers(self.sizes[k]) for r, k in zip(rngs, source)], np.int64)
        item = self.offsets[source] + local
        return [
            Draw(int(x), int(k), int(i), r)
            for x, k, i, r in zip(g.tolist(), source.tolist(), item.tolist(), rngs)
        ]

    def _epoch_positions(self, start: int, source: np.ndarray) -> np.ndarray:
        """Per sample: its place in its source's permutation of the current epoch."""
        ordinal = np.empty(len(source), dtype=np.int64)
        base = self.seen(start)
        for k in np.unique(source):
            sel = source == k
            ordinal[sel] = base[k] + np.arange(int(sel.sum()))
        n = self.sizes[source]
        epoch, within = np.divmod(ordinal, n)
        local = np.empty(len(source), dtype=np.int64)
        for k, e in {(int(k), int(e)) for k, e in zip(source, epoch)}:
            sel = (source == k) & (epoch == e)
            key = (self.seed, _EPOCH_TAG, k, e) if self.version > 1 else (self.seed, k, e)
            local[sel] = permute(int(self.sizes[k]), key, within[sel])
        return local

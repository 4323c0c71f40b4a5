"""PyTorch training layer: endless streams of whole batches, a loader, resume and ranks.

A dataset here is an ``IterableDataset`` whose items are whole batches cut from one global
sample stream (``kohakuclip.read.stream``): sample ``g`` (its source, video or image, frames,
crop and flips) is a pure function of ``(seed, g)``, and batch ``s`` of rank ``r`` in a world of
``W`` ranks with per-rank batch ``B`` holds samples ``(s W + r) B + j``. So a DataLoader with any
number of workers yields the same batches (worker ``w`` of ``K`` makes batches ``w, w + K, ...``
and the DataLoader interleaves them in order), the ranks of a step hold together what one rank
with batch ``W B`` would read, and resuming needs only the seed and the samples consumed, on
any world size and batch.

Nothing that owns threads, decoders or memory maps crosses a fork: each process opens its own
reader on first use and never touches one it inherited.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import multiprocessing.util
import os
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from kohakuclip._cpus import usable_cpus
from kohakuclip._yuv_torch import yuv_to_rgb
from kohakuclip.errors import KohakuClipError
from kohakuclip.read.pool import PoolClosedError
from kohakuclip.read.seeding import derive_seed
from kohakuclip.read.stream import (
    STREAM_VERSION,
    Draw,
    SampleStream,
    mixture,
    sample_key,
    sample_keys,
    sample_rng,
)
from kohakuclip.storage.remote import (
    adopt_store_environment,
    is_store_failure,
    is_url,
    store_environment,
)

__all__ = [
    "REPLACE_ATTEMPTS",
    "STATE_VERSION",
    "BatchDataset",
    "ClipDataset",
    "ClipLoader",
    "ImageDataset",
    "OnError",
    "collate_meta",
    "rank_and_world",
    "sample_key",
    "sample_keys",
    "sample_rng",
    "yuv_to_rgb",
]

Sampler = Callable[[int, int, np.random.Generator], Sequence[int]]
"""``sampler(n_video_frames, frames, rng) -> display-order frame indices`` (e.g. random_frames)."""

STATE_VERSION = 2
"""Format of ``ClipLoader.state_dict()``; 1 (no ``version`` key) counted batches per rank."""


def rank_and_world() -> tuple[int, int]:
    """(rank, world size): from torch.distributed when initialised, else RANK and WORLD_SIZE."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} does not fit WORLD_SIZE={world}")
    return rank, world


def _wait_quietly(job: Any) -> None:
    """Wait for an abandoned batch; its error no longer matters to anyone."""
    with contextlib.suppress(Exception):
        job.result()


def _collate_values(values: list[Any]) -> Any:
    """Numbers become a tensor (bools, ints or floats); anything else stays a list."""
    if values and all(isinstance(v, bool) for v in values):
        return torch.tensor(values, dtype=torch.bool)
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return torch.tensor(values, dtype=torch.int64)
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return torch.tensor(values, dtype=torch.float32)
    return values


def collate_meta(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-item metadata dicts to one dict of per-key batches (missing keys give None entries).

    Args:
        records: one metadata mapping per item.
    """
    keys: dict[str, None] = {}
    for record in records:
        keys.update(dict.fromkeys(record))
    return {key: _collate_values([record.get(key) for record in records]) for key in keys}


OnError = Literal["raise", "replace"]
"""What a batch dataset does with an item it cannot read (``BatchDataset``'s ``on_error``)."""
REPLACE_ATTEMPTS = 8
"""Replacements ``on_error="replace"`` tries for one sample before it raises the error."""
_REPLACE_TAG = 0x5245504C  # keys the replacement draws apart from every other draw
_NAMES_SAMPLED = 16
"""Items per source whose names go into a loader state's fingerprint (``name_digests``)."""
_IN_PROCESS_DEPTH = 4
"""Batches decoding at once in the training process by default. With 2 (one batch ahead of the
consumer's) a thread that finishes its share idles until the batch's slowest share is done and
the next batch is queued: 15 threads on 16 cores were 61 % busy at 2 and 95 % at 4
(``benchmarks/loader_bench.py``, setups 0x15 and 0x15p4), 492 and 805 clips/s."""


def _pixel_meta(mode: str, size: int, parts: Sequence[Any]) -> dict[str, Any]:
    """What the reader did to each item's pixels, from its batches ``parts`` (in item order):
    with the batch, what ``yuv_to_rgb`` needs to finish a yuv mode."""
    return {
        "mode": mode,
        "size": size,
        "crops": torch.from_numpy(np.concatenate([p.crops for p in parts])),
        "flips": torch.from_numpy(np.concatenate([p.flips for p in parts])),
        "colorspaces": [name for p in parts for name in p.colorspaces],
        "full_range": torch.from_numpy(np.concatenate([p.full_range for p in parts])),
    }


def _about_data(error: BaseException) -> bool:
    """Whether ``error`` (and what caused it) is about an item's bytes, which another item can
    stand in for, rather than storage failing or the reader closed (which would fail the
    replacement too, or make the batches depend on the moment)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, PoolClosedError):
            return False
        if is_store_failure(seen):
            return False
        seen = seen.__cause__
    return True


class BatchDataset(IterableDataset):
    """Base of the batch datasets: the sample stream, ranks, sources, in-flight decoding.

    A subclass says how to open its reader (over ``self.mixture.flat``), how a drawn item id
    becomes a reader item, the batch shape and the per-batch metadata. ``epochs=False`` draws
    items uniformly at random; ``epochs=True`` walks a seeded permutation per epoch, so all ranks
    together see every item once per epoch (per source when mixed). ``sources`` with ``weights``
    mix several sources (see ``kohakuclip.read.stream.mixture``): each sample picks its source
    by its own seeded draw. ``threads=None`` shares the usable CPUs between the DataLoader
    workers and the ranks on this node (LOCAL_WORLD_SIZE, as torchrun sets it). Iterated
    directly, it decodes in this process into pinned batches when CUDA is available; through
    ``ClipLoader``, the same batches with resume state.

    Args:
        sources: one reader's sources, or with ``weights`` several of them mixed (a sequence
            of sources with a sequence of weights, or a mapping name -> sources).
        batch_size: items per batch (per rank).
        weights: the mixing weight of each source (by position, or by name for a mapping).
        epochs: walk a seeded permutation per epoch instead of drawing uniformly.
        seed: the seed of the sample stream.
        threads: decoding threads (None: the usable CPUs shared over this node's ranks and
            DataLoader workers).
        with_meta: yield ``(batch, meta)`` instead of the batch alone (required in the yuv
            modes: the meta says how ``yuv_to_rgb`` converts each item).
        rank: this process's rank (None: from torch.distributed, else RANK).
        world_size: the number of ranks (None: from torch.distributed, else WORLD_SIZE).
        on_error: what an item that cannot be read does: ``"raise"`` its error (naming the
            file and member; the iteration ends), or ``"replace"`` it with another item of the
            same source, drawn from (seed, sample, attempt) so that every worker count and a
            resumed run replace it alike, with a ``UserWarning`` naming it (after
            ``REPLACE_ATTEMPTS`` failed replacements the error is raised).
        **reader_options: keywords of the reader a subclass opens (``self.reader_options``).
    """

    kind = "items"
    """What the sources hold (``"videos"``, ``"images"``): part of the state's fingerprint."""

    def __init__(
        self,
        sources: Any,
        batch_size: int,
        *,
        weights: Any = None,
        epochs: bool = False,
        seed: int = 0,
        threads: int | None = None,
        with_meta: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: OnError = "raise",
        **reader_options: Any,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if on_error not in ("raise", "replace"):
            raise ValueError(f"on_error must be 'raise' or 'replace', got {on_error!r}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        if rank is not None and world_size is not None and not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} does not fit world_size {world_size}")
        mode = reader_options.get("mode", "rgb")
        if mode != "rgb" and not with_meta:
            raise ValueError(
                f"mode={mode!r} needs with_meta=True: yuv_to_rgb takes each item's colorspace "
                "and range (in 'yuv' mode also its crop and flips) from the batch's meta"
            )
        derive_seed(seed)  # validates the seed early
        self.sources = sources
        self.weights = weights
        self.mixture = mixture(sources, weights)
        self.batch_size = batch_size
        self.epochs = epochs
        self.seed = seed
        self.threads = threads
        self.with_meta = with_meta
        self.on_error = on_error
        self.reader_options = reader_options
        self._ranks = None if rank is None or world_size is None else (rank, world_size)
        self._start: int | None = None  # where ClipLoader's workers start (None: the resume point)
        self._stop: int | None = None  # the epoch end ClipLoader's workers stop before (None: none)
        self._origin: tuple[int, int, tuple[int, ...]] = (0, 0, ())  # samples, batch, per source
        self.stream_version = STREAM_VERSION  # a resumed run keeps the one it started with
        self._sizes: list[int] | None = None  # items per source, once a reader was opened
        self._names: list[str] | None = None  # per source, a digest of sampled item names
        self._stream_cache: tuple[Any, SampleStream] | None = None
        self._reader: Any = None
        self._reader_pid = -1
        self._inherited: list[Any] = []

    # --- what a subclass provides -------------------------------------------------------------

    def _open_reader(self, threads: int) -> Any:
        raise NotImplementedError

    def _path_counts(self, reader: Any) -> list[int]:
        """Items per path of ``self.mixture.flat``, in order."""
        raise NotImplementedError

    def _item_name(self, reader: Any, index: int) -> str:
        """An item's member name (or folder-relative path; gulp: its id): where it is stored
        does not change it."""
        raise NotImplementedError

    def _make_item(self, reader: Any, index: int, rng: np.random.Generator) -> Any:
        raise NotImplementedError

    def _batch_shape(self, reader: Any) -> tuple[int, ...]:
        raise NotImplementedError

    def _meta(self, reader: Any, batch: int, items: list[Any]) -> dict[str, Any]:
        raise NotImplementedError

    # --- ranks, sources and the sample stream -------------------------------------------------

    @property
    def rank_world(self) -> tuple[int, int]:
        """(rank, world size) as given, else as torch.distributed or the environment say."""
        return self._ranks if self._ranks is not None else rank_and_world()

    def _pin_ranks(self) -> None:
        """Fix the ranks in this object before worker processes copy it (they lack the group)."""
        self._ranks = self.rank_world

    def source_sizes(self) -> list[int]:
        """Items (videos, images) per source of the mixture (opens this process's reader)."""
        if self._sizes is None:
            reader = self._reader_here()
            if len(self.mixture.paths) == 1:
                self._sizes = [len(reader)]
            else:
                counts = iter(self._path_counts(reader))
                self._sizes = [sum(next(counts) for _ in p) for p in self.mixture.paths]
        return self._sizes

    def name_digests(self) -> list[str]:
        """Per source, a hash of the names of up to 16 of its items at evenly spaced positions:
        with the counts, it tells another dataset (or another order) of as many items apart,
        wherever the data is stored (opens this process's reader)."""
        if self._names is None:
            reader = self._reader_here()
            digests, start = [], 0
            for n in self.source_sizes():
                picks = sorted({start + k * n // _NAMES_SAMPLED for k in range(_NAMES_SAMPLED)})
                names = "\0".join(self._item_name(reader, i) for i in picks if i < start + n)
                data = names.encode("utf-8", "surrogateescape")
                digests.append(hashlib.blake2b(data, digest_size=8).hexdigest())
                start += n
            self._names = digests
        return self._names

    def fingerprint(self) -> dict[str, Any]:
        """What a saved state records of its sources: the kind, the item count and a digest of
        sampled item names of each source (``name_digests``), and whether they are read in
        epochs (a resume must match these), and the mix's weights (a resume may change them)."""
        total = float(sum(self.mixture.weights))
        return {
            "kind": self.kind,
            "items": self.source_sizes(),
            "names": self.name_digests(),
            "epochs": self.epochs,
            "weights": [float(w) / total for w in self.mixture.weights],
        }

    def _new_stream(self, sizes: Sequence[int]) -> SampleStream:
        return self._stream_from(self.seed, self._origin, sizes)

    def _stream_from(
        self,
        seed: int,
        origin: tuple[int, int, tuple[int, ...]],
        sizes: Sequence[int],
        version: int | None = None,
    ) -> SampleStream:
        stream = SampleStream(
            seed,
            sizes,
            self.mixture.weights,
            self.epochs,
            self.mixture.names,
            version=self.stream_version if version is None else version,
        )
        samples, _, seen = origin
        if seen:
            stream.restart(samples, seen)
        return stream

    def sample_stream(self) -> SampleStream:
        """The sample stream of this seed and resume point over this process's sources."""
        key = (self.seed, self._origin, self.epochs, self.stream_version)
        if self._stream_cache is None or self._stream_cache[0] != key:
            self._stream_cache = (key, self._new_stream(self.source_sizes()))
        return self._stream_cache[1]

    def first_sample(self, batch: int) -> int:
        """The global sample index of item 0 of batch ``batch`` of this rank.

        Args:
            batch: the batch of this rank.
        """
        if batch < 0:
            raise ValueError(f"batch must be >= 0, got {batch}")
        samples, step, _ = self._origin
        if batch < step:
            raise ValueError(f"batch {batch} lies before the resume point (batch {step})")
        rank, world = self.rank_world
        return samples + ((batch - step) * world + rank) * self.batch_size

    def consumed(self, batch: int) -> int:
        """Global samples all ranks together consumed before their batch ``batch``.

        Args:
            batch: the batch of this rank.
        """
        samples, step, _ = self._origin
        return samples + (batch - step) * self.rank_world[1] * self.batch_size

    def resume_at(
        self,
        seed: int,
        samples: int,
        batch: int,
        seen: Sequence[int] = (),
        stream_version: int = STREAM_VERSION,
    ) -> None:
        """Continue a stream after some samples; checked first: nothing changes when it fails.

        Args:
            seed: the stream's seed.
            samples: global samples all ranks consumed.
            batch: this rank's next batch.
            seen: how many of ``samples`` each source gave (empty: counted from the start).
            stream_version: how the stream keys its epoch orders (``read.stream.STREAM_VERSION``,
                or the one of the run resumed).
        """
        if samples < 0 or batch < 0:
            raise ValueError(f"samples and batch must be >= 0, got {samples}, {batch}")
        origin = (int(samples), int(batch), tuple(int(c) for c in seen))
        self._stream_from(seed, origin, self.source_sizes(), stream_version)
        self.seed, self._origin, self.stream_version = seed, origin, stream_version

    def indices(self, batch: int, sizes: int | Sequence[int] | None = None) -> np.ndarray:
        """What batch ``batch`` of this rank draws: item ids over all sources, int64 [B].

        Args:
            batch: the batch of this rank.
            sizes: items per source (an int for one source); None: the sources' own (opens this
                process's reader).
        """
        if sizes is None:
            stream = self.sample_stream()
        else:
            stream = self._new_stream([sizes] if isinstance(sizes, int) else list(sizes))
        draws = stream.draw(self.first_sample(batch), self.batch_size)
        return np.array([d.item for d in draws], dtype=np.int64)

    def items(self, batch: int) -> list[Any]:
        """The reader items of batch ``batch`` of this rank (opens this process's reader).

        Args:
            batch: the batch of this rank.
        """
        return self._items(self._reader_here(), batch)[1]  # as drawn (see ``on_error``)

    def _items(self, reader: Any, batch: int) -> tuple[list[Draw], list[Any], list[int]]:
        """The draws of batch ``batch``, their reader items and the attempt each item is (0:
        the drawn one; more: a replacement, see ``on_error``)."""
        draws = self.sample_stream().draw(self.first_sample(batch), self.batch_size)
        attempts, items = zip(*(self._item(reader, d) for d in draws), strict=True)
        return draws, list(items), list(attempts)

    def _keys(self, draws: list[Draw]) -> list[int]:
        """The reader's ``item_keys`` of consecutive draws (each sample's crop and flips)."""
        return sample_keys(self.seed, draws[0].sample, len(draws))

    def _item(self, reader: Any, draw: Draw, attempt: int = 0) -> tuple[int, Any]:
        """(attempt, reader item) of ``draw``: the first candidate from ``attempt`` on whose
        planning succeeds (only the drawn one, attempt 0, unless ``on_error="replace"``)."""
        while True:
            try:
                return attempt, self._candidate(reader, draw, attempt)
            except KohakuClipError as e:
                attempt = self._next_attempt(draw, attempt, e)

    def _candidate(self, reader: Any, draw: Draw, attempt: int) -> Any:
        """Attempt 0: the drawn item; attempt k: the k-th replacement, an item of the same
        source drawn from (seed, sample, k)."""
        if attempt == 0:
            return self._make_item(reader, draw.item, draw.rng)
        stream = self.sample_stream()
        rng = np.random.default_rng(derive_seed(self.seed, _REPLACE_TAG, draw.sample, attempt))
        local = int(rng.integers(stream.sizes[draw.source]))
        return self._make_item(reader, int(stream.offsets[draw.source]) + local, rng)

    def _next_attempt(self, draw: Draw, attempt: int, error: KohakuClipError) -> int:
        """After ``error`` on ``attempt``: the next one, with a warning. Raises ``error`` in
        ``"raise"`` mode, after ``REPLACE_ATTEMPTS`` replacements, and when it is not about
        the item's data (storage failing, the reader closed): replacing then would make the
        batches depend on the network."""
        if self.on_error == "raise" or attempt >= REPLACE_ATTEMPTS or not _about_data(error):
            raise error
        warnings.warn(f"sample {draw.sample} replaced: {error}", UserWarning, stacklevel=4)
        return attempt + 1

    def _repair(
        self,
        reader: Any,
        draws: list[Draw],
        planned: tuple[list[Any], list[int]],
        out: torch.Tensor,
        keys: list[int],
    ) -> tuple[list[Any], list[Any]]:
        """A batch whose read failed, item by item into its slots, each item that cannot be
        read replaced by its next candidate (``on_error="replace"``); returns the items read
        and the reader's one-item batch of each. ``planned``: the items and their attempts,
        from ``_items``."""
        slots = out.numpy()
        done, parts = [], []
        for k, (draw, item, attempt) in enumerate(zip(draws, *planned, strict=True)):
            while True:
                try:
                    slot = slots[k : k + 1]
                    got = reader.read([item], slot, item_keys=keys[k : k + 1])
                    if got.video.ctypes.data != slot.ctypes.data:
                        slot[...] = got.video
                    break
                except KohakuClipError as e:
                    attempt, item = self._item(reader, draw, self._next_attempt(draw, attempt, e))
            done.append(item)
            parts.append(got)
        return done, parts

    def _stream_meta(self, draws: list[Draw]) -> dict[str, Any]:
        return {
            "sample": torch.tensor([d.sample for d in draws], dtype=torch.int64),
            "mix": torch.tensor([d.source for d in draws], dtype=torch.int64),
            "mix_name": [self.mixture.names[d.source] for d in draws],
        }

    def read_batch(self, batch: int) -> Any:
        """Decode batch ``batch`` of this rank on its own, as iteration would yield it.

        Args:
            batch: the batch of this rank.
        """
        stream = self._stream(batch, 1, 1, pin=False)
        try:
            return next(stream)
        finally:
            stream.close()

    # --- reader per process -------------------------------------------------------------------

    def _threads_here(self) -> int:
        """``threads``, or the usable CPUs shared out over this node's ranks and their workers."""
        if self.threads is not None:
            return self.threads
        info = get_worker_info()
        workers = info.num_workers if info is not None else 1
        ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        return max(1, usable_cpus() // (workers * max(1, ranks)))

    def _reader_here(self) -> Any:
        """This process's reader; one inherited through fork is kept alive but never used."""
        if self._reader is None or self._reader_pid != os.getpid():
            if self._reader is not None:
                self._inherited.append(self._reader)
            self._reader = self._open_reader(self._threads_here())
            self._reader_pid = os.getpid()
        return self._reader

    def close(self) -> None:
        """Close this process's reader (a new one opens on the next use)."""
        if self._reader is not None and self._reader_pid == os.getpid():
            self._reader.close()
        self._reader = None
        self._reader_pid = -1

    @property
    def reads_object_storage(self) -> bool:
        """Whether any source is a URL (its workers then start with "forkserver")."""
        return any(is_url(path) for path in self.mixture.flat)

    def __getstate__(self) -> dict[str, Any]:
        """Without this process's reader; with its object-storage credentials when a source is
        a URL (see ``__setstate__``; a dataset of local files never carries them)."""
        state = self.__dict__.copy()
        state.update(_reader=None, _reader_pid=-1, _inherited=[])
        if self.reads_object_storage:
            state["_store_environment"] = store_environment()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """In a worker process: the parent's object-storage variables too, which a forkserver
        started before the parent set them (e.g. by an earlier loader) would lack."""
        adopt_store_environment(state.pop("_store_environment", {}))
        self.__dict__.update(state)

    # --- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """Batches from the resume point on (0, or ``resume_at``'s batch), pinned when CUDA is
        available (pinning creates a CUDA context on the current device: under DDP, call
        ``torch.cuda.set_device`` first); in a DataLoader worker, its share of them, unpinned
        (``pin_memory=True`` makes the DataLoader pin them)."""
        info = get_worker_info()
        start = self._origin[1] if self._start is None else self._start
        if info is None:
            return self._stream(start, 1, _IN_PROCESS_DEPTH, pin=torch.cuda.is_available())
        return self._stream(start + info.id, info.num_workers, 2, pin=False, stop=self._stop)

    def _stream(
        self, start: int, step: int, depth: int, pin: bool, stop: int | None = None
    ) -> Generator[Any, None, None]:
        """Batches ``start, start + step, ...`` (before ``stop``, when given) with ``depth`` of
        them decoding at any time."""
        reader = self._reader_here()
        shape = self._batch_shape(reader)
        pending: deque[tuple[int, list[Draw], list[Any], list[int], torch.Tensor, Any]] = deque()
        batch = start
        try:
            while True:
                while len(pending) < depth and (stop is None or batch < stop):
                    draws, items, attempts = self._items(reader, batch)
                    out = torch.empty(shape, dtype=torch.uint8, pin_memory=pin)
                    job = reader.submit(items, out.numpy(), item_keys=self._keys(draws))
                    pending.append((batch, draws, items, attempts, out, job))
                    batch += step
                if not pending:
                    return
                index, draws, items, attempts, out, job = pending.popleft()
                try:
                    parts = [job.result()]
                    if parts[0].video.ctypes.data != out.data_ptr():
                        out.copy_(torch.from_numpy(np.ascontiguousarray(parts[0].video)))
                except KohakuClipError:
                    if self.on_error == "raise":
                        raise
                    planned = (items, attempts)
                    items, parts = self._repair(reader, draws, planned, out, self._keys(draws))
                if not self.with_meta:
                    yield out
                    continue
                meta = self._meta(reader, index, items)
                pixels = _pixel_meta(reader.mode, reader.size, parts)
                yield out, {**meta, **pixels, **self._stream_meta(draws)}
        finally:
            # let abandoned batches finish: a fork must never see a decode thread mid-work
            for *_, job in pending:
                _wait_quietly(job)


class ClipDataset(BatchDataset):
    """Batches of video clips, uint8 ``[batch_size, frames, 3, size, size]`` in rgb mode.

    Each item picks a video (at random, or by the epoch permutation with ``epochs=True``) and
    ``frames`` frames of it (``kohakuclip.clip`` with ``fps`` and ``spread``, or ``sampler``).
    ``sources`` is one reader's sources, or with ``weights`` several of them mixed (a sequence
    of sources with a sequence of weights, or a mapping name -> sources with weights by name).
    ``reader_options`` go to ``kohakuclip.Reader`` (size, mode, crop, hflip, vflip, ...). With
    ``with_meta=True`` each batch comes as ``(video, meta)``: meta holds ``batch``, ``video`` (ids
    over all sources, int64 [B]), ``frames`` (int64 [B, T]), ``source`` and ``member`` (the file
    and member, lists of str), ``meta`` (the per-video metadata recorded at write time, collated
    per key), ``sample`` (global sample indices, int64 [B]), ``mix`` (the mixed source of each
    clip, int64 [B]) and ``mix_name`` (its name: the mapping key, or its position as str), and
    what the reader did to the pixels: ``mode``, ``size``, ``crops`` (int32 [B, 4]: x, y, w, h
    in stored pixels), ``flips`` (bool [B, 2]), ``colorspaces`` (list of str) and
    ``full_range`` (bool [B]); ``kohakuclip.torch.yuv_to_rgb((video, meta))`` finishes a yuv
    mode from them (the yuv modes need ``with_meta=True``).
    The arguments it shares with ``BatchDataset`` (sources, batch_size, weights, epochs, seed,
    threads, with_meta, rank, world_size, on_error) are documented there.

    Args:
        frames: frames per clip.
        fps: sample clips at this rate (None: consecutive stored frames).
        spread: spread each clip over its whole video.
        sampler: ``sampler(n_video_frames, frames, rng)`` -> frame indices, instead of
            ``kohakuclip.clip``.
        **reader_options: keywords of ``kohakuclip.Reader`` (size, mode, crop, hflip, ...).
    """

    kind = "videos"

    def __init__(
        self,
        sources: Any,
        batch_size: int,
        *,
        frames: int = 8,
        fps: float | None = None,
        spread: bool = False,
        epochs: bool = False,
        seed: int = 0,
        threads: int | None = None,
        weights: Any = None,
        sampler: Sampler | None = None,
        with_meta: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        on_error: OnError = "raise",
        **reader_options: Any,
    ) -> None:
        super().__init__(
            sources,
            batch_size,
            weights=weights,
            epochs=epochs,
            seed=seed,
            threads=threads,
            with_meta=with_meta,
            rank=rank,
            world_size=world_size,
            on_error=on_error,
            **reader_options,
        )
        if frames < 1:
            raise ValueError(f"frames must be >= 1, got {frames}")
        if fps is not None and not (math.isfinite(fps) and fps > 0):
            raise ValueError(f"fps must be a positive number or None, got {fps}")
        self.frames = frames
        self.fps = fps
        self.spread = spread
        self.sampler = sampler
        self._lengths = np.zeros(0, dtype=np.int64)  # per video: frame count, 0 until looked up
        self._rates = np.zeros(0, dtype=np.float64)

    def _open_reader(self, threads: int) -> Any:
        from kohakuclip import Reader

        reader = Reader(self.mixture.flat, threads=threads, **self.reader_options)
        self._lengths = np.zeros(len(reader), dtype=np.int64)
        self._rates = np.zeros(len(reader), dtype=np.float64)
        return reader

    def _path_counts(self, reader: Any) -> list[int]:
        catalog = reader._catalog  # videos numbered in path order
        per_source = np.bincount(catalog.videos.sources(), minlength=len(catalog.sources))
        return _per_path(catalog.sources, per_source, len(self.mixture.flat))

    def _item_name(self, reader: Any, index: int) -> str:
        return str(reader._catalog.videos[index].member)

    def _length_and_rate(self, reader: Any, vid: int) -> tuple[int, float]:
        """A video's frame count and fps, cached: Reader.info also looks up metadata."""
        if not self._lengths[vid]:
            info = reader.info(vid)
            self._lengths[vid], self._rates[vid] = info.n, info.fps
        return int(self._lengths[vid]), float(self._rates[vid])

    def _make_item(self, reader: Any, index: int, rng: np.random.Generator) -> Any:
        from kohakuclip import clip

        n, fps = self._length_and_rate(reader, index)
        if self.sampler is not None:
            return index, [int(f) for f in self.sampler(n, self.frames, rng)]
        return index, clip(n, self.frames, rng, self.fps, fps, self.spread)

    def _batch_shape(self, reader: Any) -> tuple[int, ...]:
        return tuple(reader.batch_shape(self.batch_size, self.frames))

    def _meta(self, reader: Any, batch: int, items: list[Any]) -> dict[str, Any]:
        infos = [reader.info(vid) for vid, _ in items]
        return {
            "batch": batch,
            "video": torch.tensor([vid for vid, _ in items], dtype=torch.int64),
            "frames": torch.tensor([list(f) for _, f in items], dtype=torch.int64),
            "source": [str(info.source) for info in infos],
            "member": [info.member for info in infos],
            "meta": collate_meta([info.meta or {} for info in infos]),
        }

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.update(_lengths=self._lengths[:0], _rates=self._rates[:0])
        return state


def _context_for(dataset: Any) -> str | None:
    """ "forkserver" for a dataset with object-storage sources (no fork after obstore ran)."""
    return "forkserver" if getattr(dataset, "reads_object_storage", False) else None


class ClipLoader:
    """Iterate a batch dataset in this process or in DataLoader workers, and keep resume state.

    ``workers=0`` decodes on the reader's threads in this process, ``prefetch`` batches in flight (4
    by default: with one batch ahead of the consumer's, threads that finish their share wait for the
    batch's slowest one), each into a fresh tensor (pinned when CUDA is available: torch's caching
    host allocator makes that cheap). ``workers>0`` runs the dataset in DataLoader worker processes,
    each with its own reader. Either way the batches are the same. ``state_dict()`` holds what
    resuming needs: the format version, the seed, the global samples consumed before the next batch
    the consumer needs (the same on every rank), per source how many of them it gave, the index of
    that batch, and a fingerprint of the sources (kind, item count and sampled names per source).
    ``lookahead`` is how many batches the consumer fetches ahead of the one it trains on (1 for
    Lightning), so those count as not yet seen. A new iteration starts at that batch, so an
    interrupted epoch and a resumed run continue identically; ``load_state_dict`` continues the same
    global stream on any world size and per-rank batch (rank 0's state serves every rank).

    The stream is endless unless ``batches`` is given: then batches ``[k N, (k + 1) N)`` form
    epoch ``k``, an iteration ends at the next epoch boundary and ``len()`` is N (Lightning's
    max_epochs; with ``limit_train_batches`` instead, one batch repeats at each epoch boundary,
    as Lightning fetches ahead only within an epoch).

    Worker processes start with ``multiprocessing_context`` (the DataLoader's default: fork on
    Linux). A fork copies no running thread, and the locks a decode task holds would reach the
    child held, so a fork first waits until the readers' running tasks have finished (queued
    ones wait for it) and until the threads of closed readers have exited (their native exit
    takes library locks such as OpenCV's). "forkserver" avoids the question at some start-up
    cost, and is the default when the dataset reads URLs (object storage): obstore's I/O
    runtime does not survive a fork.

    Args:
        dataset: the ClipDataset or ImageDataset to iterate.
        workers: DataLoader worker processes (0: decode in this process).
        prefetch: batches in flight (per worker with ``workers > 0``; None: 4 in this process,
            2 per worker).
        lookahead: batches the consumer fetches ahead of the one it trains on (1: Lightning).
        pin_memory: pin the batches (None: when CUDA is available).
        timeout: seconds to wait for a worker's batch (0: forever).
        multiprocessing_context: how worker processes start (None: the DataLoader's default,
            or "forkserver" for URL sources).
        batches: batches per epoch (None: an endless stream). Epochs are counted in batches
            per rank: a run resumed on another world size or batch size keeps its epochs
            exact only if it gives each epoch the same number of samples (``batches`` times
            world size times batch size).
    """

    def __init__(
        self,
        dataset: BatchDataset,
        *,
        workers: int = 0,
        prefetch: int | None = None,
        lookahead: int = 0,
        pin_memory: bool | None = None,
        timeout: float = 0,
        multiprocessing_context: Any = None,
        batches: int | None = None,
    ) -> None:
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        if prefetch is None:
            prefetch = _IN_PROCESS_DEPTH if workers == 0 else 2
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {lookahead}")
        if batches is not None and batches < 1:
            raise ValueError(f"batches must be >= 1, got {batches}")
        self.dataset = dataset
        self.workers = workers
        self.prefetch = prefetch
        self.lookahead = lookahead
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        self.timeout = timeout
        self.multiprocessing_context = multiprocessing_context
        self.batches = batches
        # a dataset resumed before (``resume_at``, or another loader's ``load_state_dict``)
        # starts there: its batches before that point are no longer drawn
        self._position = dataset._origin[1]  # index of the next batch this loader yields
        self._floor = self._position  # where the current iteration started: state never lower
        self._ended = False  # the consumer asked past the end of an epoch: nothing is ahead
        self._live: weakref.ref[Generator[Any, None, None]] | None = None

    def __len__(self) -> int:
        """Batches per epoch; only with ``batches`` (the stream is endless otherwise)."""
        if self.batches is None:
            raise TypeError("an endless ClipLoader has no length: give batches=N for epochs")
        return self.batches

    def _next_batch(self) -> int:
        """The next batch the consumer needs (those fetched ahead count as unseen)."""
        ahead = 0 if self._ended else self.lookahead
        return max(self._floor, self._position - ahead)

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands (see the class docstring); opens the dataset's reader."""
        batch = self._next_batch()
        dataset = self.dataset
        samples = dataset.consumed(batch)
        return {
            "version": STATE_VERSION,
            "stream": dataset.stream_version,
            "seed": dataset.seed,
            "samples": samples,
            "source_samples": dataset.sample_stream().seen(samples).tolist(),
            "batch": batch,
            "sources": dataset.fingerprint(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a ``state_dict()`` (takes effect on the next iteration).

        The state brings its seed; it must come from the same sources (the same number of
        videos or images per source), and may come from another world size or batch. A state
        without ``version`` (kohakuclip before the global stream: the seed and a batch count)
        loads with a warning: the run continues at as many samples as that batch count makes
        with today's world size and batch, but the samples differ from those the old version
        would have drawn, so in epoch mode the epoch under way is not completed exactly.

        Args:
            state: what ``state_dict()`` returned.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"a loader state is a dict, got {type(state).__name__}")
        version = state.get("version")
        if version is None:
            seed, samples, batch, seen = self._legacy_state(state)
            stream = STREAM_VERSION
        elif version != STATE_VERSION:
            raise ValueError(
                f"loader state format version {version!r}: this kohakuclip reads {STATE_VERSION}"
            )
        else:
            _require(state, _STATE_KEYS, "a loader state")
            seed, samples, batch = (_whole(state, k) for k in ("seed", "samples", "batch"))
            seen = _whole(state, "source_samples")
            self._check_sources(state["sources"])
            stream = _whole(state, "stream", 1)  # states saved before it was recorded: 1
        self.dataset.resume_at(seed, samples, batch, seen, stream)
        self._stop_live()
        self._position = self._floor = batch
        self._ended = False

    def _check_sources(self, saved: Any) -> None:
        """ValueError unless the state's ``sources`` match this dataset's fingerprint (kind and
        counts always; names and the epoch mode where the state records them: states saved before
        they were recorded load as they did). Other mix weights load with a warning: the stream
        continues each source where it was with the new weights."""
        if not isinstance(saved, Mapping):
            raise ValueError(f"a loader state's sources are a dict, got {saved!r}")
        _require(saved, ("kind", "items"), "a loader state's sources")
        here = self.dataset.fingerprint()
        differ = [k for k in here if k in saved and saved[k] != here[k]]
        if "items" in differ or "kind" in differ:
            raise ValueError(
                f"this loader state belongs to other sources: it was saved for "
                f"{_describe(saved)}, this dataset reads {_describe(here)}"
            )
        if "names" in differ:
            raise ValueError(
                f"this loader state belongs to other sources: it was saved for "
                f"{_describe(saved)} and this dataset reads as many, but other items (or in "
                f"another order)"
            )
        if "epochs" in differ:
            raise ValueError(
                f"this loader state was saved with other settings: epochs {saved['epochs']!r} "
                f"(here {here['epochs']!r})"
            )
        if "weights" in differ:  # a new mix on resume (a curriculum): the stream allows it
            warnings.warn(
                f"resuming with other mix weights: {saved['weights']!r} when saved, "
                f"{here['weights']!r} now; each source continues where it was (its epoch, in "
                f"epoch mode) and the new weights pick the sources from here on",
                UserWarning,
                stacklevel=3,
            )

    def _legacy_state(self, state: Mapping[str, Any]) -> tuple[int, int, int, list[int]]:
        """(seed, samples, batch, per-source samples) of a state written before version 2."""
        _require(state, ("seed", "batch"), "a loader state (or one without a version)")
        batch, seed = int(state["batch"]), int(state["seed"])
        if batch < 0:
            raise ValueError(f"batch must be >= 0, got {batch}")
        warnings.warn(
            f"a loader state without a version (written before the global sample stream): "
            f"continuing after {batch} batches per rank with new samples, not the ones the old "
            f"version would have drawn",
            UserWarning,
            stacklevel=3,
        )
        dataset = self.dataset
        samples = batch * dataset.rank_world[1] * dataset.batch_size
        fresh = dataset._stream_from(seed, (0, 0, ()), dataset.source_sizes(), STREAM_VERSION)
        return seed, samples, batch, fresh.seen(samples).tolist()

    def __iter__(self) -> Generator[Any, None, None]:
        """Batches from ``state_dict()["batch"]`` on; an older iteration of this loader ends."""
        start = self._next_batch()
        self._stop_live()
        self._position = self._floor = start
        self._ended = False
        live = self._run(start)
        self._live = weakref.ref(live)  # a dropped iterator still closes (and drains) at once
        return live

    def _stop_live(self) -> None:
        """End the running iteration, if any: its in-flight batches finish, its workers exit."""
        live = self._live() if self._live is not None else None
        if live is not None:
            live.close()
        self._live = None

    def _batches(self, start: int) -> Iterator[Any]:
        dataset = self.dataset
        dataset._pin_ranks()
        # nothing is decoded past the epoch's end: the iteration stops there
        stop = None if self.batches is None else (start // self.batches + 1) * self.batches
        if self.workers == 0:
            return dataset._stream(start, 1, self.prefetch, pin=self.pin_memory, stop=stop)
        # the workers hand batches over as file descriptors, served from a socket in a
        # multiprocessing folder: made here first, it is theirs too (fork and pickling copy its
        # name) and goes when this process exits, after them; made in each worker, it would stay
        # in /tmp whenever a script's end terminates the workers mid-iteration
        multiprocessing.util.get_temp_dir()
        loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=self.workers,
            prefetch_factor=self.prefetch,
            pin_memory=self.pin_memory,
            timeout=self.timeout,
            multiprocessing_context=self.multiprocessing_context or _context_for(dataset),
            generator=torch.Generator(),  # keeps the global torch RNG untouched
        )
        dataset._start, dataset._stop = start, stop  # the workers copy them as they start
        try:
            return iter(loader)
        finally:  # iterating the dataset itself: from its resume point on, endless
            dataset._start = dataset._stop = None

    def _run(self, start: int) -> Generator[Any, None, None]:
        batches = self._batches(start)
        try:
            for batch in batches:
                self._position += 1
                # (batch, meta) whatever the workers: the DataLoader's conversion and pinning
                # turn a worker's tuple into a list
                yield tuple(batch) if isinstance(batch, list) else batch
                if self.batches is not None and self._position % self.batches == 0:
                    self._ended = True  # asked for the next batch: the last one was used
                    return
        finally:
            close = getattr(batches, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        """End the running iteration and close the dataset's reader in this process."""
        self._stop_live()
        self.dataset.close()


def _per_path(sources: Sequence[Any], counts: Any, paths: int) -> list[int]:
    """Items per given path from items per listed source: a folder of shards, a dataset view
    or a URL prefix lists several sources, each knowing its path (``origin``)."""
    origins = [src.origin for src in sources]
    per = np.bincount(origins, weights=np.asarray(counts, np.float64), minlength=paths)
    return [int(n) for n in per]


class ImageDataset(BatchDataset):
    """Batches of images, uint8 ``[batch_size, 3, size, size]`` in rgb mode.

    The ClipDataset of images: each item draws an image id (at random, or by the seeded epoch
    permutation with ``epochs=True``) and ``kohakuclip.ImageReader`` decodes it with the crop
    and flips the batch seed gives. ``reader_options`` go to the reader (size, crop, scale,
    ratio, hflip, vflip, mode, dct_scale, ...). With ``with_meta=True`` each batch comes as
    ``(images, meta)``: ``batch``, ``image`` (ids, int64 [B]), ``source`` (list of str), and from
    the writer's manifest.parquet beside a shard (or a gulp directory's ids and meta_data)
    ``key``, ``caption`` (lists, None where unknown) and ``meta`` (the parsed json sidecars or
    gulp meta_data, collated per key), and ``sample``, ``mix``, ``mix_name``, ``mode``,
    ``size``, ``crops``, ``flips``, ``colorspaces``, ``full_range`` as for clips.
    ``weights`` mix several sources as in ClipDataset. Its arguments are ``BatchDataset``'s.
    """

    kind = "images"

    def _open_reader(self, threads: int) -> Any:
        from kohakuclip.read.image_reader import ImageReader

        return ImageReader(self.mixture.flat, threads=threads, **self.reader_options)

    def _path_counts(self, reader: Any) -> list[int]:
        sources = reader._catalog.sources  # images numbered in path order
        return _per_path(sources, [src.count for src in sources], len(self.mixture.flat))

    def _item_name(self, reader: Any, index: int) -> str:
        return str(reader._catalog.member(index))

    def _make_item(self, reader: Any, index: int, rng: np.random.Generator) -> Any:
        return index

    def _batch_shape(self, reader: Any) -> tuple[int, ...]:
        return tuple(reader.batch_shape(self.batch_size))

    def _meta(self, reader: Any, batch: int, items: list[Any]) -> dict[str, Any]:
        origins = [reader.origin(i) for i in items]
        rows = [reader.metadata(i) for i in items]
        return {
            "batch": batch,
            "image": torch.tensor(items, dtype=torch.int64),
            "source": [source for source, _ in origins],
            "key": [row.get("key") for row in rows],
            "caption": [row.get("caption") for row in rows],
            "meta": collate_meta([_as_record(row.get("meta")) for row in rows]),
        }


_STATE_KEYS = ("seed", "samples", "source_samples", "batch", "sources")


def _require(state: Mapping[str, Any], keys: Sequence[str], what: str) -> None:
    """ValueError naming the ``keys`` missing from ``state``."""
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"not {what}: no {', '.join(map(repr, missing))}")


def _whole(state: Mapping[str, Any], key: str, default: int = 0) -> Any:
    """``state[key]`` (``default`` when absent) as an int, or a list of ints for a list;
    ValueError naming the key for anything else."""
    value = state.get(key, default)
    try:
        return [int(v) for v in value] if isinstance(value, list | tuple) else int(value)
    except (TypeError, ValueError):
        raise ValueError(f"a loader state's {key!r} must be whole numbers, got {value!r}") from None


def _describe(fingerprint: Mapping[str, Any]) -> str:
    items = list(fingerprint.get("items", []))
    kind = fingerprint.get("kind", "items")
    if len(items) == 1:
        return f"{items[0]} {kind}"
    return f"{len(items)} mixed sources of {' + '.join(map(str, items))} {kind}"


def _as_record(meta: Any) -> Mapping[str, Any]:
    """A json sidecar as per-key metadata (a non-object sidecar goes under "json")."""
    if meta is None:
        return {}
    return meta if isinstance(meta, Mapping) else {"json": meta}

"""PyTorch training layer: endless streams of whole batches, a loader, resume and ranks.

A dataset here is an ``IterableDataset`` whose items are whole batches. Batch ``i`` of a rank is a
pure function of ``(seed, rank, i)``: every random choice (which video, which frames, the crop and
flips) comes from numpy Generators keyed by ``(seed, rank, batch, item)``. So a DataLoader with any
number of workers yields the same batches (worker ``w`` of ``K`` makes batches ``w, w + K, ...``
and the DataLoader interleaves them in order), and resuming needs only the seed and a batch count.

Nothing that owns threads, decoders or memory maps crosses a fork: each process opens its own
reader on first use and never touches one it inherited.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from kohakuclip._yuv_torch import yuv_to_rgb
from kohakuclip.read.permute import permute
from kohakuclip.read.seeding import derive_seed, generator

__all__ = [
    "BatchDataset",
    "ClipDataset",
    "ClipLoader",
    "ImageDataset",
    "batch_seed",
    "collate_meta",
    "item_rng",
    "rank_and_world",
    "yuv_to_rgb",
]

Sampler = Callable[[int, int, np.random.Generator], Sequence[int]]
"""``sampler(n_video_frames, frames, rng) -> display-order frame indices`` (e.g. random_frames)."""

_CROP_FLIP_STREAM = 1
"""Tag that keeps the submit seed's stream apart from the per-item streams."""


def rank_and_world() -> tuple[int, int]:
    """(rank, world size): from torch.distributed when initialised, else RANK and WORLD_SIZE."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    if not 0 <= rank < world:
        raise ValueError(f"RANK={rank} does not fit WORLD_SIZE={world}")
    return rank, world


def item_rng(seed: int, rank: int, batch: int, item: int) -> np.random.Generator:
    """The Generator behind item ``item`` of batch ``batch`` of ``rank``: video and frame choice."""
    return generator(seed, rank, batch, item)


def batch_seed(seed: int, rank: int, batch: int) -> int:
    """The int seed a reader gets for one batch; it derives each item's crop and flips from it."""
    return derive_seed(seed, rank, batch, _CROP_FLIP_STREAM)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


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
    """Per-item metadata dicts to one dict of per-key batches (missing keys give None entries)."""
    keys: dict[str, None] = {}
    for record in records:
        keys.update(dict.fromkeys(record))
    return {key: _collate_values([record.get(key) for record in records]) for key in keys}


class BatchDataset(IterableDataset):
    """Base of the batch datasets: seeding, ranks, epochs, worker split, in-flight decoding.

    A subclass says how to open its reader, how many things it draws from, how one drawn index
    becomes a reader item, the batch shape and the per-batch metadata. ``epochs=False`` draws
    indices uniformly at random; ``epochs=True`` walks a seeded permutation per epoch, the ranks
    taking interleaved positions, so all ranks together see every index once per epoch.
    ``threads=None`` shares the usable CPUs between the DataLoader workers and the ranks on this
    node (LOCAL_WORLD_SIZE, as torchrun sets it).
    """

    def __init__(
        self,
        batch_size: int,
        *,
        epochs: bool = False,
        seed: int = 0,
        threads: int | None = None,
        with_meta: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        if rank is not None and world_size is not None and not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} does not fit world_size {world_size}")
        derive_seed(seed)  # validates the seed early
        self.batch_size = batch_size
        self.epochs = epochs
        self.seed = seed
        self.threads = threads
        self.with_meta = with_meta
        self._ranks = None if rank is None or world_size is None else (rank, world_size)
        self._start = 0
        self._reader: Any = None
        self._reader_pid = -1
        self._inherited: list[Any] = []

    # --- what a subclass provides -------------------------------------------------------------

    def _open_reader(self, threads: int) -> Any:
        raise NotImplementedError

    def _population(self, reader: Any) -> int:
        """How many things (videos, images) batches draw from."""
        return len(reader)

    def _make_item(self, reader: Any, index: int, rng: np.random.Generator) -> Any:
        raise NotImplementedError

    def _batch_shape(self, reader: Any) -> tuple[int, ...]:
        raise NotImplementedError

    def _meta(self, reader: Any, batch: int, items: list[Any], result: Any) -> dict[str, Any]:
        raise NotImplementedError

    # --- ranks and items ----------------------------------------------------------------------

    @property
    def rank_world(self) -> tuple[int, int]:
        """(rank, world size) as given, else as torch.distributed or the environment say."""
        return self._ranks if self._ranks is not None else rank_and_world()

    def _pin_ranks(self) -> None:
        """Fix the ranks in this object before worker processes copy it (they lack the group)."""
        self._ranks = self.rank_world

    def indices(self, batch: int, population: int) -> np.ndarray:
        """What batch ``batch`` of this rank draws: indices into the population, int64 [B]."""
        return np.array([index for index, _ in self._draws(batch, population)], dtype=np.int64)

    def _draws(self, batch: int, population: int) -> list[tuple[int, np.random.Generator]]:
        """Per item: the drawn index and its Generator (which then picks frames, etc.)."""
        if batch < 0:
            raise ValueError(f"batch must be >= 0, got {batch}")
        if population < 1:
            raise ValueError("nothing to draw from: the sources hold no videos or images")
        rank, world = self.rank_world
        size = self.batch_size
        rngs = [item_rng(self.seed, rank, batch, j) for j in range(size)]
        if not self.epochs:
            return [(int(rng.integers(population)), rng) for rng in rngs]
        positions = np.arange(batch * size, (batch + 1) * size, dtype=np.int64) * world + rank
        epoch, within = np.divmod(positions, population)
        picked = np.empty(size, dtype=np.int64)
        for e in np.unique(epoch):
            sel = epoch == e
            picked[sel] = permute(population, (self.seed, int(e)), within[sel])
        return list(zip(picked.tolist(), rngs))

    def items(self, batch: int) -> list[Any]:
        """The reader items of batch ``batch`` of this rank (opens this process's reader)."""
        return self._items(self._reader_here(), batch)

    def _items(self, reader: Any, batch: int) -> list[Any]:
        draws = self._draws(batch, self._population(reader))
        return [self._make_item(reader, index, rng) for index, rng in draws]

    def read_batch(self, batch: int) -> Any:
        """Decode batch ``batch`` of this rank on its own, as iteration would yield it."""
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
        return max(1, _usable_cpus() // (workers * max(1, ranks)))

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

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_reader=None, _reader_pid=-1, _inherited=[])
        return state

    # --- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        """Batches ``start, start + 1, ...``; in a DataLoader worker, its share of them."""
        info = get_worker_info()
        if info is None:
            return self._stream(self._start, 1, 2, pin=False)
        return self._stream(self._start + info.id, info.num_workers, 2, pin=False)

    def _stream(self, start: int, step: int, depth: int, pin: bool) -> Generator[Any, None, None]:
        """Batches ``start, start + step, ...`` with ``depth`` of them decoding at any time."""
        reader = self._reader_here()
        rank, _ = self.rank_world
        shape = self._batch_shape(reader)
        pending: deque[tuple[int, list[Any], torch.Tensor, Any]] = deque()
        batch = start
        try:
            while True:
                while len(pending) < depth:
                    items = self._items(reader, batch)
                    out = torch.empty(shape, dtype=torch.uint8, pin_memory=pin)
                    seed = batch_seed(self.seed, rank, batch)
                    pending.append((batch, items, out, reader.submit(items, out.numpy(), seed)))
                    batch += step
                index, items, out, job = pending.popleft()
                result = job.result()
                if result.video.ctypes.data != out.data_ptr():
                    out.copy_(torch.from_numpy(np.ascontiguousarray(result.video)))
                yield (out, self._meta(reader, index, items, result)) if self.with_meta else out
        finally:
            # let abandoned batches finish: a fork must never see a decode thread mid-work
            for *_, job in pending:
                _wait_quietly(job)


class ClipDataset(BatchDataset):
    """Batches of video clips, uint8 ``[batch_size, frames, 3, size, size]`` in rgb mode.

    Each item picks a video (at random, or by the epoch permutation with ``epochs=True``) and
    ``frames`` frames of it (``kohakuclip.clip`` with ``fps`` and ``spread``, or ``sampler``).
    ``reader_options`` go to ``kohakuclip.Reader`` (size, mode, crop, hflip, vflip, ...). With
    ``with_meta=True`` each batch comes as ``(video, meta)``: meta holds ``batch``, ``video`` (ids,
    int64 [B]), ``frames`` (int64 [B, T]), ``source`` and ``member`` (lists of str) and ``meta``
    (the per-video metadata recorded at write time, collated per key).
    """

    def __init__(
        self,
        sources: Any,
        batch_size: int,
        frames: int = 8,
        fps: float | None = None,
        spread: bool = False,
        epochs: bool = False,
        seed: int = 0,
        threads: int | None = None,
        *,
        sampler: Sampler | None = None,
        with_meta: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        **reader_options: Any,
    ) -> None:
        super().__init__(
            batch_size,
            epochs=epochs,
            seed=seed,
            threads=threads,
            with_meta=with_meta,
            rank=rank,
            world_size=world_size,
        )
        if frames < 1:
            raise ValueError(f"frames must be >= 1, got {frames}")
        if fps is not None and fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        self.sources = sources
        self.frames = frames
        self.fps = fps
        self.spread = spread
        self.sampler = sampler
        self.reader_options = reader_options
        self._lengths = np.zeros(0, dtype=np.int64)  # per video: frame count, 0 until looked up
        self._rates = np.zeros(0, dtype=np.float64)

    def _open_reader(self, threads: int) -> Any:
        from kohakuclip import Reader

        reader = Reader(self.sources, threads=threads, **self.reader_options)
        self._lengths = np.zeros(len(reader), dtype=np.int64)
        self._rates = np.zeros(len(reader), dtype=np.float64)
        return reader

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

    def _meta(self, reader: Any, batch: int, items: list[Any], result: Any) -> dict[str, Any]:
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


class ClipLoader:
    """Iterate a batch dataset in this process or in DataLoader workers, and keep resume state.

    ``workers=0`` decodes on the reader's threads in this process, ``prefetch`` batches in flight,
    each into a fresh tensor (pinned when CUDA is available: torch's caching host allocator makes
    that cheap). ``workers>0`` runs the dataset in DataLoader worker processes, each with its own
    reader. Either way the batches are the same. ``state_dict()`` holds the seed and the index of
    the next batch the consumer needs; ``lookahead`` is how many batches the consumer fetches ahead
    of the one it trains on (1 for Lightning), so those count as not yet seen. A new iteration
    starts at that batch, so an interrupted epoch and a resumed run continue identically.

    The stream is endless unless ``batches`` is given: then batches ``[k N, (k + 1) N)`` form
    epoch ``k``, an iteration ends at the next epoch boundary and ``len()`` is N (Lightning's
    max_epochs; with ``limit_train_batches`` instead, one batch repeats at each epoch boundary,
    as Lightning fetches ahead only within an epoch).

    Worker processes start with ``multiprocessing_context`` (the DataLoader's default: fork on
    Linux). A fork copies no running thread, so readers in this process must be idle then (this
    loader's in-process iterations drain before it forks); closed or dropped ones are safe too:
    closing waits until the OS has finished the threads, whose native exit takes library locks
    (OpenCV's thread-local storage) a child would inherit locked, and a fork first waits for
    any still exiting. "forkserver" avoids the question at some start-up cost.
    """

    def __init__(
        self,
        dataset: BatchDataset,
        workers: int = 0,
        prefetch: int = 2,
        lookahead: int = 0,
        pin_memory: bool | None = None,
        timeout: float = 0,
        multiprocessing_context: Any = None,
        batches: int | None = None,
    ) -> None:
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
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
        self._position = 0  # index of the next batch this loader yields
        self._floor = 0  # where the current iteration started: state never goes below it
        self._ended = False  # the consumer asked past the end of an epoch: nothing is ahead
        self._live: weakref.ref[Generator[Any, None, None]] | None = None

    def __len__(self) -> int:
        """Batches per epoch; only with ``batches`` (the stream is endless otherwise)."""
        if self.batches is None:
            raise TypeError("an endless ClipLoader has no length: give batches=N for epochs")
        return self.batches

    def state_dict(self) -> dict[str, int]:
        """The seed and the next batch the consumer needs."""
        ahead = 0 if self._ended else self.lookahead
        batch = max(self._floor, self._position - ahead)
        return {"seed": self.dataset.seed, "batch": batch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a ``state_dict()``: its seed and batch (takes effect on the next iter)."""
        batch, seed = int(state["batch"]), int(state["seed"])
        if batch < 0:
            raise ValueError(f"batch must be >= 0, got {batch}")
        self._stop_live()
        self.dataset.seed = seed
        self._position = self._floor = batch
        self._ended = False

    def __iter__(self) -> Generator[Any, None, None]:
        """Batches from ``state_dict()["batch"]`` on; an older iteration of this loader ends."""
        start = self.state_dict()["batch"]
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
        if self.workers == 0:
            return dataset._stream(start, 1, self.prefetch, pin=self.pin_memory)
        dataset._start = start
        loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=self.workers,
            prefetch_factor=self.prefetch,
            pin_memory=self.pin_memory,
            timeout=self.timeout,
            multiprocessing_context=self.multiprocessing_context,
            generator=torch.Generator(),  # keeps the global torch RNG untouched
        )
        return iter(loader)

    def _run(self, start: int) -> Generator[Any, None, None]:
        batches = self._batches(start)
        try:
            for batch in batches:
                self._position += 1
                yield batch
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


class ImageDataset(BatchDataset):
    """Batches of images, uint8 ``[batch_size, 3, size, size]`` in rgb mode.

    The ClipDataset of images: each item draws an image id (at random, or by the seeded epoch
    permutation with ``epochs=True``) and ``kohakuclip.ImageReader`` decodes it with the crop
    and flips the batch seed gives. ``reader_options`` go to the reader (size, crop, scale,
    ratio, hflip, vflip, mode, dct_scale, ...). With ``with_meta=True`` each batch comes as
    ``(images, meta)``: ``batch``, ``image`` (ids, int64 [B]), ``source`` (list of str), and from
    the writer's manifest.parquet beside a shard (or a gulp directory's ids and meta_data)
    ``key``, ``caption`` (lists, None where unknown) and ``meta`` (the parsed json sidecars or
    gulp meta_data, collated per key).
    """

    def __init__(
        self,
        sources: Any,
        batch_size: int,
        epochs: bool = False,
        seed: int = 0,
        threads: int | None = None,
        *,
        with_meta: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        **reader_options: Any,
    ) -> None:
        super().__init__(
            batch_size,
            epochs=epochs,
            seed=seed,
            threads=threads,
            with_meta=with_meta,
            rank=rank,
            world_size=world_size,
        )
        self.sources = sources
        self.reader_options = reader_options

    def _open_reader(self, threads: int) -> Any:
        from kohakuclip.read.image_reader import ImageReader

        return ImageReader(self.sources, threads=threads, **self.reader_options)

    def _make_item(self, reader: Any, index: int, rng: np.random.Generator) -> Any:
        return index

    def _batch_shape(self, reader: Any) -> tuple[int, ...]:
        return tuple(reader.batch_shape(self.batch_size))

    def _meta(self, reader: Any, batch: int, items: list[Any], result: Any) -> dict[str, Any]:
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


def _as_record(meta: Any) -> Mapping[str, Any]:
    """A json sidecar as per-key metadata (a non-object sidecar goes under "json")."""
    if meta is None:
        return {}
    return meta if isinstance(meta, Mapping) else {"json": meta}

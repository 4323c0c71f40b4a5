"""What ``Reader`` and ``ImageReader`` share: argument checks, ids, the per-process thread pool,
a batch's split into one share per thread, reading, closing, and renamed-name aliases.

Each reader keeps its own per-thread share task (the compiled hot path); this base only runs
once per batch.
"""

from __future__ import annotations

import numbers
import os
import threading
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Protocol, TypeVar, get_args

import numpy as np

from kohakuclip.decode.pixels import OutputMode
from kohakuclip.read.buffers import BatchBuffers
from kohakuclip.read.pool import OwnedPool, Pending, Task, ThreadPool
from kohakuclip.read.seeding import derive_seed, per_item_keys
from kohakuclip.storage.files import FileCache

__all__ = ["ReaderBase", "Sources", "merged_seconds", "renamed", "shown_sources", "warn_renamed"]


ItemT = TypeVar("ItemT")
BatchT = TypeVar("BatchT")
_R = TypeVar("_R", bound="ReaderBase[Any, Any]")

Sources = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def shown_sources(paths: Sequence[str]) -> str:
    """Sources as an error message names them: the first two, then how many more."""
    shown = ", ".join(paths[:2])
    return shown + (f" and {len(paths) - 2} more" if len(paths) > 2 else "") if paths else "[]"


class _Catalog(Protocol):
    def __len__(self) -> int: ...

    def ensure_process(self) -> None: ...


def merged_seconds(*parts: Mapping[str, float]) -> dict[str, float]:
    """Thread CPU seconds per stage, summed over ``parts`` (a thread state's stage clocks)."""
    total: dict[str, float] = {}
    for part in parts:
        for stage, seconds in part.items():
            total[stage] = total.get(stage, 0.0) + seconds
    return total


def warn_renamed(old: str, new: str) -> None:
    """A DeprecationWarning, pointing at the caller's caller, for a name that became ``new``."""
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


def renamed(old: str, new: str) -> Any:
    """A read-only attribute ``old`` that warns and returns the attribute ``new``."""

    def get(self: Any) -> Any:
        warn_renamed(f"{type(self).__name__}.{old}", new)
        return getattr(self, new)

    return property(get, doc=f"Deprecated: ``{new}``.")


class ReaderBase(ABC, Generic[ItemT, BatchT]):
    """The checks, pool, dispatch and lifetime of a reader of ``ItemT`` items into ``BatchT``
    batches. A subclass sets ``_catalog`` (with ``len`` and ``ensure_process``) and ``_pool``
    (an ``OwnedPool`` whose release closes the catalog's files)."""

    _noun = "item"  # what an id names, in messages
    _catalog: _Catalog
    _pool: OwnedPool

    def __init__(
        self,
        *,
        size: int,
        mode: OutputMode,
        threads: int,
        crop: str,
        crops: Any,
        hflip: float,
        vflip: float,
        seed: int | None,
    ) -> None:
        """Checks and keeps the arguments both readers take (``crops``: the crop Literal)."""
        if mode not in get_args(OutputMode):
            raise ValueError(f"mode must be one of {get_args(OutputMode)}, got {mode!r}")
        if crop not in get_args(crops):
            raise ValueError(f"crop must be one of {get_args(crops)}, got {crop!r}")
        if not _is_int(size) or size < 2:
            raise ValueError(f"size must be an int >= 2, got {size!r}")
        for name, p in (("hflip", hflip), ("vflip", vflip)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
        if not _is_int(threads) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        self.size, self.mode, self.threads, self.crop = int(size), mode, int(threads), crop
        self.hflip, self.vflip = hflip, vflip
        self._rng = np.random.default_rng(seed)
        self._buffers = BatchBuffers()
        self._compiled = True  # False: every item through the Python path (the tests' twin)
        self._pid = os.getpid()
        self._stats_lock = threading.Lock()
        self._stats: dict[str, int] = {}
        self._seconds_closed: dict[str, float] = {}  # stage clocks of pools closed before

    # -- counters ------------------------------------------------------------------------------
    def _add_counts(self, **counts: int) -> None:
        """Add to the counters ``stats()`` reports (any thread)."""
        with self._stats_lock:
            for name, value in counts.items():
                self._stats[name] = self._stats.get(name, 0) + value

    def _counters(self, names: Sequence[str]) -> dict[str, float]:
        """The counters ``names`` (0 until counted), then thread CPU seconds per stage summed
        over this process's decode threads (``seconds_<stage>``, from each thread state's
        ``stage_seconds()``)."""
        with self._stats_lock:
            s: dict[str, float] = {name: self._stats.get(name, 0) for name in names}
            states, closed = self._pool.states, self._seconds_closed
        stages = merged_seconds(closed, *(state.stage_seconds() for state in states))
        return {**s, **{f"seconds_{stage}": seconds for stage, seconds in stages.items()}}

    @staticmethod
    def _paths(sources: Sources) -> list[str]:
        """One source or a sequence of them, as a list of path strings."""
        paths = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
        return [os.fspath(p) for p in paths]

    # -- ids -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        """How many videos (images) the sources hold: ids run from 0 to ``len - 1``."""
        return len(self._catalog)

    def _check_id(self, item_id: Any) -> int:
        """``item_id`` as an int, or IndexError when it is not an id of this reader."""
        if not _is_int(item_id) or not 0 <= item_id < len(self._catalog):
            raise IndexError(
                f"{self._noun} id {item_id!r} out of range (reader has {len(self)} {self._noun}s)"
            )
        return int(item_id)

    # -- per process ---------------------------------------------------------------------------
    def _ensure_process(self) -> tuple[ThreadPool, FileCache]:
        """This process's threads and descriptors: threads, descriptors, locks and memory maps
        belong to one process, so a forked child renews them (``_forked``) before first use."""
        self._catalog.ensure_process()
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._stats_lock = threading.Lock()  # a lock held at the fork stays held
            self._forked()
        if not self._pool.running:  # a new pool: the clocks of one closed before still count
            with self._stats_lock:
                clocks = (state.stage_seconds() for state in self._pool.states)
                self._seconds_closed = merged_seconds(self._seconds_closed, *clocks)
        return self._pool.get(self._make_worker()), self._file_cache()

    def _forked(self) -> None:
        """Renew what the subclass itself holds per process (first use in a forked child)."""

    @abstractmethod
    def _make_worker(self) -> Callable[[], Any]:
        """The per-thread state factory (holding no reference to the reader)."""

    @abstractmethod
    def _file_cache(self) -> FileCache:
        """This process's descriptor cache."""

    # -- batches -------------------------------------------------------------------------------
    def _records(self, n: int, item_keys: Sequence[int] | None) -> dict[str, Any]:
        """A new batch's per-item records (filled in by the threads) besides pixels and items."""
        return dict(
            crops=np.zeros((n, 4), np.int32),
            flips=np.zeros((n, 2), bool),
            colorspaces=[""] * n,
            full_range=np.zeros(n, bool),
            mode=self.mode,
            item_keys=per_item_keys(item_keys, n),
        )

    def _dispatch(self, batch: BatchT, n: int, seed: int | None) -> Pending[BatchT]:
        """Queue the ``n`` items of ``batch``, one share per thread (``_shares``); item ``i`` of
        a batch read without ``item_keys`` takes its random choices from ``(seed, i)``."""
        if seed is None:
            seed = int(self._rng.integers(0, 2**63 - 1))
        derive_seed(seed)  # an int in [0, 2**64), checked here rather than in every item
        pool, files = self._ensure_process()
        shares = self._shares(batch, n)
        pending: Pending[BatchT] = Pending(len(shares), batch)
        pool.submit(self._tasks(batch, shares, seed, files), pending)
        return pending

    def _shares(self, batch: BatchT, n: int) -> list[list[int]]:
        """The item positions each thread takes: contiguous runs of equal length (within one).
        The split never changes what an item decodes to, only which thread writes it."""
        return [s.tolist() for s in np.array_split(np.arange(n), min(self.threads, n))]

    @abstractmethod
    def _tasks(
        self, batch: BatchT, shares: list[list[int]], seed: int, files: FileCache
    ) -> list[Task]:
        """One task per share of ``batch`` (item positions), run on a pool thread."""

    def _finish_share(
        self,
        batch: BatchT,
        later: list[int],
        read_one: Callable[[int], None],
        errors: dict[int, BaseException],
    ) -> None:
        """The end of a share task: ``read_one`` each item the compiled path left (``later``),
        then raise the first failing item's error (``errors``: position -> error), once the
        others are written."""
        for i in later:
            try:
                read_one(i)
            except Exception as e:
                errors[i] = e
        if errors:
            first = min(errors)
            error = errors[first]
            raise self._item_error(batch, first, error) from error

    @abstractmethod
    def _item_error(self, batch: BatchT, i: int, error: BaseException) -> Exception:
        """The error a failed item ``i`` of ``batch`` raises: it names the item."""

    @abstractmethod
    def submit(
        self,
        items: Sequence[ItemT],
        out: np.ndarray | None = None,
        seed: int | None = None,
        item_keys: Sequence[int] | None = None,
    ) -> Pending[BatchT]:
        """Queue a batch for decoding; returns at once."""

    def read(
        self,
        items: Sequence[ItemT],
        out: np.ndarray | None = None,
        seed: int | None = None,
        item_keys: Sequence[int] | None = None,
    ) -> BatchT:
        """Decode a batch and wait for it (``submit(...).result()``).

        Args:
            items: the items of the batch, as for ``submit``.
            out: receives the pixels (optional; shape ``batch_shape``, uint8, C-contiguous).
            seed: item ``i`` takes its crop and flips from ``(seed, i)`` (drawn when None).
            item_keys: one int in ``[0, 2**64)`` per item, as for ``submit``.
        """
        return self.submit(items, out, seed, item_keys).result()

    # -- lifetime ------------------------------------------------------------------------------
    def close(self) -> None:
        """Join the threads (queued batches finish first) and close the files; the next use
        starts new threads. A reader dropped without ``close()`` is closed when collected."""
        self._pool.close()

    def __enter__(self: _R) -> _R:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_int(value: Any) -> bool:
    """An integer (a numpy one too), not a bool or a float."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)

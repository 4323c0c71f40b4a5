"""GulpIO's loader: batches of a map-style dataset as numpy arrays, with no torch.

``from gulpio.loader import DataLoader`` becomes ``from kohakuclip.gulp.loader import
DataLoader``, with the same arguments (``batch_size``, ``shuffle``, ``num_workers``,
``drop_last``). Batch ``b`` of epoch ``e`` is a pure function of (seed, e, b): the order is a
permutation seeded from (seed, epoch) and the items' own randomness comes from the dataset's
``set_epoch``, so any number of workers gives the same batches. Workers are daemon processes:
one that dies fails the iteration instead of hanging it, and a script that stops (an exception
in the training loop included) takes them down at once instead of waiting for queued batches.
They start per epoch, or once with ``persistent_workers`` (what "spawn" and "forkserver", which
import everything again in each worker, save most on).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import pickle
import queue
import signal
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from multiprocessing.context import BaseContext
from typing import Any

import numpy as np

from kohakuclip.gulp.frames import GulpError
from kohakuclip.storage.remote import is_url

__all__ = ["DataLoader", "collate"]


def collate(items: Sequence[Any]) -> Any:
    """Items into a batch: arrays stacked, numbers into an array, strings listed, and tuples,
    lists and mappings collated field by field (as torch's ``default_collate``, in numpy).

    Args:
        items: the batch's items, all of the same structure.
    """
    first = items[0]
    if isinstance(first, np.ndarray):
        shapes = {item.shape for item in items}
        if len(shapes) > 1:
            raise GulpError(f"cannot stack items of different shapes {sorted(shapes)}")
        return np.stack(items)
    if isinstance(first, (bool, int, float, np.number, np.bool_)):
        return np.array(items)
    if isinstance(first, (str, bytes)) or first is None:
        return list(items)
    if isinstance(first, Mapping):
        return {key: collate([item[key] for item in items]) for key in first}
    if isinstance(first, (tuple, list)):
        if any(len(item) != len(first) for item in items):
            raise GulpError("cannot collate sequences of different lengths")
        fields = [collate(list(column)) for column in zip(*items)]
        if hasattr(first, "_fields"):  # a namedtuple keeps its type
            return type(first)(*fields)
        return tuple(fields) if isinstance(first, tuple) else fields
    return list(items)


def _load(
    dataset: Any, indices: list[int], epoch: int, collate_fn: Callable[[list[Any]], Any]
) -> Any:
    """One batch: the dataset at ``epoch``, its items at ``indices``, collated."""
    set_epoch = getattr(dataset, "set_epoch", None)
    if set_epoch is not None:
        set_epoch(epoch)
    return collate_fn([dataset[i] for i in indices])


def _default_context(dataset: Any) -> str | None:
    """ "forkserver" for a dataset that reads object storage (a URL ``data_path``, as the gulp
    datasets have): obstore's runtime does not survive a fork. None: the platform's default."""
    path = getattr(dataset, "data_path", None)
    return "forkserver" if isinstance(path, str) and is_url(path) else None


class _RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker (its ``__cause__`` in this process)."""


def _pickled_error(exc: Exception) -> bytes:
    """``exc`` pickled, or a RuntimeError naming it where it does not survive a round trip."""
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
    except Exception:
        data = pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
    return data


def _work(dataset: Any, collate_fn: Callable[[list[Any]], Any], tasks: Any, results: Any) -> None:
    """A worker process: (run, batch, indices, epoch) tasks in, (run, batch, ok, pickled batch
    or error, traceback) out (``run`` numbers the loader's iterations, so that a persistent
    worker's results of an abandoned one are told apart). Batches are pickled here, where a
    failure can still be reported (a queue pickles in a background thread that drops what it
    cannot send). Stopping is the loader's: SIGTERM takes its default action and Ctrl-C is
    ignored (a training script's handlers, inherited through a fork, must not keep a worker
    alive), and a worker whose loader's process is gone returns."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    while True:
        try:
            run, batch, indices, epoch = tasks.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                return
            continue
        try:
            loaded = _load(dataset, indices, epoch, collate_fn)
            results.put((run, batch, True, pickle.dumps(loaded, pickle.HIGHEST_PROTOCOL), ""))
        except Exception as exc:
            results.put((run, batch, False, _pickled_error(exc), traceback.format_exc()))


class _Results:
    """Where the workers' results go: one pipe, each message written whole, under a lock, by
    the worker's own thread. (A queue writes from a background thread: a worker that died
    (``os._exit``, a crash) while that thread wrote left half a message in the pipe, and the
    loader waited for the rest forever.)"""

    def __init__(self, context: Any) -> None:
        self.reader, self.writer = context.Pipe(duplex=False)
        self.lock = context.Lock()

    def put(self, result: tuple[Any, ...]) -> None:
        """Send ``result`` (in a worker; it waits while the loader is behind)."""
        data = pickle.dumps(result, pickle.HIGHEST_PROTOCOL)
        with self.lock:
            self.writer.send_bytes(data)

    def get(self, timeout: float, sentinels: list[Any]) -> Any:
        """The next result, or None when none came within ``timeout`` seconds or one of the
        processes behind ``sentinels`` exited first."""
        ready = multiprocessing.connection.wait([self.reader, *sentinels], timeout)
        return pickle.loads(self.reader.recv_bytes()) if self.reader in ready else None


class _Workers:
    """Worker processes (``_work``) and their task and result queues."""

    def __init__(
        self, context: Any, count: int, dataset: Any, collate_fn: Callable[[list[Any]], Any]
    ) -> None:
        self.tasks, self.results = context.Queue(), _Results(context)
        self.tasks.cancel_join_thread()  # never wait at exit to hand tasks nobody will take
        self.processes: list[Any] = []
        args = (dataset, collate_fn, self.tasks, self.results)
        try:
            for k in range(count):
                worker = context.Process(
                    target=_work, args=args, daemon=True, name=f"gulp-loader-{k}"
                )
                worker.start()
                self.processes.append(worker)
        except BaseException:
            self.stop()
            raise

    def dead(self) -> Any:
        """A worker that has exited, or None."""
        return next((w for w in self.processes if w.exitcode is not None), None)

    def drop_queued(self) -> None:
        """Take back the tasks no worker has started (an iteration was left)."""
        try:
            while True:
                self.tasks.get_nowait()
        except queue.Empty:
            pass

    def stop(self) -> None:
        """Terminate the workers (SIGTERM, then SIGKILL after 5 s) and wait for them."""
        for worker in self.processes:
            worker.terminate()
        for worker in self.processes:
            worker.join(timeout=5)
            if worker.exitcode is None:
                worker.kill()
                worker.join()
        self.processes = []


class DataLoader:
    """Batches of a map-style dataset (``len`` and ``[index]``, e.g. ``GulpVideoDataset``).

    Each iteration is one epoch: the next one after the last (0 first), or the one given to
    ``set_epoch``. It calls the dataset's ``set_epoch`` (where it has one) so that random clip
    starts and transforms change per epoch, in every worker alike.

    Args:
        dataset: the dataset; with workers, each iteration starts its own (unless
            ``persistent_workers``), which get the dataset through a fork or pickled ("spawn",
            "forkserver": a start-up per epoch).
        batch_size: items per batch.
        shuffle: visit the items in a seeded random order, a new one per epoch.
        sampler: the item indices in the order to visit them, drawn again each epoch (instead
            of ``shuffle``), e.g. weighted draws for class balance.
        batch_sampler: each epoch's batches as lists of indices (instead of ``batch_size``,
            ``shuffle``, ``sampler`` and ``drop_last``).
        num_workers: worker processes (0: load in this process).
        drop_last: leave out the last batch when it has fewer than ``batch_size`` items.
        collate_fn: items to a batch (default ``collate``: (frames, label) items become a
            uint8 [B, ...] array and an int64 [B] array).
        pin_memory: taken for GulpIO's signature (its positional order is kept up to here);
            True warns that it does nothing: the batches are numpy arrays, not tensors.
        seed: seed of the shuffled order.
        prefetch: batches in flight per worker.
        timeout: seconds to wait for a worker's batch, the workers' start-up included for
            the first (0: forever).
        multiprocessing_context: how workers start ("fork", "spawn", "forkserver" or a
            context; None: the platform's default, or "forkserver" for a dataset that reads
            object storage).
        persistent_workers: start the workers once and keep them for every epoch (until
            ``close``) instead of once per epoch; they keep the dataset as it was when they
            started. A new iteration replaces an unfinished one.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int = 1,
        shuffle: bool = False,
        sampler: Iterable[int] | None = None,
        batch_sampler: Iterable[Sequence[int]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] = collate,
        pin_memory: bool = False,
        drop_last: bool = False,
        *,
        seed: int = 0,
        prefetch: int = 2,
        timeout: float = 0,
        multiprocessing_context: str | BaseContext | None = None,
        persistent_workers: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if pin_memory:
            warnings.warn(
                "DataLoader(pin_memory=True) does nothing here: batches are numpy arrays (pin "
                "them after torch.from_numpy, or use kohakuclip.torch.ClipLoader)",
                stacklevel=2,
            )
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if timeout < 0:
            raise ValueError(f"timeout must be >= 0, got {timeout}")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers needs num_workers > 0")
        if sampler is not None and shuffle:
            raise ValueError("give shuffle=True or a sampler, not both")
        others = batch_size != 1 or shuffle or sampler is not None or drop_last
        if batch_sampler is not None and others:
            raise ValueError("batch_sampler replaces batch_size, shuffle, sampler and drop_last")
        self.dataset = dataset
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.seed = seed
        self.prefetch = prefetch
        self.timeout = timeout
        self.multiprocessing_context = multiprocessing_context
        self.persistent_workers = persistent_workers
        self.epoch = 0
        self._workers: _Workers | None = None  # the persistent ones
        self._run = 0  # iterations started: results of another one are not this one's

    def __len__(self) -> int:
        """Batches per epoch (with a sampler or batch sampler: as many as it has a length for)."""
        if self.batch_sampler is not None:
            return len(self.batch_sampler)  # type: ignore[arg-type]
        n = len(self.sampler if self.sampler is not None else self.dataset)  # type: ignore[arg-type]
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch``.

        Args:
            epoch: the epoch number (seeds the order and the dataset's draws).
        """
        self.epoch = epoch

    def batches(self, epoch: int) -> list[list[int]]:
        """The item indices of each batch of ``epoch``.

        Args:
            epoch: the epoch number.
        """
        if self.batch_sampler is not None:
            return [[int(i) for i in batch] for batch in self.batch_sampler]
        if self.sampler is not None:
            order = [int(i) for i in self.sampler]
        elif self.shuffle:
            order = (
                np.random.default_rng([self.seed, epoch]).permutation(len(self.dataset)).tolist()
            )
        else:
            order = list(range(len(self.dataset)))
        size = self.batch_size
        if self.drop_last:
            order = order[: len(order) // size * size]
        return [order[i : i + size] for i in range(0, len(order), size)]

    def __iter__(self) -> Iterator[Any]:
        epoch = self.epoch
        self.epoch += 1
        if self.num_workers == 0:
            return (
                _load(self.dataset, indices, epoch, self.collate_fn)
                for indices in self.batches(epoch)
            )
        return self._from_workers(epoch)

    def _start_workers(self) -> _Workers:
        """This iteration's workers: the persistent ones while they all live, else new ones."""
        if self._workers is not None and self._workers.dead() is None:
            return self._workers
        self.close()
        context: Any = self.multiprocessing_context or _default_context(self.dataset)
        if context is None or isinstance(context, str):
            context = multiprocessing.get_context(context)
        workers = _Workers(context, self.num_workers, self.dataset, self.collate_fn)
        if self.persistent_workers:
            self._workers = workers
        return workers

    def _from_workers(self, epoch: int) -> Iterator[Any]:
        batches = self.batches(epoch)
        if not batches:
            return
        self._run += 1
        run = self._run
        workers = self._start_workers()
        keep = self.persistent_workers
        arrived: dict[int, tuple[bool, bytes, str]] = {}
        sent = 0
        try:
            for b in range(len(batches)):
                if self.persistent_workers and run != self._run:
                    raise RuntimeError("a newer iteration of this DataLoader replaced this one")
                while sent < min(len(batches), b + self.num_workers * self.prefetch):
                    workers.tasks.put((run, sent, batches[sent], epoch))
                    sent += 1
                deadline = time.monotonic() + self.timeout if self.timeout else None
                while b not in arrived:
                    try:
                        got, ok, data, text = self._receive(workers, run, b, epoch, deadline)
                    except (RuntimeError, TimeoutError):
                        keep = False
                        raise
                    arrived[got] = (ok, data, text)
                ok, data, text = arrived.pop(b)
                if not ok:
                    raise pickle.loads(data) from _RemoteTraceback(text)
                yield pickle.loads(data)
        finally:
            if keep:
                if run == self._run:
                    workers.drop_queued()
            else:
                workers.stop()
                if workers is self._workers:
                    self._workers = None

    def close(self) -> None:
        """Stop the persistent workers (a later iteration starts new ones)."""
        workers, self._workers = self._workers, None
        if workers is not None:
            workers.stop()

    def __del__(self) -> None:
        if getattr(self, "_workers", None) is not None:
            self.close()

    def _receive(
        self, workers: _Workers, run: int, batch: int, epoch: int, deadline: float | None
    ) -> tuple[int, bool, bytes, str]:
        """The next result of iteration ``run`` from any worker (those of an earlier one are
        dropped); raises when a worker died or ``timeout`` passed."""
        sentinels = [w.sentinel for w in workers.processes]
        while True:
            got = workers.results.get(0.2, sentinels)
            if got is not None and got[0] == run:
                return tuple(got[1:])
            dead = workers.dead()
            if dead is not None:
                raise RuntimeError(
                    f"DataLoader worker {dead.name} exited (code {dead.exitcode}) "
                    f"while loading epoch {epoch}"
                )
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"batch {batch} of epoch {epoch} took longer than timeout={self.timeout} s"
                )

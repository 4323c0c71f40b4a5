"""A persistent pool of decode threads with one FIFO: batches queue back to back, no barrier."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np

T = TypeVar("T")
Task = Callable[[Any], None]


def batch_buffer(out: Any, shape: tuple[int, ...]) -> np.ndarray:
    """The caller's output buffer checked against the batch shape, or a new one."""
    if out is None:
        return np.empty(shape, dtype=np.uint8)
    arr = np.asarray(out)
    if arr.shape != shape or arr.dtype != np.uint8 or not arr.flags.c_contiguous:
        raise ValueError(
            f"out must be a C-contiguous uint8 array of shape {shape}, got {arr.dtype} {arr.shape}"
        )
    if not arr.flags.writeable:
        raise ValueError("out must be writeable")
    return arr


class Pending(Generic[T]):
    """A batch in flight: ``result()`` waits for every task and returns the batch, or raises the
    first error. Dropping it unread is safe: the tasks finish and the buffers are freed."""

    def __init__(self, tasks: int, value: T) -> None:
        self._left = tasks
        self._value = value
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        if tasks == 0:
            self._done.set()

    def _finish_task(self, error: BaseException | None) -> None:
        with self._lock:
            if error is not None and self._error is None:
                self._error = error
            self._left -= 1
            if self._left == 0:
                self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> T:
        if not self._done.wait(timeout):
            raise TimeoutError("batch not ready")
        if self._error is not None:
            raise self._error
        return self._value


class ThreadPool:
    """``threads`` daemon threads, each with its own state from ``make_state()``."""

    def __init__(self, threads: int, make_state: Callable[[], Any]) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._queue: queue.SimpleQueue[tuple[Task, Pending[Any]] | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(
                target=self._run, args=(make_state,), daemon=True, name=f"kohakuclip-{i}"
            )
            for i in range(threads)
        ]
        for t in self._threads:
            t.start()

    def _run(self, make_state: Callable[[], Any]) -> None:
        state = make_state()
        while True:
            item = self._queue.get()
            if item is None:
                return
            task, pending = item
            try:
                task(state)
            except BaseException as e:  # reported through the Pending, the thread lives on
                pending._finish_task(e)
            else:
                pending._finish_task(None)
            del item, task, pending  # an idle thread must not keep a dropped batch alive

    def submit(self, tasks: list[Task], pending: Pending[Any]) -> None:
        for task in tasks:
            self._queue.put((task, pending))

    def close(self) -> None:
        """Let queued work finish, then join the threads."""
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        self._threads = []

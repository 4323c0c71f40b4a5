"""A persistent pool of decode threads with one FIFO: batches queue back to back, no barrier.

Lifetime: a reader owns its pool through ``OwnedPool``, which holds nothing of the reader, so a
reader dropped without ``close()`` is collected and a finalizer joins its threads. At interpreter
exit an ``atexit`` hook stops every pool before anything its threads use is torn down: batches
still queued fail with ``PoolClosedError`` (so nothing waits on them), the clips being decoded
finish, the threads are joined.

A fork copies every lock but no thread, so no pool thread may be inside a task at a fork: a
task takes locks (the import lock of a module it imports on first use, OpenCV's and the
decoders' own), which the child would inherit held, and the first use of the same thing there
would wait forever. A fork therefore waits until every running task has finished (queued
tasks wait for the fork; a warning after ``FORK_WAIT`` seconds, then the fork goes ahead).
Nor may a thread be half-way out: its native exit (thread-local destructors) takes library
locks too. Closing a pool waits until the OS has finished its threads, and a fork first waits
for the threads of pools closed without waiting (from one of their own threads).
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from kohakuclip.errors import KohakuClipError

__all__ = ["OwnedPool", "Pending", "PoolClosedError", "Task", "ThreadPool"]


T = TypeVar("T")
Task = Callable[[Any], None]


class PoolClosedError(KohakuClipError, RuntimeError):
    """The pool stopped before it ran this work: its reader was closed or collected, the
    interpreter is exiting, or the batch was submitted in another process (before a fork)."""


class Pending(Generic[T]):
    """A batch in flight: ``result()`` waits for every task and returns the batch, or raises the
    first error. Dropping it unread is safe: the tasks finish and the buffers are freed."""

    def __init__(self, tasks: int, value: T) -> None:
        self._left = tasks
        self._value = value
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._pid = os.getpid()
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
        """The batch, once every task has run.

        Args:
            timeout: seconds to wait at most (``None``: until done).

        Raises:
            TimeoutError: not done within ``timeout``.
            PoolClosedError: the pool stopped first, or the batch belongs to another process
                (its threads do not exist in this one).
        """
        if not self._done.is_set() and self._pid != os.getpid():
            raise PoolClosedError(
                f"batch submitted in process {self._pid}: its threads do not exist in this one"
            )
        if not self._done.wait(timeout):
            raise TimeoutError("batch not ready")
        if self._error is not None:
            raise self._error
        return self._value


_live: weakref.WeakSet[ThreadPool] = weakref.WeakSet()  # pools whose threads may still run
_exiting = False

FORK_WAIT = 120.0
"""Seconds a fork waits for the running tasks before it warns and goes ahead."""


class _ForkGate:
    """Running tasks, counted, and a fork that waits for them: between ``before_fork`` and
    ``after_fork`` no task starts."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """No task running, no fork under way (also in a forked child: none of the parent's
        threads is there, and the lock may have been copied held)."""
        self._cond = threading.Condition()
        self._running = 0
        self._forks = 0  # forks under way (threads may fork at once)
        self._inside = threading.local()  # set on a thread while it runs a task

    def enter(self) -> None:
        """A task starts (waits while a fork is under way)."""
        with self._cond:
            while self._forks:
                self._cond.wait()
            self._running += 1
        self._inside.task = True

    def leave(self) -> None:
        """A task finished."""
        self._inside.task = False
        with self._cond:
            self._running -= 1
            self._cond.notify_all()

    def before_fork(self) -> None:
        own = 1 if getattr(self._inside, "task", False) else 0  # a task that forks
        deadline = time.monotonic() + FORK_WAIT
        with self._cond:
            self._forks += 1
            while self._running > own:
                left = deadline - time.monotonic()
                if left <= 0:
                    warnings.warn(
                        f"forking while {self._running - own} kohakuclip decode task(s) still "
                        f"run after {FORK_WAIT:.0f} s: the child may find their locks held",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                    break
                self._cond.wait(left)

    def after_fork_in_parent(self) -> None:
        with self._cond:
            self._forks -= 1
            self._cond.notify_all()


_gate = _ForkGate()


def _stop_pools_at_exit() -> None:
    """Interpreter exit: no new pools; every live pool drops its queue and joins its threads."""
    global _exiting
    _exiting = True
    for pool in list(_live):
        pool.close(cancel=True)


def _settle_before_fork() -> None:
    """Before a fork: the threads of closed pools finish exiting (first: they may still run
    queued tasks, which a closed gate would hold), then the running tasks finish (the queued
    ones wait). Idle threads hold no lock and are simply not copied."""
    for pool in list(_live):
        if pool._closed:
            pool._join()
    _gate.before_fork()


def _wait_exited(threads: list[threading.Thread], limit: float = 5.0) -> None:
    """Joined threads still run their native exit; wait until the OS has finished them."""
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        return
    deadline = time.monotonic() + limit
    for t in threads:
        path = f"{tasks}/{t.native_id}"
        while os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.0005)


# weakref.finalize registers its own exit hook on first use, which frees the native decoders
# still alive: make that happen now, so that this hook, registered after it, runs before it
# (atexit runs last in, first out) and no context is freed under a decoding thread.
weakref.finalize(_stop_pools_at_exit, lambda: None).atexit = False
atexit.register(_stop_pools_at_exit)
os.register_at_fork(
    before=_settle_before_fork,
    after_in_parent=_gate.after_fork_in_parent,
    after_in_child=_gate.reset,
)


class ThreadPool:
    """``threads`` daemon threads, each with its own state from ``make_state()`` (``states``
    lists them, in the order they were made)."""

    def __init__(self, threads: int, make_state: Callable[[], Any]) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if _exiting:
            raise PoolClosedError("the interpreter is exiting: no new decode threads")
        self._queue: queue.SimpleQueue[tuple[Task, Pending[Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False  # no more submits; the threads have their stop markers
        self._cancel = False  # queued tasks fail with PoolClosedError instead of running
        self._pid = os.getpid()
        self.states: list[Any] = []
        self._threads = [
            threading.Thread(
                target=self._run, args=(make_state,), daemon=True, name=f"kohakuclip-{i}"
            )
            for i in range(threads)
        ]
        _live.add(self)
        for t in self._threads:
            t.start()

    def _run(self, make_state: Callable[[], Any]) -> None:
        state: Any = None
        broken: BaseException | None = None
        try:
            state = make_state()
        except BaseException as e:  # every task this thread takes reports it
            broken = e
        else:
            with self._lock:
                self.states.append(state)
        while True:
            item = self._queue.get()
            if item is None:
                return
            task, pending = item
            error: BaseException | None = None
            if self._cancel:
                error = PoolClosedError("the pool stopped before this batch ran")
            elif broken is not None:
                error = broken
            else:
                _gate.enter()
                try:
                    task(state)
                except BaseException as e:  # reported through the Pending, the thread lives on
                    error = e
                finally:
                    _gate.leave()
            pending._finish_task(error)
            del item, task, pending, error  # an idle thread must not keep a dropped batch alive

    def submit(self, tasks: list[Task], pending: Pending[Any]) -> None:
        with self._lock:
            if self._closed:
                raise PoolClosedError("the pool is closed")
            for task in tasks:
                self._queue.put((task, pending))

    def close(self, cancel: bool = False) -> None:
        """Stop the threads and join them. Safe to call again, from any thread and after a fork.

        Args:
            cancel: queued tasks fail with ``PoolClosedError`` instead of running (the tasks
                already running finish either way).

        A pool thread closing its own pool (a finalizer run on it) only tells the threads to
        stop; in a forked child, whose copy of the pool has no threads, nothing is joined.
        """
        with self._lock:
            if cancel:
                self._cancel = True
            if not self._closed:
                self._closed = True
                for _ in self._threads:
                    self._queue.put(None)
        self._join()

    def _join(self) -> None:
        """Join the threads of a closed pool, unless called on one of them (the pool then stays
        live: the exit and fork hooks join it later)."""
        if self._pid != os.getpid():
            _live.discard(self)
            return
        me = threading.current_thread()
        if any(t is me for t in self._threads):
            return
        for t in self._threads:
            t.join()
        _wait_exited(self._threads)
        _live.discard(self)


class OwnedPool:
    """The thread pool of one reader object, per process, tied to the reader's lifetime.

    Made on first use (``get``) and again in a forked child (a pool is never used across a
    fork); stopped by ``close()`` or, when the reader is collected without it, by a finalizer.
    Holds no reference to the reader: ``release`` (run on every close, e.g. closing
    descriptors) and the ``make_state`` given to ``get`` must not hold one either.
    """

    def __init__(self, owner: object, threads: int, release: Callable[[], None]) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self._release = release
        self._pool: ThreadPool | None = None
        self._pid = -1
        self._states: list[Any] = []
        finalizer = weakref.finalize(owner, self.close)
        finalizer.atexit = False  # the exit hook stops the threads; the OS takes the rest

    def get(self, make_state: Callable[[], Any]) -> ThreadPool:
        """This process's pool, started on first use with a state per thread from
        ``make_state`` (which must hold no reference to the owner)."""
        if self._pool is None or self._pid != os.getpid():
            self._pool = ThreadPool(self.threads, make_state)
            self._pid = os.getpid()
            self._states = self._pool.states
        return self._pool

    @property
    def running(self) -> bool:
        """Whether this process's pool is started (and not closed since)."""
        return self._pool is not None and self._pid == os.getpid()

    @property
    def states(self) -> list[Any]:
        """The per-thread states of this process's latest pool, kept after ``close()`` (for
        statistics); empty before first use and in a forked child until its own pool starts."""
        return list(self._states) if self._pid == os.getpid() else []

    def close(self) -> None:
        """Join this process's threads (queued work finishes first) and run ``release``."""
        pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.close()
        self._release()

"""The decode pool on its own: tasks run on per-thread states, the first error of a batch wins
and the others still run, a dropped Pending is harmless, close joins the threads."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np
import pytest

from kohakuclip.read.pool import Pending, ThreadPool


def _pool(threads: int = 2) -> ThreadPool:
    return ThreadPool(threads, lambda: {"thread": threading.current_thread().name, "ran": 0})


def test_tasks_run_on_their_thread_s_own_state() -> None:
    pool = _pool(2)
    seen: list[str] = []
    lock = threading.Lock()

    def task(state: dict) -> None:
        state["ran"] += 1
        time.sleep(0.01)
        with lock:
            seen.append(state["thread"])

    pending: Pending[str] = Pending(8, "value")
    pool.submit([task] * 8, pending)
    assert pending.result(timeout=30) == "value"
    assert len(seen) == 8 and set(seen) <= {"kohakuclip-0", "kohakuclip-1"}
    pool.close()


def test_the_first_error_wins_and_the_other_tasks_still_run() -> None:
    pool = _pool(1)  # one thread: tasks run in submission order
    ran: list[int] = []

    def task(k: int):
        def run(state: dict) -> None:
            ran.append(k)
            if k in (1, 3):
                raise ValueError(f"task {k}")

        return run

    pending: Pending[None] = Pending(5, None)
    pool.submit([task(k) for k in range(5)], pending)
    with pytest.raises(ValueError, match="task 1"):
        pending.result(timeout=30)
    assert ran == [0, 1, 2, 3, 4]
    # the pool serves the next batch
    again: Pending[int] = Pending(1, 7)
    pool.submit([lambda state: None], again)
    assert again.result(timeout=30) == 7
    pool.close()


def test_a_dropped_pending_finishes_and_frees_its_batch() -> None:
    pool = _pool(1)
    gate = threading.Event()
    buffer = np.zeros(1 << 20, np.uint8)
    alive = weakref.ref(buffer)
    pending: Pending[np.ndarray] = Pending(1, buffer)
    pool.submit([lambda state: gate.wait(10)], pending)
    del pending, buffer
    gate.set()
    done: Pending[None] = Pending(1, None)  # queued behind the dropped batch
    pool.submit([lambda state: None], done)
    done.result(timeout=30)
    gc.collect()
    assert alive() is None
    pool.close()


def test_close_lets_queued_work_finish_and_joins_the_threads() -> None:
    pool = _pool(2)
    pending: Pending[None] = Pending(4, None)
    pool.submit([lambda state: time.sleep(0.02)] * 4, pending)
    pool.close()
    assert pending.done()
    assert not [t for t in threading.enumerate() if t.name.startswith("kohakuclip-")]


def test_result_times_out_while_work_is_running() -> None:
    pool = _pool(1)
    gate = threading.Event()
    pending: Pending[None] = Pending(1, None)
    pool.submit([lambda state: gate.wait(10)], pending)
    with pytest.raises(TimeoutError):
        pending.result(timeout=0.05)
    gate.set()
    pending.result(timeout=30)
    pool.close()

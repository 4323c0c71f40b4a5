"""The benchmark's GIL counter (benchmarks/_gil_count.py) counts real takes of the GIL.

Each check runs a child interpreter with the shim preloaded, under a timeout; the expected
counts come from what the child's threads do (each ``time.sleep(0)`` or ``os.stat`` releases
and retakes the GIL; a thread inside ``time.sleep(0.2)`` or a nogil numba loop holds none).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from benchmarks import _gil_count
from tests.paths import child_env

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc missing: shim not built")

N = 500

CHILD = r"""
import json, os, sys, threading, time
import numba
from benchmarks._gil_count import GilCounter, difference

@numba.njit(nogil=True, cache=False)
def spin(n):
    acc = 0.0
    for i in range(n):
        acc += (i * 7 % 13) * 0.5
    return acc

spin(10)  # compile here, on the main thread
n_spin = 1
while True:  # a nogil call of ~0.2 s
    t0 = time.perf_counter(); spin(n_spin); dt = time.perf_counter() - t0
    if dt > 0.05: n_spin = int(n_spin * 0.2 / dt); break
    n_spin *= 4

counter = GilCounter()
ids = {}
finished = []
release = threading.Event()
def job(name, fn):
    def run():
        ids[name] = threading.get_native_id()
        fn()
        finished.append(name)
        release.wait()  # alive, so that its name still maps
    return threading.Thread(target=run, name=name)

jobs = [
    job("sleep0", lambda: [time.sleep(0) for _ in range(N)]),
    job("stat", lambda: [os.stat(".") for _ in range(N)]),
    job("long_sleep", lambda: time.sleep(0.2)),
    job("nogil", lambda: spin(n_spin)),
]
before = counter.takes()
for t in jobs:
    t.start()
end = time.perf_counter() + 0.3
x = 0
while time.perf_counter() < end:  # the main thread competes for the GIL meanwhile
    x += 1
while len(finished) < len(jobs):
    time.sleep(0.01)
takes = difference(counter.takes(), before)
named = counter.by_name(counter.takes())
release.set()
for t in jobs:
    t.join()
print(json.dumps({
    "threads": {name: takes.get(tid, 0) for name, tid in ids.items()},
    "named": {k: v for k, v in named.items() if k in ids},
}))
"""


def _run(env: dict[str, str], code: str = CHILD) -> subprocess.CompletedProcess[str]:
    code = f"N = {N}\n" + code
    return subprocess.run(
        [sys.executable, "-c", code], env=child_env(env), capture_output=True, text=True, timeout=90
    )


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    return _gil_count.build(str(tmp_path_factory.mktemp("gil")))


def test_counts_takes_per_thread(lib: str) -> None:
    proc = _run(_gil_count.preload_env(lib))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    threads = out["threads"]
    # one take per release, plus the thread's start and, on a loaded machine, a few forced
    # switches (a thread descheduled while holding the GIL past the switch interval)
    assert N <= threads["sleep0"] <= N + N // 20 + 3
    assert N <= threads["stat"] <= N + N // 20 + 3
    # a thread that holds no GIL while it waits / computes takes it about once
    assert threads["long_sleep"] <= 5
    assert threads["nogil"] <= 5
    # names of live threads map to their counts
    assert out["named"]["sleep0"] >= N
    assert out["named"]["nogil"] <= 5


def test_not_preloaded_is_a_clear_error(lib: str) -> None:
    env = dict(os.environ, KC_GIL_COUNT_LIB=lib)
    env.pop("LD_PRELOAD", None)
    proc = _run(env, "from benchmarks._gil_count import GilCounter\nGilCounter()\n")
    assert proc.returncode != 0
    assert "not preloaded" in proc.stderr

"""How often each thread takes CPython's GIL: an LD_PRELOAD shim built at run time (benchmarks).

CPython (3.2 on, built with ``FORCE_SWITCHING``, the default) signals the GIL's
``switch_cond`` exactly once in every take of the GIL (``take_gil``), and the GIL's ``cond``
exactly once in every drop (``drop_gil``). The shim interposes ``pthread_cond_signal``.
Calibration finds the two condition variables: a window opened and closed with the GIL held
(``ctypes.PyDLL`` keeps it across the call) around ``n`` ``time.sleep(0)`` on one thread sees
that thread's signals only; the window's first signal is a drop (``cond``), its last a take
(``switch_cond``), and each must have been signalled ``n`` times, else calibration fails. From
then on each signal of ``switch_cond`` counts one take for the calling thread, keyed by its
kernel thread id (``threading.Thread.native_id``); threads the interpreter does not know (a
native library's own) are counted too but take the GIL only if they run Python.

Parent side::

    env = preload_env(build())               # LD_PRELOAD with the shim first
    subprocess.run([python, "child.py"], env=env, timeout=...)

Child side::

    counter = GilCounter()                   # finds the preloaded shim, calibrates
    before = counter.takes()                 # {native thread id: takes so far}
    ...
    after = counter.takes(); counter.by_name(after)   # {"kohakuclip-0": n, ...}
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SLOTS 4096
#define CAL_SLOTS 64

static atomic_long take_counts[SLOTS];
static atomic_int slot_tids[SLOTS];
static atomic_int slots_used;
static __thread int my_slot = -1;

static void *_Atomic take_cond; /* the GIL's switch_cond, once calibrated */
static atomic_long signals_seen; /* every signal through the shim: proves it is preloaded */

static atomic_int cal_tid; /* the calibrating thread, 0 when no window is open */
static void *cal_addr[CAL_SLOTS];
static long cal_count[CAL_SLOTS];
static int cal_used;
static void *cal_first, *cal_last;

static int (*real_signal)(pthread_cond_t *);

static int my_tid(void) { return (int)syscall(SYS_gettid); }

static int slot(void) {
    if (my_slot < 0) {
        int i = atomic_fetch_add(&slots_used, 1);
        if (i >= SLOTS) i = SLOTS - 1; /* overflow: shared, still atomic */
        atomic_store(&slot_tids[i], my_tid());
        my_slot = i;
    }
    return my_slot;
}

static void calibration_note(void *cond) {
    int i;
    if (!cal_first) cal_first = cond;
    cal_last = cond;
    for (i = 0; i < cal_used; i++)
        if (cal_addr[i] == cond) { cal_count[i]++; return; }
    if (cal_used < CAL_SLOTS) { cal_addr[cal_used] = cond; cal_count[cal_used++] = 1; }
}

int pthread_cond_signal(pthread_cond_t *cond) {
    if (!real_signal)
        real_signal = (int (*)(pthread_cond_t *))dlsym(RTLD_NEXT, "pthread_cond_signal");
    atomic_fetch_add_explicit(&signals_seen, 1, memory_order_relaxed);
    if ((void *)cond == atomic_load_explicit(&take_cond, memory_order_relaxed) && cond)
        atomic_fetch_add_explicit(&take_counts[slot()], 1, memory_order_relaxed);
    else if (atomic_load_explicit(&cal_tid, memory_order_relaxed)
             && atomic_load(&cal_tid) == my_tid())
        calibration_note(cond);
    return real_signal(cond);
}

long gilcount_signals_seen(void) { return atomic_load(&signals_seen); }

void gilcount_calibrate_begin(void) {
    cal_used = 0; cal_first = cal_last = 0;
    atomic_store(&take_cond, (void *)0);
    atomic_store(&cal_tid, my_tid());
}

/* Closes the window; out[0..3] = signals of the first cond, of the last, distinct conds, and
   whether first != last. Returns 0 when both were signalled n times, else -1. */
int gilcount_calibrate_end(long n, long *out) {
    long first_n = 0, last_n = 0;
    int i;
    atomic_store(&cal_tid, 0);
    for (i = 0; i < cal_used; i++) {
        if (cal_addr[i] == cal_first) first_n = cal_count[i];
        if (cal_addr[i] == cal_last) last_n = cal_count[i];
    }
    out[0] = first_n; out[1] = last_n; out[2] = cal_used; out[3] = cal_first != cal_last;
    if (cal_first == cal_last || first_n != n || last_n != n) return -1;
    atomic_store(&take_cond, cal_last);
    return 0;
}

/* Copies up to max (thread id, takes) pairs; returns how many slots are in use. */
int gilcount_snapshot(int *tids, long *counts, int max) {
    int used = atomic_load(&slots_used), i;
    if (used > SLOTS) used = SLOTS;
    for (i = 0; i < used && i < max; i++) {
        tids[i] = atomic_load(&slot_tids[i]);
        counts[i] = atomic_load(&take_counts[i]);
    }
    return used;
}
"""


class GilCountError(RuntimeError):
    """The shim could not be built, is not preloaded, or did not calibrate."""


def build(directory: str | None = None) -> str:
    """Compile the shim with gcc (once per source text) and return the shared library's path.

    Args:
        directory: where to put it (default: a folder in the system temp directory).
    """
    gcc = shutil.which("gcc")
    if gcc is None:
        raise GilCountError("gcc not found: the GIL counter is compiled at run time")
    digest = hashlib.sha256(SOURCE.encode()).hexdigest()[:16]
    directory = directory or os.path.join(tempfile.gettempdir(), "kc-gil-count")
    os.makedirs(directory, exist_ok=True)
    lib = os.path.join(directory, f"libgilcount-{digest}.so")
    if os.path.exists(lib):
        return lib
    src = os.path.join(directory, f"gilcount-{digest}.c")
    with open(src, "w") as f:
        f.write(SOURCE)
    tmp = f"{lib}.{os.getpid()}.tmp"
    proc = subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-o", tmp, src, "-ldl", "-lpthread"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode:
        raise GilCountError(f"gcc failed on {src}:\n{proc.stderr[-2000:]}")
    os.replace(tmp, lib)
    return lib


def preload_env(lib: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: this process's) with ``lib`` first in LD_PRELOAD and
    ``KC_GIL_COUNT_LIB`` naming it, for the child to find.

    Args:
        lib: the path ``build()`` returned.
        env: the environment to extend; its own LD_PRELOAD entries are kept after the shim.
    """
    out = dict(os.environ if env is None else env)
    rest = out.get("LD_PRELOAD", "")
    out["LD_PRELOAD"] = f"{lib} {rest}".strip()
    out["KC_GIL_COUNT_LIB"] = lib
    return out


class GilCounter:
    """The preloaded shim inside this process, calibrated on construction.

    Args:
        lib: the shim's path (default: ``$KC_GIL_COUNT_LIB``, set by ``preload_env``).
        calibration: ``time.sleep(0)`` calls in the calibration window.
    """

    def __init__(self, lib: str | None = None, calibration: int = 200) -> None:
        lib = lib or os.environ.get("KC_GIL_COUNT_LIB")
        if not lib:
            raise GilCountError("no shim named: pass lib= or start the process with preload_env()")
        self._dll = ctypes.PyDLL(lib)  # PyDLL: calls keep the GIL, the window's edges hold it
        self._dll.gilcount_signals_seen.restype = ctypes.c_long
        self._dll.gilcount_calibrate_end.argtypes = [ctypes.c_long, ctypes.POINTER(ctypes.c_long)]
        self._dll.gilcount_snapshot.argtypes = [
            ctypes.POINTER(ctypes.c_int),
            ctypes.POINTER(ctypes.c_long),
            ctypes.c_int,
        ]
        self.calibrate(calibration)

    def calibrate(self, n: int = 200) -> None:
        """Find the GIL's condition variables from ``n`` drops and takes on this thread."""
        info = (ctypes.c_long * 4)()
        for _attempt in range(3):  # a signal handler or another thread's wake-up may intrude
            self._dll.gilcount_calibrate_begin()
            for _ in range(n):
                time.sleep(0)
            if self._dll.gilcount_calibrate_end(n, info) == 0:
                return
        if self._dll.gilcount_signals_seen() == 0:
            raise GilCountError(
                "the shim saw no pthread_cond_signal: it is not preloaded (use preload_env)"
            )
        raise GilCountError(
            f"calibration failed: {n} time.sleep(0) gave {info[0]} signals of the first "
            f"condition variable and {info[1]} of the last ({info[2]} distinct); this "
            "interpreter's GIL does not signal as CPython's FORCE_SWITCHING GIL does"
        )

    def takes(self) -> dict[int, int]:
        """GIL takes so far per kernel thread id (every thread since calibration)."""
        cap = 4096
        tids, counts = (ctypes.c_int * cap)(), (ctypes.c_long * cap)()
        used = min(self._dll.gilcount_snapshot(tids, counts, cap), cap)
        out: dict[int, int] = {}
        for i in range(used):
            out[tids[i]] = out.get(tids[i], 0) + counts[i]
        return out

    @staticmethod
    def by_name(takes: dict[int, int]) -> dict[str, int]:
        """``takes`` keyed by the names of the live Python threads (others dropped)."""
        out: dict[str, int] = {}
        for t in threading.enumerate():
            if t.native_id in takes:
                out[t.name] = out.get(t.name, 0) + takes[t.native_id]
        return out


def difference(after: dict[int, int], before: dict[int, int]) -> dict[int, int]:
    """Takes between two ``GilCounter.takes()`` snapshots."""
    return {tid: n - before.get(tid, 0) for tid, n in after.items() if n - before.get(tid, 0)}

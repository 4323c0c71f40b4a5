"""Encoders keep the normal scheduling policy, also when the process runs as root.

SVT-AV1 (the AV1 encoder in PyAV's and imageio-ffmpeg's FFmpeg) moves every thread it starts,
and the thread that opens it, to ``SCHED_FIFO`` priority 99 whenever the effective user is
root, as it is in most containers. Forty real-time threads then outrank everything else on the
node: a thread that spin-waits starves the one it waits for, and a 2-core test runner hung
inside ``svt_av1_enc_get_packet`` with every thread real-time. Opening an encoder in
``normal_scheduling`` (``open_encoder``: an encoder's open in it) puts the threads it made
real-time back to ``SCHED_OTHER``; ``encoder_subprocess_setup`` does the same for an ffmpeg
subprocess before it starts, and ties the subprocess's life to the thread that started it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["encoder_subprocess_setup", "normal_scheduling", "open_encoder", "realtime_threads"]


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PR_CAPBSET_DROP = 24
_CAP_SYS_NICE = 23  # linux/capability.h: what setting a real-time policy needs


def realtime_threads(pid: int | None = None) -> set[int]:
    """Thread ids of this process (or of process ``pid``) that run under a real-time policy
    (Linux; empty elsewhere, or when the process is gone)."""
    if not hasattr(os, "sched_getscheduler"):
        return set()
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{'self' if pid is None else pid}/task")]
    except OSError:
        return set()
    found = set()
    for tid in tids:
        with contextlib.suppress(OSError):  # a thread may end while we look
            if os.sched_getscheduler(tid) in (os.SCHED_FIFO, os.SCHED_RR):
                found.add(tid)
    return found


@contextlib.contextmanager
def normal_scheduling() -> Iterator[None]:
    """Run the block (e.g. an encoder's open), then put every thread it moved to a real-time
    policy back to ``SCHED_OTHER``. Threads that were real-time before stay so."""
    before = realtime_threads()
    try:
        yield
    finally:
        for tid in realtime_threads() - before:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def open_encoder(context: Any) -> None:
    """Open a PyAV encoder's codec context in ``normal_scheduling``."""
    with normal_scheduling():
        context.open()


def encoder_subprocess_setup() -> Callable[[], None] | None:
    """A ``preexec_fn`` for an encoder subprocess (Linux): the child is killed when the thread
    that started it ends, so a writer killed outright (SIGKILL: the OOM killer, a scheduler's
    hard stop) leaves no encoder running on; run as root, it also drops the capability to set
    real-time policies, so the child's attempts fail and its threads stay ``SCHED_OTHER``.
    None where prctl is missing."""
    name = ctypes.util.find_library("c")
    if not hasattr(os, "getppid") or name is None:
        return None
    try:
        prctl = ctypes.CDLL(name, use_errno=True).prctl  # resolved here, before the fork
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    parent = os.getpid()

    def setup() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the writer died before the line above
            os._exit(1)
        if root:
            prctl(_PR_CAPBSET_DROP, _CAP_SYS_NICE, 0, 0, 0)

    return setup

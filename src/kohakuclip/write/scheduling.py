"""Encoders keep the normal scheduling policy, also when the process runs as root.

SVT-AV1 (the AV1 encoder in PyAV's and imageio-ffmpeg's FFmpeg) moves every thread it starts,
and the thread that opens it, to ``SCHED_FIFO`` priority 99 whenever the effective user is
root, as it is in most containers. Forty real-time threads then outrank everything else on the
node: a thread that spin-waits starves the one it waits for, and a 2-core test runner hung
inside ``svt_av1_enc_get_packet`` with every thread real-time. Opening an encoder in
``normal_scheduling`` (``open_encoder``: an encoder's open in it) puts the threads it made
real-time back to ``SCHED_OTHER``; ``drop_realtime_privilege`` does the same for an ffmpeg
subprocess before it starts.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["drop_realtime_privilege", "normal_scheduling", "open_encoder", "realtime_threads"]


_PR_CAPBSET_DROP = 24  # linux/prctl.h
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


def drop_realtime_privilege() -> Callable[[], None] | None:
    """A ``preexec_fn`` for an encoder subprocess run as root: it drops the capability to set
    real-time policies, so the child's attempts fail and its threads stay ``SCHED_OTHER``.
    None when not root (nothing to drop) or where prctl is missing."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    prctl = ctypes.CDLL(name, use_errno=True).prctl  # resolved here, before the fork
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int

    def drop() -> None:
        prctl(_PR_CAPBSET_DROP, _CAP_SYS_NICE, 0, 0, 0)

    return drop

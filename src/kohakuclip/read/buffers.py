"""Batch buffers, recycled once nothing holds them any more.

A batch of 16 clips x 16 frames at 256x256 rgb is 50 MB. Allocated afresh per batch, every
page of it is zeroed by the kernel on first touch: 3-7 % of a reader's CPU per output frame on
real footage (measured side by side, fresh buffers against a reused ``out=``). So each batch
array is a view of a pooled buffer through a small ctypes lease: numpy keeps the lease alive as
long as any array over it (slices, ``torch.from_numpy`` tensors) lives, and when the last one
goes a finalizer puts the buffer back. A buffer is handed out again only after that, so a batch
the caller still holds is never overwritten; a batch pickled to another process is a copy.
"""

from __future__ import annotations

import ctypes
import math
import weakref
from collections import deque
from typing import Any, cast

import numpy as np

__all__ = ["BatchBuffers"]


class BatchBuffers:
    """Where a reader's batch arrays come from (the caller's ``out``, or a recycled buffer).

    Args:
        idle: buffers kept for reuse while no batch uses them (the rest are freed).
    """

    def __init__(self, idle: int = 2) -> None:
        self._free: deque[np.ndarray] = deque(maxlen=idle)  # append / pop: atomic, any thread

    @property
    def idle(self) -> int:
        """Buffers waiting to be handed out again."""
        return len(self._free)

    def batch(self, out: Any, shape: tuple[int, ...]) -> np.ndarray:
        """The caller's ``out`` checked against ``shape``, or a uint8 array from the pool.

        Args:
            out: the caller's buffer, or None.
            shape: the batch's shape.
        """
        if out is not None:
            return _checked(out, shape)
        nbytes = math.prod(shape)
        raw = self._take(nbytes)
        lease: Any = (ctypes.c_uint8 * nbytes).from_buffer(cast(Any, raw))
        weakref.finalize(lease, self._free.append, raw).atexit = False
        return np.frombuffer(lease, np.uint8).reshape(shape)

    def _take(self, nbytes: int) -> np.ndarray:
        """A free buffer of ``nbytes`` to twice that (smaller or larger ones are dropped), or a
        new one."""
        while self._free:
            try:
                raw = self._free.pop()
            except IndexError:  # emptied by another thread in between
                break
            if nbytes <= len(raw) <= 2 * nbytes:
                return raw
        return np.empty(max(nbytes, 1), np.uint8)


def _checked(out: Any, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.asarray(out)
    if arr.shape != shape or arr.dtype != np.uint8 or not arr.flags.c_contiguous:
        raise ValueError(
            f"out must be a C-contiguous uint8 array of shape {shape}, got {arr.dtype} {arr.shape}"
        )
    if not arr.flags.writeable:
        raise ValueError("out must be writeable")
    return arr

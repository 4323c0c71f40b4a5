"""A bounded cache of open file descriptors shared by the decode threads."""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["FileCache", "open_regular"]


def open_regular(path: str) -> int:
    """A read-only descriptor of the regular file ``path``. Opened without blocking, so that a
    FIFO (or a device) with a video's name raises instead of waiting forever for a writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device)", path)
    return fd


class FileCache:
    """Keeps at most ``limit`` descriptors open (least recently used closed first); a descriptor
    in use by a thread is never closed under it."""

    def __init__(self, limit: int = 4096) -> None:
        if limit < 1:
            raise ValueError(f"open_files must be >= 1, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._open: OrderedDict[str, list[int]] = OrderedDict()  # path -> [fd, users]
        self._pid = os.getpid()

    def ensure_process(self) -> None:
        """After a fork, forget the parent's descriptors and lock (never used across a fork)."""
        if self._pid != os.getpid():
            self._lock = threading.Lock()
            self._open = OrderedDict()
            self._pid = os.getpid()

    @contextmanager
    def open(self, path: str) -> Iterator[int]:
        """A descriptor for ``path``, valid inside the ``with`` block."""
        with self._lock:
            slot = self._open.get(path)
            if slot is not None:
                slot[1] += 1
                self._open.move_to_end(path)
        if slot is None:
            fd = open_regular(path)
            with self._lock:
                slot = self._open.get(path)
                if slot is None:
                    slot = self._open[path] = [fd, 1]
                    fd = -1
                else:
                    slot[1] += 1
                self._evict()
            if fd >= 0:  # another thread opened it meanwhile
                os.close(fd)
        try:
            yield slot[0]
        finally:
            with self._lock:
                slot[1] -= 1
                if slot[1] == 0 and self._open.get(path) is not slot:
                    os.close(slot[0])
                self._evict()

    def _evict(self) -> None:
        for path in list(self._open):
            if len(self._open) <= self.limit:
                break
            slot = self._open[path]
            if slot[1] == 0:
                del self._open[path]
                os.close(slot[0])

    def __len__(self) -> int:
        return len(self._open)

    def close(self) -> None:
        """Close the idle descriptors and forget all (one in use closes when its user is done);
        the cache stays usable. In a forked child the parent's descriptors are only forgotten."""
        if self._pid != os.getpid():
            self.ensure_process()
            return
        with self._lock:
            for fd, users in self._open.values():
                if users == 0:
                    os.close(fd)
            self._open.clear()

"""A node-local cache of object-storage bytes, in fixed-size blocks, shared by processes.

Each block (``block`` bytes of one object version, the last one shorter) is one file named by
a hash of (URL, ETag, block number): a replaced object never serves old bytes, and every file
can be fetched again, so eviction only ever deletes cache files. Files are written to a
temporary name and renamed into place, so processes of a node (DataLoader workers, ranks) share
the directory without locks: readers see a whole block or none. A hit touches the file's
modification time; when the directory grows past ``size_limit`` bytes, the least recently used
blocks are deleted until it is back under 90% of it. A temporary file left by a process killed
mid-write is deleted by the first trim after ``STALE_TEMP`` seconds (a write takes milliseconds;
younger ones may still be another process's).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator

__all__ = ["STALE_TEMP", "BlockCache"]

_BLOCK_FOLDER = re.compile("[0-9a-f]{2}")


SUFFIX = ".kcblock"
_TEMP_PREFIX, _TEMP_SUFFIX = "kcblock-", ".tmp"
STALE_TEMP = 600.0
"""Seconds after which a cache's temporary file is a killed writer's leftover."""


class BlockCache:
    """Blocks of remote objects in ``directory`` (created if need be), at most about
    ``size_limit`` bytes of them."""

    def __init__(self, directory: str, size_limit: int, block: int = 1 << 18) -> None:
        if size_limit < block:
            raise ValueError(f"cache size {size_limit} is smaller than one block ({block})")
        self.directory, self.size_limit, self.block = os.fspath(directory), size_limit, block
        os.makedirs(self.directory, exist_ok=True)
        self._lock = threading.Lock()
        self._written = 0  # bytes added since the last trim (this process)
        self.trim()

    def _path(self, url: str, etag: str | None, number: int) -> str:
        key = hashlib.sha256(f"{url}\0{etag}\0{self.block}\0{number}".encode()).hexdigest()
        return os.path.join(self.directory, key[:2], key + SUFFIX)

    def get(self, url: str, etag: str | None, number: int, length: int) -> bytes | None:
        """Block ``number`` if cached whole (``length`` bytes), else None."""
        path = self._path(url, etag, number)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return None
        if len(data) != length:
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return data

    def put(self, url: str, etag: str | None, number: int, data: bytes | memoryview) -> None:
        """Store a block (atomically: a temporary file renamed into place)."""
        path = self._path(url, etag, number)
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=_TEMP_PREFIX, suffix=_TEMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return
        with self._lock:
            self._written += len(data)
            due = self._written > self.size_limit // 10
            if due:
                self._written = 0
        if due:
            self.trim()

    def trim(self) -> None:
        """Delete the least recently used blocks while the cache exceeds its limit, and stale
        temporary files."""
        blocks = []
        stale = time.time() - STALE_TEMP
        for entry, info in self._entries():
            if entry.name.endswith(SUFFIX):
                blocks.append((info.st_mtime, info.st_size, entry.path))
            elif _is_temporary(entry.name) and info.st_mtime < stale:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
        total = sum(size for _, size, _ in blocks)
        if total <= self.size_limit:
            return
        for _, size, path in sorted(blocks):
            if total <= self.size_limit * 9 // 10:
                break
            with contextlib.suppress(OSError):
                os.unlink(path)
                total -= size

    def size(self) -> int:
        """Bytes of blocks in the cache now."""
        return sum(info.st_size for entry, info in self._entries() if entry.name.endswith(SUFFIX))

    def _entries(self) -> Iterator[tuple[os.DirEntry[str], os.stat_result]]:
        """Every file in the block folders (named by two hex digits: a directory shared with
        other files is never walked further) with its stat; files other processes delete
        meanwhile are left out."""
        for folder in os.scandir(self.directory):
            if not (_BLOCK_FOLDER.fullmatch(folder.name) and folder.is_dir()):
                continue
            for entry in os.scandir(folder.path):
                try:
                    yield entry, entry.stat()
                except OSError:
                    continue


def _is_temporary(name: str) -> bool:
    """Whether ``name`` is one of the cache's own temporary files (``put``'s)."""
    return name.startswith(_TEMP_PREFIX) and name.endswith(_TEMP_SUFFIX)

"""Files read by byte ranges, local (``os.pread``) or in object storage (``storage.remote``).

Archive and mp4 parsing (zip tails, index members, moov boxes) reads through ``RangedFile``,
so a shard in a bucket opens with the same few reads as one on disk. ``Objects`` keeps each
source's remote objects (one HEAD each, or none where a listing already gave size and ETag).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol

from kohakuclip.storage.files import FileCache
from kohakuclip.storage.remote import (
    MissingObjectError,
    RemoteObject,
    is_url,
    local_path,
    open_object,
)

__all__ = ["Objects", "RangedFile", "open_local"]


class RangedFile(Protocol):
    """What parsers read: a name for messages, a size, and reads at an offset."""

    @property
    def name(self) -> str: ...

    @property
    def size(self) -> int: ...

    def read(self, offset: int, length: int) -> bytes: ...


class LocalFile:
    """A local file as a ``RangedFile`` (``os.pread`` on a descriptor the caller owns)."""

    def __init__(self, fd: int, name: str) -> None:
        self.fd, self.name = fd, name
        self.size = os.fstat(fd).st_size

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self.fd, length, offset)


@contextmanager
def open_local(path: str) -> Iterator[LocalFile]:
    """A local path as a ``RangedFile`` for the ``with`` block."""
    fd = os.open(path, os.O_RDONLY)
    try:
        yield LocalFile(fd, path)
    finally:
        os.close(fd)


class Objects:
    """The remote objects of a catalog's sources (with their ``storage_options``), opened once;
    local paths go through a ``FileCache``."""

    def __init__(
        self, files: FileCache, options: Mapping[str, Any] | None = None, cache: Any = None
    ) -> None:
        self.files = files
        self.options = dict(options or {})
        self.cache = cache  # a ``storage.cache.BlockCache`` for remote reads, or None
        self._lock = threading.Lock()
        self._objects: dict[str, RemoteObject] = {}

    def remote(self, url: str, meta: Mapping[str, Any] | None = None) -> RemoteObject:
        """The object at ``url``, opened with a HEAD the first time (none given ``meta``)."""
        with self._lock:
            obj = self._objects.get(url)
        if obj is None:
            obj = open_object(url, self.options, meta, self.cache)
            with self._lock:
                obj = self._objects.setdefault(url, obj)
        return obj

    def after_fork(self, files: FileCache) -> Objects:
        """The objects for a forked child, with its own local files. Remote objects are opened
        again there (``storage.remote`` refuses requests in a child forked after its parent
        made some: obstore's I/O runtime does not survive a fork)."""
        return Objects(files, self.options, self.cache)

    @contextmanager
    def open(self, path: str) -> Iterator[RangedFile]:
        """``path`` (local, ``file://`` or remote) as a ``RangedFile`` for the ``with`` block."""
        if is_url(path):
            yield self.remote(path)
            return
        with self.files.open(local_path(path)) as fd:
            yield LocalFile(fd, path)

    def read(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of ``path`` (fewer where the file ends first)."""
        with self.open(path) as f:
            return f.read(offset, length)

    def fetch_whole(self, url: str) -> bytes | None:
        """The whole object at ``url`` (a small sidecar, e.g. a manifest), None when there is
        none; other failures raise ``ObjectStoreError``."""
        try:
            obj = self.remote(url)
        except MissingObjectError:
            return None
        return obj.read(0, obj.size)

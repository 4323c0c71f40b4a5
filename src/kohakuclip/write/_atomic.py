"""Writing a file atomically, the one way every writer does it: into ``path + TEMP_SUFFIX``, then
flushed to disk and renamed to ``path``. A reader (or a crash) sees the old file or the whole new
one, never part of one; a write that fails removes its temporary file, and one cut by a kill
leaves only a name ending in ``TEMP_SUFFIX``, which the writers remove when they resume.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["TEMP_SUFFIX", "PendingFile", "naming", "replacing", "write_atomically"]


TEMP_SUFFIX = ".tmp"
"""Suffix of a file being written (a shard, a manifest, a skip log, a settings record)."""


@contextlib.contextmanager
def naming(path: str) -> Iterator[None]:
    """Re-raise an OSError that names no file (a full disk while writing) as one naming
    ``path``, the file being written."""
    try:
        yield
    except OSError as e:
        if e.filename is not None or e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, path) from e


class PendingFile:
    """A binary file written under a temporary name (default ``path + TEMP_SUFFIX``) until
    ``commit`` moves it into place; ``discard`` drops it instead."""

    def __init__(self, path: str, temp: str | None = None) -> None:
        self.path = path
        self.temp = temp or path + TEMP_SUFFIX
        self.file: BinaryIO = open(self.temp, "wb")  # closed by commit / discard

    def commit(self) -> None:
        """Flush and fsync (so a crash after the rename cannot leave it empty), close, and
        rename to ``path``; an error that names no file names ``path``."""
        with naming(self.path):
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
        os.replace(self.temp, self.path)

    def discard(self) -> None:
        """Close and remove the temporary file, whatever state a failed write left it in."""
        with contextlib.suppress(OSError, ValueError):  # its buffer may not fit on a full disk
            self.file.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.temp)


@contextlib.contextmanager
def replacing(path: str, temp: str | None = None) -> Iterator[BinaryIO]:
    """A ``PendingFile``'s file for the block to write: committed to ``path`` when the block
    ends, discarded when it raises (``temp``: another temporary name, e.g. one per part for a
    file that parts race to create)."""
    pending = PendingFile(path, temp)
    try:
        yield pending.file
        pending.commit()
    except BaseException:
        pending.discard()
        raise


def write_atomically(path: str, data: bytes, temp: str | None = None) -> None:
    """Write ``data`` as the whole of ``path`` (see the module doc); an error that names no
    file names ``path``."""
    with replacing(path, temp) as f, naming(path):
        f.write(data)

"""Tar archives: write members, locate member data without extracting.

A tar in object storage (any ``RangedFile``) is read by ranges: its index member, the last one
a ``ShardWriter`` writes, is found from the archive's tail (a few ranged reads, never a walk of
the headers); an index-less tar is listed header by header (one small read each).
"""

from __future__ import annotations

import io
import os
import tarfile
from typing import Any, BinaryIO

from kohakuclip.storage.ranged import RangedFile
from kohakuclip.storage.zip import ArchiveError, Member

__all__ = ["TarWriter", "find_tar_last_member", "list_tar"]


_BLOCK = tarfile.BLOCKSIZE
_TAIL = 1 << 16  # the first tail read; doubled until the last header is in it


class TarWriter:
    """Append members to a tar file, reporting where each member's data starts."""

    def __init__(self, fileobj: BinaryIO) -> None:
        self._tar = tarfile.open(fileobj=fileobj, mode="w", format=tarfile.GNU_FORMAT)
        self._fileobj = fileobj

    def add(self, name: str, data: bytes | memoryview) -> int:
        """Write one member; returns the absolute offset of its data."""
        info = tarfile.TarInfo(name)
        info.size = len(data)
        info.mode = 0o644
        start = self._fileobj.tell()
        self._tar.addfile(info, io.BytesIO(bytes(data)))
        return start + len(info.tobuf(tarfile.GNU_FORMAT))

    def close(self) -> None:
        self._tar.close()


class _RangedReader(io.RawIOBase):
    """A ``RangedFile`` as the seekable file object ``tarfile`` reads (one read per call)."""

    def __init__(self, f: RangedFile) -> None:
        self._f = f
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._f.size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self._f.read(self._pos, len(buffer))
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


def list_tar(source: str | os.PathLike[str] | RangedFile) -> list[Member]:
    """Every regular file of a tar archive (a path, or a ``RangedFile``: one read per header)
    with the absolute offset of its data.

    ``ArchiveError`` for an archive cut or damaged after its first header too, naming the last
    member read whole: ``tarfile`` takes a header it cannot parse for the archive's end, which
    would lose the members after it without a word."""
    where = os.fspath(source) if isinstance(source, (str, os.PathLike)) else source.name
    try:
        if isinstance(source, (str, os.PathLike)):
            tar = tarfile.open(where, mode="r:")
        else:
            fileobj = io.BufferedReader(_RangedReader(source), _BLOCK)
            tar = tarfile.open(fileobj=fileobj, mode="r:")
        with tar:
            infos = tar.getmembers()
            stop = tar.offset  # where the listing stopped: the end marker, if any
            raw: Any = tar.fileobj
            size = raw.seek(0, io.SEEK_END)
            raw.seek(stop)
            after = raw.read(_BLOCK)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ArchiveError(f"{where}: cannot read tar archive ({e})") from None
    last = f"member {infos[-1].name!r}" if infos else "its start"
    if infos and infos[-1].offset_data + infos[-1].size > size:
        raise ArchiveError(f"{where}: tar archive cut inside {last}")
    if after.strip(b"\0"):
        raise ArchiveError(f"{where}: tar archive damaged or cut after {last} (byte {stop})")
    return [Member(m.name, m.offset_data, m.size) for m in infos if m.isfile()]


def _header(block: bytes) -> tarfile.TarInfo | None:
    if block[257:262] != b"ustar":
        return None
    try:
        return tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError:
        return None


def find_tar_last_member(f: RangedFile) -> Member | None:
    """The last regular file of a tar archive, found from its tail: the highest header whose
    data reaches the end of the archive's content (the zero blocks after it); None for an empty
    archive or one not ending that way. Reads a tail of 64 KiB, doubled until the header is in
    it."""
    size = f.size
    window = min(size, _TAIL)
    while True:
        start = size - window
        tail = f.read(start, window)
        content_end = start + len(tail.rstrip(b"\0"))
        first = (start + _BLOCK - 1) // _BLOCK * _BLOCK
        last = (content_end - 1) // _BLOCK * _BLOCK
        for offset in range(last, first - 1, -_BLOCK):
            info = _header(tail[offset - start : offset - start + _BLOCK])
            if info is None:
                continue
            data = offset + _BLOCK
            if data + info.size < content_end or data + info.size > size:
                continue  # a block inside the data that looks like a header
            if not info.isfile():
                return None
            return Member(info.name, data, info.size)
        if window == size:
            return None
        window = min(size, window * 2)

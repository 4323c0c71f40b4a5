"""Stored zip archives: write members uncompressed, locate member data without extracting."""

from __future__ import annotations

import os
import struct
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

from kohakuclip.errors import KohakuClipError
from kohakuclip.storage.folder import unique_origins
from kohakuclip.storage.ranged import RangedFile, open_local

__all__ = [
    "ArchiveError",
    "Member",
    "ZipWriter",
    "find_zip_member",
    "list_zip",
    "member_origins",
]


_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")
_EOCD = struct.Struct("<4sHHHHIIH")
_CENTRAL = struct.Struct("<4sHHHHHHIIIHHHHHII")
_ZIP64_LOCATOR = struct.Struct("<4sIQI")
_ZIP64_EOCD = struct.Struct("<4sQHHIIQQQQ")


class ArchiveError(KohakuClipError, ValueError):
    """An archive that cannot be read (corrupt, truncated, compressed where it must be stored)."""


@dataclass(frozen=True)
class Member:
    """A member of an archive: its name and where its bytes lie in the archive file."""

    name: str
    offset: int  # absolute offset of the member's data
    size: int
    compressed: bool = False  # deflated zip member: data must be inflated, not sliced


def member_origins(where: str, names: list[str], separator: str) -> list[str]:
    """Each member's origin, ``where`` + ``separator`` + its name, made unique as
    ``unique_origins`` makes them (a name the archive repeats is marked ``#2``, ...), so that
    a resumed conversion tells repeated names apart.

    Args:
        where: the archive's path or URL.
        names: its members' names, in archive order.
        separator: between the archive and the name ("::" for videos, ":" for images).
    """
    return unique_origins([f"{where}{separator}{name}" for name in names])


class ZipWriter:
    """Append stored members to a zip file, reporting where each member's data starts."""

    def __init__(self, fileobj: BinaryIO) -> None:
        self._zip = zipfile.ZipFile(fileobj, "w", compression=zipfile.ZIP_STORED, allowZip64=True)

    def add(self, name: str, data: bytes | memoryview) -> int:
        """Write one member; returns the absolute offset of its data."""
        info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
        info.compress_type = zipfile.ZIP_STORED
        info.external_attr = 0o644 << 16
        self._zip.writestr(info, bytes(data))
        fp = self._zip.fp
        assert fp is not None
        return fp.tell() - len(data)

    def close(self) -> None:
        self._zip.close()


def _read_at(f: RangedFile, offset: int, size: int, path: str) -> bytes:
    data = f.read(offset, size)
    if len(data) != size:
        raise ArchiveError(f"{path}: truncated zip (wanted {size} bytes at {offset})")
    return data


def _central_directory(fd: RangedFile, path: str) -> tuple[bytes, int]:
    """Return (central directory bytes, number of entries) from the end of the archive: one
    read of the tail, and one of the directory where the tail does not hold it."""
    file_size = fd.size
    tail_size = min(file_size, 65536 + _EOCD.size)
    tail_start = file_size - tail_size
    tail = _read_at(fd, tail_start, tail_size, path)
    pos = tail.rfind(b"PK\x05\x06")
    if pos < 0 or pos + _EOCD.size > len(tail):
        raise ArchiveError(f"{path}: not a zip archive (no end of central directory)")
    _, _, _, _, count, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, pos)
    eocd_abs = file_size - tail_size + pos
    if count == 0xFFFF or cd_size == 0xFFFFFFFF or cd_offset == 0xFFFFFFFF:
        loc_abs = eocd_abs - _ZIP64_LOCATOR.size
        if loc_abs < 0:
            raise ArchiveError(f"{path}: zip64 locator missing")
        loc = _read_at(fd, loc_abs, _ZIP64_LOCATOR.size, path)
        sig, _, eocd64_abs, _ = _ZIP64_LOCATOR.unpack(loc)
        if sig != b"PK\x06\x07":
            raise ArchiveError(f"{path}: zip64 locator missing")
        rec = _ZIP64_EOCD.unpack(_read_at(fd, eocd64_abs, _ZIP64_EOCD.size, path))
        count, cd_size, cd_offset = rec[7], rec[8], rec[9]
    if cd_offset + cd_size > file_size:
        raise ArchiveError(f"{path}: truncated zip (central directory past the end)")
    if cd_offset >= tail_start and cd_offset + cd_size <= file_size:
        return tail[cd_offset - tail_start : cd_offset - tail_start + cd_size], count
    return _read_at(fd, cd_offset, cd_size, path), count


def _zip64_extra(extra: bytes, size: int, offset: int) -> tuple[int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            fields = extra[pos + 4 : pos + 4 + length]
            vals = list(struct.unpack_from(f"<{len(fields) // 8}Q", fields))
            if size == 0xFFFFFFFF and vals:
                vals.pop(0)  # uncompressed size
            if size == 0xFFFFFFFF and vals:
                size = vals.pop(0)
            if offset == 0xFFFFFFFF and vals:
                offset = vals.pop(0)
            break
        pos += 4 + length
    return size, offset


def _entries(cd: bytes, count: int, path: str) -> Iterator[tuple[str, int, int, int]]:
    """Yield (name, method, compressed size, local header offset) per central entry."""
    pos = 0
    for _ in range(count):
        if cd[pos : pos + 4] != b"PK\x01\x02" or pos + _CENTRAL.size > len(cd):
            raise ArchiveError(f"{path}: corrupt zip central directory")
        f = _CENTRAL.unpack_from(cd, pos)
        method, csize, name_len, extra_len, comment_len, local = (
            f[4],
            f[8],
            f[10],
            f[11],
            f[12],
            f[16],
        )
        start = pos + _CENTRAL.size
        name = cd[start : start + name_len].decode("utf-8", "replace")
        extra = cd[start + name_len : start + name_len + extra_len]
        csize, local = _zip64_extra(extra, csize, local)
        yield name, method, csize, local
        pos = start + name_len + extra_len + comment_len


def _data_offset(fd: RangedFile, local: int, path: str, name: str, size: int) -> int:
    """Where the ``size`` bytes of member ``name`` start (its local header at ``local``), which
    must lie inside the archive: sizes from a damaged directory would otherwise size buffers."""
    head = _read_at(fd, local, _LOCAL_HEADER.size, path)
    fields = _LOCAL_HEADER.unpack(head)
    if fields[0] != b"PK\x03\x04":
        raise ArchiveError(f"{path}: corrupt local header for member {name!r}")
    offset = local + _LOCAL_HEADER.size + fields[9] + fields[10]
    if offset + size > fd.size:
        raise ArchiveError(
            f"{path}: member {name!r} runs past the end of the archive "
            f"({offset + size} > {fd.size} bytes: a damaged central directory)"
        )
    return offset


@contextmanager
def _opened(source: str | os.PathLike[str] | RangedFile) -> Iterator[tuple[RangedFile, str]]:
    if isinstance(source, (str, os.PathLike)):
        with open_local(os.fspath(source)) as f:
            yield f, f.name
    else:
        yield source, source.name


def list_zip(source: str | os.PathLike[str] | RangedFile) -> list[Member]:
    """Every file member of a zip archive (a path, or a ``RangedFile``: a remote object) with
    the absolute offset of its data."""
    with _opened(source) as (fd, path):
        cd, count = _central_directory(fd, path)
        out = []
        for name, method, csize, local in _entries(cd, count, path):
            if name.endswith("/"):
                continue
            if method not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise ArchiveError(f"{path}: member {name!r} uses unsupported compression {method}")
            offset = _data_offset(fd, local, path, name, csize)
            out.append(Member(name, offset, csize, method == zipfile.ZIP_DEFLATED))
        return out


def find_zip_member(
    source: str | os.PathLike[str] | RangedFile, name: str, stored_only: bool = True
) -> Member | None:
    """Locate one member from the end of the central directory, without listing the archive
    (nor reading any other member's local header). ``stored_only``: a deflated member is an
    error (else it is returned, marked compressed)."""
    with _opened(source) as (fd, path):
        cd, _ = _central_directory(fd, path)
        key = name.encode()
        pos = cd.rfind(key)
        while pos >= 0:
            head = pos - _CENTRAL.size
            if head >= 0 and cd[head : head + 4] == b"PK\x01\x02":
                f = _CENTRAL.unpack_from(cd, head)
                if f[10] == len(key):
                    _, method, csize, local = next(_entries(cd[head:], 1, path))
                    if method != zipfile.ZIP_STORED and stored_only:
                        raise ArchiveError(f"{path}: member {name!r} must be stored")
                    offset = _data_offset(fd, local, path, name, csize)
                    return Member(name, offset, csize, method != zipfile.ZIP_STORED)
            pos = cd.rfind(key, 0, pos)
        return None

"""Tar archives: write members, locate member data without extracting."""

from __future__ import annotations

import io
import os
import tarfile
from typing import BinaryIO

from kohakuclip.storage.zip import ArchiveError, Member


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


def list_tar(path: str | os.PathLike[str]) -> list[Member]:
    """Every regular file of a tar archive with the absolute offset of its data."""
    path = os.fspath(path)
    try:
        with tarfile.open(path, mode="r:") as tar:
            return [Member(m.name, m.offset_data, m.size) for m in tar.getmembers() if m.isfile()]
    except (tarfile.TarError, OSError, EOFError) as e:
        raise ArchiveError(f"{path}: cannot read tar archive ({e})") from None

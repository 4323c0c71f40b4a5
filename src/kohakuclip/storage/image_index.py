"""The KCIMG1 index of an image shard: one 24-byte record per image, memory-mapped for reading.

The JSON header stays small (the image count and the codec names) so that opening a shard costs
the same for ten images or ten million; member names are not stored here, they come from the
zip's central directory when someone asks (``member_names``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from kohakuclip.formats import (
    IMAGE_CODECS,
    IMAGE_INDEX_MAGIC,
    IMAGE_RECORD,
    INDEX_MEMBER,
    IndexFormatError,
    decode_index,
    encode_index,
    read_index_header,
)
from kohakuclip.storage.ranged import RangedFile, open_local
from kohakuclip.storage.zip import ArchiveError, Member, find_zip_member, list_zip

__all__ = [
    "encode_image_index",
    "find_image_index",
    "image_records",
    "load_image_index",
    "map_image_index",
    "member_names",
]


def image_records(n: int) -> np.ndarray:
    """A zeroed table of ``n`` IMAGE_RECORDs to fill in."""
    return np.zeros(n, dtype=IMAGE_RECORD)


def encode_image_index(records: np.ndarray) -> bytes:
    """Serialize an image table as the bytes of the ``__index__.bin`` member."""
    if records.dtype != IMAGE_RECORD:
        raise TypeError(f"records must have dtype IMAGE_RECORD, got {records.dtype}")
    header: dict[str, Any] = {"images": len(records), "codecs": list(IMAGE_CODECS)}
    return encode_index(IMAGE_INDEX_MAGIC, header, records)


def decode_image_index(buf: bytes | memoryview | np.ndarray, where: str = "index") -> np.ndarray:
    """The records of a KCIMG1 index (a view of ``buf``), checked against its header.

    Records are not scanned here (that would read every page of a large table); each image's
    codec and byte range are checked when it is read."""
    header, records = decode_index(buf, IMAGE_INDEX_MAGIC, IMAGE_RECORD, where)
    count = header.get("images") if isinstance(header, dict) else None
    if count != len(records):
        raise IndexFormatError(f"{where}: header says {count} images, table has {len(records)}")
    codecs = header.get("codecs", list(IMAGE_CODECS))
    if list(codecs[: len(IMAGE_CODECS)]) != list(IMAGE_CODECS)[: len(codecs)]:
        raise IndexFormatError(f"{where}: unknown codec numbering {codecs!r}")
    return records


def find_image_index(source: str | os.PathLike[str] | RangedFile) -> tuple[Member, int] | None:
    """Locate the index member of an image shard (a zip path, or a ``RangedFile``: a remote
    object) and read its image count from the header, without reading the table; None when
    the shard has no index."""
    if isinstance(source, (str, os.PathLike)):
        with open_local(os.fspath(source)) as f:
            return find_image_index(f)
    path = source.name
    member = find_zip_member(source, INDEX_MEMBER)
    if member is None:
        return None
    where = f"{path}:{INDEX_MEMBER}"
    head = read_index_header(
        lambda at, n: source.read(member.offset + at, n), IMAGE_INDEX_MAGIC, member.size, where
    )
    count = head.header.get("images")
    records, rest = divmod(member.size - head.records, IMAGE_RECORD.itemsize)
    if rest:
        raise IndexFormatError(f"{where}: index records are not a multiple of 24 bytes")
    if count != records:
        raise IndexFormatError(f"{where}: header says {count} images, table has {records}")
    return member, records


def map_image_index(
    path: str | os.PathLike[str], member: Member | None = None
) -> np.ndarray | None:
    """Memory-map the index table of an image shard (a zip), or None when it has none.

    The index member is found from the end of the central directory (or given); only the pages
    of the table that are touched are ever read.
    """
    path = os.fspath(path)
    if member is None:
        found = find_image_index(path)
        if found is None:
            return None
        member = found[0]
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=member.offset, shape=(member.size,))
    return decode_image_index(raw, f"{path}:{INDEX_MEMBER}")


def load_image_index(source: RangedFile, member: Member) -> np.ndarray:
    """The index table of an image shard read whole (one read: for remote objects)."""
    raw = source.read(member.offset, member.size)
    if len(raw) != member.size:
        raise IndexFormatError(f"{source.name}:{INDEX_MEMBER}: truncated index")
    return decode_image_index(np.frombuffer(raw, np.uint8), f"{source.name}:{INDEX_MEMBER}")


def member_names(source: str | os.PathLike[str] | RangedFile, records: np.ndarray) -> list[str]:
    """Member name of each record, matched by data offset in the zip's central directory."""
    path = os.fspath(source) if isinstance(source, (str, os.PathLike)) else source.name
    by_offset = {m.offset: m.name for m in list_zip(source)}
    names = []
    for i, offset in enumerate(records["offset"].tolist()):
        name = by_offset.get(offset)
        if name is None:
            raise ArchiveError(f"{path}: index record {i} points at no member (offset {offset})")
        names.append(name)
    return names

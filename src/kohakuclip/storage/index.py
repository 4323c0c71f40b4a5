"""The framed index member shared by video (KCIDX1) and image (KCIMG1) shards."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import AV1_DEPS_KEY, FRAME_RECORD, VIDEO_INDEX_MAGIC, VideoEntry


class IndexFormatError(KohakuClipError, ValueError):
    """An index member that does not parse (wrong magic, truncated, inconsistent)."""


def encode_index(magic: bytes, header: dict[str, Any], records: np.ndarray) -> bytes:
    """Serialize ``magic | u64 len | JSON | pad to 8 | records``."""
    body = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    head = magic + struct.pack("<Q", len(body)) + body
    head += b"\0" * (-len(head) % 8)
    return head + np.ascontiguousarray(records).tobytes()


def decode_index(
    buf: bytes | memoryview | np.ndarray,
    magic: bytes,
    dtype: np.dtype,
    where: str = "index",
    trailer_key: str | None = None,
) -> tuple[dict[str, Any], np.ndarray]:
    """Parse a framed index from bytes or a uint8 memmap; records are a view, not a copy.

    ``trailer_key``: a header key giving the size of a blob after the records (not records)."""
    raw = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
    if len(raw) < 16 or bytes(raw[:8]) != magic:
        kind = magic.rstrip(b"\0").decode()
        raise IndexFormatError(f"{where}: not a {kind} index (bad magic)")
    (length,) = struct.unpack("<Q", bytes(raw[8:16]))
    if 16 + length > len(raw):
        raise IndexFormatError(f"{where}: truncated index header ({length} bytes announced)")
    try:
        header = json.loads(bytes(raw[16 : 16 + length]))
    except ValueError as e:
        raise IndexFormatError(f"{where}: index header is not JSON ({e})") from None
    start = (16 + length + 7) // 8 * 8
    end = len(raw)
    if trailer_key is not None and isinstance(header, dict) and trailer_key in header:
        trailer = header[trailer_key]
        if not isinstance(trailer, int) or not 0 <= trailer <= end - start:
            raise IndexFormatError(f"{where}: bad {trailer_key!r} size {trailer!r}")
        end -= trailer
    body = raw[start:end]
    if len(body) % dtype.itemsize:
        raise IndexFormatError(
            f"{where}: index records are not a multiple of {dtype.itemsize} bytes"
        )
    return header, body.view(dtype)


@dataclass(frozen=True)
class VideoIndex:
    """A parsed KCIDX1 index: per-video entries and the per-frame records (decode order)."""

    videos: list[VideoEntry]
    frames: np.ndarray  # FRAME_RECORD
    av1deps: bytes | np.ndarray | None = None  # KCAV1D table stored after the records

    def to_bytes(self) -> bytes:
        header: dict[str, Any] = {"videos": [v.to_json() for v in self.videos]}
        if self.av1deps is None:
            return encode_index(VIDEO_INDEX_MAGIC, header, self.frames)
        trailer = bytes(self.av1deps)
        header[AV1_DEPS_KEY] = len(trailer)
        return encode_index(VIDEO_INDEX_MAGIC, header, self.frames) + trailer

    @classmethod
    def from_buffer(cls, buf: bytes | memoryview | np.ndarray, where: str = "index") -> VideoIndex:
        header, frames = decode_index(buf, VIDEO_INDEX_MAGIC, FRAME_RECORD, where, AV1_DEPS_KEY)
        videos = video_entries(header, where)
        for v in videos:
            if v.row < 0 or v.row + v.n > len(frames):
                raise IndexFormatError(f"{where}: video {v.member!r} rows exceed the frame table")
        trailer = header.get(AV1_DEPS_KEY)
        if not trailer:
            return cls(videos, frames)
        raw = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
        return cls(videos, frames, raw[len(raw) - trailer :])


def video_entries(header: dict[str, Any], where: str = "index") -> list[VideoEntry]:
    """The per-video entries of a KCIDX1 JSON header."""
    try:
        return [VideoEntry.from_json(v) for v in header["videos"]]
    except (KeyError, TypeError, ValueError) as e:
        raise IndexFormatError(f"{where}: bad video entry in index header ({e!r})") from None

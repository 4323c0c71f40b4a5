"""The KCIDX1 index of a video shard (the framing itself, shared with KCIMG1 and KCAV1D, is
``formats.encode_index`` / ``formats.read_index_header``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kohakuclip.formats import (
    AV1_DEPS_KEY,
    FRAME_RECORD,
    VIDEO_INDEX_MAGIC,
    IndexFormatError,
    VideoEntry,
    decode_index,
    encode_index,
)

__all__ = ["IndexFormatError", "VideoIndex", "decode_index", "encode_index", "video_entries"]


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

"""The independent twin ``verify`` compares the reader with: a plain PyAV decode of a member.

Every packet is decoded in file order on one codec thread, so a decode error names the packet
(and so the frame) that caused it. Frames are identified by presentation time: the display index
of a frame is the rank of its pts among the pts of the packets the demuxer shows. Each frame is
reduced to a digest of its Y, U and V planes inside a crop window.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass, field

import av
import numpy as np

__all__ = ["ReferenceDecode", "Window", "plane_windows", "reference_decode", "window_digest"]


Window = tuple[int, int, int, int]
"""x, y, w, h of the luma window (x and y even); chroma covers ceil(x/2) .. ceil((x+w)/2)."""


def window_digest(y: np.ndarray, u: np.ndarray, v: np.ndarray) -> bytes:
    """A 16-byte digest of three planes (their shapes included)."""
    h = hashlib.blake2b(digest_size=16)
    for plane in (y, u, v):
        h.update(repr(plane.shape).encode())
        h.update(np.ascontiguousarray(plane).tobytes())
    return h.digest()


def plane_windows(
    planes: tuple[np.ndarray, np.ndarray, np.ndarray], window: Window
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The luma window of full Y, U, V planes of a 4:2:0 frame and its chroma windows."""
    x, y, w, h = window
    luma, u, v = planes
    cx0, cy0, cx1, cy1 = x // 2, y // 2, (x + w + 1) // 2, (y + h + 1) // 2
    return luma[y : y + h, x : x + w], u[cy0:cy1, cx0:cx1], v[cy0:cy1, cx0:cx1]


class MemberFile(io.RawIOBase):
    """A read-only file over ``size`` bytes at ``offset`` of ``path`` (an archive member)."""

    def __init__(self, path: str, offset: int, size: int) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_RDONLY)
        self._offset, self._size, self._pos = offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        length = max(0, min(len(buffer), self._size - self._pos))
        data = os.pread(self._fd, length, self._offset + self._pos) if length else b""
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


@dataclass
class ReferenceDecode:
    """What a PyAV decode of one member gave."""

    shown: int = 0  # packets the demuxer shows: the frames the member should decode to
    decoded: int = 0  # frames PyAV output
    digests: dict[int, bytes] = field(default_factory=dict)  # display index -> window digest
    errors: dict[int | None, str] = field(default_factory=dict)  # display index -> first error


def _planes(frame: av.VideoFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if frame.format.name not in ("yuv420p", "yuvj420p"):
        frame = frame.reformat(format="yuv420p")
    out = []
    for plane in frame.planes:
        rows = np.frombuffer(memoryview(plane), np.uint8).reshape(plane.height, plane.line_size)
        out.append(rows[:, : plane.width])
    return out[0], out[1], out[2]


def _shown_pts(path: str, offset: int, size: int) -> list[int]:
    with MemberFile(path, offset, size) as f, av.open(f, mode="r") as container:
        stream = container.streams.video[0]
        return sorted(
            {
                p.pts
                for p in container.demux(stream)
                if p.size and p.pts is not None and not p.is_discard
            }
        )


def reference_decode(
    path: str, offset: int, size: int, window: Window, wanted: set[int] | None = None
) -> ReferenceDecode:
    """Decode the member at ``offset`` of ``path`` with PyAV; digest the ``wanted`` frames
    (all when None) inside ``window``."""
    out = ReferenceDecode()
    try:
        rank = {pts: i for i, pts in enumerate(_shown_pts(path, offset, size))}
    except (av.FFmpegError, OSError, IndexError) as e:
        out.errors[None] = f"PyAV cannot demux the member: {e}"
        return out
    out.shown = len(rank)
    with MemberFile(path, offset, size) as f, av.open(f, mode="r") as container:
        stream = container.streams.video[0]
        stream.codec_context.thread_count = 1
        try:
            for packet in container.demux(stream):
                at = rank.get(packet.pts) if packet.pts is not None else None
                try:
                    frames = packet.decode()
                except av.FFmpegError as e:
                    out.errors.setdefault(at, f"PyAV decode error: {e}")
                    continue
                for frame in frames:
                    shown = rank.get(frame.pts) if frame.pts is not None else None
                    display = out.decoded if shown is None else shown
                    out.decoded += 1
                    if wanted is None or display in wanted:
                        planes = plane_windows(_planes(frame), window)
                        out.digests[display] = window_digest(*planes)
        except av.FFmpegError as e:
            out.errors.setdefault(None, f"PyAV demux error: {e}")
    return out

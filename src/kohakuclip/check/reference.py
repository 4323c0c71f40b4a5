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


_HALVED = {
    "yuv420p": (False, False),
    "yuvj420p": (False, False),
    "yuv422p": (False, True),
    "yuvj422p": (False, True),
    "yuv444p": (True, True),
    "yuvj444p": (True, True),
}
"""Per 8-bit planar format: whether its chroma is to be halved across and down for 4:2:0."""


def _halve(plane: np.ndarray, across: bool, down: bool) -> np.ndarray:
    """``plane`` at half the resolution on the chosen axes: each output sample the mean of its
    2 or 2x2 samples, rounded half up (an odd last column or row counted twice). This is the
    4:2:0 chroma the reader's ``yuv`` mode documents for 4:2:2 and 4:4:4 windows, done here
    on PyAV's planes (swscale's conversion filters differently)."""
    total = plane.astype(np.uint16)
    count = 1
    for axis, halve in ((1, across), (0, down)):
        if not halve:
            continue
        if total.shape[axis] % 2:
            total = np.concatenate([total, total.take([-1], axis=axis)], axis=axis)
        even = total.take(range(0, total.shape[axis], 2), axis=axis)
        odd = total.take(range(1, total.shape[axis], 2), axis=axis)
        total, count = even + odd, count * 2
    return ((total + count // 2) // count).astype(np.uint8)


def _frame_windows(
    frame: av.VideoFrame, window: Window
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Y, U, V of ``window`` with 4:2:0 chroma: a 4:2:0 frame's own (``plane_windows``), a
    4:2:2 or 4:4:4 window's chroma halved inside the window, others converted first."""
    halved = _HALVED.get(frame.format.name)
    if halved is None:
        frame, halved = frame.reformat(format="yuv420p"), (False, False)
    planes = []
    for plane in frame.planes:
        rows = np.frombuffer(memoryview(plane), np.uint8).reshape(plane.height, plane.line_size)
        planes.append(rows[:, : plane.width])
    if halved == (False, False):
        return plane_windows((planes[0], planes[1], planes[2]), window)
    x, y, w, h = window
    across, down = halved
    cx, cw = (x, w) if across else (x // 2, (x + w + 1) // 2 - x // 2)
    cy, ch = (y, h) if down else (y // 2, (y + h + 1) // 2 - y // 2)
    u, v = (_halve(p[cy : cy + ch, cx : cx + cw], across, down) for p in planes[1:])
    return planes[0][y : y + h, x : x + w], u, v


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
                        planes = _frame_windows(frame, window)
                        out.digests[display] = window_digest(*planes)
        except av.FFmpegError as e:
            out.errors.setdefault(None, f"PyAV demux error: {e}")
    return out

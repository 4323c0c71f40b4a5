"""Frames read through the public ``Reader``: the stored-resolution window of each (``yuv``
mode, centre crop), reduced to the same digest as the PyAV reference.

A batch that fails is read again clip by clip, and a clip that fails frame by frame, so that an
error names the frames it belongs to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kohakuclip.check.reference import Window, plane_windows, window_digest
from kohakuclip.decode.pixels import yuv420_planes
from kohakuclip.read.plan import Skip
from kohakuclip.read.pool import Pending
from kohakuclip.read.reader import Batch, Reader

__all__ = ["FrameDigests", "FrameReader", "consecutive", "strided"]


CLIP = 8
"""Frames per clip."""
IN_FLIGHT = 2
"""Batches queued ahead of the one being checked."""


def consecutive(frames: Sequence[int], length: int = CLIP) -> list[list[int]]:
    """``frames`` in clips of ``length`` (the last one padded with its last frame)."""
    clips = [list(frames[i : i + length]) for i in range(0, len(frames), length)]
    if clips and len(clips[-1]) < length:
        clips[-1] += [clips[-1][-1]] * (length - len(clips[-1]))
    return clips


def strided(frames: Sequence[int], length: int = CLIP, stride: int = 4) -> list[list[int]]:
    """Every frame once, in clips of every ``stride``-th frame: sparse clips, which is where
    skipping frames nothing wanted depends on has something to skip."""
    stride = max(1, min(stride, len(frames) // length))
    order = [f for start in range(stride) for f in frames[start::stride]]
    return consecutive(order, length)


@dataclass
class FrameDigests:
    """One reader's view of the frames of one video."""

    digests: dict[int, bytes] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    window: Window | None = None


def _cause(error: Exception) -> str:
    """The reader's error without the source and member it names (the problem names them)."""
    return str(error.__cause__ or error)


class FrameReader:
    """Reads clips of one video through a ``Reader`` and digests every frame's window."""

    def __init__(self, source: str, skip: Skip, window: int, threads: int, batch: int = 4) -> None:
        # yuv mode: the window at stored resolution; ``size`` (resizing) is not used
        self.reader = Reader(
            source, size=2, mode="yuv", crop="center", threads=threads, skip=skip, yuv_size=window
        )
        self.window, self.batch = window, max(1, batch)

    def close(self) -> None:
        self.reader.close()

    def read(
        self, vid: int, clips: list[list[int]], progress: Callable[[int], None]
    ) -> FrameDigests:
        """Digest every frame of ``clips`` of video ``vid``; ``progress(frames)`` per batch."""
        out = FrameDigests()
        groups = [clips[i : i + self.batch] for i in range(0, len(clips), self.batch)]
        pending: list[tuple[list[list[int]], Pending[Batch]]] = []
        for group in groups:
            pending.append((group, self.reader.submit([(vid, c) for c in group])))
            if len(pending) > IN_FLIGHT:
                self._finish(vid, *pending.pop(0), out, progress)
        for group, p in pending:
            self._finish(vid, group, p, out, progress)
        return out

    def _finish(
        self,
        vid: int,
        group: list[list[int]],
        pending: Pending[Batch],
        out: FrameDigests,
        progress: Callable[[int], None],
    ) -> None:
        try:
            self._digest(pending.result(), out)
        except Exception:
            for clip in group:
                self._retry(vid, clip, out)
        progress(sum(len(set(c)) for c in group))

    def _retry(self, vid: int, clip: list[int], out: FrameDigests) -> None:
        try:
            self._digest(self.reader.read([(vid, clip)]), out)
            return
        except Exception:
            pass
        for frame in dict.fromkeys(clip):
            try:
                self._digest(self.reader.read([(vid, [frame])]), out)
            except Exception as e:
                out.errors[frame] = _cause(e)

    def _digest(self, batch: Batch, out: FrameDigests) -> None:
        for i, (_, frames) in enumerate(batch.items):
            x, y, w, h = (int(v) for v in batch.crops[i])
            out.window = (x, y, w, h)
            local = (0, 0, w, h)
            for t, frame in enumerate(frames):
                if frame in out.digests:
                    continue
                planes = yuv420_planes(batch.video[i, t], self.window)
                out.digests[frame] = window_digest(*plane_windows(planes, local))

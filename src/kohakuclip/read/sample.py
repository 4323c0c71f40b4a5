"""Stock samplers: which frames of a video make one clip.

A sampler is any function returning display-order frame indices; items handed to a reader are
plain ``(video id, [frame indices])`` pairs, so users can bring their own.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["clip", "random_frames"]


def clip(
    n_video_frames: int,
    frames: int,
    rng: np.random.Generator,
    fps: float | None = None,
    video_fps: float | None = None,
    spread: bool = False,
) -> list[int]:
    """``frames`` frames from a random start, ``fps`` apart (the native rate when ``fps`` is None).

    With ``spread=True`` the clip spans the whole video instead (evenly spaced, random phase). A
    video too short for the requested span gives a clip squeezed to fit: the step shrinks until
    the clip fits, and frames repeat only when the video has fewer frames than ``frames``. Never
    raises for short videos (``n_video_frames >= 1``).
    """
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    if fps is not None and not (math.isfinite(fps) and fps > 0):
        raise ValueError(f"fps must be a positive number or None, got {fps}")
    if n_video_frames < 1:
        raise ValueError("cannot sample from a video without frames")
    if spread:
        step = n_video_frames / frames
        start = float(rng.random()) * step
        idx = np.floor(start + step * np.arange(frames))
    else:
        step = 1.0 if fps is None or not video_fps else video_fps / fps
        span = step * (frames - 1)
        if span > n_video_frames - 1:
            step = (n_video_frames - 1) / max(frames - 1, 1)
            span = step * (frames - 1)
        start = float(rng.random()) * (n_video_frames - 1 - span)
        idx = np.floor(start + step * np.arange(frames) + 1e-6)
    return np.clip(idx, 0, n_video_frames - 1).astype(np.int64).tolist()


def random_frames(n_video_frames: int, frames: int, rng: np.random.Generator) -> list[int]:
    """``frames`` distinct frames drawn at random from the whole video, in increasing order.

    Videos shorter than ``frames`` give every frame once and then repeats, still sorted.
    """
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    if n_video_frames < 1:
        raise ValueError("cannot sample from a video without frames")
    if n_video_frames >= frames:
        picked = rng.choice(n_video_frames, size=frames, replace=False)
    else:
        extra = rng.integers(0, n_video_frames, size=frames - n_video_frames)
        picked = np.concatenate([np.arange(n_video_frames), extra])
    return np.sort(picked).astype(np.int64).tolist()

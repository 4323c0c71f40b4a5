"""Stock samplers: which frames of a video make one clip.

A sampler is any function returning display-order frame indices; items handed to a reader are
plain ``(video id, [frame indices])`` pairs, so users can bring their own.

Both also take KohakuClip 1.0.0's calls, whose generator is a ``random.Random``:
``clip(n, fps, frames, target_fps, rng)`` and ``random_frames(n, frames, rng)``; those draw
the frames 1.0.0 draws from the same generator state, so a migrated script keeps its clips.
"""

from __future__ import annotations

import inspect
import math
import operator
import random
from collections.abc import Callable
from typing import Any, overload

import numpy as np

__all__ = ["clip", "random_frames"]


@overload
def clip(
    n_video_frames: int,
    frames: int,
    rng: np.random.Generator,
    fps: float | None = None,
    video_fps: float | None = None,
    spread: bool = False,
) -> list[int]: ...


@overload
def clip(
    n: int, fps: float, frames: int, target_fps: float | None, rng: random.Random
) -> list[int]: ...


def clip(*args: Any, **kwargs: Any) -> list[int]:
    """``frames`` frames from a random start, ``fps`` apart (the native rate when ``fps`` is None).

    With ``spread=True`` the clip spans the whole video instead (evenly spaced, random phase). A
    video too short for the requested span gives a clip squeezed to fit: the step shrinks until
    the clip fits, and frames repeat only when the video has fewer frames than ``frames``. Never
    raises for short videos (``n_video_frames >= 1``).

    KohakuClip 1.0.0's call ``clip(n, fps, frames, target_fps, rng)`` (``rng`` a
    ``random.Random``; ``target_fps`` None: every frame; positional or by those names) draws as
    1.0.0 does: a start uniform over the frames that fit, each frame rounded to the nearest, the
    last frame repeated where the video is too short.

    Its arguments, by position or by name (``*args`` in the signature, as it takes two call
    forms; the ``random.Random`` one is above):

        n_video_frames: frames in the video (>= 1).
        frames: frames in the clip (>= 1).
        rng: the generator the start (or phase) is drawn from.
        fps: the clip's frame rate (None: the video's own).
        video_fps: the video's frame rate (None: frames are taken consecutively).
        spread: span the whole video instead of ``fps``.
    """
    if _is_1_0_call(args, kwargs, "target_fps"):
        return _call("clip", _clip_1_0, args, kwargs)
    return _call("clip", _clip, args, kwargs)


def _is_1_0_call(args: tuple[Any, ...], kwargs: dict[str, Any], *names: str) -> bool:
    """Whether a sampler call is KohakuClip 1.0.0's: a ``random.Random`` or 1.0.0's names."""
    values = [*args, *kwargs.values()]
    return any(isinstance(v, random.Random) for v in values) or bool({"n", *names} & set(kwargs))


def _call(
    name: str, function: Callable[..., list[int]], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[int]:
    """``function(*args, **kwargs)``, where a call that does not fit its parameters raises a
    TypeError naming the public sampler ``name`` and those parameters."""
    try:
        return function(*args, **kwargs)
    except TypeError:
        signature = inspect.signature(function)
        try:
            signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{name}({', '.join(signature.parameters)}): {error}") from None
        raise


def _counts(call: str, video: str, n: Any, frames: Any) -> tuple[int, int]:
    """A sampler's frame counts as ints (numpy ones too); TypeError naming ``call`` and the
    video's count ``video`` for anything else, ValueError for no frames wanted."""
    try:
        n, frames = operator.index(n), operator.index(frames)
    except TypeError:
        raise TypeError(f"{call}: {video} and frames are ints, got {n!r}, {frames!r}") from None
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    return n, frames


def _clip(
    n_video_frames: int,
    frames: int,
    rng: np.random.Generator,
    fps: float | None = None,
    video_fps: float | None = None,
    spread: bool = False,
) -> list[int]:
    """``clip`` with a numpy generator (its docstring)."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"clip(): rng must be a numpy Generator, got {type(rng).__name__}")
    n_video_frames, frames = _counts("clip()", "n_video_frames", n_video_frames, frames)
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


def _clip_1_0(
    n: int, fps: float, frames: int, target_fps: float | None, rng: random.Random
) -> list[int]:
    """KohakuClip 1.0.0's ``clip``, draw for draw."""
    if not isinstance(rng, random.Random):
        raise TypeError(
            f"KohakuClip 1.0.0's clip() takes a random.Random, got {type(rng).__name__}"
        )
    n, frames = _counts("KohakuClip 1.0.0's clip()", "n", n, frames)
    if n < 1:
        raise ValueError("cannot sample from a video without frames")
    if not (math.isfinite(fps) and fps > 0):
        raise ValueError(f"fps must be a positive number, got {fps}")
    if target_fps is not None and not (math.isfinite(target_fps) and target_fps > 0):
        raise ValueError(f"target_fps must be a positive number or None, got {target_fps}")
    step = 1.0 if target_fps is None else fps / target_fps
    start = rng.uniform(0.0, max(0.0, n - 1 - (frames - 1) * step))
    return [min(round(start + k * step), n - 1) for k in range(frames)]


@overload
def random_frames(
    n_video_frames: int, frames: int, rng: np.random.Generator | random.Random
) -> list[int]: ...


@overload
def random_frames(*, n: int, frames: int, rng: random.Random) -> list[int]: ...


def random_frames(*args: Any, **kwargs: Any) -> list[int]:
    """``frames`` distinct frames drawn at random from the whole video, in increasing order.

    Videos shorter than ``frames`` give every frame once and then repeats, still sorted. With
    a ``random.Random`` (KohakuClip 1.0.0's call, ``random_frames(n, frames, rng)``) the draw is
    1.0.0's, and a short video gives each of its frames once (fewer than ``frames``), as 1.0.0
    does.

    Its arguments, by position or by name (``*args`` in the signature, as it takes two call
    forms; the ``random.Random`` one is above):

        n_video_frames: frames in the video (>= 1).
        frames: frames to draw (>= 1).
        rng: the generator they are drawn from.
    """
    if _is_1_0_call(args, kwargs):
        return _call("random_frames", _random_frames_1_0, args, kwargs)
    return _call("random_frames", _random_frames, args, kwargs)


def _random_frames_1_0(n: int, frames: int, rng: random.Random) -> list[int]:
    """``random_frames`` by 1.0.0's names."""
    return _random_frames(n, frames, rng)


def _random_frames(
    n_video_frames: int, frames: int, rng: np.random.Generator | random.Random
) -> list[int]:
    """``random_frames`` by position (its docstring)."""
    if not isinstance(rng, (np.random.Generator, random.Random)):
        raise TypeError(f"random_frames(): rng must be a generator, got {type(rng).__name__}")
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    if n_video_frames < 1:
        raise ValueError("cannot sample from a video without frames")
    if isinstance(rng, random.Random):
        return sorted(rng.sample(range(n_video_frames), min(frames, n_video_frames)))
    if n_video_frames >= frames:
        picked = rng.choice(n_video_frames, size=frames, replace=False)
    else:
        extra = rng.integers(0, n_video_frames, size=frames - n_video_frames)
        picked = np.concatenate([np.arange(n_video_frames), extra])
    return np.sort(picked).astype(np.int64).tolist()

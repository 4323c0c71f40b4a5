"""Source media for ingestion: video frames at a chosen rate (PyAV, in memory) and images.

Both are resized so the short side matches a size (GulpIO's ``frame_size`` / ``image_size``;
0 or less keeps the stored size). No temporary files.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from fractions import Fraction

import av
import cv2
import numpy as np
from PIL import Image, ImageOps

from kohakuclip.gulp.frames import GulpError

__all__ = ["read_image", "read_video_frames"]


def resize_short_side(image: np.ndarray, size: int) -> np.ndarray:
    """Resize so the short side is ``size`` (area filter when shrinking); ``size <= 0`` keeps it."""
    h, w = image.shape[:2]
    if size <= 0 or min(h, w) == size:
        return image
    scale = size / min(h, w)
    out_w, out_h = (size, max(1, round(h * scale))) if w <= h else (max(1, round(w * scale)), size)
    interpolation = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    return cv2.resize(image, (out_w, out_h), interpolation=interpolation)


def read_image(path: str, size: int = -1) -> np.ndarray:
    """An image file as RGB uint8 (EXIF orientation applied), short side resized to ``size``."""
    try:
        with Image.open(path) as image:
            rgb = np.asarray(ImageOps.exif_transpose(image).convert("RGB"))
    except (OSError, ValueError) as exc:
        raise GulpError(f"{path}: unreadable image ({exc})") from exc
    return resize_short_side(rgb, size)


def read_video_frames(
    source: str | os.PathLike[str] | bytes, frame_rate: float | None = None, frame_size: int = -1
) -> tuple[list[np.ndarray], float]:
    """RGB frames of a video's first video stream, and the rate they were taken at.

    With ``frame_rate`` > 0, output frame k (for every k / frame_rate before the video's end) is
    the source frame nearest in time to k / frame_rate (frames repeat when the source is slower);
    otherwise every frame is kept and the rate is the stream's average rate. Rotation metadata
    is not applied. GulpError naming the source when it cannot be decoded.
    """
    name = "<bytes>" if isinstance(source, bytes) else os.fspath(source)
    try:
        with av.open(io.BytesIO(source) if isinstance(source, bytes) else name, "r") as container:
            if not container.streams.video:
                raise GulpError(f"{name}: no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or Fraction(25)
            frames = _sample(container.decode(stream), float(rate), frame_rate, frame_size)
    except (av.FFmpegError, OSError) as exc:
        raise GulpError(f"{name}: cannot decode video ({exc})") from exc
    if not frames:
        raise GulpError(f"{name}: no decodable frames")
    return frames, float(frame_rate) if frame_rate and frame_rate > 0 else float(rate)


def _sample(
    decoded: Iterable[av.VideoFrame], source_rate: float, frame_rate: float | None, frame_size: int
) -> list[np.ndarray]:
    if not frame_rate or frame_rate <= 0:
        return [resize_short_side(f.to_ndarray(format="rgb24"), frame_size) for f in decoded]
    out: list[np.ndarray] = []
    k = 0  # next output frame, due at k / frame_rate seconds
    start: float | None = None
    previous: av.VideoFrame | None = None
    previous_time = 0.0
    for count, frame in enumerate(decoded):
        when = frame.time if frame.time is not None else count / source_rate
        start = when if start is None else start
        when -= start
        if previous is not None:  # outputs due before the midpoint are nearest to ``previous``
            k = _emit(out, previous, k, (previous_time + when) / 2, frame_rate, frame_size)
        previous, previous_time = frame, when
    if previous is not None:  # the last frame lasts until the video ends, one frame later
        end = previous_time + 1 / source_rate - 1e-6  # (an output due exactly at the end: none)
        _emit(out, previous, k, end, frame_rate, frame_size)
    return out


def _emit(
    out: list[np.ndarray],
    frame: av.VideoFrame,
    k: int,
    until: float,
    frame_rate: float,
    frame_size: int,
) -> int:
    """Append ``frame`` for every output due before ``until``; returns the next output number."""
    rgb = None
    while k / frame_rate < until:
        if rgb is None:
            rgb = resize_short_side(frame.to_ndarray(format="rgb24"), frame_size)
        out.append(rgb)
        k += 1
    return k

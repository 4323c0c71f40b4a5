"""Synthetic sample videos for demos: moving shapes over a drifting gradient, made with PyAV."""

from __future__ import annotations

import io
import os
from fractions import Fraction

import av
import numpy as np

__all__ = ["make_sample_video"]


def sample_frame(index: int, width: int, height: int, seed: int) -> np.ndarray:
    """Frame ``index`` (uint8 HxWx3 RGB) of sample video ``seed``: every frame differs."""
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=3)
    speed = rng.uniform(1, 4, size=2)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    t = float(index)
    img = np.empty((height, width, 3), np.float32)
    img[..., 0] = (base[0] + x * 0.5 + t * 2) % 256
    img[..., 1] = (base[1] + y * 0.7 + t * 1.5) % 256
    img[..., 2] = (base[2] + (x + y) * 0.3 - t) % 256
    cx = (width * 0.5 + width * 0.35 * np.sin(t * speed[0] / 24)) % width
    cy = (height * 0.5 + height * 0.35 * np.cos(t * speed[1] / 24)) % height
    radius = min(width, height) / 6
    img[(x - cx) ** 2 + (y - cy) ** 2 < radius**2] = 255 - base.astype(np.float32)
    bar_x = int(t * 3) % max(1, width - width // 8)
    img[height - height // 10 :, bar_x : bar_x + width // 8] = (32, 32, 32)
    return img.astype(np.uint8)


def make_sample_video(
    path: str | os.PathLike[str] | None = None,
    seconds: float = 4.0,
    width: int = 320,
    height: int = 240,
    fps: int = 24,
    seed: int = 0,
) -> bytes:
    """An H.264 mp4 of the sample content; returns its bytes and writes ``path`` when given."""
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "18"}
        for i in range(max(1, round(seconds * fps))):
            frame = av.VideoFrame.from_ndarray(sample_frame(i, width, height, seed), format="rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    data = buffer.getvalue()
    if path is not None:
        with open(path, "wb") as f:
            f.write(data)
    return data

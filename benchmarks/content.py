"""Natural-looking synthetic source videos for benchmarks (no real footage ships with the repo).

Multi-octave smooth noise (like foliage, clouds, texture) seen through a slowly panning and zooming
camera, a few moving objects, and per-frame sensor noise: content that makes an encoder spend its
bits the way real footage does (textured, mostly predictable, never static), unlike flat test
patterns. Say so wherever these numbers are quoted.
"""

from __future__ import annotations

import os
from fractions import Fraction

import av
import cv2
import numpy as np


def _texture(rng: np.random.Generator, size: int) -> np.ndarray:
    """A size x size x 3 float32 texture, sum of smooth noise octaves."""
    out = np.zeros((size, size, 3), np.float32)
    amp = 1.0
    for octave in range(7):
        cells = 4 * 2**octave
        noise = rng.standard_normal((cells, cells, 3)).astype(np.float32)
        out += amp * cv2.resize(noise, (size, size), interpolation=cv2.INTER_CUBIC)
        amp *= 0.8
    out -= out.min()
    out *= 255.0 / max(float(out.max()), 1e-6)
    return out


def natural_video(
    path: str,
    seconds: float = 10.0,
    width: int = 640,
    height: int = 360,
    fps: int = 24,
    seed: int = 0,
) -> None:
    """Write a high-quality H.264 mp4 of panning textured content to ``path``."""
    rng = np.random.default_rng(seed)
    size = 2 * max(width, height)
    tex = _texture(rng, size)
    tint = rng.uniform(0.6, 1.2, 3).astype(np.float32)
    tex = np.clip(tex * tint, 0, 255)
    blobs = [
        (
            rng.uniform(0, width),
            rng.uniform(0, height),
            rng.uniform(-3, 3),
            rng.uniform(-2, 2),
            rng.uniform(15, 45),
            rng.uniform(0, 255, 3),
        )
        for _ in range(4)
    ]
    vx, vy = rng.uniform(-2, 2, 2)
    zoom_rate = rng.uniform(-0.002, 0.002)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    with av.open(path, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "16"}
        for i in range(round(seconds * fps)):
            zoom = 1.0 + zoom_rate * i
            cx, cy = size / 2 + vx * i, size / 2 + vy * i
            m = np.float32(
                [[1 / zoom, 0, cx - width / (2 * zoom)], [0, 1 / zoom, cy - height / (2 * zoom)]]
            )
            frame = cv2.warpAffine(
                tex, m, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT
            )
            for bx, by, bvx, bvy, r, colour in blobs:
                px, py = (bx + bvx * i) % width, (by + bvy * i) % height
                mask = np.clip(r - np.sqrt((xx - px) ** 2 + (yy - py) ** 2), 0, 1)[..., None]
                frame = frame * (1 - mask) + colour.astype(np.float32) * mask
            frame += rng.normal(0, 2.0, frame.shape).astype(np.float32)
            rgb = np.clip(frame, 0, 255).astype(np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
        out.mux(stream.encode(None))


def natural_videos(folder: str, count: int, seconds: float = 10.0, **kwargs: int) -> list[str]:
    """``count`` natural videos in ``folder`` (reused when already there)."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i in range(count):
        path = os.path.join(folder, f"natural_{i:03d}.mp4")
        if not os.path.exists(path):
            natural_video(path, seconds=seconds, seed=i, **kwargs)
        paths.append(path)
    return paths

"""Crop windows for images: the short-side square (random or centred) or a random resized crop.

Windows start at even pixels so that 4:2:0 chroma stays aligned with luma.
"""

from __future__ import annotations

import math

import numpy as np

from kohakuclip.decode.pixels import Crop, square_crop

__all__ = ["image_crop"]


def resized_crop(
    width: int,
    height: int,
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Crop:
    """torchvision's RandomResizedCrop window: area fraction in ``scale``, aspect ratio (w / h)
    log-uniform in ``ratio``; ten tries, then the centred crop of the clamped ratio."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * float(rng.uniform(scale[0], scale[1]))
        aspect = math.exp(float(rng.uniform(log_ratio[0], log_ratio[1])))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            x = int(rng.integers(0, width - w + 1)) & ~1
            y = int(rng.integers(0, height - h + 1)) & ~1
            return Crop(x, y, w, h)
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return Crop(((width - w) // 2) & ~1, ((height - h) // 2) & ~1, w, h)


def image_crop(
    kind: str,
    width: int,
    height: int,
    rng: np.random.Generator,
    scale: tuple[float, float],
    ratio: tuple[float, float],
) -> Crop:
    """The window of one image for crop ``kind`` ("random", "center" or "resized")."""
    if kind == "resized":
        return resized_crop(width, height, rng, scale, ratio)
    return square_crop(width, height, rng if kind == "random" else None)

"""Synthetic photo-like images for the image benchmarks (no real photos ship with the repo).

Each picture is a 1/f luminance field (the power spectrum of natural images) with smooth colour,
under blurred shapes with gradients and textures at several scales, a slight lens blur and
sensor noise (mostly luminance). Results on
real photos differ; say so next to any number measured on these.
"""

from __future__ import annotations

import cv2
import numpy as np


def photo_like(seed: int, height: int = 768, width: int = 1024) -> np.ndarray:
    """uint8 [height, width, 3] RGB."""
    rng = np.random.default_rng(seed)
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    f = np.sqrt(fx**2 + fy**2)
    f[0, 0] = 1.0

    def field(exponent: float) -> np.ndarray:
        spectrum = rng.normal(size=f.shape) + 1j * rng.normal(size=f.shape)
        spectrum /= f**exponent
        spectrum[0, 0] = 0
        out = np.fft.irfft2(spectrum, s=(height, width))
        return (out - out.mean()) / (out.std() + 1e-9)

    # Detail lives in luminance; colour varies smoothly, as in real photos.
    luma = field(float(rng.uniform(1.0, 1.3))) * 40
    chroma = [cv2.GaussianBlur(field(1.2), (0, 0), 6.0) * 25 for _ in range(2)]
    tint = rng.normal(size=(2, 3)) * 0.6
    base = luma[..., None] + chroma[0][..., None] * tint[0] + chroma[1][..., None] * tint[1]
    base += rng.uniform(80, 170, 3)
    img = base.astype(np.float32)
    gy, gx = np.mgrid[0:height, 0:width].astype(np.float32)
    for _ in range(int(rng.integers(6, 20))):
        mask = np.zeros((height, width), np.float32)
        if rng.random() < 0.5:
            center = (int(rng.integers(0, width)), int(rng.integers(0, height)))
            axes = (int(rng.integers(10, width // 3)), int(rng.integers(10, height // 3)))
            cv2.ellipse(mask, center, axes, float(rng.uniform(0, 180)), 0, 360, 1.0, -1)
        else:
            corners = rng.integers(0, [width, height], size=(int(rng.integers(3, 7)), 2))
            cv2.fillPoly(mask, [corners.astype(np.int32)], 1.0)
        mask = cv2.GaussianBlur(mask, (0, 0), float(rng.uniform(0.6, 3.0)))[..., None]
        colour = rng.uniform(0, 255, 3).astype(np.float32)
        shade = 1 + 0.4 * np.sin(gx / rng.uniform(30, 300) + gy / rng.uniform(30, 300))
        texture = np.zeros((height, width), np.float32)
        if rng.random() < 0.6:
            scale = float(rng.uniform(0.7, 4))
            noise = rng.normal(size=(height, width)).astype(np.float32)
            texture = cv2.GaussianBlur(noise, (0, 0), scale) * float(rng.uniform(5, 40)) * scale
        obj = colour * shade[..., None] + texture[..., None]
        img = img * (1 - mask) + obj * mask
    img = cv2.GaussianBlur(img, (0, 0), 0.7)
    sigma = float(rng.uniform(1, 4))
    img += rng.normal(size=(*img.shape[:2], 1)).astype(np.float32) * sigma  # luma noise
    img += rng.normal(size=img.shape).astype(np.float32) * (sigma / 3)  # some chroma noise
    return np.clip(img, 0, 255).astype(np.uint8)

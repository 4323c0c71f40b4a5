"""Synthetic still images for the image tests: photo-like pixels and files in every odd form."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
import zlib
from collections.abc import Iterable, Mapping

import cv2
import numpy as np
from PIL import Image


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """uint8 [H, W, 3]: smooth colour fields, blurred shapes and mild noise (JPEG-friendly,
    asymmetric so that any rotation or flip shows)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.empty((height, width, 3), np.float32)
    for c in range(3):
        fx, fy = rng.uniform(0.5, 3, 2) * np.pi / np.array([width, height])
        img[..., c] = 120 + 60 * np.sin(xx * fx + rng.uniform(0, 6)) * np.cos(yy * fy)
    for _ in range(6):
        layer = np.zeros((height, width), np.float32)
        center = (int(rng.integers(0, width)), int(rng.integers(0, height)))
        axes = (int(rng.integers(4, width // 3 + 5)), int(rng.integers(4, height // 3 + 5)))
        cv2.ellipse(layer, center, axes, float(rng.uniform(0, 180)), 0, 360, 1.0, -1)
        layer = cv2.GaussianBlur(layer, (0, 0), 1.5)[..., None]
        img = img * (1 - layer) + rng.uniform(0, 255, 3).astype(np.float32) * layer
    img[: height // 6, : width // 4] = (250, 30, 30)  # a marker in the top-left corner
    img += rng.normal(0, 2, img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def encode(image: Image.Image, fmt: str, **options: object) -> bytes:
    """The bytes of ``image`` saved by Pillow as ``fmt``."""
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 arrays of one shape."""
    assert a.shape == b.shape, (a.shape, b.shape)
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255.0**2 / mse))


# For each EXIF orientation, the transpose that makes the stored (raw) pixels from upright ones:
# the inverse of what a viewer applies.
RAW_FROM_UPRIGHT = {
    1: None,
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_90,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_270,
}


def oriented_jpeg(upright: np.ndarray, orientation: int, quality: int = 95) -> bytes:
    """A JPEG whose raw pixels, turned by its EXIF orientation tag, show ``upright``."""
    image = Image.fromarray(upright)
    method = RAW_FROM_UPRIGHT[orientation]
    raw = image.transpose(method) if method is not None else image
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(raw, "JPEG", quality=quality, subsampling=0, exif=exif.tobytes())


def write_tar(
    path: str | os.PathLike[str], members: Mapping[str, bytes] | Iterable[tuple[str, bytes]]
) -> None:
    """A plain tar of ``members`` (names to bytes, or (name, bytes) pairs: names may repeat),
    in order."""
    pairs = members.items() if isinstance(members, Mapping) else members
    with tarfile.open(path, "w") as tar:
        for name, data in pairs:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


APPLE_DOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00" + b"Mac OS X        " + bytes(58)
"""The start of a ``._name`` resource file macOS puts beside each file it archives."""


def write_zip(path: str, members: dict[str, bytes], deflate: bool = False) -> None:
    method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w", compression=method) as z:
        for name, data in members.items():
            z.writestr(name, data)


_ADAM7 = (
    (0, 0, 8, 8),
    (4, 0, 8, 8),
    (0, 4, 4, 8),
    (2, 0, 4, 4),
    (0, 2, 2, 4),
    (1, 0, 2, 2),
    (0, 1, 1, 2),
)


def raw_png(pixels: np.ndarray, interlaced: bool = False, rows: int | None = None) -> bytes:
    """An 8-bit gray or RGB PNG of ``pixels`` written here, every row unfiltered: Adam7
    interlaced (Pillow writes none), or with the image data of only the first ``rows`` rows
    (checksums right: a well-formed file that ends its image early)."""
    import struct

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    h, w = pixels.shape[:2]
    passes = _ADAM7 if interlaced else ((0, 0, 1, 1),)
    data = b""
    for x0, y0, dx, dy in passes:
        sub = pixels[y0::dy, x0::dx][:rows]
        if sub.shape[0] and sub.shape[1]:
            data += b"".join(b"\0" + row.tobytes() for row in sub)
    header = struct.pack(">IIBBBBB", w, h, 8, 2 if pixels.ndim == 3 else 0, 0, 0, int(interlaced))
    signature = b"\x89PNG\r\n\x1a\n"
    return (
        signature
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(data))
        + chunk(b"IEND", b"")
    )

"""Turn the bytes of any source image into the upright 8-bit pixels that get stored.

EXIF orientation is applied, alpha is composited onto white, CMYK / palette / 16-bit / other
modes become 8-bit RGB (or gray for gray sources), and the short side is capped with Lanczos-3
(never upscaled). The ``native`` backend decodes plain JPEGs with libjpeg-turbo (simplejpeg, DCT
scaling down to no less than the stored size) and everything else with Pillow, then FFmpeg
(PyAV) for what Pillow cannot open; ``pillow`` uses Pillow alone. Heavy steps release the GIL.
"""

from __future__ import annotations

import contextlib
import io
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import simplejpeg
from PIL import Image

from kohakuclip.errors import KohakuClipError
from kohakuclip.imaging import flatten

__all__ = ["Backend", "ImageSkip", "prepare"]


Backend = Literal["native", "pillow"]

_ORIENTATION_TAG = 0x0112
_TRANSPOSE = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_SWAPS_AXES = (5, 6, 7, 8)

with contextlib.suppress(ImportError):  # JPEG XL sources, when the optional plugin is there
    import pillow_jxl  # noqa: F401


class ImageSkip(KohakuClipError):
    """A source image that is not stored; ``reason`` goes to skipped.jsonl."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Prepared:
    """Upright pixels ready to encode: uint8 [H, W, 3] RGB, or [H, W] for gray sources."""

    pixels: np.ndarray
    source_width: int  # upright size of the source, before any resize
    source_height: int

    @property
    def gray(self) -> bool:
        return self.pixels.ndim == 2


def stored_dims(width: int, height: int, max_short: int) -> tuple[int, int]:
    """(width, height) with the short side capped at ``max_short`` (0: no cap), never upscaled."""
    short = min(width, height)
    if max_short <= 0 or short <= max_short:
        return width, height
    scale = max_short / short
    if width <= height:
        return max_short, max(max_short, round(height * scale))
    return max(max_short, round(width * scale)), max_short


def prepare(
    data: bytes, max_short: int = 512, min_short: int = 0, backend: Backend = "native"
) -> Prepared:
    """Decode, orient, flatten and resize one source image (raises ImageSkip)."""
    if not data:
        raise ImageSkip("empty", "the file has no bytes")
    if backend == "native" and data[:2] == b"\xff\xd8":
        prepared = _prepare_plain_jpeg(data, max_short, min_short)
        if prepared is not None:
            return prepared
    try:
        image = Image.open(io.BytesIO(data))
    except Exception as pillow_error:
        if backend == "pillow":
            raise ImageSkip("corrupt", f"Pillow cannot read it ({pillow_error})") from None
        return _prepare_with_ffmpeg(data, max_short, min_short, pillow_error)
    return _prepare_with_pillow(image, max_short, min_short)


def _orientation(image: Image.Image) -> int:
    try:
        value = image.getexif().get(_ORIENTATION_TAG, 1)
    except Exception:  # a broken EXIF block is no reason to drop the picture
        return 1
    return value if value in _TRANSPOSE else 1


def _check_short(width: int, height: int, min_short: int) -> None:
    if min(width, height) < min_short:
        raise ImageSkip("too small", f"{width}x{height}, short side under {min_short}")


def _prepare_plain_jpeg(data: bytes, max_short: int, min_short: int) -> Prepared | None:
    """libjpeg-turbo path for YCbCr and gray JPEGs; None hands other JPEGs to Pillow."""
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if colorspace not in ("YCbCr", "Gray"):
        return None
    try:
        orientation = _orientation(Image.open(io.BytesIO(data)))
    except Exception:
        orientation = 1
    up_w, up_h = (height, width) if orientation in _SWAPS_AXES else (width, height)
    _check_short(up_w, up_h, min_short)
    gray = colorspace == "Gray"
    min_w = min_h = 0
    if max_short > 0 and min(width, height) > max_short:
        if height <= width:
            min_h = max_short
        else:
            min_w = max_short
    try:
        pixels = simplejpeg.decode_jpeg(
            data, colorspace="GRAY" if gray else "RGB", min_height=min_h, min_width=min_w
        )
    except ValueError as e:
        raise ImageSkip("corrupt", f"libjpeg-turbo cannot decode it ({e})") from None
    image = Image.fromarray(pixels[:, :, 0] if gray else pixels)
    if orientation != 1:
        image = image.transpose(_TRANSPOSE[orientation])
    return _finish(image, max_short, up_w, up_h)


def _prepare_with_pillow(image: Image.Image, max_short: int, min_short: int) -> Prepared:
    orientation = _orientation(image)
    width, height = image.size
    up_w, up_h = (height, width) if orientation in _SWAPS_AXES else (width, height)
    _check_short(up_w, up_h, min_short)
    if image.format == "JPEG" and max_short > 0 and min(width, height) > max_short:
        scale = max_short / min(width, height)
        image.draft(image.mode, (math.ceil(width * scale), math.ceil(height * scale)))
    try:
        image.seek(0)
        image.load()
    except Exception as e:
        raise ImageSkip("corrupt", f"Pillow cannot decode it ({e})") from None
    image = flatten(image)
    if orientation != 1:
        image = image.transpose(_TRANSPOSE[orientation])
    return _finish(image, max_short, up_w, up_h)


def _prepare_with_ffmpeg(
    data: bytes, max_short: int, min_short: int, pillow_error: Exception
) -> Prepared:
    """Formats Pillow cannot open, through FFmpeg: the first picture, as RGB(A)."""
    import av

    try:
        with av.open(io.BytesIO(data), "r") as container:
            frame = next(container.decode(video=0))
            has_alpha = any(c.is_alpha for c in frame.format.components)
            rgb = frame.to_ndarray(format="rgba" if has_alpha else "rgb24")
    except Exception as e:
        raise ImageSkip(
            "corrupt", f"neither Pillow ({pillow_error}) nor FFmpeg ({e}) can read it"
        ) from None
    height, width = rgb.shape[:2]
    _check_short(width, height, min_short)
    image = flatten(Image.fromarray(rgb, "RGBA" if has_alpha else "RGB"))
    return _finish(image, max_short, width, height)


def _finish(image: Image.Image, max_short: int, up_w: int, up_h: int) -> Prepared:
    """Resize to the stored size (from the source's upright size) with Lanczos-3."""
    width, height = stored_dims(up_w, up_h, max_short)
    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.LANCZOS)
    return Prepared(np.asarray(image), up_w, up_h)

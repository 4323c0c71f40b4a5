"""Pillow images to the 8-bit gray or RGB pixels kohakuclip stores and reads: shared by the
writer (``write.image_prepare``) and the Pillow fallback of the image decoder
(``decode.image``), so neither imports the other's layer."""

from __future__ import annotations

import numpy as np
from PIL import Image

__all__ = ["flatten"]


def flatten(image: Image.Image) -> Image.Image:
    """An 8-bit 'L' image for gray sources, else 'RGB'; alpha is composited onto white.

    Args:
        image: a loaded Pillow image of any mode.
    """
    mode = image.mode
    if mode == "P":
        palette = image.palette
        has_alpha = "transparency" in image.info or (palette is not None and palette.mode == "RGBA")
        image = image.convert("RGBA" if has_alpha else "RGB")
    elif mode == "PA":
        image = image.convert("RGBA")
    elif mode in ("La", "RGBa"):
        image = image.convert(mode.upper())
    elif mode.startswith("I") or mode == "F":
        image = _wide_gray_to_8bit(image)
    elif mode == "1":
        image = image.convert("L")
    elif mode in ("L", "RGB") and "transparency" in image.info:
        image = image.convert(mode + "A")  # a PNG's tRNS colour: transparent
    mode = image.mode
    if mode in ("LA", "RGBA"):
        color = image.convert(mode[:-1])
        white = Image.new(color.mode, image.size, 255 if mode == "LA" else (255, 255, 255))
        white.paste(color, mask=image.getchannel("A"))
        return white
    if mode not in ("L", "RGB"):
        return image.convert("RGB")  # CMYK, YCbCr, LAB, HSV
    return image


def _wide_gray_to_8bit(image: Image.Image) -> Image.Image:
    """16-bit (or 32-bit / float) gray to 8 bits by scaling, not clipping."""
    values = np.asarray(image)
    scaled: np.ndarray
    if image.mode == "F":
        peak = 1.0 if float(values.max(initial=0.0)) <= 1.0 else 255.0
        scaled = np.clip(values / peak * 255.0 + 0.5, 0, 255)
    elif image.mode.startswith("I;16") or int(values.max(initial=0)) > 255:
        scaled = (np.clip(values, 0, 65535).astype(np.uint32) * 255 + 32767) // 65535
    else:
        scaled = np.clip(values, 0, 255)
    return Image.fromarray(np.ascontiguousarray(scaled, dtype=np.uint8))

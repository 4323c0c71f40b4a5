"""Encode prepared pixels for storage: JPEG (default), AVIF (AV1), JPEG XL or WebP.

JPEG is 4:4:4 baseline, decodable by any libjpeg. Three JPEG encoders, chosen by measurement
(benchmarks/image_store_bench.py, synthetic photo-like images):

- ``tuned`` (default): libjpeg-turbo through Pillow with optimized Huffman tables and
  N. Robidoux's quantization table (ImageMagick's and mozjpeg's default) for both luma and
  chroma, scaled by quality as libjpeg scales its tables. About 10 % smaller than plain
  libjpeg-turbo at the same PSNR on 256 x 256 crops; at the same quality number it stores more
  detail (higher PSNR) than libjpeg-turbo's Annex K tables.
- ``turbo``: libjpeg-turbo (simplejpeg) with the Annex K tables: the fastest, about 2.5x.
- ``jpegli``: jpegli through pyjpegli, whose API only writes 4:2:0 (not 4:4:4).

AVIF stores the raw AV1 OBUs of one SVT-AV1 intra frame (4:2:0, full-range BT.601), JPEG XL and
WebP go through Pillow (JPEG XL needs the ``pillow-jxl-plugin`` package).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np
import simplejpeg
from PIL import Image

from kohakuclip.formats import COLOR_FULL_RANGE, COLOR_GRAY, COLOR_RGB
from kohakuclip.write.scheduling import open_encoder

__all__ = [
    "CODEC_ALIASES",
    "INDEX_CODEC",
    "JPEG_ENCODERS",
    "STORAGE_CODECS",
    "Encoded",
    "check_codec",
    "encode_pixels",
    "quality_table",
]


StorageCodec = Literal["jpeg", "avif", "jxl", "webp"]
JpegEncoder = Literal["tuned", "turbo", "jpegli"]

STORAGE_CODECS: tuple[str, ...] = ("jpeg", "avif", "jxl", "webp")
CODEC_ALIASES = {"av1": "avif"}
"""Other names of a storage codec: ``av1`` is ``avif`` (both store raw AV1 OBUs)."""
JPEG_ENCODERS: tuple[str, ...] = ("tuned", "turbo", "jpegli")

# N. Robidoux's 8x8 table (natural order); the tuned encoder uses it for every component.
_ROBIDOUX_TABLE = np.array(
    [
        [16, 16, 16, 18, 25, 37, 56, 85],
        [16, 17, 20, 27, 34, 40, 53, 75],
        [16, 20, 24, 31, 43, 62, 91, 135],
        [18, 27, 31, 40, 53, 74, 106, 156],
        [25, 34, 43, 53, 69, 94, 131, 189],
        [37, 40, 62, 74, 94, 124, 169, 238],
        [56, 53, 91, 106, 131, 169, 226, 311],
        [85, 75, 135, 156, 189, 238, 311, 418],
    ],
    dtype=np.int64,
)

# Member suffix and KCIMG1 codec name of each storage codec.
_SUFFIX = {"jpeg": ".jpg", "avif": ".obu", "jxl": ".jxl", "webp": ".webp"}
INDEX_CODEC = {"jpeg": "jpeg", "avif": "av1", "jxl": "jxl", "webp": "webp"}
"""The codec name the image index records for each storage codec."""


@dataclass(frozen=True)
class Encoded:
    """One stored image: its bytes and what the KCIMG1 record says about them."""

    data: bytes
    codec: str  # name in formats.IMAGE_CODECS
    color: int  # formats.COLOR_* flags
    suffix: str  # member name suffix


def check_codec(codec: str, jpeg_encoder: str = "tuned") -> str:
    """The storage codec ``codec`` names (``CODEC_ALIASES`` resolved); ValueError for an unknown
    codec or JPEG encoder, or one whose package is missing."""
    codec = CODEC_ALIASES.get(codec, codec)
    if codec not in STORAGE_CODECS:
        raise ValueError(f"unknown storage codec {codec!r}; one of {', '.join(STORAGE_CODECS)}")
    if jpeg_encoder not in JPEG_ENCODERS:
        raise ValueError(
            f"unknown JPEG encoder {jpeg_encoder!r}; one of {', '.join(JPEG_ENCODERS)}"
        )
    if codec == "jxl":
        try:
            import pillow_jxl  # noqa: F401
        except ImportError:
            raise ValueError("--codec jxl needs the pillow-jxl-plugin package") from None
    if codec == "jpeg" and jpeg_encoder == "jpegli":
        try:
            import pyjpegli  # noqa: F401
        except ImportError:
            raise ValueError("--jpeg-encoder jpegli needs the pyjpegli package") from None
    return codec


def quality_table(quality: int) -> list[int]:
    """The tuned encoder's table at ``quality`` (libjpeg's scaling, baseline-clamped to 255)."""
    q = min(max(int(quality), 1), 100)
    percent = 5000 // q if q < 50 else 200 - 2 * q
    table = np.clip((_ROBIDOUX_TABLE * percent + 50) // 100, 1, 255)
    return [int(v) for v in table.ravel()]


def encode_pixels(
    pixels: np.ndarray,
    codec: str = "jpeg",
    quality: int = 70,
    jpeg_encoder: str = "tuned",
) -> Encoded:
    """Encode uint8 [H, W, 3] RGB or [H, W] gray pixels for storage (``codec`` may be an alias,
    see ``CODEC_ALIASES``)."""
    codec = check_codec(codec, jpeg_encoder)
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    gray = pixels.ndim == 2
    if codec == "jpeg":
        data, color = _encode_jpeg(pixels, gray, quality, jpeg_encoder)
    elif codec == "avif":
        data, color = _encode_av1(pixels, gray, quality), COLOR_FULL_RANGE
    else:
        data, color = _encode_with_pillow(pixels, gray, codec, quality)
    return Encoded(data, INDEX_CODEC[codec], color, _SUFFIX[codec])


def _encode_jpeg(pixels: np.ndarray, gray: bool, quality: int, encoder: str) -> tuple[bytes, int]:
    color = COLOR_FULL_RANGE | (COLOR_GRAY if gray else 0)
    if encoder == "turbo":
        if gray:
            data = simplejpeg.encode_jpeg(
                pixels[:, :, None], quality, colorspace="GRAY", colorsubsampling="Gray"
            )
        else:
            data = simplejpeg.encode_jpeg(pixels, quality, colorspace="RGB", colorsubsampling="444")
        return data, color
    if encoder == "jpegli":
        import pyjpegli

        rgb = np.repeat(pixels[:, :, None], 3, axis=2) if gray else pixels
        height, width = rgb.shape[:2]
        return pyjpegli.encode(rgb.tobytes(), width, height, quality), COLOR_FULL_RANGE
    table = quality_table(quality)
    out = io.BytesIO()
    Image.fromarray(pixels).save(
        out,
        "JPEG",
        qtables=[table] if gray else [table, table],
        subsampling=0,
        optimize=True,
        progressive=False,
    )
    return out.getvalue(), color


def avif_crf(quality: int) -> int:
    """SVT-AV1's CRF (1-63) for a 0-100 quality."""
    return min(max(round((100 - quality) * 63 / 100), 1), 63)


def _encode_av1(pixels: np.ndarray, gray: bool, quality: int) -> bytes:
    import av

    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1 prints its configuration otherwise
    rgb = np.repeat(pixels[:, :, None], 3, axis=2) if gray else pixels
    height, width = rgb.shape[:2]
    ctx = av.CodecContext.create("libsvtav1", "w")
    ctx.width, ctx.height = width, height
    ctx.pix_fmt = "yuv420p"
    ctx.time_base = Fraction(1, 1)
    ctx.color_range = 2  # full
    ctx.colorspace = 6  # SMPTE 170M (BT.601)
    ctx.options = {
        "crf": str(avif_crf(quality)),
        "preset": "8",
        "svtav1-params": "tune=4:avif=1",
    }
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(
        format="yuv420p", dst_colorspace="ITU601", dst_color_range="JPEG"
    )
    frame.pts = 0
    open_encoder(ctx)
    packets = ctx.encode(frame) + ctx.encode(None)
    return b"".join(bytes(p) for p in packets)


def _encode_with_pillow(
    pixels: np.ndarray, gray: bool, codec: str, quality: int
) -> tuple[bytes, int]:
    out = io.BytesIO()
    image = Image.fromarray(pixels)
    if codec == "webp":
        image.save(out, "WEBP", quality=quality, method=6)
        return out.getvalue(), COLOR_RGB
    import pillow_jxl  # noqa: F401

    image.save(out, "JXL", quality=quality, effort=7, decoding_speed=4, num_threads=1)
    return out.getvalue(), COLOR_GRAY if gray else COLOR_RGB

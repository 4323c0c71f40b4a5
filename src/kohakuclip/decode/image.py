"""Decode one stored image straight into its slot of a batch: crop window, resize, flips, mode.

JPEG goes through libavcodec's MJPEG decoder (PyAV), shrunk in the DCT by 1/4 or 1/8
(``lowres``) when the crop window stays at least as large as the output (``dct_scale``), its
YCbCr planes to the shared pixel path: the same bytes as the compiled share path of
``read.image_reader``, whose twin this is. AV1 (raw OBUs) goes through libdav1d, whose planes
take the same path; CMYK JPEGs (libjpeg-turbo, simplejpeg) and everything else through Pillow. The
window is resized with the shared antialiased filter (``decode._resize``), flipped as it is
stored, and written in the layouts of ``decode.pixels.PixelWriter``: planar RGB, 4:2:0 planes
resized to the output ("yuv_resized", flipped), or the window's planes at stored resolution in
the top-left of a ``window`` square ("yuv", unflipped; the batch records crop and flips).
RGB-decoded codecs give full-range BT.601 (JFIF) planes, AV1 its stored matrix. Each thread owns
one decoder and its buffers; the heavy calls release the GIL.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from kohakuclip.decode.pixels import Crop, OutputMode, PixelWriter, frame_planes
from kohakuclip.decode.video import padded_packet
from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import COLOR_BT709, COLOR_FULL_RANGE

__all__ = [
    "JPEG_COLORSPACE",
    "ImageDecodeError",
    "ImageDecoder",
    "dct_denominator",
    "output_shape",
    "scaled_window",
    "sniff_codec",
    "stored_color",
]


JPEG_COLORSPACE = "bt601"
"""What RGB-decoded images report in the yuv modes, with full range: JPEG's own YCbCr."""


def stored_color(codec: str, color: int) -> tuple[str, bool]:
    """The matrix and range of a stored image's decoded planes: JPEG's YCbCr (full range
    BT.601; also of RGB-decoded images such as PNG, converted to it), WebP's (lossy WebP is
    VP8: limited range BT.601), or an AV1 image's from its index entry's ``color`` flags."""
    if codec in ("jpeg", "png"):
        return JPEG_COLORSPACE, True
    if codec == "webp":
        return "bt601", False
    return ("bt709" if color & COLOR_BT709 else "bt601"), bool(color & COLOR_FULL_RANGE)


_DCT_DENOMINATORS = (8, 4)
"""The JPEG DCT shrinks used. Not 2: FFmpeg's half-size inverse DCT is plain C, and a full
decode (its SIMD inverse DCT) plus our resize was 12-30 % faster at every size where 1/2 was the
deepest shrink (real photographs, short sides 512-1000 to 256, 4:4:4 q70 and 4:2:0 q90); 1/4
was 27-58 % faster than a full decode (short sides 1024, 1536), 1/8 as fast as 1/4 (2880)."""
_PLANAR_JPEG = ("yuvj420p", "yuvj422p", "yuvj444p", "yuv420p", "yuv422p", "yuv444p", "gray")


class ImageDecodeError(KohakuClipError, ValueError):
    """Bytes that do not decode as the image they should be."""


def sniff_codec(data: bytes) -> str:
    """The codec of an image from its first bytes: an IMAGE_CODECS name, or "other"."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:2] == b"\xff\x0a" or data[4:8] == b"JXL ":
        return "jxl"
    return "other"


def output_shape(size: int, mode: OutputMode, window: int = 512) -> tuple[int, ...]:
    """Shape of one image's output: [3, S, S] for rgb, else the flat 4:2:0 planes Y, U, V."""
    return PixelWriter.frame_shape(size, mode, window)


def dct_denominator(width: int, height: int, crop: Crop, side: int) -> int:
    """The largest JPEG DCT shrink (8 or 4; else 1) that keeps the crop window >= ``side``."""
    for d in _DCT_DENOMINATORS:
        if crop.w // d >= side and crop.h // d >= side:
            return d
    return 1


def scaled_window(width: int, height: int, crop: Crop, d: int) -> tuple[int, int, int, int]:
    """The crop window (x, y, w, h) in a picture decoded at 1/``d`` of its stored size (the
    decoder rounds sizes up), at least one pixel wide."""
    return _window_at(width, height, crop, -(-width // d), -(-height // d))


def _window_at(
    width: int, height: int, crop: Crop, decoded_width: int, decoded_height: int
) -> tuple[int, int, int, int]:
    """The crop window (x, y, w, h) of a ``width`` x ``height`` picture in its decoded
    ``decoded_width`` x ``decoded_height`` copy, at least one pixel wide."""
    if (decoded_width, decoded_height) == (width, height):
        return crop.x, crop.y, crop.w, crop.h
    sx, sy = decoded_width / width, decoded_height / height
    x0, y0 = round(crop.x * sx), round(crop.y * sy)
    x1 = max(round((crop.x + crop.w) * sx), x0 + 1)
    y1 = max(round((crop.y + crop.h) * sy), y0 + 1)
    return x0, y0, x1 - x0, y1 - y0


class ImageDecoder:
    """One thread's decoders and buffers for one output mode and side."""

    def __init__(self, size: int, mode: OutputMode, window: int = 512) -> None:
        self.size = size
        self.mode = mode
        self.window = window
        self._decoded = np.empty(0, np.uint8)
        self._planes = PixelWriter(size, mode, window)
        self._av1: Any = None  # libdav1d CodecContext, made on first use
        self._webp: Any = None  # libavcodec's WebP CodecContext, made on first use
        self._mjpeg: dict[int, Any] = {}  # lowres -> MJPEG CodecContext

    # -- sizes -------------------------------------------------------------------------------
    def probe(self, data: bytes, codec: str) -> tuple[int, int]:
        """(width, height) from the image's header (AV1: by decoding it)."""
        if codec == "jpeg":
            try:
                height, width, _, _ = simplejpeg.decode_jpeg_header(data)
                return width, height
            except ValueError:
                pass  # e.g. an arithmetic-coded JPEG: Pillow may still read it
        if codec == "av1":
            frame = self._decode_av1(data)
            return frame.width, frame.height
        try:
            with Image.open(io.BytesIO(data)) as image:
                return image.size
        except Exception as e:
            raise ImageDecodeError(f"cannot read the image header ({_pillow_reason(e)})") from None

    # -- decoding ----------------------------------------------------------------------------
    def write(
        self,
        data: bytes,
        codec: str,
        color: int,
        width: int,
        height: int,
        crop: Crop,
        hflip: bool,
        vflip: bool,
        dct_scale: bool,
        dst: np.ndarray,
    ) -> tuple[str, bool]:
        """Decode ``data`` and write the crop's output into ``dst``; returns the colorspace
        (the planes' matrix, or "rgb" in rgb mode) and whether the planes are full range."""
        if self.mode == "yuv" and (crop.w > self.window or crop.h > self.window):
            raise ImageDecodeError(
                f"crop window {crop.w}x{crop.h} exceeds the {self.window}-pixel yuv window "
                "(use a larger yuv_size, or mode='yuv_resized')"
            )
        frame = None
        if codec == "av1":
            frame = self._decode_av1(data)
        elif codec == "webp":
            frame = self._decode_webp(data)  # lossy: VP8's planes; else None (Pillow below)
        if frame is not None:
            if (frame.width, frame.height) != (width, height):
                raise ImageDecodeError("decoded size differs from the index")
            colorspace, full = stored_color(codec, color)
            y, u, v, shifts = frame_planes(frame)
            self._planes.write((y, u, v), crop, hflip, vflip, colorspace, full, dst, shifts)
            return ("rgb", False) if self.mode == "rgb" else (colorspace, full)
        scaling = dct_scale and self.mode != "yuv"
        if codec == "jpeg" and self._write_jpeg_planes(
            data, width, height, crop, hflip, vflip, scaling, dst
        ):
            return self._rgb_decoded()
        rgb, window = self._decode_rgb(data, codec, width, height, crop, scaling)
        self._planes.write_rgb(rgb, window, hflip, vflip, dst)
        return self._rgb_decoded()

    def _rgb_decoded(self) -> tuple[str, bool]:
        """The colorspace and range of an image decoded through JPEG's YCbCr or to RGB."""
        return ("rgb", False) if self.mode == "rgb" else (JPEG_COLORSPACE, True)

    def _write_jpeg_planes(
        self,
        data: bytes,
        width: int,
        height: int,
        crop: Crop,
        hflip: bool,
        vflip: bool,
        scaling: bool,
        dst: np.ndarray,
    ) -> bool:
        """A JPEG through libavcodec's decoder (shrunk in the DCT with ``lowres``), its YCbCr
        planes to the shared pixel path: what the compiled JPEG path does, the same bytes.
        False for what it cannot give as 8-bit planes (CMYK, 12-bit)."""
        import av

        d = dct_denominator(width, height, crop, self.size) if scaling else 1
        lowres = d.bit_length() - 1
        ctx = self._mjpeg.get(lowres)
        if ctx is None:
            ctx = self._mjpeg[lowres] = av.CodecContext.create("mjpeg", "r")
            ctx.thread_count = 1
            ctx.options = {"lowres": str(lowres), "err_detect": "explode"}  # as _avcodec
        try:
            frames = ctx.decode(padded_packet(data)) + ctx.decode(None)
        except av.FFmpegError as e:
            raise ImageDecodeError(f"libavcodec cannot decode it ({e})") from None
        finally:
            ctx.flush_buffers()
        if not frames:
            raise ImageDecodeError("libavcodec produced no picture")
        frame = frames[0]
        if frame.format.name not in _PLANAR_JPEG:
            return False
        if (frame.width, frame.height) != (-(-width // d), -(-height // d)):
            raise ImageDecodeError("decoded size differs from the index")
        y, u, v, shifts = frame_planes(frame)
        x0, y0, w, h = scaled_window(width, height, crop, d)
        window = Crop(x0, y0, w, h)
        self._planes.write((y, u, v), window, hflip, vflip, "bt601", True, dst, shifts)
        return True

    def _decode_rgb(
        self, data: bytes, codec: str, width: int, height: int, crop: Crop, dct_scale: bool
    ) -> tuple[np.ndarray, Crop]:
        """The decoded image, uint8 [H, W, 3] (maybe DCT-shrunk), and the crop window in it."""
        full = None
        if codec == "jpeg":
            full = self._decode_jpeg(data, width, height, crop, dct_scale)
        if full is None:
            full = _decode_with_pillow(data)
        return full, Crop(*_window_at(width, height, crop, full.shape[1], full.shape[0]))

    def _decode_jpeg(
        self, data: bytes, width: int, height: int, crop: Crop, dct_scale: bool
    ) -> np.ndarray | None:
        """libjpeg-turbo into a reused buffer; None for JPEGs it cannot give as RGB (CMYK)."""
        d = dct_denominator(width, height, crop, self.size) if dct_scale else 1
        min_h = -(-height // d) if d > 1 else 0
        min_w = -(-width // d) if d > 1 else 0
        try:
            dh, dw, colorspace, _ = simplejpeg.decode_jpeg_header(
                data, min_height=min_h, min_width=min_w
            )
        except ValueError as e:
            raise ImageDecodeError(f"not a readable JPEG ({e})") from None
        if colorspace in ("CMYK", "YCCK"):
            return None
        need = dh * dw * 3
        if self._decoded.size < need:
            self._decoded = np.empty(need, np.uint8)
        try:
            return simplejpeg.decode_jpeg(
                data,
                colorspace="RGB",
                min_height=min_h,
                min_width=min_w,
                buffer=self._decoded[:need],
            )
        except ValueError as e:
            raise ImageDecodeError(f"libjpeg-turbo cannot decode it ({e})") from None

    def _decode_webp(self, data: bytes) -> Any:
        """A lossy WebP's 8-bit 4:2:0 picture through libavcodec (what the compiled path
        decodes), or None for what it gives otherwise (lossless, alpha) or rejects."""
        import av

        if self._webp is None:
            self._webp = av.CodecContext.create("webp", "r")
            self._webp.thread_count = 1
            self._webp.options = {"err_detect": "explode"}
        ctx = self._webp
        try:
            frames = ctx.decode(padded_packet(data)) or ctx.decode(None)
        except av.FFmpegError:
            frames = []
        ctx.flush_buffers()
        if not frames or frames[0].format.name != "yuv420p":
            return None
        return frames[0]

    def _decode_av1(self, data: bytes) -> Any:
        import av

        if self._av1 is None:
            self._av1 = av.CodecContext.create("libdav1d", "r")
            self._av1.thread_count = 1
        ctx = self._av1
        try:
            frames = ctx.decode(padded_packet(data))
            if not frames:
                frames = ctx.decode(None)
        except av.FFmpegError as e:
            ctx.flush_buffers()
            raise ImageDecodeError(f"libdav1d cannot decode it ({e})") from None
        ctx.flush_buffers()
        if not frames:
            raise ImageDecodeError("libdav1d produced no picture")
        return frames[0]


def _decode_with_pillow(data: bytes) -> np.ndarray:
    from kohakuclip.imaging import flatten

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            flat = flatten(image)
    except Exception as e:
        raise ImageDecodeError(f"Pillow cannot decode it ({_pillow_reason(e)})") from None
    if flat.mode != "RGB":
        flat = flat.convert("RGB")
    return np.asarray(flat)


def _pillow_reason(error: Exception) -> str:
    """Pillow's reason, without the repr of the in-memory file it was given (the caller names
    the real one)."""
    if isinstance(error, UnidentifiedImageError):
        return "not an image format Pillow can identify"
    return str(error) or type(error).__name__

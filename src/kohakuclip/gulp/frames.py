"""JPEG frames of a GulpIO chunk: encode, decode, and read their bytes with positional reads.

Frames are RGB uint8 arrays (H x W x 3), the GulpIO convention. Decoding goes through simplejpeg
(libjpeg-turbo, releases the GIL) and falls back to Pillow for what it refuses (CMYK, odd files).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image

from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import GULP_ALIGNMENT

__all__ = [
    "JPEG_QUALITY",
    "GulpError",
    "RecordError",
    "decode_frame",
    "decode_stack",
    "encode_frame",
    "padding_for",
    "read_records",
]


JPEG_QUALITY = 90
"""Default encode quality, as GulpIO used."""

_JPEG_SOI = b"\xff\xd8"


class GulpError(KohakuClipError, ValueError):
    """A gulp directory, chunk or frame that cannot be read or written as asked."""


def padding_for(length: int) -> int:
    """Zero bytes that right-pad a record of ``length`` bytes to the GulpIO alignment."""
    return -length % GULP_ALIGNMENT


def encode_frame(frame: Any, quality: int = JPEG_QUALITY) -> bytes:
    """JPEG bytes of one frame: an RGB (H x W x 3), RGBA or gray array, a PIL image, or JPEG bytes.

    JPEG bytes are stored as they are (no re-encode); arrays are encoded 4:2:0 at ``quality``.
    """
    if isinstance(frame, bytes | bytearray | memoryview):
        data = bytes(frame)
        if not data.startswith(_JPEG_SOI):
            raise GulpError("frame bytes are not a JPEG (no SOI marker)")
        return data
    if isinstance(frame, Image.Image):
        frame = np.asarray(frame.convert("L" if frame.mode in ("L", "1") else "RGB"))
    array = np.asarray(frame)
    if array.dtype != np.uint8:
        raise GulpError(f"frames must be uint8 arrays, got {array.dtype}")
    if array.ndim == 3 and array.shape[2] == 4:
        array = array[:, :, :3]
    if array.ndim == 2 or (array.ndim == 3 and array.shape[2] == 1):
        gray = np.ascontiguousarray(array.reshape(array.shape[0], array.shape[1], 1))
        return bytes(simplejpeg.encode_jpeg(gray, quality=quality, colorspace="GRAY"))
    if array.ndim != 3 or array.shape[2] != 3:
        raise GulpError(f"frames must be H x W x 3 (RGB) or H x W (gray), got shape {array.shape}")
    return bytes(
        simplejpeg.encode_jpeg(
            np.ascontiguousarray(array), quality=quality, colorspace="RGB", colorsubsampling="420"
        )
    )


def decode_frame(data: bytes | memoryview, min_height: int = 0, min_width: int = 0) -> np.ndarray:
    """RGB uint8 array (H x W x 3) of one JPEG; gray JPEGs come back as RGB too.

    ``min_height`` / ``min_width`` let libjpeg-turbo decode at a reduced scale (DCT scaling) that
    still covers that size (the Pillow fallback decodes at full size). Raises ValueError when no
    decoder can read the bytes.
    """
    try:
        return simplejpeg.decode_jpeg(
            data, colorspace="RGB", min_height=min_height, min_width=min_width
        )
    except ValueError:
        pass
    try:
        with Image.open(io.BytesIO(bytes(data))) as image:
            return np.asarray(image.convert("RGB"))
    except Exception as exc:  # Pillow raises several types for broken images
        raise ValueError(f"not a decodable JPEG ({exc})") from exc


class RecordError(KohakuClipError, ValueError):
    """Record ``position`` of a batch of records could not be decoded (or did not fit)."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(reason)
        self.position = position


def decode_stack(records: Sequence[bytes]) -> np.ndarray:
    """Decode JPEGs of one size into a single T x H x W x 3 array, without a copy per frame.

    Raises RecordError when one cannot be decoded or differs in size from the first.
    """
    if not records:
        return np.empty((0, 0, 0, 3), np.uint8)
    try:
        height, width = simplejpeg.decode_jpeg_header(records[0])[:2]
    except ValueError:  # not one simplejpeg reads: use the slow path for its size
        try:
            height, width = decode_frame(records[0]).shape[:2]
        except ValueError as exc:
            raise RecordError(0, str(exc)) from exc
    out = np.empty((len(records), height, width, 3), np.uint8)
    for k, data in enumerate(records):
        try:
            frame = simplejpeg.decode_jpeg(data, colorspace="RGB", buffer=out[k])
        except ValueError:
            try:
                frame = decode_frame(data)
            except ValueError as exc:
                raise RecordError(k, str(exc)) from exc
            if frame.shape == out.shape[1:]:
                out[k] = frame
        if frame.shape != out.shape[1:]:
            raise RecordError(k, f"size {frame.shape[:2]} differs from the clip's {out.shape[1:3]}")
    return out


def read_records(
    path: str, offsets: Sequence[int] | np.ndarray, sizes: Sequence[int] | np.ndarray
) -> list[bytes]:
    """The bytes of each (offset, size) record of a data file.

    Records close together are fetched with one positional read over their span; sparse ones
    with one read each. Raises GulpError naming the file when it is shorter than a record needs.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    if len(offsets) == 0:
        return []
    start = int(offsets.min())
    span = int((offsets + sizes).max()) - start
    fd = os.open(path, os.O_RDONLY)
    try:
        if span <= 2 * int(sizes.sum()) + 65536:
            block = os.pread(fd, span, start)
            if len(block) < span:
                raise GulpError(
                    f"{path}: data file ends at {start + len(block)}, records need {start + span}"
                )
            view = memoryview(block)
            return [
                bytes(view[o - start : o - start + s])
                for o, s in zip(offsets.tolist(), sizes.tolist(), strict=True)
            ]
        out = []
        for offset, size in zip(offsets.tolist(), sizes.tolist(), strict=True):
            record = os.pread(fd, size, offset)
            if len(record) < size:
                raise GulpError(
                    f"{path}: data file ends at {offset + len(record)}, "
                    f"a record needs {offset + size}"
                )
            out.append(record)
        return out
    finally:
        os.close(fd)

"""Turn a decoded YUV frame into output pixels: crop window, resize, colour conversion, flips.

The work is ``_frame.write_frame`` (numba, no GIL), shared with the compiled clip drivers: the
crop window resized plane by plane with the one antialiased filter (``_resize``: only the window
is read), converted with the video's own matrix and range straight into the planar output
(``_planar_rgb``), flipped where the pixels are stored. This module holds the Python side:
matrices, crops, packed layouts, and the per-thread buffers for frames PyAV decoded.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import cv2
import numpy as np

if TYPE_CHECKING:
    from kohakuclip.decode._frame import Scratch

__all__ = [
    "Crop",
    "OutputMode",
    "PixelWriter",
    "Planes",
    "frame_planes",
    "square_crop",
    "yuv420_frame_bytes",
    "yuv420_planes",
    "yuv_to_rgb_matrix",
]


OutputMode = Literal["rgb", "yuv_resized", "yuv"]

# Parallelism comes from the decode pool, one frame per thread: OpenCV's own worker threads would
# only oversubscribe the cores, and a pool thread caught mid-call by a DataLoader fork can leave
# the child a locked mutex.
cv2.setNumThreads(0)

_KR_KB = {"bt601": (0.299, 0.114), "bt709": (0.2126, 0.0722)}


def yuv_to_rgb_matrix(colorspace: str, full_range: bool) -> np.ndarray:
    """3x4 float32 matrix M with [R G B] = M @ [Y U V 1] for 8-bit samples."""
    kr, kb = _KR_KB.get(colorspace, _KR_KB["bt601"])
    kg = 1.0 - kr - kb
    if full_range:
        ys, yo, cs = 1.0, 0.0, 1.0
    else:
        ys, yo, cs = 255.0 / 219.0, 16.0, 255.0 / 224.0
    rv = 2.0 * (1.0 - kr) * cs
    gu = -2.0 * kb * (1.0 - kb) / kg * cs
    gv = -2.0 * kr * (1.0 - kr) / kg * cs
    bu = 2.0 * (1.0 - kb) * cs
    m = np.array(
        [[ys, 0.0, rv], [ys, gu, gv], [ys, bu, 0.0]],
        dtype=np.float64,
    )
    offset = -m @ np.array([yo, 128.0, 128.0])
    return np.concatenate([m, offset[:, None]], axis=1).astype(np.float32)


@dataclass(frozen=True)
class Crop:
    """A window of the stored frame, in luma pixels (x and y even, so chroma stays aligned)."""

    x: int
    y: int
    w: int
    h: int


def square_crop(width: int, height: int, rng: np.random.Generator | None) -> Crop:
    """The short-side square: at a random position along the long side, or centred (rng=None)."""
    side = min(width, height)
    room_x, room_y = width - side, height - side
    if rng is None:
        x, y = room_x // 2, room_y // 2
    else:
        x = int(rng.integers(0, room_x + 1)) if room_x else 0
        y = int(rng.integers(0, room_y + 1)) if room_y else 0
    return Crop(x & ~1, y & ~1, side, side)


Taps = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


_SHIFTS = {
    "yuv420p": (1, 1),
    "yuvj420p": (1, 1),
    "yuv422p": (1, 0),
    "yuvj422p": (1, 0),
    "yuv444p": (0, 0),
    "yuvj444p": (0, 0),
}

Planes = tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]
"""Y, U, V arrays over whole rows, and the chroma subsampling as (x, y) shifts."""


def frame_planes(frame: object) -> Planes:
    """Zero-copy Y, U, V arrays of a decoded 8-bit PyAV frame (4:2:0, 4:2:2, 4:4:4; gray gets
    neutral chroma; other formats are converted to 4:2:0), with its chroma shifts.

    Whole rows, line padding included: C-contiguous, which the RGB conversion needs to run at
    full speed. Read them through a crop window inside the frame."""
    fmt = frame.format.name  # type: ignore[attr-defined]
    if fmt == "gray":
        (py,) = frame.planes  # type: ignore[attr-defined]
        y = _rows(py)
        neutral = np.full(y.shape, 128, np.uint8)
        return y, neutral, neutral, (0, 0)
    shifts = _SHIFTS.get(fmt)
    if shifts is None:
        frame = frame.reformat(format="yuv420p")  # type: ignore[attr-defined]
        shifts = (1, 1)
    py, pu, pv = frame.planes  # type: ignore[attr-defined]
    return _rows(py), _rows(pu), _rows(pv), shifts


def _rows(plane: Any) -> np.ndarray:
    """A PyAV plane's whole rows. A plane the decoder hands over bottom-up (a negative line
    size: MJPEG after a "Metasoft MJPEG Codec" comment) comes as a copy of its rows in stored
    order, as Pillow decodes it and as the compiled path reads it."""
    if plane.line_size >= 0:
        return np.ndarray((plane.height, plane.line_size), np.uint8, plane)
    stride = -plane.line_size
    lowest = plane.buffer_ptr + (plane.height - 1) * plane.line_size
    stored = (ctypes.c_uint8 * (plane.height * stride)).from_address(lowest)
    return np.frombuffer(stored, np.uint8).reshape(plane.height, stride).copy()


def yuv420_planes(flat: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Views of the Y (side x side) and U, V (ceil(side/2) squared) planes packed in ``flat``."""
    c = (side + 1) // 2
    y = flat[: side * side].reshape(side, side)
    u = flat[side * side : side * side + c * c].reshape(c, c)
    v = flat[side * side + c * c : side * side + 2 * c * c].reshape(c, c)
    return y, u, v


def yuv420_frame_bytes(side: int) -> int:
    """Bytes of one packed 4:2:0 frame of ``side`` x ``side`` pixels."""
    c = (side + 1) // 2
    return side * side + 2 * c * c


class PixelWriter:
    """Per-thread buffers for the per-frame pixel pipeline (``_frame.write_frame``) of one output
    mode and size, for frames decoded outside the compiled drivers (PyAV).

    ``rgb``: the crop resized to ``size`` and converted, planar [3, size, size], flipped.
    ``yuv_resized``: the crop's planes resized to ``size`` (chroma at half), packed 4:2:0, flipped.
    ``yuv``: the crop's planes at stored resolution, packed 4:2:0 into a ``window`` square (top
    left; the rest of the frame is left as is), not flipped: the batch records crop and flips.
    """

    def __init__(self, size: int, mode: OutputMode = "rgb", window: int = 512) -> None:
        self.size = size
        self.mode = mode
        self.window = window
        self._matrices: dict[tuple[str, bool], np.ndarray] = {}
        self._taps: dict[tuple[int, ...], tuple[Taps, Taps]] = {}
        self._scratch: Scratch | None = None

    @staticmethod
    def frame_shape(size: int, mode: OutputMode, window: int = 512) -> tuple[int, ...]:
        """Shape of one output frame."""
        if mode == "rgb":
            return (3, size, size)
        return (yuv420_frame_bytes(window if mode == "yuv" else size),)

    def matrix(self, colorspace: str, full_range: bool) -> np.ndarray:
        """The YUV -> RGB matrix of a colorspace and range (cached)."""
        key = (colorspace, full_range)
        m = self._matrices.get(key)
        if m is None:
            m = self._matrices[key] = yuv_to_rgb_matrix(colorspace, full_range)
        return m

    def write(
        self,
        planes: tuple[np.ndarray, np.ndarray, np.ndarray],
        crop: Crop,
        hflip: bool,
        vflip: bool,
        colorspace: str,
        full_range: bool,
        dst: np.ndarray,
        shifts: tuple[int, int] = (1, 1),
    ) -> None:
        """Write one frame's output into ``dst`` (shape ``frame_shape``); ``shifts``: the
        chroma subsampling as (x, y) shifts ((1, 1) for 4:2:0, (0, 0) for 4:4:4)."""
        from kohakuclip.decode._frame import write_frame

        row, mode, taps, scratch = self._prepare(crop, hflip, vflip, shifts)
        write_frame(
            *planes,
            row,
            self.matrix(colorspace, full_range),
            mode,
            self.size,
            self.window,
            *taps,
            scratch,
            dst.reshape(-1),
        )

    def write_rgb(
        self, rgb: np.ndarray, crop: Crop, hflip: bool, vflip: bool, dst: np.ndarray
    ) -> None:
        """Write the output of an RGB picture (uint8 [H, W, 3], C-contiguous) into ``dst``
        (shape ``frame_shape``); the yuv modes take its JFIF YCbCr (full-range BT.601)."""
        from kohakuclip.decode._frame import write_rgb_frame

        row, mode, taps, scratch = self._prepare(crop, hflip, vflip, (0, 0))
        height, width = rgb.shape[:2]
        flat = rgb.reshape(height, 3 * width)
        write_rgb_frame(flat, row, mode, self.size, self.window, taps[0], scratch, dst.reshape(-1))

    def _prepare(
        self, crop: Crop, hflip: bool, vflip: bool, shifts: tuple[int, int]
    ) -> tuple[np.ndarray, int, tuple[Taps, Taps], Scratch]:
        """The crop row, the mode's number and the taps of a frame, and the scratch, grown to
        its window."""
        from kohakuclip.decode._frame import MODES, frame_taps, new_scratch

        rows = max(crop.w, crop.h, 2)
        scratch = self._scratch
        if scratch is None or scratch[0].shape[0] < 3 * rows:
            scratch = self._scratch = new_scratch(rows, self.size, self.window)
        row = np.array([crop.x, crop.y, crop.w, crop.h, hflip, vflip, *shifts], np.int64)
        mode = MODES.index(self.mode)
        key = (crop.x & 1, crop.y & 1, crop.w, crop.h, *shifts)
        taps = self._taps.get(key)
        if taps is None:
            taps = self._taps[key] = frame_taps(row, mode, self.size)
        return row, mode, taps, scratch

"""Turn a decoded YUV frame into output pixels: crop window, resize, colour conversion, flips.

The crop window is resized plane by plane with the one antialiased filter (``_resize``: only the
window is read), then converted with the video's own matrix and range straight into the planar
output (``_planar_rgb``); both are numba. A window that already has the output size, or exactly
twice it in luma (the filter's 2x2 box, averaged in the conversion), goes to the conversion as it
is. Flips happen where the pixels are stored. Every step releases the GIL and writes into reused
buffers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np

from kohakuclip.decode import _resize

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


def frame_planes(frame: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Zero-copy Y, U, V arrays of a decoded 8-bit 4:2:0 PyAV frame (other formats converted).

    Whole rows, line padding included: C-contiguous, which the RGB conversion needs to run at
    full speed. Read them through a crop window inside the frame."""
    fmt = frame.format.name  # type: ignore[attr-defined]
    if fmt not in ("yuv420p", "yuvj420p"):
        frame = frame.reformat(format="yuv420p")  # type: ignore[attr-defined]
    py, pu, pv = frame.planes  # type: ignore[attr-defined]
    return (
        np.ndarray((py.height, py.line_size), np.uint8, py),
        np.ndarray((pu.height, pu.line_size), np.uint8, pu),
        np.ndarray((pv.height, pv.line_size), np.uint8, pv),
    )


def _chroma_window(c: np.ndarray, crop: Crop) -> np.ndarray:
    x0, y0 = crop.x // 2, crop.y // 2
    return c[y0 : (crop.y + crop.h + 1) // 2, x0 : (crop.x + crop.w + 1) // 2]


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
    """Per-thread buffers and the per-frame pixel pipeline for one output mode and size.

    ``rgb``: the crop resized to ``size`` and converted, planar [3, size, size], flipped.
    ``yuv_resized``: the crop's planes resized to ``size`` (chroma at half), packed 4:2:0, flipped.
    ``yuv``: the crop's planes at stored resolution, packed 4:2:0 into a ``window`` square (top
    left; the rest of the frame is left as is), not flipped: the batch records crop and flips.
    """

    def __init__(self, size: int, mode: OutputMode = "rgb", window: int = 512) -> None:
        self.size = size
        self.mode = mode
        self.window = window
        s = size
        self._resize = _resize.Resizer()
        if mode == "rgb":
            from kohakuclip.decode import _planar_rgb

            self._planar_rgb = _planar_rgb.planar_rgb
            self._planar_rgb_box2 = _planar_rgb.planar_rgb_box2
            self._y = np.empty((s, s), np.uint8)
            self._u = np.empty((s, s), np.uint8)
            self._v = np.empty((s, s), np.uint8)
        self._matrices: dict[tuple[str, bool], np.ndarray] = {}

    @staticmethod
    def frame_shape(size: int, mode: OutputMode, window: int = 512) -> tuple[int, ...]:
        """Shape of one output frame."""
        if mode == "rgb":
            return (3, size, size)
        return (yuv420_frame_bytes(window if mode == "yuv" else size),)

    def _matrix(self, colorspace: str, full_range: bool) -> np.ndarray:
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
    ) -> None:
        """Write one frame's output into ``dst`` (shape ``frame_shape``)."""
        y, u, v = planes
        windows = (
            y[crop.y : crop.y + crop.h, crop.x : crop.x + crop.w],
            _chroma_window(u, crop),
            _chroma_window(v, crop),
        )
        if self.mode == "rgb":
            matrix = self._matrix(colorspace, full_range)
            self._write_rgb(planes, windows, crop, matrix, hflip, vflip, dst)
        elif self.mode == "yuv_resized":
            for src, out in zip(windows, yuv420_planes(dst, self.size)):
                self._resize(src, out, hflip, vflip)
        else:
            for src, out in zip(windows, yuv420_planes(dst, self.window)):
                out[: src.shape[0], : src.shape[1]] = src

    def _write_rgb(
        self,
        planes: tuple[np.ndarray, np.ndarray, np.ndarray],
        windows: tuple[np.ndarray, np.ndarray, np.ndarray],
        crop: Crop,
        matrix: np.ndarray,
        hflip: bool,
        vflip: bool,
        dst: np.ndarray,
    ) -> None:
        """Resize what needs it into the scratch planes, then convert into ``dst`` (flipped)."""
        s = self.size
        y, u, v = planes
        cy, cx = crop.y // 2, crop.x // 2
        if not (windows[1].shape == (s, s) and u.flags.c_contiguous and v.flags.c_contiguous):
            self._resize(windows[1], self._u, False, False)
            self._resize(windows[2], self._v, False, False)
            u, v, cy, cx = self._u, self._v, 0, 0
        pairs = crop.x % 2 == 0 and y.shape[1] % 2 == 0 and y.flags.c_contiguous
        if crop.w == crop.h == 2 * s and pairs:
            luma16 = y.view(np.uint16)
            self._planar_rgb_box2(
                luma16, crop.y, crop.x // 2, u, v, cy, cx, matrix, vflip, hflip, dst
            )
            return
        if not (crop.w == crop.h == s and y.flags.c_contiguous):
            self._resize(windows[0], self._y, False, False)
            y, crop = self._y, Crop(0, 0, s, s)
        self._planar_rgb(y, crop.y, crop.x, u, v, cy, cx, matrix, vflip, hflip, dst)

"""RGB to JFIF YCbCr (decode/_ycbcr.py) against OpenCV: every RGB triple, and 4:2:0 windows of
odd and even sizes against OpenCV's conversion and area filter over edge-replicated planes."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from kohakuclip.decode._ycbcr import ycbcr_planes, ycbcr_window_420


def _opencv(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Y, Cb, Cr of uint8 [h, w, 3] RGB, as OpenCV converts it."""
    ycrcb = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2YCrCb)
    return ycrcb[..., 0], ycrcb[..., 2], ycrcb[..., 1]


def test_every_rgb_triple_converts_as_opencv_does() -> None:
    values = np.arange(256, dtype=np.uint8)
    red, green, blue = (a.reshape(4096, 4096) for a in np.meshgrid(values, values, values))
    y, cb, cr = (np.empty((4096, 4096), np.uint8) for _ in range(3))
    ycbcr_planes(red, green, blue, y, cb, cr)
    want_y, want_cb, want_cr = _opencv(np.dstack([red, green, blue]))
    np.testing.assert_array_equal(y, want_y)
    np.testing.assert_array_equal(cb, want_cb)
    np.testing.assert_array_equal(cr, want_cr)


def test_chroma_may_overwrite_the_green_and_blue_planes() -> None:
    rng = np.random.default_rng(1)
    red, green, blue = (rng.integers(0, 256, (17, 23), dtype=np.uint8) for _ in range(3))
    want = _opencv(np.dstack([red, green, blue]))
    y = np.empty_like(red)
    ycbcr_planes(red, green, blue, y, green, blue)
    for got, expected in zip((y, green, blue), want, strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("size", [(16, 24), (17, 24), (16, 25), (1, 1), (33, 7)])
def test_a_window_as_420_planes_is_opencv_on_replicated_edges(size: tuple[int, int]) -> None:
    h, w = size
    rng = np.random.default_rng(2)
    picture = rng.integers(0, 256, (h + 3, w + 5, 3), dtype=np.uint8)
    window = picture[2 : 2 + h, 3 : 3 + w]
    ch, cw = (h + 1) // 2, (w + 1) // 2
    y = np.full((h + 4, w + 4), 7, np.uint8)
    cb, cr = np.full((ch + 2, cw + 2), 7, np.uint8), np.full((ch + 2, cw + 2), 7, np.uint8)
    ycbcr_window_420(picture.reshape(h + 3, -1)[2 : 2 + h, 9 : 9 + 3 * w], y, cb, cr)
    want_y, want_cb, want_cr = _opencv(window)
    np.testing.assert_array_equal(y[:h, :w], want_y)
    for got, full in ((cb, want_cb), (cr, want_cr)):
        edged = cv2.copyMakeBorder(full, 0, 2 * ch - h, 0, 2 * cw - w, cv2.BORDER_REPLICATE)
        half = cv2.resize(edged, (cw, ch), interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(got[:ch, :cw], half)
        assert (got[ch:] == 7).all() and (got[:, cw:] == 7).all()  # nothing written outside
    assert (y[h:] == 7).all() and (y[:, w:] == 7).all()

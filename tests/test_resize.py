"""The shared resize (decode/_resize.py): taps against Pillow's own weights, the numba kernel
against Pillow's 8-bit resize and against a numpy emulation of its integer arithmetic, the two
shorter roads (copy, 2x box) against Pillow, flips, bad arguments, and quality on real footage
against an area-filtered reference."""

from __future__ import annotations

import os

import av
import cv2
import numpy as np
import pytest
from PIL import Image

from kohakuclip.decode._resize import (
    PRECISION_BITS,
    _store_transposed,
    resize,
    resize_rgb,
    resize_taps,
    resize_window,
    tmp_shape,
)
from tests.media import psnr

REAL = "/tmp/kc-real/pans/pan_Autumn.mp4"

# (in_h, in_w, out_h, out_w): shrinks from 1x to 8x, enlargements, both axes apart, odd sizes
RATIOS = [
    (405, 405, 256, 256),  # 1.58x, the real-footage case
    (512, 910, 256, 300),  # 2x by 3.03x
    (300, 300, 256, 256),  # 1.17x
    (640, 410, 256, 128),  # 2.5x by 3.2x
    (203, 203, 256, 256),  # chroma enlarged 1.26x
    (97, 61, 12, 9),  # ~8x, odd
    (33, 47, 64, 20),  # 0.52x by 2.35x
    (7, 9, 15, 4),
    (1, 5, 3, 2),
    (41, 13, 41, 6),  # one axis unchanged
    (256, 257, 256, 256),  # a column too many
]


def _integer(in_size: int, out_size: int) -> bool:
    return in_size % out_size == 0 and in_size > out_size


def _pillow(src: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Pillow, axis by axis as the filter is defined: an exact integer shrink is ``reduce``,
    any other ratio ``resize(BILINEAR)``; the vertical axis first, 8 bits in between (2x on
    both axes: ``reduce(2)``, rounded once)."""
    image = Image.fromarray(np.ascontiguousarray(src))
    (h, w) = src.shape
    if (h, w) == (2 * out_h, 2 * out_w):
        return np.asarray(image.reduce(2))
    if _integer(h, out_h):
        image = image.reduce((1, h // out_h))
    elif h != out_h:
        image = image.resize((w, out_h), Image.Resampling.BILINEAR)
    if _integer(w, out_w):
        image = image.reduce((w // out_w, 1))
    elif w != out_w:
        image = image.resize((out_w, out_h), Image.Resampling.BILINEAR)
    return np.asarray(image)


def _pillow_weights(in_size: int, out_size: int) -> np.ndarray:
    """Pillow's BILINEAR weights [out, in], read from its float resize of unit impulses."""
    eye = np.eye(in_size, dtype=np.float32)
    image = Image.fromarray(eye, "F").resize((out_size, in_size), Image.Resampling.BILINEAR)
    return np.asarray(image).T.astype(np.float64)


def _dense(in_size: int, out_size: int) -> np.ndarray:
    starts, weights = resize_taps(in_size, out_size)
    dense = np.zeros((out_size, in_size), np.int64)
    for i in range(out_size):
        dense[i, starts[i] : starts[i] + weights.shape[1]] = weights[i]
    return dense


def _emulate(src: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """The documented arithmetic in numpy: vertical pass, round to 8 bits, horizontal pass."""

    def round8(acc: np.ndarray) -> np.ndarray:
        return np.clip((acc + (1 << (PRECISION_BITS - 1))) >> PRECISION_BITS, 0, 255)

    tall = round8(_dense(src.shape[0], out_h) @ src.astype(np.int64))
    return round8(tall @ _dense(src.shape[1], out_w).T).astype(np.uint8)


@pytest.mark.parametrize(
    ("in_size", "out_size"), [(405, 256), (910, 256), (7, 15), (203, 256), (61, 9), (5, 2)]
)
def test_taps_are_pillows_weights(in_size: int, out_size: int) -> None:
    got = _dense(in_size, out_size) / float(1 << PRECISION_BITS)
    # fixed point rounds each weight to 2**-23; Pillow's float image holds float32
    np.testing.assert_allclose(got, _pillow_weights(in_size, out_size), atol=4e-7)
    starts, weights = resize_taps(in_size, out_size)
    assert starts.dtype == weights.dtype == np.int32
    assert starts.min() >= 0 and starts.max() + weights.shape[1] <= in_size
    assert not weights.flags.writeable and resize_taps(in_size, out_size)[1] is weights


@pytest.mark.parametrize(("in_size", "factor"), [(512, 2), (30, 3), (64, 8)])
def test_exact_integer_shrinks_are_boxes(in_size: int, factor: int) -> None:
    starts, weights = resize_taps(in_size, in_size // factor)
    assert weights.shape[1] == factor
    np.testing.assert_array_equal(starts, np.arange(in_size // factor) * factor)
    assert np.all(np.abs(weights * factor - (1 << PRECISION_BITS)) <= factor)


@pytest.mark.parametrize(("in_h", "in_w", "out_h", "out_w"), RATIOS)
def test_kernel_is_within_one_level_of_pillow_and_exactly_its_arithmetic(
    in_h: int, in_w: int, out_h: int, out_w: int
) -> None:
    rng = np.random.default_rng(in_h * 1000 + in_w)
    src = rng.integers(0, 256, (in_h, in_w), dtype=np.uint8)
    got = resize(src, out_h, out_w)
    assert got.shape == (out_h, out_w)
    np.testing.assert_array_equal(got, _emulate(src, out_h, out_w))
    assert np.abs(got.astype(int) - _pillow(src, out_h, out_w)).max() <= 1
    if not (_integer(in_h, out_h) or _integer(in_w, out_w)):
        # Pillow's own 2-D resize runs the passes in whichever order keeps its intermediate
        # smaller; ours is always vertical first: the 8-bit rounding between them may differ
        whole = np.asarray(Image.fromarray(src).resize((out_w, out_h), Image.Resampling.BILINEAR))
        assert np.abs(got.astype(int) - whole).max() <= 1


def test_strided_windows_read_like_contiguous_copies() -> None:
    rng = np.random.default_rng(11)
    frame = rng.integers(0, 256, (300, 500, 3), dtype=np.uint8)
    windows = [
        frame[10:290, 33:401, 1],  # one channel of interleaved pixels: column stride 3
        frame[::2, ::3, 0],  # every other row, every third column
        frame[::-1, 40:300, 2],  # negative row stride
        np.asfortranarray(frame[:250, :260, 0]),  # column-major
    ]
    for window in windows:
        for out in ((128, 128), (200, 97), (window.shape[0] // 2, window.shape[1] // 2)):
            contiguous = resize(np.ascontiguousarray(window), *out)
            np.testing.assert_array_equal(resize(window, *out), contiguous)
            assert np.abs(contiguous.astype(int) - _pillow(window, *out)).max() <= 1


@pytest.mark.parametrize(
    ("window", "out"),
    [((300, 411), (128, 128)), ((61, 47), (40, 53)), ((64, 90), (32, 45)), ((64, 90), (64, 90))],
)
@pytest.mark.parametrize(("hflip", "vflip"), [(False, False), (True, False), (True, True)])
def test_interleaved_rgb_resizes_as_each_channel_alone(window, out, hflip, vflip) -> None:
    """``resize_rgb`` on an RGB window inside a wider, padded picture: per channel the bytes of
    ``resize_window`` on that channel as a contiguous plane (shrinks, an enlargement, the 2x
    box and the copy)."""
    rng = np.random.default_rng(14)
    h, w = window
    picture = rng.integers(0, 256, (h + 9, 3 * (w + 13) + 5), dtype=np.uint8)  # padded rows
    pixels = picture[4 : 4 + h, 3 * 7 : 3 * (7 + w)]
    hs, hw = resize_taps(w, out[1])
    vs, vw = resize_taps(h, out[0])
    tmp = np.empty((3 * w, out[0]), np.uint8)
    got = np.empty((3, *out), np.uint8)
    resize_rgb(pixels, hs, hw, vs, vw, tmp, got[0], got[1], got[2], hflip, vflip)
    for c in range(3):
        plane = np.ascontiguousarray(pixels.reshape(h, w, 3)[:, :, c])
        want = np.empty(out, np.uint8)
        resize_window(plane, hs, hw, vs, vw, np.empty((w, out[0]), np.uint8), want, hflip, vflip)
        np.testing.assert_array_equal(got[c], want)
    if (h, w) != out and (h, w) != (2 * out[0], 2 * out[1]):  # the filter: three channels' tmp
        small = np.empty((w, out[0]), np.uint8)
        with pytest.raises(ValueError, match="tmp is smaller"):
            resize_rgb(pixels, hs, hw, vs, vw, small, got[0], got[1], got[2], False, False)


def test_the_two_shorter_roads_are_pillows_copy_and_reduce() -> None:
    rng = np.random.default_rng(12)
    src = rng.integers(0, 256, (64, 90), dtype=np.uint8)
    np.testing.assert_array_equal(resize(src, 64, 90), src)
    reduced = np.asarray(Image.fromarray(src).reduce(2))  # the 2x2 mean, rounded once
    np.testing.assert_array_equal(resize(src, 32, 45), reduced)
    # one axis exactly 2x, the other not: the general path with box taps on that axis
    np.testing.assert_array_equal(resize(src, 32, 40), _emulate(src, 32, 40))


@pytest.mark.parametrize("out", [(40, 30), (32, 45), (64, 90), (100, 131)])
@pytest.mark.parametrize(("hflip", "vflip"), [(True, False), (False, True), (True, True)])
def test_flips_are_numpy_flips(out: tuple[int, int], hflip: bool, vflip: bool) -> None:
    rng = np.random.default_rng(13)
    src = rng.integers(0, 256, (64, 90), dtype=np.uint8)[:, 1:]
    src = np.ascontiguousarray(src[:, :90]) if out == (32, 45) else src  # 2x needs 90 columns
    h, w = src.shape
    hs, hw = resize_taps(w, out[1])
    vs, vw = resize_taps(h, out[0])
    tmp = np.empty(tmp_shape(src.shape, out), np.uint8)
    plain, flipped = np.empty(out, np.uint8), np.empty(out, np.uint8)
    resize_window(src, hs, hw, vs, vw, tmp, plain, False, False)
    resize_window(src, hs, hw, vs, vw, tmp, flipped, hflip, vflip)
    want = plain[::-1] if vflip else plain
    np.testing.assert_array_equal(flipped, want[:, ::-1] if hflip else want)


def test_bad_arguments_raise_clear_errors() -> None:
    src = np.zeros((40, 50), np.uint8)
    hs, hw = resize_taps(50, 20)
    vs, vw = resize_taps(40, 16)
    dst = np.empty((16, 20), np.uint8)
    with pytest.raises(ValueError, match="taps do not match"):
        resize_window(
            src,
            hs,
            hw,
            vs,
            vw,
            np.empty((50, 16), np.uint8),
            np.empty((16, 21), np.uint8),
            False,
            False,
        )
    with pytest.raises(ValueError, match="outside the source"):
        resize_window(src[:, :30], hs, hw, vs, vw, np.empty((50, 16), np.uint8), dst, False, False)
    with pytest.raises(ValueError, match="tmp is smaller"):
        resize_window(src, hs, hw, vs, vw, np.empty((10, 16), np.uint8), dst, False, False)
    with pytest.raises(ValueError, match="must be positive"):
        resize_taps(0, 5)
    with pytest.raises(ValueError, match="2-D uint8"):
        resize(np.zeros((4, 4, 3), np.uint8), 2, 2)


def _area(plane: np.ndarray, out: int) -> np.ndarray:
    """Exact area averaging in float64 (each output the mean of the source area it covers)."""

    def matrix(n: int) -> np.ndarray:
        edges = np.arange(out + 1) * (n / out)
        lo, hi = edges[:-1, None], edges[1:, None]
        cells = np.arange(n)[None, :]
        cover = np.clip(np.minimum(hi, cells + 1) - np.maximum(lo, cells), 0, None)
        return cover / (n / out)

    return matrix(plane.shape[0]) @ plane.astype(np.float64) @ matrix(plane.shape[1]).T


@pytest.fixture(scope="module")
def real_luma() -> np.ndarray:
    if not os.path.exists(REAL):
        pytest.skip(f"real footage not fetched ({REAL}: ../shared/tools/real-footage.sh)")
    with av.open(REAL) as container:
        frame = next(container.decode(video=0))
    return frame.to_ndarray(format="yuv420p")[: frame.height]


def test_real_footage_405_to_256_is_close_to_the_area_filter(real_luma: np.ndarray) -> None:
    """1080p camera footage stored at short side 405 (the writer's area scaler), its short-side
    square shrunk to 256 (1.58x): measured 58.5 dB against exact area averaging on this (smooth)
    first frame; plain bilinear, the old video path, 58.0 (47.3 against 44.8 on Big Buck Bunny)."""
    h, w = real_luma.shape
    stored = cv2.resize(real_luma, (round(w * 405 / h), 405), interpolation=cv2.INTER_AREA)
    x = (stored.shape[1] - 405) // 2 & ~1
    window = stored[:, x : x + 405]
    assert psnr(resize(window, 256, 256), _area(window, 256)) >= 39


def test_real_footage_exact_2x_is_the_area_filter(real_luma: np.ndarray) -> None:
    """A 512 window to 256 is OpenCV's area filter bit for bit (the old path): no softer."""
    window = real_luma[:512, 300:812]
    want = cv2.resize(window, (256, 256), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(resize(window, 256, 256), want)


def test_random_sizes_sweep() -> None:
    """150 random size pairs up to 120 (the 1500-pair sweep run once: at most 1 level too)."""
    rng = np.random.default_rng(5)
    for _ in range(150):
        h, w, out_h, out_w = (int(v) for v in rng.integers(1, 121, 4))
        src = rng.integers(0, 256, (h, w), dtype=np.uint8)
        got = resize(src, out_h, out_w)
        np.testing.assert_array_equal(got, _emulate(src, out_h, out_w))
        assert np.abs(got.astype(int) - _pillow(src, out_h, out_w)).max() <= 1, (h, w, out_h, out_w)


def test_transposed_stores_are_numpy_transposes() -> None:
    """The kernel's tiled transposes (16x16 tiles, 8x8 ones at their edges, bytes at the last
    edges) against numpy, for block shapes on either side of each tile size, at an offset into
    a wider output, and into a strided output (bytes only)."""
    rng = np.random.default_rng(9)
    for rows in (1, 7, 8, 9, 15, 16, 17, 24, 33, 64):
        for ncols in (1, 8, 15, 16, 23, 24, 40, 404):
            block = rng.integers(0, 256, (64, ncols + 5), dtype=np.uint8)
            out = rng.integers(0, 256, (ncols + 3, 100), dtype=np.uint8)
            want = out.copy()
            want[:ncols, 20 : 20 + rows] = block[:rows, :ncols].T
            _store_transposed(block, rows, ncols, out, 20)
            np.testing.assert_array_equal(out, want, err_msg=f"{rows} x {ncols}")
    block = rng.integers(0, 256, (32, 40), dtype=np.uint8)
    wide = np.zeros((40, 64), np.uint8)
    _store_transposed(block, 32, 40, wide[:, ::2], 0)
    np.testing.assert_array_equal(wide[:, ::2], block.T)

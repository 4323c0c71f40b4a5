"""Windows with alpha or a palette onto white (decode/_alpha.py) against Pillow's composite
(``imaging.flatten``): every value and alpha, gray + alpha, and palette pictures with tRNS."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from kohakuclip.decode import _avcodec
from kohakuclip.decode._alpha import flatten_window
from kohakuclip.imaging import flatten


def test_every_value_and_alpha_composites_as_pillow_does() -> None:
    values = np.arange(256, dtype=np.uint8)
    value, alpha = np.meshgrid(values, values, indexing="ij")
    rgba = np.dstack([value, 255 - value, value // 2, alpha]).astype(np.uint8)
    out = np.empty((256, 3 * 256), np.uint8)
    flatten_window(rgba.reshape(256, -1), np.zeros(0, np.uint8), _avcodec.RGBA, 0, 0, out)
    want = np.asarray(flatten(Image.fromarray(rgba, "RGBA")))
    np.testing.assert_array_equal(out.reshape(256, 256, 3), want)


def test_a_gray_and_alpha_window_inside_a_padded_picture() -> None:
    rng = np.random.default_rng(3)
    la = rng.integers(0, 256, (30, 41, 2), dtype=np.uint8)
    picture = np.zeros((30, 2 * 41 + 6), np.uint8)  # rows padded as a decoder pads them
    picture[:, : 2 * 41] = la.reshape(30, -1)
    out = np.empty((12, 3 * 17), np.uint8)
    flatten_window(picture, np.zeros(0, np.uint8), _avcodec.GRAY_ALPHA, 5, 9, out)
    gray = np.asarray(flatten(Image.fromarray(la, "LA")))[9:21, 5:22]
    np.testing.assert_array_equal(out.reshape(12, 17, 3), np.dstack([gray] * 3))


def test_a_palette_with_transparent_entries_as_pillow_flattens_it() -> None:
    """A palette PNG whose tRNS makes some entries transparent and some half so, decoded by
    libavcodec (indices and its BGRA palette words) and flattened, against Pillow."""
    import av

    rng = np.random.default_rng(4)
    image = Image.fromarray(rng.integers(0, 256, (24, 33, 3), dtype=np.uint8)).quantize(64)
    buf = io.BytesIO()
    image.save(buf, "PNG", transparency=bytes([0, 128, 255, 40] * 4))
    frame = av.CodecContext.create("png", "r").decode(av.Packet(buf.getvalue()))[0]
    assert frame.format.name == "pal8"
    indices = np.frombuffer(frame.planes[0], np.uint8).reshape(24, -1)
    palette = np.frombuffer(frame.planes[1], np.uint8)[:1024].copy()
    out = np.empty((24, 3 * 33), np.uint8)
    flatten_window(indices, palette, _avcodec.PALETTE, 0, 0, out)
    want = np.asarray(flatten(Image.open(io.BytesIO(buf.getvalue()))))
    np.testing.assert_array_equal(out.reshape(24, 33, 3), want)

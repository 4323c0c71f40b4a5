"""What a source video becomes when stored: upright orientation, size and colour.

Both encode backends (PyAV in-process and the ffmpeg command line) share these decisions, and they
share the filter chain that carries them out, so the two store the same pixels.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from kohakuclip.codecs.colour import is_hd
from kohakuclip.formats import Colorspace

__all__ = [
    "Colour",
    "Layout",
    "Orientation",
    "choose_colour",
    "display_matrix_orientation",
    "plan_layout",
    "stored_size",
]


# FFmpeg's AVColorSpace values (frame.colorspace) and the names the scale filter knows them by.
_MATRIX_NAMES = {1: "bt709", 4: "fcc", 5: "bt470bg", 6: "smpte170m", 7: "smpte240m", 9: "bt2020"}
_BT709, _SMPTE170M = 1, 6
_STORED_MATRIX: dict[int, Colorspace] = {1: "bt709", 5: "bt601", 6: "bt601"}
_UNSPECIFIED = 2
_LIMITED, _FULL = 1, 2


@dataclass(frozen=True)
class Orientation:
    """How to turn decoded pixels upright: transpose first, then mirror."""

    transpose: bool = False
    hflip: bool = False
    vflip: bool = False

    @classmethod
    def from_display_matrix(cls, matrix: Sequence[int]) -> Orientation:
        """Read FFmpeg's 3x3 display matrix (16.16 fixed point, row-major).

        A source pixel (x, y) is displayed at (a*x + c*y, b*x + d*y) with ``a, b, c, d`` the
        matrix entries 0, 1, 3 and 4; right angles and mirrors are all that phones write.
        """
        a, b, c, d = matrix[0], matrix[1], matrix[3], matrix[4]
        if abs(a) >= abs(b):
            return cls(False, a < 0, d < 0)
        return cls(True, c < 0, b < 0)

    def filters(self) -> list[tuple[str, str]]:
        """The FFmpeg filters that apply this orientation."""
        if self.transpose:
            # transpose directions: 0 plain transpose, 1 clockwise, 2 counter-clockwise, 3 both
            return [("transpose", f"dir={int(self.hflip) + 2 * int(self.vflip)}")]
        out = []
        if self.hflip:
            out.append(("hflip", ""))
        if self.vflip:
            out.append(("vflip", ""))
        return out


def display_matrix_orientation(side_data: bytes | None) -> Orientation:
    """Orientation from the bytes of a DISPLAYMATRIX side data entry (upright when absent)."""
    if not side_data or len(side_data) < 36:
        return Orientation()
    return Orientation.from_display_matrix(struct.unpack("<9i", bytes(side_data[:36])))


def _even(value: float) -> int:
    """The nearest even integer, at least 2."""
    return max(2, math.floor(value / 2 + 0.5) * 2)


def stored_size(width: float, height: float, max_short: int) -> tuple[int, int]:
    """(width, height) with the short side capped at ``max_short`` (0: no cap), never upscaled,
    both even, the aspect ratio kept as closely as even sizes allow."""
    short, long = min(width, height), max(width, height)
    capped = min(short, max_short) if max_short > 0 else short
    new_short = max(2, int(capped) // 2 * 2)
    new_long = min(_even(long * new_short / short), max(2, int(long) // 2 * 2))
    return (new_long, new_short) if width >= height else (new_short, new_long)


@dataclass(frozen=True)
class Colour:
    """Colour decisions: the matrix the stored pixels use and how to get there."""

    stored: Colorspace  # what the index records
    matrix: int  # AVColorSpace tag written to the stream
    primaries: int  # AVColorPrimaries tag
    trc: int  # AVColorTransferCharacteristic tag
    convert_from: str | None  # scale-filter matrix name to convert from, None: keep the values
    full_range_source: bool


def choose_colour(
    colorspace: int,
    color_range: int,
    pix_fmt: str,
    is_rgb: bool,
    primaries: int,
    trc: int,
    width: int,
    height: int,
) -> Colour:
    """Keep a BT.601 / BT.709 source's matrix, tag untagged sources by size (SD / HD), and
    convert RGB and other matrices (BT.2020, SMPTE 240M, FCC) to the size-based one."""
    full = color_range == _FULL or pix_fmt.startswith("yuvj")
    if not is_rgb and colorspace in _STORED_MATRIX:
        matrix, convert = colorspace, None
    else:
        matrix = _BT709 if is_hd(width, height) else _SMPTE170M
        convert = "rgb" if is_rgb else _MATRIX_NAMES.get(colorspace)
    stored = _STORED_MATRIX[matrix]
    default = _BT709 if stored == "bt709" else _SMPTE170M
    keep_tags = convert is None and colorspace in _STORED_MATRIX
    return Colour(
        stored=stored,
        matrix=matrix,
        primaries=primaries if keep_tags and primaries != _UNSPECIFIED else default,
        trc=trc if keep_tags and trc != _UNSPECIFIED else default,
        convert_from=convert,
        full_range_source=full,
    )


@dataclass(frozen=True)
class Layout:
    """Everything the encoder needs to store one video: filter chain, size and colour tags."""

    width: int
    height: int
    orientation: Orientation
    colour: Colour

    def filters(self) -> list[tuple[str, str]]:
        """Scale (area filter) to the stored size as 8-bit 4:2:0 limited range in the chosen
        matrix, then turn upright and tag the colour."""
        c = self.colour
        transpose = self.orientation.transpose
        w, h = (self.height, self.width) if transpose else (self.width, self.height)
        scale = [f"w={w}", f"h={h}", "flags=area", "out_range=tv"]
        scale.append("in_range=" + ("pc" if c.full_range_source else "tv"))
        if c.convert_from != "rgb":
            # both ends named, or the scaler converts a tagged matrix to its default one
            scale.append(f"in_color_matrix={c.convert_from or _MATRIX_NAMES[c.matrix]}")
        scale.append(f"out_color_matrix={_MATRIX_NAMES[c.matrix]}")
        tags = f"color_primaries={c.primaries}:color_trc={c.trc}"
        # converting the matrix only: the scaler would also convert primaries and transfer
        # (and refuses HDR transfers), so give the source the target's first
        retag = [("setparams", tags)] if c.convert_from not in (None, "rgb") else []
        return [
            *retag,
            ("scale", ":".join(scale)),
            ("format", "pix_fmts=yuv420p"),
            *self.orientation.filters(),
            ("setsar", "1"),
            ("setparams", f"range=tv:colorspace={c.matrix}:{tags}"),
        ]


def plan_layout(
    width: int,
    height: int,
    sample_aspect: Fraction | None,
    orientation: Orientation,
    colour_of: Colour,
    max_short: int,
) -> Layout:
    """Stored size from the displayed shape: square pixels, upright, short side capped."""
    display_w = float(width * sample_aspect) if sample_aspect and sample_aspect > 0 else width
    upright = (height, display_w) if orientation.transpose else (display_w, height)
    w, h = stored_size(upright[0], upright[1], max_short)
    return Layout(w, h, orientation, colour_of)

"""Contact sheets: a row of frames per video, spread over its duration, labelled under the row.

Frames are read through the ``Reader`` (centre square, ``thumb`` pixels a side); the sheet is
drawn with Pillow.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from kohakuclip.read.pool import Pending
from kohakuclip.read.reader import Batch, Reader, VideoInfo

__all__ = ["SheetLayout", "contact_sheet"]


BACKGROUND = (255, 255, 255)
TEXT = (20, 20, 20)
MISSING = (200, 200, 200)
"""The colour of a tile whose frame could not be read."""


@dataclass(frozen=True)
class SheetLayout:
    """Where things go: ``columns`` square tiles of ``thumb`` pixels per row, ``pad`` pixels
    around each, and ``lines`` text lines of ``line`` pixels under each row."""

    columns: int
    thumb: int
    pad: int = 4
    line: int = 14
    lines: int = 2

    @property
    def row_height(self) -> int:
        return self.thumb + self.lines * self.line + self.pad

    def size(self, rows: int) -> tuple[int, int]:
        """(width, height) of a sheet of ``rows`` rows."""
        return self.pad + self.columns * (self.thumb + self.pad), self.pad + rows * self.row_height

    def tile(self, row: int, column: int) -> tuple[int, int]:
        """Top-left corner of a tile."""
        return self.pad + column * (self.thumb + self.pad), self.pad + row * self.row_height

    def label(self, row: int, line: int) -> tuple[int, int]:
        """Top-left corner of a text line under a row."""
        return self.pad, self.pad + row * self.row_height + self.thumb + line * self.line


def spread_frames(n: int, columns: int) -> list[int]:
    """``columns`` frames spread over ``n``: the middle of each of ``columns`` equal stretches."""
    return [min(n - 1, int((k + 0.5) * n / columns)) for k in range(columns)]


@dataclass(frozen=True)
class _Row:
    labels: tuple[str, str]
    tiles: np.ndarray | None  # uint8 [columns, 3, thumb, thumb]


def _labels(info: VideoInfo) -> tuple[str, str]:
    seconds = info.n / info.fps if info.fps > 0 else 0.0
    facts = f"{info.n} frames, {seconds:.1f} s, {info.width}x{info.height} {info.codec}"
    caption = info.meta.get("caption") or info.meta.get("label") or ""
    return f"{info.member}  ({facts})", str(caption)


def _rows(source: str, layout: SheetLayout, limit: int, threads: int) -> list[_Row]:
    try:
        reader = Reader(source, size=layout.thumb, crop="center", threads=threads, seed=0)
    except (ValueError, OSError) as e:
        return [_Row((source, f"cannot open: {e}"), None)]
    rows: list[_Row | tuple[tuple[str, str], Pending[Batch]]] = []
    with reader:
        for vid in range(min(len(reader), limit)):  # every clip queued, then collected
            try:
                info = reader.info(vid)
            except (ValueError, OSError) as e:
                rows.append(_Row((f"video {vid} of {source}", f"cannot open: {e}"), None))
                continue
            frames = spread_frames(info.n, layout.columns)
            rows.append((_labels(info), reader.submit([(vid, frames)])))
        return [row if isinstance(row, _Row) else _collect(*row) for row in rows]


def _collect(labels: tuple[str, str], pending: Pending[Batch]) -> _Row:
    try:
        return _Row(labels, pending.result().video[0])
    except (ValueError, RuntimeError) as e:
        return _Row((labels[0], f"unreadable: {e.__cause__ or e}"), None)


def _fit(text: str, font: ImageFont.ImageFont | ImageFont.FreeTypeFont, width: int) -> str:
    """``text`` cut to ``width`` pixels; a font without Unicode glyph lookup gets Latin-1."""
    if not isinstance(font, ImageFont.FreeTypeFont):
        text = text.encode("latin-1", "replace").decode("latin-1")
    if font.getlength(text) <= width:
        return text
    while text and font.getlength(text + "...") > width:
        text = text[:-1]
    return text + "..."


def contact_sheet(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    columns: int = 8,
    thumb: int = 128,
    max_videos: int = 200,
    threads: int = 1,
) -> tuple[int, int]:
    """Draw a contact sheet of ``sources`` into the image file ``out`` (PNG by its name).

    Args:
        sources: paths as the ``Reader`` takes them.
        out: the image to write.
        columns: frames per video, spread over its duration.
        thumb: side of each (square, centre-cropped) frame in pixels.
        max_videos: at most this many videos (rows), the first ones of the sources.
        threads: decode threads.

    Returns the sheet's (width, height): ``SheetLayout(columns, thumb).size(rows)``.
    """
    if columns < 1 or thumb < 2 or max_videos < 1:
        raise ValueError(f"need columns >= 1, thumb >= 2, max_videos >= 1: {columns}, {thumb}")
    layout = SheetLayout(columns, thumb)
    paths = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    rows: list[_Row] = []
    for path in paths:
        rows += _rows(os.fspath(path), layout, max_videos - len(rows), threads)
        if len(rows) >= max_videos:
            break
    sheet = Image.new("RGB", layout.size(len(rows)), BACKGROUND)
    draw = ImageDraw.Draw(sheet)
    font = ImageFont.load_default()
    width = sheet.width - 2 * layout.pad
    for r, row in enumerate(rows):
        for c in range(columns):
            x, y = layout.tile(r, c)
            if row.tiles is None:
                draw.rectangle((x, y, x + thumb - 1, y + thumb - 1), fill=MISSING)
            else:
                sheet.paste(Image.fromarray(row.tiles[c].transpose(1, 2, 0)), (x, y))
        for i, text in enumerate(row.labels[: layout.lines]):
            draw.text(layout.label(r, i), _fit(text, font, width), fill=TEXT, font=font)
    sheet.save(os.fspath(out))
    return sheet.size

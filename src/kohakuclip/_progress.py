"""Progress bars that suit both a terminal and a job log.

On a terminal a tqdm bar redraws in place. Written to a file or a pipe (a Slurm log, a Ray
driver's output, ``| tee``) the same bar would append a carriage-return-separated redraw ten times
a second, one unreadable line that grows for hours; there it prints a plain line instead, at most
every ``LOG_INTERVAL`` seconds, and a last one when it closes.
"""

from __future__ import annotations

import sys
from typing import IO, Any

from tqdm import tqdm

__all__ = ["LOG_INTERVAL", "progress_bar"]

LOG_INTERVAL = 30.0
"""Seconds between a bar's lines in a log (not a terminal)."""


class _Lines:
    """A text stream that turns tqdm's in-place redraws into lines."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self._stream.write(line + "\n")

    def flush(self) -> None:
        self._stream.flush()


def progress_bar(stream: IO[str] | None = None, **options: Any) -> tqdm:
    """A tqdm bar on ``stream`` (default: stderr), redrawn in place on a terminal and printed
    as a line every ``LOG_INTERVAL`` seconds elsewhere.

    Args:
        stream: where the bar goes; its ``isatty()`` decides the style.
        **options: tqdm's own (``total``, ``unit``, ``desc``, ``disable``, ``bar_format`` ...).
    """
    out = sys.stderr if stream is None else stream
    isatty = getattr(out, "isatty", None)
    if callable(isatty) and isatty():
        return tqdm(file=out, dynamic_ncols=True, **options)
    return tqdm(
        file=_Lines(out), mininterval=LOG_INTERVAL, maxinterval=LOG_INTERVAL, ncols=100, **options
    )

"""``KohakuClipError``: the base of every error the package raises on purpose.

Each concrete error also derives from the builtin it always was (``ValueError`` for bad input,
``RuntimeError`` for a failed read, ``IndexError`` for an out-of-range frame), so existing
``except`` clauses keep working; ``except kohakuclip.KohakuClipError`` catches them all.
"""

from __future__ import annotations

__all__ = ["KohakuClipError", "SourceWarning", "os_error_text"]


class KohakuClipError(Exception):
    """Base class of the package's errors."""


class SourceWarning(UserWarning):
    """A source holds files the reader leaves out (e.g. videos only the writer takes): the
    category to filter, e.g. ``warnings.simplefilter("ignore", kohakuclip.SourceWarning)``."""


def os_error_text(error: OSError, where: str | None = None) -> str:
    """``place: reason`` for an OSError in a message: its file (else ``where``) and its reason
    without the ``[Errno N]`` prefix."""
    reason = error.strerror or str(error) or type(error).__name__
    place = error.filename if error.filename is not None else where
    return f"{place}: {reason}" if place is not None else reason

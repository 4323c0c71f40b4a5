"""``KohakuClipError``: the base of every error the package raises on purpose.

Each concrete error also derives from the builtin it always was (``ValueError`` for bad input,
``RuntimeError`` for a failed read, ``IndexError`` for an out-of-range frame), so existing
``except`` clauses keep working; ``except kohakuclip.KohakuClipError`` catches them all.
"""

from __future__ import annotations

__all__ = ["KohakuClipError"]


class KohakuClipError(Exception):
    """Base class of the package's errors."""

"""argparse ``type`` functions shared by the command-line tools: numbers with bounds, refused
with a usage error (exit status 2) before any work starts."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["bounded_int", "positive_float", "positive_int"]


def bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer from ``low`` (up to ``high``), else a usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < low or (high is not None and value > high):
            allowed = f"at least {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"must be {allowed}, got {value}")
        return value

    return parse


def positive_float(text: str) -> float:
    """An argparse ``type``: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


positive_int = bounded_int(1)
"""An argparse ``type``: an integer of at least 1."""

"""KohakuClip 1.0.0's ``kohakuclip.profile()``: what every video reader of this process did, in
one dict (``Reader.stats()`` gives the same per reader).

The readers add to it after each share of a batch: frames written and decoded, and the decode
threads' CPU seconds per stage. A forked child starts from zero.
"""

from __future__ import annotations

import os
import threading

__all__ = ["add_frames", "add_seconds", "profile"]

_STAGES = ("read", "decode", "convert", "resize", "plan")
_lock = threading.Lock()
_totals: dict[str, float] = {}


def _zeros() -> dict[str, float]:
    """Every count at zero: seconds as floats, frames as ints."""
    return {**{stage: 0.0 for stage in _STAGES}, "frames": 0, "decoded": 0}


def _zero() -> None:
    global _lock
    _lock = threading.Lock()  # a fork may have copied it held
    _totals.clear()
    _totals.update(_zeros())


_zero()
os.register_at_fork(after_in_child=_zero)


def add_frames(frames: int, decoded: int) -> None:
    """Count a clip's frames written and decoded."""
    with _lock:
        _totals["frames"] += frames
        _totals["decoded"] += decoded


def add_seconds(before: dict[str, float], after: dict[str, float]) -> None:
    """Add a thread's stage seconds spent between two of its ``stage_seconds()`` readings
    (its pixel stage, resize and conversion fused, counts as ``convert``)."""
    names = {"read": "read", "decode": "decode", "pixels": "convert", "plan": "plan"}
    with _lock:
        for stage, name in names.items():
            _totals[name] += after.get(stage, 0.0) - before.get(stage, 0.0)


def profile(reset: bool = False) -> dict[str, float]:
    """CPU seconds per stage summed over the decode threads of every video reader of this
    process (``read``, ``decode``, ``convert``: the pixel stage, which resizes in the same
    pass, so ``resize`` stays 0; ``plan``), then ``frames`` written and ``decoded``, since the
    process started or the last reset. KohakuClip 1.0.0's call; ``Reader.stats()`` reports
    the same per reader.

    Args:
        reset: start counting again from zero (the counts before are returned).
    """
    with _lock:
        counts = dict(_totals)
        if reset:
            _totals.update(_zeros())
    return counts

"""Decoding: the compiled share drivers, the pixel stage, and their PyAV twins."""

from __future__ import annotations

import os
from functools import cache

from kohakuclip.decode._jit_cache import drop_stale

__all__ = ["avcodec_found"]

drop_stale(os.path.dirname(os.path.abspath(__file__)))


@cache
def avcodec_found() -> bool:
    """True when PyAV's libavcodec passed its start-up layout check (``_avcodec.library``);
    the check (which loads the libraries) waits for the first call, so that importing
    kohakuclip stays quick."""
    from kohakuclip.decode import _avcodec

    return _avcodec.library() is not None

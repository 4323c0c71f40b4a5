"""Decoding: the compiled share drivers, the pixel stage, and their PyAV twins."""

from __future__ import annotations

from functools import cache

__all__ = ["avcodec_found"]


@cache
def avcodec_found() -> bool:
    """True when PyAV's libavcodec passed its start-up layout check (``_avcodec.library``);
    the check (which loads the libraries) waits for the first call, so that importing
    kohakuclip stays quick."""
    from kohakuclip.decode import _avcodec

    return _avcodec.library() is not None

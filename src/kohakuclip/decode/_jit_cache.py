"""Numba's on-disk cache of the compiled pixel and driver code, kept consistent with the source.

Numba keys a cached function by its own file's timestamp and size only: a driver in
``_clips.py`` that calls ``_frame.write_frame`` keeps the old ``write_frame`` compiled into it
after ``_frame.py`` changes (an editable install, a patched file). The compiled modules all live
in this package and call each other, so when any of them is newer than a cache file, every cache
file here is dropped and recompiled on first use.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["drop_stale"]


def drop_stale(package_dir: str) -> None:
    """Delete the numba cache files under ``package_dir``/__pycache__ when a source file of the
    package is newer than the oldest of them (best effort: a read-only install is left alone)."""
    cache_dir = os.path.join(package_dir, "__pycache__")
    try:  # another process (a DataLoader worker starting beside this one) may be deleting too
        cached = [
            e for e in os.scandir(cache_dir) if e.name.endswith((".nbi", ".nbc")) and e.is_file()
        ]
        sources = [e for e in os.scandir(package_dir) if e.name.endswith(".py") and e.is_file()]
        if not cached or not sources:
            return
        newest_source = max(e.stat().st_mtime for e in sources)
        if min(e.stat().st_mtime for e in cached) >= newest_source:
            return
    except OSError:
        return
    for entry in cached:
        with contextlib.suppress(OSError):
            os.remove(entry.path)

"""Folder trees: every file with a wanted suffix below a directory, in a stable order."""

from __future__ import annotations

import os
from collections.abc import Iterable

__all__ = ["list_folder"]


def list_folder(path: str | os.PathLike[str], suffixes: Iterable[str]) -> list[str]:
    """Paths (relative to ``path``, '/'-separated, sorted) of files whose suffix is wanted."""
    root = os.fspath(path)
    wanted = tuple(s.lower() for s in suffixes)
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for name in filenames:
            if name.lower().endswith(wanted) and not name.startswith("."):
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                out.append(rel.replace(os.sep, "/"))
    out.sort()
    return out

"""Folder trees: every file with a wanted suffix below a directory, in a stable order."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Iterable

__all__ = [
    "is_hidden",
    "is_media",
    "list_folder",
    "media_or_shards",
    "mixed_message",
    "printable_name",
    "unique_origins",
]


def is_hidden(name: str) -> bool:
    """A hidden file or member by its last path part: ``.DS_Store``, or the ``._x.jpg`` resource
    files macOS puts into tars and zips (under ``__MACOSX/`` in zips). Sources skip them as
    folder listings skip hidden files.

    Args:
        name: a '/'-separated path or member name.
    """
    return posixpath.basename(name).startswith(".")


def is_media(name: str, suffixes: tuple[str, ...]) -> bool:
    """A video or image file (or member) by its suffix (lower case ``suffixes``), hidden ones
    left out (``is_hidden``)."""
    return name.lower().endswith(suffixes) and not is_hidden(name)


def printable_name(name: str) -> str:
    """``name`` as text every UTF-8 writer takes (zip member names, parquet, JSON): bytes of a
    file or member name that are not UTF-8 (which the OS and tarfile give as lone surrogates)
    become ``\\xNN``. Valid names come back unchanged.

    Args:
        name: a path or member name.
    """
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def unique_origins(origins: list[str]) -> list[str]:
    """``origins`` as ``printable_name`` writes them, one that repeats an earlier one (the same
    name twice in an archive, or a name that prints as another does) marked ``#2``, ``#3``,
    ...: one origin per item, so that a resumed conversion tells them apart. Unique printable
    origins come back unchanged.

    Args:
        origins: paths, ``archive::member`` names or URLs, in listing order.
    """
    taken: set[str] = set()
    unique = []
    for origin in origins:
        base = mark = printable_name(origin)
        repeat = 1
        while mark in taken:
            repeat += 1
            mark = f"{base}#{repeat}"
        taken.add(mark)
        unique.append(mark)
    return unique


def list_folder(
    path: str | os.PathLike[str],
    suffixes: Iterable[str],
    on_error: Callable[[OSError], None] | None = None,
) -> list[str]:
    """Paths (relative to ``path``, '/'-separated, sorted) of files whose suffix is wanted.

    Symbolic links to folders are followed, each folder once: a link back up the tree (a
    cycle) or a second link to the same folder adds nothing. A folder that cannot be listed
    is left out, and given to ``on_error`` (e.g. to report it) when there is one."""
    root = os.fspath(path)
    wanted = tuple(s.lower() for s in suffixes)
    out = []
    seen: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames in os.walk(root, onerror=on_error, followlinks=True):
        here = os.stat(dirpath)
        if (here.st_dev, here.st_ino) in seen:
            dirnames.clear()
            continue
        seen.add((here.st_dev, here.st_ino))
        dirnames.sort()
        for name in filenames:
            if name.lower().endswith(wanted) and not name.startswith("."):
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                out.append(rel.replace(os.sep, "/"))
    out.sort()
    return out


def media_or_shards(
    path: str,
    media_suffixes: Iterable[str],
    shard_suffixes: Iterable[str],
    keep: Callable[[list[str]], list[str]] | None = None,
) -> tuple[list[str], list[str]]:
    """(media files, shards) below the folder ``path`` (``list_folder``'s paths, one walk), one
    of them empty: a folder of videos or images, or of shards (a writer's output). ``keep``
    picks the media files that count (the others are left out before the check below).

    Raises:
        ValueError: the folder holds both, naming an example of each (a folder of videos next
            to a zip of the same videos is common: reading both, or either, would be a guess).
    """
    media = tuple(s.lower() for s in media_suffixes)
    shards = tuple(s.lower() for s in shard_suffixes)
    found = list_folder(path, media + shards)
    files = [name for name in found if name.lower().endswith(media)]
    packed = [name for name in found if not name.lower().endswith(media)]
    if keep is not None:
        files = keep(files)
    if files and packed:
        raise ValueError(mixed_message(path, files[0], len(files), packed[0], len(packed)))
    return files, packed


def mixed_message(where: str, medium: str, media: int, shard: str, shards: int) -> str:
    """The error for a folder or URL prefix holding both media files and shards."""
    return (
        f"{where}: holds both media files ({media}, e.g. {medium}) and shards ({shards}, e.g. "
        f"{shard}): give the subfolder, prefix or files meant"
    )

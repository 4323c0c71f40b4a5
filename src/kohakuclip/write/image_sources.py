"""Where source images come from: files, folders with sidecars, WebDataset tars, zip archives.

Every source yields ``SourceImage`` items in a stable order, each with a key, a caption (from a
``<stem>.txt`` sidecar) and metadata (the text of a ``<stem>.json`` sidecar). Archive members
are read on demand by offset (deflated zip members are inflated), so nothing is extracted and
the reads can run on worker threads.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import IMAGE_SUFFIXES
from kohakuclip.storage.files import open_regular
from kohakuclip.storage.folder import list_folder
from kohakuclip.storage.tar import list_tar
from kohakuclip.storage.zip import ArchiveError, Member, list_zip

__all__ = ["ImageInputError", "SourceImage", "iter_sources"]


_CAPTION_SUFFIX = ".txt"
_META_SUFFIX = ".json"


class ImageInputError(KohakuClipError, ValueError):
    """A source path that is missing or of an unknown kind, or an archive that cannot be read."""


@dataclass(frozen=True)
class SourceImage:
    """One image to store."""

    key: str  # member name in the shard, without the suffix
    origin: str  # the file, or "archive:member", for messages and the manifest
    read: Callable[[], bytes]
    caption: str | None = None
    meta: str | None = None  # the json sidecar's text, unparsed


def _kind(path: str) -> str:
    lower = path.lower()
    if os.path.isdir(path):
        return "folder"
    if not os.path.exists(path):
        raise ImageInputError(f"{path}: no such file or directory")
    if lower.endswith(".tar"):
        return "tar"
    if lower.endswith(".zip"):
        return "zip"
    if lower.endswith(IMAGE_SUFFIXES):
        return "file"
    raise ImageInputError(f"{path}: not an image, a folder, a .tar or a .zip")


def iter_sources(paths: list[str | os.PathLike[str]]) -> Iterator[SourceImage]:
    """Every image of every source, in order; every path is checked now, before any is read."""
    return _iterate([(os.fspath(p), _kind(os.fspath(p))) for p in paths])


def _iterate(kinds: list[tuple[str, str]]) -> Iterator[SourceImage]:
    for path, kind in kinds:
        if kind == "folder":
            yield from _folder(path)
        elif kind == "tar":
            yield from _archive(path, _list_or_fail(list_tar, path))
        elif kind == "zip":
            yield from _archive(path, _list_or_fail(list_zip, path))
        else:
            yield _file(path, os.path.splitext(os.path.basename(path))[0])


def _read_file(path: str) -> Callable[[], bytes]:
    def read() -> bytes:  # a FIFO named like an image raises instead of waiting for a writer
        with os.fdopen(open_regular(path), "rb") as f:
            return f.read()

    return read


def _sidecar(path: str) -> str | None:
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def _file(path: str, key: str) -> SourceImage:
    stem = os.path.splitext(path)[0]
    caption = _sidecar(stem + _CAPTION_SUFFIX)
    return SourceImage(
        key,
        path,
        _read_file(path),
        caption.strip() if caption is not None else None,
        _sidecar(stem + _META_SUFFIX),
    )


def _folder(root: str) -> Iterator[SourceImage]:
    """The images below ``root``; a folder that cannot be listed comes as an item whose read
    fails, so that the skip log names it."""
    unlistable: list[OSError] = []
    for rel in list_folder(root, IMAGE_SUFFIXES, on_error=unlistable.append):
        yield _file(os.path.join(root, rel), os.path.splitext(rel)[0])
    for error in unlistable:
        path = str(error.filename)
        key = os.path.relpath(path, root).replace(os.sep, "/")
        yield SourceImage(key, path, partial(_unlistable, path, error.strerror or str(error)))


def _unlistable(path: str, reason: str) -> bytes:
    raise OSError(f"{path}: cannot list the folder ({reason})")


def _list_or_fail(lister: Callable[[str], list[Member]], path: str) -> list[Member]:
    try:
        return lister(path)
    except ArchiveError as e:
        raise ImageInputError(str(e)) from None


def _read_member(path: str, member: Member) -> Callable[[], bytes]:
    def read() -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, member.size, member.offset)
        finally:
            os.close(fd)
        if len(data) != member.size:
            raise OSError(f"{path}:{member.name}: truncated archive")
        return zlib.decompress(data, -15) if member.compressed else data

    return read


def _webdataset_key(name: str) -> tuple[str, str]:
    """(key, extension) the WebDataset way: the extension starts at the basename's first dot."""
    head, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    key = f"{head}/{stem}" if head else stem
    return key, (dot + ext).lower()


def _archive(path: str, members: list[Member]) -> Iterator[SourceImage]:
    """Group an archive's members by WebDataset key; one image per key, sidecars attached."""
    groups: dict[str, dict[str, Member]] = {}
    for member in members:
        key, ext = _webdataset_key(member.name)
        groups.setdefault(key, {}).setdefault(ext, member)
    for key, by_ext in groups.items():
        image = next((m for ext, m in by_ext.items() if ext.endswith(IMAGE_SUFFIXES)), None)
        if image is None:
            continue
        caption = by_ext.get(_CAPTION_SUFFIX)
        meta = by_ext.get(_META_SUFFIX)
        caption_text = _read_member(path, caption)().decode("utf-8", "replace") if caption else None
        yield SourceImage(
            key,
            f"{path}:{image.name}",
            _read_member(path, image),
            caption_text.strip() if caption_text is not None else None,
            _read_member(path, meta)().decode("utf-8", "replace") if meta else None,
        )

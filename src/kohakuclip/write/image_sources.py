"""Where source images come from: files, folders with sidecars, WebDataset tars, zip archives,
and the same in object storage by URL.

Every source yields ``SourceImage`` items in a stable order, each with a key, a caption (from a
``<stem>.txt`` sidecar) and metadata (the text of a ``<stem>.json`` sidecar). Archive members
are read on demand by offset (deflated zip members are inflated), so nothing is extracted and
the reads can run on worker threads.

A URL ending in ``/`` is a prefix, listed when the sources are checked (``storage.remote``: every
image object below it, sorted, as a folder is walked, with the sidecar objects beside each); any
other URL is one image, tar or zip (HEADed then; an archive's members listed by ranged reads when
its turn comes). An image object's bytes are fetched when a worker reads it; captions and
metadata in storage are fetched ``SIDECAR_BATCH`` images at a time, by concurrent ranged GETs, as
the images are iterated.

``iter_sources(paths, part)`` lists every source first and selects the part's images before any
sidecar is read (each part reads only its own images' captions and metadata);
``count_sources`` counts the images without reading a sidecar.
"""

from __future__ import annotations

import itertools
import os
import posixpath
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import unquote, urlsplit

from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import IMAGE_SUFFIXES
from kohakuclip.storage.files import open_regular
from kohakuclip.storage.folder import (
    is_hidden,
    is_media,
    list_folder,
    printable_name,
    unique_origins,
)
from kohakuclip.storage.ranged import RangedFile
from kohakuclip.storage.remote import (
    MissingObjectError,
    RemoteObject,
    fetch_ranges,
    head_objects,
    is_url,
    list_objects,
    open_object,
    suffix_of,
)
from kohakuclip.storage.tar import list_tar
from kohakuclip.storage.zip import ArchiveError, Member, list_zip, member_origins
from kohakuclip.write.parts import Part

__all__ = ["ImageInputError", "SourceImage", "count_sources", "iter_sources"]


_CAPTION_SUFFIX = ".txt"
_META_SUFFIX = ".json"
SIDECAR_BATCH = 256
"""Images whose sidecars in object storage are fetched at once (concurrent ranged GETs)."""


class ImageInputError(KohakuClipError, ValueError):
    """A source path that is missing or of an unknown kind, an archive that cannot be read, or
    a plain http(s) prefix (which cannot be listed)."""


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


def iter_sources(
    paths: Iterable[str | os.PathLike[str]], part: Part | None = None
) -> Iterator[SourceImage]:
    """Every image of every source, in order (``part``: only that part's block of them sorted
    by origin, ``Part.select``); every path is checked now, before any is read (a URL: its
    prefix listed or its object found, so that a store that cannot be reached, refused
    credentials and a missing object raise ``ObjectStoreError`` naming it before anything is
    encoded). A whole run lists each archive when its turn comes; a part lists every source
    now, selects, and reads the sidecars of its own images only, as they are iterated."""
    checked = [_checked(os.fspath(p)) for p in paths]
    if part is None:
        return itertools.chain.from_iterable(_resolve(entries) for entries in checked)
    listed = list(itertools.chain.from_iterable(checked))
    return _resolve(part.select(listed, key=lambda entry: entry.origin))


def count_sources(paths: Iterable[str | os.PathLike[str]]) -> int:
    """How many images ``iter_sources(paths)`` yields: every source checked and listed, no
    sidecar read."""
    return sum(1 for _ in itertools.chain.from_iterable([_checked(os.fspath(p)) for p in paths]))


@dataclass(frozen=True)
class _Local:
    """A local image (a file or an archive member), its sidecars not read yet."""

    origin: str
    make: Callable[[], SourceImage]  # reads the sidecars


def _resolve(entries: Iterable[SourceImage | _Local | _Pending]) -> Iterator[SourceImage]:
    """The images of ``entries``, in order, their sidecars read as iterated (those in object
    storage ``SIDECAR_BATCH`` at a time, ``_with_sidecars``)."""
    for remote, run in itertools.groupby(entries, key=lambda entry: isinstance(entry, _Pending)):
        if remote:
            yield from _with_sidecars(e for e in run if isinstance(e, _Pending))
        else:
            for entry in run:
                if isinstance(entry, _Local):
                    yield entry.make()
                elif isinstance(entry, SourceImage):  # an unlistable folder or archive
                    yield entry


def _checked(path: str) -> Iterator[SourceImage | _Local | _Pending]:
    """The images of one source, the source checked now and listed as iterated."""
    return _remote(path) if is_url(path) else _local(path, _kind(path))


def _local(path: str, kind: str) -> Iterator[SourceImage | _Local]:
    """The images of a local source of ``kind`` (``_kind``), listed as iterated."""
    if kind == "folder":
        yield from _folder(path)
    elif kind in ("tar", "zip"):
        try:
            members = (list_tar if kind == "tar" else list_zip)(path)
        except ArchiveError as e:
            yield _unlistable_archive(path, e)
            return
        yield from _archive(path, members)
    else:
        key = os.path.splitext(os.path.basename(path))[0]
        yield _Local(printable_name(path), partial(_file, path, key, printable_name(path)))


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


def _file(path: str, key: str, origin: str) -> SourceImage:
    stem = os.path.splitext(path)[0]
    caption = _sidecar(stem + _CAPTION_SUFFIX)
    return SourceImage(
        printable_name(key),
        origin,
        _read_file(path),
        caption.strip() if caption is not None else None,
        _sidecar(stem + _META_SUFFIX),
    )


def _folder(root: str) -> Iterator[SourceImage | _Local]:
    """The images below ``root``; a folder that cannot be listed comes as an item whose read
    fails, so that the skip log names it."""
    unlistable: list[OSError] = []
    rels = list_folder(root, IMAGE_SUFFIXES, on_error=unlistable.append)
    paths = [os.path.join(root, rel) for rel in rels]
    for rel, path, origin in zip(rels, paths, unique_origins(paths), strict=True):
        yield _Local(origin, partial(_file, path, os.path.splitext(rel)[0], origin))
    for error in unlistable:
        path = str(error.filename)
        key = printable_name(os.path.relpath(path, root).replace(os.sep, "/"))
        reason = printable_name(error.strerror or str(error))
        yield SourceImage(key, printable_name(path), partial(_unlistable, path, reason))


def _unlistable(path: str, reason: str) -> bytes:
    raise OSError(f"{path}: cannot list the folder ({reason})")


def _unlistable_archive(where: str, error: ArchiveError) -> SourceImage:
    """An archive that cannot be listed (it is read when its turn comes), as one item whose
    read fails: the skip log names it, as a folder that cannot be listed, and the run goes on
    (an error would stop every run, resumed ones too, at the same place)."""
    key = posixpath.basename(where.rstrip("/"))
    return SourceImage(key, where, partial(_unreadable_archive, str(error)))


def _unreadable_archive(reason: str) -> bytes:
    raise OSError(reason)


def _inflated(data: bytes, member: Member) -> bytes:
    return zlib.decompress(data, -15) if member.compressed else data


def _read_member(path: str, member: Member) -> Callable[[], bytes]:
    def read() -> bytes:
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, member.size, member.offset)
        finally:
            os.close(fd)
        if len(data) != member.size:
            raise OSError(f"{path}:{member.name}: truncated archive")
        return _inflated(data, member)

    return read


def _webdataset_key(name: str) -> tuple[str, str]:
    """(key, extension) the WebDataset way: the extension starts at the basename's first dot."""
    head, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    key = f"{head}/{stem}" if head else stem
    return key, (dot + ext).lower()


def _groups(
    where: str, members: list[Member]
) -> Iterator[tuple[str, str, Member, Member | None, Member | None]]:
    """An archive's images with the sidecars of their WebDataset key: (key, origin, image,
    caption, metadata). Every image member is one item: where a key has several (``a.jpg``
    beside ``a.png``; ``frame.0001.jpg`` beside ``frame.0002.jpg``, one WebDataset sample with
    two image fields) each keeps its name up to its suffix as its key (the shard names repeats
    apart) and the key's sidecars; a name the archive repeats is marked in its origin."""
    images: list[tuple[str, Member]] = []
    sidecars: dict[str, dict[str, Member]] = {}
    for member in members:
        if is_hidden(member.name):  # .DS_Store, macOS's ._x.jpg resource members
            continue
        key, ext = _webdataset_key(member.name)
        if ext.endswith(IMAGE_SUFFIXES):
            images.append((key, member))
        else:
            sidecars.setdefault(key, {}).setdefault(ext, member)
    per_key: dict[str, int] = {}
    for key, _ in images:
        per_key[key] = per_key.get(key, 0) + 1
    origins = member_origins(where, [image.name for _, image in images], ":")
    for (key, image), origin in zip(images, origins, strict=True):
        found = sidecars.get(key, {})
        own = posixpath.splitext(image.name)[0] if per_key[key] > 1 else key
        caption, meta = found.get(_CAPTION_SUFFIX), found.get(_META_SUFFIX)
        yield printable_name(own), origin, image, caption, meta


def _archive(path: str, members: list[Member]) -> Iterator[_Local]:
    """An archive's images (``_groups``), their sidecars read when each is made."""
    for key, origin, image, caption, meta in _groups(path, members):
        yield _Local(origin, partial(_member_image, path, key, origin, image, caption, meta))


def _member_image(
    path: str, key: str, origin: str, image: Member, caption: Member | None, meta: Member | None
) -> SourceImage:
    """An archive member's image, its sidecar members read now."""
    caption_text = _read_member(path, caption)().decode("utf-8", "replace") if caption else None
    return SourceImage(
        key,
        origin,
        _read_member(path, image),
        caption_text.strip() if caption_text is not None else None,
        _read_member(path, meta)().decode("utf-8", "replace") if meta else None,
    )


_Located = tuple[RemoteObject, Member]
"""Bytes in object storage: a member of the object (the whole of it: offset 0, its size)."""


@dataclass(frozen=True)
class _Pending:
    """An image in object storage, its caption and metadata not fetched yet."""

    key: str
    origin: str
    read: Callable[[], bytes]
    caption: _Located | None
    meta: _Located | None


def _remote(url: str) -> Iterator[SourceImage | _Pending]:
    """The images the URL names, checked now: a prefix listed, an object HEADed (its sidecar
    objects too); an archive's members are listed when its turn comes."""
    if url.endswith("/"):
        return iter(_prefix_images(url))
    suffix = suffix_of(url)
    if suffix not in (".tar", ".zip", *IMAGE_SUFFIXES):
        raise ImageInputError(f"{url}: not an image, a prefix (ending in /), a .tar or a .zip")
    try:
        obj = open_object(url)
    except MissingObjectError:
        raise MissingObjectError(f"{url}: no such object (a prefix ends with '/')") from None
    if suffix == ".tar":
        return _remote_archive(obj, list_tar)
    if suffix == ".zip":
        return _remote_archive(obj, list_zip)
    stem = posixpath.splitext(url)[0]
    heads = head_objects([stem + _CAPTION_SUFFIX, stem + _META_SUFFIX])
    key = posixpath.splitext(unquote(posixpath.basename(urlsplit(url).path)))[0]
    return iter([_object_image(obj, key, heads)])


def _prefix_images(prefix: str) -> list[_Pending]:
    """Every image object below the URL ``prefix`` (sorted by URL, as a folder's images are by
    path; keyed by its name below the prefix), with the sidecar objects beside each. A prefix
    with no object at all is ``MissingObjectError`` (a typo should not silently drop a folder)."""
    if prefix.partition("://")[0].lower() in ("http", "https"):
        raise ImageInputError(
            f"{prefix}: a plain http(s) prefix cannot be listed: name each image's, tar's or "
            "zip's URL"
        )
    listed = dict(list_objects(prefix))
    if not listed:
        raise MissingObjectError(f"{prefix}: no objects under this prefix")
    return [
        _object_image(open_object(url, meta=meta), os.path.splitext(url[len(prefix) :])[0], listed)
        for url, meta in listed.items()
        if is_media(url, IMAGE_SUFFIXES)
    ]


def _object_image(
    obj: RemoteObject, key: str, entries: Mapping[str, Mapping[str, Any]]
) -> _Pending:
    """An image object, with the ``<stem>.txt`` / ``<stem>.json`` objects beside it among
    ``entries`` (URL -> listing entry or HEAD answer)."""
    stem = posixpath.splitext(obj.url)[0]

    def beside(suffix: str) -> _Located | None:
        entry = entries.get(stem + suffix)
        if entry is None:
            return None
        url = stem + suffix
        return open_object(url, meta=entry), Member(url, 0, int(entry["size"]))

    whole = Member(obj.url, 0, obj.size)
    read = partial(_read_remote, obj, whole)
    return _Pending(key, obj.url, read, beside(_CAPTION_SUFFIX), beside(_META_SUFFIX))


def _remote_archive(
    obj: RemoteObject, lister: Callable[[str | RangedFile], list[Member]]
) -> Iterator[SourceImage | _Pending]:
    """A tar or zip in object storage as ``_archive`` takes a local one (listed by ranged
    reads when its turn comes)."""
    try:
        members = lister(obj)
    except ArchiveError as e:
        yield _unlistable_archive(obj.url, e)
        return
    yield from (
        _Pending(
            key,
            origin,
            partial(_read_remote, obj, image),
            None if caption is None else (obj, caption),
            None if meta is None else (obj, meta),
        )
        for key, origin, image, caption, meta in _groups(obj.url, members)
    )


def _read_remote(obj: RemoteObject, member: Member) -> bytes:
    """A member's bytes (inflated where deflated) by one ranged GET: ``ObjectStoreError``, an
    OSError naming the URL, when it cannot be read."""
    return _inflated(obj.read(member.offset, member.size), member)


def _with_sidecars(pending: Iterable[_Pending]) -> Iterator[SourceImage]:
    """The images with their captions and metadata, fetched ``SIDECAR_BATCH`` images at a time
    (one ``fetch_ranges``: concurrent ranged GETs)."""
    items = iter(pending)
    while batch := list(itertools.islice(items, SIDECAR_BATCH)):
        wanted = [s for p in batch for s in (p.caption, p.meta) if s is not None]
        fetched = fetch_ranges([(obj, m.offset, m.offset + m.size) for obj, m in wanted])
        texts = iter(
            _inflated(bytes(data), m).decode("utf-8", "replace")
            for (_, m), data in zip(wanted, fetched)
        )
        for p in batch:
            caption = next(texts) if p.caption is not None else None
            meta = next(texts) if p.meta is not None else None
            caption = caption.strip() if caption is not None else None
            yield SourceImage(p.key, p.origin, p.read, caption, meta)

"""Listing image sources: paths, URLs, prefixes, folders and dataset views expanded into shards,
folders and gulp directories (``ImageSource``), each with its image count.

Indexed shards (zips with a KCIMG1 index) cost only their index header to open. Plain sources
(zips with stored or deflated members, tars, folder trees) are listed once. A GulpIO directory
gives one image per stored frame (image gulps hold one frame per id, video gulps every frame).
A folder with a dataset view (``dataset.json``, from ``kohakuclip merge``) gives its shards in
the view's order, each opened from the view's index location without reading the shard. Zip
and tar shards and image files may also be objects in object storage (``storage.remote``; a URL
ending in ``/`` lists the shards or images under it): an indexed remote shard's table is read
once whole here (a prefix holding a dataset view opens no shard); a remote tar (e.g.
WebDataset's) is listed header by header, one ranged read per member; a prefix holding a GulpIO
directory has its ``.gmeta`` files read whole (each frame is fetched later by one ranged read).
An ``http(s)://`` prefix is found from the writers' files (``storage.prefix``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kohakuclip.errors import KohakuClipError, os_error_text
from kohakuclip.formats import DATASET_FILE, IMAGE_SUFFIXES, INDEX_MEMBER, SHARD_SUFFIXES
from kohakuclip.gulp.index import GulpIndex, open_gulp_source
from kohakuclip.gulp.meta import is_gulp_directory
from kohakuclip.storage.folder import is_media, list_folder, media_or_shards, mixed_message
from kohakuclip.storage.image_index import find_image_index, load_image_index
from kohakuclip.storage.index import IndexFormatError
from kohakuclip.storage.prefix import list_prefix, open_listed_gulp
from kohakuclip.storage.ranged import Objects
from kohakuclip.storage.remote import ObjectStoreError, is_url, local_path, suffix_of
from kohakuclip.storage.tar import list_tar
from kohakuclip.storage.view import ViewError, has_view, load_view, parse_view
from kohakuclip.storage.zip import ArchiveError, Member, list_zip

__all__ = ["ImageSource", "ImageSourceError", "list_image_sources"]


class ImageSourceError(KohakuClipError, ValueError):
    """A source that cannot be opened, or an image in it that cannot be located."""


@dataclass
class ImageSource:
    """One listed source of images: a shard, a folder (local or a URL prefix) or a gulp."""

    path: str
    kind: str  # "indexed" | "zip" | "tar" | "folder" | "gulp"
    count: int
    index_member: Member | None = None
    records: np.ndarray | None = None  # per process
    records_pid: int = -1
    names: list[str] = field(default_factory=list)  # plain sources (indexed: on demand)
    offsets: np.ndarray | None = None  # plain archives
    sizes: np.ndarray | None = None
    compressed: np.ndarray | None = None
    gulp: GulpIndex | None = None
    remote: bool = False
    origin: int = 0  # the position of the path it was listed from among those given


def list_image_sources(
    paths: list[str], objects: Objects, use_index: bool = True
) -> list[ImageSource]:
    """The sources ``paths`` expand to, in order, each with the position of its path
    (``origin``: a folder of shards, a dataset view or a URL prefix lists several).

    Args:
        paths: shards, folders, gulp directories, dataset views, or their URLs.
        objects: where remote objects are opened and read (their listing entries are recorded).
        use_index: read shards' KCIMG1 index; False lists their members instead.
    """
    sources: list[ImageSource] = []
    for origin, given in enumerate(paths):
        first = len(sources)
        try:
            expanded = _expand_shard_folder(local_path(os.fspath(given)))
        except OSError as e:  # e.g. a folder this process may not read
            raise ImageSourceError(os_error_text(e, os.fspath(given))) from None
        for path in expanded:
            if not is_url(path):
                try:
                    sources.extend(_open_all(path, use_index))
                except OSError as e:
                    raise ImageSourceError(os_error_text(e, path)) from None
                continue
            try:
                sources.extend(_open_remote(objects, path, use_index))
            except ObjectStoreError as e:
                raise ImageSourceError(str(e)) from None
        for src in sources[first:]:
            src.origin = origin
    return sources


def _expand_shard_folder(path: str) -> list[str]:
    """A folder of shards (e.g. kohakuclip-write-images' output) as its shards, any other
    source as itself; ``ImageSourceError`` for a folder of both images and shards."""
    plain = os.path.isdir(path) and not is_gulp_directory(path) and not has_view(path)
    shards: list[str] = []
    if plain:
        try:
            shards = media_or_shards(path, IMAGE_SUFFIXES, SHARD_SUFFIXES)[1]
        except ValueError as e:
            raise ImageSourceError(str(e)) from None
    return [os.path.join(path, name) for name in shards] if shards else [path]


def _open_all(path: str, use_index: bool) -> list[ImageSource]:
    """One source, or every shard of a dataset view."""
    if not has_view(path):
        return [_open(path, use_index)]
    try:
        view = load_view(path)
    except ViewError as e:
        raise ImageSourceError(str(e)) from None
    if view.kind != "image":
        raise ImageSourceError(f"{path}: a dataset view of {view.kind}s, not images")
    return [
        ImageSource(
            os.path.join(path, s.name),
            "indexed",
            s.count,
            index_member=Member(INDEX_MEMBER, *s.index),
        )
        for s in view.shards
    ]


def _open(path: str, use_index: bool) -> ImageSource:
    if is_gulp_directory(path):
        try:
            gulp = open_gulp_source(path)
        except ValueError as e:
            raise ImageSourceError(str(e)) from None
        return ImageSource(path, "gulp", len(gulp.size), gulp=gulp)
    if os.path.isdir(path):
        names = list_folder(path, IMAGE_SUFFIXES)
        return ImageSource(path, "folder", len(names), names=names)
    if not os.path.exists(path):
        raise ImageSourceError(f"{path}: no such file or directory")
    try:
        if path.lower().endswith(".tar"):
            return _plain(path, "tar", list_tar(path))
        found = find_image_index(path) if use_index else None
        if found is not None:
            return ImageSource(path, "indexed", found[1], index_member=found[0])
        return _plain(path, "zip", list_zip(path))
    except (ArchiveError, IndexFormatError) as e:
        raise ImageSourceError(str(e)) from None


def _open_remote(objects: Objects, url: str, use_index: bool) -> list[ImageSource]:
    """An image shard in object storage, or every shard and image under a prefix."""
    if not url.endswith("/"):
        return [_open_object(objects, url, use_index)]
    found = list_prefix(url, objects.options)
    if any(name == url + DATASET_FILE for name, _ in found):  # a merged dataset view
        return _open_remote_view(objects, url, dict(found))
    gulp = _open_remote_gulp(objects, url, found)
    if gulp is not None:
        return [gulp]
    packed = [name for name, _ in found if suffix_of(name) in (".zip", ".tar")]
    images = [name for name, _ in found if is_media(name, IMAGE_SUFFIXES)]
    if packed and images:
        raise ImageSourceError(mixed_message(url, images[0], len(images), packed[0], len(packed)))
    shards, names = [], []
    for name, meta in found:
        objects.remote(name, meta)
        if suffix_of(name) in (".zip", ".tar"):
            shards.append(_open_object(objects, name, use_index))
        elif is_media(name, IMAGE_SUFFIXES):
            names.append(name[len(url) :])
    if names:
        shards.append(ImageSource(url, "folder", len(names), names=names, remote=True))
    if not shards:
        raise ImageSourceError(f"{url}: no zip or tar shards or images under this prefix")
    return shards


def _open_remote_gulp(
    objects: Objects, url: str, listed: list[tuple[str, dict[str, Any]]]
) -> ImageSource | None:
    """The gulp directory directly under the prefix ``url`` (its ``.gmeta`` files read whole,
    its frames later by ranged reads); None when there is none."""
    try:
        gulp = open_listed_gulp(objects, url, listed)
    except ValueError as e:
        raise ImageSourceError(str(e)) from None
    if gulp is None:
        return None
    return ImageSource(url, "gulp", len(gulp.size), gulp=gulp, remote=True)


def _open_remote_view(
    objects: Objects, url: str, listed: Mapping[str, Mapping[str, Any]]
) -> list[ImageSource]:
    """Every shard of the dataset view under the prefix ``url`` (``listed``: its objects,
    URL -> listing entry): one GET for the view; each shard's table read when first used."""
    where = url + DATASET_FILE
    obj = objects.remote(where, listed[where])
    try:
        view = parse_view(obj.read(0, obj.size), where)
    except ViewError as e:
        raise ImageSourceError(str(e)) from None
    if view.kind != "image":
        raise ImageSourceError(f"{url}: a dataset view of {view.kind}s, not images")
    sources = []
    for s in view.shards:
        path = url + s.name
        if path not in listed:
            raise ImageSourceError(f"{path}: listed in the dataset view, but no such object")
        if int(listed[path]["size"]) != s.bytes:
            raise ImageSourceError(
                f"{path}: {listed[path]['size']} bytes, the dataset view says {s.bytes} "
                "(changed since `kohakuclip merge`: merge again)"
            )
        objects.remote(path, listed[path])
        member = Member(INDEX_MEMBER, *s.index)
        sources.append(ImageSource(path, "indexed", s.count, index_member=member, remote=True))
    return sources


def _open_object(objects: Objects, url: str, use_index: bool) -> ImageSource:
    if suffix_of(url) not in (".zip", ".tar"):
        raise ImageSourceError(f"{url}: only zip and tar shards and image files are read from URLs")
    obj = objects.remote(url)
    try:
        if suffix_of(url) == ".tar":  # e.g. a WebDataset tar: listed header by header
            tar = _plain(url, "tar", list_tar(obj))
            tar.remote = True
            return tar
        found = find_image_index(obj) if use_index else None
        if found is not None:
            src = ImageSource(url, "indexed", found[1], index_member=found[0], remote=True)
            src.records, src.records_pid = load_image_index(obj, found[0]), -2
            return src
        plain = _plain(url, "zip", list_zip(obj))
        plain.remote = True
        return plain
    except (ArchiveError, IndexFormatError) as e:
        raise ImageSourceError(str(e)) from None


def _plain(path: str, kind: str, members: list[Member]) -> ImageSource:
    images = [m for m in members if is_media(m.name, IMAGE_SUFFIXES)]
    return ImageSource(
        path,
        kind,
        len(images),
        names=[m.name for m in images],
        offsets=np.array([m.offset for m in images], dtype=np.int64),
        sizes=np.array([m.size for m in images], dtype=np.int64),
        compressed=np.array([m.compressed for m in images], dtype=bool),
    )

"""Expand what the user names (files, folders, tar archives, gulp directories, in-memory bytes,
and the same in object storage by URL) into videos.

Each video becomes a ``Source``: the member name it gets in a shard (its path below the folder,
URL prefix or inside the tar, or the file's name; a gulp video's id), where it came from (for the
manifest and skipped.jsonl: a path or a URL), and its ``<stem>.txt`` / ``<stem>.json`` sidecars
(a gulp video's meta_data plays the JSON sidecar). A local tar's members are read into memory
when encoded; nothing is extracted.

A URL ending in ``/`` is a prefix, listed once (``storage.remote``: every video object below it,
sorted, as a folder is walked, its sidecars the objects beside it); any other URL is one object,
a video or a tar. Nothing of an object is read while expanding but a tar's headers: a worker
downloads each video (or tar member) into a temporary file when its turn comes and deletes it
once encoded (``Source.opened``), and fetches its sidecars then, so memory stays bounded and the
downloads overlap the other workers' encodes.
"""

from __future__ import annotations

import json
import os
import posixpath
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import unquote, urlsplit

from kohakuclip.formats import VIDEO_SUFFIXES
from kohakuclip.gulp.meta import is_gulp_directory
from kohakuclip.storage.folder import is_media, list_folder, printable_name, unique_origins
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
from kohakuclip.storage.zip import ArchiveError, Member, member_origins
from kohakuclip.write.gulp_videos import GulpVideo, list_gulp_videos

__all__ = ["Source", "expand_sources"]


SIDECAR_SUFFIXES = (".txt", ".json")

DOWNLOAD_BLOCK = 16 << 20
"""Bytes per ranged GET when a video in object storage is downloaded for its encode (what a
worker holds of it in memory at once)."""


@dataclass(frozen=True)
class Source:
    """One video to encode, with what travels with it into the manifest (``Source.from_bytes``
    makes one from memory).

    Attributes:
        name: the member name in the shard (before its suffix becomes ``.mp4``).
        origin: a path, ``archive.tar::member``, ``gulp_dir::id`` or ``<bytes>::name``.
        size: bytes of the source.
        sidecars: ``.txt`` / ``.json`` sidecar bytes by suffix.
        path: a file FFmpeg opens itself.
        data: in-memory bytes.
        archive: for a tar member: the archive ...
        offset: ... and where the member's bytes start in it (or in ``remote``).
        gulp: a gulp video, encoded from its JPEG frames.
        remote: an object in storage: the video, or (with ``offset``) a tar holding it.
        remote_sidecars: sidecars in storage by suffix: (object, offset, size), fetched when
            ``labels`` are made (on the worker encoding the video).
    """

    name: str
    origin: str
    size: int
    sidecars: dict[str, bytes] = field(default_factory=dict)
    path: str | None = None
    data: bytes | None = None
    archive: str | None = None
    offset: int = 0
    gulp: GulpVideo | None = None
    remote: RemoteObject | None = None
    remote_sidecars: dict[str, tuple[RemoteObject, int, int]] = field(default_factory=dict)

    @classmethod
    def from_bytes(
        cls, name: str, data: bytes, caption: str | None = None, meta: dict[str, Any] | None = None
    ) -> Source:
        """An in-memory video; ``caption`` and ``meta`` play the parts of the sidecars."""
        sidecars = {}
        if caption is not None:
            sidecars[".txt"] = caption.encode()
        if meta is not None:
            sidecars[".json"] = json.dumps(meta, ensure_ascii=False).encode()
        return cls(name, f"<bytes>::{name}", len(data), sidecars, data=bytes(data))

    def load(self) -> str | bytes:
        """What the encoder opens: the file's path, or the video's bytes (gulp videos have
        neither: ``write.gulp_videos.encode_gulp_video`` encodes them; a video in object
        storage is read whole: ``opened`` downloads it into a file instead)."""
        if self.gulp is not None:
            raise ValueError(f"{self.origin}: a gulp video is encoded from its frames")
        if self.path is not None:
            return self.path
        if self.data is not None:
            return self.data
        if self.remote is not None:
            return self.remote.read(self.offset, self.size)
        assert self.archive is not None
        with open(self.archive, "rb") as f:
            data = os.pread(f.fileno(), self.size, self.offset)
        if len(data) != self.size:
            raise OSError(f"{self.origin}: truncated tar member")
        return data

    @contextmanager
    def opened(self, stop: threading.Event | None = None) -> Iterator[str | bytes]:
        """What the encoder opens, for the ``with`` block: ``load()``'s, or for a video in object
        storage a temporary file it is downloaded into (named with its suffix; deleted when the
        block ends): an encoder needs a file or bytes, the ffmpeg backend's child a file, and a
        video may be too big to hold in memory. Raises ``ObjectStoreError`` naming the URL, and
        InterruptedError when ``stop`` is set during the download (Ctrl-C, SIGTERM)."""
        if self.remote is None:
            yield self.load()
            return
        suffix = posixpath.splitext(self.name)[1]
        with tempfile.NamedTemporaryFile(prefix="kohakuclip-download-", suffix=suffix) as f:
            _download(self.remote, self.offset, self.size, f, stop)
            yield f.name

    def labels(self) -> dict[str, Any]:
        """Caption, label and the JSON sidecar for the manifest (ValueError for bad JSON;
        ``ObjectStoreError`` for a sidecar in object storage that cannot be read)."""
        sidecars = {**self.sidecars, **_fetch_sidecars(self.remote_sidecars)}
        meta: dict[str, Any] | None = None
        raw = sidecars.get(".json")
        if raw is not None:
            try:
                loaded = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"{self.origin}: bad JSON sidecar ({e})") from None
            meta = loaded if isinstance(loaded, dict) else {"value": loaded}
        caption = None
        if ".txt" in sidecars:
            caption = sidecars[".txt"].decode("utf-8", "replace").strip()
        elif meta is not None and isinstance(meta.get("caption"), str):
            caption = meta["caption"]
        label = None if meta is None else meta.get("label")
        if label is not None and not isinstance(label, str):
            label = json.dumps(label, ensure_ascii=False)
        return {
            "caption": caption,
            "label": label,
            "meta": None if meta is None else json.dumps(meta, ensure_ascii=False, sort_keys=True),
        }


def _stem(name: str) -> str:
    return posixpath.splitext(name)[0]


def is_video_name(name: str) -> bool:
    """A video file by its suffix (hidden files excluded)."""
    return is_media(name, VIDEO_SUFFIXES)


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _file_sidecars(path: str) -> dict[str, bytes]:
    stem = os.path.splitext(path)[0]
    found = {}
    for suffix in SIDECAR_SUFFIXES:
        data = _read_file(stem + suffix) if os.path.isfile(stem + suffix) else None
        if data is not None:
            found[suffix] = data
    return found


def _file_source(path: str, name: str, origin: str | None = None) -> Source | tuple[str, str]:
    """The video at ``path`` (``origin``: how the manifest names it; default its printable
    path), or (path, reason) for a dangling link, a FIFO, a device ..."""
    try:
        info = os.stat(path)
    except OSError as e:
        return path, f"{path}: cannot read ({e.strerror or e})"
    if not stat.S_ISREG(info.st_mode):
        return path, f"{path}: not a regular file"
    origin = printable_name(path) if origin is None else origin
    return Source(printable_name(name), origin, info.st_size, _file_sidecars(path), path=path)


def _folder_sources(root: str) -> tuple[list[Source], list[tuple[str, str]]]:
    """The videos below ``root``, and (path, reason) of the folders and files that cannot be
    read."""
    unreadable: list[tuple[str, str]] = []

    def failed(e: OSError) -> None:
        unreadable.append((str(e.filename), f"{e.filename}: cannot list ({e.strerror or e})"))

    names = list_folder(root, VIDEO_SUFFIXES, on_error=failed)
    paths = [os.path.join(root, *name.split("/")) for name in names]
    sources = []
    for name, path, origin in zip(names, paths, unique_origins(paths), strict=True):
        found = _file_source(path, name, origin)
        if isinstance(found, Source):
            sources.append(found)
        else:
            unreadable.append(found)
    return sources, unreadable


def _tar_members(members: list[Member]) -> tuple[list[Member], dict[str, dict[str, Member]]]:
    """A tar's video members, and its sidecar members by the stem and suffix they belong to."""
    videos: list[Member] = []
    sidecars: dict[str, dict[str, Member]] = {}
    for m in members:
        suffix = posixpath.splitext(m.name)[1].lower()
        if is_video_name(m.name):
            videos.append(m)
        elif suffix in SIDECAR_SUFFIXES:
            sidecars.setdefault(_stem(m.name), {})[suffix] = m
    return videos, sidecars


def _tar_sources(archive: str) -> list[Source]:
    videos, members = _tar_members(list_tar(archive))
    with open(archive, "rb") as f:
        sidecars = {
            stem: {suffix: os.pread(f.fileno(), m.size, m.offset) for suffix, m in found.items()}
            for stem, found in members.items()
        }
    origins = member_origins(archive, [m.name for m in videos], "::")
    return [
        Source(
            printable_name(m.name),
            origin,
            m.size,
            sidecars.get(_stem(m.name), {}),
            archive=archive,
            offset=m.offset,
        )
        for m, origin in zip(videos, origins, strict=True)
    ]


def _download(
    obj: RemoteObject, offset: int, size: int, into: IO[bytes], stop: threading.Event | None
) -> None:
    """``size`` bytes of ``obj`` from ``offset`` into the file ``into`` (flushed), by ranged
    GETs of ``DOWNLOAD_BLOCK`` bytes; InterruptedError between two when ``stop`` is set."""
    for start in range(offset, offset + size, DOWNLOAD_BLOCK):
        if stop is not None and stop.is_set():
            raise InterruptedError(f"{obj.url}: download interrupted")
        into.write(obj.read(start, min(DOWNLOAD_BLOCK, offset + size - start)))
    into.flush()


def _fetch_sidecars(wanted: dict[str, tuple[RemoteObject, int, int]]) -> dict[str, bytes]:
    """The sidecars in object storage (``Source.remote_sidecars``) by suffix, fetched at once
    (concurrent ranged GETs)."""
    ranges = [(obj, offset, offset + size) for obj, offset, size in wanted.values()]
    return {suffix: bytes(data) for suffix, data in zip(wanted, fetch_ranges(ranges))}


def _zip_refused(path: str) -> ValueError:
    return ValueError(
        f"{path}: zip archives are not a video source (give video files, folders, "
        ".tar archives or gulp directories)"
    )


def _sidecars_beside(
    url: str, entries: dict[str, dict[str, Any]]
) -> dict[str, tuple[RemoteObject, int, int]]:
    """The ``<stem>.txt`` / ``<stem>.json`` objects beside the video object ``url`` among
    ``entries`` (URL -> listing entry or HEAD answer), as ``Source.remote_sidecars``."""
    stem = _stem(url)
    found = {}
    for suffix in SIDECAR_SUFFIXES:
        entry = entries.get(stem + suffix)
        if entry is not None:
            found[suffix] = (open_object(stem + suffix, meta=entry), 0, int(entry["size"]))
    return found


def _prefix_sources(prefix: str) -> list[Source]:
    """Every video object below the URL ``prefix`` (sorted by URL, as a folder's videos are by
    path; named by their keys below it), with the sidecar objects beside each. Plain http(s)
    cannot be listed (ValueError); a prefix with no object at all is MissingObjectError (a typo
    should not silently drop a folder's videos)."""
    if prefix.partition("://")[0].lower() in ("http", "https"):
        raise ValueError(
            f"{prefix}: a plain http(s) prefix cannot be listed: name each video's (or tar's) URL"
        )
    listed = dict(list_objects(prefix))
    if not listed:
        raise MissingObjectError(f"{prefix}: no objects under this prefix")
    return [
        Source(
            url[len(prefix) :],
            url,
            int(meta["size"]),
            remote_sidecars=_sidecars_beside(url, listed),
            remote=open_object(url, meta=meta),
        )
        for url, meta in listed.items()
        if is_video_name(url[len(prefix) :])
    ]


def _remote_tar_sources(obj: RemoteObject) -> list[Source]:
    """The video members of a tar in object storage (its headers read by ranged GETs), each
    with its sidecar members."""
    videos, sidecars = _tar_members(list_tar(obj))
    origins = member_origins(obj.url, [m.name for m in videos], "::")
    return [
        Source(
            printable_name(m.name),
            origin,
            m.size,
            remote_sidecars={
                suffix: (obj, s.offset, s.size)
                for suffix, s in sidecars.get(_stem(m.name), {}).items()
            },
            remote=obj,
            offset=m.offset,
        )
        for m, origin in zip(videos, origins, strict=True)
    ]


def _url_sources(url: str) -> tuple[list[Source], list[tuple[str, str]]]:
    """The videos the URL names (a prefix's, a tar's members, or the object itself with the
    sidecar objects beside it), and the tar that cannot be read (URL, reason). A store that
    cannot be reached, refused credentials and a missing object raise ``ObjectStoreError``
    naming the URL, before anything is encoded."""
    if url.endswith("/"):
        return _prefix_sources(url), []
    if suffix_of(url) == ".zip":
        raise _zip_refused(url)
    try:
        obj = open_object(url)
    except MissingObjectError:
        raise MissingObjectError(f"{url}: no such object (a prefix ends with '/')") from None
    if suffix_of(url) == ".tar":
        try:
            return _remote_tar_sources(obj), []
        except ArchiveError as e:
            return [], [(url, str(e))]
    heads = head_objects([_stem(url) + suffix for suffix in SIDECAR_SUFFIXES])
    name = unquote(posixpath.basename(urlsplit(url).path))
    return [
        Source(name, url, obj.size, remote_sidecars=_sidecars_beside(url, heads), remote=obj)
    ], []


def _gulp_sources(root: str, gulp_fps: float | None) -> tuple[list[Source], list[tuple[str, str]]]:
    videos, unreadable = list_gulp_videos(root, gulp_fps)
    sources = [
        Source(
            f"{v.id}.mp4",
            f"{root}::{v.id}",
            v.size,
            {".json": json.dumps(v.meta, ensure_ascii=False).encode()},
            gulp=v,
        )
        for v in videos
    ]
    return sources, unreadable


@dataclass(frozen=True)
class Expansion:
    """The videos found, and the sources that could not be listed (origin, reason)."""

    sources: list[Source]
    unreadable: list[tuple[str, str]]


def expand_sources(
    items: Iterable[str | os.PathLike[str] | Source | tuple[str, bytes]],
    gulp_fps: float | None = None,
) -> Expansion:
    """Every video named by ``items``, in order: a file is one video (whatever its suffix), a
    folder every video file below it (sorted), a ``.tar`` every video member (archive order),
    a gulp directory (one holding ``data_<i>.gulp`` / ``meta_<i>.gmeta``) every id, in chunk
    order, at ``gulp_fps`` if given (see ``write.gulp_videos``), a ``(name, bytes)`` pair or a
    ``Source`` itself; a URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``) ending in ``/``
    every video object below that prefix (sorted; not plain http(s), which cannot be listed),
    any other URL one object: a tar's video members, or one video. A missing path raises
    FileNotFoundError (a missing object or an empty prefix ``MissingObjectError``), and a zip
    ValueError, before anything is done (a typo should not silently drop a folder), as does a
    store that cannot be reached (``ObjectStoreError``); a tar or a gulp chunk that cannot be
    read, a folder that cannot be listed and a file that is not a regular one (a FIFO, a
    dangling link) are reported in ``unreadable``. Symlink loops are not followed."""
    found: list[Source] = []
    unreadable: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, Source):
            found.append(item)
        elif isinstance(item, tuple):
            name, data = item
            found.append(Source.from_bytes(name, data))
        else:
            path = os.fspath(item)
            if is_url(path):
                videos, bad = _url_sources(path)
                found.extend(videos)
                unreadable.extend(bad)
            elif is_gulp_directory(path):
                videos, bad = _gulp_sources(path, gulp_fps)
                found.extend(videos)
                unreadable.extend(bad)
            elif os.path.isdir(path):
                videos, bad = _folder_sources(path)
                found.extend(videos)
                unreadable.extend(bad)
            elif not os.path.exists(path):
                raise FileNotFoundError(f"{path}: no such file or folder")
            elif path.lower().endswith(".zip"):
                raise _zip_refused(path)
            elif path.lower().endswith(".tar"):
                try:
                    found.extend(_tar_sources(path))
                except (ArchiveError, OSError) as e:
                    unreadable.append((path, str(e)))
            else:
                source = _file_source(path, os.path.basename(path))
                if isinstance(source, Source):
                    found.append(source)
                else:
                    unreadable.append(source)
    return Expansion(found, [(printable_name(p), printable_name(r)) for p, r in unreadable])

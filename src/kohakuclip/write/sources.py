"""Expand what the user names (files, folders, tar archives, gulp directories, in-memory bytes)
into videos.

Each video becomes a ``Source``: the member name it gets in a shard (its path below the folder or
inside the tar, or the file's name; a gulp video's id), where it came from (for the manifest and
skipped.jsonl), and its ``<stem>.txt`` / ``<stem>.json`` sidecars (a gulp video's meta_data plays
the JSON sidecar). Tar members are read into memory when encoded; nothing is extracted.
"""

from __future__ import annotations

import json
import os
import posixpath
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kohakuclip.gulp.meta import is_gulp_directory
from kohakuclip.storage.folder import list_folder
from kohakuclip.storage.tar import list_tar
from kohakuclip.storage.zip import ArchiveError, Member
from kohakuclip.write.gulp_videos import GulpVideo, list_gulp_videos

__all__ = ["Source", "expand_sources"]


VIDEO_SUFFIXES = (
    ".mp4",
    ".m4v",
    ".mov",
    ".mkv",
    ".webm",
    ".avi",
    ".mpg",
    ".mpeg",
    ".ts",
    ".m2ts",
    ".mts",
    ".flv",
    ".wmv",
    ".3gp",
    ".ogv",
)
"""Suffixes that mark video files inside folders and tar archives."""

SIDECAR_SUFFIXES = (".txt", ".json")


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
        offset: ... and where the member's bytes start in it.
        gulp: a gulp video, encoded from its JPEG frames.
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
        neither: ``write.gulp_videos.encode_gulp_video`` encodes them)."""
        if self.gulp is not None:
            raise ValueError(f"{self.origin}: a gulp video is encoded from its frames")
        if self.path is not None:
            return self.path
        if self.data is not None:
            return self.data
        assert self.archive is not None
        with open(self.archive, "rb") as f:
            data = os.pread(f.fileno(), self.size, self.offset)
        if len(data) != self.size:
            raise OSError(f"{self.origin}: truncated tar member")
        return data

    def labels(self) -> dict[str, Any]:
        """Caption, label and the JSON sidecar for the manifest (ValueError for bad JSON)."""
        meta: dict[str, Any] | None = None
        raw = self.sidecars.get(".json")
        if raw is not None:
            try:
                loaded = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as e:
                raise ValueError(f"{self.origin}: bad JSON sidecar ({e})") from None
            meta = loaded if isinstance(loaded, dict) else {"value": loaded}
        caption = None
        if ".txt" in self.sidecars:
            caption = self.sidecars[".txt"].decode("utf-8", "replace").strip()
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
    return name.lower().endswith(VIDEO_SUFFIXES) and not posixpath.basename(name).startswith(".")


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


def _file_source(path: str, name: str) -> Source | tuple[str, str]:
    """The video at ``path``, or (path, reason) for a dangling link, a FIFO, a device ..."""
    try:
        info = os.stat(path)
    except OSError as e:
        return path, f"{path}: cannot read ({e.strerror or e})"
    if not stat.S_ISREG(info.st_mode):
        return path, f"{path}: not a regular file"
    return Source(name, path, info.st_size, _file_sidecars(path), path=path)


def _folder_sources(root: str) -> tuple[list[Source], list[tuple[str, str]]]:
    """The videos below ``root``, and (path, reason) of the folders and files that cannot be
    read."""
    unreadable: list[tuple[str, str]] = []

    def failed(e: OSError) -> None:
        unreadable.append((str(e.filename), f"{e.filename}: cannot list ({e.strerror or e})"))

    names = list_folder(root, VIDEO_SUFFIXES, on_error=failed)
    sources = []
    for name in names:
        found = _file_source(os.path.join(root, *name.split("/")), name)
        if isinstance(found, Source):
            sources.append(found)
        else:
            unreadable.append(found)
    return sources, unreadable


def _tar_sources(archive: str) -> list[Source]:
    members = list_tar(archive)
    sidecars: dict[str, dict[str, bytes]] = {}
    wanted: list[Member] = []
    with open(archive, "rb") as f:
        for m in members:
            suffix = posixpath.splitext(m.name)[1].lower()
            if is_video_name(m.name):
                wanted.append(m)
            elif suffix in SIDECAR_SUFFIXES:
                data = os.pread(f.fileno(), m.size, m.offset)
                sidecars.setdefault(_stem(m.name), {})[suffix] = data
    return [
        Source(
            m.name,
            f"{archive}::{m.name}",
            m.size,
            sidecars.get(_stem(m.name), {}),
            archive=archive,
            offset=m.offset,
        )
        for m in wanted
    ]


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
    ``Source`` itself. A missing path raises FileNotFoundError, and a zip ValueError, before
    anything is done (a typo should not silently drop a folder); a tar or a gulp chunk that
    cannot be read, a folder that cannot be listed and a file that is not a regular one (a
    FIFO, a dangling link) are reported in ``unreadable``. Symlink loops are not followed."""
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
            if is_gulp_directory(path):
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
                raise ValueError(
                    f"{path}: zip archives are not a video source (give video files, folders, "
                    ".tar archives or gulp directories)"
                )
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
    return Expansion(found, unreadable)

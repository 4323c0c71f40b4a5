"""Listing video sources: paths, URLs, prefixes, folders and dataset views expanded into shards,
folders and gulp directories (``VideoSource``) and their videos (``VideoRef``).

Sources are zip or tar shards (with or without a KCIDX1 index member), folder trees of mp4
files, GulpIO directories, and folders with a dataset view (``dataset.json``, written by
``kohakuclip merge``): their shards in the view's order, each video's header entry from the
merged manifest, no shard opened. Zip shards, mp4 files and GulpIO directories may also be in
object storage (``s3://``, ``gs://``, ``az://``, ``http(s)://``; ``storage.remote``), and a URL
ending in ``/`` lists the shards or mp4 files under it (``http(s)://``: found from the
writers' files, see ``storage.prefix``). Opening a source reads at most its zip
tail and index header (a few ranged reads, never a listing of members); no frame table is read
here (``storage.video_resolve`` does that).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from kohakuclip.errors import KohakuClipError, SourceWarning, os_error_text
from kohakuclip.formats import (
    AV1_DEPS_KEY,
    DATASET_FILE,
    FRAME_RECORD,
    INDEX_MEMBER,
    READ_VIDEO_SUFFIXES,
    SHARD_SUFFIXES,
    VIDEO_INDEX_MAGIC,
    VIDEO_SUFFIXES,
    IndexFormatError,
    VideoEntry,
    read_index_header,
)
from kohakuclip.gulp.index import GulpIndex, open_gulp_source
from kohakuclip.gulp.meta import is_gulp_directory
from kohakuclip.storage.files import FileCache
from kohakuclip.storage.folder import (
    is_hidden,
    is_media,
    media_or_shards,
    mixed_message,
    printable_name,
)
from kohakuclip.storage.index import video_entries
from kohakuclip.storage.prefix import list_prefix, open_listed_gulp
from kohakuclip.storage.ranged import Objects
from kohakuclip.storage.remote import ObjectStoreError, is_url, local_path, suffix_of
from kohakuclip.storage.tar import find_tar_last_member, list_tar
from kohakuclip.storage.video_refs import VideoRef, VideoRefs
from kohakuclip.storage.view import ViewError, has_view, load_view, parse_view
from kohakuclip.storage.zip import ArchiveError, Member, find_zip_member, list_zip

__all__ = [
    "SourceError",
    "VideoSource",
    "archive_members",
    "index_layout",
    "list_video_sources",
]


_T = TypeVar("_T")

_READ_WHAT = (
    f"the reader opens {', '.join(READ_VIDEO_SUFFIXES)} files and zip or tar shards "
    "(kohakuclip-write turns other videos into shards)"
)


_warned: set[str] = set()
"""Sources whose left-out videos this process has named (forked DataLoader workers inherit it,
so the warning is not repeated per worker and epoch)."""


def _readable(where: str, found: Sequence[_T], name: Callable[[_T], str]) -> list[_T]:
    """The entries of ``found`` (videos of one source) whose ``name`` the reader opens; the
    others (an .avi, a .ts: videos only the writer takes) are left out with a ``SourceWarning``,
    once per source and process."""
    kept = [f for f in found if name(f).lower().endswith(READ_VIDEO_SUFFIXES)]
    if len(kept) < len(found) and where not in _warned:
        _warned.add(where)
        example = next(n for n in map(name, found) if not n.lower().endswith(READ_VIDEO_SUFFIXES))
        left = len(found) - len(kept)
        warnings.warn(
            f"{printable_name(where)}: {left} video{'s' * (left > 1)} left out (e.g. "
            f"{printable_name(example)}): {_READ_WHAT}",
            SourceWarning,
            stacklevel=2,
        )
    return kept


class SourceError(KohakuClipError, ValueError):
    """A source that cannot be opened, or a video in it that cannot be read."""


@dataclass
class VideoSource:
    """One listed source of videos: a shard, a folder (local or a URL prefix) or a gulp."""

    path: str
    kind: str  # "zip" | "tar" | "folder" | "gulp"
    index_member: Member | None = None
    members: dict[str, Member] | None = None  # filled lazily for archives
    records_start: int = 0  # absolute offset of the first index record
    deps_start: int = -1  # absolute offset of the AV1 dependency table (-1: none)
    deps: dict[str, tuple[int, int]] | None = None  # member -> (first record offset, records)
    gulp: GulpIndex | None = None
    remote: bool = False  # an object-storage source: every path under it is a URL
    expected_size: int = -1  # from a dataset view: the shard's size when merged (-1: unknown)
    origin: int = 0  # the position of the path it was listed from among those given


_VIEW_COLUMNS = ["shard", "index", "member", "frames", "fps", "width", "height", "codec"]
_VIEW_COLUMNS += ["colorspace", "prefix"]
_VIEW_OPTIONAL = ["full_range"]  # merged manifests before 2026-12-03 lack it: limited range


def list_video_sources(
    paths: list[str], objects: Objects, use_index: bool = True
) -> tuple[list[VideoSource], VideoRefs]:
    """The sources ``paths`` expand to, each with the position of its path (``origin``: a
    folder of shards, a dataset view or a URL prefix lists several), and their videos in order.

    Args:
        paths: shards, folders, mp4 files, gulp directories, dataset views, or their URLs.
        objects: where remote objects are opened and read (their listing entries are recorded).
        use_index: read shards' KCIDX1 index; False lists their mp4 members instead.
    """
    lister = _Lister(objects, use_index)
    for origin, path in enumerate(paths):
        first = len(lister.sources)
        try:
            lister.add(os.fspath(path))
        except OSError as e:  # e.g. a folder this process may not read
            raise SourceError(os_error_text(e, os.fspath(path))) from None
        for src in lister.sources[first:]:
            src.origin = origin
    return lister.sources, lister.videos


def archive_members(objects: Objects, src: VideoSource) -> dict[str, Member]:
    """The members of a zip or tar source, listed on first use (kept in ``src.members``)."""
    if src.members is None:
        try:
            if src.kind == "zip":
                with objects.open(src.path) as f:
                    listed = list_zip(f)
            elif src.remote:
                with objects.open(src.path) as f:
                    listed = list_tar(f)
            else:
                listed = list_tar(src.path)
        except (ArchiveError, ObjectStoreError) as e:
            raise SourceError(str(e)) from None
        src.members = {m.name: m for m in listed}
    return src.members


def index_layout(path: str) -> tuple[Member, int, int, list[VideoEntry]]:
    """Where an indexed video shard's index lies: the index member, the absolute offsets of its
    first frame record and of its KCAV1D table (-1: none), and its header entries."""
    files = FileCache(4)
    try:
        sources, videos = list_video_sources([path], Objects(files, None, None))
        src = sources[0]
        if src.index_member is None:
            raise SourceError(f"{path}: no {INDEX_MEMBER} member (not a kohakuclip shard)")
        entries = [ref.entry for ref in videos if ref.entry is not None]
        return src.index_member, src.records_start, src.deps_start, entries
    finally:
        files.close()


class _Lister:
    """Sources and videos appended as paths are expanded."""

    def __init__(self, objects: Objects, use_index: bool) -> None:
        self.objects = objects
        self.use_index = use_index
        self.sources: list[VideoSource] = []
        self.videos = VideoRefs()

    def add(self, path: str) -> None:
        try:
            self._add(path)
        except SourceError:
            raise
        except ValueError as e:  # a video the listing's columns refuse (VideoRefs.append)
            raise SourceError(f"{path}: {e}") from None

    def _add(self, path: str) -> None:
        path = local_path(path)
        if is_url(path):
            try:
                self._add_remote(path)
            except ObjectStoreError as e:
                raise SourceError(str(e)) from None
            return
        if has_view(path):
            self._add_view(path)
            return
        if os.path.isdir(path) and is_gulp_directory(path):
            sid = len(self.sources)
            try:
                gulp = open_gulp_source(path)
            except ValueError as e:
                raise SourceError(str(e)) from None
            self.sources.append(VideoSource(path, "gulp", gulp=gulp))
            self.videos.extend(VideoRef(sid, str(id_)) for id_ in gulp.ids)
            return
        if os.path.isdir(path):
            try:
                names, shards = media_or_shards(
                    path,
                    VIDEO_SUFFIXES,
                    SHARD_SUFFIXES,
                    keep=lambda found: _readable(path, found, str),
                )
            except ValueError as e:
                raise SourceError(str(e)) from None
            if shards:  # a folder of shards, e.g. kohakuclip-write's output
                for name in shards:
                    self.add(os.path.join(path, name))
                return
            sid = len(self.sources)
            self.sources.append(VideoSource(path, "folder"))
            self.videos.extend(VideoRef(sid, name) for name in names)
            return
        if not os.path.exists(path):
            raise SourceError(f"{path}: no such file or directory")
        if path.lower().endswith(READ_VIDEO_SUFFIXES):  # one video file: a folder of one
            sid = len(self.sources)
            self.sources.append(VideoSource(os.path.dirname(path) or ".", "folder"))
            self.videos.append(VideoRef(sid, os.path.basename(path)))
            return
        if path.lower().endswith(VIDEO_SUFFIXES):  # a .ts, an .avi given by name
            raise SourceError(f"{path}: not a video the reader opens as it is: {_READ_WHAT}")
        try:
            self._add_archive(path)
        except SourceError as e:
            if path.lower().endswith((".zip", ".tar")):
                raise
            raise SourceError(f"{e}; {_READ_WHAT}") from None  # say what is read instead

    def _add_remote(self, url: str) -> None:
        """An object, or every shard and mp4 file under a prefix (a URL ending in ``/``)."""
        if not url.endswith("/"):
            self.objects.remote(url)
            if suffix_of(url) in READ_VIDEO_SUFFIXES:  # one mp4: a folder source of one video
                folder, name = url.rsplit("/", 1)
                self.sources.append(VideoSource(folder + "/", "folder", remote=True))
                self.videos.append(VideoRef(len(self.sources) - 1, name))
            elif suffix_of(url) in VIDEO_SUFFIXES:
                raise SourceError(f"{url}: not a video the reader opens as it is: {_READ_WHAT}")
            else:
                self._add_archive(url, remote=True)
            return
        listed = list_prefix(url, self.objects.options)
        if any(found == url + DATASET_FILE for found, _ in listed):  # a merged dataset view
            self._add_view(url, dict(listed))
            return
        if self._add_remote_gulp(url, listed):
            return
        shards = [(f, m) for f, m in listed if suffix_of(f) in (".zip", ".tar")]
        videos = [(f, m) for f, m in listed if suffix_of(f) in VIDEO_SUFFIXES and not is_hidden(f)]
        gulp_files = [f for f, _ in listed if suffix_of(f) in (".gulp", ".gmeta")]
        if gulp_files:
            raise SourceError(
                f"{gulp_files[0]}: only zip and tar shards, mp4 files and gulp directories (a "
                "prefix holding data_<i>.gulp and meta_<i>.gmeta) are read from URLs"
            )
        videos = _readable(url, videos, lambda found: found[0])
        if videos and shards:
            raise SourceError(
                mixed_message(url, videos[0][0], len(videos), shards[0][0], len(shards))
            )
        if not videos and not shards:
            raise SourceError(f"{url}: no zip or tar shards or mp4 files under this prefix")
        for found, meta in shards:
            self.objects.remote(found, meta)
            self._add_archive(found, remote=True)
        if videos:
            for found, meta in videos:
                self.objects.remote(found, meta)
            sid = len(self.sources)
            self.sources.append(VideoSource(url, "folder", remote=True))
            self.videos.extend(VideoRef(sid, found[len(url) :]) for found, _ in videos)

    def _add_remote_gulp(self, url: str, listed: list[tuple[str, dict[str, Any]]]) -> bool:
        """A gulp directory directly under the prefix ``url``; False when there is none."""
        try:
            gulp = open_listed_gulp(self.objects, url, listed)
        except ValueError as e:
            raise SourceError(str(e)) from None
        if gulp is None:
            return False
        sid = len(self.sources)
        self.sources.append(VideoSource(url, "gulp", gulp=gulp, remote=True))
        self.videos.extend(VideoRef(sid, str(id_)) for id_ in gulp.ids)
        return True

    def _add_archive(self, path: str, remote: bool = False) -> None:
        kind = "tar" if path.endswith(".tar") else "zip"
        src = VideoSource(path, kind, remote=remote)
        sid = len(self.sources)
        try:
            if remote and kind == "tar":  # the index from the tail, no walk of the headers
                with self.objects.open(path) as f:
                    last = find_tar_last_member(f) if self.use_index else None
                src.index_member = last if last is not None and last.name == INDEX_MEMBER else None
            elif kind == "zip":
                with self.objects.open(path) as f:
                    src.index_member = find_zip_member(f, INDEX_MEMBER) if self.use_index else None
            else:
                src.members = {m.name: m for m in list_tar(path)}
                src.index_member = src.members.get(INDEX_MEMBER) if self.use_index else None
        except (ArchiveError, ObjectStoreError) as e:
            raise SourceError(str(e)) from None
        self.sources.append(src)
        if src.index_member is not None:
            header = self._read_index_header(src)
            self.videos.extend(VideoRef(sid, v.member, v) for v in header)
        else:
            members = archive_members(self.objects, src)
            names = [n for n in sorted(members) if is_media(n, VIDEO_SUFFIXES)]
            self.videos.extend(VideoRef(sid, name) for name in _readable(path, names, str))

    def _add_view(self, root: str, listed: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Every shard of a dataset view, each video's entry from the merged manifest: a
        folder's, or (given ``listed``, its objects: URL -> listing entry) a URL prefix's, read
        with one GET each for the view and the manifest."""
        remote = listed is not None
        try:
            if listed is not None:
                where = root + DATASET_FILE
                obj = self.objects.remote(where, listed[where])
                view = parse_view(obj.read(0, obj.size), where)
            else:
                view = load_view(root)
        except (ViewError, ObjectStoreError) as e:
            raise SourceError(str(e)) from None
        manifest = root + view.manifest if remote else os.path.join(root, view.manifest)
        if view.kind != "video":
            raise SourceError(f"{root}: a dataset view of {view.kind}s, not videos")
        try:
            if listed is not None:
                if manifest not in listed:
                    raise FileNotFoundError("no such object")
                obj = self.objects.remote(manifest, listed[manifest])
                parquet = pq.ParquetFile(pa.BufferReader(obj.read(0, obj.size)))
            else:
                parquet = pq.ParquetFile(manifest)
            optional = [c for c in _VIEW_OPTIONAL if c in parquet.schema_arrow.names]
            table = parquet.read(columns=_VIEW_COLUMNS + optional)
        except (OSError, KeyError, ValueError) as e:
            raise SourceError(f"{manifest}: cannot read the merged manifest ({e})") from None
        table = table.sort_by([("shard", "ascending"), ("index", "ascending")])
        columns = {name: table.column(name).to_pylist() for name in _VIEW_COLUMNS + optional}
        full_range = columns.get("full_range", [False] * len(table))
        start = 0
        for shard in view.shards:
            rows = range(start, start + shard.count)
            start += shard.count
            if rows.stop > len(table) or any(columns["shard"][i] != shard.name for i in rows):
                raise SourceError(f"{manifest}: rows disagree with the view's {shard.name}")
            kind = "tar" if shard.name.endswith(".tar") else "zip"
            sid = len(self.sources)
            path = root + shard.name if remote else os.path.join(root, shard.name)
            if listed is not None:
                if path not in listed:
                    raise SourceError(f"{path}: listed in the dataset view, but no such object")
                self.objects.remote(path, listed[path])
            self.sources.append(
                VideoSource(
                    path,
                    kind,
                    remote=remote,
                    index_member=Member(INDEX_MEMBER, *shard.index),
                    records_start=shard.records,
                    deps_start=shard.deps,
                    expected_size=shard.bytes,
                )
            )
            row = 0
            for i in rows:
                entry = VideoEntry(
                    member=columns["member"][i],
                    row=row,
                    n=columns["frames"][i],
                    fps=columns["fps"][i],
                    h=columns["height"][i],
                    w=columns["width"][i],
                    codec=columns["codec"][i],
                    prefix=columns["prefix"][i] or "",
                    colorspace=columns["colorspace"][i],
                    full_range=bool(full_range[i]),
                )
                self.videos.append(VideoRef(sid, entry.member, entry))
                row += entry.n
        if start != len(table):
            raise SourceError(f"{manifest}: {len(table)} rows, the view lists {start} videos")

    def _read_index_header(self, src: VideoSource) -> list[VideoEntry]:
        member = src.index_member
        assert member is not None
        where = f"{src.path}:{INDEX_MEMBER}"
        try:
            with self.objects.open(src.path) as f:
                head = read_index_header(
                    lambda at, n: f.read(member.offset + at, n),
                    VIDEO_INDEX_MAGIC,
                    member.size,
                    where,
                )
            header = head.header
            videos = video_entries(header, where)
        except IndexFormatError as e:
            raise SourceError(str(e)) from None
        src.records_start = member.offset + head.records
        trailer = header.get(AV1_DEPS_KEY, 0)
        if not isinstance(trailer, int) or not 0 <= trailer <= member.size:
            raise SourceError(f"{where}: bad {AV1_DEPS_KEY!r} size {trailer!r}")
        if trailer:
            src.deps_start = member.offset + member.size - trailer
        records_end = member.offset + member.size - trailer
        n_records = (records_end - src.records_start) // FRAME_RECORD.itemsize
        for v in videos:
            if v.row < 0 or v.row + v.n > n_records:
                raise SourceError(f"{where}: video {v.member!r} rows exceed the frame table")
        return videos

"""The images of a set of sources: where each one's bytes are, and what is known about it.

Indexed shards (zips with a KCIMG1 index) cost only their index header to open; the table is
memory-mapped once per process and read record by record, so a catalog over tens of millions of
images holds no per-image Python objects. Plain sources (zips with stored or deflated members,
tars, folder trees) are listed once; their images' sizes and codecs come from the bytes when an
image is read or ``info`` asks. A GulpIO directory gives one image per stored frame (image gulps
hold one frame per id, video gulps every frame), located through its flat ``GulpIndex``. A
folder with a dataset view (``dataset.json``, from ``kohakuclip merge``) gives its shards in the
view's order, each opened from the view's index location without reading the shard. Zip and tar
shards and image files may also be objects in object storage (``storage.remote``; a URL ending
in ``/`` lists the shards or images under it): an indexed remote shard's table is read once
whole instead of mapped (a prefix holding a dataset view opens no shard: each table is read
when first used); a remote tar (e.g. WebDataset's) is listed header by header, one ranged read
per member; a prefix holding a GulpIO directory has its ``.gmeta`` files read whole and each
frame fetched by one ranged read. An ``http(s)://`` prefix is found from the writers' files
(``storage.prefix``).
"""

from __future__ import annotations

import os
import threading
import zlib
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import (
    DATASET_FILE,
    IMAGE_CODECS,
    IMAGE_SUFFIXES,
    INDEX_MEMBER,
    SHARD_SUFFIXES,
)
from kohakuclip.gulp.index import GulpIndex, open_gulp_source, open_remote_gulp
from kohakuclip.gulp.meta import is_gulp_directory
from kohakuclip.read.image_manifest import ImageManifest
from kohakuclip.storage.cache import BlockCache
from kohakuclip.storage.files import FileCache
from kohakuclip.storage.folder import list_folder
from kohakuclip.storage.image_index import (
    find_image_index,
    load_image_index,
    map_image_index,
    member_names,
)
from kohakuclip.storage.index import IndexFormatError
from kohakuclip.storage.prefix import list_prefix
from kohakuclip.storage.ranged import Objects
from kohakuclip.storage.remote import (
    ObjectStoreError,
    RemoteObject,
    is_url,
    local_path,
    suffix_of,
)
from kohakuclip.storage.tar import list_tar
from kohakuclip.storage.view import ViewError, has_view, load_view, parse_view
from kohakuclip.storage.zip import ArchiveError, Member, list_zip


class ImageSourceError(KohakuClipError, ValueError):
    """A source that cannot be opened, or an image in it that cannot be located."""


@dataclass(frozen=True)
class ImageLocation:
    """Everything a decode task needs to fetch one image; 0 / "" where not known yet."""

    where: str  # "source:member" for messages
    path: str  # file to read from
    offset: int
    size: int
    compressed: bool  # deflated zip member
    codec: str  # formats.IMAGE_CODECS name, or "" (sniff the bytes)
    width: int
    height: int
    color: int
    remote: RemoteObject | None = None  # the object to read from, for a source in object storage


@dataclass
class _Source:
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


def _expand_shard_folders(sources: list[str]) -> list[str]:
    """Sources with each folder that holds shards but no images replaced by its shards
    (e.g. kohakuclip-write-images' output)."""
    out = []
    for path in map(os.fspath, sources):
        plain = os.path.isdir(path) and not is_gulp_directory(path) and not has_view(path)
        shards = list_folder(path, SHARD_SUFFIXES) if plain else []
        if shards and not list_folder(path, IMAGE_SUFFIXES):
            out += [os.path.join(path, name) for name in shards]
        else:
            out.append(path)
    return out


class ImageCatalog:
    """Image ids ``0 .. len-1`` over the sources, in source order."""

    def __init__(
        self,
        sources: list[str],
        use_index: bool = True,
        storage_options: dict[str, Any] | None = None,
        cache: BlockCache | None = None,
    ) -> None:
        self.objects = Objects(FileCache(64), storage_options, cache)
        self._pid = os.getpid()
        self.sources = []
        for path in _expand_shard_folders([local_path(os.fspath(p)) for p in sources]):
            if not is_url(path):
                self.sources.extend(self._open_all(path, use_index))
                continue
            try:
                self.sources.extend(self._open_remote(path, use_index))
            except ObjectStoreError as e:
                raise ImageSourceError(str(e)) from None
        counts = np.array([s.count for s in self.sources], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self._start_list: list[int] = self._starts.tolist()
        self._lock = threading.Lock()
        self._manifest: ImageManifest | None = None

    def _open_all(self, path: str, use_index: bool) -> list[_Source]:
        """One source, or every shard of a dataset view."""
        if not has_view(path):
            return [self._open(path, use_index)]
        try:
            view = load_view(path)
        except ViewError as e:
            raise ImageSourceError(str(e)) from None
        if view.kind != "image":
            raise ImageSourceError(f"{path}: a dataset view of {view.kind}s, not images")
        return [
            _Source(
                os.path.join(path, s.name),
                "indexed",
                s.count,
                index_member=Member(INDEX_MEMBER, *s.index),
            )
            for s in view.shards
        ]

    def _open(self, path: str, use_index: bool) -> _Source:
        if is_gulp_directory(path):
            try:
                gulp = open_gulp_source(path)
            except ValueError as e:
                raise ImageSourceError(str(e)) from None
            return _Source(path, "gulp", len(gulp.size), gulp=gulp)
        if os.path.isdir(path):
            names = list_folder(path, IMAGE_SUFFIXES)
            return _Source(path, "folder", len(names), names=names)
        if not os.path.exists(path):
            raise ImageSourceError(f"{path}: no such file or directory")
        try:
            if path.lower().endswith(".tar"):
                return self._plain(path, "tar", list_tar(path))
            found = find_image_index(path) if use_index else None
            if found is not None:
                return _Source(path, "indexed", found[1], index_member=found[0])
            return self._plain(path, "zip", list_zip(path))
        except (ArchiveError, IndexFormatError) as e:
            raise ImageSourceError(str(e)) from None

    def _open_remote(self, url: str, use_index: bool) -> list[_Source]:
        """An image shard in object storage, or every shard and image under a prefix."""
        if not url.endswith("/"):
            return [self._open_object(url, use_index)]
        found = list_prefix(url, self.objects.options)
        if any(name == url + DATASET_FILE for name, _ in found):  # a merged dataset view
            return self._open_remote_view(url, dict(found))
        gulp = self._open_remote_gulp(url, found)
        if gulp is not None:
            return [gulp]
        shards, names = [], []
        for name, meta in found:
            self.objects.remote(name, meta)
            if suffix_of(name) in (".zip", ".tar"):
                shards.append(self._open_object(name, use_index))
            elif name.lower().endswith(IMAGE_SUFFIXES):
                names.append(name[len(url) :])
        if names:
            shards.append(_Source(url, "folder", len(names), names=names, remote=True))
        if not shards:
            raise ImageSourceError(f"{url}: no zip or tar shards or images under this prefix")
        return shards

    def _open_remote_gulp(
        self, url: str, listed: list[tuple[str, dict[str, Any]]]
    ) -> _Source | None:
        """The gulp directory directly under the prefix ``url`` (its ``.gmeta`` files read
        whole, its frames later by ranged reads); None when there is none."""
        sizes = {found: int(meta["size"]) for found, meta in listed}
        for found, meta in listed:
            self.objects.remote(found, meta)
        try:
            gulp = open_remote_gulp(
                url, sizes, lambda meta: self.objects.read(meta, 0, sizes[meta]), self.objects.read
            )
        except ValueError as e:
            raise ImageSourceError(str(e)) from None
        if gulp is None:
            return None
        return _Source(url, "gulp", len(gulp.size), gulp=gulp, remote=True)

    def _open_remote_view(self, url: str, listed: Mapping[str, Mapping[str, Any]]) -> list[_Source]:
        """Every shard of the dataset view under the prefix ``url`` (``listed``: its objects,
        URL -> listing entry): one GET for the view; each shard's table read when first used."""
        where = url + DATASET_FILE
        obj = self.objects.remote(where, listed[where])
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
            self.objects.remote(path, listed[path])
            member = Member(INDEX_MEMBER, *s.index)
            sources.append(_Source(path, "indexed", s.count, index_member=member, remote=True))
        return sources

    def _open_object(self, url: str, use_index: bool) -> _Source:
        if suffix_of(url) not in (".zip", ".tar"):
            raise ImageSourceError(
                f"{url}: only zip and tar shards and image files are read from URLs"
            )
        obj = self.objects.remote(url)
        try:
            if suffix_of(url) == ".tar":  # e.g. a WebDataset tar: listed header by header
                tar = self._plain(url, "tar", list_tar(obj))
                tar.remote = True
                return tar
            found = find_image_index(obj) if use_index else None
            if found is not None:
                src = _Source(url, "indexed", found[1], index_member=found[0], remote=True)
                src.records, src.records_pid = load_image_index(obj, found[0]), -2
                return src
            plain = self._plain(url, "zip", list_zip(obj))
            plain.remote = True
            return plain
        except (ArchiveError, IndexFormatError) as e:
            raise ImageSourceError(str(e)) from None

    @staticmethod
    def _plain(path: str, kind: str, members: list[Member]) -> _Source:
        images = [m for m in members if m.name.lower().endswith(IMAGE_SUFFIXES)]
        return _Source(
            path,
            kind,
            len(images),
            names=[m.name for m in images],
            offsets=np.array([m.offset for m in images], dtype=np.int64),
            sizes=np.array([m.size for m in images], dtype=np.int64),
            compressed=np.array([m.compressed for m in images], dtype=bool),
        )

    def __len__(self) -> int:
        return int(self._starts[-1])

    def after_fork(self) -> None:
        """Forget the memory maps, locks and manifests inherited through a fork."""
        self._lock = threading.Lock()
        self._manifest = None
        for src in self.sources:
            if src.records_pid not in (os.getpid(), -2):
                src.records = None
        if self._pid != os.getpid():
            self.objects = self.objects.after_fork(FileCache(64))
            self._pid = os.getpid()

    def _find(self, image_id: int) -> tuple[_Source, int]:
        s = bisect_right(self._start_list, image_id) - 1  # np.searchsorted releases the GIL
        return self.sources[s], image_id - self._start_list[s]

    def _records(self, src: _Source) -> np.ndarray:
        if src.records is not None and src.records_pid == -2:  # read whole (remote)
            return src.records
        if src.remote:  # a shard of a remote dataset view: its table read on first use
            assert src.index_member is not None
            try:
                table = load_image_index(self.objects.remote(src.path), src.index_member)
            except (ArchiveError, IndexFormatError, ObjectStoreError) as e:
                raise ImageSourceError(str(e)) from None
            src.records, src.records_pid = table, -2
            return table
        if src.records is None or src.records_pid != os.getpid():
            mapped = map_image_index(src.path, src.index_member)
            assert mapped is not None
            src.records, src.records_pid = mapped, os.getpid()
        return src.records

    def source(self, image_id: int) -> str:
        """The path of the source holding one image."""
        return self._find(image_id)[0].path

    def position(self, image_id: int) -> int:
        """The position of one image within its source."""
        return self._find(image_id)[1]

    @staticmethod
    def _gulp_frame(gulp: GulpIndex, k: int) -> tuple[int, int]:
        """(video, frame in that video) of the ``k``-th stored frame of a gulp directory."""
        video = bisect_right(gulp.first, k) - 1  # gulp.first: a sorted sequence
        return video, k - int(gulp.first[video])

    def frame(self, image_id: int) -> int | None:
        """The frame index of a gulp image within its video (None for other sources)."""
        src, k = self._find(image_id)
        if src.gulp is None:
            return None
        return self._gulp_frame(src.gulp, k)[1]

    def metadata(self, image_id: int) -> dict[str, Any]:
        """Key, caption and meta of one image: a gulp frame's id and its video's meta_data, or
        the row of the writer's manifest beside a shard (all None when there is none)."""
        src, k = self._find(image_id)
        if src.gulp is not None:
            video, _ = self._gulp_frame(src.gulp, k)
            meta = dict(src.gulp.meta(video))
            caption = meta.get("caption")
            return {
                "key": src.gulp.ids[video],
                "caption": caption if isinstance(caption, str) else None,
                "meta": meta,
            }
        with self._lock:
            if self._manifest is None:
                self._manifest = ImageManifest(lambda url: self.objects.fetch_whole(url))
            manifest = self._manifest
        row = manifest.lookup(src.path, k) or {}
        return {"key": row.get("key"), "caption": row.get("caption"), "meta": row.get("meta")}

    def member(self, image_id: int) -> str:
        """The member name (or folder-relative path; gulp: the video id) of one image."""
        src, k = self._find(image_id)
        if src.gulp is not None:
            return src.gulp.ids[self._gulp_frame(src.gulp, k)[0]]
        if src.kind == "indexed" and not src.names:
            with self._lock:
                if not src.names:
                    with self.objects.open(src.path) as f:
                        src.names = member_names(f, self._records(src))
        return src.names[k]

    def where(self, image_id: int) -> str:
        """How messages name one image: source and member (gulp: data file, id and frame)."""
        src, k = self._find(image_id)
        if src.gulp is not None:
            return self._gulp_where(src.gulp, k)
        return f"{src.path}:{self.member(image_id)}"

    def _gulp_where(self, gulp: GulpIndex, k: int) -> str:
        video, frame = self._gulp_frame(gulp, k)
        return f"{gulp.data_path(video)}: id {gulp.ids[video]!r} frame {frame}"

    def locate(self, image_id: int) -> ImageLocation:
        """Where the bytes of one image are and what the index says about them."""
        src, k = self._find(image_id)
        if src.kind == "indexed":
            rec = self._records(src)[k]
            codec_id = int(rec["codec"])
            where = f"{src.path}:#{k}"
            if codec_id >= len(IMAGE_CODECS):
                raise ImageSourceError(f"{where}: unknown codec id {codec_id} in the index")
            return ImageLocation(
                where,
                src.path,
                int(rec["offset"]),
                int(rec["size"]),
                False,
                IMAGE_CODECS[codec_id],
                int(rec["width"]),
                int(rec["height"]),
                int(rec["color"]),
                self.objects.remote(src.path) if src.remote else None,
            )
        if src.gulp is not None:
            video, _ = self._gulp_frame(src.gulp, k)
            return ImageLocation(
                self._gulp_where(src.gulp, k),
                src.gulp.data_path(video),
                int(src.gulp.offset[k]),
                int(src.gulp.size[k]),
                False,
                "jpeg",
                0,
                0,
                0,
                self.objects.remote(src.gulp.data_path(video)) if src.remote else None,
            )
        where = f"{src.path}:{src.names[k]}"
        if src.kind == "folder" and src.remote:
            url = src.path + src.names[k]
            obj = self.objects.remote(url)
            return ImageLocation(where, url, 0, obj.size, False, "", 0, 0, 0, obj)
        if src.kind == "folder":
            path = os.path.join(src.path, src.names[k])
            return ImageLocation(where, path, 0, -1, False, "", 0, 0, 0)
        assert src.offsets is not None and src.sizes is not None and src.compressed is not None
        return ImageLocation(
            where,
            src.path,
            int(src.offsets[k]),
            int(src.sizes[k]),
            bool(src.compressed[k]),
            "",
            0,
            0,
            0,
            self.objects.remote(src.path) if src.remote else None,
        )

    @staticmethod
    def read(loc: ImageLocation, files: FileCache) -> bytes:
        """The bytes of one image (inflated when the member is deflated)."""
        if loc.size < 0:
            with open(loc.path, "rb") as f:
                return f.read()
        if loc.remote is not None:
            try:
                data = loc.remote.read(loc.offset, loc.size)
            except ObjectStoreError as e:
                raise ImageSourceError(str(e)) from None
        else:
            with files.open(loc.path) as fd:
                data = os.pread(fd, loc.size, loc.offset)
        if len(data) != loc.size:
            raise ImageSourceError(f"{loc.where}: truncated ({len(data)} of {loc.size} bytes)")
        if loc.compressed:
            try:
                return zlib.decompress(data, -15)
            except zlib.error as e:
                raise ImageSourceError(f"{loc.where}: cannot inflate member ({e})") from None
        return data

"""The videos of a set of sources, and each video's frame table, resolved on first use.

Sources are zip or tar shards (with or without a KCIDX1 index member), folder trees of mp4
files, GulpIO directories (every frame a JPEG: codec "jpeg", every frame a keyframe), and
folders with a dataset view (``dataset.json``, written by ``kohakuclip merge``): their shards
in the view's order, each video's header entry from the merged manifest, no shard opened.
Zip shards, mp4 files and GulpIO directories may also be in object storage (``s3://``,
``gs://``, ``az://``, ``http(s)://``; ``storage.remote``), and a URL ending in ``/`` lists the
shards or mp4 files under it (``http(s)://``: found from the writers' files, see
``storage.prefix``). Opening a source reads at most its zip tail and index header (a few ranged
reads, never a listing of members); a video's frame table comes from its index rows (one read),
or from parsing the mp4's moov box, the first time the video is read (cached).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kohakuclip.codecs.av1 import Av1Deps, Av1ParseError, analyze, sample_rows
from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import (
    AV1_DEPS_KEY,
    AV1_DEPS_MAGIC,
    AV1_FRAME_RECORD,
    DATASET_FILE,
    FLAG_KEYFRAME,
    FRAME_RECORD,
    INDEX_MEMBER,
    SHARD_SUFFIXES,
    VIDEO_INDEX_MAGIC,
    IndexFormatError,
    VideoEntry,
    read_index_header,
)
from kohakuclip.gulp.index import GulpIndex, open_gulp_source, open_remote_gulp
from kohakuclip.gulp.meta import is_gulp_directory
from kohakuclip.storage.cache import BlockCache
from kohakuclip.storage.files import FileCache
from kohakuclip.storage.index import video_entries
from kohakuclip.storage.manifest import VideoManifests
from kohakuclip.storage.prefix import list_prefix
from kohakuclip.storage.ranged import Objects, RangedFile
from kohakuclip.storage.remote import (
    ObjectStoreError,
    RemoteObject,
    is_url,
    local_path,
    suffix_of,
)
from kohakuclip.storage.tar import find_tar_last_member, list_tar
from kohakuclip.storage.view import ViewError, has_view, load_view, parse_view
from kohakuclip.storage.zip import ArchiveError, Member, find_zip_member, list_zip

VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov")


class SourceError(KohakuClipError, ValueError):
    """A source that cannot be opened, or a video in it that cannot be read."""


@dataclass(frozen=True)
class VideoRef:
    """Where one video lives."""

    source: int  # index into Catalog.sources
    member: str  # member name in the archive, or path relative to the folder
    entry: VideoEntry | None = None  # header entry when the source has an index


@dataclass
class VideoTrack:
    """Everything the planner and decoder need about one video, in decode order."""

    codec: str
    width: int
    height: int
    fps: float
    colorspace: str  # "bt601" | "bt709"
    full_range: bool
    prefix: bytes  # AV1 sequence header OBU, or Annex-B parameter sets
    nal_length_size: int  # 0: samples are AV1 OBUs; else the AVCC/HVCC length field size
    path: str  # the file to pread from
    offsets: np.ndarray  # absolute offsets in ``path``
    sizes: np.ndarray
    keep: np.ndarray  # bytes later frames need (== sizes where unknown)
    keyframe: np.ndarray  # bool
    # decode index -> display index, -1 for samples decoded but never shown (trimmed by an edit
    # list); None: identity
    display: np.ndarray | None = None
    decode_of_display: np.ndarray | None = None  # display index -> decode index
    key_positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    av1_frames: np.ndarray | None = None  # AV1_FRAME_RECORDs: per-frame dependencies
    # per sample (and one past the last), the row of its first AV1_FRAME_RECORD
    av1_rows: np.ndarray | None = None
    n: int = 0  # frames shown
    # the mp4 sample entry's decoder configuration (av1C / avcC / hvcC / vpcC payload, mpeg4's
    # VOL headers): the extradata of codecs the PyAV fallback decodes without a prefix
    config: bytes = b""

    def __post_init__(self) -> None:
        self.key_positions = np.flatnonzero(self.keyframe)
        self.n = len(self.sizes)
        if self.av1_frames is not None:
            self.av1_rows = sample_rows(self.av1_frames, self.n)
        if self.display is not None and not np.array_equal(self.display, np.arange(self.n)):
            shown = np.flatnonzero(self.display >= 0)
            self.n = len(shown)
            self.decode_of_display = shown[np.argsort(self.display[shown], kind="stable")]
        else:
            self.display = None


@dataclass
class _Source:
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


_VIEW_COLUMNS = ["shard", "index", "member", "frames", "fps", "width", "height", "codec"]
_VIEW_COLUMNS += ["colorspace", "prefix"]


class Catalog:
    """The videos of many sources, with an LRU of resolved frame tables."""

    def __init__(
        self,
        sources: list[str],
        use_index: bool = True,
        cache_size: int = 4096,
        open_files: int = 4096,
        gulp_fps: float | None = None,
        analyze_av1: bool = True,
        storage_options: dict[str, Any] | None = None,
        cache: BlockCache | None = None,
    ) -> None:
        self._analyze = analyze_av1
        self._gulp_fps = gulp_fps
        self._manifests = VideoManifests(lambda url: self.objects.fetch_whole(url))
        self._open_files = open_files
        self._pid = os.getpid()
        self.files = FileCache(open_files)
        self.objects = Objects(self.files, storage_options, cache)
        self.sources: list[_Source] = []
        self.videos: list[VideoRef] = []
        self._lock = threading.Lock()
        self._tracks: OrderedDict[int, VideoTrack] = OrderedDict()
        self._cache_size = max(1, cache_size)
        self._use_index = use_index
        for path in sources:
            self._add_source(os.fspath(path))

    # -- opening -----------------------------------------------------------------------------
    def _add_source(self, path: str) -> None:
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
            self.sources.append(_Source(path, "gulp", gulp=gulp))
            self.videos.extend(VideoRef(sid, str(id_)) for id_ in gulp.ids)
            return
        if os.path.isdir(path):
            from kohakuclip.storage.folder import list_folder

            names = list_folder(path, VIDEO_SUFFIXES)
            shards = [] if names else list_folder(path, SHARD_SUFFIXES)
            if shards:  # a folder of shards, e.g. kohakuclip-write's output
                for name in shards:
                    self._add_source(os.path.join(path, name))
                return
            sid = len(self.sources)
            self.sources.append(_Source(path, "folder"))
            self.videos.extend(VideoRef(sid, name) for name in names)
            return
        if not os.path.exists(path):
            raise SourceError(f"{path}: no such file or directory")
        if path.lower().endswith(VIDEO_SUFFIXES):  # one video file: a folder of one
            sid = len(self.sources)
            self.sources.append(_Source(os.path.dirname(path) or ".", "folder"))
            self.videos.append(VideoRef(sid, os.path.basename(path)))
            return
        self._add_archive(path)

    def _add_remote(self, url: str) -> None:
        """An object, or every shard and mp4 file under a prefix (a URL ending in ``/``)."""
        if not url.endswith("/"):
            self.objects.remote(url)
            if suffix_of(url) in VIDEO_SUFFIXES:  # one mp4: a folder source of one video
                folder, name = url.rsplit("/", 1)
                self.sources.append(_Source(folder + "/", "folder", remote=True))
                self.videos.append(VideoRef(len(self.sources) - 1, name))
            else:
                self._add_archive(url, remote=True)
            return
        listed = list_prefix(url, self.objects.options)
        if any(found == url + DATASET_FILE for found, _ in listed):  # a merged dataset view
            self._add_view(url, dict(listed))
            return
        if self._add_remote_gulp(url, listed):
            return
        names = []
        for found, meta in listed:
            suffix = suffix_of(found)
            if suffix in (".zip", ".tar"):
                self.objects.remote(found, meta)
                self._add_archive(found, remote=True)
            elif suffix in VIDEO_SUFFIXES:
                self.objects.remote(found, meta)
                names.append(found[len(url) :])
            elif suffix in (".gulp", ".gmeta"):
                raise SourceError(
                    f"{found}: only zip and tar shards, mp4 files and gulp directories (a prefix "
                    "holding data_<i>.gulp and meta_<i>.gmeta) are read from URLs"
                )
        if names:
            sid = len(self.sources)
            self.sources.append(_Source(url, "folder", remote=True))
            self.videos.extend(VideoRef(sid, name) for name in names)
        elif not any(suffix_of(found) in (".zip", ".tar") for found, _ in listed):
            raise SourceError(f"{url}: no zip or tar shards or mp4 files under this prefix")

    def _add_remote_gulp(self, url: str, listed: list[tuple[str, dict[str, Any]]]) -> bool:
        """A gulp directory directly under the prefix ``url``; False when there is none."""
        sizes = {found: int(meta["size"]) for found, meta in listed}
        for found, meta in listed:
            self.objects.remote(found, meta)

        def fetch(found: str) -> bytes:
            return self.objects.read(found, 0, sizes[found])

        def read_at(path: str, offset: int, length: int) -> bytes:
            return self.objects.read(path, offset, length)

        try:
            gulp = open_remote_gulp(url, sizes, fetch, read_at)
        except ValueError as e:
            raise SourceError(str(e)) from None
        if gulp is None:
            return False
        sid = len(self.sources)
        self.sources.append(_Source(url, "gulp", gulp=gulp, remote=True))
        self.videos.extend(VideoRef(sid, str(id_)) for id_ in gulp.ids)
        return True

    def _add_archive(self, path: str, remote: bool = False) -> None:
        kind = "tar" if path.endswith(".tar") else "zip"
        src = _Source(path, kind, remote=remote)
        sid = len(self.sources)
        try:
            if remote and kind == "tar":  # the index from the tail, no walk of the headers
                with self.objects.open(path) as f:
                    last = find_tar_last_member(f) if self._use_index else None
                src.index_member = last if last is not None and last.name == INDEX_MEMBER else None
            elif kind == "zip":
                with self.objects.open(path) as f:
                    src.index_member = find_zip_member(f, INDEX_MEMBER) if self._use_index else None
            else:
                src.members = {m.name: m for m in list_tar(path)}
                src.index_member = src.members.get(INDEX_MEMBER) if self._use_index else None
        except (ArchiveError, ObjectStoreError) as e:
            raise SourceError(str(e)) from None
        self.sources.append(src)
        if src.index_member is not None:
            header = self._read_index_header(src)
            self.videos.extend(VideoRef(sid, v.member, v) for v in header)
        else:
            members = self._members(src)
            self.videos.extend(
                VideoRef(sid, name)
                for name in sorted(members)
                if name.lower().endswith(VIDEO_SUFFIXES)
            )

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
                table = pq.read_table(pa.BufferReader(obj.read(0, obj.size)), columns=_VIEW_COLUMNS)
            else:
                table = pq.read_table(manifest, columns=_VIEW_COLUMNS)
        except (OSError, KeyError, ValueError) as e:
            raise SourceError(f"{manifest}: cannot read the merged manifest ({e})") from None
        table = table.sort_by([("shard", "ascending"), ("index", "ascending")])
        columns = {name: table.column(name).to_pylist() for name in _VIEW_COLUMNS}
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
                _Source(
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
                )
                row += entry.n
                self.videos.append(VideoRef(sid, entry.member, entry))
        if start != len(table):
            raise SourceError(f"{manifest}: {len(table)} rows, the view lists {start} videos")

    def _read_index_header(self, src: _Source) -> list[VideoEntry]:
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

    def _members(self, src: _Source) -> dict[str, Member]:
        if src.members is None:
            try:
                if src.kind == "zip":
                    with self.objects.open(src.path) as f:
                        listed = list_zip(f)
                elif src.remote:
                    with self.objects.open(src.path) as f:
                        listed = list_tar(f)
                else:
                    listed = list_tar(src.path)
            except (ArchiveError, ObjectStoreError) as e:
                raise SourceError(str(e)) from None
            src.members = {m.name: m for m in listed}
        return src.members

    def _index_rows(self, src: _Source, entry: VideoEntry) -> np.ndarray:
        """One video's index records, read with one pread (or ranged GET)."""
        size = entry.n * FRAME_RECORD.itemsize
        start = src.records_start + entry.row * FRAME_RECORD.itemsize
        if src.expected_size >= 0:
            with self.objects.open(src.path) as f:
                actual = f.size
            if actual != src.expected_size:
                raise SourceError(
                    f"{src.path}: {actual} bytes, the dataset view says {src.expected_size} "
                    "(changed since `kohakuclip merge`: merge again)"
                )
            src.expected_size = -1
        raw = self.objects.read(src.path, start, size)
        if len(raw) != size:
            raise SourceError(f"{src.path}:{INDEX_MEMBER}: truncated frame table")
        return np.frombuffer(raw, dtype=FRAME_RECORD)

    def _av1_frames(self, src: _Source, member: str) -> np.ndarray | None:
        """A video's AV1_FRAME_RECORDs from the table after the index records, if any."""
        if src.deps_start < 0:
            return None
        where = f"{src.path}:{INDEX_MEMBER}:{AV1_DEPS_KEY}"
        if src.deps is None:
            size = None
            if src.index_member is not None:
                size = src.index_member.offset + src.index_member.size - src.deps_start
            try:
                with self.objects.open(src.path) as f:
                    head = read_index_header(
                        lambda at, n: f.read(src.deps_start + at, n), AV1_DEPS_MAGIC, size, where
                    )
                first = src.deps_start + head.records
                record = AV1_FRAME_RECORD.itemsize
                src.deps = {
                    str(v["member"]): (first + int(v["row"]) * record, int(v["n"]))
                    for v in head.header["videos"]
                }
            except (IndexFormatError, KeyError, TypeError, ValueError) as e:
                raise SourceError(f"{where}: {e}") from None
        located = src.deps.get(member)
        if located is None:
            return None
        start, count = located
        raw = self.objects.read(src.path, start, count * AV1_FRAME_RECORD.itemsize)
        if len(raw) != count * AV1_FRAME_RECORD.itemsize:
            raise SourceError(f"{where}: truncated table")
        return np.frombuffer(raw, dtype=AV1_FRAME_RECORD)

    def has_remote(self) -> bool:
        """True when some source is in object storage."""
        return any(src.remote for src in self.sources)

    def remote(self, path: str) -> RemoteObject | None:
        """The object a track's ``path`` names when it is a URL, else None (a local file)."""
        return self.objects.remote(path) if is_url(path) else None

    def ensure_process(self) -> None:
        """After a fork, forget the parent's locks and descriptors (never used across a fork)."""
        if self._pid != os.getpid():
            self._lock = threading.Lock()
            self._pid = os.getpid()
            self.files = FileCache(self._open_files)
            self.objects = self.objects.after_fork(self.files)

    def close(self) -> None:
        """Close every descriptor and drop the cached frame tables (a forked child's copy is
        left alone: its lock and descriptors are the parent's)."""
        if self._pid != os.getpid():
            return
        self.files.close()
        with self._lock:
            self._tracks.clear()

    # -- per video -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.videos)

    def where(self, vid: int) -> str:
        ref = self.videos[vid]
        return f"{self.sources[ref.source].path}:{ref.member}"

    def track(self, vid: int) -> VideoTrack:
        """The frame table of video ``vid`` (cached; thread-safe)."""
        with self._lock:
            track = self._tracks.get(vid)
            if track is not None:
                self._tracks.move_to_end(vid)
                return track
        track = self._resolve(vid)
        with self._lock:
            self._tracks[vid] = track
            while len(self._tracks) > self._cache_size:
                self._tracks.popitem(last=False)
        return track

    def _resolve(self, vid: int) -> VideoTrack:
        ref = self.videos[vid]
        src = self.sources[ref.source]
        if ref.entry is not None:
            return self._from_index(src, ref.entry, vid)
        if src.gulp is not None:
            return self._from_gulp(src.gulp, src.gulp.position(ref.member))
        return self._from_moov(vid)

    def _from_gulp(self, gulp: GulpIndex, video: int) -> VideoTrack:
        path, offsets, sizes = gulp.frames(video)
        height, width = gulp.frame_size(video)
        n = len(sizes)
        return VideoTrack(
            codec="jpeg",
            width=width,
            height=height,
            fps=self._gulp_fps or gulp.fps(video) or 0.0,
            colorspace="bt601",
            full_range=True,
            prefix=b"",
            nal_length_size=0,
            path=path,
            offsets=np.asarray(offsets, np.uint64),
            sizes=np.asarray(sizes, np.uint32),
            keep=np.asarray(sizes, np.uint32),
            keyframe=np.ones(n, bool),
        )

    def _member_location(self, vid: int) -> tuple[str, int, int]:
        ref = self.videos[vid]
        src = self.sources[ref.source]
        if src.kind == "folder" and src.remote:
            url = src.path + ref.member
            try:
                return url, 0, self.objects.remote(url).size
            except ObjectStoreError as e:
                raise SourceError(str(e)) from None
        if src.kind == "folder":
            path = os.path.join(src.path, ref.member)
            try:
                return path, 0, os.path.getsize(path)
            except OSError as e:
                raise SourceError(f"{path}: {e.strerror}") from None
        if src.kind == "zip" and src.remote and src.members is None:  # without a listing
            try:
                with self.objects.open(src.path) as f:
                    member = find_zip_member(f, ref.member, stored_only=False)
            except (ArchiveError, ObjectStoreError) as e:
                raise SourceError(str(e)) from None
        else:
            member = self._members(src).get(ref.member)
        if member is None:
            raise SourceError(f"{self.where(vid)}: member missing from the archive")
        if member.compressed:
            raise SourceError(f"{self.where(vid)}: member is compressed; store videos uncompressed")
        return src.path, member.offset, member.size

    def _from_moov(self, vid: int) -> VideoTrack:
        from kohakuclip.mp4.moov import parse_mp4

        path, base, size = self._member_location(vid)
        where = self.where(vid)
        try:
            with self.objects.open(path) as f:
                mp4 = parse_mp4(lambda off, n: f.read(base + off, n), size, base=base, where=where)
                deps = self._analyze_av1(f, mp4, where) if mp4.codec == "av1" else None
        except ObjectStoreError as e:
            raise SourceError(str(e)) from None
        except OSError as e:
            raise SourceError(f"{where}: {e.strerror}") from None
        except ValueError as e:
            raise SourceError(str(e)) from None
        sizes = np.asarray(mp4.sizes, dtype=np.uint32)
        return VideoTrack(
            codec=mp4.codec,
            width=mp4.width,
            height=mp4.height,
            fps=float(mp4.fps),
            colorspace=mp4.matrix or ("bt709" if min(mp4.width, mp4.height) >= 720 else "bt601"),
            full_range=bool(mp4.full_range),
            prefix=bytes(mp4.prefix),
            nal_length_size=int(mp4.nal_length_size),
            path=path,
            offsets=np.asarray(mp4.offsets, dtype=np.uint64),
            sizes=sizes,
            keep=sizes if deps is None else deps.keep,
            keyframe=np.asarray(mp4.keyframes, dtype=bool),
            display=np.asarray(mp4.display, dtype=np.int64),
            av1_frames=None if deps is None else deps.frames,
            config=bytes(mp4.config),
        )

    def _analyze_av1(self, f: RangedFile, mp4: Any, where: str) -> Av1Deps | None:
        """The AV1 dependency table of a video without an index, built on first use (one read
        of its samples): the moov fallback then skips as much as an indexed shard. None when
        disabled, or when a frame header does not parse (``keep`` stays the whole sample)."""
        if not self._analyze or mp4.n == 0:
            return None
        offsets = mp4.offsets.astype(np.int64)
        start = int(offsets.min())
        data = f.read(start, int((offsets + mp4.sizes).max()) - start)
        view = memoryview(data)
        samples = [
            view[o - start : o - start + z] for o, z in zip(offsets.tolist(), mp4.sizes.tolist())
        ]
        try:
            return analyze(samples, mp4.prefix, where)
        except Av1ParseError:
            return None

    def _from_index(self, src: _Source, entry: VideoEntry, vid: int) -> VideoTrack:
        rows = self._index_rows(src, entry)
        display = None
        nal_length_size = 0
        prefix = bytes.fromhex(entry.prefix)
        if entry.codec != "av1":
            # The index has no composition times: B-frames need the moov's display order.
            moov = self._from_moov(vid)
            display, nal_length_size = moov.display, moov.nal_length_size
            if display is None:
                display = np.arange(entry.n)
        return VideoTrack(
            codec=entry.codec,
            width=entry.w,
            height=entry.h,
            fps=entry.fps,
            colorspace=entry.colorspace,
            full_range=False,
            prefix=prefix,
            nal_length_size=nal_length_size,
            path=src.path,
            offsets=rows["offset"],
            sizes=rows["size"],
            keep=rows["keep"],
            keyframe=(rows["flags"] & FLAG_KEYFRAME) != 0,
            display=display,
            av1_frames=self._av1_frames(src, entry.member) if entry.codec == "av1" else None,
        )

    def max_short_side(self, default: int) -> int:
        """The largest short side the index headers announce; ``default`` if any is unknown."""
        sides = [min(r.entry.w, r.entry.h) for r in self.videos if r.entry is not None]
        if len(sides) < len(self.videos) or not sides:
            return default
        return max(sides) + max(sides) % 2

    def track_codec(self, vid: int) -> str:
        """The codec of a video if known without parsing anything, else ""."""
        entry = self.videos[vid].entry
        if entry is not None:
            return entry.codec
        with self._lock:
            track = self._tracks.get(vid)
        return track.codec if track is not None else ""

    def meta(self, vid: int) -> dict[str, Any]:
        """Metadata recorded at write time: the manifest beside a shard, a gulp's meta_data."""
        ref = self.videos[vid]
        src = self.sources[ref.source]
        if src.gulp is not None:
            return dict(src.gulp.meta(src.gulp.position(ref.member)))
        if src.kind in ("zip", "tar"):
            return self._manifests.lookup(src.path, ref.member)
        return {}

    def info(self, vid: int) -> dict[str, Any]:
        """Per-video facts: from the index header without touching the frame table when possible."""
        ref = self.videos[vid]
        src = self.sources[ref.source]
        e = ref.entry
        facts: tuple[int, float, int, int, str, str]
        if e is not None:
            facts = (e.n, e.fps, e.h, e.w, e.codec, e.colorspace)
        else:
            t = self.track(vid)
            facts = (t.n, t.fps, t.height, t.width, t.codec, t.colorspace)
        n, fps, height, width, codec, colorspace = facts
        return dict(
            n=n,
            fps=fps,
            height=height,
            width=width,
            codec=codec,
            colorspace=colorspace,
            source=src.path,
            member=ref.member,
        )


def index_layout(path: str) -> tuple[Member, int, int, list[VideoEntry]]:
    """Where an indexed video shard's index lies: the index member, the absolute offsets of its
    first frame record and of its KCAV1D table (-1: none), and its header entries."""
    catalog = Catalog([path], analyze_av1=False)
    try:
        src = catalog.sources[0]
        if src.index_member is None:
            raise SourceError(f"{path}: no {INDEX_MEMBER} member (not a kohakuclip shard)")
        entries = [ref.entry for ref in catalog.videos if ref.entry is not None]
        return src.index_member, src.records_start, src.deps_start, entries
    finally:
        catalog.close()

"""The videos of a set of sources by id, each one's ``VideoTrack`` resolved on first use.

``storage.video_listing`` expands the sources into videos when the catalog is made;
``storage.video_resolve`` reads a video's frame table (index rows or moov) the first time it
is asked for, kept in an LRU. The per-video facts and metadata come from the index header or
the manifest when they can, without resolving the track.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

from kohakuclip.storage.cache import BlockCache
from kohakuclip.storage.files import FileCache
from kohakuclip.storage.manifest import VideoManifests
from kohakuclip.storage.ranged import Objects
from kohakuclip.storage.remote import RemoteObject, is_url
from kohakuclip.storage.video_listing import list_video_sources
from kohakuclip.storage.video_resolve import DerivedTables, resolve_video
from kohakuclip.tracks import VideoTrack

__all__ = ["DERIVED_BYTES", "Catalog"]

DERIVED_BYTES = 64 << 20
"""Bytes of ``DerivedTables`` a catalog keeps for the videos whose tracks it dropped (the
``keep`` column and AV1 dependency records built from a whole read of a video, 4-30 bytes a
frame): a video resolved again is not read whole again while they are kept."""


class Catalog:
    """The videos of many sources, with an LRU of resolved frame tables.

    Args:
        sources: shards, folders, mp4 files, gulp directories, dataset views, or their URLs.
        use_index: read shards' KCIDX1 index; False parses each video's moov instead.
        cache_size: resolved frame tables kept.
        open_files: file descriptors kept open.
        gulp_fps: the frame rate of gulp videos (default: their meta's).
        skip_tables: build the AV1 dependency tables and H.264 / HEVC keep columns that
            nothing stored holds (``resolve_video``).
        storage_options: options of the object stores (``storage.remote``).
        cache: a block cache for remote reads, shared with other catalogs.
    """

    def __init__(
        self,
        sources: list[str],
        use_index: bool = True,
        cache_size: int = 4096,
        open_files: int = 4096,
        gulp_fps: float | None = None,
        skip_tables: bool = True,
        storage_options: dict[str, Any] | None = None,
        cache: BlockCache | None = None,
    ) -> None:
        self._skip_tables = skip_tables
        self._gulp_fps = gulp_fps
        self._manifests = VideoManifests(lambda url: self.objects.fetch_whole(url))
        self._open_files = open_files
        self._pid = os.getpid()
        self.files = FileCache(open_files)
        self.objects = Objects(self.files, storage_options, cache)
        self._lock = threading.Lock()
        self._tracks: OrderedDict[int, VideoTrack] = OrderedDict()
        self._cache_size = max(1, cache_size)
        self._derived: OrderedDict[int, DerivedTables] = OrderedDict()
        self._derived_bytes = 0
        self.sources, self.videos = list_video_sources(sources, self.objects, use_index)

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
            self._derived.clear()
            self._derived_bytes = 0

    # -- per video -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.videos)

    def where(self, vid: int) -> str:
        """Where video ``vid`` is, for messages: ``archive:member``, a folder's file by its path,
        or for a GulpIO video its chunk's data file and its id."""
        ref = self.videos[vid]
        src = self.sources[ref.source]
        if src.gulp is not None:
            data_path = src.gulp.data_path(src.gulp.position(ref.member))
            return f"{data_path}: id {ref.member!r}"
        if src.kind == "folder":
            return src.path.rstrip("/") + "/" + ref.member
        return f"{src.path}:{ref.member}"

    def track(self, vid: int) -> VideoTrack:
        """The frame table of video ``vid`` (cached; thread-safe)."""
        with self._lock:
            track = self._tracks.get(vid)
            if track is not None:
                self._tracks.move_to_end(vid)
                return track
        ref = self.videos[vid]
        src = self.sources[ref.source]
        with self._lock:
            derived = self._derived.pop(vid, None)
            self._derived_bytes -= 0 if derived is None else derived.nbytes
        track = resolve_video(
            self.objects, src, ref, self.where(vid), self._gulp_fps, self._skip_tables, derived
        )
        with self._lock:
            self._tracks[vid] = track
            while len(self._tracks) > self._cache_size:
                self._keep_derived(*self._tracks.popitem(last=False))
        return track

    def _keep_derived(self, vid: int, track: VideoTrack) -> None:
        """Keep what resolving the dropped ``track`` computed (``DerivedTables``) within
        ``DERIVED_BYTES``, the oldest dropped first (under the lock)."""
        derived = DerivedTables.of(track)
        self._derived[vid] = derived
        self._derived_bytes += derived.nbytes
        while self._derived_bytes > DERIVED_BYTES and self._derived:
            self._derived_bytes -= self._derived.popitem(last=False)[1].nbytes

    def max_short_side(self, default: int) -> int:
        """The largest short side the index headers announce; ``default`` if any is unknown."""
        sides = self.videos.short_sides()
        if sides is None:
            return default
        longest = int(sides.max())
        return longest + longest % 2

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

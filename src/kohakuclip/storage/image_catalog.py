"""The images of a set of sources by id ``0 .. len-1``, in source order.

``storage.image_listing`` expands the sources when the catalog is made; ``storage.image_resolve``
locates an image's bytes when it is read; the writer's manifest beside a shard gives its key,
caption and meta, read when first asked for.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_right
from typing import Any

import numpy as np

from kohakuclip.storage.cache import BlockCache
from kohakuclip.storage.files import FileCache
from kohakuclip.storage.image_index import member_names
from kohakuclip.storage.image_listing import ImageSource, list_image_sources
from kohakuclip.storage.image_manifest import ImageManifest
from kohakuclip.storage.image_resolve import (
    ImageLocation,
    gulp_frame,
    gulp_where,
    index_records,
    read_image,
    resolve_image,
)
from kohakuclip.storage.ranged import Objects

__all__ = ["ImageCatalog"]


class ImageCatalog:
    """Image ids ``0 .. len-1`` over the sources, in source order.

    Args:
        sources: shards, folders, gulp directories, dataset views, or their URLs.
        use_index: read shards' KCIMG1 index; False lists their members instead.
        storage_options: options of the object stores (``storage.remote``).
        cache: a block cache for remote reads, shared with other catalogs.
    """

    def __init__(
        self,
        sources: list[str],
        use_index: bool = True,
        storage_options: dict[str, Any] | None = None,
        cache: BlockCache | None = None,
    ) -> None:
        self.objects = Objects(FileCache(64), storage_options, cache)
        self._pid = os.getpid()
        self.sources = list_image_sources(sources, self.objects, use_index)
        counts = np.array([s.count for s in self.sources], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self._start_list: list[int] = self._starts.tolist()
        self._lock = threading.Lock()
        self._manifest: ImageManifest | None = None

    def __len__(self) -> int:
        return int(self._starts[-1])

    def ensure_process(self) -> None:
        """After a fork, forget the memory maps, locks and manifests inherited from the parent."""
        if self._pid == os.getpid():
            return
        self._lock = threading.Lock()
        self._manifest = None
        for src in self.sources:
            if src.records_pid not in (os.getpid(), -2):
                src.records = None
        self.objects = self.objects.after_fork(FileCache(64))
        self._pid = os.getpid()

    def _find(self, image_id: int) -> tuple[ImageSource, int]:
        s = bisect_right(self._start_list, image_id) - 1  # np.searchsorted releases the GIL
        return self.sources[s], image_id - self._start_list[s]

    def source(self, image_id: int) -> str:
        """The path of the source holding one image."""
        return self._find(image_id)[0].path

    def position(self, image_id: int) -> int:
        """The position of one image within its source."""
        return self._find(image_id)[1]

    def frame(self, image_id: int) -> int | None:
        """The frame index of a gulp image within its video (None for other sources)."""
        src, k = self._find(image_id)
        if src.gulp is None:
            return None
        return gulp_frame(src.gulp, k)[1]

    def metadata(self, image_id: int) -> dict[str, Any]:
        """Key, caption and meta of one image: a gulp frame's id and its video's meta_data, or
        the row of the writer's manifest beside a shard (all None when there is none)."""
        src, k = self._find(image_id)
        if src.gulp is not None:
            video, _ = gulp_frame(src.gulp, k)
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
            return src.gulp.ids[gulp_frame(src.gulp, k)[0]]
        if src.kind == "indexed" and not src.names:
            with self._lock:
                if not src.names:
                    with self.objects.open(src.path) as f:
                        src.names = member_names(f, index_records(self.objects, src))
        return src.names[k]

    def where(self, image_id: int) -> str:
        """How messages name one image: ``archive:member``, a folder's file by its path (gulp:
        data file, id and frame)."""
        src, k = self._find(image_id)
        if src.gulp is not None:
            return gulp_where(src.gulp, k)
        if src.kind == "folder":
            return src.path.rstrip("/") + "/" + self.member(image_id)
        return f"{src.path}:{self.member(image_id)}"

    def locate(self, image_id: int) -> ImageLocation:
        """Where the bytes of one image are and what the index says about them."""
        src, k = self._find(image_id)
        return resolve_image(self.objects, src, k)

    @staticmethod
    def read(loc: ImageLocation, files: FileCache) -> bytes:
        """The bytes of one image (inflated when the member is deflated)."""
        return read_image(loc, files)

"""Resolving a listed image into its ``ImageLocation`` (where its bytes are, and what the index
says about them), and reading those bytes.

An indexed shard's KCIMG1 table is memory-mapped once per process and read record by record, so
a catalog over tens of millions of images holds no per-image Python objects (a remote shard's
table is read once whole). A gulp image is located through its directory's flat ``GulpIndex``.
Plain sources' sizes and codecs are left for the bytes to tell.
"""

from __future__ import annotations

import os
import zlib
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from kohakuclip.formats import IMAGE_CODECS, MAX_INFLATED_MEMBER
from kohakuclip.gulp.index import GulpIndex
from kohakuclip.storage.files import FileCache, open_regular
from kohakuclip.storage.image_index import load_image_index, map_image_index
from kohakuclip.storage.image_listing import ImageSource, ImageSourceError
from kohakuclip.storage.index import IndexFormatError
from kohakuclip.storage.ranged import Objects
from kohakuclip.storage.remote import ObjectStoreError, RemoteObject
from kohakuclip.storage.zip import ArchiveError

__all__ = [
    "ImageLocation",
    "gulp_frame",
    "gulp_where",
    "index_records",
    "read_image",
    "resolve_image",
]


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


def resolve_image(objects: Objects, src: ImageSource, k: int) -> ImageLocation:
    """Where the bytes of the ``k``-th image of the source ``src`` are.

    Args:
        objects: where the source's files and objects are read.
        src: the listed source holding the image.
        k: the image's position in the source.
    """
    if src.kind == "indexed":
        rec = index_records(objects, src)[k]
        codec_id = int(rec["codec"])
        where = f"{src.path}:#{k}"
        if codec_id >= len(IMAGE_CODECS):
            raise ImageSourceError(f"{where}: unknown codec id {codec_id} in the index")
        offset, size = int(rec["offset"]), int(rec["size"])
        assert src.index_member is not None
        if offset + size > src.index_member.offset:  # images are stored before the index
            raise ImageSourceError(
                f"{where}: damaged index: offset {offset}, size {size} runs past the images"
            )
        return ImageLocation(
            where,
            src.path,
            offset,
            size,
            False,
            IMAGE_CODECS[codec_id],
            int(rec["width"]),
            int(rec["height"]),
            int(rec["color"]),
            objects.remote(src.path) if src.remote else None,
        )
    if src.gulp is not None:
        video, _ = gulp_frame(src.gulp, k)
        return ImageLocation(
            gulp_where(src.gulp, k),
            src.gulp.data_path(video),
            int(src.gulp.offset[k]),
            int(src.gulp.size[k]),
            False,
            "jpeg",
            0,
            0,
            0,
            objects.remote(src.gulp.data_path(video)) if src.remote else None,
        )
    if src.kind == "folder":
        where = src.path.rstrip("/") + "/" + src.names[k]
    else:
        where = f"{src.path}:{src.names[k]}"
    if src.kind == "folder" and src.remote:
        url = src.path + src.names[k]
        obj = objects.remote(url)
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
        objects.remote(src.path) if src.remote else None,
    )


def index_records(objects: Objects, src: ImageSource) -> np.ndarray:
    """The KCIMG1 records of an indexed source: mapped once per process, or (remote) read once."""
    if src.records is not None and src.records_pid == -2:  # read whole (remote)
        return src.records
    if src.remote:  # a shard of a remote dataset view: its table read on first use
        assert src.index_member is not None
        try:
            table = load_image_index(objects.remote(src.path), src.index_member)
        except (ArchiveError, IndexFormatError, ObjectStoreError) as e:
            raise ImageSourceError(str(e)) from None
        src.records, src.records_pid = table, -2
        return table
    if src.records is None or src.records_pid != os.getpid():
        mapped = map_image_index(src.path, src.index_member)
        assert mapped is not None
        src.records, src.records_pid = mapped, os.getpid()
    return src.records


def gulp_frame(gulp: GulpIndex, k: int) -> tuple[int, int]:
    """(video, frame in that video) of the ``k``-th stored frame of a gulp directory."""
    video = bisect_right(gulp.first, k) - 1  # gulp.first: a sorted sequence
    return video, k - int(gulp.first[video])


def gulp_where(gulp: GulpIndex, k: int) -> str:
    """How messages name the ``k``-th stored frame of a gulp directory: data file, id, frame."""
    video, frame = gulp_frame(gulp, k)
    return f"{gulp.data_path(video)}: id {gulp.ids[video]!r} frame {frame}"


def read_image(loc: ImageLocation, files: FileCache) -> bytes:
    """The bytes of one image (inflated when the member is deflated)."""
    if loc.size < 0:  # a file of a folder: not a FIFO (whose open would wait for a writer)
        with open(open_regular(loc.path), "rb") as f:
            return f.read()
    if loc.remote is not None:
        try:
            data = loc.remote.read(loc.offset, loc.size)
        except ObjectStoreError as e:
            raise ImageSourceError(str(e)) from e  # the cause tells storage from data
    else:
        with files.open(loc.path) as fd:
            data = os.pread(fd, loc.size, loc.offset)
    if len(data) != loc.size:
        raise ImageSourceError(f"{loc.where}: truncated ({len(data)} of {loc.size} bytes)")
    if loc.compressed:
        inflater = zlib.decompressobj(-15)
        try:
            inflated = inflater.decompress(data, MAX_INFLATED_MEMBER + 1)
        except zlib.error as e:
            raise ImageSourceError(f"{loc.where}: cannot inflate member ({e})") from None
        if len(inflated) > MAX_INFLATED_MEMBER:
            raise ImageSourceError(
                f"{loc.where}: inflates to over {MAX_INFLATED_MEMBER} bytes (a zip bomb?)"
            )
        if not inflater.eof:
            raise ImageSourceError(f"{loc.where}: cannot inflate member (its data ends early)")
        return inflated
    return data

"""Resolving a listed video into its ``VideoTrack``: from its index rows (one read), from a gulp
directory's frame table, or from parsing the mp4's moov box (and, for AV1 without a stored
dependency table, its frame headers)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from kohakuclip.codecs.av1 import Av1Deps, Av1ParseError, analyze
from kohakuclip.codecs.h26x import keep_sizes
from kohakuclip.formats import (
    AV1_DEPS_KEY,
    AV1_DEPS_MAGIC,
    AV1_FRAME_RECORD,
    FLAG_KEYFRAME,
    FRAME_RECORD,
    INDEX_MEMBER,
    IndexFormatError,
    VideoEntry,
    read_index_header,
)
from kohakuclip.gulp.index import GulpIndex
from kohakuclip.mp4.moov import parse_mp4
from kohakuclip.storage.ranged import Objects, RangedFile
from kohakuclip.storage.remote import ObjectStoreError
from kohakuclip.storage.video_listing import SourceError, VideoSource, archive_members
from kohakuclip.storage.video_refs import VideoRef
from kohakuclip.storage.zip import ArchiveError, find_zip_member
from kohakuclip.tracks import VideoTrack

__all__ = ["TABLE_READ_LIMIT", "DerivedTables", "resolve_video"]

TABLE_READ_LIMIT = 256 << 20
"""The largest video (bytes of samples) whose skip tables are built from its samples."""


@dataclass(frozen=True)
class DerivedTables:
    """What resolving a video computed from its samples rather than read from a table: the
    ``keep`` column, the AV1 dependency records and the colour (the first sample decoded).
    The catalog keeps them after it drops the track, so that a video resolved again is not
    read whole again."""

    keep: np.ndarray | None  # None: no skip table (every sample kept whole)
    av1_frames: np.ndarray | None
    colorspace: str
    full_range: bool

    @classmethod
    def of(cls, track: VideoTrack) -> DerivedTables:
        return cls(track.keep, track.av1_frames, track.colorspace, track.full_range)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.keep, self.av1_frames) if a is not None)


def resolve_video(
    objects: Objects,
    src: VideoSource,
    ref: VideoRef,
    where: str,
    gulp_fps: float | None = None,
    skip_tables: bool = True,
    derived: DerivedTables | None = None,
) -> VideoTrack:
    """The frame table of the video ``ref`` of the source ``src``.

    Args:
        objects: where the source's files and objects are read.
        src: the listed source holding the video.
        ref: the listed video.
        where: how messages name the video.
        gulp_fps: the frame rate of gulp videos (default: their meta's, else 0).
        skip_tables: build what skipping needs where nothing stored has it, on first use from
            one read of the video's samples: the dependency table of AV1 videos (no index, or
            an index without one), the ``keep`` column of H.264 / HEVC videos without an index
            (videos over ``TABLE_READ_LIMIT`` are read without skipping).
        derived: what an earlier resolve of the same video computed (``DerivedTables``):
            used instead of reading the samples again.
    """
    if ref.entry is not None:
        return _from_index(objects, src, ref, where, skip_tables, derived)
    if src.gulp is not None:
        return _from_gulp(src.gulp, src.gulp.position(ref.member), gulp_fps)
    return _from_moov(objects, src, ref, where, skip_tables, derived)


def member_location(
    objects: Objects, src: VideoSource, ref: VideoRef, where: str
) -> tuple[str, int, int]:
    """(file or URL, offset, size) of the mp4 bytes of the video ``ref`` (``where``: how
    messages name it); an archive's member must be stored uncompressed."""
    if src.kind == "folder" and src.remote:
        url = src.path + ref.member
        try:
            return url, 0, objects.remote(url).size
        except ObjectStoreError as e:
            raise SourceError(str(e)) from e  # the cause tells storage from data
    if src.kind == "folder":
        path = os.path.join(src.path, ref.member)
        try:
            return path, 0, os.path.getsize(path)
        except OSError as e:
            raise SourceError(f"{path}: {e.strerror}") from None
    if src.kind == "zip" and src.remote and src.members is None:  # without a listing
        try:
            with objects.open(src.path) as f:
                member = find_zip_member(f, ref.member, stored_only=False)
        except (ArchiveError, ObjectStoreError) as e:
            raise SourceError(str(e)) from e
    else:
        member = archive_members(objects, src).get(ref.member)
    if member is None:
        raise SourceError(f"{where}: member missing from the archive")
    if member.compressed:
        raise SourceError(f"{where}: member is compressed; store videos uncompressed")
    return src.path, member.offset, member.size


def _index_rows(objects: Objects, src: VideoSource, entry: VideoEntry, where: str) -> np.ndarray:
    """One video's index records, read with one pread (or ranged GET); ``SourceError`` naming
    ``where`` when a record points past the end of the file (a damaged index)."""
    size = entry.n * FRAME_RECORD.itemsize
    start = src.records_start + entry.row * FRAME_RECORD.itemsize
    with objects.open(src.path) as f:
        actual = f.size
    if src.expected_size >= 0:
        if actual != src.expected_size:
            raise SourceError(
                f"{src.path}: {actual} bytes, the dataset view says {src.expected_size} "
                "(changed since `kohakuclip merge`: merge again)"
            )
        src.expected_size = -1
    raw = objects.read(src.path, start, size)
    if len(raw) != size:
        raise SourceError(f"{src.path}:{INDEX_MEMBER}: truncated frame table")
    rows = np.frombuffer(raw, dtype=FRAME_RECORD)
    ends = rows["offset"] + rows["size"].astype(np.uint64)
    past = (rows["offset"] > actual) | (ends > actual)  # offset first: the sum may wrap
    bad = np.flatnonzero(past | (rows["keep"] > rows["size"]))
    if len(bad):
        k = int(bad[0])
        raise SourceError(
            f"{where}: damaged index: frame record {k} (offset {int(rows['offset'][k])}, size "
            f"{int(rows['size'][k])}, keep {int(rows['keep'][k])}) reaches past the file's "
            f"{actual} bytes or keeps more than its size"
        )
    return rows


def _av1_frames(objects: Objects, src: VideoSource, member: str) -> np.ndarray | None:
    """A video's AV1_FRAME_RECORDs from the table after the index records, if any."""
    if src.deps_start < 0:
        return None
    where = f"{src.path}:{INDEX_MEMBER}:{AV1_DEPS_KEY}"
    if src.deps is None:
        size = None
        if src.index_member is not None:
            size = src.index_member.offset + src.index_member.size - src.deps_start
        try:
            with objects.open(src.path) as f:
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
    raw = objects.read(src.path, start, count * AV1_FRAME_RECORD.itemsize)
    if len(raw) != count * AV1_FRAME_RECORD.itemsize:
        raise SourceError(f"{where}: truncated table")
    return np.frombuffer(raw, dtype=AV1_FRAME_RECORD)


def _from_gulp(gulp: GulpIndex, video: int, gulp_fps: float | None) -> VideoTrack:
    path, offsets, sizes = gulp.frames(video)
    height, width = gulp.frame_size(video)
    n = len(sizes)
    return VideoTrack(
        codec="jpeg",
        width=width,
        height=height,
        fps=gulp_fps or gulp.fps(video) or 0.0,
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


def _from_moov(
    objects: Objects,
    src: VideoSource,
    ref: VideoRef,
    where: str,
    skip_tables: bool,
    derived: DerivedTables | None = None,
) -> VideoTrack:
    path, base, size = member_location(objects, src, ref, where)
    try:
        with _opened(objects, path, where) as f:
            mp4 = parse_mp4(lambda off, n: f.read(base + off, n), size, base=base, where=where)
            if derived is None:
                derived = _derive(f, mp4, skip_tables, where)
    except ValueError as e:
        raise SourceError(str(e)) from None
    sizes = np.asarray(mp4.sizes, dtype=np.uint32)
    return VideoTrack(
        codec=mp4.codec,
        width=mp4.width,
        height=mp4.height,
        fps=float(mp4.fps),
        colorspace=derived.colorspace,
        full_range=derived.full_range,
        prefix=bytes(mp4.prefix),
        nal_length_size=int(mp4.nal_length_size),
        path=path,
        offsets=np.asarray(mp4.offsets, dtype=np.uint64),
        sizes=sizes,
        keep=sizes if derived.keep is None else derived.keep,
        keyframe=np.asarray(mp4.keyframes, dtype=bool),
        display=np.asarray(mp4.display, dtype=np.int64),
        av1_frames=derived.av1_frames,
        config=bytes(mp4.config),
    )


def _derive(f: RangedFile, mp4: Any, skip_tables: bool, where: str) -> DerivedTables:
    """What a video without an index needs computed from its samples, from one read of them:
    its skip tables (when ``skip_tables``) and its
    colour (``Mp4Track.colour``: the first sample only where the ``colr`` box is silent)."""
    samples = None
    if skip_tables and mp4.codec in ("av1", "h264", "hevc"):
        samples = _read_samples(f, mp4.offsets, mp4.sizes)
    av1_frames, keep = None, None
    if mp4.codec == "av1":
        deps = _analyze_av1(samples, mp4.prefix, where)
        av1_frames, keep = (None, None) if deps is None else (deps.frames, deps.keep)
    elif mp4.codec in ("h264", "hevc"):
        keep = _h26x_keep(samples, mp4, where)
    first = (int(mp4.offsets[0]), int(mp4.sizes[0]))  # a parsed track has samples
    matrix, full_range = mp4.colour(lambda: samples[0] if samples else f.read(*first))
    return DerivedTables(keep, av1_frames, matrix, full_range)


def _analyze_av1(samples: list[memoryview] | None, prefix: bytes, where: str) -> Av1Deps | None:
    """The AV1 dependency table of a video that has none stored (the moov fallback; a shard
    index without a KCAV1D table, as KohakuClip 1.0.0 writes), built on first use from its
    samples (``_read_samples``), so that it skips as much as one of our shards. None without
    samples, or when a frame header does not parse (``keep`` is then all there is)."""
    if not samples:
        return None
    try:
        return analyze(samples, prefix, where)
    except Av1ParseError:
        return None


def _h26x_keep(samples: list[memoryview] | None, mp4: Any, where: str) -> np.ndarray | None:
    """The ``keep`` column of an H.264 / HEVC video without an index, built on first use from
    its samples (``_read_samples``; as the writer's index stores it), so that clips skip
    unwanted non-reference pictures there too. None without samples, or when a sample does not
    parse (nothing skipped)."""
    if not samples:
        return None
    keyframes = np.asarray(mp4.keyframes, dtype=bool)
    try:
        return keep_sizes(samples, mp4.codec, mp4.nal_length_size, mp4.prefix, keyframes, where)
    except ValueError:
        return None


def _read_samples(f: RangedFile, offsets: np.ndarray, sizes: np.ndarray) -> list[memoryview] | None:
    """Every sample of a video, from one read of the range they span; None when there is none,
    or when the range is over ``TABLE_READ_LIMIT`` (such a video is read without skipping
    rather than held in memory whole)."""
    offsets, sizes = np.asarray(offsets, np.int64), np.asarray(sizes, np.int64)
    if len(sizes) == 0:
        return None
    start = int(offsets.min())
    span = int((offsets + sizes).max()) - start
    if span > TABLE_READ_LIMIT:
        return None
    view = memoryview(f.read(start, span))
    return [view[o - start : o - start + z] for o, z in zip(offsets.tolist(), sizes.tolist())]


def _from_index(
    objects: Objects,
    src: VideoSource,
    ref: VideoRef,
    where: str,
    skip_tables: bool,
    derived: DerivedTables | None = None,
) -> VideoTrack:
    entry = ref.entry
    assert entry is not None
    rows = _index_rows(objects, src, entry, where)
    display = None
    nal_length_size = 0
    prefix = bytes.fromhex(entry.prefix)
    if entry.codec != "av1":
        # The index has no composition times: B-frames need the moov's display order.
        moov = _from_moov(objects, src, ref, where, False)  # keep is in the index
        display, nal_length_size = moov.display, moov.nal_length_size
        if display is None:
            display = np.arange(entry.n)
    av1_frames = None
    if entry.codec == "av1":
        av1_frames = _av1_frames(objects, src, entry.member)
        if av1_frames is None and derived is not None:
            av1_frames = derived.av1_frames
        elif av1_frames is None and skip_tables:
            av1_frames = _analyze_indexed_av1(objects, src, rows, prefix, where)
    return VideoTrack(
        codec=entry.codec,
        width=entry.w,
        height=entry.h,
        fps=entry.fps,
        colorspace=entry.colorspace,
        full_range=entry.full_range,
        prefix=prefix,
        nal_length_size=nal_length_size,
        path=src.path,
        offsets=rows["offset"],
        sizes=rows["size"],
        keep=rows["keep"],
        keyframe=(rows["flags"] & FLAG_KEYFRAME) != 0,
        display=display,
        av1_frames=av1_frames,
    )


def _analyze_indexed_av1(
    objects: Objects, src: VideoSource, rows: np.ndarray, prefix: bytes, where: str
) -> np.ndarray | None:
    """``_analyze_av1`` of an indexed video whose shard has no dependency table."""
    with _opened(objects, src.path, where) as f:
        deps = _analyze_av1(_read_samples(f, rows["offset"], rows["size"]), prefix, where)
    return None if deps is None else deps.frames


@contextlib.contextmanager
def _opened(objects: Objects, path: str, where: str) -> Iterator[RangedFile]:
    """``objects.open(path)``, its storage errors (opening or reading) raised as
    ``SourceError`` naming ``where``."""
    try:
        with objects.open(path) as f:
            yield f
    except ObjectStoreError as e:
        raise SourceError(str(e)) from e
    except OSError as e:
        raise SourceError(f"{where}: {e.strerror}") from None

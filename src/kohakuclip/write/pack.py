"""Pack mp4 files into a shard: a stored zip or a tar with the KCIDX1 index member.

A shard is written under a temporary name and renamed only once complete, so a crash never leaves
a file that looks finished. Each mp4 is parsed as it is added (sample table, decoder prefix,
colour) and its ``keep`` bytes computed: for AV1 from the frame headers, whose per-frame
dependency table (KCAV1D) goes after the index's frame records; for H.264 / HEVC the whole sample
for pictures a later one may reference and 0 for the others.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from types import TracebackType
from typing import Literal, cast, get_args

import numpy as np

from kohakuclip.codecs.av1 import Av1Deps, Av1DepsIndex, analyze
from kohakuclip.codecs.h26x import keep_sizes
from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import (
    FLAG_KEYFRAME,
    FRAME_RECORD,
    INDEX_MEMBER,
    VideoCodec,
    VideoEntry,
)
from kohakuclip.mp4.moov import Mp4Track, parse_mp4_bytes
from kohakuclip.storage.index import VideoIndex
from kohakuclip.storage.tar import TarWriter
from kohakuclip.storage.zip import ZipWriter
from kohakuclip.write._atomic import PendingFile, naming

__all__ = ["Container", "PackError", "ShardWriter", "pack"]


Container = Literal["zip", "tar"]


class PackError(KohakuClipError, ValueError):
    """A member that cannot go into a shard (bad name, duplicate, not a supported mp4)."""


def container_of(path: str | os.PathLike[str]) -> Container:
    """``tar`` for a ``.tar`` path, otherwise a stored ``zip``."""
    return "tar" if os.fspath(path).lower().endswith(".tar") else "zip"


def _sample_views(data: bytes, track: Mp4Track) -> list[memoryview]:
    """Each sample of an mp4 parsed at base 0, as a view into its bytes."""
    view = memoryview(data)
    offsets, sizes = track.offsets.tolist(), track.sizes.tolist()
    return [view[s : s + z] for s, z in zip(offsets, sizes, strict=True)]


class ShardWriter:
    """Write one shard member by member; ``close`` adds the index and renames into place.

    Use as a context manager: leaving the block by an exception deletes the partial file.
    """

    def __init__(self, path: str | os.PathLike[str], container: Container | None = None) -> None:
        self.path = os.fspath(path)
        self.container = container or container_of(self.path)
        if self.container not in ("zip", "tar"):
            raise ValueError(f"container must be 'zip' or 'tar', got {self.container!r}")
        self._out = PendingFile(self.path)
        file = self._out.file
        self._writer = ZipWriter(file) if self.container == "zip" else TarWriter(file)
        self._videos: list[VideoEntry] = []
        self._records: list[np.ndarray] = []
        self._av1: list[tuple[str, Av1Deps]] = []
        self._rows = 0

    @property
    def videos(self) -> list[VideoEntry]:
        return list(self._videos)

    def __len__(self) -> int:
        return len(self._videos)

    def add(self, name: str, mp4: bytes) -> VideoEntry:
        """Store one faststart (or any) mp4 as member ``name``; returns its index entry."""
        where = f"{self.path}:{name}"
        if not name or name == INDEX_MEMBER or name.endswith("/"):
            raise PackError(f"{where}: not a valid member name")
        if any(v.member == name for v in self._videos):
            raise PackError(f"{where}: duplicate member name")
        try:
            track = parse_mp4_bytes(mp4, 0, where)
            if track.codec not in get_args(VideoCodec):
                indexed = ", ".join(get_args(VideoCodec))
                raise PackError(
                    f"{where}: a shard index holds {indexed}, not {track.codec!r} "
                    "(re-encode it with kohakuclip-write, or read it from a folder)"
                )
            samples = _sample_views(mp4, track)
            if track.codec == "av1":
                deps = analyze(samples, track.prefix, where)
                keep = deps.keep
            else:
                keep = keep_sizes(
                    samples,
                    track.codec,
                    track.nal_length_size,
                    track.prefix,
                    track.keyframes,
                    where,
                )
        except ValueError as e:
            raise PackError(str(e)) from None
        with naming(self.path):
            base = self._writer.add(name, mp4)
        if track.codec == "av1":
            self._av1.append((name, deps))
        records = np.zeros(len(samples), dtype=FRAME_RECORD)
        records["offset"] = track.offsets.astype(np.uint64) + np.uint64(base)
        records["size"] = track.sizes
        records["keep"] = keep
        records["flags"] = np.where(track.keyframes, FLAG_KEYFRAME, 0)
        colorspace, full_range = track.colour(lambda: samples[0])
        entry = VideoEntry(
            member=name,
            row=self._rows,
            n=len(samples),
            fps=float(track.fps),
            h=int(track.height),
            w=int(track.width),
            codec=cast(VideoCodec, track.codec),
            prefix=track.prefix.hex(),
            colorspace=colorspace,
            full_range=full_range,
        )
        self._videos.append(entry)
        self._records.append(records)
        self._rows += len(samples)
        return entry

    def index(self) -> VideoIndex:
        """The index of the members added so far (with the AV1 dependency table, if any)."""
        frames = np.concatenate(self._records) if self._records else np.zeros(0, FRAME_RECORD)
        deps = Av1DepsIndex.build(self._av1).to_bytes() if self._av1 else None
        return VideoIndex(list(self._videos), frames, deps)

    def close(self) -> VideoIndex:
        """Write the dependency and index members, then rename the shard into place."""
        index = self.index()
        try:
            with naming(self.path):
                self._writer.add(INDEX_MEMBER, index.to_bytes())
                self._writer.close()
            self._out.commit()
        except BaseException:
            self.abort()
            raise
        return index

    def abort(self) -> None:
        """Drop the partial shard."""
        with contextlib.suppress(Exception):  # the archive is discarded whatever state it is in
            self._writer.close()
        self._out.discard()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


def pack(
    path: str | os.PathLike[str],
    members: Iterable[tuple[str, bytes]],
    container: Container | None = None,
) -> VideoIndex:
    """Write one video shard with its KCIDX1 index from already encoded mp4s.

    Args:
        path: the shard file; written under a temporary name and renamed when complete.
        members: ``(name, mp4 bytes)`` pairs, e.g. from ``encode``; names must be unique.
        container: ``zip`` (stored) or ``tar``; default: ``tar`` for a ``.tar`` path, else zip.

    Returns:
        The index written into the shard.

    Raises:
        PackError: a bad or repeated name, or bytes that are not a supported mp4.
    """
    with ShardWriter(path, container) as shard:
        for name, data in members:
            shard.add(name, data)
    return shard.index()

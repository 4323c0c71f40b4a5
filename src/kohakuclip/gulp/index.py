"""A gulp directory as flat numpy arrays, for readers that fetch frames by position.

Built once from the ``.gmeta`` files: per video its chunk, first frame row and frame count; per
frame the absolute offset in its chunk's data file and the JPEG length without padding. Any
frame is then one ``os.pread`` of ``size[row]`` bytes at ``offset[row]`` of ``data_path(video)``.
A gulp directory in object storage (``open_remote_gulp``) has URLs for paths, and its frames are
read through the reader it was opened with (per frame, or a video's frames at once).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import simplejpeg

from kohakuclip.gulp.frames import (
    GulpError,
    RecordError,
    decode_frame,
    decode_stack,
    read_records,
)
from kohakuclip.gulp.meta import ChunkFiles, MetaDict, find_chunks, frame_table, load_meta

__all__ = ["GulpIndex", "open_gulp_source", "open_remote_gulp"]


ReadAt = Callable[[str, int, int], bytes]  # (path, offset, length) -> bytes
# (path, offsets, lengths) -> the records, read together (e.g. concurrent ranged GETs)
ReadRecords = Callable[[str, np.ndarray, np.ndarray], list[bytes]]

FPS_KEYS = ("fps", "frame_rate")
"""meta_data keys that record a video's frame rate (the ingestors write ``fps``)."""


@dataclass(eq=False)
class GulpIndex:
    """Every video of a gulp directory; videos are numbered in chunk order, then file order."""

    root: str
    chunks: list[ChunkFiles]
    ids: list[str]
    chunk: np.ndarray  # int32 per video: position in ``chunks``
    first: np.ndarray  # int64 per video: its first row in the frame arrays
    count: np.ndarray  # int64 per video: number of frames
    offset: np.ndarray  # uint64 per frame: absolute offset in the chunk's data file
    size: np.ndarray  # uint32 per frame: JPEG length (stored length minus padding)
    meta_data: list[list[dict[str, Any]]]  # per video, as stored
    _positions: dict[str, int]
    read_at: ReadAt | None = None  # how frames are read (None: os.pread of local files)
    read_records: ReadRecords | None = None  # how several are read at once (None: read_at each)

    @classmethod
    def from_metas(
        cls,
        root: str,
        chunks: Iterable[tuple[ChunkFiles, MetaDict]],
        data_sizes: Mapping[str, int] | None = None,
        read_at: ReadAt | None = None,
        read_records: ReadRecords | None = None,
    ) -> GulpIndex:
        """Build from already parsed meta files; checks records, data sizes (of the files, or
        ``data_sizes``: data path -> bytes) and unique ids."""
        files: list[ChunkFiles] = []
        ids: list[str] = []
        meta_data: list[list[dict[str, Any]]] = []
        chunk_of: list[np.ndarray] = []
        counts: list[np.ndarray] = []
        tables: list[np.ndarray] = []
        positions: dict[str, int] = {}
        owner: dict[str, str] = {}
        for files_of_chunk, meta in chunks:
            count, table = frame_table(meta, files_of_chunk.meta_path)
            _check_data_size(files_of_chunk, meta, count, table, data_sizes)
            for id_, entry in meta.items():
                if id_ in positions:
                    raise GulpError(
                        f"duplicate id {id_!r} in {owner[id_]} and {files_of_chunk.meta_path}"
                    )
                positions[id_] = len(ids)
                owner[id_] = files_of_chunk.meta_path
                ids.append(id_)
                meta_data.append(entry.get("meta_data", []))
            chunk_of.append(np.full(len(meta), len(files), np.int32))
            counts.append(count)
            tables.append(table)
            files.append(files_of_chunk)
        count_all = np.concatenate(counts) if counts else np.zeros(0, np.int64)
        table_all = np.concatenate(tables) if tables else np.zeros((0, 3), np.int64)
        first = np.zeros(len(count_all), np.int64)
        np.cumsum(count_all[:-1], out=first[1:])
        return cls(
            root=root,
            chunks=files,
            ids=ids,
            chunk=np.concatenate(chunk_of) if chunk_of else np.zeros(0, np.int32),
            first=first,
            count=count_all,
            offset=table_all[:, 0].astype(np.uint64),
            size=(table_all[:, 2] - table_all[:, 1]).astype(np.uint32),
            meta_data=meta_data,
            _positions=positions,
            read_at=read_at,
            read_records=read_records,
        )

    def __len__(self) -> int:
        return len(self.ids)

    def position(self, id_: str | int) -> int:
        """The video number of an id (ids are strings in GulpIO; ints are converted)."""
        try:
            return self._positions[str(id_)]
        except KeyError:
            raise KeyError(f"{self.root}: no video with id {str(id_)!r}") from None

    def data_path(self, video: int) -> str:
        """The data file that holds a video's frames."""
        return self.chunks[int(self.chunk[video])].data_path

    def frames(self, video: int) -> tuple[str, np.ndarray, np.ndarray]:
        """(data file, frame offsets, JPEG sizes) of a video: views, not copies."""
        rows = slice(int(self.first[video]), int(self.first[video] + self.count[video]))
        return self.data_path(video), self.offset[rows], self.size[rows]

    def read(self, video: int, indices: Sequence[int] | np.ndarray) -> list[bytes]:
        """JPEG bytes of the given frames of a video (any order, repeats allowed)."""
        path, offsets, sizes = self.frames(video)
        wanted = np.asarray(indices, dtype=np.int64)
        n = len(offsets)
        if wanted.size and (wanted.min() < 0 or wanted.max() >= n):
            raise IndexError(f"{path}: video {self.ids[video]!r} has {n} frames, asked {indices}")
        return self._records(path, offsets[wanted], sizes[wanted])

    def _records(self, path: str, offsets: np.ndarray, sizes: np.ndarray) -> list[bytes]:
        if self.read_records is not None:
            out = self.read_records(path, offsets, sizes)
        elif self.read_at is not None:
            out = [self.read_at(path, o, n) for o, n in zip(offsets.tolist(), sizes.tolist())]
        else:
            return read_records(path, offsets, sizes)
        for data, offset, size in zip(out, offsets.tolist(), sizes.tolist(), strict=True):
            if len(data) != size:
                raise GulpError(f"{path}: truncated record ({len(data)} of {size} at {offset})")
        return out

    def decode(self, video: int, indices: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """RGB frames (H x W x 3 uint8) of a video; GulpError naming file, id and frame if bad."""
        out = []
        for i, data in zip(indices, self.read(video, indices), strict=True):
            try:
                out.append(decode_frame(data))
            except ValueError as exc:
                path = self.data_path(video)
                raise GulpError(f"{path}: id {self.ids[video]!r} frame {i}: {exc}") from exc
        return out

    def decode_stack(self, video: int, indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """The frames as one T x H x W x 3 uint8 array, each repeated index decoded once."""
        wanted = np.asarray(indices, dtype=np.int64)
        unique, where = np.unique(wanted, return_inverse=True)
        try:
            stack = decode_stack(self.read(video, unique))
        except RecordError as exc:
            path, frame = self.data_path(video), unique[exc.position]
            raise GulpError(f"{path}: id {self.ids[video]!r} frame {frame}: {exc}") from exc
        if len(unique) == len(wanted) and (unique == wanted).all():
            return stack
        return stack[where.ravel()]

    def frame_size(self, video: int, frame: int = 0) -> tuple[int, int]:
        """(height, width) of a stored frame, from its JPEG header (one small read); GulpError
        when the video has no such frame (GulpIO's ``GulpChunk.append`` stores ids without
        frames too)."""
        path, offsets, sizes = self.frames(video)
        if not 0 <= frame < len(offsets):
            raise GulpError(f"{path}: id {self.ids[video]!r} has no frame {frame}")
        data = self._records(
            path, offsets[frame : frame + 1], np.minimum(sizes[frame : frame + 1], 65536)
        )[0]
        try:
            height, width = simplejpeg.decode_jpeg_header(data)[:2]
        except ValueError:  # a header simplejpeg refuses, or one longer than 64 KiB
            height, width = self.decode(video, [frame])[0].shape[:2]
        return int(height), int(width)

    def meta(self, video: int) -> dict[str, Any]:
        """The first meta_data dict of a video (GulpIO's per-video metadata), or {}."""
        entries = self.meta_data[video]
        return entries[0] if entries else {}

    def fps(self, video: int) -> float | None:
        """The frame rate recorded in a video's meta_data, if any."""
        meta = self.meta(video)
        for key in FPS_KEYS:
            value = meta.get(key)
            if isinstance(value, int | float) and value > 0:
                return float(value)
        return None


def open_gulp_source(path: str | os.PathLike[str]) -> GulpIndex:
    """Index a gulp directory for reading; GulpError naming it when it holds no chunk."""
    root = os.fspath(path)
    chunks = find_chunks(root)
    if not chunks:
        raise GulpError(f"{root}: no gulp chunks (data_<i>.gulp + meta_<i>.gmeta)")
    return GulpIndex.from_metas(root, ((c, load_meta(c.meta_path)) for c in chunks))


_DATA_NAME = re.compile(r"data_(\d+)\.gulp$")
_META_NAME = re.compile(r"meta_(\d+)\.gmeta$")


def open_remote_gulp(
    prefix: str,
    objects: Mapping[str, int],
    fetch: Callable[[str], bytes],
    read_at: ReadAt | None,
    read_records: ReadRecords | None = None,
) -> GulpIndex | None:
    """Index the gulp directory at ``prefix`` (a URL ending in ``/``) from a listing
    (``objects``: URL -> size, every object under it); None when no chunk is directly under it.
    ``fetch(url)`` reads a whole ``.gmeta``; frames are read with ``read_records`` (the frames
    wanted together) when given, else one by one with ``read_at``."""
    data: dict[int, str] = {}
    meta: dict[int, str] = {}
    for url in objects:
        name = url[len(prefix) :]
        if match := _DATA_NAME.fullmatch(name):
            data[int(match.group(1))] = url
        elif match := _META_NAME.fullmatch(name):
            meta[int(match.group(1))] = url
    if not data and not meta:
        return None
    lone = sorted(data.keys() - meta.keys())
    if lone:
        raise GulpError(f"{data[lone[0]]}: data file without its meta file")
    chunks = []
    for number in sorted(data.keys() & meta.keys()):
        files = ChunkFiles(number, data[number], meta[number])
        try:
            parsed = json.loads(fetch(files.meta_path))
        except ValueError as exc:
            raise GulpError(f"{files.meta_path}: unreadable meta file ({exc})") from exc
        if not isinstance(parsed, dict):
            raise GulpError(f"{files.meta_path}: meta file is not a JSON object")
        chunks.append((files, parsed))
    return GulpIndex.from_metas(prefix, chunks, objects, read_at, read_records)


def _check_data_size(
    files: ChunkFiles,
    meta: MetaDict,
    count: np.ndarray,
    table: np.ndarray,
    data_sizes: Mapping[str, int] | None = None,
) -> None:
    if not len(table):
        return
    ends = table[:, 0] + table[:, 2]
    end = int(ends.max())
    if data_sizes is not None:
        size = data_sizes[files.data_path]
    else:
        size = os.path.getsize(files.data_path)
    if size < end:
        row = int(np.argmax(ends > size))
        owner = list(meta)[int(np.searchsorted(np.cumsum(count), row, side="right"))]
        raise GulpError(
            f"{files.data_path}: {size} bytes, "
            f"but id {owner!r} has a frame ending at {int(ends[row])}"
        )

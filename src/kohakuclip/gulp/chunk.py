"""One GulpIO chunk: read videos from it, append to it, or build a new one.

Byte layout (GulpIO's): ``data_<i>.gulp`` is the JPEG of every frame, each right-padded with zero
bytes to a multiple of 4; ``meta_<i>.gmeta`` maps each id to ``frame_info`` records
``[offset, pad, length_with_pad]`` and a ``meta_data`` list of dicts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any

import numpy as np

from kohakuclip.gulp.frames import (
    JPEG_QUALITY,
    GulpError,
    decode_frame,
    encode_frame,
    padding_for,
    read_records,
)
from kohakuclip.gulp.meta import MetaDict, dump_meta, frame_table, load_meta

__all__ = ["ChunkBuilder", "GulpChunk", "JpegDecoder", "split_key"]


FrameSelection = slice | Sequence[int] | None
"""Which frames of a video: all (None), a slice, or a list of indices."""

JpegDecoder = Callable[[bytes], Any]
"""gulpio2's ``jpeg_decoder``: a frame's JPEG bytes -> what reads return for it."""


def split_key(key: Any) -> tuple[str, FrameSelection]:
    """``id`` or ``(id, selection)`` -> (id as str, selection); GulpIO's indexing convention."""
    if isinstance(key, tuple):
        if len(key) != 2:
            raise TypeError(f"expected id or (id, slice), got {key!r}")
        return str(key[0]), key[1]
    if isinstance(key, str | int | np.integer):
        return str(key), None
    raise TypeError(f"expected id or (id, slice), got {key!r}")


def _append_records(
    fp: IO[bytes], entry: dict[str, Any], frames: Iterable[Any], quality: int
) -> None:
    """Encode frames, write each padded record at the file's end, and record it in ``entry``."""
    offset = fp.tell()
    for frame in frames:
        jpeg = encode_frame(frame, quality)
        pad = padding_for(len(jpeg))
        fp.write(jpeg)
        fp.write(b"\0" * pad)
        entry["frame_info"].append([offset, pad, len(jpeg) + pad])
        offset += len(jpeg) + pad


class GulpChunk:
    """A pair of chunk files; the meta file is loaded and its records checked (or an empty
    chunk started) on construction.

    Reads give RGB arrays (``decode_frame``), or what ``jpeg_decoder`` makes of each frame's
    JPEG bytes (gulpio2's option: ``bytes`` gives the stored JPEGs as they are).
    """

    def __init__(
        self,
        data_file_path: str,
        meta_file_path: str,
        *,
        jpeg_decoder: JpegDecoder | None = None,
    ) -> None:
        self.data_file_path = data_file_path
        self.meta_file_path = meta_file_path
        self.jpeg_decoder: JpegDecoder = jpeg_decoder or decode_frame
        self.meta_dict: MetaDict = {}
        if os.path.exists(meta_file_path):
            self.meta_dict = load_meta(meta_file_path)
            frame_table(self.meta_dict, meta_file_path)

    def __repr__(self) -> str:
        return f"GulpChunk({self.data_file_path!r}, {len(self.meta_dict)} ids)"

    def __len__(self) -> int:
        return len(self.meta_dict)

    def __contains__(self, id_: object) -> bool:
        return str(id_) in self.meta_dict

    def __getitem__(self, key: Any) -> tuple[list[Any], dict[str, Any]]:
        return self.read_frames(*split_key(key))

    def __iter__(self) -> Iterator[tuple[list[Any], dict[str, Any]]]:
        return self.iter_all()

    def ids(self) -> list[str]:
        """The ids in this chunk, in file order."""
        return list(self.meta_dict)

    def read_frames(
        self, id_: str | int, slice_: FrameSelection = None
    ) -> tuple[list[Any], dict[str, Any]]:
        """(frames, a copy of the first meta_data dict) of one video; frames are RGB arrays, or
        what ``jpeg_decoder`` returns."""
        key = str(id_)
        entry = self.meta_dict.get(key)
        if entry is None:
            raise KeyError(f"{self.meta_file_path}: no id {key!r}")
        infos = entry["frame_info"]
        if slice_ is None:
            chosen = list(range(len(infos)))
        elif isinstance(slice_, slice):
            chosen = list(range(len(infos)))[slice_]
        else:
            chosen = [int(i) for i in slice_]
            if any(not -len(infos) <= i < len(infos) for i in chosen):
                raise IndexError(
                    f"{self.data_file_path}: id {key!r} has {len(infos)} frames, asked {chosen}"
                )
            chosen = [i % len(infos) for i in chosen]
        records = read_records(
            self.data_file_path,
            [infos[i][0] for i in chosen],
            [infos[i][2] - infos[i][1] for i in chosen],
        )
        frames = []
        for i, data in zip(chosen, records, strict=True):
            try:
                frames.append(self.jpeg_decoder(data))
            except ValueError as exc:
                raise GulpError(f"{self.data_file_path}: id {key!r} frame {i}: {exc}") from exc
        meta_data = entry.get("meta_data") or [{}]
        return frames, dict(meta_data[0])

    def iter_all(
        self, accepted_ids: Iterable[str] | None = None, shuffle: bool = False, seed: int = 0
    ) -> Iterator[tuple[list[Any], dict[str, Any]]]:
        """(frames, meta) of every video (or only ``accepted_ids``), optionally seeded-shuffled."""
        ids = self.ids()
        if accepted_ids is not None:
            accepted = {str(i) for i in accepted_ids}
            ids = [i for i in ids if i in accepted]
        if shuffle:
            ids = [ids[i] for i in np.random.default_rng(seed).permutation(len(ids))]
        for id_ in ids:
            yield self.read_frames(id_)

    def append(
        self,
        id_: str | int,
        meta_data: dict[str, Any],
        frames: Iterable[Any],
        quality: int = JPEG_QUALITY,
    ) -> None:
        """Add frames (and a meta_data dict) for an id, new or already present, at the end.

        The data is appended in place, then the meta file is replaced atomically.
        """
        key = str(id_)
        entry = self.meta_dict.get(key) or {"frame_info": [], "meta_data": []}
        with open(self.data_file_path, "ab") as fp:
            _append_records(fp, entry, frames, quality)
        entry["meta_data"].append(meta_data)
        self.meta_dict[key] = entry
        dump_meta(self.meta_dict, self.meta_file_path)


class ChunkBuilder:
    """Writes a new chunk under temporary names; ``close`` makes it appear complete, at once.

    Use as a context manager: on an exception the temporary files are removed and nothing named
    like a chunk is left behind.
    """

    def __init__(self, data_file_path: str, meta_file_path: str, quality: int = JPEG_QUALITY):
        self.data_file_path = data_file_path
        self.meta_file_path = meta_file_path
        self.quality = quality
        self.meta_dict: MetaDict = {}
        self._tmp_data = f"{data_file_path}.tmp"
        self._fp: IO[bytes] | None = open(self._tmp_data, "wb")

    def __enter__(self) -> ChunkBuilder:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def add(self, id_: str | int, meta_data: dict[str, Any], frames: Iterable[Any]) -> None:
        """Write one video's frames and meta (a repeated id extends its entry, as GulpIO did)."""
        if self._fp is None:
            raise GulpError(f"{self.data_file_path}: chunk already closed")
        key = str(id_)
        entry = self.meta_dict.get(key) or {"frame_info": [], "meta_data": []}
        _append_records(self._fp, entry, frames, self.quality)
        entry["meta_data"].append(meta_data)
        self.meta_dict[key] = entry

    def close(self) -> GulpChunk:
        """Finish: meta file first, then the data file under its final name."""
        if self._fp is not None:
            self._fp.close()
            self._fp = None
            dump_meta(self.meta_dict, self.meta_file_path)
            os.replace(self._tmp_data, self.data_file_path)
        return GulpChunk(self.data_file_path, self.meta_file_path)

    def abort(self) -> None:
        """Drop everything written so far."""
        if self._fp is not None:
            self._fp.close()
            self._fp = None
        if os.path.exists(self._tmp_data):
            os.remove(self._tmp_data)

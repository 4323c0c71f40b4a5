"""A gulp directory: its chunks, a merged view of their meta files, and access by id."""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import cached_property
from typing import Any

from kohakuclip.gulp.chunk import GulpChunk, JpegDecoder, split_key
from kohakuclip.gulp.frames import GulpError
from kohakuclip.gulp.index import GulpIndex
from kohakuclip.gulp.meta import chunk_paths, find_chunks, next_chunk_number

__all__ = ["GulpDirectory"]


class GulpDirectory:
    """Every chunk of a directory (sorted by chunk number), loaded on construction.

    ``gd[id]``, ``gd[id, 1:10:2]`` or ``gd[id, [0, 5, 9]]`` give (RGB frames, meta dict).
    Ids are strings, as in the meta files; an id present in two chunks raises GulpError.
    ``jpeg_decoder`` (gulpio2's option) makes the frames from their JPEG bytes instead.
    """

    def __init__(
        self, output_dir: str | os.PathLike[str], jpeg_decoder: JpegDecoder | None = None
    ) -> None:
        self.output_dir = os.fspath(output_dir)
        self.jpeg_decoder = jpeg_decoder
        self._files = find_chunks(self.output_dir)
        self.chunk_objs_lookup: dict[int, GulpChunk] = {
            f.number: GulpChunk(f.data_path, f.meta_path, jpeg_decoder=jpeg_decoder)
            for f in self._files
        }
        self.all_meta_dicts = [c.meta_dict for c in self.chunk_objs_lookup.values()]
        self.num_chunks = len(self.chunk_objs_lookup)
        self.chunk_lookup: dict[str, int] = {}
        self.merged_meta_dict: dict[str, Any] = {}
        for number, chunk in self.chunk_objs_lookup.items():
            for id_, entry in chunk.meta_dict.items():
                if id_ in self.chunk_lookup:
                    first = self.chunk_objs_lookup[self.chunk_lookup[id_]].meta_file_path
                    raise GulpError(f"duplicate id {id_!r} in {first} and {chunk.meta_file_path}")
                self.chunk_lookup[id_] = number
                self.merged_meta_dict[id_] = entry

    def __repr__(self) -> str:
        return f"GulpDirectory({self.output_dir!r}, {self.num_chunks} chunks, {len(self)} ids)"

    def __len__(self) -> int:
        return len(self.merged_meta_dict)

    def __contains__(self, id_: object) -> bool:
        return str(id_) in self.chunk_lookup

    def __iter__(self) -> Iterator[GulpChunk]:
        return iter(self.chunk_objs_lookup.values())

    def chunks(self) -> Iterator[GulpChunk]:
        """The chunks, in chunk-number order."""
        return iter(self)

    def __getitem__(self, key: Any) -> tuple[list[Any], dict[str, Any]]:
        id_, selection = split_key(key)
        number = self.chunk_lookup.get(id_)
        if number is None:
            raise KeyError(f"{self.output_dir}: no id {id_!r}")
        return self.chunk_objs_lookup[number].read_frames(id_, selection)

    def new_chunks(self, total_new_chunks: int) -> list[GulpChunk]:
        """Empty chunks numbered after every chunk file in the directory (for appending)."""
        start = next_chunk_number(self.output_dir)
        return [
            GulpChunk(p.data_path, p.meta_path, jpeg_decoder=self.jpeg_decoder)
            for p in (chunk_paths(self.output_dir, start + i) for i in range(total_new_chunks))
        ]

    @cached_property
    def index(self) -> GulpIndex:
        """The same directory as flat arrays (frame offsets and sizes per id), for fast readers."""
        return GulpIndex.from_metas(
            self.output_dir,
            ((f, self.chunk_objs_lookup[f.number].meta_dict) for f in self._files),
        )

"""Ingestion: an adapter's items written as new chunks of a gulp directory, in parallel.

Each chunk is built under temporary names and renamed when complete, so an interrupted run
never leaves a chunk that looks finished. Chunks are numbered after those already present;
ids already in the directory are not written again, and an id the adapter gives twice is written
once (its first item), so that every id of the directory names one video.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kohakuclip._progress import progress_bar
from kohakuclip.gulp.adapters import AbstractDatasetAdapter, Label2Idx, load_label2idx
from kohakuclip.gulp.chunk import ChunkBuilder, GulpChunk
from kohakuclip.gulp.frames import JPEG_QUALITY, GulpError
from kohakuclip.gulp.meta import (
    ChunkFiles,
    chunk_paths,
    dump_meta,
    find_chunks,
    load_meta,
    next_chunk_number,
    scan_directory,
    write_json,
)

__all__ = [
    "LABEL2IDX_FILE",
    "ChunkWriter",
    "GulpIngestor",
    "IngestReport",
    "calculate_chunk_slices",
]


LABEL2IDX_FILE = "label2idx.json"
"""Label name -> class index, kept beside the chunks (GulpIO's convention)."""


@dataclass
class IngestReport:
    """What an ingestion (or one chunk of it) wrote and left out."""

    chunks: list[str] = field(default_factory=list)  # data files written
    written: int = 0  # items written
    empty: list[str] = field(default_factory=list)  # ids whose adapter gave no frames
    existing: list[str] = field(default_factory=list)  # ids already in the directory
    repeated: list[str] = field(default_factory=list)  # ids given again: the first item is kept

    def merge(self, other: IngestReport) -> None:
        self.chunks += other.chunks
        self.written += other.written
        self.empty += other.empty
        self.existing += other.existing
        self.repeated += other.repeated


def calculate_chunk_slices(items_per_chunk: int, num_items: int) -> list[slice]:
    """Consecutive slices of at most ``items_per_chunk`` items covering ``num_items``."""
    if items_per_chunk < 1:
        raise ValueError(f"items_per_chunk must be >= 1, got {items_per_chunk}")
    return [
        slice(i, min(i + items_per_chunk, num_items)) for i in range(0, num_items, items_per_chunk)
    ]


def _unpack(item: Any) -> tuple[str, list[Any], dict[str, Any]]:
    if isinstance(item, dict):
        return str(item["id"]), list(item["frames"]), dict(item["meta"])
    id_, frames, meta = item
    return str(id_), list(frames), dict(meta)


class ChunkWriter:
    """Writes one slice of an adapter's items as one chunk.

    Ids in ``existing_ids`` are left out, and so are those this writer has already written
    (in this slice or an earlier one it wrote).
    """

    def __init__(
        self,
        adapter: AbstractDatasetAdapter,
        quality: int = JPEG_QUALITY,
        existing_ids: Iterable[str] = (),
    ) -> None:
        self.adapter = adapter
        self.quality = quality
        self.existing_ids = frozenset(existing_ids)
        self._written: set[str] = set()

    def write_chunk(self, output: ChunkFiles | GulpChunk, input_slice: slice) -> IngestReport:
        """Build the chunk (given by its files, or as GulpIO did, as an empty ``GulpChunk`` from
        ``GulpDirectory.new_chunks``); a slice that yields nothing writable leaves no files."""
        if isinstance(output, GulpChunk):
            data_path, meta_path = output.data_file_path, output.meta_file_path
        else:
            data_path, meta_path = output.data_path, output.meta_path
        report = IngestReport()
        with ChunkBuilder(data_path, meta_path, self.quality) as builder:
            for item in self.adapter.iter_data(input_slice):
                id_, frames, meta = _unpack(item)
                if id_ in self.existing_ids:
                    report.existing.append(id_)
                elif id_ in self._written or id_ in builder.meta_dict:
                    report.repeated.append(id_)
                elif not frames:
                    report.empty.append(id_)
                else:
                    builder.add(id_, meta, frames)
                    report.written += 1
            if not builder.meta_dict:
                builder.abort()
                return report
            self._written.update(builder.meta_dict)
        report.chunks.append(data_path)
        return report


def _drop_repeated(output: ChunkFiles, report: IngestReport, seen: set[str]) -> None:
    """Remove from a chunk written in parallel the ids an earlier chunk of the run holds (the
    meta file is rewritten atomically, then the data file cut after the last frame kept: frames
    of a dropped id before that stay, unreferenced); a chunk left with none is deleted.
    ``seen`` gains the chunk's ids."""
    if not report.chunks:
        return
    meta = load_meta(output.meta_path)
    repeated = [id_ for id_ in meta if id_ in seen]
    seen.update(meta)
    if not repeated:
        return
    report.repeated += repeated
    report.written -= len(repeated)
    kept = {id_: entry for id_, entry in meta.items() if id_ not in repeated}
    if kept:
        dump_meta(kept, output.meta_path)
        end = max(offset + length for e in kept.values() for offset, _, length in e["frame_info"])
        os.truncate(output.data_path, end)  # what the sanity check wants: ends at the last frame
    else:
        os.remove(output.meta_path)  # meta first: a data file alone would be an error
        os.remove(output.data_path)
        report.chunks.remove(output.data_path)


def _clear_unfinished(root: str) -> None:
    """Remove what an interrupted ingestion left: meta files without their data file (a crash
    between the two renames of ``ChunkBuilder.close``) and data files under their temporary
    name. Readers skip both; the sanity check, and gulpio2, refuse the directory while they are
    there. (One ingestion per directory at a time: another one's chunk in the making would go
    too.)"""
    _, _, lone_meta = scan_directory(root)
    temporary = [
        os.path.join(root, name)
        for name in os.listdir(root)
        if re.fullmatch(r"data_\d+\.gulp\.tmp", name)  # ChunkBuilder's names, nothing else
    ]
    for path in lone_meta + temporary:
        os.remove(path)


def _extended(old: Label2Idx, new: Label2Idx) -> Label2Idx:
    """``old`` with the labels only in ``new`` added after its largest index, in ``new``'s order
    (a derived map's order is the sorted labels, as GulpIO numbered them)."""
    start = max(old.values(), default=-1) + 1
    added = sorted(new.keys() - old.keys(), key=new.__getitem__)
    return {**old, **{label: start + i for i, label in enumerate(added)}}


_worker_writer: ChunkWriter | None = None


def _init_worker(writer: ChunkWriter) -> None:
    global _worker_writer
    _worker_writer = writer


def _write_in_worker(output: ChunkFiles, input_slice: slice) -> IngestReport:
    assert _worker_writer is not None
    return _worker_writer.write_chunk(output, input_slice)


class GulpIngestor:
    """Write every item of ``adapter`` into ``output_folder``, ``videos_per_chunk`` per chunk.

    ``num_workers`` > 1 builds chunks in that many processes (the adapter must pickle). Calling
    the ingestor runs it and returns an IngestReport; items without frames are listed there.
    """

    def __init__(
        self,
        adapter: AbstractDatasetAdapter,
        output_folder: str | os.PathLike[str],
        videos_per_chunk: int,
        num_workers: int,
        *,
        quality: int = JPEG_QUALITY,
        progress: bool = True,
    ) -> None:
        self.adapter = adapter
        self.output_folder = os.fspath(output_folder)
        self.videos_per_chunk = videos_per_chunk
        self.num_workers = num_workers
        self.quality = quality
        self.progress = progress

    def __call__(self) -> IngestReport:
        os.makedirs(self.output_folder, exist_ok=True)
        _clear_unfinished(self.output_folder)
        label2idx = self._merged_label2idx()
        existing = [id_ for c in find_chunks(self.output_folder) for id_ in load_meta(c.meta_path)]
        slices = calculate_chunk_slices(self.videos_per_chunk, len(self.adapter))
        start = next_chunk_number(self.output_folder)
        outputs = [chunk_paths(self.output_folder, start + i) for i in range(len(slices))]
        writer = ChunkWriter(self.adapter, self.quality, existing)
        bar = progress_bar(total=len(slices), unit="chunk", desc="gulp", disable=not self.progress)
        report = IngestReport()
        if self.num_workers <= 1:
            for output, part in zip(outputs, slices, strict=True):
                report.merge(writer.write_chunk(output, part))
                bar.update()
        else:
            seen: set[str] = set()
            with ProcessPoolExecutor(
                self.num_workers, initializer=_init_worker, initargs=(writer,)
            ) as pool:
                for output, part_report in zip(
                    outputs, pool.map(_write_in_worker, outputs, slices), strict=True
                ):
                    _drop_repeated(output, part_report, seen)
                    report.merge(part_report)
                    bar.update()
        bar.close()
        if label2idx is not None:
            write_json(os.path.join(self.output_folder, LABEL2IDX_FILE), label2idx)
        return report

    def _merged_label2idx(self) -> Label2Idx | None:
        """The label map to write: the adapter's, joined with one already in the folder.

        A map the adapter derived from its labels yields to the folder's, as GulpIO's
        ``--extend`` did: labels already there keep their index, new ones are numbered after,
        and the adapter takes the result so that its items' ``idx`` agree with the file. A map
        given to the adapter must agree with the folder's; GulpError otherwise.
        """
        # getattr: an adapter written for GulpIO (not subclassing ours) may have neither
        new = getattr(self.adapter, "label2idx", None)
        path = os.path.join(self.output_folder, LABEL2IDX_FILE)
        if new is None or not os.path.exists(path):
            return new
        old = load_label2idx(path)
        if getattr(self.adapter, "label2idx_derived", False):
            self.adapter.label2idx = _extended(old, new)
            return self.adapter.label2idx
        merged = {**old, **new}
        clash = [k for k in old.keys() & new.keys() if old[k] != new[k]]
        if clash or len(set(merged.values())) != len(merged):
            raise GulpError(
                f"{path}: the adapter's label map disagrees with this one"
                f"{f' on {clash[:3]}' if clash else ''}; pass label2idx={path!r} to the adapter"
            )
        return merged

"""``kohakuclip merge OUT``: one dataset view over every part written into a folder.

The parts' manifests (``part-*-of-N.manifest.parquet``, or a single run's ``manifest.parquet``)
become one ``manifest.parquet`` sorted by (shard, index), their skip logs one ``skipped.jsonl``,
and ``dataset.json`` lists every shard with its count, byte size and index location (see
``formats.DATASET_FILE``). Each shard's index is read once here and checked against its
manifest rows, so a reader of the view trusts it without opening the shards. Merging refuses a
folder where a part is missing or unfinished, naming the parts to (re-)run.

``OUT`` may be an object-store URL prefix the parts uploaded to (``s3://bucket/prefix/``...,
credentials from the standard environment variables): the manifests and skip logs are fetched,
each shard's index read by ranged GETs (never the whole shard), and the merged files uploaded,
``dataset.json`` last, each with one PUT (visible only once complete).
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import (
    DATASET_FILE,
    MANIFEST_FILE,
    SKIPPED_FILE,
    VideoEntry,
    manifest_table,
)
from kohakuclip.storage.image_index import find_image_index
from kohakuclip.storage.index import IndexFormatError
from kohakuclip.storage.remote import (
    ObjectStoreError,
    is_url,
    list_objects,
    open_object,
    put_object,
)
from kohakuclip.storage.video_listing import SourceError, index_layout
from kohakuclip.storage.view import DatasetView, ShardListing, ViewKind, dump_view
from kohakuclip.storage.zip import ArchiveError
from kohakuclip.write._atomic import write_atomically
from kohakuclip.write.parts import OutputNames, Part

__all__ = ["MergeError", "MergeResult", "merge"]


_PART_MANIFEST_RE = re.compile(r"^part-(\d+)-of-(\d+)\." + re.escape(MANIFEST_FILE) + "$")


class MergeError(KohakuClipError, RuntimeError):
    """The folder cannot be merged (parts missing or unfinished, a shard disagreeing with its
    manifest)."""


@dataclass(frozen=True)
class MergeResult:
    """What ``merge`` wrote.

    Attributes:
        view: the path (or URL) of ``dataset.json``.
        kind: ``video`` or ``image`` shards.
        shards: shards in the view.
        count: videos (or images) in the view.
        bytes: bytes of the shards.
        parts: parts merged (1 for a single run).
    """

    view: str
    kind: ViewKind
    shards: int
    count: int
    bytes: int
    parts: int


@dataclass(frozen=True)
class _Out:
    """The folder (or URL prefix) merged: its files' sizes, reads and atomic replacements."""

    root: str  # a local folder, or a URL prefix ending in "/"
    sizes: Mapping[str, int]  # name -> bytes; a local sub-folder as "name/" -> 0
    options: Mapping[str, Any] | None = None

    @classmethod
    def open(cls, out: str, options: Mapping[str, Any] | None = None) -> _Out:
        if not is_url(out):
            if not os.path.isdir(out):
                raise MergeError(f"{out}: no such folder")
            sizes = {}
            for name in os.listdir(out):
                path = os.path.join(out, name)
                if os.path.isdir(path):
                    sizes[name + "/"] = 0
                else:
                    sizes[name] = os.path.getsize(path)
            return cls(out, sizes)
        prefix = out if out.endswith("/") else out + "/"
        try:
            listed = list_objects(prefix, options)
        except ObjectStoreError as e:
            raise MergeError(str(e)) from None
        return cls(prefix, {url[len(prefix) :]: int(m["size"]) for url, m in listed}, options)

    @property
    def remote(self) -> bool:
        return is_url(self.root)

    def path(self, name: str) -> str:
        return self.root + name if self.remote else os.path.join(self.root, name)

    def has_folder(self, name: str) -> bool:
        return any(found.startswith(name + "/") for found in self.sizes)

    def read(self, name: str) -> bytes:
        if not self.remote:
            with open(self.path(name), "rb") as f:
                return f.read()
        try:
            return open_object(self.path(name), self.options, {"size": self.sizes[name]}).read(
                0, self.sizes[name]
            )
        except ObjectStoreError as e:
            raise MergeError(str(e)) from None

    def table(self, name: str) -> pa.Table:
        if not self.remote:
            return pq.read_table(self.path(name))
        return pq.read_table(pa.BufferReader(self.read(name)))

    def replace(self, name: str, data: bytes) -> None:
        """Write ``name`` whole: a renamed temporary file, or one PUT."""
        path = self.path(name)
        if not self.remote:
            write_atomically(path, data)
            return
        try:
            put_object(path, data, self.options)
        except ObjectStoreError as e:
            raise MergeError(str(e)) from None


def _runs(out: _Out) -> list[OutputNames]:
    """The runs whose manifests are merged: every part of one job, or the single run."""
    found: dict[int, set[int]] = {}
    for name in out.sizes:
        match = _PART_MANIFEST_RE.match(name)
        if match:
            found.setdefault(int(match.group(2)), set()).add(int(match.group(1)))
    if not found:
        if MANIFEST_FILE not in out.sizes:
            raise MergeError(f"{out.root}: no manifest to merge (no finished run or part there)")
        return [OutputNames()]
    if len(found) > 1:
        counts = ", ".join(str(n) for n in sorted(found))
        raise MergeError(f"{out.root}: parts of jobs split different ways ({counts} parts)")
    ((count, indices),) = found.items()
    runs = [OutputNames(Part(i, count)) for i in range(count)]
    missing = [str(r.part) for r in runs if r.part is not None and r.part.index not in indices]
    unfinished = [str(r.part) for r in runs if out.has_folder(r.pending)]
    if missing or unfinished:
        what = [f"missing {', '.join(missing)}"] if missing else []
        what += [f"unfinished {', '.join(unfinished)}"] if unfinished else []
        raise MergeError(f"{out.root}: parts {'; '.join(what)} (run them, with --resume)")
    return runs


def _kind(table: pa.Table) -> ViewKind:
    return "image" if "key" in table.column_names else "video"


def _video_listing(out: _Out, shard: str, rows: pa.Table) -> tuple[ShardListing, list[VideoEntry]]:
    path = out.path(shard)
    try:
        member, records, deps, entries = index_layout(path)
    except (SourceError, ArchiveError, IndexFormatError) as e:
        raise MergeError(f"{path}: {e}") from None
    order = rows.column("index").to_pylist()
    members = rows.column("member").to_pylist()
    frames = rows.column("frames").to_pylist()
    by_member = {e.member: e for e in entries}
    if order != list(range(len(entries))) or [e.member for e in entries] != members:
        raise MergeError(f"{path}: its index and its manifest rows list different videos")
    for name, n in zip(members, frames):
        if by_member[name].n != n:
            raise MergeError(f"{path}:{name}: {by_member[name].n} frames, manifest says {n}")
    listing = ShardListing(
        shard, len(entries), out.sizes[shard], (member.offset, member.size), records, deps
    )
    return listing, entries


def _image_listing(out: _Out, shard: str, rows: pa.Table) -> ShardListing:
    path = out.path(shard)
    try:
        source = open_object(path, out.options, {"size": out.sizes[shard]}) if out.remote else path
        found = find_image_index(source)
    except (ArchiveError, IndexFormatError, ObjectStoreError) as e:
        raise MergeError(f"{path}: {e}") from None
    if found is None:
        raise MergeError(f"{path}: no image index (not a kohakuclip image shard)")
    member, count = found
    if rows.column("index").to_pylist() != list(range(count)):
        raise MergeError(f"{path}: {count} images in its index, manifest rows disagree")
    return ShardListing(shard, count, out.sizes[shard], (member.offset, member.size))


def _set_column(table: pa.Table, name: str, column: pa.Array) -> pa.Table:
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, column)
    return table.append_column(name, column)


def merge(out: str | os.PathLike[str]) -> MergeResult:
    """Write ``manifest.parquet``, ``skipped.jsonl`` and ``dataset.json`` over every part in
    ``out``: the dataset view that ``Reader``, ``ImageReader`` and the datasets read in one go.

    Args:
        out: the folder the parts (or a single run) wrote into, or the object-store URL prefix
            they uploaded to.

    Raises:
        MergeError: a part missing or unfinished, a shard that disagrees with its manifest, or
            an object store that cannot be read or written.
    """
    folder = _Out.open(os.fspath(out))
    runs = _runs(folder)
    tables = [manifest_table(folder.table(r.manifest)) for r in runs]
    table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    table = table.sort_by([("shard", "ascending"), ("index", "ascending")])
    kind = _kind(table)
    shard_runs = pc.run_end_encode(table.column("shard").combine_chunks())
    ends = shard_runs.run_ends.to_pylist()
    listings: list[ShardListing] = []
    entries: list[VideoEntry] = []
    for shard, start, end in zip(shard_runs.values.to_pylist(), [0, *ends[:-1]], ends):
        rows = table.slice(start, end - start)
        if shard not in folder.sizes:
            raise MergeError(f"{folder.root}: {shard} is in a manifest but missing")
        if kind == "video":
            listing, shard_entries = _video_listing(folder, shard, rows)
            entries.extend(shard_entries)
        else:
            listing = _image_listing(folder, shard, rows)
        listings.append(listing)
    if kind == "video":  # as the indexes have them (older manifests lack the columns)
        table = _set_column(table, "prefix", pa.array([e.prefix for e in entries], pa.string()))
        ranges = pa.array([e.full_range for e in entries], pa.bool_())
        table = _set_column(table, "full_range", ranges)
    encoded = io.BytesIO()
    pq.write_table(table, encoded)
    folder.replace(MANIFEST_FILE, encoded.getvalue())
    if runs[0].part is not None:
        lines: list[bytes] = []
        for r in runs:
            if r.skipped in folder.sizes:
                data = folder.read(r.skipped)
                lines.extend(line for line in data.splitlines(keepends=True) if line)
        folder.replace(SKIPPED_FILE, b"".join(lines))
    view = DatasetView(kind, listings)
    folder.replace(DATASET_FILE, dump_view(view))
    return MergeResult(
        folder.path(DATASET_FILE),
        kind,
        len(listings),
        view.count,
        sum(s.bytes for s in listings),
        len(runs),
    )

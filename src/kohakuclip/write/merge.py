"""``kohakuclip merge OUT``: one dataset view over every part written into a folder.

The parts' manifests (``part-*-of-N.manifest.parquet``, or a single run's ``manifest.parquet``)
become one ``manifest.parquet`` sorted by (shard, index), their skip logs one ``skipped.jsonl``,
and ``dataset.json`` lists every shard with its count, byte size and index location (see
``formats.DATASET_FILE``). Each shard's index is read once here and checked against its
manifest rows, so a reader of the view trusts it without opening the shards. Merging refuses a
folder where a part is missing or unfinished, naming the parts to (re-)run.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import MANIFEST_FILE, SKIPPED_FILE, manifest_table
from kohakuclip.storage.catalog import SourceError, index_layout
from kohakuclip.storage.image_index import find_image_index
from kohakuclip.storage.index import IndexFormatError
from kohakuclip.storage.view import DatasetView, ShardListing, ViewKind, dump_view, view_path
from kohakuclip.storage.zip import ArchiveError
from kohakuclip.write.pack import TEMP_SUFFIX
from kohakuclip.write.parts import OutputNames, Part

_PART_MANIFEST_RE = re.compile(r"^part-(\d+)-of-(\d+)\." + re.escape(MANIFEST_FILE) + "$")


class MergeError(KohakuClipError, RuntimeError):
    """The folder cannot be merged (parts missing or unfinished, a shard disagreeing with its
    manifest)."""


@dataclass(frozen=True)
class MergeResult:
    """What ``merge`` wrote."""

    view: str  # path of dataset.json
    kind: ViewKind
    shards: int
    count: int  # videos (images)
    bytes: int
    parts: int  # parts merged (1 for a single run)


def _runs(out: str) -> list[OutputNames]:
    """The runs whose manifests are merged: every part of one job, or the single run."""
    found: dict[int, set[int]] = {}
    for name in os.listdir(out):
        match = _PART_MANIFEST_RE.match(name)
        if match:
            found.setdefault(int(match.group(2)), set()).add(int(match.group(1)))
    if not found:
        if not os.path.isfile(os.path.join(out, MANIFEST_FILE)):
            raise MergeError(f"{out}: no manifest to merge (no finished run or part there)")
        return [OutputNames()]
    if len(found) > 1:
        counts = ", ".join(str(n) for n in sorted(found))
        raise MergeError(f"{out}: parts of jobs split different ways ({counts} parts)")
    ((count, indices),) = found.items()
    runs = [OutputNames(Part(i, count)) for i in range(count)]
    missing = [str(r.part) for r in runs if r.part is not None and r.part.index not in indices]
    unfinished = [str(r.part) for r in runs if os.path.isdir(os.path.join(out, r.pending))]
    if missing or unfinished:
        what = [f"missing {', '.join(missing)}"] if missing else []
        what += [f"unfinished {', '.join(unfinished)}"] if unfinished else []
        raise MergeError(f"{out}: parts {'; '.join(what)} (run them, with --resume)")
    return runs


def _kind(table: pa.Table) -> ViewKind:
    return "image" if "key" in table.column_names else "video"


def _video_listing(out: str, shard: str, rows: pa.Table) -> tuple[ShardListing, list[str]]:
    path = os.path.join(out, shard)
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
        shard, len(entries), os.path.getsize(path), (member.offset, member.size), records, deps
    )
    return listing, [e.prefix for e in entries]


def _image_listing(out: str, shard: str, rows: pa.Table) -> ShardListing:
    path = os.path.join(out, shard)
    try:
        found = find_image_index(path)
    except (ArchiveError, IndexFormatError) as e:
        raise MergeError(f"{path}: {e}") from None
    if found is None:
        raise MergeError(f"{path}: no image index (not a kohakuclip image shard)")
    member, count = found
    if rows.column("index").to_pylist() != list(range(count)):
        raise MergeError(f"{path}: {count} images in its index, manifest rows disagree")
    return ShardListing(shard, count, os.path.getsize(path), (member.offset, member.size))


def _replace(path: str, data: bytes) -> None:
    temp = path + TEMP_SUFFIX
    with open(temp, "wb") as f:
        f.write(data)
    os.replace(temp, path)


def merge(out: str | os.PathLike[str]) -> MergeResult:
    """Write ``manifest.parquet``, ``skipped.jsonl`` and ``dataset.json`` over every part in
    ``out`` (see the module doc).

    Args:
        out: the folder the parts (or a single run) wrote into.

    Raises:
        MergeError: a part missing or unfinished, or a shard that disagrees with its manifest.
    """
    out = os.fspath(out)
    runs = _runs(out)
    tables = [manifest_table(pq.read_table(os.path.join(out, r.manifest))) for r in runs]
    table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    table = table.sort_by([("shard", "ascending"), ("index", "ascending")])
    kind = _kind(table)
    shard_runs = pc.run_end_encode(table.column("shard").combine_chunks())
    ends = shard_runs.run_ends.to_pylist()
    listings: list[ShardListing] = []
    prefixes: list[str] = []
    for shard, start, end in zip(shard_runs.values.to_pylist(), [0, *ends[:-1]], ends):
        rows = table.slice(start, end - start)
        if not os.path.isfile(os.path.join(out, shard)):
            raise MergeError(f"{out}: {shard} is in a manifest but missing")
        if kind == "video":
            listing, shard_prefixes = _video_listing(out, shard, rows)
            prefixes.extend(shard_prefixes)
        else:
            listing = _image_listing(out, shard, rows)
        listings.append(listing)
    if kind == "video":  # the decoder prefix as the index has it (older manifests lack it)
        column = pa.array(prefixes, pa.string())
        if "prefix" in table.column_names:
            table = table.set_column(table.column_names.index("prefix"), "prefix", column)
        else:
            table = table.append_column("prefix", column)
    temp = os.path.join(out, MANIFEST_FILE + TEMP_SUFFIX)
    pq.write_table(table, temp)
    os.replace(temp, os.path.join(out, MANIFEST_FILE))
    if runs[0].part is not None:
        lines: list[bytes] = []
        for r in runs:
            skipped = os.path.join(out, r.skipped)
            if os.path.isfile(skipped):
                with open(skipped, "rb") as f:
                    lines.extend(line for line in f.read().splitlines(keepends=True) if line)
        _replace(os.path.join(out, SKIPPED_FILE), b"".join(lines))
    view = DatasetView(kind, listings)
    _replace(view_path(out), dump_view(view))
    return MergeResult(
        view_path(out), kind, len(listings), view.count, sum(s.bytes for s in listings), len(runs)
    )

"""Per-video metadata (caption, label, json sidecar) from the ``manifest.parquet`` beside shards.

A shard in object storage has its manifest beside it too (the same prefix): fetched whole, once
per prefix, through the caller's ``fetch`` (one HEAD and one GET; none when it is absent).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kohakuclip.formats import MANIFEST_FILE, manifest_columns, manifest_table
from kohakuclip.storage.remote import is_url

__all__ = ["Fetch", "VideoManifests", "read_manifest", "shard_location"]


Fetch = Callable[[str], "bytes | None"]
"""Reads a whole remote object by URL; None when there is no such object."""


def shard_location(shard: str) -> tuple[str, str]:
    """(the folder or URL prefix a shard lies in, its name there)."""
    if is_url(shard):
        directory, _, name = shard.rpartition("/")
        return directory, name
    return os.path.dirname(os.path.abspath(shard)), os.path.basename(shard)


def read_manifest(
    directory: str, columns: Sequence[str] | None, fetch: Fetch | None
) -> pa.Table | None:
    """The manifest in ``directory`` (a folder, or a URL prefix read through ``fetch``), or None
    when there is none there; ``columns``: those of them present (all: None)."""
    if is_url(directory):
        data = fetch(directory + "/" + MANIFEST_FILE) if fetch is not None else None
        if data is None:
            return None
        source: Any = pa.BufferReader(data)
    else:
        source = os.path.join(directory, MANIFEST_FILE)
        if not os.path.isfile(source):
            return None
    if columns is None:
        return manifest_table(pq.read_table(source))
    available = pq.read_schema(source).names
    return manifest_table(pq.read_table(source, columns=manifest_columns(available, list(columns))))


_COLUMNS = ("shard", "member", "caption", "label", "meta")


class VideoManifests:
    """Lookup of (shard path or URL, member) -> metadata, one manifest file read per directory.

    Args:
        fetch: reads a remote manifest (for shards given by URL); without it they have none.
    """

    def __init__(self, fetch: Fetch | None = None) -> None:
        self._fetch = fetch
        self._tables: dict[str, dict[tuple[str, str], int] | None] = {}
        self._rows: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _load(self, directory: str) -> dict[tuple[str, str], int] | None:
        with self._lock:
            if directory not in self._tables:
                table = read_manifest(directory, _COLUMNS, self._fetch)
                if table is None:
                    self._tables[directory] = None
                else:
                    shards = table.column("shard").to_pylist()
                    members = table.column("member").to_pylist()
                    self._tables[directory] = {
                        (s, m): i for i, (s, m) in enumerate(zip(shards, members))
                    }
                    self._rows[directory] = table
            return self._tables[directory]

    def lookup(self, shard: str, member: str) -> dict[str, Any]:
        """Caption, label and the json sidecar's fields of one video ({} when unknown)."""
        directory, name = shard_location(shard)
        positions = self._load(directory)
        if positions is None:
            return {}
        pos = positions.get((name, member))
        if pos is None:
            return {}
        row = self._rows[directory].slice(pos, 1).to_pylist()[0]
        out: dict[str, Any] = {}
        for key in ("caption", "label"):
            if row.get(key) is not None:
                out[key] = row[key]
        sidecar = row.get("meta")
        if sidecar:
            try:
                parsed = json.loads(sidecar)
            except ValueError:
                parsed = sidecar
            out.update(parsed if isinstance(parsed, dict) else {"json": parsed})
        return out

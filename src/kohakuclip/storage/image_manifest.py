"""Captions and metadata of stored images, from the ``manifest.parquet`` beside their shards.

A manifest is read the first time one of its shards is asked about, kept as a columnar table
sorted by (shard, index), and looked up by position: no per-row Python objects.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kohakuclip.storage.manifest import Fetch, read_manifest, shard_location

__all__ = ["ImageManifest"]


_COLUMNS = ["shard", "index", "key", "caption", "meta"]


class _Table:
    def __init__(self, table: pa.Table) -> None:
        self.table = table.sort_by([("shard", "ascending"), ("index", "ascending")])
        runs = pc.run_end_encode(self.table.column("shard").combine_chunks())
        ends = runs.run_ends.to_numpy()
        starts = np.concatenate([[0], ends[:-1]])
        self.starts = dict(zip(runs.values.to_pylist(), starts.tolist()))
        self.index = self.table.column("index").to_numpy()


class ImageManifest:
    """Lookup of (shard path or URL, index in shard) -> key, caption and parsed json sidecar.

    Args:
        fetch: reads a remote manifest (for shards given by URL); without it they have none.
    """

    def __init__(self, fetch: Fetch | None = None) -> None:
        self._fetch = fetch
        self._tables: dict[str, _Table | None] = {}
        self._lock = threading.Lock()

    def _table(self, directory: str) -> _Table | None:
        with self._lock:
            if directory not in self._tables:
                table = read_manifest(directory, _COLUMNS, self._fetch)
                self._tables[directory] = None if table is None else _Table(table)
            return self._tables[directory]

    def lookup(self, shard: str, index: int) -> dict[str, Any] | None:
        """The manifest row of one stored image, or None when there is none."""
        directory, name = shard_location(shard)
        table = self._table(directory)
        if table is None:
            return None
        start = table.starts.get(name)
        pos = None if start is None else start + index
        if pos is None or pos >= len(table.index) or table.index[pos] != index:
            return None
        row: dict[str, Any] = table.table.slice(pos, 1).to_pylist()[0]
        row["meta"] = _parse(row.get("meta"))
        row.pop("shard")
        return row


def _parse(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text

"""Per-video metadata (caption, label, json sidecar) from the ``manifest.parquet`` beside shards."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import pyarrow.parquet as pq

from kohakuclip.formats import MANIFEST_FILE

_COLUMNS = ("shard", "member", "caption", "label", "meta")


class VideoManifests:
    """Lookup of (shard path, member) -> metadata, one manifest file read per directory."""

    def __init__(self) -> None:
        self._tables: dict[str, dict[tuple[str, str], int] | None] = {}
        self._rows: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _load(self, directory: str) -> dict[tuple[str, str], int] | None:
        with self._lock:
            if directory not in self._tables:
                path = os.path.join(directory, MANIFEST_FILE)
                if not os.path.isfile(path):
                    self._tables[directory] = None
                else:
                    table = pq.read_table(path)
                    present = [c for c in _COLUMNS if c in table.column_names]
                    table = table.select(present)
                    shards = table.column("shard").to_pylist()
                    members = table.column("member").to_pylist()
                    self._tables[directory] = {
                        (s, m): i for i, (s, m) in enumerate(zip(shards, members))
                    }
                    self._rows[directory] = table
            return self._tables[directory]

    def lookup(self, shard: str, member: str) -> dict[str, Any]:
        """Caption, label and the json sidecar's fields of one video ({} when unknown)."""
        directory = os.path.dirname(os.path.abspath(shard))
        positions = self._load(directory)
        if positions is None:
            return {}
        pos = positions.get((os.path.basename(shard), member))
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

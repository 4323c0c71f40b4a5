"""The dataset view (``dataset.json``, see ``formats.DATASET_FILE``): every shard of a folder with
its item count, byte size and where its index lies, so a reader opens one file, not every
shard's tail."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import DATASET_FILE, DATASET_FORMAT, MANIFEST_FILE

__all__ = [
    "DatasetView",
    "ShardListing",
    "ViewError",
    "ViewKind",
    "dump_view",
    "has_view",
    "load_view",
    "parse_view",
]


ViewKind = Literal["video", "image"]


class ViewError(KohakuClipError, ValueError):
    """A dataset view that cannot be used (bad JSON, another format, a shard gone)."""


@dataclass(frozen=True)
class ShardListing:
    """One shard of a dataset view."""

    name: str  # file name inside the folder
    count: int  # videos (images) in its index
    bytes: int  # file size when merged
    index: tuple[int, int]  # (offset, size) of the index member
    records: int = -1  # video: absolute offset of the first frame record
    deps: int = -1  # video: absolute offset of the KCAV1D table, -1: none


@dataclass(frozen=True)
class DatasetView:
    """Every shard of a folder, in id order."""

    kind: ViewKind
    shards: list[ShardListing] = field(default_factory=list)
    manifest: str = MANIFEST_FILE

    @property
    def count(self) -> int:
        return sum(s.count for s in self.shards)

    def to_json(self) -> dict[str, Any]:
        shards = []
        for s in self.shards:
            item = asdict(s)
            item["index"] = list(s.index)
            if self.kind == "image":
                del item["records"], item["deps"]
            shards.append(item)
        return {
            "format": DATASET_FORMAT,
            "version": 1,
            "kind": self.kind,
            "count": self.count,
            "bytes": sum(s.bytes for s in self.shards),
            "manifest": self.manifest,
            "shards": shards,
        }


def dump_view(view: DatasetView) -> bytes:
    """The JSON text of a view: the header on the first line, then one shard per line."""
    doc = view.to_json()
    shards = doc.pop("shards")
    head = json.dumps(doc)[:-1]
    lines = ",\n".join(json.dumps(s) for s in shards)
    return f'{head}, "shards": [\n{lines}\n]}}\n'.encode()


def view_path(directory: str) -> str:
    return os.path.join(directory, DATASET_FILE)


def has_view(path: str) -> bool:
    """Whether ``path`` is a folder holding a dataset view."""
    return os.path.isdir(path) and os.path.isfile(view_path(path))


def load_view(directory: str) -> DatasetView:
    """Parse ``directory/dataset.json`` (ViewError naming the file when it is not one)."""
    where = view_path(directory)
    try:
        with open(where, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ViewError(f"{where}: cannot read the dataset view ({e})") from None
    return parse_view(data, where)


def parse_view(data: bytes, where: str) -> DatasetView:
    """Parse the text of a dataset view read from ``where`` (ViewError naming it when it is not
    one)."""
    try:
        raw = json.loads(data)
        if raw.get("format") != DATASET_FORMAT or raw.get("version") != 1:
            raise ViewError(f"{where}: not a {DATASET_FORMAT} (version 1)")
        kind = raw["kind"]
        if kind not in ("video", "image"):
            raise ViewError(f"{where}: unknown kind {kind!r}")
        shards = [
            ShardListing(
                name=str(s["name"]),
                count=int(s["count"]),
                bytes=int(s["bytes"]),
                index=(int(s["index"][0]), int(s["index"][1])),
                records=int(s.get("records", -1)),
                deps=int(s.get("deps", -1)),
            )
            for s in raw["shards"]
        ]
        manifest = str(raw.get("manifest", MANIFEST_FILE))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        if isinstance(e, ViewError):
            raise
        raise ViewError(f"{where}: cannot read the dataset view ({e})") from None
    for s in shards:
        if os.path.basename(s.name) != s.name or s.count < 0:
            raise ViewError(f"{where}: bad shard entry {s.name!r}")
    return DatasetView(kind, shards, manifest)

"""Chunk files of a gulp directory and their ``.gmeta`` JSON: find, load, check, write.

A chunk is ``data_<i>.gulp`` (JPEG records) beside ``meta_<i>.gmeta``:
``{id: {"frame_info": [[offset, pad, length_with_pad], ...], "meta_data": [{...}, ...]}}``.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from kohakuclip.formats import GULP_ALIGNMENT, GULP_DATA_PATTERN, GULP_META_PATTERN
from kohakuclip.gulp.frames import GulpError

__all__ = [
    "ChunkFiles",
    "MetaDict",
    "chunk_paths",
    "dump_meta",
    "find_chunks",
    "frame_table",
    "is_gulp_directory",
    "load_meta",
    "next_chunk_number",
    "scan_directory",
    "write_json",
]


_DATA_NAME = re.compile(r"^data_(\d+)\.gulp$")
_META_NAME = re.compile(r"^meta_(\d+)\.gmeta$")

MetaDict = dict[str, Any]
"""The parsed content of one ``.gmeta`` file."""

_PICKLE_START = b"\x80"  # the PROTO opcode that begins every pickle of protocol 2 and later


@dataclass(frozen=True)
class ChunkFiles:
    """The two files of one chunk, by its number."""

    number: int
    data_path: str
    meta_path: str


def chunk_paths(root: str, number: int) -> ChunkFiles:
    """Where chunk ``number`` of the directory ``root`` lives."""
    return ChunkFiles(
        number,
        os.path.join(root, GULP_DATA_PATTERN.format(number)),
        os.path.join(root, GULP_META_PATTERN.format(number)),
    )


def scan_directory(root: str) -> tuple[list[ChunkFiles], list[str], list[str]]:
    """Complete chunks (sorted by number), data files without meta, meta files without data."""
    if not os.path.isdir(root):
        raise GulpError(f"{root}: not a directory")
    data: dict[int, str] = {}
    meta: dict[int, str] = {}
    for name in os.listdir(root):
        if match := _DATA_NAME.match(name):
            data[int(match.group(1))] = name
        elif match := _META_NAME.match(name):
            meta[int(match.group(1))] = name
    chunks = [chunk_paths(root, n) for n in sorted(data.keys() & meta.keys())]
    lone_data = [os.path.join(root, data[n]) for n in sorted(data.keys() - meta.keys())]
    lone_meta = [os.path.join(root, meta[n]) for n in sorted(meta.keys() - data.keys())]
    return chunks, lone_data, lone_meta


def find_chunks(root: str) -> list[ChunkFiles]:
    """The chunks of a gulp directory, sorted by number.

    A meta file without its data file is an unfinished write and is skipped; a data file
    without its meta file cannot be read and raises GulpError.
    """
    chunks, lone_data, _ = scan_directory(root)
    if lone_data:
        raise GulpError(f"{lone_data[0]}: data file without its meta file")
    return chunks


def next_chunk_number(root: str) -> int:
    """The first chunk number after every data or meta file already in ``root``."""
    if not os.path.isdir(root):
        return 0
    numbers = [
        int(m.group(1))
        for name in os.listdir(root)
        if (m := _DATA_NAME.match(name) or _META_NAME.match(name))
    ]
    return max(numbers, default=-1) + 1


def load_meta(path: str, duplicate_ids: list[str] | None = None) -> MetaDict:
    """Parse a ``.gmeta`` file (ids in file order); GulpError naming it when malformed.

    JSON keeps the last of repeated keys; pass a list as ``duplicate_ids`` to collect the ids
    that appear more than once in the file (slower: for checks, not for reading).
    """
    last_pairs: list[list[tuple[str, Any]]] = []

    def keep_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        last_pairs[:] = [pairs]
        return dict(pairs)

    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f, object_pairs_hook=keep_pairs if duplicate_ids is not None else None)
    except (OSError, ValueError) as exc:
        raise GulpError(f"{path}: unreadable meta file ({_why_unreadable(path, exc)})") from exc
    if not isinstance(meta, dict):
        raise GulpError(f"{path}: meta file is not a JSON object")
    if duplicate_ids is not None and last_pairs:
        seen: set[str] = set()
        for key, _ in last_pairs[0]:
            if key in seen:
                duplicate_ids.append(key)
            seen.add(key)
    for id_, entry in meta.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("frame_info"), list)):
            raise GulpError(f"{path}: id {id_!r} has no frame_info list")
        if not isinstance(entry.get("meta_data", []), list):
            raise GulpError(f"{path}: id {id_!r} has a meta_data that is not a list")
    return meta


def _why_unreadable(path: str, exc: Exception) -> str:
    """Why a meta file did not parse. GulpIO's ``GulpChunk(serializer=pickle_serializer)``
    writes pickles, which are named as such: they are not read here, since unpickling a file
    can run any code it holds."""
    try:
        with open(path, "rb") as f:
            pickled = f.read(1) == _PICKLE_START
    except OSError:
        pickled = False
    if pickled:
        return "a pickle (GulpIO's PickleSerializer), not JSON; convert it to JSON to read it"
    return str(exc)


def write_json(path: str, obj: Any) -> None:
    """Write a JSON file atomically (a temporary name, then a rename)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def dump_meta(meta: MetaDict, path: str) -> None:
    """Write a ``.gmeta`` file atomically."""
    write_json(path, meta)


def frame_table(meta: MetaDict, path: str) -> tuple[np.ndarray, np.ndarray]:
    """Per id the frame count, and all frames as int64 rows (offset, pad, length_with_pad).

    Checks that every frame is a well-formed record; GulpError naming ``path`` otherwise.
    """
    counts = np.fromiter((len(e["frame_info"]) for e in meta.values()), np.int64, len(meta))
    rows = [info for entry in meta.values() for info in entry["frame_info"]]
    try:
        table = np.array(rows, dtype=np.int64).reshape(-1, 3)
    except (ValueError, TypeError) as exc:
        raise GulpError(
            f"{path}: frame_info entries must be [offset, pad, length] ({exc})"
        ) from exc
    if len(table) != len(rows):
        raise GulpError(f"{path}: frame_info entries must be [offset, pad, length]")
    offset, pad, length = table[:, 0], table[:, 1], table[:, 2]
    bad = (offset < 0) | (pad < 0) | (pad >= GULP_ALIGNMENT) | (length <= pad)
    if bad.any():
        row = int(np.argmax(bad))
        owner = list(meta)[int(np.searchsorted(np.cumsum(counts), row, side="right"))]
        raise GulpError(f"{path}: id {owner!r} has a bad frame record {rows[row]}")
    return counts, table


def is_gulp_directory(path: str) -> bool:
    """Whether ``path`` is a directory holding gulp chunk files (what readers take it for)."""
    if not os.path.isdir(path):
        return False
    return any(_DATA_NAME.match(n) or _META_NAME.match(n) for n in os.listdir(path))

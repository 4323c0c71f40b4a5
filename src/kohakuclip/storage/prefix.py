"""The objects under a URL prefix (a URL ending in ``/``), for the readers' catalogs.

``s3://``, ``gs://`` and ``az://`` prefixes are listed by the store. Plain ``http(s)://`` has no
listing, so what is under a prefix is found from the files the writers put there, in this
order: the dataset view (``dataset.json``, from ``kohakuclip merge``: its shards and its
manifest), a writer's ``manifest.parquet`` (the shards its ``shard`` column names), or a GulpIO
directory (``meta_0.gmeta``, ``meta_1.gmeta`` ... up to the first number missing, each with its
``data_<i>.gulp``). The first round HEADs ``dataset.json``, ``manifest.parquet`` and chunk
0's two files at once; each shard found then costs a HEAD (all concurrent). Entries come as
the store's listing gives them: (URL, {"size", "e_tag" ...}).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kohakuclip.formats import (
    DATASET_FILE,
    GULP_DATA_PATTERN,
    GULP_META_PATTERN,
    MANIFEST_FILE,
)
from kohakuclip.gulp.index import GulpIndex, open_remote_gulp
from kohakuclip.storage.ranged import Objects
from kohakuclip.storage.remote import (
    ObjectStoreError,
    head_objects,
    list_objects,
    open_object,
)
from kohakuclip.storage.view import ViewError, parse_view

__all__ = ["list_prefix", "open_listed_gulp"]


Listing = list[tuple[str, dict[str, Any]]]


def list_prefix(prefix: str, options: Mapping[str, Any] | None = None) -> Listing:
    """(URL, listing entry) of the objects under ``prefix``, sorted: the store's listing, or for
    ``http(s)://`` the objects its ``dataset.json``, ``manifest.parquet`` or gulp meta files
    name (``ObjectStoreError`` naming the prefix and those files when it has none of them)."""
    if prefix.partition("://")[0].lower() not in ("http", "https"):
        return list_objects(prefix, options)
    first = [prefix + DATASET_FILE, prefix + MANIFEST_FILE, *_gulp_chunk(prefix, 0)]
    found = head_objects(first, options)
    if first[0] in found:
        view = _read(first[0], found, options)
        try:
            parsed = parse_view(view, first[0])
        except ViewError as e:
            raise ObjectStoreError(str(e)) from None
        names = [parsed.manifest, *(s.name for s in parsed.shards)]
        return _with_heads(prefix, found, [first[0]], names, options)
    if first[1] in found:
        try:
            table = pq.read_table(
                pa.BufferReader(_read(first[1], found, options)), columns=["shard"]
            )
        except (OSError, ValueError, KeyError) as e:
            raise ObjectStoreError(f"{first[1]}: cannot read the shard names ({e})") from None
        shards = sorted({str(name) for name in table.column("shard").to_pylist()})
        return _with_heads(prefix, found, [first[1]], shards, options)
    if first[2] in found or first[3] in found:
        return _gulp_listing(prefix, found, options)
    raise ObjectStoreError(
        f"{prefix}: a plain http(s) prefix cannot be listed, and none of {DATASET_FILE} (a merged "
        f"dataset), {MANIFEST_FILE} (a writer's output) or {GULP_META_PATTERN.format(0)} (a "
        "GulpIO directory) is under it: name the shards' URLs one by one"
    )


def _gulp_chunk(prefix: str, number: int) -> list[str]:
    """The meta and data file URLs of one gulp chunk."""
    return [prefix + GULP_META_PATTERN.format(number), prefix + GULP_DATA_PATTERN.format(number)]


def _read(
    url: str, found: Mapping[str, Mapping[str, Any]], options: Mapping[str, Any] | None
) -> bytes:
    obj = open_object(url, options, found[url])
    return obj.read(0, obj.size)


def _with_heads(
    prefix: str,
    found: Mapping[str, dict[str, Any]],
    known: list[str],
    names: list[str],
    options: Mapping[str, Any] | None,
) -> Listing:
    """The objects ``known`` (already HEADed) and those of ``names`` that exist (HEADed now)."""
    urls = [prefix + name for name in dict.fromkeys(names)]
    heads = {**head_objects([u for u in urls if u not in found], options), **found}
    return sorted((url, heads[url]) for url in {*known, *urls} if url in heads)


def _gulp_listing(
    prefix: str, found: Mapping[str, dict[str, Any]], options: Mapping[str, Any] | None
) -> Listing:
    """Gulp chunks 0, 1 ... up to the first number whose meta file is missing, and that
    number's data file if there is one (so that a data file without its meta file is an
    error, as in a listing). Chunks are HEADed in rounds of doubling size."""
    heads, probed, step, count = dict(found), 1, 1, 0
    while True:
        if count == probed:
            step *= 2
            urls = [u for n in range(probed, probed + step) for u in _gulp_chunk(prefix, n)]
            heads.update(head_objects(urls, options))
            probed += step
        if _gulp_chunk(prefix, count)[0] not in heads:
            break
        count += 1
    wanted = [u for n in range(count) for u in _gulp_chunk(prefix, n)]
    wanted.append(_gulp_chunk(prefix, count)[1])
    return sorted((url, heads[url]) for url in wanted if url in heads)


def open_listed_gulp(objects: Objects, prefix: str, listed: Listing) -> GulpIndex | None:
    """The gulp directory directly under ``prefix`` from its listing (each object registered
    with ``objects``; the ``.gmeta`` files read whole, frames later by ranged reads); None when
    there is none. Raises ``GulpError`` for a broken one."""
    sizes = {url: int(meta["size"]) for url, meta in listed}
    for url, meta in listed:
        objects.remote(url, meta)
    return open_remote_gulp(
        prefix, sizes, lambda url: objects.read(url, 0, sizes[url]), objects.read
    )

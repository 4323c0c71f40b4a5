"""A gulp directory in object storage (a URL prefix), opened for the datasets.

The prefix is listed and its ``.gmeta`` files read whole once, where the dataset is made; each
frame is then one ranged GET of its chunk's data file (a clip's frames concurrently). obstore's
I/O runtime does not survive a fork, so nothing opened travels with the dataset: the frame
reader keeps only URLs, their listing entries (size, ETag) and the storage options, and opens
its objects in each process on first use. Worker processes must start with "forkserver" or
"spawn": one forked after this process made requests raises ``ObjectStoreError`` saying so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from kohakuclip.gulp.adapters import Label2Idx, load_label2idx
from kohakuclip.gulp.frames import GulpError
from kohakuclip.gulp.index import GulpIndex, open_remote_gulp
from kohakuclip.storage.remote import (
    MissingObjectError,
    RemoteObject,
    adopt_store_environment,
    fetch_ranges,
    open_object,
    store_environment,
)

__all__ = ["RemoteFrames", "fetch_label2idx", "open_gulp_url"]


class RemoteFrames:
    """Reads frame records of a gulp directory's data files, opened per process from their
    listing entries (no HEAD); pickles without them, so it crosses to "spawn" and "forkserver"
    workers."""

    def __init__(
        self, entries: Mapping[str, Mapping[str, Any]], options: Mapping[str, Any]
    ) -> None:
        self.entries = {url: dict(entry) for url, entry in entries.items()}
        self.options = dict(options)
        self._objects: dict[str, RemoteObject] = {}
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        """Without open objects, with this process's object-storage credentials (a forkserver
        worker may lack them: see ``storage.remote.store_environment``)."""
        return {**self.__dict__, "_objects": {}, "_pid": -1, "_env": store_environment()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        adopt_store_environment(state.pop("_env", {}))
        self.__dict__.update(state)

    def _object(self, url: str) -> RemoteObject:
        """The object at ``url``, opened in this process (a fork's child opens its own)."""
        if self._pid != os.getpid():
            self._objects, self._pid = {}, os.getpid()
        obj = self._objects.get(url)
        if obj is None:
            obj = self._objects.setdefault(url, open_object(url, self.options, self.entries[url]))
        return obj

    def read_records(self, url: str, offsets: np.ndarray, sizes: np.ndarray) -> list[bytes]:
        """The records at ``offsets`` of the object at ``url``, fetched concurrently."""
        obj = self._object(url)
        wanted = [(obj, o, o + n) for o, n in zip(offsets.tolist(), sizes.tolist())]
        return [bytes(view) for view in fetch_ranges(wanted)]


def open_gulp_url(prefix: str, options: Mapping[str, Any]) -> GulpIndex:
    """The gulp directory under ``prefix`` (a URL; ``/`` is added when it lacks one): listed
    (plain ``http(s)://``: found from ``meta_0.gmeta`` on, see ``storage.prefix``), its
    ``.gmeta`` files read whole, its frames read later through a ``RemoteFrames``."""
    from kohakuclip.storage.prefix import list_prefix  # pyarrow: only for URL datasets

    prefix = prefix if prefix.endswith("/") else prefix + "/"
    listed = dict(list_prefix(prefix, options))
    frames = RemoteFrames({u: e for u, e in listed.items() if u.endswith(".gulp")}, options)
    sizes = {url: int(entry["size"]) for url, entry in listed.items()}
    index = open_remote_gulp(
        prefix,
        sizes,
        lambda url: open_object(url, options, listed[url]).read(0, sizes[url]),
        None,
        frames.read_records,
    )
    if index is None:
        raise GulpError(f"{prefix}: no gulp chunks (data_<i>.gulp + meta_<i>.gmeta)")
    return index


def fetch_label2idx(url: str, options: Mapping[str, Any]) -> Label2Idx:
    """The label map in the JSON object at ``url``; GulpError naming it when it is missing or
    not a label map."""
    try:
        obj = open_object(url, options)
    except MissingObjectError:
        raise GulpError(f"{url}: missing (pass label2idx= to the dataset)") from None
    try:
        parsed = json.loads(obj.read(0, obj.size))
    except ValueError as exc:
        raise GulpError(f"{url}: unreadable JSON ({exc})") from exc
    try:
        return load_label2idx(parsed)
    except GulpError as exc:
        raise GulpError(f"{url}: {exc}") from None

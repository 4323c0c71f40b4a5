"""Objects in object storage (``s3://``, ``gs://``, ``az://``, ``http(s)://``) read by byte ranges.

Built on ``obstore`` (Rust ``object_store``: ranged and concurrent GETs with the GIL released,
credentials from the standard environment variables and config files), an optional extra:
the ``[cloud]`` extra. ``file://`` URLs are plain local paths (``local_path``).

An object is opened with one HEAD (size and ETag); every later read is a ranged GET with
``If-Match: <etag>``, so an object replaced while a reader uses it is an error naming it, not
bytes from two versions. 5xx answers, dropped connections and timeouts are retried with
exponential backoff (obstore's retry layer, bounded by ``RETRY``); what still fails is an
``ObjectStoreError`` naming the URL. ``fetch_ranges`` reads many ranges of many objects at once:
ranges of one object that touch or overlap are coalesced into one request, and all requests run
concurrently.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, cast
from urllib.parse import unquote, urlsplit

import numpy as np

from kohakuclip.errors import KohakuClipError

__all__ = [
    "MissingObjectError",
    "ObjectStoreError",
    "RemoteObject",
    "adopt_store_environment",
    "delete_objects",
    "describe_error",
    "fetch_ranges",
    "gather_into",
    "head_objects",
    "is_store_failure",
    "is_url",
    "list_objects",
    "local_path",
    "open_object",
    "put_object",
    "request_counts",
    "store_environment",
    "store_for",
    "suffix_of",
]


REMOTE_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "adl", "azure", "http", "https")
# What a failing request is retried with before it becomes an error (obstore's retry layer).
RETRY: dict[str, Any] = {
    "max_retries": 4,
    "backoff": {"init_backoff": timedelta(milliseconds=50), "max_backoff": timedelta(seconds=2)},
    "retry_timeout": timedelta(seconds=30),
}
CLIENT = {"timeout": "30s", "connect_timeout": "5s"}
MAX_CONCURRENT = 32  # requests in flight per ``fetch_ranges`` call
# The variables (and files) each scheme's credentials come from, for the missing-credentials error.
CREDENTIAL_VARIABLES = {
    "s3": "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_ENDPOINT_URL, "
    "AWS_REGION, AWS_ALLOW_HTTP, AWS_PROFILE / ~/.aws/config, AWS_WEB_IDENTITY_TOKEN_FILE, "
    "the instance metadata service",
    "gs": "GOOGLE_SERVICE_ACCOUNT (or GOOGLE_APPLICATION_CREDENTIALS), GOOGLE_SERVICE_ACCOUNT_KEY, "
    "GOOGLE_ALLOW_HTTP, the gcloud application default credentials, the instance metadata "
    "service",
    "az": "AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY, "
    "AZURE_CLIENT_ID / AZURE_CLIENT_SECRET / AZURE_TENANT_ID, AZURE_STORAGE_USE_EMULATOR",
}


_COUNTS = {"requests": 0, "bytes": 0}
_COUNTS_LOCK = threading.Lock()

# obstore's I/O runtime (its threads) does not survive a fork: a request made in a process
# forked after this one made requests waits forever. Such a child raises instead.
_REQUESTS_MADE = False
_FORKED_AFTER_REQUESTS = False


def _note_fork() -> None:
    global _FORKED_AFTER_REQUESTS
    _FORKED_AFTER_REQUESTS = _FORKED_AFTER_REQUESTS or _REQUESTS_MADE


os.register_at_fork(after_in_child=_note_fork)


def _requests_allowed(url: str) -> None:
    """Raise ``ObjectStoreError`` naming ``url`` in a process forked after requests were made
    (they would never complete); else note that requests are made here."""
    global _REQUESTS_MADE
    if _FORKED_AFTER_REQUESTS:
        raise ObjectStoreError(
            f"{url}: object storage cannot be read in a process forked after its parent read "
            "object storage (obstore's runtime does not survive fork; requests would wait "
            "forever): start workers with 'forkserver' or 'spawn' (ClipLoader chooses "
            "'forkserver' for URL sources)"
        )
    _REQUESTS_MADE = True


_STORE_VARIABLES = ("AWS_", "GOOGLE_", "AZURE_")
"""Prefixes of the environment variables stores take credentials and endpoints from."""


def store_environment() -> dict[str, str]:
    """This process's credential and endpoint variables (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``)
    as they are now, for a worker process to ``adopt_store_environment``: a forkserver worker
    starts with the environment its server had when it started, which may predate them."""
    return {k: v for k, v in os.environ.items() if k.startswith(_STORE_VARIABLES)}


def adopt_store_environment(variables: Mapping[str, str]) -> None:
    """Set ``variables`` (from ``store_environment`` in the parent) in this process, where a
    worker that has made no request yet reads them when it first opens a store."""
    os.environ.update(variables)


def _count(requests: int, nbytes: int) -> None:
    with _COUNTS_LOCK:
        _COUNTS["requests"] += requests
        _COUNTS["bytes"] += nbytes


def request_counts() -> dict[str, int]:
    """Requests made and bytes received by this process so far (HEADs, listings, GETs)."""
    with _COUNTS_LOCK:
        return dict(_COUNTS)


class ObjectStoreError(KohakuClipError, OSError):
    """An object that cannot be read: missing, replaced, refused, or the store unreachable."""


class MissingObjectError(ObjectStoreError):
    """No object at the URL."""


def is_store_failure(error: BaseException) -> bool:
    """Whether ``error`` says the store failed (unreachable, refusing, still failing after the
    retries) rather than that an object is missing: the next attempt may well succeed, so a
    reader must not stand another item in for it and a writer must not log the source as
    skipped (a resumed run never retries those)."""
    return isinstance(error, ObjectStoreError) and not isinstance(error, MissingObjectError)


def is_url(source: str) -> bool:
    """True for an object-storage URL (``s3://``, ``gs://``, ``az://``, ``http(s)://``)."""
    scheme, sep, _ = source.partition("://")
    return bool(sep) and scheme.lower() in REMOTE_SCHEMES


def local_path(source: str) -> str:
    """``file://`` URLs as local paths; anything else unchanged."""
    if source.lower().startswith("file://"):
        return unquote(urlsplit(source).path)
    return source


def _family(scheme: str) -> str:
    if scheme in ("s3", "s3a"):
        return "s3"
    if scheme == "gs":
        return "gs"
    if scheme in ("http", "https"):
        return "http"
    return "az"


_ALLOW_HTTP = {"s3": "AWS_ALLOW_HTTP", "gs": "GOOGLE_ALLOW_HTTP", "az": "AZURE_ALLOW_HTTP"}
"""Per store family, the variable that lets its client speak plain http (an emulator, a gateway)."""


def _split(url: str) -> tuple[str, str]:
    """(the store's root URL, the object's key under it)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}/", unquote(parts.path.lstrip("/"))


def _credential_problem(text: str) -> bool:
    lowered = text.lower()
    return any(
        word in lowered
        for word in ("credential", "169.254.169.254", "api/token", "unauthenticated", "metadata")
    )


def describe_error(url: str, error: BaseException) -> ObjectStoreError:
    """An obstore exception as an ``ObjectStoreError`` naming ``url`` (and, for a credentials
    problem, the variables credentials are read from)."""
    if isinstance(error, ObjectStoreError):
        return error
    from obstore import exceptions

    text = str(error).split("\n\nDebug source:")[0].strip()
    family = _family(url.partition("://")[0].lower())
    if isinstance(error, FileNotFoundError):
        return MissingObjectError(f"{url}: no such object")
    if isinstance(error, exceptions.PreconditionError):
        return ObjectStoreError(f"{url}: the object changed while it was read (ETag mismatch)")
    if family in CREDENTIAL_VARIABLES and (
        isinstance(error, (exceptions.UnauthenticatedError, exceptions.PermissionDeniedError))
        or _credential_problem(text)
    ):
        return ObjectStoreError(
            f"{url}: no usable credentials ({text[:200]}); read from: "
            f"{CREDENTIAL_VARIABLES[family]}; or pass storage_options="
        )
    return ObjectStoreError(f"{url}: {text[:500]}")


def _obstore(url: str) -> Any:
    """The ``obstore`` module, or an ``ObjectStoreError`` naming ``url`` and the extra that
    installs it."""
    try:
        import obstore
        import obstore.store
    except ImportError:
        raise ObjectStoreError(
            f"{url}: object storage needs obstore (pip install obstore, or kohakuclip's [cloud] "
            "extra)"
        ) from None
    return obstore


class _Stores:
    """One obstore store per (root URL, options) in this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stores: dict[tuple[str, str, int], Any] = {}

    def get(self, root: str, options: Mapping[str, Any] | None) -> Any:
        key = (root, repr(sorted((options or {}).items())), os.getpid())
        with self._lock:
            store = self._stores.get(key)
        if store is not None:
            return store
        from_url = _obstore(root).store.from_url
        settings = dict(options or {})
        client = {**CLIENT, **settings.pop("client_options", {})}
        # explicit client options replace the ones read from the environment: keep
        # AWS_ALLOW_HTTP / GOOGLE_ALLOW_HTTP / AZURE_ALLOW_HTTP (and plain http:// stores,
        # which need it) working
        family = _family(root.partition("://")[0].lower())
        variable = _ALLOW_HTTP.get(family, "")
        if family == "http" or os.environ.get(variable, "").lower() in ("1", "true"):
            client.setdefault("allow_http", True)
        retry = {**RETRY, **settings.pop("retry_config", {})}
        try:
            make: Any = from_url
            store = make(root, client_options=client, retry_config=retry, **settings)
        except Exception as e:
            raise describe_error(root, e) from None
        with self._lock:
            return self._stores.setdefault(key, store)


_STORES = _Stores()


@dataclass(frozen=True)
class RemoteObject:
    """One object: where it is, its size and the ETag every read must match."""

    url: str
    store: Any
    key: str
    size: int
    etag: str | None
    cache: Any = None  # a ``storage.cache.BlockCache``, or None

    @property
    def name(self) -> str:
        return self.url

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer only where the object ends first)."""
        if length <= 0 or offset >= self.size:
            return b""
        return bytes(fetch_ranges([(self, offset, offset + length)])[0])


def store_for(url: str, options: Mapping[str, Any] | None = None) -> tuple[Any, str]:
    """(the obstore store, the object's key) for ``url``."""
    root, key = _split(url)
    return _STORES.get(root, options), key


def open_object(
    url: str,
    options: Mapping[str, Any] | None = None,
    meta: Mapping[str, Any] | None = None,
    cache: Any = None,
) -> RemoteObject:
    """The object at ``url``: one HEAD, unless ``meta`` (a listing's entry) already says.
    ``cache``: a ``storage.cache.BlockCache`` its reads go through."""
    root, key = _split(url)
    store = _STORES.get(root, options)
    if meta is None:
        obstore = _obstore(url)
        _requests_allowed(url)
        _count(1, 0)
        try:
            meta = obstore.head(store, key)
        except Exception as e:
            raise describe_error(url, e) from None
    return RemoteObject(url, store, key, int(meta["size"]), meta.get("e_tag"), cache)


async def _head(url: str, store: Any, key: str, gate: asyncio.Semaphore) -> dict[str, Any] | None:
    obstore = _obstore(url)
    async with gate:
        try:
            return dict(await obstore.head_async(store, key))
        except FileNotFoundError:
            return None
        except Exception as e:
            raise describe_error(url, e) from None


async def _head_all(wanted: list[tuple[str, Any, str]]) -> list[dict[str, Any] | None]:
    gate = asyncio.Semaphore(MAX_CONCURRENT)
    return await asyncio.gather(*(_head(url, store, key, gate) for url, store, key in wanted))


def head_objects(
    urls: Sequence[str], options: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """URL -> HEAD answer (size, ETag) of each of ``urls`` that exists, all requested at once
    (``MAX_CONCURRENT`` in flight); a missing object is left out, other failures raise."""
    wanted = [(url, *store_for(url, options)) for url in urls]
    if wanted:
        _requests_allowed(wanted[0][0])
    _count(len(wanted), 0)
    found = _run(_head_all(wanted)) if wanted else []
    return {url: meta for (url, _, _), meta in zip(wanted, found) if meta is not None}


def list_objects(
    prefix: str, options: Mapping[str, Any] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """(URL, listing entry) of every object under ``prefix`` (a URL ending in ``/``), sorted."""
    obstore = _obstore(prefix)
    root, key = _split(prefix)
    store = _STORES.get(root, options)
    _requests_allowed(prefix)
    _count(1, 0)
    try:
        entries = [m for chunk in obstore.list(store, key or None) for m in chunk]
    except Exception as e:
        raise describe_error(prefix, e) from None
    found = [(root + str(m["path"]), dict(m)) for m in entries]
    return sorted(found, key=lambda item: item[0])


def put_object(
    url: str, body: bytes | os.PathLike[str], options: Mapping[str, Any] | None = None
) -> None:
    """Write the object at ``url``: ``body`` is its bytes, or a local file's path.

    Args:
        url: where the object goes.
        body: the bytes, or the path (``os.PathLike``) of a file to upload.
        options: the ``storage_options`` of the store.
    """
    obstore = _obstore(url)
    store, key = store_for(url, options)
    _requests_allowed(url)
    _count(1, 0)
    try:
        obstore.put(store, key, body if isinstance(body, bytes) else Path(body))
    except Exception as e:
        raise describe_error(url, e) from None


def delete_objects(urls: Sequence[str], options: Mapping[str, Any] | None = None) -> None:
    """Delete the objects ``urls`` (of one store), in bulk where the store can.

    Args:
        urls: the objects, all under one store root.
        options: the ``storage_options`` of the store.
    """
    if not urls:
        return
    obstore = _obstore(urls[0])
    store, _ = store_for(urls[0], options)
    try:
        obstore.delete(store, [store_for(url, options)[1] for url in urls])
    except Exception as e:
        raise describe_error(urls[0], e) from None


def _coalesce(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted ranges merged where they touch or overlap."""
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _bare_etag(tag: str) -> str:
    """An ETag without its quotes (and weak mark): Azure lists them bare, and quotes them in
    the headers of the same object's reads."""
    return tag.removeprefix("W/").strip('"')


def _header_etag(url: str, tag: str) -> str:
    """``tag`` as an ``If-Match`` header carries it: an Azure listing's bare ETag quoted, as
    Azure's own headers have it; any other store's as it gave it (a server that sends bare
    ETags may compare If-Match as plain text)."""
    bare = not tag.startswith(('"', "W/"))
    return f'"{tag}"' if bare and _family(url.partition("://")[0].lower()) == "az" else tag


async def _get(obj: RemoteObject, start: int, end: int, gate: asyncio.Semaphore) -> Any:
    obstore = _obstore(obj.url)
    options: dict[str, Any] = {"range": (start, end)}
    if obj.etag:
        options["if_match"] = _header_etag(obj.url, obj.etag)
    async with gate:
        try:
            result = await obstore.get_async(obj.store, obj.key, options=cast(Any, options))
            data = await result.bytes_async()
        except Exception as e:
            raise describe_error(obj.url, e) from None
    tag = result.meta.get("e_tag")
    if obj.etag and tag and _bare_etag(tag) != _bare_etag(obj.etag):  # If-Match ignored
        raise ObjectStoreError(f"{obj.url}: the object changed while it was read (ETag mismatch)")
    return data


async def _get_all(requests: list[tuple[RemoteObject, int, int]]) -> list[Any]:
    gate = asyncio.Semaphore(MAX_CONCURRENT)
    return await asyncio.gather(*(_get(o, a, b, gate) for o, a, b in requests))


def _cached_blocks(
    obj: RemoteObject, ranges: list[tuple[int, int]], located: list[tuple[int, int, memoryview]]
) -> list[tuple[int, int]]:
    """The cache's blocks covering ``ranges`` into ``located``; returns the byte ranges of the
    missing ones (adjacent blocks merged)."""
    cache, block = obj.cache, obj.cache.block
    numbers = sorted(
        {n for a, b in ranges if b > a for n in range(a // block, (b - 1) // block + 1)}
    )
    missing: list[tuple[int, int]] = []
    for n in numbers:
        a, b = n * block, min((n + 1) * block, obj.size)
        data = cache.get(obj.url, obj.etag, n, b - a)
        if data is not None:
            located.append((a, b, memoryview(data)))
        elif missing and missing[-1][1] == a:
            missing[-1] = (missing[-1][0], b)
        else:
            missing.append((a, b))
    return missing


def _piece(pieces: list[tuple[int, int, memoryview]], start: int, end: int) -> memoryview:
    """Bytes ``start:end`` from pieces that cover them."""
    for a, b, view in pieces:
        if a <= start and end <= b:
            return view[start - a : end - a]
    parts = [
        view[max(start, a) - a : min(end, b) - a]
        for a, b, view in sorted(pieces, key=lambda p: p[0])
        if a < end and b > start
    ]
    return memoryview(b"".join(parts))


def fetch_ranges(wanted: Sequence[tuple[RemoteObject, int, int]]) -> list[memoryview]:
    """The bytes of each (object, start, end) range, fetched concurrently (ranges of one object
    that touch or overlap coalesced into one GET; objects with a cache: its missing blocks).
    A range past the object's end is an error."""
    by_object: dict[str, tuple[RemoteObject, list[tuple[int, int]]]] = {}
    for obj, start, end in wanted:
        if start < 0 or end > obj.size or end < start:
            raise ObjectStoreError(
                f"{obj.url}: range {start}-{end} outside the object ({obj.size} bytes)"
            )
        by_object.setdefault(obj.url, (obj, []))[1].append((start, end))
    located: dict[str, list[tuple[int, int, memoryview]]] = {url: [] for url in by_object}
    requests: list[tuple[RemoteObject, int, int]] = []
    for url, (obj, ranges) in by_object.items():
        runs = _cached_blocks(obj, ranges, located[url]) if obj.cache else _coalesce(ranges)
        requests.extend((obj, a, b) for a, b in runs if b > a)
    if requests:
        _requests_allowed(requests[0][0].url)
    fetched = _run(_get_all(requests)) if requests else []
    _count(len(requests), sum(len(b) for b in fetched))
    for (obj, a, b), data in zip(requests, fetched):
        view = memoryview(data)
        if len(view) != b - a:
            raise ObjectStoreError(f"{obj.url}: short read ({len(view)} of {b - a} bytes at {a})")
        located[obj.url].append((a, b, view))
        if obj.cache:
            block = obj.cache.block
            for start in range(a, b, block):
                obj.cache.put(
                    obj.url, obj.etag, start // block, view[start - a : min(b, start + block) - a]
                )
    return [
        _piece(located[obj.url], start, end) if end > start else memoryview(b"")
        for obj, start, end in wanted
    ]


def _run(coroutine: Any) -> Any:
    """Run ``coroutine`` to completion on this thread (decode threads have no event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    result: list[Any] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            result.append(asyncio.run(coroutine))
        except BaseException as e:
            failure.append(e)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def gather_into(
    wanted: Sequence[tuple[RemoteObject, int, int]],
    ready: Mapping[tuple[str, int, int], Any] | None = None,
) -> tuple[np.ndarray, list[int]]:
    """The ranges fetched (``fetch_ranges``; those in ``ready``, keyed by (URL, start, length),
    taken from it) into one uint8 buffer, and each range's start in it."""
    ready = ready or {}
    keys = [(obj.url, a, b - a) for obj, a, b in wanted]
    missing = [w for w, key in zip(wanted, keys) if key not in ready]
    got = iter(fetch_ranges(missing))
    views = [ready[key] if key in ready else next(got) for key in keys]
    starts = np.cumsum([0, *(len(v) for v in views)]).tolist()
    # one bytes.join: one GIL hand-off at most, not one per range as numpy's copies make
    joined = bytearray().join(views) if starts[-1] else bytearray(1)
    return np.frombuffer(joined, np.uint8), starts[:-1]


def suffix_of(url: str) -> str:
    """The object name's extension, lower case (``.zip``, ``.mp4`` ...)."""
    return os.path.splitext(urlsplit(url).path)[1].lower()

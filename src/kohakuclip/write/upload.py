"""Writers' output in object storage: each run is built in a local staging folder, then uploaded.

Shards go up first and the sidecars (``manifest.parquet``, ``encoding.json``, ``skipped.jsonl``,
a dataset view ...) last, each object with one PUT or a multipart upload (obstore picks by
size); an object becomes visible only once its upload completes, so a crashed writer leaves no
half-written object (an interrupted multipart upload stays invisible). A resumed run keeps its
staging folder (``--staging``) and uploads only what the bucket does not already hold at the
same size.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from kohakuclip.errors import os_error_text
from kohakuclip.formats import SHARD_SUFFIXES
from kohakuclip.storage.remote import (
    ObjectStoreError,
    is_url,
    list_objects,
    put_object,
)
from kohakuclip.write.parts import OutputNames, Part, holds_run

__all__ = ["nothing_stored", "output_arguments", "run_staged", "skip_log", "staged_main"]


def _order(name: str) -> tuple[int, str]:
    return (0 if name.endswith(SHARD_SUFFIXES) else 1, name)


def _prefix(url: str) -> str:
    return url if url.endswith("/") else url + "/"


def present_objects(url: str, options: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Size by URL of every object under the prefix ``url`` (ObjectStoreError when the store
    cannot be reached or refuses the credentials)."""
    return {found: int(meta["size"]) for found, meta in list_objects(_prefix(url), options)}


def upload_folder(
    local: str,
    url: str,
    options: Mapping[str, Any] | None = None,
    present: Mapping[str, int] | None = None,
) -> list[tuple[str, int]]:
    """Upload every file under ``local`` to the prefix ``url`` (ending in ``/``), shards first,
    skipping objects already there with the same size (``present``: a listing taken earlier);
    returns (URL, bytes) of each upload."""
    prefix = _prefix(url)
    present = present_objects(prefix, options) if present is None else present
    names = []
    for folder, _, files in os.walk(local):
        for name in files:
            names.append(os.path.relpath(os.path.join(folder, name), local).replace(os.sep, "/"))
    uploaded = []
    for name in sorted(names, key=_order):
        path = os.path.join(local, name)
        size = os.path.getsize(path)
        target = prefix + name
        if present.get(target) == size:
            continue
        put_object(target, Path(path), options)
        uploaded.append((target, size))
    return uploaded


@dataclass
class Staging:
    """Where a run is built; set ``done`` when it succeeded (only then is it uploaded)."""

    folder: str
    done: bool = False


class _EarlierRun(Exception):
    """The output prefix holds a run the new one would clash with (no --resume)."""


@contextmanager
def staged(
    out: str, staging: str | None = None, clashes: Callable[[list[str]], bool] | None = None
) -> Iterator[Staging]:
    """The folder a writer builds into for the output URL ``out``: ``staging`` (kept, for
    ``--resume``), or a temporary one removed afterwards; uploaded at the end of the block when
    marked done. The prefix is listed first: an unreachable store or bad credentials fail
    before anything is encoded, and so does a prefix whose object names ``clashes`` says hold
    an earlier run."""
    present = present_objects(out)
    if clashes is not None and clashes([url[len(_prefix(out)) :] for url in present]):
        raise _EarlierRun(
            f"{out}: holds an earlier run; pass --resume (with its --staging) to continue it, "
            "or choose another prefix"
        )
    folder = staging or tempfile.mkdtemp(prefix="kohakuclip-upload-")
    os.makedirs(folder, exist_ok=True)
    stage = Staging(folder)
    try:
        yield stage
        if stage.done:
            upload_folder(folder, out, present=present)
    finally:
        if staging is None:
            shutil.rmtree(folder, ignore_errors=True)


def output_arguments(parser: argparse.ArgumentParser) -> None:
    """A writer CLI's ``out`` (a folder or a URL prefix) and ``--staging``."""
    parser.add_argument(
        "out",
        help="output folder, or a URL prefix (s3://bucket/prefix/ ...: built in --staging, "
        "then uploaded)",
    )
    parser.add_argument(
        "--staging",
        default=None,
        help="local folder a URL output is built in (kept: --resume reuses it and uploads "
        "only what the bucket lacks; default: a temporary folder)",
    )


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread like KeyboardInterrupt so the writer cleans up."""


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the clean-up
    raise _Terminated


def skip_log(out: str, part: str | None) -> str:
    """Where a run's (a part's) skip log is, for messages: under ``out``, a folder or URL."""
    return f"{out.rstrip('/')}/{OutputNames(Part.parse(part) if part else None).skipped}"


def nothing_stored(
    prog: str,
    kind: str,
    stored: int,
    skipped: int,
    part: str | None,
    sources: Sequence[str],
    log: str,
) -> bool:
    """Whether a whole run stored nothing, saying so on stderr (``kind``: "videos" or
    "images"): every input skipped, or none found. A part that stores nothing is normal (its
    block may be empty or all bad; merge still needs its files)."""
    if stored or part is not None:
        return False
    if skipped:
        what = f"0 of {skipped} {kind} stored, see {log}"
    else:
        what = f"no {kind} found under {', '.join(sources)}"
    print(f"{prog}: error: {what}", file=sys.stderr)
    return True


def staged_main(
    parser: argparse.ArgumentParser,
    write: Callable[[argparse.Namespace, str], int],
    argv: Sequence[str] | None,
    check: Callable[[argparse.Namespace], None] | None = None,
) -> int:
    """A writer CLI (``output_arguments`` in its parser): ``write(args, folder)``, staged.

    ``check`` validates the options up front (a ValueError is a usage error). Ctrl-C (exit
    status 130) and SIGTERM (143) stop it after the writer removed its partial files; an output
    it cannot write is an error naming the path (2)."""
    args = parser.parse_args(argv)
    if args.staging is not None and not is_url(args.out):
        parser.error("--staging is for a URL output (s3://bucket/prefix/ ...) only")
    if check is not None:
        try:
            check(args)
        except ValueError as e:
            parser.error(str(e))
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    if main_thread and previous is None:  # a handler installed outside Python
        previous = signal.SIG_DFL
    part = Part.parse(args.part) if args.part else None
    clashes = None if args.resume else partial(holds_run, part=part)
    try:
        return run_staged(
            args.out, args.staging, lambda out: write(args, out), parser.prog, clashes
        )
    except KeyboardInterrupt:
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print(f"{parser.prog}: terminated", file=sys.stderr)
        return 143
    except OSError as e:
        print(f"{parser.prog}: error: {os_error_text(e)}", file=sys.stderr)
        return 2
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def run_staged(
    out: str,
    staging: str | None,
    write: Callable[[str], int],
    prog: str,
    clashes: Callable[[list[str]], bool] | None = None,
) -> int:
    """A CLI writer's run for ``out`` (a local folder, or a URL: staged, then uploaded, also
    when it stored nothing (exit status 1): its skip log says why); returns its exit status.
    ``clashes``: see ``staged``."""
    if not is_url(out):
        return write(out)
    try:
        with staged(out, staging, clashes) as stage:
            code = write(stage.folder)
            stage.done = code in (0, 1)
    except (ObjectStoreError, _EarlierRun) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return code

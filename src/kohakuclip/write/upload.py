"""Where a writer's files go: a local folder, or a URL prefix built in a local staging folder and
uploaded shard by shard.

A URL output (``s3://bucket/prefix/`` ...) is listed first: an unreachable store, refused
credentials or a prefix holding an earlier run (without ``resume``) fail before anything is
encoded. The run is then built in a staging folder (``staging=`` / ``--staging``, or a temporary
one). Each shard is uploaded as soon as it is finished, then the files that let a run resume it
(its manifest rows and the run's settings, in the run's hidden pending folder,
``OutputNames.pending``), and its local copy is removed. The sidecars (``manifest.parquet``,
``encoding.json``, ``skipped.jsonl``) go up last, when the run (part) finishes, and then the
pending objects are deleted. Uploads run in a background thread, in the order the shards were
finished, so the encoders never wait for the network: staging holds at most the shard being
written and two finished ones, and a run that stops (an error, Ctrl-C, SIGTERM) first lets the
finished shards' uploads end. Each object is one PUT or a multipart upload (obstore picks by size)
and becomes visible only once complete, so a writer killed anywhere (SIGKILL, a lost node) loses
at most the shard it was writing and the finished ones still waiting to go up. A resumed run, on
any node and with any staging folder, first downloads what its staging folder lacks of the run's
small files (the job's ``encoding.json``, the run's pending folder and sidecars; never a shard)
and continues after the shards the prefix holds.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from kohakuclip.errors import KohakuClipError, os_error_text
from kohakuclip.formats import ENCODING_FILE, SHARD_SUFFIXES
from kohakuclip.storage.remote import (
    delete_objects,
    is_url,
    list_objects,
    open_object,
    put_object,
)
from kohakuclip.write._atomic import write_atomically
from kohakuclip.write.parts import OutputNames, Part, earlier_run

__all__ = [
    "Output",
    "StagedOutput",
    "WriteError",
    "check_staging",
    "nothing_stored",
    "output",
    "output_arguments",
    "present_objects",
    "skip_log",
    "staged",
    "writer_main",
]


class WriteError(KohakuClipError, RuntimeError):
    """The output folder (or URL prefix) cannot be used (a previous run there, with other
    settings)."""


def _order(name: str, last: str) -> tuple[int, str]:
    """Shards first, then the sidecars, ``last`` at the end."""
    return (0 if name.endswith(SHARD_SUFFIXES) else 2 if name == last else 1, name)


def _prefix(url: str) -> str:
    return url if url.endswith("/") else url + "/"


def present_objects(url: str) -> dict[str, int]:
    """Size of every object under the prefix ``url``, by its name under the prefix (``a/b`` for
    one in a sub-folder); ObjectStoreError when the store cannot be reached or refuses the
    credentials."""
    prefix = _prefix(url)
    return {found[len(prefix) :]: int(meta["size"]) for found, meta in list_objects(prefix)}


def _files_of(local: str, names: OutputNames) -> list[str]:
    """The run's (part's) files under the staging folder ``local``, by their names under it
    (``a/b`` in a sub-folder): its shards, manifest, skip log, record, the job's
    ``encoding.json``, its pending folder and its files half-written. Another run sharing the
    folder (a part beside it, anything else) is never touched."""
    found = []
    for folder, _, files in os.walk(local):
        for file in files:
            name = os.path.relpath(os.path.join(folder, file), local).replace(os.sep, "/")
            top = name.split("/")[0]
            if top == names.pending or ("/" not in name and _is_run_file(name, names)):
                found.append(name)
    return found


def _is_run_file(name: str, names: OutputNames) -> bool:
    return names.owns(name) or names.temporary(name) or name in (names.record, ENCODING_FILE)


@dataclass
class Output:
    """A writer's local output folder: its finished shards stay in it."""

    folder: str

    @property
    def name(self) -> str:
        """The output, as messages and results name it."""
        return self.folder

    def path_of(self, name: str) -> str:
        """Where the output's file ``name`` is, as results name it."""
        return os.path.join(self.folder, name)

    def has_shard(self, shard: str) -> bool:
        """Whether the finished ``shard`` is kept (in the folder)."""
        return os.path.isfile(os.path.join(self.folder, shard))

    def publish(self, shard: str, state: Sequence[str]) -> None:
        """Hand over the finished ``shard`` and the ``state`` files (names under the folder)
        that let a resumed run keep it: a local folder keeps them where they are."""

    def drain(self) -> None:
        """Wait until every finished shard was handed over (a URL output's uploads end); raise
        the first upload that failed."""

    def read_beside(self, wanted: Callable[[str], bool]) -> dict[str, bytes]:
        """The output's top-level files whose names ``wanted`` takes, read whole: what other
        runs beside this one left (e.g. the records of a job's other parts)."""
        found = {}
        for name in sorted(os.listdir(self.folder)):
            path = os.path.join(self.folder, name)
            if wanted(name) and os.path.isfile(path):
                with open(path, "rb") as f:
                    found[name] = f.read()
        return found


@dataclass
class StagedOutput(Output):
    """The URL prefix ``url`` (``out`` as given) built in the staging ``folder`` for the run
    (part) ``names``; see the module doc. ``present``: the objects under the prefix by name,
    with their sizes (the listing taken at the start, then each upload)."""

    out: str
    url: str
    names: OutputNames
    present: dict[str, int]
    _queue: queue.Queue[tuple[str, list[str]] | None] = field(
        default_factory=lambda: queue.Queue(maxsize=1), init=False, repr=False
    )
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _failure: BaseException | None = field(default=None, init=False, repr=False)
    _abandoned: bool = field(default=False, init=False, repr=False)

    @property
    def name(self) -> str:
        return self.out

    def path_of(self, name: str) -> str:
        return self.url + name

    def has_shard(self, shard: str) -> bool:
        """Whether the finished ``shard`` is kept: in the bucket, or still in staging."""
        return shard in self.present or super().has_shard(shard)

    def publish(self, shard: str, state: Sequence[str]) -> None:
        """Queue the finished ``shard`` and its ``state`` files for the upload thread, which
        sends the shard, removes its local copy, then sends the state files (the object that
        records a shard never comes before the shard). Returns at once unless a finished shard
        is already waiting; an upload that failed is raised here (or by ``finish``)."""
        self._raise_failure()
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._upload_queued, name="kohakuclip-upload", daemon=True
            )
            self._thread.start()
        self._queue.put((shard, list(state)))

    def _upload_queued(self) -> None:
        """The upload thread: each queued shard and its state files, until ``None``; after a
        failure, or once abandoned, the rest is only taken off the queue (``publish`` must not
        wait forever). It looks at the queue every second too: a signal that interrupted
        ``publish`` between its append and its wake-up call leaves an item nobody announced."""
        while True:
            try:
                item = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            if item is None:
                return
            if self._failure is not None or self._abandoned:
                continue
            shard, state = item
            try:
                for name in (shard, *state):
                    if self._abandoned:
                        break
                    self._put(name)
                    if name == shard:
                        os.remove(self._local(shard))
            except BaseException as e:
                self._failure = e

    def drain(self) -> None:
        if self._thread is not None:
            try:
                self._queue.put(None)
                self._thread.join()
            except BaseException:  # a second Ctrl-C: no further object goes up
                self._abandoned = True
                raise
            self._thread = None
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    def read_beside(self, wanted: Callable[[str], bool]) -> dict[str, bytes]:
        """The prefix's objects (top level) whose names ``wanted`` takes, and those in staging
        not uploaded yet (a part sharing the staging folder); staging's copy first."""
        found = {
            name: open_object(self.url + name, meta={"size": size}).read(0, size)
            for name, size in sorted(self.present.items())
            if "/" not in name and wanted(name)
        }
        return found | super().read_beside(wanted)

    def finish(self) -> None:
        """The run (part) succeeded: upload its files in staging the prefix lacks at the same
        size (its sidecars; never a file half-written or the pending folder; the run's record
        last: the image writer takes it to mean the run finished), then delete the run's
        pending objects."""
        self.drain()
        pending = self.names.pending + "/"
        ready = [
            name
            for name in _files_of(self.folder, self.names)
            if not (self.names.temporary(name) or name.startswith(pending))
        ]
        for name in sorted(ready, key=lambda name: _order(name, self.names.record)):
            if self.present.get(name) != os.path.getsize(self._local(name)):
                self._put(name)
        delete_objects([self.url + name for name in self.present if name.startswith(pending)])

    def fetch_state(self) -> None:
        """Make staging hold what the bucket holds of the run: its files there (a staging folder
        kept from an earlier attempt may be stale: another node may have gone on since) are
        removed, and the objects it resumes from (``_state_names``) downloaded."""
        for name in _files_of(self.folder, self.names):
            os.remove(self._local(name))
        for name in _state_names(self.present, self.names):
            path = self._local(name)
            size = self.present[name]
            data = open_object(self.url + name, meta={"size": size}).read(0, size)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomically(path, data)

    def _local(self, name: str) -> str:
        return os.path.join(self.folder, *name.split("/"))

    def _put(self, name: str) -> None:
        path = self._local(name)
        put_object(self.url + name, Path(path))
        self.present[name] = os.path.getsize(path)


def _state_names(present: Collection[str], names: OutputNames) -> list[str]:
    """The objects the run (part) ``names`` resumes from: the job's ``encoding.json``, the
    run's record, manifest and skip log, and its pending folder; never a shard."""
    wanted = {ENCODING_FILE, names.record, names.manifest, names.skipped}
    pending = names.pending + "/"
    return sorted(name for name in present if name in wanted or name.startswith(pending))


def _refuse_earlier(out: str, present: Collection[str], names: OutputNames) -> None:
    """Refuse a prefix whose objects show an earlier run a new one would clash with
    (``parts.earlier_run``, over the names as a folder listing shows them)."""
    found = earlier_run({name.split("/")[0] for name in present}, names.part)
    if found is not None:
        what = "an earlier run" + ("" if names.part is None else f" of part {names.part}")
        raise WriteError(
            f"{out}: holds {what} ({found}); pass resume=True (--resume) to continue it, "
            "or choose another prefix"
        )


@contextmanager
def staged(
    out: str, staging: str | None, names: OutputNames, resume: bool
) -> Iterator[StagedOutput]:
    """The run (part) ``names`` at the URL prefix ``out``, built in ``staging`` (kept) or in a
    temporary folder (removed afterwards), with its state fetched; its sidecars go up when the
    block ends without an error. The prefix is listed before the folder is made (see the module
    doc): ObjectStoreError, or WriteError for an earlier run without ``resume``. A block that
    raises first lets the finished shards' uploads end (a second Ctrl-C abandons them); an
    upload failing then is dropped: the block's own exception is the one raised."""
    url = _prefix(out)
    present = present_objects(url)
    if not resume:
        _refuse_earlier(out, present, names)
    folder = staging or tempfile.mkdtemp(prefix="kohakuclip-upload-")
    try:
        os.makedirs(folder, exist_ok=True)
        stage = StagedOutput(folder, out, url, names, present)
        stage.fetch_state()
        try:
            yield stage
        except BaseException:
            with suppress(Exception):
                stage.drain()
            raise
        stage.finish()
    finally:
        if staging is None:
            shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def output(out: str, staging: str | None, names: OutputNames, resume: bool) -> Iterator[Output]:
    """Where the run (part) ``names`` writes for the block: the local folder ``out``, or the
    URL prefix ``out`` built in ``staging`` (``staged``)."""
    if not is_url(out):
        yield Output(out)
        return
    with staged(out, staging, names, resume) as stage:
        yield stage


def check_staging(out: str, staging: str | None) -> None:
    """Refuse a staging folder for a local output: ValueError naming both."""
    if staging is not None and not is_url(out):
        raise ValueError(
            f"staging (--staging) is for a URL output (s3://bucket/prefix/ ...) only; {out} is "
            "a local folder"
        )


def output_arguments(parser: argparse.ArgumentParser) -> None:
    """A writer CLI's ``out`` (a folder or a URL prefix) and ``--staging``."""
    parser.add_argument(
        "out",
        help="output folder, or a URL prefix (s3://bucket/prefix/ ...: built in --staging, each "
        "shard uploaded once finished, the manifest and settings last)",
    )
    parser.add_argument(
        "--staging",
        default=None,
        help="local folder a URL output is built in (it holds the shard in progress and the "
        "small files; default: a temporary folder); --resume needs no particular one",
    )


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread like KeyboardInterrupt so the writer cleans up."""


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the clean-up
    raise _Terminated


def skip_log(out: str, part: str | None) -> str:
    """Where a run's (a part's) skip log is, for messages: under ``out``, a folder or URL."""
    return f"{out.rstrip('/')}/{OutputNames(Part.parse(part) if part else None).skipped}"


def _first_reason(log: str) -> str:
    """``; the first: <source>: <reason>`` from a local skip log's first line, or nothing."""
    try:
        with open(log, encoding="utf-8") as f:
            entry = json.loads(f.readline())
        source, reason = str(entry["source"]), str(entry["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return f"; the first: {reason if reason.startswith(source) else f'{source}: {reason}'}"


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
        what = f"0 of {skipped} {kind} stored, see {log}" + _first_reason(log)
    else:
        what = f"no {kind} found under {', '.join(sources)}"
    print(f"{prog}: error: {what}", file=sys.stderr)
    return True


def writer_main(
    parser: argparse.ArgumentParser,
    write: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None,
    check: Callable[[argparse.Namespace], None] | None = None,
) -> int:
    """A writer CLI (``output_arguments`` in its parser): ``write(args)``'s exit status.

    ``check`` validates the options up front, as does ``check_staging`` (a ValueError is a usage
    error). Ctrl-C (exit status 130) and SIGTERM (143) stop it after the writer removed its
    partial files; an output it cannot write (a local path, an object store) is an error naming
    it (2)."""
    args = parser.parse_args(argv)
    try:
        check_staging(args.out, args.staging)
        if check is not None:
            check(args)
    except ValueError as e:
        parser.error(str(e))
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    if main_thread and previous is None:  # a handler installed outside Python
        previous = signal.SIG_DFL
    try:
        return write(args)
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

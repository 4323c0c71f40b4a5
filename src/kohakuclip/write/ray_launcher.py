"""Run a write job's parts as Ray tasks: ``write_videos(..., ray=True)``, ``kohakuclip-write
--ray``, and ``write_images(..., ray=True)``, ``kohakuclip-write-images --ray``.

The driver connects to the cluster ``RAY_ADDRESS`` names, or starts a local Ray when none is
set, and submits one task per part (``part=I/N`` of the same job into the same output). The
output is a folder every node must see (a shared file system), or a URL prefix: then each task
builds its part in a temporary folder on its own node and uploads it (``write.upload``), and
nothing is staged on the driver. A task whose worker dies, or that fails with an OSError, is
retried (with ``resume``: a retry keeps the part's finished shards, for a URL those in the
bucket; a settings mismatch is not retried); the tasks report each video (image) to a small
actor, and the driver shows one progress bar over the cluster. When every part is done the
output is merged (``write.merge``; at a URL prefix, by ranged reads).

Both writers share all of this (``_run_parts``); each gives its job (``RayJob``: the settings,
picklable, with the ``write`` its parts run) and sums its parts' results.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from kohakuclip._argtypes import positive_int
from kohakuclip._progress import progress_bar
from kohakuclip.formats import ENCODING_FILE
from kohakuclip.storage.remote import is_url
from kohakuclip.write.merge import merge
from kohakuclip.write.parts import Part, holds_run
from kohakuclip.write.sources import expand_sources
from kohakuclip.write.upload import WriteError, present_objects

if TYPE_CHECKING:
    from kohakuclip.write.images import WriteSummary, _ImageJob
    from kohakuclip.write.shards import WriteResult, _Job

__all__ = ["RayJob", "ray_arguments", "write_images_on_ray", "write_on_ray"]


TASK_RETRIES = 3
"""How many times a failed part is run again (each retry resumes it)."""

_POLL_SECONDS = 0.5
_COUNTER_NAME = "kohakuclip-write-progress"
_PART_TAG_RE = re.compile(r"^\.?part-\d+-of-(\d+)\.")
"""A part's file (or pending folder) name; group 1 is the job's part count."""

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class RayJob(Protocol[R_co]):
    """A writer's job as the launcher runs it: a dataclass of its settings (picklable: every
    task gets a copy) with ``workers`` (threads per task, set by the launcher) and the ``write``
    of one part (``kohakuclip.write.shards._Job``, ``kohakuclip.write.images._ImageJob``)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def workers(self) -> int | None: ...

    def write(
        self,
        out: str,
        sources: Sequence[Any],
        part: Part | None,
        resume: bool,
        progress: bool,
        staging: str | None,
        on_item: Callable[[], None] | None,
        /,
    ) -> R_co:
        """Write ``part`` of the job into ``out`` (a URL: staged in ``staging``, None: a
        temporary folder), calling ``on_item`` after each source stored or skipped."""
        ...


def ray_arguments(parser: argparse.ArgumentParser) -> None:
    """A writer CLI's ``--ray`` and ``--ray-parts`` (``shards.check_ray_options`` checks them
    against ``--part`` and ``--staging``)."""
    parser.add_argument(
        "--ray",
        action="store_true",
        help="run the parts as Ray tasks on $RAY_ADDRESS's cluster (or a local Ray), then merge",
    )
    parser.add_argument(
        "--ray-parts",
        type=positive_int,
        default=None,
        help="parts (tasks) for --ray (default: the cluster's CPUs / --workers)",
    )


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "ray=True needs Ray: pip install 'kohakuclip[ray]' (or 'ray[default]')"
        ) from None
    return ray


def _connect(ray: Any) -> bool:
    """Join ``RAY_ADDRESS``'s cluster or start a local one; True when this call started it."""
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS") or None
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    return True


class _Counter:
    """Sources done (videos, images) per job across the cluster (one Ray actor per driver,
    reused by its jobs)."""

    def __init__(self) -> None:
        self.done: dict[str, int] = {}

    def add(self, job: str, n: int = 1) -> None:
        self.done[job] = self.done.get(job, 0) + n

    def value(self, job: str) -> int:
        return self.done.get(job, 0)

    def forget(self, job: str) -> None:
        self.done.pop(job, None)


def _run_part(
    job: RayJob[R],
    out: str,
    sources: Sequence[Any],
    part: Part,
    counter: Any,
    key: str,
) -> R:
    """One Ray task: write ``part`` (resuming whatever an earlier attempt finished; a URL
    output staged in a temporary folder of this node), counting each source on ``counter``."""
    return job.write(out, sources, part, True, False, None, lambda: counter.add.remote(key))


def _earlier_job(out: str) -> tuple[bool, int | None]:
    """Whether ``out`` holds an earlier run, and the parts it was split into (None: unknown).
    A folder or a URL prefix tells by the names in it (``parts.holds_run``; a part's files and
    pending rows are named after it and the job's part count, and a URL's sidecars go up last);
    a folder's ``encoding.json`` from the video writer (written first) records the count too."""
    if is_url(out):
        names = {name.split("/")[0] for name in present_objects(out)}
    else:
        names = set(os.listdir(out)) if os.path.isdir(out) else set()
    counts = {int(m.group(1)) for m in map(_PART_TAG_RE.match, names) if m}
    split = counts.pop() if len(counts) == 1 else None
    if ENCODING_FILE in names and not is_url(out):
        with open(os.path.join(out, ENCODING_FILE), "rb") as f:
            recorded = json.load(f)
        parts = recorded.get("parts") if isinstance(recorded, dict) else None
        split = parts if isinstance(parts, int) else split
    return holds_run(names, None), split


_remote_parts: dict[int, Any] = {}


def _part_task(ray: Any, cpus: int) -> Any:
    """The remote form of ``_run_part`` for tasks of ``cpus`` CPUs (made once per process)."""
    if cpus not in _remote_parts:
        options = {"num_cpus": cpus, "max_retries": TASK_RETRIES, "retry_exceptions": [OSError]}
        _remote_parts[cpus] = ray.remote(**options)(_run_part)
    return _remote_parts[cpus]


def _run_parts(
    out: str,
    sources: Sequence[Any],
    job: RayJob[R],
    resume: bool,
    progress: bool,
    parts: int | None,
    total: int,
    unit: str,
) -> list[R]:
    """Write ``job`` as ``parts`` Ray tasks into ``out`` (a folder or a URL prefix), then merge
    it; see the module doc. Returns the parts' results (in the order they finished); the
    progress bar counts ``total`` sources, in ``unit``."""
    ray = _ray()
    sources = [os.fspath(s) if isinstance(s, os.PathLike) else s for s in sources]
    earlier, split = _earlier_job(out)
    if earlier:
        if not resume:
            raise WriteError(
                f"{out}: holds an earlier run; pass resume=True (--resume) to continue it, "
                "or choose another folder"
            )
        if split is None:
            raise WriteError(
                f"{out}: holds a run not split into parts (or split several ways): resume it "
                "the way it was written (without --ray, or with its --part), or choose another "
                "folder"
            )
        if parts is None:  # resume with the split the earlier run used, whatever the cluster
            parts = split
    if parts is not None and parts < 1:
        raise ValueError(f"ray_parts must be at least 1, got {parts}")
    started = _connect(ray)
    try:
        per_task = max(1, job.workers or 1)
        if parts is None:
            cpus = int(ray.cluster_resources().get("CPU", 1))
            parts = max(1, min(total, cpus // per_task))
        job = dataclasses.replace(job, workers=per_task)
        counter = (
            ray.remote(num_cpus=0)(_Counter)
            .options(name=_COUNTER_NAME, get_if_exists=True)
            .remote()
        )
        key = uuid.uuid4().hex
        task = _part_task(ray, per_task)
        pending = [
            task.remote(job, out, sources, Part(i, parts), counter, key) for i in range(parts)
        ]
        results: list[R] = []
        bar = progress_bar(total=total, unit=unit, disable=not progress)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1, timeout=_POLL_SECONDS)
                results.extend(ray.get(ready))
                if progress:
                    bar.n = min(total, ray.get(counter.value.remote(key)))
                    bar.refresh()
            bar.n = total  # every part finished (the last counts may still be in flight)
            bar.refresh()
        finally:
            bar.close()
            counter.forget.remote(key)
    finally:
        if started:
            ray.shutdown()
    merge(out)
    return results


def write_on_ray(
    out: str,
    sources: list[Any],
    job: _Job,
    resume: bool,
    progress: bool,
    parts: int | None,
) -> WriteResult:
    """``write_videos(..., ray=True)``: the video ``job`` as ``parts`` Ray tasks into ``out``
    (a folder or a URL prefix), merged; the parts' results summed."""
    from kohakuclip.write.shards import WriteResult

    total = len(expand_sources(sources, job.gulp_fps).sources)
    results = _run_parts(out, sources, job, resume, progress, parts, total, "video")
    combined = WriteResult(out)
    for r in sorted(results, key=lambda r: r.shards):  # the seconds summed in a fixed order
        combined.shards.extend(r.shards)
        combined.videos += r.videos
        combined.skipped += r.skipped
        combined.seconds += r.seconds
        combined.resumed_videos += r.resumed_videos
    combined.shards.sort()
    return combined


def write_images_on_ray(
    out: str,
    sources: list[Any],
    job: _ImageJob,
    resume: bool,
    progress: bool,
    parts: int | None,
) -> WriteSummary:
    """``write_images(..., ray=True)``: the image ``job`` as ``parts`` Ray tasks into ``out``
    (a folder or a URL prefix), merged; the parts' summaries summed."""
    from kohakuclip.write.image_sources import count_sources
    from kohakuclip.write.images import WriteSummary

    total = count_sources(sources)  # lists the sources, reads no sidecar
    combined = WriteSummary(out)
    for r in _run_parts(out, sources, job, resume, progress, parts, total, "img"):
        combined.shards.extend(r.shards)
        combined.images += r.images
        combined.skipped += r.skipped
        combined.stored_bytes += r.stored_bytes
        combined.source_bytes += r.source_bytes
    combined.shards.sort()
    return combined

"""Run a write job's parts as Ray tasks: ``write_videos(..., ray=True)``, ``kohakuclip-write
--ray``.

The driver connects to the cluster ``RAY_ADDRESS`` names, or starts a local Ray when none is
set, and submits one task per part (``part=I/N`` of the same job into the same output). The
output is a folder every node must see (a shared file system), or a URL prefix: then each task
builds its part in a temporary folder on its own node and uploads it (``write.upload``), and
nothing is staged on the driver. A task whose worker dies, or that fails with an OSError, is
retried (with ``resume``: a retry keeps the part's finished shards, for a URL those in the
bucket; a settings mismatch is not retried); the tasks report each video to a small actor, and
the driver shows one progress bar over the cluster. When every part is done the output is merged
(``write.merge``; at a URL prefix, by ranged reads).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from kohakuclip.formats import ENCODING_FILE
from kohakuclip.storage.remote import is_url
from kohakuclip.write.merge import merge
from kohakuclip.write.parts import Part, holds_run
from kohakuclip.write.sources import Source, expand_sources
from kohakuclip.write.upload import WriteError, present_objects

if TYPE_CHECKING:
    from kohakuclip.write.shards import WriteResult, _Job

__all__ = ["write_on_ray"]


TASK_RETRIES = 3
"""How many times a failed part is run again (each retry resumes it)."""

_POLL_SECONDS = 0.5
_COUNTER_NAME = "kohakuclip-write-progress"
_PART_TAG_RE = re.compile(r"^\.?part-\d+-of-(\d+)\.")
"""A part's file (or pending folder) name; group 1 is the job's part count."""


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
    """Videos done per job across the cluster (one Ray actor per driver, reused by its jobs)."""

    def __init__(self) -> None:
        self.done: dict[str, int] = {}

    def add(self, job: str, n: int = 1) -> None:
        self.done[job] = self.done.get(job, 0) + n

    def value(self, job: str) -> int:
        return self.done.get(job, 0)

    def forget(self, job: str) -> None:
        self.done.pop(job, None)


def _run_part(
    job: _Job,
    out: str,
    sources: Sequence[str | Source | tuple[str, bytes]],
    part: Part,
    counter: Any,
    key: str,
) -> WriteResult:
    """One Ray task: write ``part`` (resuming whatever an earlier attempt finished; a URL
    output staged in a temporary folder of this node)."""
    return job.write(
        out, sources, part, resume=True, progress=False, on_video=lambda: counter.add.remote(key)
    )


def _earlier_job(out: str) -> tuple[bool, int | None]:
    """Whether ``out`` holds an earlier run, and the parts it was split into (None: unknown).
    A folder tells by its ``encoding.json`` (written first); a URL prefix by its objects (the
    sidecars go up last, a part's files and pending rows as it goes)."""
    if is_url(out):
        names = {name.split("/")[0] for name in present_objects(out)}
        counts = {int(m.group(1)) for m in map(_PART_TAG_RE.match, names) if m}
        return holds_run(names, None), counts.pop() if len(counts) == 1 else None
    settings = os.path.join(out, ENCODING_FILE)
    if not os.path.exists(settings):
        return False, None
    with open(settings, "rb") as f:
        return True, json.load(f).get("parts")


_remote_parts: dict[int, Any] = {}


def _part_task(ray: Any, cpus: int) -> Any:
    """The remote form of ``_run_part`` for tasks of ``cpus`` CPUs (made once per process)."""
    if cpus not in _remote_parts:
        options = {"num_cpus": cpus, "max_retries": TASK_RETRIES, "retry_exceptions": [OSError]}
        _remote_parts[cpus] = ray.remote(**options)(_run_part)
    return _remote_parts[cpus]


def write_on_ray(
    out: str,
    sources: list[Any],
    job: _Job,
    resume: bool,
    progress: bool,
    parts: int | None,
) -> WriteResult:
    """Write the job as ``parts`` Ray tasks into ``out`` (a folder or a URL prefix), then merge
    it; see the module doc."""
    from kohakuclip.write.shards import WriteResult

    ray = _ray()
    sources = [os.fspath(s) if isinstance(s, os.PathLike) else s for s in sources]
    earlier, split = _earlier_job(out)
    if earlier:
        if not resume:
            raise WriteError(
                f"{out}: holds an earlier run; pass resume=True (--resume) to continue it, "
                "or choose another folder"
            )
        if parts is None:  # resume with the split the earlier run used, whatever the cluster
            parts = split
    if parts is not None and parts < 1:
        raise ValueError(f"ray_parts must be at least 1, got {parts}")
    total = len(expand_sources(sources, job.gulp_fps).sources)
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
        results: list[WriteResult] = []
        bar = tqdm(total=total, unit="video", disable=not progress, dynamic_ncols=True)
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
    combined = WriteResult(out)
    for r in sorted(results, key=lambda r: r.shards):
        combined.shards.extend(r.shards)
        combined.videos += r.videos
        combined.skipped += r.skipped
        combined.seconds += r.seconds
        combined.resumed_videos += r.resumed_videos
    combined.shards.sort()
    return combined

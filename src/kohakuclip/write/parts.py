"""Splitting one write job into parts that run on separate machines (``--part I/N``).

Part ``I`` of ``N`` (``0 <= I < N``: Slurm's ``$SLURM_ARRAY_TASK_ID`` of an array ``0-(N-1)``,
Kubernetes' ``$JOB_COMPLETION_INDEX``) takes the ``I``-th contiguous block of the sources sorted
by origin: the same block on every machine given the same source list, every video (or image)
whole. Each part names its files after itself, so parts never collide in one output folder:
``part-00003-of-00010.shard_00000.zip``, ``part-00003-of-00010.manifest.parquet`` and
``part-00003-of-00010.skipped.jsonl``; ``kohakuclip merge`` then writes the dataset view over
all of them.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kohakuclip.formats import ENCODING_FILE, MANIFEST_FILE, PART_PREFIX, SKIPPED_FILE
from kohakuclip.write._atomic import TEMP_SUFFIX

__all__ = [
    "ANY_SHARD_RE",
    "OutputNames",
    "Part",
    "earlier_run",
    "holds_run",
    "left_to_do",
    "part_argument",
]


T = TypeVar("T")

_PART_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
ANY_SHARD_RE = re.compile(r"^(part-\d+-of-\d+\.)?shard_\d{5,}\.(zip|tar)$")
"""Any writer run's (or part's) shard name."""
_WHOLE_RUN_FILES = (MANIFEST_FILE, SKIPPED_FILE, ENCODING_FILE)
"""What any writer's whole run leaves beside its shards."""


@dataclass(frozen=True)
class Part:
    """Part ``index`` of ``count`` (zero-based)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ValueError(
                f"part must be I/N with 0 <= I < N, got {self.index}/{self.count} "
                "(Slurm: --array=0-(N-1))"
            )

    @classmethod
    def parse(cls, text: str | Part) -> Part:
        """``"3/10"`` -> Part(3, 10)."""
        if isinstance(text, Part):
            return text
        match = _PART_RE.match(str(text))
        if match is None:
            raise ValueError(f"part must look like I/N (e.g. 3/10), got {text!r}")
        return cls(int(match.group(1)), int(match.group(2)))

    @property
    def tag(self) -> str:
        """``part-00003-of-00010``: the prefix of every file this part writes."""
        return PART_PREFIX.format(self.index, self.count)

    def select(self, items: Sequence[T], key: Callable[[T], str]) -> list[T]:
        """This part's contiguous block of ``items`` sorted by ``key`` (stable)."""
        ordered = sorted(items, key=key)
        start = self.index * len(ordered) // self.count
        stop = (self.index + 1) * len(ordered) // self.count
        return ordered[start:stop]

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class OutputNames:
    """The names of the files one run (a whole job, or one part) writes in its folder."""

    part: Part | None = None

    @property
    def prefix(self) -> str:
        return "" if self.part is None else self.part.tag + "."

    def shard(self, number: int, container: str) -> str:
        return f"{self.prefix}shard_{number:05d}.{container}"

    def shard_pattern(self, containers: str = "zip|tar") -> re.Pattern[str]:
        """Matches this run's shard names; group 1 is the shard number."""
        return re.compile(rf"^{re.escape(self.prefix)}shard_(\d{{5,}})\.({containers})$")

    @property
    def manifest(self) -> str:
        return self.prefix + MANIFEST_FILE

    @property
    def skipped(self) -> str:
        return self.prefix + SKIPPED_FILE

    @property
    def record(self) -> str:
        """The image writer's record of the run (part); the video writer keeps one
        ``encoding.json`` for the whole job."""
        return self.prefix + ENCODING_FILE

    @property
    def pending(self) -> str:
        """Folder of an unfinished run's resume state: per-shard manifest rows and the settings
        its shards were written with."""
        return f".{self.prefix}manifest-parts"

    def pending_rows(self, shard: str) -> str:
        """Where (under the output) the finished ``shard``'s manifest rows wait for the run's
        manifest."""
        return f"{self.pending}/{shard}.parquet"

    @property
    def pending_skipped(self) -> str:
        """Where (under the output) the skip log is copied with each shard's rows: a run
        resumed from a bucket keeps the sources skipped before (the log goes up at the end)."""
        return f"{self.pending}/{SKIPPED_FILE}"

    @property
    def pending_settings(self) -> str:
        """Where (under the output) the settings of the pending rows' shards are kept: a run
        resumed from a bucket, before any sidecar is uploaded, checks its settings by them."""
        return f"{self.pending}/{ENCODING_FILE}"

    def owns(self, name: str) -> bool:
        """Whether ``name`` is one of this run's files (shard, manifest, skip log)."""
        return bool(self.shard_pattern().match(name)) or name in (self.manifest, self.skipped)

    def temporary(self, name: str) -> bool:
        """Whether ``name`` is one of this run's files still being written (or left so by a
        killed run); for a whole run, any writer's."""
        return name.startswith(self.prefix) and name.endswith(TEMP_SUFFIX)


def earlier_run(names: Iterable[str], part: Part | None) -> str | None:
    """The first (sorted) of a folder's (or URL prefix's) file ``names`` that shows a run a new
    one would clash with, or None. For a whole run: any writer's shard, manifest, skip log or
    ``encoding.json``; for a part, only its own files (the other parts of its job write beside
    it): shards, manifest, skip log, record, files left half-written and unfinished manifest
    rows. Both writers decide by it, for a local folder and for a URL prefix alike."""
    run = OutputNames(part)
    for name in sorted(names):
        if part is None:
            found = bool(ANY_SHARD_RE.match(name)) or name in _WHOLE_RUN_FILES
        else:
            found = run.owns(name) or run.temporary(name) or name in (run.record, run.pending)
        if found:
            return name
    return None


def holds_run(names: Iterable[str], part: Part | None) -> bool:
    """Whether ``names`` show an earlier run (``earlier_run``)."""
    return earlier_run(names, part) is not None


def part_argument(parser: argparse.ArgumentParser, verb: str, items: str) -> None:
    """A writer CLI's ``--part I/N``: ``verb`` only that part of the sorted ``items``."""
    parser.add_argument(
        "--part",
        default=None,
        metavar="I/N",
        help=f"{verb} only part I of N (0 <= I < N) of the sorted {items}, beside the other "
        "parts in OUT (Slurm: $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT); then "
        "`kohakuclip merge OUT`",
    )


def left_to_do(items: Iterable[T], done: Counter[str], origin: Callable[[T], str]) -> Iterator[T]:
    """The ``items`` a resumed run still has to store or skip: each origin counted in ``done``
    (stored or skipped by the earlier attempt) covers that many items of that origin, so a
    source given twice is stored twice, as in a run straight through. ``done`` is used up."""
    for item in items:
        key = origin(item)
        if done[key] > 0:
            done[key] -= 1
        else:
            yield item

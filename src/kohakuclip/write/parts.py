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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from kohakuclip.formats import ENCODING_FILE, MANIFEST_FILE, PART_PREFIX, SKIPPED_FILE

__all__ = ["ANY_SHARD_RE", "OutputNames", "Part", "holds_run", "part_argument"]


T = TypeVar("T")

_PART_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
ANY_SHARD_RE = re.compile(r"^(part-\d+-of-\d+\.)?shard_\d{5,}\.(zip|tar)$")
"""Any writer run's (or part's) shard name."""


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
    def pending(self) -> str:
        """Folder of per-shard manifest rows of an unfinished run."""
        return f".{self.prefix}manifest-parts"

    def owns(self, name: str) -> bool:
        """Whether ``name`` is one of this run's files (shard, manifest, skip log)."""
        return bool(self.shard_pattern().match(name)) or name in (self.manifest, self.skipped)


def holds_run(names: Iterable[str], part: Part | None) -> bool:
    """Whether a folder's (or URL prefix's) file ``names`` hold a run a new one would clash
    with: for a whole run any writer's shard, manifest or settings; for a part, its own
    files (the other parts of its job write beside it)."""
    if part is None:
        return any(ANY_SHARD_RE.match(n) or n in (MANIFEST_FILE, ENCODING_FILE) for n in names)
    own = OutputNames(part)
    return any(own.owns(n) for n in names)


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

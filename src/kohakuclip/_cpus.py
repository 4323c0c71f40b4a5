"""How many CPUs this process may use, for the default thread and worker counts.

``os.cpu_count()`` counts the machine's: a Slurm task given 4 CPUs on a 96-core node, or a
container limited to 2, would start 96 encoders or decoders and thrash. The count here is the
fewest of what the scheduler lets this process run on (its affinity mask), what its cgroup's
CPU quota allows (containers, Kubernetes limits, Slurm's cgroup plugin; v1 and v2, the tightest
limit on the way up the hierarchy), and Slurm's ``SLURM_CPUS_PER_TASK``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

__all__ = ["usable_cpus"]

_CGROUP_ROOT = "/sys/fs/cgroup"
_SELF_CGROUP = "/proc/self/cgroup"


def usable_cpus() -> int:
    """CPUs this process may use (at least 1): see the module doc."""
    limits = [_affinity(), _cgroup_quota(), _slurm_allotment()]
    return max(1, min(n for n in limits if n is not None))


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _slurm_allotment() -> int | None:
    value = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _cgroup_quota() -> int | None:
    """The CPU quota of this process's cgroups, rounded up to whole CPUs (None: unlimited or
    not Linux)."""
    try:
        with open(_SELF_CGROUP, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found: list[int] = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2: one hierarchy (mounted beside v1's as "unified" on hybrids)
            v2 = _CGROUP_ROOT
            if not os.path.exists(os.path.join(v2, "cgroup.controllers")):
                v2 = os.path.join(_CGROUP_ROOT, "unified")
            found += _along(v2, path, _v2_quota)
        elif "cpu" in controllers.split(","):
            found += _along(os.path.join(_CGROUP_ROOT, controllers), path, _v1_quota)
    return min(found) if found else None


def _along(base: str, path: str, quota: Callable[[str], int | None]) -> list[int]:
    """The quotas (``quota(folder)``, None where unlimited) from the cgroup ``path`` up to the
    hierarchy's root ``base``."""
    found = []
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        cpus = quota(os.path.join(base, *parts[:depth]))
        if cpus is not None:
            found.append(cpus)
    return found


def _v2_quota(folder: str) -> int | None:
    words = _read(os.path.join(folder, "cpu.max")).split()
    if len(words) != 2 or not words[0].isdigit() or not words[1].isdigit():
        return None  # "max PERIOD": unlimited
    return _whole(int(words[0]), int(words[1]))


def _v1_quota(folder: str) -> int | None:
    quota = _read(os.path.join(folder, "cpu.cfs_quota_us")).strip()
    period = _read(os.path.join(folder, "cpu.cfs_period_us")).strip()
    if not quota.isdigit() or not period.isdigit():
        return None  # "-1": unlimited
    return _whole(int(quota), int(period))


def _whole(quota: int, period: int) -> int | None:
    return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""

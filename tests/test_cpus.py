"""kohakuclip._cpus: the CPUs a process may use (affinity, cgroup quota, Slurm's allotment)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kohakuclip import _cpus
from kohakuclip._cpus import usable_cpus

AFFINITY = len(os.sched_getaffinity(0))


def _hierarchy(tmp_path: Path, self_cgroup: str, files: dict[str, str]) -> None:
    """A cgroup tree under ``tmp_path`` (file path -> content) and this process's
    /proc/self/cgroup lines, in place of the machine's."""
    for rel, text in files.items():
        path = tmp_path / "sys" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "self").write_text(self_cgroup)


@pytest.fixture
def fake_cgroups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(_cpus, "_CGROUP_ROOT", str(tmp_path / "sys"))
    monkeypatch.setattr(_cpus, "_SELF_CGROUP", str(tmp_path / "self"))
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    return tmp_path


def test_v2_quota_is_the_tightest_on_the_way_up(fake_cgroups: Path) -> None:
    _hierarchy(
        fake_cgroups,
        "0::/job/step\n",
        {
            "cgroup.controllers": "cpu io\n",
            "job/cpu.max": "150000 100000\n",  # 1.5 CPUs: 2 threads
            "job/step/cpu.max": "max 100000\n",
        },
    )
    assert _cpus._cgroup_quota() == 2
    assert usable_cpus() == min(AFFINITY, 2)


def test_v1_quota_and_the_hybrid_layout(fake_cgroups: Path) -> None:
    _hierarchy(
        fake_cgroups,
        "4:memory:/x\n1:cpu,cpuacct:/slurm/job_7\n0::/\n",
        {
            "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/slurm/job_7/cpu.cfs_quota_us": "100000\n",
            "cpu,cpuacct/slurm/job_7/cpu.cfs_period_us": "100000\n",
            "unified/cpu.max": "max 100000\n",  # hybrid: v2 beside v1, no limit there
        },
    )
    assert _cpus._cgroup_quota() == 1
    assert usable_cpus() == 1


def test_no_limits_leave_the_affinity(fake_cgroups: Path) -> None:
    _hierarchy(fake_cgroups, "0::/\n", {"cgroup.controllers": "", "cpu.max": "max 100000\n"})
    assert _cpus._cgroup_quota() is None
    assert usable_cpus() == AFFINITY
    (fake_cgroups / "self").unlink()  # not Linux, or no /proc
    assert usable_cpus() == AFFINITY


def test_slurm_allotment(fake_cgroups: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert usable_cpus() == 1
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "not a number")
    assert usable_cpus() == AFFINITY


@pytest.mark.skipif(AFFINITY < 2, reason="needs 2 CPUs to restrict to 1")
def test_the_affinity_mask_counts() -> None:
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
        "from kohakuclip._cpus import usable_cpus; print(usable_cpus())"
    )
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CPUS_PER_TASK"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"

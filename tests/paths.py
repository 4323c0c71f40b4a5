"""Where the checkout is, the environment a test's child interpreter needs to import
``tests.*`` and ``benchmarks.*`` the way the test process does, and a child run without the
right to read a folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
"""The checkout: ``tests`` and ``benchmarks`` import from here."""


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: this process's) with the checkout first on PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    rest = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), *rest])
    return out


def run_locked_out(
    command: Sequence[str], locked: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` while the folder ``locked`` grants nobody anything (its permissions come
    back afterwards). As root, the child runs without the capabilities that let root read and
    list anything (``setpriv``; the test is skipped where it is missing)."""
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv")
        drop = "--bounding-set=-dac_override,-dac_read_search"
        command = ["setpriv", "--inh-caps=-all", drop, *command]
    locked.chmod(0)
    try:
        return subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout, env=child_env()
        )
    finally:
        locked.chmod(0o755)

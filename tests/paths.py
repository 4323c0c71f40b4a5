"""Where the checkout is, and the environment a test's child interpreter needs to import
``tests.*`` and ``benchmarks.*`` the way the test process does."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The checkout: ``tests`` and ``benchmarks`` import from here."""


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of ``env`` (default: this process's) with the checkout first on PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    rest = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), *rest])
    return out

"""KohakuClip 1.0.0 (the published wheel, a black box) for side-by-side tests, where installed by
``../shared/tools/reference-kohakuclip.sh``."""

from __future__ import annotations

import os

import pytest

REFERENCE_PYTHON = "/tmp/kohakuclip-ref/python"
REFERENCE_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
"""Its environment: our PYTHONPATH (a source checkout) would shadow its package."""

needs_reference = pytest.mark.skipif(
    not os.path.exists(REFERENCE_PYTHON), reason="reference wheel not installed"
)

"""KohakuClip 1.0.0's ``kohakuclip.sampling``, for code written against it: ``clip`` and
``random_frames``, the readers' stock samplers (``read.sample``), which take 1.0.0's calls
(a ``random.Random``) and draw as 1.0.0 does. The package root exports them too."""

from __future__ import annotations

from kohakuclip.read.sample import clip, random_frames

__all__ = ["clip", "random_frames"]

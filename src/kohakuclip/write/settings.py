"""Encoder settings and the FFmpeg encoder options they map to (shared by both backends)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

from kohakuclip.formats import VideoCodec

__all__ = ["DEFAULT_CRF", "DEFAULT_PRESET", "ENCODERS", "EncodeSettings"]


# SVT-AV1 prints its configuration banner per encoder unless told otherwise (errors only); the
# variable also reaches ffmpeg subprocesses.
os.environ.setdefault("SVT_LOG", "1")

ENCODERS: dict[str, str] = {"av1": "libsvtav1", "h264": "libx264", "hevc": "libx265"}
"""FFmpeg encoder per storage codec."""

DEFAULT_CRF = {"av1": 36, "h264": 23, "hevc": 28}
DEFAULT_PRESET: dict[str, int | str] = {"av1": 6, "h264": "medium", "hevc": "medium"}
X26X_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
    "placebo",
)


@dataclass(frozen=True)
class EncodeSettings:
    """How videos are re-encoded for storage.

    ``crf`` and ``preset`` default per codec (AV1: CRF 36, preset 6; H.264: 23, medium;
    HEVC: 28, medium). ``preset`` is SVT-AV1's number for AV1, and an x264/x265 preset name (or
    its position in X26X_PRESETS) otherwise. ``loop_filters`` turns AV1's deblocking, CDEF and
    loop restoration back on (they are off by default: decoding is 20-27 % faster at the same
    size); H.264/HEVC keep their deblocking either way.

    SVT-AV1 and x265 give the same bytes run after run; x264's AVX-512 code (its macroblock-tree
    rate control) does not, so H.264 shards written twice on such CPUs hold equivalent but not
    identical bitstreams.
    """

    codec: VideoCodec = "av1"
    crf: int | None = None
    gop: int = 16
    preset: int | str | None = None
    max_short: int = 512
    loop_filters: bool = False

    def __post_init__(self) -> None:
        if self.codec not in ENCODERS:
            raise ValueError(f"unknown codec {self.codec!r} (choose from {', '.join(ENCODERS)})")
        if self.gop < 1:
            raise ValueError(f"gop must be at least 1, got {self.gop}")
        if self.max_short < 0:
            raise ValueError(f"max_short must be >= 0 (0: no cap), got {self.max_short}")
        self.encoder_options()  # validates crf and preset

    @property
    def encoder(self) -> str:
        return ENCODERS[self.codec]

    def resolved(self) -> EncodeSettings:
        """The same settings with the per-codec defaults filled in."""
        return EncodeSettings(
            self.codec,
            DEFAULT_CRF[self.codec] if self.crf is None else self.crf,
            self.gop,
            DEFAULT_PRESET[self.codec] if self.preset is None else self.preset,
            self.max_short,
            self.loop_filters,
        )

    def encoder_options(self) -> dict[str, str]:
        """Private options of the FFmpeg encoder: a closed GOP of ``gop`` frames, no scene-cut
        keyframes, one encoder thread (videos are encoded in parallel instead)."""
        crf = DEFAULT_CRF[self.codec] if self.crf is None else int(self.crf)
        preset = DEFAULT_PRESET[self.codec] if self.preset is None else self.preset
        if self.codec == "av1":
            if not str(preset).lstrip("-").isdigit() or not -1 <= int(preset) <= 13:
                raise ValueError(f"AV1 preset must be a number in -1..13 (SVT-AV1), got {preset!r}")
            if not 0 <= crf <= 63:
                raise ValueError(f"AV1 crf must be in 0..63, got {crf}")
            params = [f"keyint={self.gop}", "irefresh-type=2", "scd=0", "lp=1"]
            if not self.loop_filters:
                params += ["enable-dlf=0", "enable-cdef=0", "enable-restoration=0"]
            return {"preset": str(preset), "crf": str(crf), "svtav1-params": ":".join(params)}
        name = _x26x_preset(preset)
        if not 0 <= crf <= 51:
            raise ValueError(f"{self.codec} crf must be in 0..51, got {crf}")
        gop = str(self.gop)
        if self.codec == "h264":
            x264 = f"keyint={gop}:min-keyint={gop}:scenecut=0:open-gop=0"
            return {"preset": name, "crf": str(crf), "x264-params": x264}
        x265 = (
            f"keyint={gop}:min-keyint={gop}:scenecut=0:open-gop=0"
            ":pools=1:frame-threads=1:log-level=error"
        )
        return {"preset": name, "crf": str(crf), "x265-params": x265}

    def to_json(self) -> dict[str, Any]:
        return asdict(self.resolved())


def _x26x_preset(preset: int | str) -> str:
    if isinstance(preset, int) or str(preset).isdigit():
        index = int(preset)
        if not 0 <= index < len(X26X_PRESETS):
            raise ValueError(f"x264/x265 preset index must be 0..{len(X26X_PRESETS) - 1}")
        return X26X_PRESETS[index]
    if preset not in X26X_PRESETS:
        raise ValueError(f"unknown x264/x265 preset {preset!r} (choose from {X26X_PRESETS})")
    return str(preset)

"""``VideoTrack``: one video's frame table, made by ``storage.video_resolve`` and consumed by
``read.plan`` and ``decode``; a module of its own (the home of track types) so that decode/ and
the planner do not import the catalog."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kohakuclip.codecs.av1 import sample_rows

__all__ = ["VideoTrack"]


@dataclass
class VideoTrack:
    """Everything the planner and decoder need about one video, in decode order."""

    codec: str
    width: int
    height: int
    fps: float
    colorspace: str  # "bt601" | "bt709"
    full_range: bool
    prefix: bytes  # AV1 sequence header OBU, or Annex-B parameter sets
    nal_length_size: int  # 0: samples are AV1 OBUs; else the AVCC/HVCC length field size
    path: str  # the file to pread from
    offsets: np.ndarray  # absolute offsets in ``path``
    sizes: np.ndarray
    keep: np.ndarray  # bytes later frames need (== sizes where unknown)
    keyframe: np.ndarray  # bool
    # decode index -> display index, -1 for samples decoded but never shown (trimmed by an edit
    # list); None: identity
    display: np.ndarray | None = None
    decode_of_display: np.ndarray | None = None  # display index -> decode index
    key_positions: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    av1_frames: np.ndarray | None = None  # AV1_FRAME_RECORDs: per-frame dependencies
    # per sample (and one past the last), the row of its first AV1_FRAME_RECORD
    av1_rows: np.ndarray | None = None
    n: int = 0  # frames shown
    # the mp4 sample entry's decoder configuration (av1C / avcC / hvcC / vpcC payload, mpeg4's
    # VOL headers): the extradata of codecs the PyAV fallback decodes without a prefix
    config: bytes = b""

    def __post_init__(self) -> None:
        self.key_positions = np.flatnonzero(self.keyframe)
        self.n = len(self.sizes)
        if self.av1_frames is not None:
            self.av1_rows = sample_rows(self.av1_frames, self.n)
        if self.display is not None and not np.array_equal(self.display, np.arange(self.n)):
            shown = np.flatnonzero(self.display >= 0)
            self.n = len(shown)
            self.decode_of_display = shown[np.argsort(self.display[shown], kind="stable")]
        else:
            self.display = None

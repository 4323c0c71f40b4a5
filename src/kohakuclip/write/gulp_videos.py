"""GulpIO directories as writer sources: every id becomes one stored video.

Each video's JPEG frames are read with positional reads, decoded with the gulp package's
decoder and fed, as RGB frames, to the same encode pipeline as any other source (settings,
short-side cap, even sizes). Gulp frames are JPEG's BT.601 YCbCr, so the stored video keeps
that matrix, whatever its size. The frame rate is the one given (``gulp_fps``), else the one
the video's meta_data records (``fps`` / ``frame_rate``), else ``DEFAULT_GULP_FPS``. Chunks
are opened one by one: a chunk whose files are missing or broken is reported and the others
are still read.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import av
import numpy as np

from kohakuclip.gulp.frames import GulpError, decode_frame
from kohakuclip.gulp.index import GulpIndex
from kohakuclip.gulp.meta import load_meta, scan_directory
from kohakuclip.write.layout import Colour, Orientation, plan_layout
from kohakuclip.write.settings import EncodeSettings
from kohakuclip.write.video import EncodedVideo, SourceProbe, encode_frames

__all__ = ["DEFAULT_GULP_FPS", "GulpVideo", "encode_gulp_video", "list_gulp_videos"]


DEFAULT_GULP_FPS = 12.0
"""Frame rate of gulp videos whose meta_data records none (GulpIO's ingestors stored none)."""

_FRAMES_PER_READ = 32
"""Frames fetched per positional read while encoding (bounds the JPEG bytes held at once)."""

_SMPTE170M = 6  # AVColorSpace, AVColorPrimaries and AVColorTransferCharacteristic: BT.601 525
_JPEG_COLOUR = Colour(
    stored="bt601",
    matrix=_SMPTE170M,
    primaries=_SMPTE170M,
    trc=_SMPTE170M,
    convert_from="rgb",
    full_range_source=True,
)


@dataclass(frozen=True)
class GulpVideo:
    """One id of a gulp directory, to be encoded at ``fps``."""

    index: GulpIndex  # the chunk that holds it
    video: int  # its position in ``index``
    fps: float

    @property
    def id(self) -> str:
        return self.index.ids[self.video]

    @property
    def meta(self) -> dict[str, Any]:
        """The first meta_data dict of the video (its labels), or {}."""
        return dict(self.index.meta(self.video))

    @property
    def size(self) -> int:
        """JPEG bytes of all its frames."""
        return int(self.index.frames(self.video)[2].sum(dtype=np.int64))

    def frames(self) -> Iterator[np.ndarray]:
        """Its frames in order, RGB uint8; GulpError naming data file, id and frame if bad."""
        n = int(self.index.count[self.video])
        for start in range(0, n, _FRAMES_PER_READ):
            wanted = range(start, min(n, start + _FRAMES_PER_READ))
            for frame, data in zip(wanted, self.index.read(self.video, wanted), strict=True):
                try:
                    yield decode_frame(data)
                except ValueError as exc:
                    path = self.index.data_path(self.video)
                    raise GulpError(f"{path}: id {self.id!r} frame {frame}: {exc}") from exc


def list_gulp_videos(
    root: str, gulp_fps: float | None = None
) -> tuple[list[GulpVideo], list[tuple[str, str]]]:
    """The videos of a gulp directory in chunk order, and the chunk files that cannot be read
    (path, reason). An id already seen in an earlier chunk is reported, not repeated."""
    chunks, lone_data, _ = scan_directory(root)  # a meta file alone is an unfinished write
    unreadable = [(path, f"{path}: data file without its meta file") for path in lone_data]
    videos: list[GulpVideo] = []
    seen: dict[str, str] = {}
    for chunk in chunks:
        try:
            index = GulpIndex.from_metas(root, [(chunk, load_meta(chunk.meta_path))])
        except (GulpError, OSError) as exc:
            unreadable.append((chunk.meta_path, str(exc)))
            continue
        for video, id_ in enumerate(index.ids):
            if id_ in seen:
                reason = f"{chunk.meta_path}: duplicate id {id_!r} (also in {seen[id_]})"
                unreadable.append((f"{chunk.meta_path}::{id_}", reason))
                continue
            seen[id_] = chunk.meta_path
            fps = gulp_fps or index.fps(video) or DEFAULT_GULP_FPS
            videos.append(GulpVideo(index, video, fps))
    return videos, unreadable


def encode_gulp_video(
    video: GulpVideo,
    settings: EncodeSettings | None = None,
    name: str | None = None,
    *,
    stop: threading.Event | None = None,
) -> EncodedVideo:
    """Encode one gulp video from its JPEG frames (in process, with PyAV); ``stop`` as for
    ``encode_frames``."""
    settings = settings or EncodeSettings()
    name = name or f"{video.index.root}::{video.id}"
    rate = Fraction(video.fps).limit_denominator(1001)

    def plan(frame: av.VideoFrame) -> SourceProbe:
        layout = plan_layout(
            frame.width, frame.height, None, Orientation(), _JPEG_COLOUR, settings.max_short
        )
        return SourceProbe(frame.width, frame.height, rate, layout)

    frames = (av.VideoFrame.from_ndarray(rgb, format="rgb24") for rgb in video.frames())
    return encode_frames(frames, plan, settings, name, stop=stop)

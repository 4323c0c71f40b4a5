"""KohakuClip 1.0.0's Python writer entry point, for code written against it:
``kohakuclip.writer.write(sources, out_dir, enc=Encoding(...), ...)``. It runs ``write_videos``
(sources first here, as 1.0.0 had them) and returns the shards' paths; new code calls
``write_videos``, which also resumes, splits into parts and writes to URLs."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Literal

from kohakuclip.write.ffmpeg_backend import FFMPEG_ENV
from kohakuclip.write.pack import Container
from kohakuclip.write.shards import write_videos

__all__ = ["Encoding", "write"]


@dataclass(frozen=True)
class Encoding:
    """1.0.0's encoder settings (``write_videos`` takes the same fields as keywords).

    Args:
        codec: ``av1``, ``h264`` or ``hevc``.
        crf: constant rate factor.
        gop: frames per closed GOP.
        preset: the encoder's speed preset.
        max_short: short side cap (never upscaled; 0: none).
        loop_filters: keep AV1's deblocking, CDEF and loop restoration on.
    """

    codec: str = "av1"
    crf: int = 36
    gop: int = 16
    preset: int = 6
    max_short: int = 512
    loop_filters: bool = False


def write(
    sources: Sequence[str],
    out_dir: str,
    enc: Encoding | None = None,
    per_shard: int = 1000,
    workers: int = 2,
    container: Container = "zip",
    backend: Literal["native", "ffmpeg"] = "native",
    ffmpeg: str = "ffmpeg",
) -> list[str]:
    """Encode ``sources`` into shards under ``out_dir``; the paths of the shards written.

    Videos that cannot be read are skipped and logged in ``out_dir/skipped.jsonl``.

    Args:
        sources: video files, folders and tar archives.
        out_dir: the output folder.
        enc: encoder settings (default ``Encoding()``).
        per_shard: videos per shard.
        workers: videos encoded at once.
        container: ``zip`` or ``tar``.
        backend: ``native`` (in process) or ``ffmpeg`` (the command line).
        ffmpeg: the ffmpeg executable of ``backend="ffmpeg"``, a path or a name on PATH (when
            the name is not found there: ``$KOHAKUCLIP_FFMPEG``, else imageio-ffmpeg's).
    """
    enc = enc or Encoding()
    with _ffmpeg(ffmpeg if backend == "ffmpeg" else None):
        result = write_videos(
            out_dir,
            sources,
            **asdict(enc),  # write_videos takes the same fields as keywords
            per_shard=per_shard,
            workers=workers,
            container=container,
            backend=backend,
            progress=False,
        )
    return [os.path.join(out_dir, shard) for shard in result.shards]


@contextmanager
def _ffmpeg(binary: str | None) -> Iterator[None]:
    """``binary`` (resolved on PATH) as the ffmpeg backend's executable for the block."""
    found = shutil.which(binary) if binary else None
    if found is None:
        yield
        return
    before = os.environ.get(FFMPEG_ENV)
    os.environ[FFMPEG_ENV] = found
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(FFMPEG_ENV, None)
        else:
            os.environ[FFMPEG_ENV] = before

"""``kohakuclip inspect``: what is in a set of sources, one row per video, with totals.

The facts come from the catalog the reader uses (the index header, else the moov), plus each
video's frame table for its stored bytes and keyframe spacing; nothing is decoded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kohakuclip.storage.video_catalog import Catalog

__all__ = ["VideoSummary", "describe", "format_table", "to_json"]


@dataclass(frozen=True)
class VideoSummary:
    """One video as ``inspect`` shows it. ``error`` is set (and the numbers are 0) when the
    video cannot be opened."""

    source: str
    member: str
    frames: int = 0
    fps: float = 0.0
    duration: float = 0.0  # seconds: frames / fps (0 when the rate is unknown)
    width: int = 0
    height: int = 0
    codec: str = ""
    colorspace: str = ""
    bytes: int = 0  # stored bytes of the video's samples
    keyframes: int = 0
    gop: int = 0  # the longest run of samples from a keyframe to the next (decode order)
    meta: dict[str, Any] = field(default_factory=dict)  # caption, label, json sidecar
    error: str | None = None

    @property
    def caption(self) -> str:
        """The caption recorded at write time (else the label), or ""."""
        for key in ("caption", "label"):
            value = self.meta.get(key)
            if value:
                return str(value)
        return ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _gop(keyframe: np.ndarray) -> tuple[int, int]:
    """(keyframes, longest keyframe-to-keyframe run) of a per-sample keyframe flag array."""
    keys = np.flatnonzero(keyframe)
    if len(keyframe) == 0:
        return 0, 0
    runs = np.diff(np.concatenate([[0], keys, [len(keyframe)]]))
    return len(keys), int(runs.max())


def describe(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    gulp_fps: float | None = None,
) -> list[VideoSummary]:
    """One summary per video of ``sources`` (shards, folders, gulp directories), in the
    reader's video order; a source that cannot be opened, or holds no videos, gives one
    summary with its error.

    Args:
        sources: paths as the ``Reader`` takes them.
        gulp_fps: frame rate for gulp videos, as the ``Reader``'s ``gulp_fps``.
    """
    paths = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    out = []
    for path in (os.fspath(p) for p in paths):
        try:
            catalog = Catalog([path], gulp_fps=gulp_fps, skip_tables=False)
        except (ValueError, OSError) as e:
            out.append(VideoSummary(path, "", error=str(e)))
            continue
        if not len(catalog):
            catalog.close()
            out.append(VideoSummary(path, "", error="no videos found"))
            continue
        try:
            for vid in range(len(catalog)):
                out.append(_summary(catalog, vid, path))
        finally:
            catalog.close()
    return out


def _summary(catalog: Catalog, vid: int, path: str) -> VideoSummary:
    member = catalog.videos[vid].member
    try:
        info = catalog.info(vid)
        track = catalog.track(vid)
        meta = catalog.meta(vid)
    except (ValueError, OSError) as e:
        return VideoSummary(path, member, error=str(e))
    keyframes, gop = _gop(track.keyframe)
    fps = float(info["fps"])
    return VideoSummary(
        source=path,
        member=member,
        frames=int(info["n"]),
        fps=fps,
        duration=info["n"] / fps if fps > 0 else 0.0,
        width=int(info["width"]),
        height=int(info["height"]),
        codec=str(info["codec"]),
        colorspace=str(info["colorspace"]),
        bytes=int(track.sizes.astype(np.int64).sum()),
        keyframes=keyframes,
        gop=gop,
        meta=meta,
    )


def totals(videos: Sequence[VideoSummary]) -> dict[str, Any]:
    """Counts over ``videos``: videos, unreadable ones, sources that could not be listed (a
    summary without a member), frames, seconds, bytes, per codec."""
    good = [v for v in videos if v.error is None]
    listed = [v for v in videos if v.member or v.error is None]
    codecs: dict[str, int] = {}
    for v in good:
        codecs[v.codec] = codecs.get(v.codec, 0) + 1
    seconds = sum(v.duration for v in good)
    stored = sum(v.bytes for v in good)
    return {
        "videos": len(listed),
        "errors": len(listed) - len(good),
        "unreadable_sources": len(videos) - len(listed),
        "frames": sum(v.frames for v in good),
        "duration": seconds,
        "bytes": stored,
        "kbps": stored * 8 / 1000 / seconds if seconds > 0 else 0.0,
        "codecs": dict(sorted(codecs.items())),
    }


def to_json(videos: Sequence[VideoSummary]) -> str:
    """The summaries and their totals as a JSON document."""
    doc = {"videos": [v.to_json() for v in videos], "totals": totals(videos)}
    return json.dumps(doc, indent=2, ensure_ascii=False, default=str)


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def _clock(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


_COLUMNS = (
    "video",
    "frames",
    "fps",
    "seconds",
    "size",
    "codec",
    "colour",
    "bytes",
    "kb/s",
    "gop",
    "caption",
)
_CAPTION = 40
"""Characters of a caption shown in the table."""
_RIGHT = {"frames", "fps", "seconds", "bytes", "kb/s", "gop"}


def _row(v: VideoSummary) -> list[str]:
    if v.error is not None:
        return [v.member, f"error: {v.error}"]
    kbps = v.bytes * 8 / 1000 / v.duration if v.duration > 0 else 0.0
    return [
        v.member,
        str(v.frames),
        f"{v.fps:.3f}".rstrip("0").rstrip("."),
        f"{v.duration:.2f}",
        f"{v.width}x{v.height}",
        v.codec,
        v.colorspace,
        _size(v.bytes),
        f"{kbps:.0f}",
        str(v.gop),
        v.caption if len(v.caption) <= _CAPTION else v.caption[: _CAPTION - 3] + "...",
    ]


def format_table(videos: Sequence[VideoSummary]) -> str:
    """A text table per source (a row per video), then the totals."""
    lines = []
    by_source: dict[str, list[VideoSummary]] = {}
    for v in videos:
        by_source.setdefault(v.source, []).append(v)
    for source, group in by_source.items():
        if len(group) == 1 and not group[0].member:
            lines += [f"{source}: error: {group[0].error}", ""]
            continue
        rows = [_row(v) for v in group]
        widths = [len(c) for c in _COLUMNS]
        for r in rows:
            if len(r) == len(_COLUMNS):
                widths = [max(w, len(c)) for w, c in zip(widths, r)]

        def line(cells: Sequence[str], widths: list[int] = widths) -> str:
            parts = [
                c.rjust(w) if name in _RIGHT else c.ljust(w)
                for c, w, name in zip(cells, widths, _COLUMNS)
            ]
            return "  ".join(parts).rstrip()

        t = totals(group)
        lines.append(
            f"{source}: {t['videos']} videos, {_clock(t['duration'])}, {_size(t['bytes'])}"
        )
        lines.append(line(_COLUMNS))
        lines.extend(line(r) if len(r) == len(_COLUMNS) else "  ".join(r) for r in rows)
        lines.append("")
    t = totals(videos)
    codecs = ", ".join(f"{n} {c}" for c, n in t["codecs"].items()) or "none"
    errors = f", {t['errors']} unreadable" if t["errors"] else ""
    sources = t["unreadable_sources"]
    unlisted = f", {sources} source{'s' if sources > 1 else ''} unreadable" if sources else ""
    lines.append(
        f"total: {t['videos']} videos ({codecs}{errors}){unlisted}, {t['frames']} frames, "
        f"{_clock(t['duration'])} ({t['duration']:.1f} s), {_size(t['bytes'])}, "
        f"{t['kbps']:.0f} kb/s"
    )
    return "\n".join(lines)

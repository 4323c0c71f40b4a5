"""Edit lists (``elst``): which samples a player demuxes, decodes and shows, as FFmpeg does.

Policy: the sample table follows FFmpeg's mov demuxer (its default "advanced edit list" mode),
so that frame ``i`` is the ``i``-th frame PyAV decodes. For each edit that maps media:

- demuxing starts at the last keyframe whose presentation time is at or before the edit's
  ``media_time`` (so frames shown from the edit's start can be decoded); earlier samples are
  left out of the table;
- it stops after the first keyframe whose presentation reaches the edit's end (the second such
  keyframe when the track has composition offsets, for trailing B-frames);
- samples presented outside ``[media_time, media_time + duration)`` stay in the table (later
  frames may need them) but are never shown: their display index is -1.

Leading empty edits (``media_time == -1``) only delay the start; a list of nothing but empty
edits shows nothing (FFmpeg demuxes no sample then), and FFmpeg reads an empty edit after a
media edit as one starting at time -1 (this module follows it there too). Several edits
that map media are concatenated in order (a sample can then appear twice). A track without an
edit list shows every sample.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Edit", "apply_edits"]


class Edit(NamedTuple):
    """One ``elst`` entry: ``duration`` in the movie timescale, ``media_time`` in the media's."""

    duration: int
    media_time: int


class EditedTable(NamedTuple):
    """The table after edits: each entry's source sample and display index, in decode order."""

    samples: np.ndarray  # int64 index into the unedited tables
    display: np.ndarray  # int32 display index of the entry, -1 where it is never shown


def _rescale(value: int, to_scale: int, from_scale: int) -> int:
    """``value * to_scale / from_scale`` rounded to nearest, halves away from zero."""
    num = value * to_scale
    q, r = divmod(abs(num), from_scale)
    if 2 * r >= from_scale:
        q += 1
    return q if num >= 0 else -q


def _start_sample(dts: np.ndarray, pts: np.ndarray, key: np.ndarray, media_time: int) -> int:
    """The sample demuxing starts from for an edit that begins at ``media_time``."""
    before = np.flatnonzero(key & (dts <= media_time) & (pts <= media_time))
    return int(before[-1]) if len(before) else 0


def apply_edits(
    edits: list[Edit],
    dts: np.ndarray,
    pts: np.ndarray,
    key: np.ndarray,
    has_ctts: bool,
    movie_timescale: int,
    media_timescale: int,
) -> EditedTable | None:
    """Apply an edit list to a track's samples; None when it changes nothing.

    ``dts`` and ``pts`` are each sample's decode and presentation times (int64 media ticks;
    ``pts = dts + composition offset``, which may be negative); ``key`` marks the sync samples.
    """
    if not edits:
        return None
    n = len(dts)
    durations = np.empty(n, np.int64)
    if n:
        durations[:-1] = np.diff(dts)
    pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    edit_start = 0  # where the edit begins on the presentation timeline, in media ticks
    for edit in edits:
        length = _rescale(edit.duration, media_timescale, movie_timescale)
        edit_start += length
        if edit.media_time == -1 and not pieces:
            continue
        start_time, end_time = edit.media_time, edit.media_time + length
        first = _start_sample(dts, pts, key, start_time)
        if n:
            durations[-1] = length
        # Stop after the first (with composition offsets: second) keyframe reaching the end.
        reaches = np.flatnonzero(key[first:] & (pts[first:] + durations[first:] >= end_time))
        stop_at = 1 if has_ctts else 0
        last = first + int(reaches[stop_at]) if len(reaches) > stop_at else n - 1
        picked = np.arange(first, last + 1, dtype=np.int64)
        in_edit = (pts[picked] >= start_time) & (pts[picked] < end_time)
        if not in_edit.any():
            pieces.append((picked, in_edit, np.zeros(len(picked), np.int64)))
            continue
        # FFmpeg's new timestamps: decode times restart at the edit's start with the first
        # sample (in decode order) inside the edit; presentation = decode + composition offset.
        anchor = dts[picked[int(np.argmax(in_edit))]]
        pieces.append((picked, in_edit, edit_start - length + pts[picked] - anchor))
    if not pieces:  # only empty edits: FFmpeg demuxes nothing
        return EditedTable(np.zeros(0, np.int64), np.zeros(0, np.int32))
    samples = np.concatenate([p[0] for p in pieces])
    shown = np.concatenate([p[1] for p in pieces])
    if len(samples) == n and bool(shown.all()) and np.array_equal(samples, np.arange(n)):
        return None
    presented = np.concatenate([p[2] for p in pieces])
    visible = np.flatnonzero(shown)
    order = visible[np.argsort(presented[visible], kind="stable")]
    display = np.full(len(samples), -1, np.int32)
    display[order] = np.arange(len(order), dtype=np.int32)
    return EditedTable(samples, display)

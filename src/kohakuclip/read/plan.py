"""Plan one clip: which byte ranges to read and which packets to feed the decoder.

Per GOP holding wanted frames: one read from its keyframe to the last sample needed. What is fed
from that read depends on ``skip``:

- ``False``: every sample, whole.
- ``"keep"``: samples that are not wanted are cut to the bytes later frames depend on (``keep``),
  and dropped when nothing depends on them.
- ``True``: for AV1 with a dependency table, only the frames the wanted frames transitively
  reference (the per-clip closure); otherwise as ``"keep"``.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Literal

import numpy as np

from kohakuclip.codecs.av1 import closure
from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import AV1_SHOW_EXISTING
from kohakuclip.plan_types import ClipPlan, GopRead, Pieces
from kohakuclip.tracks import VideoTrack

__all__ = [
    "ClipPlan",
    "FrameRangeError",
    "GopRead",
    "Skip",
    "check_frames",
    "clip_targets",
    "plan_clip",
]

Skip = bool | Literal["keep"]


class FrameRangeError(KohakuClipError, IndexError):
    """A wanted frame index outside the video."""


def check_frames(track: VideoTrack, frames: list[int] | np.ndarray) -> None:
    """Raise ``FrameRangeError`` for a frame index outside ``track`` (``ValueError`` for no
    frames)."""
    if len(frames) == 0:
        raise ValueError("a clip needs at least one frame")
    low, high = min(frames), max(frames)
    if low < 0 or high >= track.n:
        bad = next(int(f) for f in frames if not 0 <= f < track.n)
        raise FrameRangeError(f"frame {bad} out of range (video has {track.n} frames)")


def clip_targets(frames: list[int] | np.ndarray) -> dict[int, list[int]]:
    """Display index -> the clip's output positions that show it (a frame may repeat)."""
    targets: dict[int, list[int]] = {}
    for t, d in enumerate(frames):
        targets.setdefault(int(d), []).append(t)
    return targets


def plan_clip(
    track: VideoTrack, frames: list[int] | np.ndarray, skip: Skip = True, reach_back: int = 0
) -> ClipPlan:
    """Plan the reads and decoder input for display-order ``frames`` of ``track``.

    ``reach_back``: start decoding that many keyframes earlier than needed. An H.264 sync
    sample that is not an IDR picture (a recovery point without the SEI) may leave later
    frames referencing pictures before it, which the decoder then drops: the reader retries
    such clips from an earlier keyframe."""
    check_frames(track, frames)
    targets = clip_targets(frames)
    # sorted() and bisect, not np.sort / np.searchsorted: those release the GIL, and each
    # release costs a decode thread up to a switch interval beside a busy training thread
    unique_display = list(targets)
    if track.decode_of_display is not None:
        unique_display = track.decode_of_display[unique_display].tolist()
    wanted_decode = np.array(sorted(unique_display), np.int64)
    keys = track.key_positions
    if len(keys) == 0 or keys[0] > wanted_decode[0]:
        keys = np.concatenate([[0], keys]).astype(np.int64)
    key_list = keys.tolist()
    gop = np.array([bisect_right(key_list, d) - 1 for d in wanted_decode.tolist()], np.int64)
    if track.display is not None:
        # Open GOPs: a leading picture (shown before its keyframe) may reference the previous
        # GOP, so decoding starts one keyframe earlier for it.
        leading = track.display[wanted_decode] < track.display[keys[gop]]
        gop = np.where(leading & (gop > 0), gop - 1, gop)
    gop = np.maximum(gop - reach_back, 0)
    gop_start = keys[gop]
    reads = []
    packets = decoded = 0
    use_closure = skip is True and track.av1_frames is not None
    for first, last in _merged_ranges(gop_start, wanted_decode):
        in_range = wanted_decode[(wanted_decode >= first) & (wanted_decode <= last)]
        offsets = track.offsets[first : last + 1].astype(np.int64)
        sizes = track.sizes[first : last + 1].astype(np.int64)
        base = int(offsets.min())
        end = int((offsets + sizes).max())
        if use_closure:
            feed, n_frames = _closure_packets(track, first, in_range, offsets - base)
        else:
            feed, n_frames = _sample_packets(
                track, first, last, in_range, offsets - base, sizes, skip
            )
        packets += len(feed)
        decoded += n_frames
        reads.append(GopRead(base, end - base, feed))
    return ClipPlan(reads, targets, packets, decoded)


def _display(track: VideoTrack, samples: np.ndarray) -> list[int]:
    return (samples if track.display is None else track.display[samples]).tolist()


def _sample_packets(
    track: VideoTrack,
    first: int,
    last: int,
    wanted: np.ndarray,
    starts: np.ndarray,
    sizes: np.ndarray,
    skip: Skip,
) -> tuple[list[tuple[Pieces, int]], int]:
    """Whole samples, or unwanted ones cut to their ``keep`` bytes (dropped at 0)."""
    if skip:
        is_wanted = np.zeros(len(sizes), dtype=bool)
        is_wanted[wanted - first] = True
        lengths = np.where(is_wanted, sizes, track.keep[first : last + 1].astype(np.int64))
        lengths[0] = sizes[0]  # the keyframe is always fed whole
    else:
        lengths = sizes
    fed = np.flatnonzero(lengths > 0)
    begin = starts[fed]
    stop = begin + lengths[fed]
    display = _display(track, fed + first)
    packets: list[tuple[Pieces, int]] = [
        (((a, b),), d) for a, b, d in zip(begin.tolist(), stop.tolist(), display)
    ]
    return packets, _frames_in(track, first, fed, lengths[fed])


def _frames_in(track: VideoTrack, first: int, fed: np.ndarray, lengths: np.ndarray) -> int:
    """Frames decoded from fed sample prefixes: exact with an AV1 table, else one per sample."""
    table = track.av1_frames
    if table is None:
        return len(fed)
    rows = track.av1_rows
    assert rows is not None
    part = table[int(rows[first + fed[0]]) : int(rows[first + fed[-1] + 1])]
    limit = np.zeros(int(fed[-1]) + 1, np.int64)
    limit[fed] = lengths
    inside = part["end"] <= limit[part["sample"] - first]
    decodes = (part["flags"] & AV1_SHOW_EXISTING) == 0
    return int(np.count_nonzero(inside & decodes))


def _closure_packets(
    track: VideoTrack, first: int, wanted: np.ndarray, starts: np.ndarray
) -> tuple[list[tuple[Pieces, int]], int]:
    """Only the frames the wanted frames transitively reference (AV1 dependency table)."""
    assert track.av1_frames is not None
    feed = closure(track.av1_frames, first, wanted.tolist(), track.av1_rows)
    display = track.display
    at_sample = starts.tolist()
    packets: list[tuple[Pieces, int]] = []
    current = -1
    pieces: list[tuple[int, int]] = []
    for sample, a, b in feed.ranges:
        if sample != current:
            if pieces:
                packets.append(
                    (tuple(pieces), current if display is None else int(display[current]))
                )
            current, pieces = sample, []
        at = at_sample[sample - first]
        pieces.append((at + a, at + b))
    if pieces:
        packets.append((tuple(pieces), current if display is None else int(display[current])))
    return packets, feed.decoded


def _merged_ranges(gop_start: np.ndarray, wanted_decode: np.ndarray) -> list[tuple[int, int]]:
    """Decode-order ranges [keyframe, last wanted sample], overlapping ones merged."""
    ranges: list[tuple[int, int]] = []
    for first, last in sorted(zip(gop_start.tolist(), wanted_decode.tolist())):
        if ranges and first <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], last))
        else:
            ranges.append((first, last))
    return ranges

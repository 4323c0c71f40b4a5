"""Plan one clip: which byte ranges to read and which packets to feed the decoder.

Per GOP holding wanted frames: one read from its keyframe to the last sample needed. With
``skip=True`` samples that are not wanted are cut to the bytes later frames depend on (``keep``),
and dropped when nothing depends on them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kohakuclip.storage.catalog import VideoTrack


class FrameRangeError(IndexError):
    """A wanted frame index outside the video."""


@dataclass(frozen=True)
class GopRead:
    """One pread and the packets cut from it: (start, end, display index) per packet."""

    offset: int
    length: int
    packets: list[tuple[int, int, int]]


@dataclass(frozen=True)
class ClipPlan:
    reads: list[GopRead]
    targets: dict[int, list[int]]  # display index -> output positions in the clip
    packets: int  # packets fed to the decoder

    @property
    def bytes_read(self) -> int:
        return sum(r.length for r in self.reads)


def plan_clip(track: VideoTrack, frames: list[int] | np.ndarray, skip: bool = True) -> ClipPlan:
    """Plan the reads and decoder input for display-order ``frames`` of ``track``."""
    wanted_display = np.asarray(frames, dtype=np.int64)
    n = track.n
    if wanted_display.size == 0:
        raise ValueError("a clip needs at least one frame")
    bad = (wanted_display < 0) | (wanted_display >= n)
    if bad.any():
        raise FrameRangeError(
            f"frame {int(wanted_display[bad][0])} out of range (video has {n} frames)"
        )
    targets: dict[int, list[int]] = {}
    for t, d in enumerate(wanted_display.tolist()):
        targets.setdefault(d, []).append(t)
    unique_display = np.fromiter(targets, dtype=np.int64, count=len(targets))
    if track.decode_of_display is None:
        wanted_decode = np.sort(unique_display)
    else:
        wanted_decode = np.sort(track.decode_of_display[unique_display])
    keys = track.key_positions
    if len(keys) == 0 or keys[0] > wanted_decode[0]:
        keys = np.concatenate([[0], keys]).astype(np.int64)
    gop = np.searchsorted(keys, wanted_decode, side="right") - 1
    if track.display is not None:
        # Open GOPs: a leading picture (shown before its keyframe) may reference the previous
        # GOP, so decoding starts one keyframe earlier for it.
        leading = track.display[wanted_decode] < track.display[keys[gop]]
        gop = np.where(leading & (gop > 0), gop - 1, gop)
    gop_start = keys[gop]
    reads = []
    packets = 0
    for first, last in _merged_ranges(gop_start, wanted_decode):
        in_range = wanted_decode[(wanted_decode >= first) & (wanted_decode <= last)]
        samples = np.arange(first, last + 1)
        sizes = track.sizes[first : last + 1].astype(np.int64)
        if skip:
            wanted = np.zeros(len(samples), dtype=bool)
            wanted[in_range - first] = True
            lengths = np.where(wanted, sizes, track.keep[first : last + 1].astype(np.int64))
        else:
            lengths = sizes
        offsets = track.offsets[first : last + 1].astype(np.int64)
        base = int(offsets.min())
        end = int((offsets + sizes).max())
        lengths[0] = sizes[0]  # the keyframe is always fed whole
        fed = lengths > 0
        starts_in = offsets[fed] - base
        display = samples[fed] if track.display is None else track.display[samples[fed]]
        packets_gop = list(
            zip(starts_in.tolist(), (starts_in + lengths[fed]).tolist(), display.tolist())
        )
        packets += len(packets_gop)
        reads.append(GopRead(base, end - base, packets_gop))
    return ClipPlan(reads, targets, packets)


def _merged_ranges(gop_start: np.ndarray, wanted_decode: np.ndarray) -> list[tuple[int, int]]:
    """Decode-order ranges [keyframe, last wanted sample], overlapping ones merged."""
    ranges: list[tuple[int, int]] = []
    order = np.argsort(gop_start, kind="stable")
    for first, last in zip(gop_start[order].tolist(), wanted_decode[order].tolist()):
        if ranges and first <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], last))
        else:
            ranges.append((first, last))
    return ranges

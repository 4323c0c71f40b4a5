"""``plan_clip`` on hand-built tracks: the reads, the packets fed and the targets follow from the
frame table alone (keyframes, display order, keep bytes, AV1 dependencies)."""

from __future__ import annotations

import numpy as np
import pytest

from kohakuclip.formats import AV1_FRAME_RECORD, AV1_SHOW_FRAME, AV1_SHOWABLE
from kohakuclip.read.plan import FrameRangeError, plan_clip
from kohakuclip.tracks import VideoTrack

SIZE = 100  # bytes per sample; sample i lies at 1000 + 100 * i


def _track(
    n: int,
    keys: list[int],
    display: list[int] | None = None,
    keep: list[int] | None = None,
    av1_frames: np.ndarray | None = None,
) -> VideoTrack:
    keyframe = np.zeros(n, bool)
    keyframe[keys] = True
    return VideoTrack(
        codec="av1" if av1_frames is not None else "h264",
        width=64,
        height=48,
        fps=24.0,
        colorspace="bt601",
        full_range=False,
        prefix=b"",
        nal_length_size=0 if av1_frames is not None else 4,
        path="unused",
        offsets=np.arange(n, dtype=np.uint64) * SIZE + 1000,
        sizes=np.full(n, SIZE, np.uint32),
        keep=np.asarray(keep if keep is not None else [SIZE] * n, np.uint32),
        keyframe=keyframe,
        display=None if display is None else np.asarray(display, np.int64),
        av1_frames=av1_frames,
    )


def _fed(plan) -> list[list[int]]:
    """Per read, the display index of every packet fed."""
    return [[display for _, display in read.packets] for read in plan.reads]


def test_one_read_per_gop_from_its_keyframe_to_the_last_wanted_sample() -> None:
    track = _track(24, keys=[0, 8, 16])
    plan = plan_clip(track, [3, 5, 18], skip=False)
    assert [(r.offset, r.length) for r in plan.reads] == [(1000, 6 * SIZE), (2600, 3 * SIZE)]
    assert _fed(plan) == [[0, 1, 2, 3, 4, 5], [16, 17, 18]]
    assert plan.targets == {3: [0], 5: [1], 18: [2]}
    assert plan.packets == plan.decoded == 9
    assert plan.bytes_read == 9 * SIZE


def test_repeated_and_unsorted_frames_share_one_decode() -> None:
    track = _track(24, keys=[0, 8, 16])
    plan = plan_clip(track, [18, 3, 3, 18], skip=False)
    assert plan.targets == {18: [0, 3], 3: [1, 2]}
    assert _fed(plan) == [[0, 1, 2, 3], [16, 17, 18]]


def test_reads_of_one_gop_merge() -> None:
    track = _track(24, keys=[0, 8, 16])
    plan = plan_clip(track, [9, 12, 14], skip=False)
    assert len(plan.reads) == 1 and _fed(plan) == [list(range(8, 15))]


def test_keep_cuts_unwanted_samples_and_drops_the_unreferenced() -> None:
    keep = [SIZE, 0, 40, SIZE, 0, 10, SIZE, 0]
    track = _track(8, keys=[0], keep=keep)
    plan = plan_clip(track, [4], skip="keep")
    (read,) = plan.reads
    # the keyframe whole, sample 1 dropped (nothing depends on it), 2 cut to 40 bytes, 3 whole,
    # the wanted sample 4 whole although its keep is 0
    assert [pieces for pieces, _ in read.packets] == [
        ((0, SIZE),),
        ((2 * SIZE, 2 * SIZE + 40),),
        ((3 * SIZE, 4 * SIZE),),
        ((4 * SIZE, 5 * SIZE),),
    ]
    assert _fed(plan) == [[0, 2, 3, 4]]
    assert _fed(plan_clip(track, [4], skip=False)) == [[0, 1, 2, 3, 4]]
    assert _fed(plan_clip(track, [4], skip=True)) == [[0, 2, 3, 4]]  # no AV1 table: as keep


def test_open_gop_leading_pictures_start_a_keyframe_earlier() -> None:
    # decode order I0 P1 P2 P3 | I4 B5 B6 P7: B5 and B6 are shown before I4 (display 3.5 ...)
    display = [0, 1, 2, 5, 6, 3, 4, 7]
    track = _track(8, keys=[0, 4], display=display)
    leading = plan_clip(track, [3], skip=False)  # display 3 is decode sample 5
    assert _fed(leading) == [[0, 1, 2, 5, 6, 3]]
    trailing = plan_clip(track, [7], skip=False)  # decode 7: from keyframe 4
    assert _fed(trailing) == [[6, 3, 4, 7]]


def test_reach_back_starts_keyframes_earlier_but_never_before_the_first() -> None:
    track = _track(24, keys=[0, 8, 16])
    assert _fed(plan_clip(track, [17], False, reach_back=1)) == [list(range(8, 18))]
    assert _fed(plan_clip(track, [17], False, reach_back=5)) == [list(range(0, 18))]


def test_frames_out_of_range_are_refused() -> None:
    track = _track(8, keys=[0])
    for frames in ([8], [-1], [0, 9]):
        with pytest.raises(FrameRangeError, match="out of range"):
            plan_clip(track, frames)
    with pytest.raises(ValueError):
        plan_clip(track, [])


def _frames(records: list[tuple[int, int, int, int, int]]) -> np.ndarray:
    """AV1 frame records (sample, frame type, flags, refresh, reads), one frame per sample,
    each frame the whole sample."""
    table = np.zeros(len(records), AV1_FRAME_RECORD)
    for row, (sample, frame_type, flags, refresh, reads) in zip(table, records):
        row["sample"], row["start"], row["end"] = sample, 0, SIZE
        row["frame_type"], row["flags"], row["refresh"], row["reads"] = (
            frame_type,
            flags,
            refresh,
            reads,
        )
    return table


def test_the_av1_closure_feeds_only_the_frames_wanted_frames_reference() -> None:
    shown = AV1_SHOW_FRAME | AV1_SHOWABLE
    # key frame 0 writes every slot; 1 reads slot 0, writes slot 1; 2 reads slot 0 (not 1),
    # writes slot 2; 3 reads slot 2
    frames = _frames(
        [
            (0, 0, shown, 0xFF, 0),
            (1, 1, shown, 0x02, 0x01),
            (2, 1, shown, 0x04, 0x01),
            (3, 1, shown, 0x08, 0x04),
        ]
    )
    track = _track(4, keys=[0], av1_frames=frames)
    closure = plan_clip(track, [3], skip=True)
    assert _fed(closure) == [[0, 2, 3]]  # frame 1 is referenced by nothing wanted
    assert closure.decoded == 3
    assert _fed(plan_clip(track, [3], skip=False)) == [[0, 1, 2, 3]]

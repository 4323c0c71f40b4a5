"""The stock samplers: their frames, and KohakuClip 1.0.0's calls drawing as 1.0.0 does."""

from __future__ import annotations

import json
import random
import subprocess

import numpy as np
import pytest

import kohakuclip
from kohakuclip.read.sample import clip, random_frames
from tests.reference import REFERENCE_ENV, REFERENCE_PYTHON, needs_reference


def test_clip_steps_at_the_asked_rate_inside_the_video():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(40, 400))
        frames = clip(n, 8, rng, fps=6.0, video_fps=30.0)
        assert np.diff(frames).tolist() == [5] * 7
        assert frames[0] >= 0 and frames[-1] < n


def test_short_videos_squeeze_then_repeat():
    rng = np.random.default_rng(1)
    squeezed = clip(20, 8, rng, fps=6.0, video_fps=30.0)  # 35 frames asked, 20 there
    assert squeezed == sorted(set(squeezed)) and len(squeezed) == 8
    assert squeezed[0] >= 0 and squeezed[-1] <= 19 and squeezed[-1] - squeezed[0] >= 17
    assert clip(3, 5, rng) == [0, 0, 1, 1, 2]
    repeated = random_frames(3, 5, rng)
    assert repeated == sorted(repeated) and len(repeated) == 5 and set(repeated) == {0, 1, 2}


def test_random_frames_are_distinct_and_sorted():
    rng = np.random.default_rng(2)
    for _ in range(100):
        picked = random_frames(50, 8, rng)
        assert picked == sorted(set(picked)) and len(picked) == 8 and picked[-1] < 50


def test_the_calls_of_1_0_0_take_a_random_random():
    """``clip(n, fps, frames, target_fps, rng)``: ``frames`` frames ``fps / target_fps`` apart
    (rounded to the nearest), every frame when ``target_fps`` is None, the last frame repeated
    in a video too short; ``random_frames(n, frames, rng)``: distinct, sorted, at most ``n``.
    The same generator state gives the same frames, and ``kohakuclip.sampling`` holds both."""
    assert kohakuclip.sampling.clip is clip and kohakuclip.sampling.random_frames is random_frames
    for seed in range(50):
        frames = kohakuclip.clip(1000, 25.0, 16, 6.0, random.Random(seed))
        steps = np.diff(frames)
        assert set(steps.tolist()) <= {4, 5} and abs(frames[-1] - frames[0] - 62.5) <= 1
        assert frames == kohakuclip.clip(1000, 25.0, 16, 6.0, random.Random(seed))
        consecutive = kohakuclip.clip(100, 30.0, 8, None, random.Random(seed))
        assert np.diff(consecutive).tolist() == [1] * 7
        picked = kohakuclip.random_frames(100, 8, random.Random(seed))
        assert picked == sorted(set(picked)) and len(picked) == 8
    assert kohakuclip.clip(10, 30.0, 8, 6.0, random.Random(0)) == [0, 5, 9, 9, 9, 9, 9, 9]
    assert kohakuclip.random_frames(3, 8, random.Random(0)) == [0, 1, 2]


def test_both_call_forms_take_their_names_as_keywords():
    """1.0.0's names (``n``, ``target_fps``) bind to 1.0.0's call, ours to ours; each keyword
    form draws what its positional form draws from the same state."""
    positional = clip(100, 30.0, 8, None, random.Random(3))
    assert clip(np.int64(100), 30.0, np.int32(8), None, random.Random(3)) == positional
    assert clip(100, 30.0, 8, target_fps=None, rng=random.Random(3)) == positional
    assert clip(n=100, fps=30.0, frames=8, target_fps=None, rng=random.Random(3)) == positional
    assert random_frames(n=100, frames=8, rng=random.Random(4)) == random_frames(
        100, 8, random.Random(4)
    )
    ours = clip(100, 8, np.random.default_rng(5), 6.0, 30.0)
    assert clip(100, 8, rng=np.random.default_rng(5), fps=6.0, video_fps=30.0) == ours
    assert clip(n_video_frames=100, frames=8, rng=np.random.default_rng(5), fps=6.0,
                video_fps=30.0) == ours  # fmt: skip
    assert random_frames(
        n_video_frames=100, frames=8, rng=np.random.default_rng(6)
    ) == random_frames(100, 8, np.random.default_rng(6))


def test_mixed_calls_are_refused():
    with pytest.raises(TypeError, match=r"n and frames are ints"):
        clip(100, 30.0, np.random.default_rng(0), 6.0, random.Random(0))  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="rng must be a numpy Generator"):
        clip(100, 8, 3, 6.0, 30.0)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"n_video_frames and frames are ints, got 100, 2\.5"):
        clip(100, 2.5, np.random.default_rng(0))  # type: ignore[call-overload]
    assert len(clip(np.int64(100), np.int64(3), np.random.default_rng(0))) == 3
    with pytest.raises(TypeError, match=r"clip\(n, fps, frames, target_fps, rng\)"):
        clip(100, 8, np.random.default_rng(0), video_fps=random.Random(0))  # type: ignore[call-overload]
    with pytest.raises(TypeError, match=r"clip\(n_video_frames, frames, rng.*'rng'"):
        clip(100, 8)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="rng must be a generator"):
        random_frames(100, 8, 3)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="target_fps"):
        clip(100, 30.0, 8, 0.0, random.Random(0))
    with pytest.raises(ValueError, match="without frames"):
        random_frames(0, 3, random.Random(0))


_REFERENCE_DRAWS = """
import json, random, sys, kohakuclip
cases = json.loads(sys.stdin.read())
def draw(kind, n, fps, frames, target, seed):
    rng = random.Random(seed)
    if kind == "clip":
        return kohakuclip.clip(n, fps, frames, target, rng)
    if kind == "clip by name":
        return kohakuclip.clip(n=n, fps=fps, frames=frames, target_fps=target, rng=rng)
    if kind == "random_frames":
        return kohakuclip.random_frames(n, frames, rng)
    return kohakuclip.random_frames(n=n, frames=frames, rng=rng)
print(json.dumps([draw(*case) for case in cases]))
"""


@needs_reference
def test_draws_equal_those_of_1_0_0():
    """1.0.0's wheel (a black box) and ours draw the same frames for the same generator state,
    over rates that round to halves, short videos and upsampling, called by position or by
    1.0.0's names."""
    picks = random.Random(7)
    cases = []
    for k in range(3000):
        n = picks.randint(1, 400)
        fps = picks.choice([15.0, 23.976, 24.0, 25.0, 29.97, 30.0, 60.0])
        target = picks.choice([None, 1.0, 2.0, 6.0, 7.0, 12.0, 24.0, 30.0, 60.0])
        kind = ("random_frames", "clip", "clip by name", "random_frames by name")[k % 4]
        cases.append((kind, n, fps, picks.randint(1, 20), target, picks.randrange(1 << 30)))
    done = subprocess.run(
        [REFERENCE_PYTHON, "-c", _REFERENCE_DRAWS],
        input=json.dumps(cases), capture_output=True, text=True, timeout=300, env=REFERENCE_ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout)
    assert [_draw(*case) for case in cases] == theirs


def _draw(kind: str, n: int, fps: float, frames: int, target: float | None, seed: int) -> list[int]:
    """One case of ``_REFERENCE_DRAWS``, drawn by us."""
    rng = random.Random(seed)
    if kind == "clip":
        return clip(n, fps, frames, target, rng)
    if kind == "clip by name":
        return clip(n=n, fps=fps, frames=frames, target_fps=target, rng=rng)
    if kind == "random_frames":
        return random_frames(n, frames, rng)
    return random_frames(n=n, frames=frames, rng=rng)

"""Encoders leave no real-time threads behind, in process and in an ffmpeg subprocess.

SVT-AV1 moves its threads and its opener to SCHED_FIFO 99 when the effective user is root: the
tests that show it need root (they are skipped otherwise), and each first shows that the
encoder does it unguarded, so that the guarded check can fail.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import av
import numpy as np
import pytest

from kohakuclip.write.image_codecs import _encode_av1
from kohakuclip.write.scheduling import (
    encoder_subprocess_setup,
    normal_scheduling,
    realtime_threads,
)
from kohakuclip.write.settings import EncodeSettings
from kohakuclip.write.video import encode_video
from tests.media import VideoSpec, make_video

needs_root = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0 or not os.path.isdir("/proc/self/task"),
    reason="SVT-AV1 only raises priorities when run as root (Linux)",
)


def _restore(threads: set[int]) -> None:
    for tid in threads:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def _open_svt_unguarded() -> tuple[object, set[int]]:
    context = av.CodecContext.create("libsvtav1", "w")
    context.width, context.height, context.pix_fmt = 64, 64, "yuv420p"
    context.time_base = 1
    context.options = {"preset": "12", "svtav1-params": "log-level=0"}
    before = realtime_threads()
    context.open()
    return context, realtime_threads() - before


@needs_root
def test_svt_av1_goes_real_time_unguarded():
    """The hazard itself: opening SVT-AV1 as root makes threads (the opener too) real-time."""
    context, made = _open_svt_unguarded()
    try:
        assert threading.get_native_id() in made
        assert len(made) > 1
    finally:
        _restore(made)
        del context


@needs_root
def test_encode_video_leaves_no_real_time_threads():
    data = make_video(VideoSpec(codec="h264", width=96, height=64, frames=12))
    assert realtime_threads() == set()
    encoded = encode_video(data, EncodeSettings(codec="av1", preset=12))
    assert encoded.frames == 12
    assert realtime_threads() == set()
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


@needs_root
def test_concurrent_encodes_leave_no_real_time_threads():
    """Encoders opened at once on several threads (as the writer's workers do): each open puts
    back what it made real-time, whichever other open happened in between. The threads are
    checked before they end (the opener itself is one SVT-AV1 makes real-time)."""
    sources = [
        make_video(VideoSpec(codec="h264", width=96, height=64, frames=12, seed=i))
        for i in range(4)
    ]
    settings = EncodeSettings(codec="av1", preset=12)
    start = threading.Barrier(4)

    def encode(data: bytes) -> int:
        start.wait()
        return encode_video(data, settings).frames

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(encode, sources)) == [12] * 4
        assert realtime_threads() == set()


@needs_root
def test_avif_encode_leaves_no_real_time_threads():
    assert _encode_av1(np.full((48, 64, 3), 128, np.uint8), False, 70)
    assert realtime_threads() == set()


@needs_root
def test_threads_real_time_before_stay_so():
    """Only what the block made real-time is put back: a caller's own choice stands."""
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    try:
        with normal_scheduling():
            context, _ = _open_svt_unguarded()
        assert os.sched_getscheduler(0) == os.SCHED_FIFO
        assert realtime_threads() == {threading.get_native_id()}
        del context
    finally:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


@needs_root
def test_subprocess_cannot_go_real_time():
    """The ffmpeg backend's preexec: a root child can no longer set a real-time policy (and
    without it, it can)."""
    code = (
        "import os\n"
        "try:\n"
        "    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)); print('rt')\n"
        "except PermissionError:\n"
        "    print('refused')\n"
    )
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    guarded = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        preexec_fn=encoder_subprocess_setup(),
    )
    assert plain.stdout.strip() == "rt"
    assert guarded.stdout.strip() == "refused"


@needs_root
def test_ffmpeg_backend_encoder_threads_stay_normal():
    """SVT-AV1 in the ffmpeg subprocess: its threads stay SCHED_OTHER while it encodes."""
    from kohakuclip.write.ffmpeg_backend import encode_video_ffmpeg

    data = make_video(VideoSpec(codec="h264", width=320, height=192, frames=48))
    seen: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for pid in os.listdir("/proc"):
                if pid.isdigit() and _is_ffmpeg_child(int(pid)):
                    seen.append(len(realtime_threads(int(pid))))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        encoded = encode_video_ffmpeg(data, EncodeSettings(codec="av1", preset=10))
    finally:
        done.set()
        watcher.join()
    assert encoded.frames == 48
    assert seen, "the watcher never saw the ffmpeg process"
    assert max(seen) == 0


def _is_ffmpeg_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/comm") as f:
            return int(fields[1]) == os.getpid() and "ffmpeg" in f.read()
    except (OSError, IndexError, ValueError):
        return False

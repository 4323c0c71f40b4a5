"""Writer speed: seconds of encode per minute of video, per codec, beside KohakuClip 1.0.0.

    python benchmarks/write_bench.py [VIDEO...] [--make 3] [--seconds 10] [--codecs av1 h264 hevc]
        [--workers 2] [--reference "$(../shared/tools/reference-kohakuclip.sh)"] [--ffmpeg]
    python benchmarks/write_bench.py --cluster [--make 4] [--seconds 4] [--cores 100 1000]

Each encoder re-encodes the same sources one after the other with one thread (the writer runs one
video per thread, so per-thread speed is what scales), first ours, then the reference in its own
process; the ratio is ours / reference (lower is faster). The reference's FFmpeg has SVT-AV1 only,
so it is compared on AV1. ``--workers`` also times ``write_videos`` with that many encoder threads
against one, to show how encoding scales. Without videos, ``--make N`` natural-looking synthetic
clips (benchmarks/content.py, 640x360, 24 fps) are made first: real footage encodes at other
speeds, so quote these numbers with that caveat.

``--cluster`` measures the job as a cluster runs it (AV1 defaults): videos and minutes of video
per hour per core from one worker, the scaling to 2 worker threads in one process, and from 1 to
2 Ray tasks (``write_videos(..., ray=True)`` on a local 2-CPU Ray, started once and warmed up
first), then what ``--cores`` cores do per day at the one-worker rate.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import av

from kohakuclip.write.settings import EncodeSettings
from kohakuclip.write.shards import write_videos
from kohakuclip.write.video import encode_video

REFERENCE = r"""
import json, sys, time
import kohakuclip._core as core
codec, paths = sys.argv[1], sys.argv[2:]
times = []
for path in paths:
    start = time.perf_counter()
    core.encode(path, codec=codec)
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def _minutes(paths: list[str]) -> float:
    total = 0.0
    for path in paths:
        with av.open(path) as c:
            stream = c.streams.video[0]
            frames = stream.frames or sum(1 for _ in c.demux(stream))
            total += frames / float(stream.average_rate or 25)
    return total / 60


def _ours(paths: list[str], codec: str, backend: str) -> float:
    settings = EncodeSettings(codec=codec)  # type: ignore[arg-type]
    if backend == "ffmpeg":
        from kohakuclip.write.ffmpeg_backend import encode_video_ffmpeg as encoder
    else:
        encoder = encode_video
    start = time.perf_counter()
    for path in paths:
        encoder(path, settings)
    return time.perf_counter() - start


def _reference(python: str, paths: list[str], codec: str) -> float | None:
    done = subprocess.run(
        [python, "-c", REFERENCE, codec, *paths], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        print(f"  reference {codec}: {lines[-1] if lines else 'failed'}", file=sys.stderr)
        return None
    return float(sum(json.loads(done.stdout)))


def _scaling(paths: list[str], workers: int) -> tuple[float, float]:
    """Wall seconds of ``write_videos`` (AV1 defaults) with 1 and with ``workers`` encoder
    threads."""
    walls = []
    for count in (1, workers):
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            write_videos(out, paths, workers=count, progress=False)
            walls.append(time.perf_counter() - start)
    return walls[0], walls[1]


def _wall(run: Callable[[str], object]) -> float:
    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        run(out)
        return time.perf_counter() - start


def _cluster(paths: list[str], minutes: float, cores: list[int]) -> None:
    """Per-core rates, 1 -> 2 workers, 1 -> 2 Ray tasks, and the per-day rate of N cores."""
    one = _wall(lambda out: write_videos(out, paths, workers=1, progress=False))
    two = _wall(lambda out: write_videos(out, paths, workers=2, progress=False))
    per_hour = len(paths) / one * 3600
    print(f"{len(paths)} videos, {minutes * 60:.0f} s of video, AV1 defaults")
    print(
        f"1 worker: {one:.1f} s = {per_hour:.0f} videos/hour/core, "
        f"{minutes / one * 3600 / 60:.1f} hours of video per hour per core"
    )
    print(f"2 workers (threads): {two:.1f} s, {one / two:.2f}x")
    try:
        import ray
    except ImportError:
        print("Ray: not installed (pip install 'kohakuclip[ray]')")
    else:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            _wall(lambda out: write_videos(out, paths[:2], ray=True, ray_parts=2, progress=False))
            tasks = [
                _wall(
                    lambda out, n=n: write_videos(out, paths, ray=True, ray_parts=n, progress=False)
                )
                for n in (1, 2)
            ]
        finally:
            ray.shutdown()
        print(
            f"Ray, 1 task: {tasks[0]:.1f} s, 2 tasks: {tasks[1]:.1f} s, "
            f"{tasks[0] / tasks[1]:.2f}x (merge included)"
        )
    for n in cores:
        videos = per_hour * 24 * n
        hours = minutes / one * 3600 / 60 * 24 * n
        print(f"{n} cores at the 1-worker rate: {videos:,.0f} such videos/day, {hours:,.0f} h/day")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("videos", nargs="*")
    p.add_argument("--make", type=int, default=3, help="synthetic clips when no videos are given")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--codecs", nargs="+", default=["av1", "h264", "hevc"])
    p.add_argument("--workers", type=int, default=2, help="threads to compare with 1 (0: skip)")
    p.add_argument("--ffmpeg", action="store_true", help="also time the ffmpeg CLI backend")
    p.add_argument("--cluster", action="store_true", help="per-core, 2-worker and Ray scaling")
    p.add_argument("--cores", type=int, nargs="+", default=[100, 1000], help="for --cluster")
    default_ref = "/tmp/kohakuclip-ref/python"
    p.add_argument("--reference", default=default_ref if os.path.exists(default_ref) else None)
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="write-bench-") as scratch:
        paths = args.videos
        if not paths:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from content import natural_videos

            paths = natural_videos(scratch, args.make, seconds=args.seconds)
        minutes = _minutes(paths)
        if args.cluster:
            _cluster(paths, minutes, args.cores)
            return
        print(f"{len(paths)} videos, {minutes * 60:.0f} s of video; one encoder thread each")
        print(f"{'codec':<18}{'ours s/min':>12}{'reference s/min':>17}{'ours / ref':>12}")
        for codec in args.codecs:
            backends = ["native", "ffmpeg"] if args.ffmpeg else ["native"]
            ref = _reference(args.reference, paths, codec) if args.reference else None
            for backend in backends:
                ours = _ours(paths, codec, backend) / minutes
                label = codec if backend == "native" else f"{codec} (ffmpeg)"
                if ref is None:
                    print(f"{label:<18}{ours:>12.1f}{'-':>17}{'-':>12}")
                else:
                    theirs = ref / minutes
                    print(f"{label:<18}{ours:>12.1f}{theirs:>17.1f}{ours / theirs:>12.2f}")
        if args.workers > 1:
            one, many = _scaling(paths, args.workers)
            print(
                f"write_videos(), AV1 defaults: 1 thread {one:.1f} s, {args.workers} threads "
                f"{many:.1f} s: {one / many:.2f}x"
            )


if __name__ == "__main__":
    main()

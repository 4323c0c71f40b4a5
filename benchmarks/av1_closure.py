"""Frames decoded per output frame on AV1: keyframe-to-last, ``keep`` and the per-clip closure.

    python benchmarks/av1_closure.py [video.mp4] [--seconds 30] [--clips 100] [--seed 0]

Without a video it encodes tests/media.py's synthetic pattern at 640x360, 24 fps, with the
writer's defaults (SVT-AV1 preset 6, GOP 16, deblocking and CDEF off); synthetic content
compresses differently from real footage, so treat its byte counts with care (the reference
structure, which decides the frame counts, is the encoder's). Every sampled clip is decoded
both ways with libdav1d (one thread) and checked bit for bit against a full decode.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import sys
import time
from typing import Any

import av
import numpy as np

from kohakuclip.codecs.av1 import analyze, closure, feed_packets
from kohakuclip.formats import AV1_SHOW_EXISTING

SPECS = (("8@6fps", 8, 4), ("8@24fps", 8, 1), ("16@6fps", 16, 4), ("8 random", 8, 0))


def synthetic(seconds: float) -> bytes:
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from tests.media import VideoSpec, make_video

    params = "keyint=16:enable-dlf=0:enable-cdef=0:enable-restoration=0"
    spec = VideoSpec(
        codec="av1",
        width=640,
        height=360,
        frames=round(seconds * 24),
        options={"preset": "6", "crf": "36", "svtav1-params": params},
    )
    return make_video(spec)


def digest(frame: av.VideoFrame) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in frame.planes:
        rows = np.frombuffer(memoryview(p), np.uint8).reshape(p.height, p.line_size)
        h.update(np.ascontiguousarray(rows[:, : p.width]).tobytes())
    return h.digest()


def run(packets, ctx: Any) -> list[tuple[int, bytes]]:
    out = []
    for sample, data in packets:
        packet = av.Packet(bytes(data))
        packet.pts = sample
        out += [(f.pts, digest(f)) for f in ctx.decode(packet)]
    return out


def timed(packets, ctx: Any) -> float:
    start = time.perf_counter()
    for sample, data in packets:
        packet = av.Packet(bytes(data))
        packet.pts = sample
        for _ in ctx.decode(packet):
            pass
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("video", nargs="?")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--clips", type=int, default=100, help="clips per shape")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t = time.perf_counter()
    if args.video:
        with open(args.video, "rb") as f:
            mp4 = f.read()
    else:
        mp4 = synthetic(args.seconds)
    print(f"video: {len(mp4) / 1e6:.1f} MB ({time.perf_counter() - t:.1f} s to load or encode)")
    with av.open(io.BytesIO(mp4), "r") as c:
        s = c.streams.video[0]
        packets = [p for p in c.demux(s) if p.size]
        samples = [bytes(p) for p in packets]
        keys = [i for i, p in enumerate(packets) if p.is_keyframe]
        print(f"{s.codec_context.width}x{s.codec_context.height}, {len(samples)} samples")

    t = time.perf_counter()
    deps = analyze(samples)
    took = time.perf_counter() - t
    frames = deps.frames
    sizes = np.array([len(x) for x in samples])
    keep = deps.keep.astype(np.int64)
    decodes = (frames["flags"] & AV1_SHOW_EXISTING) == 0
    print(
        f"analyze: {took * 1e3:.1f} ms ({took / len(frames) * 1e6:.1f} us per frame OBU, "
        f"{len(frames)} frame OBUs, {int(decodes.sum())} decoded ones)"
    )
    existing = np.zeros(len(samples), dtype=bool)
    existing[frames["sample"][~decodes]] = True
    dropped = int(((keep == 0) & ~existing).sum())
    truncated = int(((keep > 0) & (keep < sizes)).sum())
    print(
        f"keep: of {len(samples)} samples, {int(existing.sum())} are show_existing_frame (keep 0), "
        f"{dropped} others dropped ({dropped / len(samples):.0%}), {truncated} truncated "
        f"({truncated / len(samples):.0%}); {int((sizes - keep).sum()) / sizes.sum():.0%} of the "
        "bytes are skippable"
    )

    full_ctx = av.CodecContext.create("libdav1d", "r")
    full_ctx.thread_count = 1
    full = dict(run(list(enumerate(samples)), full_ctx))
    rng = np.random.default_rng(args.seed)
    n = len(samples)
    closure_us = []
    for name, length, stride in SPECS:
        if (length - 1) * stride >= n or length > n:
            print(f"{name:9s} skipped: the video is too short")
            continue
        counts = np.zeros(4)
        seconds = np.zeros(2)
        for _ in range(args.clips):
            if stride:
                start = int(rng.integers(0, n - (length - 1) * stride))
                wanted = [start + stride * i for i in range(length)]
            else:
                wanted = sorted(rng.choice(n, length, replace=False).tolist())
            groups: dict[int, list[int]] = {}
            for w in wanted:
                groups.setdefault(max(k for k in keys if k <= w), []).append(w)
            keep_feed, closure_feed = [], []
            for key, ws in groups.items():
                t = time.perf_counter()
                feed = closure(frames, key, ws)
                closure_us.append((time.perf_counter() - t) * 1e6)
                closure_feed += feed_packets(feed, samples)
                counts[2] += feed.decoded
                counts[0] += feed.total
                for i in range(key, ws[-1] + 1):
                    size = len(samples[i]) if i in ws else keep[i]
                    if size:
                        keep_feed.append((i, samples[i][:size]))
                        mine = (frames["sample"] == i) & decodes
                        counts[1] += int((mine & (frames["end"] <= size)).sum())
            counts[3] += len(wanted)
            for k, feed_list in enumerate((keep_feed, closure_feed)):
                ctx = av.CodecContext.create("libdav1d", "r")
                ctx.thread_count = 1
                out = run(feed_list, ctx)
                got = {p for p, _ in out}
                assert set(wanted) <= got, (name, wanted)
                assert all(full[p] == d for p, d in out), (name, wanted)
                ctx = av.CodecContext.create("libdav1d", "r")
                ctx.thread_count = 1
                seconds[k] += timed(feed_list, ctx)
        per = counts[:3] / counts[3]
        ms = seconds * 1e3 / counts[3]
        print(
            f"{name:9s} frames decoded per output frame: keyframe-to-last {per[0]:.2f}, "
            f"keep {per[1]:.2f}, closure {per[2]:.2f}; libdav1d ms per output frame: "
            f"keep {ms[0]:.2f}, closure {ms[1]:.2f}  (all clips bit-exact)"
        )
    median, p99 = np.median(closure_us), np.percentile(closure_us, 99)
    print(f"closure: median {median:.0f} us per GOP, p99 {p99:.0f}")


if __name__ == "__main__":
    main()

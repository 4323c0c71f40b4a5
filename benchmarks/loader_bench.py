"""The training-side loader alone: clips/s and training-thread CPU per batch, per setup.

    python benchmarks/loader_bench.py SHARD_OR_FOLDER... [--setups 0x8 0x16 1x16 2x8 4x4]
        [--batches 50] [--batch 16 --frames 8 --fps 6] [--cuda]

A setup ``WxT`` is W DataLoader worker processes (0: decode in the training process) with T decode
threads each; ``WxTpN`` also sets the loader's prefetch to N batches (default ``--prefetch``).
Each setup runs in a fresh process: a ClipLoader over a ClipDataset, a few warm-up batches, then
``--batches`` timed ones, no model. "train ms/batch" is the CPU time the training thread spends
inside ``next(loader)`` (drawing items, submitting, allocating, receiving from workers); with
workers and pinned memory the DataLoader's pin-memory thread adds a copy on top. In process
(W = 0) two more columns: "threads busy", the decode threads' CPU seconds per stage
(``kohakuclip.profile()``) over their wall-clock seconds, and "cores", the process's CPU seconds
over the wall clock.
``--cuda`` also copies each batch to the GPU (non_blocking) and synchronises, as training would.
Without sources, ``--make N`` writes N sample videos into shards first (see bench.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from bench import add_loader_options, parse_setup, sources_or_samples

WORKER = r"""
import json, sys, time
import torch
import kohakuclip
from kohakuclip.torch import ClipDataset, ClipLoader
spec = json.load(sys.stdin)
dataset = ClipDataset(
    spec["sources"], spec["batch"], frames=spec["frames"], fps=spec["fps"],
    threads=spec["threads"], size=spec["size"], hflip=0.5, seed=0,
)
loader = ClipLoader(dataset, workers=spec["workers"], prefetch=spec["prefetch"])
batches = iter(loader)
cuda = spec["cuda"]

def step():
    t = time.thread_time()
    video = next(batches)
    cpu = time.thread_time() - t
    if cuda:
        video.cuda(non_blocking=True)
        torch.cuda.synchronize()
    return cpu

for _ in range(spec["warmup"]):
    step()
kohakuclip.profile(reset=True)
process0 = time.process_time()
t0 = time.perf_counter()
cpu = sum(step() for _ in range(spec["batches"]))
wall = time.perf_counter() - t0
process = time.process_time() - process0
stages = kohakuclip.profile()
decode = sum(stages[k] for k in ("read", "decode", "convert", "resize", "plan"))
loader.close()
json.dump({"wall": wall, "train_cpu": cpu, "decode": decode, "process": process}, sys.stdout)
"""


def run_setup(spec: dict) -> dict:
    """One setup in a fresh interpreter: nothing shared with the previous one."""
    done = subprocess.run(
        [sys.executable, "-c", WORKER], input=json.dumps(spec), capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"setup {spec['workers']}x{spec['threads']} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("sources", nargs="*")
    ap.add_argument(
        "--setups",
        nargs="+",
        default=["0x8", "0x16", "1x16", "2x8", "4x4"],
        help="WORKERSxTHREADS[pPREFETCH], e.g. 0x8 (in process, 8 threads), 2x4 or 0x15p6",
    )
    ap.add_argument("--batches", type=int, default=50, help="timed batches per setup")
    ap.add_argument("--cuda", action="store_true", help="copy each batch to the GPU")
    add_loader_options(ap, size=256)
    args = ap.parse_args()
    sources = sources_or_samples(args)
    print(f"sources: {sources}")
    print(
        f"{args.batch} clips of {args.frames} frames at {args.fps} fps, {args.size} px, "
        f"{args.batches} batches; {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}"
    )
    header = (
        f"{'setup':<38} {'clips/s':>8} {'train ms/batch':>15} {'threads busy':>12} {'cores':>6}"
    )
    print(header)
    print("-" * len(header))
    for text in args.setups:
        workers, threads, prefetch = parse_setup(text, args.prefetch)
        spec = dict(
            sources=sources, batch=args.batch, frames=args.frames, fps=args.fps, size=args.size,
            threads=threads, workers=workers, prefetch=prefetch, cuda=args.cuda,
            warmup=args.warmup, batches=args.batches,
        )  # fmt: skip
        r = run_setup(spec)
        name = (
            f"in process, {threads} threads"
            if workers == 0
            else f"{workers} worker{'s' if workers > 1 else ''} x {threads} threads"
        )
        name += f", prefetch {prefetch or 'default'}"
        clips = args.batch * args.batches / r["wall"]
        train = r["train_cpu"] / args.batches * 1000
        busy, cores = "-", "-"
        if workers == 0:
            busy = f"{r['decode'] / (r['wall'] * threads):.0%}"
            cores = f"{r['process'] / r['wall']:.1f}"
        print(f"{name:<38} {clips:>8.1f} {train:>15.3f} {busy:>12} {cores:>6}", flush=True)


if __name__ == "__main__":
    main()

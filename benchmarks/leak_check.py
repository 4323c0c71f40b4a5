"""Long-run memory and descriptor check: does anything grow per batch, per round, per reader?

    python benchmarks/leak_check.py [--batches 1500] [--rounds 100] [--readers 200]
        [--loader-batches 300] [--json OUT]

Measures anonymous resident memory (``Anonymous`` of /proc/self/smaps_rollup: heap and
buffers, not the mapped libraries or page cache) and open descriptors, at the start, after a
warm-up (per-thread decoders and buffers are allocated then), and at the end; the slope is a
least-squares fit of memory per step after the warm-up. Sample videos are generated first.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def anon_kb() -> int:
    """Anonymous resident memory of this process, in KB."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1])
    raise RuntimeError("no Anonymous line in smaps_rollup")


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def track(name: str, steps: int, step: Callable[[int], None], warmup: int) -> dict:
    """Run ``step`` ``steps`` times; memory, descriptors and threads before, after warm-up and
    after."""
    gc.collect()
    start, fds0, threads0 = anon_kb(), open_fds(), threading.active_count()
    samples = []
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
        if i + 1 == warmup:
            gc.collect()
            warm = anon_kb()
        if i + 1 >= warmup and (i + 1 - warmup) % max(1, (steps - warmup) // 50) == 0:
            samples.append((i + 1, anon_kb()))
    gc.collect()
    end, fds1, threads1 = anon_kb(), open_fds(), threading.active_count()
    xs, ys = np.array(samples, dtype=float).T if len(samples) > 1 else (np.zeros(2), np.zeros(2))
    slope = float(np.polyfit(xs, ys, 1)[0]) if len(samples) > 1 else 0.0
    return dict(
        name=name,
        steps=steps,
        start_kb=start,
        warm_kb=warm,
        end_kb=end,
        slope_kb=slope,
        fds_start=fds0,
        fds_end=fds1,
        threads_start=threads0,
        threads_end=threads1,
        seconds=time.perf_counter() - t0,
    )


def make_shards(root: str) -> list[str]:
    sys.path.insert(0, HERE)
    from content import natural_videos

    from kohakuclip import write_videos

    videos = natural_videos(os.path.join(root, "sources"), 4, seconds=4.0, width=320, height=180)
    out = os.path.join(root, "shards")
    result = write_videos(out, videos, codec="av1", per_shard=2, progress=False)
    return [os.path.join(out, s) for s in result.shards]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--batches", type=int, default=1500)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--readers", type=int, default=200)
    ap.add_argument("--loader-batches", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    for option, steps, warmup in (
        ("--batches", args.batches, 50),
        ("--rounds", args.rounds, 5),
        ("--readers", args.readers, 10),
        ("--loader-batches", args.loader_batches, 20),
    ):
        if steps < warmup + 2:  # a slope needs two samples after the warm-up
            ap.error(f"{option} {steps}: at least {warmup + 2} (its warm-up is {warmup} steps)")

    import kohakuclip
    from kohakuclip import ImageReader, Reader
    from kohakuclip.write.video import encode

    root = tempfile.mkdtemp(prefix="kc-leak-")
    shards = make_shards(root)
    rows = []
    for mode in ("rgb", "yuv_resized"):
        reader = Reader(shards, size=128, mode=mode, threads=args.threads, hflip=0.5, seed=0)

        def read_batch(i: int, reader: Reader = reader) -> None:
            reader.read(reader.sample(4, 8, fps=6.0, seed=i))

        rows.append(track(f"{mode} batches (4 clips x 8 frames)", args.batches, read_batch, 50))
        reader.close()

    source = os.path.join(root, "sources", "natural_000.mp4")

    def encode_and_pack(i: int) -> None:
        mp4 = encode(source, codec="av1", preset=12, max_short=96)
        kohakuclip.pack(os.path.join(root, "round.zip"), [(f"v{i}.mp4", mp4)])

    rows.append(track("encode + pack rounds", args.rounds, encode_and_pack, 5))

    images = os.path.join(root, "images")
    _make_image_shard(images)
    image_shards = [os.path.join(images, f) for f in os.listdir(images) if f.endswith(".zip")]

    def readers(i: int) -> None:
        with Reader(shards, size=32, threads=2) as r:
            r.read([(0, [0, 1])])
        with ImageReader(image_shards, size=32, threads=2) as ir:
            ir.read([0])

    rows.append(track("Reader + ImageReader made and closed", args.readers, readers, 10))

    def dropped(i: int) -> None:  # no close(): the finalizers join the threads
        Reader(shards, size=32, threads=2).read([(0, [0, 1])])
        ImageReader(image_shards, size=32, threads=2).read([0])

    rows.append(track("Reader + ImageReader dropped, no close", args.readers, dropped, 10))
    rows.append(_dataset_row(shards, image_shards, args))
    rows.append(_loader_row(shards, args))
    print(
        f"anonymous resident memory (KB) and descriptors; {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} CPUs"
    )
    header = (
        f"{'run':<40} {'steps':>6} {'start':>8} {'warm':>8} {'end':>8} {'KB/step':>8} {'fds':>9}"
        f" {'threads':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['name']:<40} {r['steps']:>6} {r['start_kb']:>8} {r['warm_kb']:>8} "
            f"{r['end_kb']:>8} {r['slope_kb']:>8.2f} {r['fds_start']:>4}->{r['fds_end']:<4}"
            f" {r['threads_start']:>4}->{r['threads_end']:<4}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def _make_image_shard(folder: str) -> None:
    from PIL import Image

    from kohakuclip import write_images

    src = os.path.join(folder, "src")
    os.makedirs(src, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(4):
        pixels = rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(src, f"img{i}.png"))
    write_images(folder, [src], min_short=0, progress=False)


def _skipped(name: str) -> dict:
    return dict(
        name=name,
        steps=0,
        start_kb=0,
        warm_kb=0,
        end_kb=0,
        slope_kb=0.0,
        fds_start=0,
        fds_end=0,
        threads_start=0,
        threads_end=0,
        seconds=0.0,
    )


def _dataset_row(shards: list[str], image_shards: list[str], args: argparse.Namespace) -> dict:
    """ClipDataset + ImageDataset made, one batch each read, dropped without close()."""
    try:
        from kohakuclip.torch import ClipDataset, ImageDataset
    except ImportError:
        return _skipped("datasets dropped (torch missing)")

    def step(i: int) -> None:
        ClipDataset(shards, batch_size=2, frames=2, threads=2, size=32).read_batch(i)
        ImageDataset(image_shards, batch_size=2, threads=2, size=32).read_batch(i)

    return track("Clip + ImageDataset dropped, no close", args.readers, step, 10)


def _loader_row(shards: list[str], args: argparse.Namespace) -> dict:
    """ClipLoader with 2 DataLoader workers: the training process's memory per batch."""
    try:
        from kohakuclip.torch import ClipDataset, ClipLoader
    except ImportError:
        return _skipped("ClipLoader, 2 workers (torch missing)")
    dataset = ClipDataset(shards, batch_size=4, frames=8, fps=6.0, threads=2, size=128, seed=0)
    loader = ClipLoader(dataset, workers=2)
    batches = iter(loader)

    def step(i: int) -> None:
        next(batches)

    return track("ClipLoader, 2 workers x 2 threads", args.loader_batches, step, 20)


if __name__ == "__main__":
    main()

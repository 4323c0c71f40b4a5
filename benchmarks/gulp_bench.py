"""GulpIO directories vs AV1 shards of the same videos: clips/s and bytes stored.

    python benchmarks/gulp_bench.py [--videos DIR] [--count 12] [--size 224] [--clip 8] [--fps 8]
        [--batch 16] [--batches 8] [--workers 0 2] [--threads 2] [--rounds 1] [--work DIR]
        [--no-gulp-loader]

Without ``--videos`` it makes ``--count`` synthetic videos (a panning texture, shapes, noise).
Stores each set three ways: a gulp directory at native fps, a gulp directory at the clip's fps
(GulpIO's usual ``--frame_rate``), and an AV1 zip shard (kohakuclip's writer), all with the short
side at ``--store`` pixels. Then reads batches of ``--batch`` clips of ``--clip`` frames at
``--fps``, random crops of ``--size``:

- gulp: ``GulpVideoDataset`` + ``ComposeVideo([Scale], [RandomCropVideo])`` + torch's DataLoader
  and ``kohakuclip.gulp.loader.DataLoader`` (numpy, GulpIO's), ``--workers`` processes each;
- AV1: ``kohakuclip.torch.ClipDataset`` + ``ClipLoader`` (in process, ``--threads`` threads),
  when those modules are available;
- ``kohakuclip.Reader`` (in process, ``--threads`` threads, the same seeded clips) on both gulp
  directories as they are, and on AV1 shards converted from the native-fps gulp directory by
  ``kohakuclip.write_videos`` (what ``kohakuclip-write OUT GULP_DIR`` does).

Each run reads one warm-up batch, then times ``--batches`` batches; ``--rounds`` repeats them
all, interleaved. CPU ms/clip counts this process's threads (so only the in-process runs have it):
on a busy machine it is steadier than clips/s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time
from fractions import Fraction
from typing import Any

import av
import cv2
import numpy as np

from kohakuclip.gulp import GulpIngestor, JsonVideoAdapter
from kohakuclip.gulp.adapters import VIDEO_EXTENSIONS
from kohakuclip.gulp.dataset import GulpVideoDataset
from kohakuclip.gulp.transforms import ComposeVideo, RandomCropVideo, Scale


def synthetic_video(path: str, seed: int, frames: int, fps: int, w: int, h: int) -> None:
    """A panning multi-scale texture with drifting shapes and sensor noise, so that neither
    codec gets the easy ride flat test patterns give."""
    rng = np.random.default_rng(seed)
    big_h, big_w = h + frames, w + 2 * frames
    texture = sum(
        cv2.GaussianBlur(rng.normal(0, 1, (big_h, big_w, 3)).astype(np.float32), (0, 0), s) * s
        for s in (1.5, 6.0, 24.0)
    )
    texture = (texture - texture.min()) / (texture.max() - texture.min()) * 255
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    shapes = [(rng.uniform(0, w), rng.uniform(0, h), rng.uniform(-3, 3), rng.uniform(-2, 2),
               rng.uniform(8, h / 4), rng.uniform(0, 255, 3)) for _ in range(6)]  # fmt: skip
    with av.open(path, "w") as out:
        stream = out.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        stream.options = {"crf": "18", "preset": "veryfast"}
        for i in range(frames):
            img = texture[i : i + h, 2 * i : 2 * i + w].copy()  # the camera pans
            for x, y, dx, dy, r, colour in shapes:
                img[((xx - x - dx * i) ** 2 + (yy - y - dy * i) ** 2) < r * r] = colour
            img += rng.normal(0, 2, img.shape)
            frame = av.VideoFrame.from_ndarray(np.clip(img, 0, 255).astype(np.uint8), "rgb24")
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)


def source_videos(args: argparse.Namespace) -> tuple[str, list[str]]:
    if args.videos:
        names = sorted(n for n in os.listdir(args.videos) if n.lower().endswith(VIDEO_EXTENSIONS))
        return args.videos, names
    folder = os.path.join(args.work, "videos")
    os.makedirs(folder, exist_ok=True)
    names = []
    for i in range(args.count):
        name = f"v{i:03d}.mp4"
        if not os.path.exists(os.path.join(folder, name)):
            synthetic_video(os.path.join(folder, name), i, args.frames, 24, 480, 272)
        names.append(name)
    return folder, names


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path))


def make_gulp(args: argparse.Namespace, folder: str, names: list[str], rate: float) -> str:
    out = os.path.join(args.work, f"gulp_{'native' if rate <= 0 else f'{rate:g}fps'}")
    if not os.path.isdir(out):
        listing = os.path.join(args.work, "videos.json")
        items = [{"id": os.path.splitext(n)[0], "label": "any"} for n in names]
        with open(listing, "w") as f:
            json.dump(items, f)
        adapter = JsonVideoAdapter(listing, folder, frame_rate=rate, frame_size=args.store)
        GulpIngestor(adapter, out, 100, 2, progress=False)()
    return out


def make_shard(args: argparse.Namespace, folder: str, names: list[str]) -> str | None:
    try:
        from kohakuclip.write.pack import pack
        from kohakuclip.write.video import encode
    except ImportError as exc:
        print(f"AV1 shard skipped: {exc}")
        return None
    path = os.path.join(args.work, "av1_shard.zip")
    if not os.path.exists(path):
        members = [(n, encode(os.path.join(folder, n), "av1", max_short=args.store)) for n in names]
        pack(path, members)
    return path


def time_batches(batches: Any, count: int, batch: int) -> tuple[float, float]:
    """(clips/s, CPU ms per clip of this process: all its threads, not worker processes)."""
    iterator = iter(batches)
    next(iterator)  # warm-up: workers, decoders, page cache
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        next(iterator)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return count * batch / wall, cpu * 1000 / (count * batch)


def gulp_rate(
    args: argparse.Namespace, path: str, step: int, workers: int, loader_kind: str
) -> tuple[float, float]:
    """clips/s and CPU ms per clip through torch's DataLoader or kohakuclip.gulp.loader's."""
    transform = ComposeVideo([Scale(args.size)], [RandomCropVideo(args.size)])
    dataset = GulpVideoDataset(path, args.clip, step, is_val=False, transform=transform)
    draws = np.random.default_rng(0).integers(0, len(dataset), (args.batches + 1) * args.batch)
    if loader_kind == "numpy":
        from kohakuclip.gulp.loader import DataLoader as NumpyLoader

        loader = NumpyLoader(dataset, args.batch, sampler=draws.tolist(), num_workers=workers)
        return time_batches(loader, args.batches, args.batch)
    from torch.utils.data import DataLoader

    loader = DataLoader(
        dataset,
        batch_size=args.batch,
        sampler=draws.tolist(),
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    return time_batches(loader, args.batches, args.batch)


def shard_rate(args: argparse.Namespace, shard: str) -> tuple[float, float] | None:
    try:
        from kohakuclip.torch import ClipDataset, ClipLoader
    except ImportError as exc:
        print(f"ClipDataset skipped: {exc}")
        return None
    dataset = ClipDataset(
        shard, args.batch, frames=args.clip, fps=args.fps, threads=args.threads, size=args.size
    )
    loader = ClipLoader(dataset, workers=0)
    try:
        return time_batches(loader, args.batches, args.batch)
    finally:
        loader.close()


def make_converted(args: argparse.Namespace, gulp: str) -> tuple[list[str], float]:
    """AV1 shards written from a gulp directory (kohakuclip-write's defaults); their paths and
    the seconds the conversion took (0 when already there)."""
    from kohakuclip import write_videos

    out = os.path.join(args.work, "av1_from_gulp")
    seconds = 0.0
    if not os.path.isdir(out):
        start = time.perf_counter()
        write_videos(out, [gulp], max_short=args.store, progress=False)
        seconds = time.perf_counter() - start
    shards = sorted(os.path.join(out, n) for n in os.listdir(out) if n.startswith("shard_"))
    return shards, seconds


def reader_rate(args: argparse.Namespace, sources: str | list[str]) -> tuple[float, float]:
    """(clips/s, CPU ms per clip) of ``kohakuclip.Reader``: the same seeded clips every run."""
    from kohakuclip import Reader

    with Reader(sources, size=args.size, threads=args.threads, seed=0) as reader:
        clips = (reader.sample(args.batch, args.clip, fps=args.fps) for _ in itertools.count())
        return time_batches(map(reader.read, clips), args.batches, args.batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", help="folder of videos (default: synthetic ones)")
    parser.add_argument("--count", type=int, default=12)
    parser.add_argument("--frames", type=int, default=96, help="frames per synthetic video")
    parser.add_argument("--store", type=int, default=256, help="stored short side")
    parser.add_argument("--size", type=int, default=224, help="crop size")
    parser.add_argument("--clip", type=int, default=8)
    parser.add_argument("--fps", type=float, default=8.0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1, help="repeat every run, interleaved")
    parser.add_argument("--work", default="/tmp/gulp_bench")
    parser.add_argument(
        "--no-gulp-loader",
        dest="gulp_loader",
        action="store_false",
        help="skip the GulpVideoDataset + DataLoader and ClipDataset rows (Reader rows only)",
    )
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    torch_threads = os.environ.get("OMP_NUM_THREADS")
    print(f"torch intra-op threads from OMP_NUM_THREADS: {torch_threads or 'default'}")

    folder, names = source_videos(args)
    with av.open(os.path.join(folder, names[0])) as c:
        native = float(c.streams.video[0].average_rate or 25)
    stores = {
        "gulp, native fps": (make_gulp(args, folder, names, 0), max(1, round(native / args.fps))),
        f"gulp, {args.fps:g} fps": (make_gulp(args, folder, names, args.fps), 1),
    }
    shard = make_shard(args, folder, names) if args.gulp_loader else None
    native_gulp = stores["gulp, native fps"][0]
    converted, convert_seconds = make_converted(args, native_gulp)
    if convert_seconds:
        print(f"kohakuclip-write converted the native-fps gulp in {convert_seconds:.1f} s")
    converted_bytes = sum(os.path.getsize(p) for p in converted)

    rows = []
    source_bytes = sum(os.path.getsize(os.path.join(folder, n)) for n in names)
    for _ in range(args.rounds):  # interleaved rounds: load from elsewhere hits every row alike
        for label, (path, step) in stores.items():
            for workers in args.workers if args.gulp_loader else []:
                for kind in ("torch", "numpy"):
                    rate, cpu = gulp_rate(args, path, step, workers, kind)
                    cpu_text = f"{cpu:.1f}" if workers == 0 else "-"
                    name = f"{label}, {kind} DataLoader {workers} workers"
                    rows.append((name, folder_bytes(path), rate, cpu_text))
            rate, cpu = reader_rate(args, path)
            rows.append((f"{label}, Reader {args.threads} threads", folder_bytes(path), rate,
                         f"{cpu:.1f}"))  # fmt: skip
        rate, cpu = reader_rate(args, converted)
        label = f"AV1 shards from the gulp, Reader {args.threads} threads"
        rows.append((label, converted_bytes, rate, f"{cpu:.1f}"))
        if shard is not None:
            result = shard_rate(args, shard)
            if result is not None:
                label = f"AV1 shard, ClipDataset {args.threads} threads"
                rows.append((label, os.path.getsize(shard), result[0], f"{result[1]:.1f}"))
    print(f"{len(names)} videos, sources {source_bytes / 1e6:.1f} MB; clips of {args.clip} @ "
          f"{args.fps:g} fps, {args.size}px crops, batches of {args.batch}")  # fmt: skip
    print(f"{'store / loader':<56} {'MB stored':>10} {'clips/s':>9} {'CPU ms/clip':>12}")
    for label, size, rate, cpu_text in rows:
        print(f"{label:<56} {size / 1e6:>10.2f} {rate:>9.1f} {cpu_text:>12}")


if __name__ == "__main__":
    main()

"""Image reading speed: ImageReader beside Pillow on the same bytes and a DataLoader over zip.

    python benchmarks/image_bench.py [SHARD.zip] [--images 300] [--size 256] [--threads 1 2]

Without a shard, one is written first from synthetic photo-like images (benchmarks/photo_like.py;
not real photos) with the writer's defaults (JPEG 4:4:4 q70, short side 512). Reported:

- ImageReader, per crop kind (random short-side square with DCT shrinking, the same with
  ``dct_scale=False``, RandomResizedCrop): ms per image on one thread (wall time x threads /
  images, from the page cache) and images/s on N threads.
- Pillow on the same bytes from memory: ``draft`` (DCT shrink), crop, antialiased bilinear resize
  to the same windows, ms per image on one core and images/s on N processes.
- A torch DataLoader with N workers over the zip (zipfile + Pillow as above), and ImageDataset
  through ClipLoader with N threads, images/s.

The target is ImageReader at no more than 0.7x Pillow's ms per image (random crop). Timings on
a shared machine are noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from photo_like import photo_like

from kohakuclip import write_images
from kohakuclip.read.image_reader import ImageReader

BATCH = 64


def _make_shard(tmp: str, n: int) -> str:
    src = os.path.join(tmp, "src")
    os.makedirs(src)
    for i in range(n):
        px = photo_like(i, *((768, 1024) if i % 2 == 0 else (600, 800)))
        Image.fromarray(px).save(os.path.join(src, f"{i:05d}.png"), compress_level=1)
    summary = write_images(os.path.join(tmp, "out"), [src], progress=False, min_short=0)
    return summary.shards[0]


def _members(shard: str) -> list[bytes]:
    with zipfile.ZipFile(shard) as z:
        return [z.read(n) for n in z.namelist() if n != "__index__.bin"]


def _time_reader(shard: str, threads: int, n: int, **options: object) -> tuple[float, float]:
    """(ms per image per thread, images/s) over ``n`` images in batches of BATCH, 2 in flight."""
    with ImageReader(shard, threads=threads, **options) as reader:  # type: ignore[arg-type]
        ids = [i % len(reader) for i in range(n)]
        reader.read(ids[:BATCH], seed=0)  # warm-up: threads, buffers, page cache
        t0 = time.perf_counter()
        pending = []
        for k, start in enumerate(range(0, n, BATCH)):
            pending.append(reader.submit(ids[start : start + BATCH], seed=k))
            if len(pending) > 2:
                pending.pop(0).result()
        for p in pending:
            p.result()
        dt = time.perf_counter() - t0
    return dt * threads / n * 1e3, n / dt


def _interleaved(
    shard: str, blobs: list[bytes], size: int, rounds: int, **options: object
) -> tuple[float, float]:
    """Median ms per image on one thread of (ImageReader, Pillow), alternating batch by batch so
    that both see the same machine load."""
    reader_ms, pillow_ms = [], []
    with ImageReader(shard, threads=1, size=size, **options) as reader:  # type: ignore[arg-type]
        ids = list(range(min(BATCH, len(reader))))
        reader.read(ids, seed=0)
        _pillow_chunk(([blobs[i] for i in ids], size, 0))
        for k in range(rounds):
            t0 = time.perf_counter()
            reader.read(ids, seed=k)
            t1 = time.perf_counter()
            _pillow_chunk(([blobs[i] for i in ids], size, k))
            t2 = time.perf_counter()
            reader_ms.append((t1 - t0) / len(ids) * 1e3)
            pillow_ms.append((t2 - t1) / len(ids) * 1e3)
    return float(np.median(reader_ms)), float(np.median(pillow_ms))


def _pillow_one(data: bytes, size: int, rng: np.random.Generator) -> np.ndarray:
    """Pillow's fast path: draft (DCT shrink), random short-side square, bilinear resize."""
    image = Image.open(io.BytesIO(data))
    w, h = image.size
    s = size / min(w, h)
    image.draft("RGB", (int(w * s + 0.999), int(h * s + 0.999)))
    dw, dh = image.size
    side = min(dw, dh)
    x = int(rng.integers(0, dw - side + 1))
    y = int(rng.integers(0, dh - side + 1))
    out = image.convert("RGB").resize(
        (size, size), Image.Resampling.BILINEAR, box=(x, y, x + side, y + side)
    )
    return np.asarray(out).transpose(2, 0, 1)


def _pillow_chunk(args: tuple[list[bytes], int, int]) -> int:
    blobs, size, seed = args
    rng = np.random.default_rng(seed)
    for data in blobs:
        _pillow_one(data, size, rng)
    return len(blobs)


def _time_pillow(blobs: list[bytes], size: int, n: int, processes: int) -> tuple[float, float]:
    work = [blobs[i % len(blobs)] for i in range(n)]
    if processes == 1:
        _pillow_chunk((work[:BATCH], size, 0))
        t0 = time.perf_counter()
        _pillow_chunk((work, size, 1))
        dt = time.perf_counter() - t0
        return dt / n * 1e3, n / dt
    chunks = [(work[i : i + BATCH], size, i) for i in range(0, n, BATCH)]
    with ProcessPoolExecutor(processes) as pool:
        list(pool.map(_pillow_chunk, chunks[:processes]))  # warm-up
        t0 = time.perf_counter()
        list(pool.map(_pillow_chunk, chunks))
        dt = time.perf_counter() - t0
    return dt * processes / n * 1e3, n / dt


class _ZipPillowDataset:
    """The usual baseline: a map-style dataset over a zip, Pillow per item."""

    def __init__(self, shard: str, size: int) -> None:
        self.shard, self.size = shard, size
        with zipfile.ZipFile(shard) as z:
            self.names = [n for n in z.namelist() if n != "__index__.bin"]
        self._zip: zipfile.ZipFile | None = None

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> object:
        import torch

        if self._zip is None:
            self._zip = zipfile.ZipFile(self.shard)
        data = self._zip.read(self.names[i % len(self.names)])
        return torch.from_numpy(_pillow_one(data, self.size, np.random.default_rng(i)).copy())


def _time_dataloader(shard: str, size: int, n: int, workers: int) -> float:
    import torch
    from torch.utils.data import DataLoader, Subset

    ds = _ZipPillowDataset(shard, size)
    indices = [i % len(ds) for i in range(n + 2 * BATCH * workers)]
    loader = DataLoader(Subset(ds, indices), batch_size=BATCH, num_workers=workers)  # type: ignore[arg-type]
    it = iter(loader)
    for _ in range(2 * workers):  # warm-up: workers started and busy
        next(it)
    t0 = time.perf_counter()
    count = 0
    for batch in it:
        count += len(batch)
    dt = time.perf_counter() - t0
    del torch
    return count / dt


def _time_dataset(shard: str, size: int, n: int, threads: int) -> float:
    from kohakuclip.torch import ClipLoader, ImageDataset

    loader = ClipLoader(ImageDataset([shard], BATCH, threads=threads, size=size), workers=0)
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    for _ in range(n // BATCH):
        next(it)
    dt = time.perf_counter() - t0
    loader.close()
    return (n // BATCH) * BATCH / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shard", nargs="?", help="a KCIMG1 shard (default: write one)")
    ap.add_argument("--images", type=int, default=300, help="images in the written shard")
    ap.add_argument("--reads", type=int, default=1024, help="images decoded per measurement")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, os.cpu_count() or 1])
    ap.add_argument("--rounds", type=int, default=15, help="interleaved one-thread rounds")
    ap.add_argument("--no-loaders", action="store_true", help="skip the DataLoader comparison")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shard = args.shard
        if shard is None:
            print(f"writing {args.images} synthetic photo-like images (not real photos)...")
            shard = _make_shard(tmp, args.images)
        blobs = _members(shard)
        kb = sum(map(len, blobs)) / len(blobs) / 1024
        print(f"{shard}: {len(blobs)} images, {kb:.1f} KB each, output {args.size}x{args.size} rgb")
        rows = [
            ("random (short side square), DCT shrink", dict(crop="random")),
            ("same, dct_scale=False", dict(crop="random", dct_scale=False)),
            ("resized (area 0.08-1)", dict(crop="resized")),
        ]
        print("\none thread, interleaved with Pillow batch by batch (median ms / image):")
        for name, options in rows:
            ours, pillow = _interleaved(shard, blobs, args.size, args.rounds, **options)
            print(f"  {name:42s} {ours:6.2f}   Pillow {pillow:6.2f}   ratio {ours / pillow:5.2f}x")
        print("\nimages/s (ImageReader: threads; Pillow: processes):")
        header = "".join(f"{t:>10d} thr" for t in args.threads)
        print(f"  {'':42s}{header}")
        for name, options in rows:
            rates = [_time_reader(shard, t, args.reads, size=args.size, **options)[1]
                     for t in args.threads]  # fmt: skip
            print(f"  {name:42s}{''.join(f'{r:14.0f}' for r in rates)}")
        rates = [_time_pillow(blobs, args.size, args.reads, t)[1] for t in args.threads]
        print(f"  {'Pillow (draft, crop, resize)':42s}{''.join(f'{r:14.0f}' for r in rates)}")
        if not args.no_loaders:
            n = max(args.threads)
            print(f"\nloaders, {n} workers / threads, batches of {BATCH}:")
            rate = _time_dataloader(shard, args.size, args.reads, n)
            print(f"  DataLoader over zip + Pillow, {n} workers: {rate:8.0f} images/s")
            rate = _time_dataset(shard, args.size, args.reads, n)
            print(f"  ImageDataset (ClipLoader), {n} threads:    {rate:8.0f} images/s")


if __name__ == "__main__":
    main()

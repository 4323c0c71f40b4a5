"""The output modes side by side: CPU cost, bytes to the GPU, and the GPU's share of the work.

    python benchmarks/gpu_check.py [SHARD_OR_FOLDER...] [--size 256] [--clips 64] [--json FILE]

Per mode (rgb, yuv_resized, yuv): CPU ms per output frame (Reader, one thread, 8 frames at
6 fps), bytes per frame that travel to the GPU, and how close ``yuv_to_rgb`` of that mode gets to
the rgb mode (PSNR). With CUDA: the host-to-device copy from pinned memory and the conversion
kernel per frame, plain torch against Triton (CUDA events, 16 x 8 frames per batch), and how far
the two disagree. Without CUDA it prints what it can, including the plain torch path on the CPU.
Without sources it writes ``--make`` sample videos (``--width`` x ``--height``) into a folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np
import torch

import kohakuclip
from kohakuclip._yuv_torch import Backend
from kohakuclip.decode.pixels import OutputMode
from kohakuclip.torch import yuv_to_rgb

MODES: tuple[OutputMode, ...] = ("rgb", "yuv_resized", "yuv")


def make_sources(count: int, width: int, height: int, out: str) -> list[str]:
    from kohakuclip.write.samples import make_sample_video

    for i in range(count):
        make_sample_video(os.path.join(out, f"sample_{i:03d}.mp4"), 4.0, width, height, seed=i)
    return [out]


def draw_items(reader: kohakuclip.Reader, clips: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    items = []
    for _ in range(clips):
        vid = int(rng.integers(0, len(reader)))
        info = reader.info(vid)
        items.append((vid, kohakuclip.clip(info.n, 8, rng, 6.0, info.fps)))
    return items


def cpu_per_mode(sources: list[str], size: int, items: list, batch: int, rounds: int) -> dict:
    """ms per output frame per mode, one thread; rounds interleave the modes against drift."""
    readers = {m: kohakuclip.Reader(sources, size=size, mode=m, threads=1, seed=0) for m in MODES}
    for reader in readers.values():
        reader.read(items[:batch])  # warm-up: decoders, buffers, page cache
    best = dict.fromkeys(MODES, float("inf"))
    frames = sum(len(f) for _, f in items)
    for _ in range(rounds):
        for mode, reader in readers.items():
            t0 = time.perf_counter()
            for i in range(0, len(items), batch):
                reader.read(items[i : i + batch], seed=i)
            best[mode] = min(best[mode], (time.perf_counter() - t0) / frames * 1000)
    for reader in readers.values():
        reader.close()
    return best


def psnr(a: torch.Tensor, b: np.ndarray) -> float:
    diff = a.cpu().numpy().astype(np.float64) - b.astype(np.float64)
    mse = float(np.mean(diff * diff))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def cuda_time(fn: Callable[[], object], reps: int) -> float:
    """Mean seconds per call, by CUDA events, after a warm-up call."""
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1000 / reps


def cpu_time(fn: Callable[[], object], reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def gpu_side(batches: dict, size: int, reps: int) -> dict:
    """Copy and conversion per frame on CUDA, plain torch against Triton."""
    from kohakuclip import gpu

    backends: tuple[Backend, ...] = ("torch", "triton") if gpu.available() else ("torch",)
    out: dict = {"triton": gpu.available()}
    for mode, batch in batches.items():
        frames = batch.video.shape[0] * batch.video.shape[1]
        pinned = torch.from_numpy(batch.video).pin_memory()
        on_device = torch.empty_like(pinned, device="cuda")
        copy = partial(on_device.copy_, pinned, non_blocking=True)
        row = {"copy_us": cuda_time(copy, reps) * 1e6 / frames}
        if mode != "rgb":
            device_batch = replace(batch, video=on_device)
            floats = {}
            for backend in backends:
                run = partial(yuv_to_rgb, device_batch, size=size, backend=backend)
                row[f"{backend}_us"] = cuda_time(run, reps) * 1e6 / frames
                floats[backend] = run(dtype=torch.float32)
            if len(floats) == 2:
                row["max_abs_diff"] = float((floats["torch"] - floats["triton"]).abs().max())
        out[mode] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("sources", nargs="*")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--clips", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=50, help="timed repetitions of each GPU step")
    ap.add_argument("--make", type=int, default=4, help="sample videos to write without sources")
    ap.add_argument("--width", type=int, default=910)
    ap.add_argument("--height", type=int, default=512)
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    sources = args.sources or make_sources(
        args.make, args.width, args.height, tempfile.mkdtemp(prefix="kc-gpu-check-")
    )
    cuda = torch.cuda.is_available()
    print(f"sources: {sources}  size {args.size}  clips {args.clips}  batch {args.batch}")
    print(
        f"machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"GPU: {torch.cuda.get_device_name() if cuda else 'none'}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    with kohakuclip.Reader(sources, size=args.size) as probe:
        items = draw_items(probe, args.clips, seed=1)
    cpu = cpu_per_mode(sources, args.size, items, args.batch, args.rounds)
    batches = {}
    for mode in MODES:
        with kohakuclip.Reader(sources, size=args.size, mode=mode, hflip=0.5, seed=0) as reader:
            batches[mode] = reader.read(items[: args.batch], seed=5)
            window = reader.yuv_size
    rgb = batches["rgb"].video
    frames = rgb.shape[0] * rgb.shape[1]
    results: dict = {"size": args.size, "window": window, "modes": {}}
    for mode in MODES:
        video = batches[mode].video
        row: dict = {"cpu_ms": cpu[mode], "bytes": video[0, 0].nbytes}
        if mode != "rgb":
            converted = yuv_to_rgb(batches[mode], size=args.size, backend="torch")
            row["psnr_vs_rgb"] = psnr(converted, rgb)
            run = partial(yuv_to_rgb, batches[mode], size=args.size, backend="torch")
            row["torch_cpu_us"] = cpu_time(run, 3) * 1e6 / frames
        results["modes"][mode] = row
    if cuda:
        results["cuda"] = gpu_side(batches, args.size, args.reps)
    report(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def report(results: dict) -> None:
    size, window = results["size"], results["window"]
    print(f"\n{size} x {size} output, yuv window {window} (stored resolution)")
    head = (
        f"{'mode':<12} {'CPU ms/frame':>12} {'bytes/frame':>20} {'vs rgb':>9} "
        f"{'torch CPU us/frame':>18}"
    )
    print(head)
    print("-" * len(head))
    rgb_bytes = results["modes"]["rgb"]["bytes"]
    for mode, row in results["modes"].items():
        volume = f"{row['bytes']:,} ({row['bytes'] / rgb_bytes:.2g}x)"
        quality = f"{row['psnr_vs_rgb']:.1f} dB" if "psnr_vs_rgb" in row else "-"
        torch_cpu = f"{row['torch_cpu_us']:.0f}" if "torch_cpu_us" in row else "-"
        print(f"{mode:<12} {row['cpu_ms']:>12.2f} {volume:>20} {quality:>9} {torch_cpu:>18}")
    cuda = results.get("cuda")
    if cuda is None:
        print("\nno CUDA device: copy and kernel times need a GPU")
        return
    print(f"\nCUDA, us per frame (triton {'available' if cuda['triton'] else 'missing'})")
    head = f"{'mode':<12} {'H2D pinned':>10} {'torch':>8} {'triton':>8} {'max |diff|':>11}"
    print(head)
    print("-" * len(head))
    for mode in MODES:
        row = cuda[mode]
        cells = [f"{row[k]:.2f}" if k in row else "-" for k in ("torch_us", "triton_us")]
        diff = f"{row['max_abs_diff']:.2g}" if "max_abs_diff" in row else "-"
        print(f"{mode:<12} {row['copy_us']:>10.2f} {cells[0]:>8} {cells[1]:>8} {diff:>11}")


if __name__ == "__main__":
    main()

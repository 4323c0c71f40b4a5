"""CPU per output frame of each output mode, side by side in one process.

    python benchmarks/output_modes.py SHARD_OR_FOLDER... [--specs "8 @ 24 fps" "8 random"]
        [--clips 96] [--rounds 3] [--size 256] [--threads 1]

One ``Reader`` per mode (``rgb``, ``yuv_resized``, ``yuv``) reads the same items, alternating
batch by batch (the order rotates), so every mode sees the same moments of a shared machine's
noise. Prints per output frame: process CPU ms, the pixel stage (crop, resize, conversion or
copy into the batch; ``Reader.stats``), frames decoded, and the bytes each mode hands to the GPU.
The decode is the same in all three modes; what the yuv modes save on the CPU is the pixel
stage, paid instead by ``kohakuclip.torch.yuv_to_rgb`` on the GPU.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import SPECS, draw_items

import kohakuclip
from kohakuclip.decode.pixels import OutputMode

MODES: tuple[OutputMode, ...] = ("rgb", "yuv_resized", "yuv")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--specs", nargs="+", default=["8 @ 24 fps", "8 random"], choices=list(SPECS))
    ap.add_argument("--clips", type=int, default=96)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    print(f"sources: {args.sources}  size {args.size}  threads {args.threads}")
    print(f"machine: {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'clip':<12} {'mode':<12} {'cpu ms':>7} {'pixels ms':>9} {'dec/out':>7} {'bytes':>8}")
    for name in args.specs:
        items = draw_items(args.sources, SPECS[name], args.clips, seed=1)
        readers = {
            m: kohakuclip.Reader(args.sources, size=args.size, seed=0, threads=args.threads, mode=m)
            for m in MODES
        }
        for reader in readers.values():
            reader.read(items[: args.batch])  # warm-up: threads, decoders, page cache
        before = {m: reader.stats() for m, reader in readers.items()}
        cpu = dict.fromkeys(MODES, 0.0)
        for r in range(args.rounds):
            for b, i in enumerate(range(0, len(items), args.batch)):
                k = (b + r) % len(MODES)
                for mode in MODES[k:] + MODES[:k]:
                    c0 = time.process_time()
                    readers[mode].read(items[i : i + args.batch])
                    cpu[mode] += time.process_time() - c0
        for mode, reader in readers.items():
            after = reader.stats()
            out = after["frames_out"] - before[mode]["frames_out"]
            pixels = after["seconds_pixels"] - before[mode]["seconds_pixels"]
            decoded = after["frames_decoded"] - before[mode]["frames_decoded"]
            size = math.prod(reader.batch_shape(1, 1))
            print(
                f"{name:<12} {mode:<12} {1e3 * cpu[mode] / out:7.3f} {1e3 * pixels / out:9.3f}"
                f" {decoded / out:7.2f} {size:8d}"
            )
            reader.close()


if __name__ == "__main__":
    main()

"""Does the GPU wait? Training steps fed by the loader, against the same steps on a resident batch.

    python benchmarks/gpu_train.py SHARD_OR_FOLDER... [--setups 0x8 0x14 2x7] [--modes rgb
        yuv_resized] [--steps 30] [--batch 16 --frames 8 --fps 6 --size 224] [--width 64]

Each (mode, setup) runs in a fresh process. A setup ``WxT`` is W DataLoader worker processes (0:
decode in the training process, beside the eager training loop and its GIL) with T decode threads
each; ``WxTpN`` also sets the loader's prefetch to N batches. The model is a ResNet-18-shaped 2D
network (``--width`` channels in its first stage) over every frame, bf16 autocast, channels-last,
SGD; yuv modes convert on the device with ``yuv_to_rgb``. Three timings per process, all over
``--steps`` steps:

- resident: the training step on one batch kept in pinned host memory (copy, convert, forward,
  backward, step): what the GPU needs per batch when it never waits for data;
- fed: the same steps, each on the loader's next batch;
- loader only: ``next(loader)`` alone, no GPU work, after the batches decoded during the fed
  phase are taken: what the loader can give.

"GPU waits" is ``1 - resident / fed``. ``--gil`` also counts, over the fed phase, the GIL takes per
clip of the decode threads and per step of the training thread (``_gil_count.py``: a shim gcc
builds, preloaded into each process; in process only: workers' takes are their own). Without CUDA it
runs the same on the CPU (slowly: use a small ``--width`` and ``--size`` to try it). Without
sources, ``--make N`` writes N sample videos into shards first (see bench.py).
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
from torch import nn
from kohakuclip.torch import ClipDataset, ClipLoader, yuv_to_rgb

spec = json.load(sys.stdin)
counter = None
if spec["gil"]:
    sys.path.insert(0, spec["benchmarks"])
    from _gil_count import GilCounter, difference
    counter = GilCounter()
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.backends.cudnn.benchmark = True


def block(cin, cout, stride):
    body = nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
        nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout),
    )
    skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
        nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
    return body, skip


class Residual(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body, self.skip = block(cin, cout, stride)

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


w = spec["width"]
layers = [nn.Conv2d(3, w, 7, 2, 3, bias=False), nn.BatchNorm2d(w), nn.ReLU(inplace=True),
          nn.MaxPool2d(3, 2, 1)]
cin = w
for i, cout in enumerate((w, 2 * w, 4 * w, 8 * w)):
    layers += [Residual(cin, cout, 1 if i == 0 else 2), Residual(cout, cout, 1)]
    cin = cout
layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 400)]
model = nn.Sequential(*layers).to(device, memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
mode = spec["mode"]


def frames_of(batch):
    if mode == "rgb":
        video = batch.to(device, non_blocking=True).flatten(0, 1)
        return video.to(torch.bfloat16).mul_(2 / 255).sub_(1)
    rgb = yuv_to_rgb(batch, device=device, dtype=torch.bfloat16, scale=2 / 255, offset=-1.0)
    return rgb.flatten(0, 1)


def step(batch):
    x = frames_of(batch).contiguous(memory_format=torch.channels_last)
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = model(x).float().square().mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def sync():
    if device == "cuda":
        torch.cuda.synchronize()


dataset = ClipDataset(
    spec["sources"], spec["batch"], frames=spec["frames"], fps=spec["fps"],
    threads=spec["threads"], size=spec["size"], mode=mode, hflip=0.5, seed=0,
    with_meta=mode != "rgb",
)
loader = ClipLoader(dataset, workers=spec["workers"], prefetch=spec["prefetch"])
batches = iter(loader)
for _ in range(spec["warmup"]):
    resident = next(batches)
    step(resident)
sync()
n = spec["steps"]
t0 = time.perf_counter()
for _ in range(n):
    step(resident)
sync()
resident_s = time.perf_counter() - t0
waiting = 0.0
takes0 = counter.takes() if counter else {}
t0 = time.perf_counter()
for _ in range(n):
    t = time.perf_counter()
    batch = next(batches)
    waiting += time.perf_counter() - t
    step(batch)
sync()
fed_s = time.perf_counter() - t0
takes = GilCounter.by_name(difference(counter.takes(), takes0)) if counter else {}
for _ in range(loader.prefetch):  # those decoded while the GPU worked: not the loader's pace
    next(batches)
t0 = time.perf_counter()
for _ in range(n):
    next(batches)
loader_s = time.perf_counter() - t0
loader.close()
decode_takes = sum(v for k, v in takes.items() if k.startswith("kohakuclip-"))
json.dump({"resident": resident_s, "fed": fed_s, "waiting": waiting, "loader": loader_s,
           "decode_takes": decode_takes, "trainer_takes": takes.get("MainThread", 0),
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}, sys.stdout)
"""


def run_setup(spec: dict, env: dict[str, str] | None) -> dict:
    """One (mode, setup) in a fresh interpreter: nothing shared with the previous one."""
    done = subprocess.run(
        [sys.executable, "-c", WORKER],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{spec['mode']} {spec['workers']}x{spec['threads']}:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("sources", nargs="*")
    ap.add_argument(
        "--setups", nargs="+", default=["0x8", "0x14", "2x7"], help="WORKERSxTHREADS[pPREFETCH]"
    )
    ap.add_argument("--modes", nargs="+", default=["rgb", "yuv_resized"])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per phase")
    ap.add_argument("--width", type=int, default=64, help="channels of the first stage")
    add_loader_options(ap, size=224)
    ap.add_argument("--gil", action="store_true", help="count GIL takes (needs gcc)")
    args = ap.parse_args()
    env = None
    if args.gil:
        import _gil_count

        env = _gil_count.preload_env(_gil_count.build())
    sources = sources_or_samples(args)
    print(f"sources: {sources}")
    print(
        f"{args.batch} clips of {args.frames} frames at {args.fps} fps, {args.size} px, "
        f"width {args.width}, {args.steps} steps per phase; {os.cpu_count()} CPUs, "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )
    header = (
        f"{'mode':<12} {'setup':<8} {'resident ms':>11} {'fed ms':>8} {'GPU waits':>9} "
        f"{'in next() ms':>12} {'needs clips/s':>13} {'loader clips/s':>14}"
        + (f" {'GIL takes: /clip':>16} {'/step':>6}" if args.gil else "")
    )
    print(header)
    print("-" * len(header))
    for mode in args.modes:
        for text in args.setups:
            workers, threads, prefetch = parse_setup(text, args.prefetch)
            spec = dict(
                sources=sources, batch=args.batch, frames=args.frames, fps=args.fps,
                size=args.size, threads=threads, workers=workers, mode=mode,
                prefetch=prefetch, warmup=args.warmup, steps=args.steps, width=args.width,
                gil=args.gil, benchmarks=os.path.dirname(os.path.abspath(__file__)),
            )  # fmt: skip
            r = run_setup(spec, env)
            per = 1000 / args.steps
            row = (
                f"{mode:<12} {text:<8} {r['resident'] * per:>11.1f} {r['fed'] * per:>8.1f} "
                f"{1 - r['resident'] / r['fed']:>9.0%} {r['waiting'] * per:>12.1f} "
                f"{args.batch * args.steps / r['resident']:>13.0f} "
                f"{args.batch * args.steps / r['loader']:>14.0f}"
            )
            if args.gil:
                clips = args.batch * args.steps
                row += (
                    f" {r['decode_takes'] / clips:>16.2f} {r['trainer_takes'] / args.steps:>6.1f}"
                )
            print(row, flush=True)
    print(f"device: {r['device']}")


if __name__ == "__main__":
    main()

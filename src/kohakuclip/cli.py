"""``kohakuclip``: the package's command line (``kohakuclip demo``)."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence

from kohakuclip.write.samples import make_sample_video
from kohakuclip.write.shards import WriteResult, write


def _make_sources(folder: str, count: int, seconds: float) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    paths = []
    for i in range(count):
        path = os.path.join(folder, f"sample_{i:03d}.mp4")
        make_sample_video(path, seconds=seconds, seed=i)
        with open(os.path.join(folder, f"sample_{i:03d}.txt"), "w", encoding="utf-8") as f:
            f.write(f"sample video {i}: a disc circling over a drifting gradient")
        paths.append(path)
    return paths


def _write_demo(args: argparse.Namespace, root: str) -> WriteResult:
    sources = _make_sources(os.path.join(root, "sources"), args.videos, args.seconds)
    print(f"made {len(sources)} sample videos of {args.seconds:g} s in {root}/sources")
    started = time.perf_counter()
    result = write(
        os.path.join(root, "shards"),
        [os.path.join(root, "sources")],
        codec=args.codec,
        per_shard=max(1, (args.videos + 1) // 2),
        workers=args.workers,
        progress=False,
    )
    elapsed = time.perf_counter() - started
    print(
        f"wrote {result.videos} videos ({result.seconds:.0f} s of video) as {args.codec} into "
        f"{', '.join(result.shards)} in {elapsed:.1f} s "
        f"({elapsed / max(result.seconds, 1e-9) * 60:.1f} s of encode per minute of video)"
    )
    return result


def _demo_in(args: argparse.Namespace, root: str) -> int:
    result = _write_demo(args, root)
    # Reading the shards back (batches of clips, clips/s) goes here, while ``root`` exists.
    return 0 if result.videos == args.videos else 1


def demo(args: argparse.Namespace) -> int:
    """Make sample videos, write shards from them, and show what was written."""
    if args.out:
        return _demo_in(args, args.out)
    with tempfile.TemporaryDirectory(prefix="kohakuclip-demo-") as root:
        return _demo_in(args, root)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kohakuclip", description="kohakuclip tools")
    commands = p.add_subparsers(dest="command", required=True)
    d = commands.add_parser("demo", help="write shards from generated sample videos")
    d.add_argument("--videos", type=int, default=4, help="sample videos to make (default: 4)")
    d.add_argument("--seconds", type=float, default=4.0, help="length of each (default: 4)")
    d.add_argument("--codec", choices=("av1", "h264", "hevc"), default="av1")
    d.add_argument("--workers", type=int, default=None, help="encoder threads (default: CPUs)")
    d.add_argument("--out", default=None, help="keep the files here (default: a temporary folder)")
    d.set_defaults(run=demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())

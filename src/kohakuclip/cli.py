"""``kohakuclip``: the package's command line (``demo``, ``inspect``, ``verify``, ``merge``)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence

from kohakuclip._argtypes import bounded_int, positive_float
from kohakuclip._cpus import usable_cpus
from kohakuclip.errors import os_error_text
from kohakuclip.write.samples import make_sample_video
from kohakuclip.write.shards import WriteResult, write_videos

__all__ = ["main"]


class _UsageError(Exception):
    """A user error found while a command runs (an output that cannot be written, a folder
    that must not be written into): ``prog: error: message``, exit status 2."""


def check_writable(path: str) -> None:
    """A usage error naming ``path`` unless a file can be written there (tried by opening it,
    without waiting on a FIFO; a file this made is removed again), before any work is done."""
    existed = os.path.lexists(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o644)
        os.close(fd)
    except OSError as e:
        raise _UsageError(os_error_text(e, path)) from None
    if not existed:
        os.remove(path)


_DEMO_MARK = ".kohakuclip-demo"
"""The file the demo leaves in ``--out``: only a folder holding it is written over."""


def _demo_root(out: str) -> None:
    """Make ``out`` for the demo's ``sources/`` and ``shards/``: a new or empty folder, or an
    earlier demo's output (holding ``_DEMO_MARK``; its files replaced); any other folder is
    refused, as the demo's files would mix with what is there (a dataset would read wrong)."""
    try:
        entries = set(os.listdir(out)) if os.path.isdir(out) else set()
        if entries and _DEMO_MARK not in entries:
            raise _UsageError(
                f"{out}: not empty and not an earlier demo's output; choose a new or empty folder"
            )
        for name in entries - {_DEMO_MARK}:
            path = os.path.join(out, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, _DEMO_MARK), "w") as f:
            f.write("written by `kohakuclip demo`: it may replace this folder's files\n")
    except OSError as e:
        raise _UsageError(os_error_text(e, out)) from None


def _make_sources(folder: str, count: int, seconds: float) -> list[str]:
    os.makedirs(folder)
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
    kept = "" if args.out else " (a temporary folder, removed at the end: --out DIR keeps it)"
    print(f"made {len(sources)} sample videos of {args.seconds:g} s in {root}/sources{kept}")
    started = time.perf_counter()
    result = write_videos(
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


def _read_demo(args: argparse.Namespace, shards: list[str]) -> None:
    """Read batches of random clips from the shards and report the rate."""
    from kohakuclip.read.reader import Reader

    threads = args.threads or usable_cpus()
    with Reader(shards, size=args.size, threads=threads, hflip=0.5, seed=0) as reader:
        reader.read(reader.sample(args.batch, 8, fps=6.0, seed=0))  # warm-up
        started = time.perf_counter()
        pending = []
        for i in range(args.batches):
            pending.append(reader.submit(reader.sample(args.batch, 8, fps=6.0, seed=i + 1)))
            if len(pending) > 2:
                pending.pop(0).result()
        for p in pending:
            batch = p.result()
        elapsed = time.perf_counter() - started
        stats = reader.stats()
    clips = args.batches * args.batch
    print(
        f"read {args.batches} batches of {args.batch} clips (8 frames @ 6 fps, "
        f"{args.size}x{args.size} rgb, shape {tuple(batch.video.shape)}) with {threads} threads: "
        f"{clips / elapsed:.1f} clips/s, {stats['decoded_per_output']:.2f} frames decoded "
        f"per output frame"
    )


def _demo_in(args: argparse.Namespace, root: str) -> int:
    result = _write_demo(args, root)
    _read_demo(args, [os.path.join(root, "shards", s) for s in result.shards])
    return 0 if result.videos == args.videos else 1


def demo(args: argparse.Namespace) -> int:
    """Make sample videos, write shards from them, and show what was written."""
    if args.out:
        _demo_root(args.out)
        return _demo_in(args, args.out)
    with tempfile.TemporaryDirectory(prefix="kohakuclip-demo-") as root:
        return _demo_in(args, root)


def inspect(args: argparse.Namespace) -> int:
    """Print a table (or JSON) of the videos in the sources; draw a contact sheet if asked."""
    from kohakuclip.summary import describe, format_table, to_json

    if args.sheet:
        from PIL import Image

        suffix = os.path.splitext(args.sheet)[1].lower()
        if suffix not in Image.registered_extensions():
            raise _UsageError(f"{args.sheet}: not an image file name Pillow can write (.png ...)")
        check_writable(args.sheet)
    videos = describe(args.paths, gulp_fps=args.gulp_fps)
    print(to_json(videos) if args.json else format_table(videos))
    if args.sheet:
        from kohakuclip.sheet import contact_sheet

        width, height = contact_sheet(
            args.paths, args.sheet, args.columns, args.thumb, args.max_videos, args.threads
        )
        print(f"contact sheet: {args.sheet} ({width}x{height})", file=sys.stderr)
    return 1 if any(v.error is not None for v in videos) else 0


def verify(args: argparse.Namespace) -> int:
    """Check every frame (or a sample) of the sources; print each problem; 1 if any."""
    from tqdm import tqdm

    from kohakuclip.check import verify as run_verify

    report = run_verify(
        args.paths,
        sample=args.sample,
        threads=args.threads,
        seed=args.seed,
        progress=not args.no_progress,
        on_problem=lambda problem: tqdm.write(str(problem)),
    )
    print(
        f"verified {report.videos} videos ({report.frames} frames) in {report.sources} sources: "
        f"{len(report.problems) or 'no'} problems"
    )
    return 0 if report.ok else 1


def merge_command(args: argparse.Namespace) -> int:
    """Write the dataset view over every part in a folder."""
    from kohakuclip.write.merge import MergeError, merge

    try:
        result = merge(args.out)
    except (MergeError, OSError) as e:
        print(f"kohakuclip merge: error: {e}", file=sys.stderr)
        return 2
    unit = "videos" if result.kind == "video" else "images"
    print(
        f"{result.count} {unit} in {result.shards} shards ({result.bytes / 1e6:.1f} MB) from "
        f"{result.parts} part(s): {result.view}"
    )
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kohakuclip", description="kohakuclip tools")
    commands = p.add_subparsers(dest="command", required=True)
    d = commands.add_parser("demo", help="write shards from generated sample videos")
    count = bounded_int(1)
    d.add_argument("--videos", type=count, default=4, help="sample videos to make (default: 4)")
    d.add_argument("--seconds", type=positive_float, default=4.0, help="length (default: 4)")
    d.add_argument("--codec", choices=("av1", "h264", "hevc"), default="av1", help="default: av1")
    d.add_argument("--workers", type=count, default=None, help="encoder threads (default: CPUs)")
    d.add_argument("--out", default=None, help="keep the files here (default: a temporary folder)")
    d.add_argument("--threads", type=count, default=None, help="decode threads (default: CPUs)")
    d.add_argument("--batch", type=count, default=16, help="clips per batch (default: 16)")
    d.add_argument("--batches", type=count, default=20, help="batches to read (default: 20)")
    d.add_argument("--size", type=bounded_int(2), default=256, help="output size (default: 256)")
    d.set_defaults(run=demo, prog=d.prog)

    threads = usable_cpus()
    i = commands.add_parser("inspect", help="list the videos of shards, folders, gulp directories")
    i.add_argument("paths", nargs="+", help="shards (zip / tar), folders, gulp directories")
    i.add_argument("--json", action="store_true", help="print JSON instead of a table")
    i.add_argument("--sheet", default=None, help="draw a contact sheet into this PNG")
    i.add_argument(
        "--columns", type=count, default=8, help="frames per video on the sheet (default: 8)"
    )
    i.add_argument(
        "--thumb", type=bounded_int(2), default=128, help="side of a sheet frame, px (default: 128)"
    )
    i.add_argument(
        "--max-videos", type=count, default=200, help="videos on the sheet at most (default: 200)"
    )
    i.add_argument("--threads", type=count, default=threads, help="decode threads (default: CPUs)")
    i.add_argument(
        "--gulp-fps",
        type=positive_float,
        default=None,
        help="gulp videos' fps (default: their meta_data's)",
    )
    i.set_defaults(run=inspect, prog=i.prog)

    v = commands.add_parser("verify", help="decode every frame and check the index")
    v.add_argument("paths", nargs="+", help="shards (zip / tar), folders, gulp directories")
    v.add_argument("--sample", type=count, default=None, help="check K frames per video, not all")
    v.add_argument("--threads", type=count, default=threads, help="decode threads (default: CPUs)")
    v.add_argument("--seed", type=int, default=0, help="picks the sampled frames (default: 0)")
    v.add_argument("--no-progress", action="store_true", help="no progress bar")
    v.set_defaults(run=verify, prog=v.prog)

    m = commands.add_parser(
        "merge",
        help="write the dataset view (dataset.json, manifest.parquet, skipped.jsonl) over every "
        "part written into a folder",
    )
    m.add_argument(
        "out", help="the folder the parts wrote into, or the URL prefix they uploaded to"
    )
    m.set_defaults(run=merge_command, prog=m.prog)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except _UsageError as e:
        print(f"{args.prog}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `kohakuclip verify ... | head`: the reader went away
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the exit's flush does not fail again
        os.close(devnull)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())

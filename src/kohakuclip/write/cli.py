"""``kohakuclip-write OUT SOURCES...``: re-encode videos (and GulpIO directories) into indexed
shards."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kohakuclip._argtypes import positive_int
from kohakuclip.write.merge import MergeError
from kohakuclip.write.parts import Part, part_argument
from kohakuclip.write.ray_launcher import ray_arguments
from kohakuclip.write.settings import DEFAULT_CRF, DEFAULT_PRESET, ENCODERS, EncodeSettings
from kohakuclip.write.shards import WriteError, check_ray_options, write_videos
from kohakuclip.write.upload import nothing_stored, output_arguments, skip_log, writer_main

__all__ = ["main"]

PROG = "kohakuclip-write"


def _preset(value: str) -> int | str:
    return int(value) if value.lstrip("-").isdigit() else value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Re-encode videos (files, folders, tar archives, GulpIO directories) into "
        "zip or tar shards with a frame index, a manifest.parquet and an encoding.json.",
    )
    output_arguments(p)
    p.add_argument(
        "sources",
        nargs="+",
        help="video files, folders of videos, tar archives, gulp directories (every id one "
        "video), or URLs of videos, tars and prefixes (s3://bucket/videos/: as a folder)",
    )
    p.add_argument("--codec", choices=sorted(ENCODERS), default="av1", help="default: av1")
    defaults = ", ".join(f"{c} {DEFAULT_CRF[c]}" for c in ENCODERS)
    p.add_argument("--crf", type=int, default=None, help=f"quality (default: {defaults})")
    p.add_argument("--gop", type=int, default=16, help="closed GOP length in frames (default: 16)")
    presets = ", ".join(f"{c} {DEFAULT_PRESET[c]}" for c in ENCODERS)
    p.add_argument(
        "--preset",
        type=_preset,
        default=None,
        help=f"SVT-AV1 preset number or x264/x265 preset name (default: {presets})",
    )
    p.add_argument(
        "--max-short",
        type=int,
        default=512,
        help="cap on the short side, never upscaled; 0 keeps the size (default: 512)",
    )
    p.add_argument(
        "--loop-filters",
        action="store_true",
        help="keep AV1's deblocking, CDEF and loop restoration (off by default: faster decode)",
    )
    p.add_argument(
        "--per-shard", type=positive_int, default=1000, help="videos per shard (default: 1000)"
    )
    p.add_argument("--container", choices=("zip", "tar"), default="zip", help="default: zip")
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="videos encoded at once (default: the usable CPUs)",
    )
    p.add_argument(
        "--backend",
        choices=("native", "ffmpeg"),
        default="native",
        help="native (default): PyAV in process; ffmpeg: the ffmpeg command line "
        "($KOHAKUCLIP_FFMPEG or imageio-ffmpeg's binary)",
    )
    p.add_argument(
        "--gulp-fps",
        type=float,
        default=None,
        help="frame rate of gulp videos (default: the fps / frame_rate of their meta_data, "
        "else 12); gulp videos are always encoded in process",
    )
    p.add_argument("--resume", action="store_true", help="continue an earlier run (or part) in OUT")
    part_argument(p, "write", "sources")
    ray_arguments(p)
    p.add_argument(
        "--no-progress", "--quiet", dest="quiet", action="store_true", help="no progress bar"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return writer_main(parser(), _write, argv, _check)


def _check(args: argparse.Namespace) -> None:
    """The options ``write_videos`` would refuse, refused before anything is read."""
    EncodeSettings(args.codec, args.crf, args.gop, args.preset, args.max_short, args.loop_filters)
    if args.part is not None:
        Part.parse(args.part)
    check_ray_options(args.ray, args.part, args.ray_parts, args.staging)


def _write(args: argparse.Namespace) -> int:
    try:
        result = write_videos(
            args.out,
            args.sources,
            codec=args.codec,
            crf=args.crf,
            gop=args.gop,
            preset=args.preset,
            max_short=args.max_short,
            loop_filters=args.loop_filters,
            per_shard=args.per_shard,
            container=args.container,
            workers=args.workers,
            backend=args.backend,
            resume=args.resume,
            progress=not args.quiet,
            gulp_fps=args.gulp_fps,
            part=args.part,
            ray=args.ray,
            ray_parts=args.ray_parts,
            staging=args.staging,
        )
    except (WriteError, MergeError, FileNotFoundError, ImportError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    log = skip_log(args.out, args.part)
    stored = result.videos + result.resumed_videos
    if nothing_stored(PROG, "videos", stored, result.skipped, args.part, args.sources, log):
        return 1
    print(
        f"{result.videos} videos ({result.seconds / 60:.1f} min) in {len(result.shards)} shards, "
        f"{result.skipped} skipped (see {log}), in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``kohakuclip-write-images OUT SOURCES...``: encode images into indexed zip shards."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kohakuclip._argtypes import positive_int
from kohakuclip.write.image_codecs import CODEC_ALIASES, JPEG_ENCODERS, STORAGE_CODECS
from kohakuclip.write.images import check_options, write_images
from kohakuclip.write.merge import MergeError
from kohakuclip.write.parts import Part, part_argument
from kohakuclip.write.ray_launcher import ray_arguments
from kohakuclip.write.shards import WriteError, check_ray_options
from kohakuclip.write.upload import nothing_stored, output_arguments, skip_log, writer_main

__all__ = ["main"]

PROG = "kohakuclip-write-images"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Store images (files, folders with <stem>.txt / <stem>.json sidecars, "
        "WebDataset tars, zip archives) as zip shards with a KCIMG1 index, plus "
        "manifest.parquet, skipped.jsonl and encoding.json.",
    )
    output_arguments(p)
    p.add_argument(
        "sources",
        nargs="+",
        help="image files, folders, .tar or .zip archives, or their URLs (s3://bucket/images/: "
        "a prefix, as a folder)",
    )
    p.add_argument("--quality", type=int, default=70, help="0-100 (default 70)")
    p.add_argument(
        "--max-short", type=int, default=512, help="cap of the short side, 0: none (default: 512)"
    )
    p.add_argument(
        "--min-short",
        type=int,
        default=384,
        help="skip images whose short side is smaller; 0 keeps all (default: 384)",
    )
    p.add_argument(
        "--per-shard", type=positive_int, default=10000, help="images per shard (default: 10000)"
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="encoding threads (default: the usable CPUs; with --ray: per task, default 1)",
    )
    p.add_argument(
        "--codec",
        choices=[*STORAGE_CODECS, *CODEC_ALIASES],
        default="jpeg",
        help="stored format (default: jpeg; av1: the same as avif, raw AV1 OBUs)",
    )
    p.add_argument(
        "--jpeg-encoder",
        choices=JPEG_ENCODERS,
        default="tuned",
        help="tuned: smallest at equal quality (default); turbo: fastest; jpegli: 4:2:0 only",
    )
    p.add_argument(
        "--backend",
        choices=("native", "pillow"),
        default="native",
        help="native (default): PyAV / libavcodec decoding; pillow: Pillow for every image",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    part_argument(p, "store", "images")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue an earlier run (or part) in OUT, keeping its finished shards",
    )
    ray_arguments(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    return writer_main(_parser(), _write, argv, _check)


def _check(args: argparse.Namespace) -> None:
    """The options ``write_images`` would refuse, refused before anything is read."""
    check_options(args.quality, args.max_short, args.min_short, args.codec, args.jpeg_encoder)
    if args.part is not None:
        Part.parse(args.part)
    check_ray_options(args.ray, args.part, args.ray_parts, args.staging)


def _write(args: argparse.Namespace) -> int:
    try:
        summary = write_images(
            args.out,
            args.sources,
            quality=args.quality,
            max_short=args.max_short,
            min_short=args.min_short,
            per_shard=args.per_shard,
            workers=args.workers,
            codec=args.codec,
            jpeg_encoder=args.jpeg_encoder,
            backend=args.backend,
            progress=not args.no_progress,
            part=args.part,
            resume=args.resume,
            staging=args.staging,
            ray=args.ray,
            ray_parts=args.ray_parts,
        )
    except (WriteError, MergeError, ImportError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    log = skip_log(args.out, args.part)
    if nothing_stored(
        PROG, "images", summary.images, summary.skipped, args.part, args.sources, log
    ):
        return 1
    print(
        f"{summary.images} images in {len(summary.shards)} shards, {summary.skipped} skipped "
        f"(see {log})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Clip reading, kohakuclip and KohakuClip 1.0.0 in one process, alternating batch by batch.

    python benchmarks/side_by_side.py --reference-package DIR [SHARD...] [--threads 1 2]

Run it with an interpreter that has kohakuclip installed and the Python version of the
reference's wheel (its extension is built for one), under whatever environment the reference
needs (e.g. its LD_PRELOAD). ``DIR`` is the reference's installed ``kohakuclip`` package folder:
it is copied under the name ``kohakuclip_ref`` so that both import side by side. Both read the
same items; per batch the order alternates. On a shared machine this is the steadiest
comparison: both see the same moments of its noise, each batch a fraction of a second apart.
Prints CPU ms per output frame (process CPU time while each reads) and wall ms x threads.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import SPECS, draw_items, make_sources


def import_reference(package_dir: str, into: str) -> object:
    """The reference package, copied to ``into``/kohakuclip_ref (its bundled libraries linked
    beside it, where its extension looks for them), imported."""
    shutil.copytree(package_dir, os.path.join(into, "kohakuclip_ref"))
    libs = package_dir.rstrip("/") + ".libs"
    if os.path.isdir(libs):
        os.symlink(libs, os.path.join(into, os.path.basename(libs)))
    sys.path.insert(0, into)
    return importlib.import_module("kohakuclip_ref")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("sources", nargs="*")
    ap.add_argument("--reference-package", required=True, help="the reference's kohakuclip dir")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--clips", type=int, default=96)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="passes over the items")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--make", type=int, default=12, help="sample videos to write without sources")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "kc-bench"))
    ap.add_argument("--specs", nargs="+", default=list(SPECS), choices=list(SPECS))
    args = ap.parse_args()

    import av

    import kohakuclip

    sources = args.sources or make_sources(args.make, args.workdir, "av1")
    with tempfile.TemporaryDirectory() as tmp:
        ref = import_reference(args.reference_package, tmp)
        print(f"sources: {sources}  size {args.size}  batch {args.batch}  PyAV {av.__version__}")
        print(f"machine: {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
        print(
            f"{'clip':<12} {'thr':>3} {'ref cpu ms':>10} {'ours cpu ms':>11} {'cpu ratio':>9}"
            f" {'wall ratio':>10}"
        )
        for name in args.specs:
            items = draw_items(sources, SPECS[name], args.clips, seed=1)
            for threads in args.threads:
                readers = {
                    "ref": ref.Reader(sources, size=args.size, seed=0, threads=threads),  # type: ignore[attr-defined]
                    "ours": kohakuclip.Reader(sources, size=args.size, seed=0, threads=threads),
                }
                for reader in readers.values():
                    reader.read(items[: args.batch])  # warm-up
                cpu = dict.fromkeys(readers, 0.0)
                wall = dict.fromkeys(readers, 0.0)
                for r in range(args.rounds):
                    for b, i in enumerate(range(0, len(items), args.batch)):
                        order = list(readers) if (b + r) % 2 else list(readers)[::-1]
                        for key in order:
                            c0, w0 = time.process_time(), time.perf_counter()
                            readers[key].read(items[i : i + args.batch])
                            cpu[key] += time.process_time() - c0
                            wall[key] += time.perf_counter() - w0
                frames = args.rounds * len(items) * SPECS[name]["frames"]
                print(
                    f"{name:<12} {threads:>3} {cpu['ref'] / frames * 1e3:>10.3f}"
                    f" {cpu['ours'] / frames * 1e3:>11.3f} {cpu['ours'] / cpu['ref']:>9.3f}"
                    f" {wall['ours'] / wall['ref']:>10.3f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""Clip reading, kohakuclip and KohakuClip 1.0.0 in one process, alternating batch by batch.

    python benchmarks/side_by_side.py --reference-package DIR [SHARD_OR_FOLDER...] [--threads 1 2]
        [--naive] [--torchcodec] [--distinct] [--dav1d-time]

Run it with an interpreter that has kohakuclip installed and the Python version of the
reference's wheel (its extension is built for one), under whatever environment the reference
needs (e.g. its LD_PRELOAD). ``DIR`` is the reference's installed ``kohakuclip`` package folder:
it is copied under the name ``kohakuclip_ref`` so that both import side by side. Both read the
same items; per batch the order alternates. On a shared machine this is the steadiest
comparison: both see the same moments of its noise, each batch a fraction of a second apart.
Prints CPU ms per output frame (process CPU time while each reads) and wall ms x threads, and
for ours / 1.0.0 a 95 % interval: the batches resampled with replacement (a bootstrap of the
ratio of sums), so a cell's noise within the run shows beside its value (more ``--rounds``
narrow it; the machine's drift between runs is not in it).
``--naive`` adds a third contender, the naive PyAV loop (open, seek, decode to the last wanted
frame, ``to_ndarray`` RGB, short-side crop, OpenCV area resize; one clip per thread at a time),
the baseline for mp4 folders (e.g. benchmarks/busy_trainer.py's H.264 folders at GOP 16 and 250
in /tmp/kc-busy-media). ``--torchcodec`` adds torchcodec's CPU decoder the same way (one
``VideoDecoder`` per clip, one FFmpeg thread, ``get_frames_at``; the same crop and OpenCV area
resize as the naive loop, so the columns differ in decoding only); it needs torch and torchcodec
in the interpreter (benchmarks/torchcodec_env.sh makes such a venv, no GPU needed).
Items are drawn video by video at random, so a batch may hold several clips of one video; ours
then decodes the GOPs they share once (1.0.0 decodes clip by clip). ``--distinct`` draws every
batch from as many different videos (``--batch`` at most the number of videos): the cost per
clip with nothing shared.
``--dav1d-time`` (AV1) compiles benchmarks/dav1d_time.c with gcc, runs the script again with it
preloaded, and prints under each row the thread CPU ms per output frame spent inside libdav1d
(send / get calls, which decode) and outside it, for each reader, with the pictures each got:
how much of a cell is the decoder both share.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

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


class NaivePyAV:
    """Clips read the naive way with PyAV (``read(items)`` like the readers), for a baseline.

    Args:
        reader: our Reader over the same sources: it maps video ids to files.
        size: output side.
        threads: clips decoded at once.
    """

    def __init__(self, reader: Any, size: int, threads: int) -> None:
        self.reader, self.size = reader, size
        self.pool = ThreadPoolExecutor(threads)

    def _open(self, vid: int) -> Any:
        import io

        info = self.reader.info(vid)
        if os.path.isdir(info.source):
            return os.path.join(info.source, info.member)
        with zipfile.ZipFile(info.source) as z:
            return io.BytesIO(z.read(info.member))

    def _clip(self, item: tuple[int, list[int]]) -> Any:
        import av
        import cv2
        import numpy as np

        vid, frames = item
        out = np.empty((len(frames), self.size, self.size, 3), np.uint8)
        wanted = {f: i for i, f in enumerate(frames)}
        with av.open(self._open(vid)) as c:
            s = c.streams.video[0]
            s.thread_count = 1
            rate, tb = float(s.average_rate), float(s.time_base)
            c.seek(int(min(frames) / rate / tb), stream=s, backward=True)
            for f in c.decode(s):
                idx = round(f.pts * tb * rate)
                if idx in wanted:
                    rgb = f.to_ndarray(format="rgb24")
                    side = min(rgb.shape[:2])
                    y, x = (rgb.shape[0] - side) // 2, (rgb.shape[1] - side) // 2
                    out[wanted[idx]] = cv2.resize(
                        rgb[y : y + side, x : x + side],
                        (self.size, self.size),
                        interpolation=cv2.INTER_AREA,
                    )
                if idx >= max(frames):
                    break
        return out

    def read(self, items: list[tuple[int, list[int]]]) -> list[Any]:
        return list(self.pool.map(self._clip, items))


class TorchCodec(NaivePyAV):
    """Clips read with torchcodec's CPU decoder, one ``VideoDecoder`` per clip (as a loader
    opens one per sample), cropped and resized like ``NaivePyAV``.

    Args:
        reader: our Reader over the same sources: it maps video ids to files.
        size: output side.
        threads: clips decoded at once.
        seek_mode: torchcodec's ``"approximate"`` (frame times from the header's rate) or
            ``"exact"`` (a scan of the packets when each decoder opens).
    """

    def __init__(self, reader: Any, size: int, threads: int, seek_mode: str) -> None:
        super().__init__(reader, size, threads)
        self.seek_mode = seek_mode

    def _clip(self, item: tuple[int, list[int]]) -> Any:
        import cv2
        import numpy as np
        from torchcodec.decoders import VideoDecoder

        vid, frames = item
        source = self._open(vid)
        decoder = VideoDecoder(
            source.getvalue() if hasattr(source, "getvalue") else source,
            dimension_order="NHWC",
            num_ffmpeg_threads=1,
            device="cpu",
            seek_mode=self.seek_mode,
        )
        rgb = decoder.get_frames_at(frames).data.numpy()
        side = min(rgb.shape[1:3])
        y, x = (rgb.shape[1] - side) // 2, (rgb.shape[2] - side) // 2
        out = np.empty((len(frames), self.size, self.size, 3), np.uint8)
        for i, frame in enumerate(rgb[:, y : y + side, x : x + side]):
            out[i] = cv2.resize(frame, (self.size, self.size), interpolation=cv2.INTER_AREA)
        return out


def ratio_interval(ours: list[float], ref: list[float], draws: int = 4000) -> tuple[float, float]:
    """A 95 % bootstrap interval of ``sum(ours) / sum(ref)``, batches (pairs) resampled.

    Args:
        ours: our CPU seconds per batch.
        ref: the reference's, for the same batches in the same order.
        draws: bootstrap resamples.
    """
    import numpy as np

    pairs = np.array([ours, ref])
    picks = np.random.default_rng(0).integers(0, pairs.shape[1], (draws, pairs.shape[1]))
    ratios = pairs[0][picks].sum(axis=1) / pairs[1][picks].sum(axis=1)
    low, high = np.quantile(ratios, [0.025, 0.975])
    return float(low), float(high)


def dav1d_interposer(workdir: str) -> Any:
    """benchmarks/dav1d_time.c loaded (ctypes) once this process runs with it preloaded; the
    first call compiles it and runs the script again with it in LD_PRELOAD."""
    import ctypes
    import subprocess

    library = os.path.join(workdir, "dav1d_time.so")
    if library not in os.environ.get("LD_PRELOAD", "").split():
        os.makedirs(workdir, exist_ok=True)
        source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dav1d_time.c")
        subprocess.run(
            ["gcc", "-O2", "-shared", "-fPIC", "-o", library, source, "-ldl"], check=True
        )
        preload = " ".join(filter(None, [os.environ.get("LD_PRELOAD", ""), library]))
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, "LD_PRELOAD": preload}
        )
    interposer = ctypes.CDLL(library)
    interposer.dav1d_time_ms.restype = ctypes.c_double
    return interposer


def print_dav1d_split(interposer: Any, cpu: dict[str, float], frames: int) -> None:
    """The row's CPU inside libdav1d and outside it, per output frame, for both readers."""
    cells = []
    for reader, key in ((0, "ours"), (1, "ref")):
        inside = interposer.dav1d_time_ms(reader) / frames
        outside = cpu[key] / frames * 1e3 - inside
        sends, pictures = (
            interposer.dav1d_time_sends(reader),
            interposer.dav1d_time_pictures(reader),
        )
        cells.append(
            f"{key}: libdav1d {inside:.3f} outside {outside:.3f} ms"
            f" ({sends} sends, {pictures} pictures)"
        )
    print("    " + " | ".join(cells), flush=True)


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
    ap.add_argument("--naive", action="store_true", help="add the naive PyAV loop")
    ap.add_argument("--torchcodec", action="store_true", help="add torchcodec's CPU decoder")
    ap.add_argument("--torchcodec-seek", default="approximate", choices=["approximate", "exact"])
    ap.add_argument("--dav1d-time", action="store_true", help="split CPU at libdav1d's calls")
    ap.add_argument(
        "--distinct",
        action="store_true",
        help="no two clips of a batch from one video (clips sharing a video share decoding)",
    )
    args = ap.parse_args()
    interposer = dav1d_interposer(args.workdir) if args.dav1d_time else None

    import av

    import kohakuclip

    if args.naive or args.torchcodec:
        import cv2

        # one clip per thread: OpenCV's own pool would split each resize and leave its workers
        # spinning into the next contender's measurement (process CPU time counts them)
        cv2.setNumThreads(1)
    if args.torchcodec:
        import torch
        import torchcodec

        torch.set_num_threads(1)
        print(f"torchcodec {torchcodec.__version__}  torch {torch.__version__}")
    sources = args.sources or make_sources(args.make, args.workdir, "av1")
    with tempfile.TemporaryDirectory() as tmp:
        ref = import_reference(args.reference_package, tmp)
        print(f"sources: {sources}  size {args.size}  batch {args.batch}  PyAV {av.__version__}")
        print(f"machine: {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
        extra = [k for k, on in (("naive", args.naive), ("torchcodec", args.torchcodec)) if on]
        heads = "".join(
            f" {k + ' cpu ms':>{len(k) + 7}} {'ours/' + k:>{len(k) + 5}}" for k in extra
        )
        print(
            f"{'clip':<12} {'thr':>3} {'ref cpu ms':>10} {'ours cpu ms':>11} {'cpu ratio':>9}"
            f" {'95 % interval':>13} {'wall ratio':>10}{heads}"
        )
        for name in args.specs:
            items = draw_items(
                sources, SPECS[name], args.clips, seed=1, distinct_in=args.batch * args.distinct
            )
            for threads in args.threads:
                readers: dict[str, Any] = {
                    "ref": ref.Reader(sources, size=args.size, seed=0, threads=threads),  # type: ignore[attr-defined]
                    "ours": kohakuclip.Reader(sources, size=args.size, seed=0, threads=threads),
                }
                if args.naive:
                    readers["naive"] = NaivePyAV(readers["ours"], args.size, threads)
                if args.torchcodec:
                    readers["torchcodec"] = TorchCodec(
                        readers["ours"], args.size, threads, args.torchcodec_seek
                    )
                for reader in readers.values():
                    reader.read(items[: args.batch])  # warm-up
                wall = dict.fromkeys(readers, 0.0)
                per_batch: dict[str, list[float]] = {key: [] for key in readers}
                if interposer is not None:
                    interposer.dav1d_time_reset()
                for r in range(args.rounds):
                    for b, i in enumerate(range(0, len(items), args.batch)):
                        k = (b + r) % len(readers)
                        order = list(readers)[k:] + list(readers)[:k]
                        for key in order:
                            c0, w0 = time.process_time(), time.perf_counter()
                            readers[key].read(items[i : i + args.batch])
                            per_batch[key].append(time.process_time() - c0)
                            wall[key] += time.perf_counter() - w0
                cpu = {key: sum(values) for key, values in per_batch.items()}
                low, high = ratio_interval(per_batch["ours"], per_batch["ref"])
                frames = args.rounds * len(items) * SPECS[name]["frames"]
                cols = "".join(
                    f" {cpu[k] / frames * 1e3:>{len(k) + 7}.3f}"
                    f" {cpu['ours'] / cpu[k]:>{len(k) + 5}.3f}"
                    for k in extra
                )
                print(
                    f"{name:<12} {threads:>3} {cpu['ref'] / frames * 1e3:>10.3f}"
                    f" {cpu['ours'] / frames * 1e3:>11.3f} {cpu['ours'] / cpu['ref']:>9.3f}"
                    f" {f'{low:.3f}-{high:.3f}':>13} {wall['ours'] / wall['ref']:>10.3f}{cols}",
                    flush=True,
                )
                if interposer is not None:
                    print_dav1d_split(interposer, cpu, frames)


if __name__ == "__main__":
    main()

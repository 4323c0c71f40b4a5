"""Decode throughput beside a training thread that keeps the GIL busy, ours and KohakuClip 1.0.0.

    python benchmarks/busy_trainer.py [--quick]
        [--only av1,h264_g16,h264_g250,hevc,jpeg,jpeg_tar,jpeg_folder,jpeg_zip,avif,webp,png,
                png_alpha]
        [--threads 1 2] [--reference "$(../shared/tools/reference-kohakuclip.sh)"]

A training loop in the same process as the decode threads runs Python most of the time (an
eager loop launching kernels). Every time a decode thread needs the GIL it waits behind that
thread, up to the 5 ms switch interval. This benchmark measures, in one run and side by side:

- clips/s (images/s for JPEG) with the main thread waiting on the reader only ("idle"), and
  beside a busy thread running pure Python in 1 ms slices, back to back ("100 %") or each
  followed by a 1 ms sleep ("50 %"), and the ratio busy / idle;
- GIL takes per clip (per image) by the decode threads: every thread but the main and the busy
  one, counted with benchmarks/_gil_count.py (an LD_PRELOAD shim);
- the busy thread's speed while the reader runs, relative to its speed alone.

Sources (built once into ``--media``, default /tmp/kc-busy-media, from the real footage of
../shared/tools/real-footage.sh in /tmp/kc-real): a few seconds of each clip, scaled to 720 wide
(smaller ones kept at their own size), re-encoded with PyAV: H.264 folders (libx264 medium,
GOP 16 closed, and x264's default keyint 250), an HEVC folder (libx265, its default keyint 250),
AV1 shards written by ``kohakuclip-write`` from the same frames, and JPEG image shards written
by ``kohakuclip-write-images`` from real photographs (Debian's Plasma wallpapers) and frames
of the footage; ``jpeg_tar``, ``jpeg_folder`` and ``jpeg_zip`` hold the same JPEGs without an
index, in a plain (WebDataset-style) tar, as files of a folder, and in a zip made with
compression (every member deflated, as ``zip`` and ``shutil.make_archive`` make them);
``avif`` and ``webp`` hold the same photographs written with ``--codec avif`` (AV1 intra,
8-bit 4:2:0) and ``--codec webp`` (lossy); ``png`` is the folder of PNG photographs they were
all written from (at their own size, not capped), ``png_alpha`` the same photographs as RGBA
PNGs with a left-to-right alpha gradient (composited onto white when read).

Video: 16 clips x 8 frames @ 6 fps per batch, size 256; images: batches of 64, size 256. Each
reader runs in its own process (the reference under its own Python) with one batch queued
behind the one decoding; each process measures its modes in turn, ``--rounds`` times in rotated
order.
Each side draws its own random clips from the same sources (the reference's API is used as a
black box: Reader(sources, size, threads, seed), sample(), submit().result()).
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from fractions import Fraction
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _gil_count  # noqa: E402

MEDIA_VERSION = 1
CONTENTS = (
    *("av1", "h264_g16", "h264_g250", "hevc"),
    *("jpeg", "jpeg_tar", "jpeg_folder", "jpeg_zip", "avif", "webp", "png", "png_alpha"),
)
IMAGES = ("jpeg", "jpeg_tar", "jpeg_folder", "jpeg_zip", "avif", "webp", "png", "png_alpha")
MODES = {"idle": 0.0, "100 %": 1.0, "50 %": 0.5}

# (file under /tmp/kc-real, start second): camera pans over photos, animated film, broadcast TV
FOOTAGE = [
    ("pans/pan_Altai.mp4", 0.0),
    ("pans/pan_Autumn.mp4", 1.0),
    ("pans/pan_MilkyWay.mp4", 2.0),
    ("videos/bbb_part0.mp4", 10.0),
    ("videos/bbb_part1.mp4", 20.0),
    ("videos/bbb_part2.mp4", 30.0),
    ("videos/bbb_part3.mp4", 10.0),
    ("videos/bbb_part4.mp4", 25.0),
    ("videos/bbb_part5.mp4", 40.0),
    ("videos/opencv_Megamind.avi", 0.0),
    ("videos/muxjs_tv.ts", 0.0),
]

CHILD = r"""
import json, os, sys, threading, time
spec = json.load(sys.stdin)
sys.path.insert(0, spec["bench_dir"])
from _gil_count import GilCounter, difference
import kohakuclip

counter = GilCounter()
main_tid = threading.get_native_id()

def busy(stop, duty, state):
    state["tid"] = threading.get_native_id()
    x = 0
    while not stop.is_set():
        end = time.perf_counter() + 0.001
        while time.perf_counter() < end:
            x += 1
        state["slices"] += 1
        if duty < 1.0:
            time.sleep(0.001 * (1.0 - duty) / duty)

def start_busy(duty):
    stop, state = threading.Event(), {"slices": 0, "tid": None}
    t = threading.Thread(target=busy, args=(stop, duty, state), name="busy", daemon=True)
    t.start()
    while state["tid"] is None:
        time.sleep(0.001)
    return t, stop, state

opts = dict(size=spec["size"], threads=spec["threads"], seed=0)
if spec["kind"] == "image":
    reader = kohakuclip.ImageReader(spec["sources"], **opts)
    batches = [reader.sample(spec["batch"], seed=i) for i in range(32)]
    per_batch = spec["batch"]
else:
    reader = kohakuclip.Reader(spec["sources"], **opts)
    batches = [
        reader.sample(spec["clips"], spec["frames"], fps=spec["fps"], seed=i) for i in range(32)
    ]
    per_batch = spec["clips"]

reader.read(batches[-1])  # warm-up: threads, decoders, compiled kernels, page cache

def measure(mode, duty, seconds, k0):
    busy_state, alone = None, None
    if duty > 0:  # its rate alone first, the reader idle: the same moment of the machine's noise
        t, stop, busy_state = start_busy(duty)
        a0, s0 = time.perf_counter(), busy_state["slices"]
        time.sleep(0.3)
        alone = (busy_state["slices"] - s0) / (time.perf_counter() - a0)
    before = counter.takes()
    s0 = busy_state["slices"] if busy_state else 0
    t0 = time.perf_counter()
    done, k, pending = 0, k0, []
    while time.perf_counter() - t0 < seconds or done == 0:
        pending.append(reader.submit(batches[k % len(batches)]))
        k += 1
        if len(pending) > 1:  # one batch queued behind the one decoding
            pending.pop(0).result()
            done += 1
    for p in pending:
        p.result()
        done += 1
    wall = time.perf_counter() - t0
    takes = difference(counter.takes(), before)
    slices = (busy_state["slices"] - s0) if busy_state else 0
    if duty > 0:
        stop.set(); t.join()
    skip = {main_tid, busy_state["tid"] if busy_state else None}
    decode = sum(n for tid, n in takes.items() if tid not in skip)
    pool = sum(n for name, n in counter.by_name(takes).items() if name.startswith("kohakuclip-"))
    return {"items": done * per_batch, "wall": wall, "takes": decode, "pool_takes": pool,
            "trainer_speed": slices / wall / alone if alone else None}, k

out = {
    m: {"items": 0, "wall": 0.0, "takes": 0, "pool_takes": 0, "trainer_speed": []}
    for m in spec["modes"]
}
modes = list(spec["modes"].items())
k = 0
for r in range(spec["rounds"]):
    for mode, duty in modes[r % len(modes):] + modes[:r % len(modes)]:
        res, k = measure(mode, duty, spec["seconds"], k)
        for key in ("items", "wall", "takes", "pool_takes"):
            out[mode][key] += res[key]
        if res["trainer_speed"] is not None:
            out[mode]["trainer_speed"].append(res["trainer_speed"])
result = {}
for mode, o in out.items():
    result[mode] = {
        "per_s": o["items"] / o["wall"],
        "takes_per_item": o["takes"] / o["items"],
        "pool_takes_per_item": o["pool_takes"] / o["items"],
        "trainer_speed": sum(o["trainer_speed"]) / len(o["trainer_speed"])
        if o["trainer_speed"] else None,
    }
reader.close() if hasattr(reader, "close") else None
print(json.dumps(result))
"""


# -- media ------------------------------------------------------------------------------------
def _even(x: float) -> int:
    return max(2, round(x / 2) * 2)


def _scaled_frames(path: str, start: float, seconds: float) -> tuple[list[Any], Fraction]:
    """Frames of ``seconds`` from ``start`` of one video, 720 wide at most (even sizes)."""
    import av

    with av.open(path) as c:
        s = c.streams.video[0]
        rate = Fraction(s.average_rate or 25)
        w, h = s.width, s.height
        if w > 720:
            w, h = 720, _even(s.height * 720 / s.width)
        w, h = _even(w), _even(h)
        if start > 0:
            c.seek(int(start / s.time_base), stream=s, backward=True)
        frames = []
        for f in c.decode(s):
            if f.time is None or f.time < start:
                continue
            if f.time >= start + seconds:
                break
            frames.append(f.reformat(width=w, height=h, format="yuv420p", interpolation="AREA"))
    return frames, rate


def _encode(frames: list[Any], rate: Fraction, path: str, codec: str, options: dict) -> None:
    import av

    with av.open(path, "w") as out:
        s = out.add_stream(codec, rate=rate, options=options)
        s.width, s.height, s.pix_fmt = frames[0].width, frames[0].height, "yuv420p"
        for i, f in enumerate(frames):
            f = f.reformat(format="yuv420p")
            f.pts, f.time_base = i, 1 / rate
            for p in s.encode(f):
                out.mux(p)
        for p in s.encode(None):
            out.mux(p)


def _describe(path: str) -> dict[str, Any]:
    import av

    with av.open(path) as c:
        s = c.streams.video[0]
        keys = n = 0
        for p in c.demux(s):
            if p.size:
                n += 1
                keys += bool(p.is_keyframe)
        return {
            "codec": s.codec_context.name,
            "size": f"{s.width}x{s.height}",
            "fps": round(float(s.average_rate), 3),
            "frames": n,
            "keyframes": keys,
            "bytes": os.path.getsize(path),
        }


def build_media(media: str, real: str, seconds: float, python: str) -> dict[str, Any]:
    """Write the benchmark's sources once; returns their manifest (media.json)."""
    manifest_path = os.path.join(media, "media.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        if manifest.get("version") == MEDIA_VERSION:
            return manifest
    import av
    from PIL import Image

    if not os.path.isdir(real):
        raise SystemExit(f"no real footage in {real}: run ../shared/tools/real-footage.sh first")
    shutil.rmtree(media, ignore_errors=True)
    dirs = {
        k: os.path.join(media, k) for k in ("master", "h264_g16", "h264_g250", "hevc", "photos")
    }
    for d in dirs.values():
        os.makedirs(d)
    gop16 = {"preset": "medium", "crf": "23", "g": "16", "keyint_min": "16", "sc_threshold": "0"}
    variants = {
        "master": ("libx264", {"preset": "ultrafast", "crf": "10"}),
        "h264_g16": ("libx264", gop16),
        "h264_g250": ("libx264", {"preset": "medium", "crf": "23"}),  # x264's keyint 250
        "hevc": ("libx265", {"preset": "fast", "crf": "28", "x265-params": "log-level=error"}),
    }
    videos = []
    for rel, start in FOOTAGE:
        src = os.path.join(real, rel)
        if not os.path.exists(src):
            print(f"  (missing {src}, skipped)", flush=True)
            continue
        frames, rate = _scaled_frames(src, start, seconds)
        if len(frames) < 16:
            continue
        name = os.path.splitext(os.path.basename(rel))[0]
        t0 = time.perf_counter()
        for key, (codec, options) in variants.items():
            _encode(frames, rate, os.path.join(dirs[key], f"{name}.mp4"), codec, options)
        for i in range(0, len(frames), max(1, int(2 * rate))):  # a frame every 2 s
            frames[i].to_image().save(os.path.join(dirs["photos"], f"{name}_{i:04d}.png"))
        videos.append(name)
        print(f"  {name}: {len(frames)} frames in {time.perf_counter() - t0:.1f} s", flush=True)
    wallpapers = sorted(glob.glob(os.path.join(real, ".work/x/usr/share/wallpapers/*")))
    for wp in wallpapers:  # real photographs: the largest size of each wallpaper
        imgs = glob.glob(os.path.join(wp, "contents/images/*"))
        if not imgs:
            continue
        best = max(imgs, key=os.path.getsize)
        with Image.open(best) as im:
            im = im.convert("RGB")
            im.thumbnail((1600, 1600))
            im.save(os.path.join(dirs["photos"], f"photo_{os.path.basename(wp)}.png"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    av1_dir = os.path.join(media, "av1")
    cmd = "import sys; from kohakuclip.write.cli import main; sys.exit(main(sys.argv[1:]))"
    subprocess.run(
        [python, "-c", cmd, av1_dir, dirs["master"], "--quiet", "--workers", "2"],
        check=True,
        env=env,
        timeout=3600,
    )
    img_dir = os.path.join(media, "jpeg")
    cmd = "import sys; from kohakuclip.write.image_cli import main; sys.exit(main(sys.argv[1:]))"
    subprocess.run(
        [python, "-c", cmd, img_dir, dirs["photos"], "--no-progress", "--workers", "2"],
        check=True,
        env=env,
        timeout=3600,
    )
    manifest = {
        "version": MEDIA_VERSION,
        "av": av.__version__,
        "seconds": seconds,
        "videos": videos,
        "sources": {
            "av1": sorted(glob.glob(os.path.join(av1_dir, "*.zip"))),
            "h264_g16": [dirs["h264_g16"]],
            "h264_g250": [dirs["h264_g250"]],
            "hevc": [dirs["hevc"]],
            "jpeg": sorted(glob.glob(os.path.join(img_dir, "*.zip"))),
        },
        "describe": {
            key: [_describe(os.path.join(dirs[key], f"{v}.mp4")) for v in videos]
            for key in ("h264_g16", "h264_g250", "hevc")
        },
        "photos": len(os.listdir(dirs["photos"])),
    }
    with open(manifest_path, "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def coded_shards(media: str, python: str, codec: str) -> list[str]:
    """The photographs of the JPEG shards stored with ``--codec`` ``codec`` (avif, webp),
    written once."""
    out = os.path.join(media, codec)
    if not glob.glob(os.path.join(out, "*.zip")):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        cmd = (
            "import sys; from kohakuclip.write.image_cli import main; sys.exit(main(sys.argv[1:]))"
        )
        photos = os.path.join(media, "photos")
        subprocess.run(
            [python, "-c", cmd, out, photos, "--codec", codec, "--no-progress", "--workers", "2"],
            check=True,
            env=env,
            timeout=3600,
        )
    return sorted(glob.glob(os.path.join(out, "*.zip")))


def plain_copy(media: str, shards: list[str], kind: str) -> list[str]:
    """The JPEG shards' images without an index, made once: one plain tar of ``<key>.jpg``
    members (``kind`` "tar", as WebDataset keeps them), a folder of files ("folder"), or a zip
    with every member deflated ("zip")."""
    import tarfile
    import zipfile

    name = {"tar": "images.tar", "zip": "images.zip"}.get(kind, "images")
    path = os.path.join(media, f"jpeg_{kind}", name)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        members = []
        for shard in shards:
            with zipfile.ZipFile(shard) as z:
                members += [(n, z.read(n)) for n in z.namelist() if n.endswith(".jpg")]
        if kind == "tar":
            with tarfile.open(path + ".tmp", "w") as tar:
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        elif kind == "zip":
            with zipfile.ZipFile(path + ".tmp", "w", zipfile.ZIP_DEFLATED) as z:
                for name, data in members:
                    z.writestr(name, data)
        else:
            os.makedirs(path + ".tmp")
            for name, data in members:
                with open(os.path.join(path + ".tmp", name), "wb") as f:
                    f.write(data)
        os.replace(path + ".tmp", path)
    return [path]


def alpha_copy(media: str) -> str:
    """The photographs as RGBA PNGs, alpha a left-to-right gradient (0 to 255), made once."""
    from PIL import Image

    path = os.path.join(media, "png_alpha")
    if not os.path.isdir(path):
        os.makedirs(path + ".tmp", exist_ok=True)
        photos = os.path.join(media, "photos")
        for name in sorted(os.listdir(photos)):
            with Image.open(os.path.join(photos, name)) as image:
                rgba = image.convert("RGBA")
            rgba.putalpha(Image.linear_gradient("L").rotate(90).resize(rgba.size))
            rgba.save(os.path.join(path + ".tmp", os.path.splitext(name)[0] + ".png"))
        os.replace(path + ".tmp", path)
    return path


# -- running ----------------------------------------------------------------------------------
def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH: the reference must not import our source tree."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def real_interpreter(python: str) -> tuple[str, str]:
    """(executable, LD_PRELOAD) a python (or a wrapper script around one) really runs with."""
    code = "import os, sys; print(sys.executable); print(os.environ.get('LD_PRELOAD', ''))"
    out = subprocess.run(
        [python, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=clean_env(),
    ).stdout
    exe, preload = [*out.splitlines(), "", ""][:2]
    return exe, preload


def run_child(exe: str, preload: str, lib: str, spec: dict, ours: bool) -> dict:
    """One reader's measurements, in a fresh process with the GIL counter preloaded."""
    env = _gil_count.preload_env(lib, dict(os.environ if ours else clean_env(), LD_PRELOAD=preload))
    env["OMP_NUM_THREADS"] = "1"
    budget = 400 + spec["rounds"] * len(spec["modes"]) * spec["seconds"] * 4
    try:
        proc = subprocess.run(
            [exe, "-c", CHILD],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            env=env,
            timeout=budget,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {budget:.0f} s"}
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:160]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def machine() -> str:
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg()
    return (
        f"{platform.node()}: {model}, {os.cpu_count()} CPUs, load average "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}, {platform.platform()}"
    )


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _takes(res: dict) -> str:
    """Takes per item: by the pool's threads (``kohakuclip-N``) where it names them, else by
    every thread but the main and busy ones; ``(+x)``: takes by other such threads."""
    total, pool = res["takes_per_item"], res.get("pool_takes_per_item", 0.0)
    if pool == 0:
        return _fmt(total)
    other = total - pool
    return _fmt(pool) + (f" (+{other:.1f})" if other >= 0.05 else "")


def table_row(content: str, who: str, threads: int, res: dict) -> str:
    unit = "images" if content in IMAGES else "clips"
    if "error" in res:
        return f"| {content} | {who} | {threads} | error: {res['error']} |" + " |" * 8
    idle = res["idle"]["per_s"]
    cells = [content, who, str(threads), f"{idle:.1f} {unit}/s"]
    for mode in ("100 %", "50 %"):
        per_s = res[mode]["per_s"]
        cells += [f"{per_s:.1f}", f"{per_s / idle:.2f}"]
    cells.append(" / ".join(_takes(res[m]) for m in MODES))
    cells += [_fmt(res[m]["trainer_speed"], 2) for m in ("100 %", "50 %")]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one short round per row, for checking")
    ap.add_argument("--only", default=",".join(CONTENTS), help=f"comma list of {CONTENTS}")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--seconds", type=float, default=4.0, help="per mode and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--media", default="/tmp/kc-busy-media", help="cache of the sources")
    ap.add_argument("--real", default="/tmp/kc-real", help="real-footage.sh's folder")
    ap.add_argument("--clip-seconds", type=float, default=8.0, help="length of each video")
    ap.add_argument(
        "--reference",
        default=None,
        help="python of KohakuClip 1.0.0 (default: ../shared/tools/reference-kohakuclip.sh's, "
        "if it prints one); 'none' skips it",
    )
    args = ap.parse_args()
    only = [c.strip() for c in args.only.split(",") if c.strip()]
    for c in only:
        if c not in CONTENTS:
            ap.error(f"--only: unknown {c!r} (choose from {', '.join(CONTENTS)})")
    if args.quick:
        args.seconds, args.rounds = 1.0, 1

    print("## Decoding beside a busy training thread\n")
    print(f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
    print(f"- machine: {machine()}")
    t0 = time.perf_counter()
    manifest = build_media(args.media, args.real, args.clip_seconds, sys.executable)
    if time.perf_counter() - t0 > 1:
        print(f"- media built in {time.perf_counter() - t0:.0f} s into {args.media}")
    lib = _gil_count.build()

    ref_python = args.reference
    if ref_python is None:
        tool = os.path.join(HERE, "..", "..", "shared", "tools", "reference-kohakuclip.sh")
        tool = tool if os.path.exists(tool) else "/work/shared/tools/reference-kohakuclip.sh"
        try:
            ref_python = subprocess.run(
                ["bash", tool],
                capture_output=True,
                text=True,
                timeout=900,
                check=True,
                env=clean_env(),
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            ref_python = "none"
    ref = None if ref_python in ("none", "") else real_interpreter(ref_python)
    ours = (sys.executable, os.environ.get("LD_PRELOAD", ""))
    import av

    print(
        f"- python {platform.python_version()}, PyAV {av.__version__}; reference: "
        f"{ref[0] if ref else 'not run'}"
    )
    print(
        f"- content: {len(manifest['videos'])} videos of {manifest['seconds']:.0f} s from "
        f"real footage ({', '.join(manifest['videos'])}); {manifest['photos']} images "
        "(real photographs and frames of the footage)"
    )
    for key, rows in manifest["describe"].items():
        sizes = sorted({r["size"] for r in rows})
        frames = sum(r["frames"] for r in rows)
        keys = sum(r["keyframes"] for r in rows)
        mb = sum(r["bytes"] for r in rows) / 1e6
        print(
            f"  - {key}: {rows[0]['codec']}, {', '.join(sizes)}, {frames} frames, "
            f"{frames / keys:.0f} frames per keyframe, {mb:.1f} MB"
        )
    print(
        f"- per batch: 16 clips x 8 frames @ 6 fps (images: 64), size 256; {args.rounds} round(s) "
        f"of {args.seconds:.1f} s per mode; busy thread: pure Python in 1 ms slices, back to back "
        "(100 %) or each followed by a 1 ms sleep (50 %)"
    )
    print(
        "- GIL takes per clip (image) by the decode threads, idle / 100 % / 50 %: ours, its "
        "pool's threads kohakuclip-N ((+x): other threads); 1.0.0, every thread but the main "
        "and busy ones; trainer speed: the busy thread's rate beside the reader / alone "
        "(0.3 s before each measurement)\n"
    )
    print(
        "| source | reader | threads | idle | 100 % busy | busy / idle | 50 % busy | busy / idle |"
        " GIL takes per item | trainer speed 100 % | trainer speed 50 % |"
    )
    print("| --- " * 11 + "|", flush=True)
    for content in only:
        kind = "image" if content in IMAGES else "video"
        if content in ("jpeg_tar", "jpeg_folder", "jpeg_zip"):
            sources = plain_copy(args.media, manifest["sources"]["jpeg"], content[5:])
        elif content in ("avif", "webp"):
            sources = coded_shards(args.media, sys.executable, content)
        elif content == "png":
            sources = [os.path.join(args.media, "photos")]
        elif content == "png_alpha":
            sources = [alpha_copy(args.media)]
        else:
            sources = manifest["sources"][content]
        for threads in args.threads:
            spec = {
                "bench_dir": HERE,
                "kind": kind,
                "sources": sources,
                "threads": threads,
                "size": 256,
                "clips": 16,
                "frames": 8,
                "fps": 6.0,
                "batch": 64,
                "seconds": args.seconds,
                "rounds": args.rounds,
                "modes": MODES,
            }
            runs = [("ours", ours)]
            if ref is not None and kind == "video":
                runs.append(("1.0.0", ref))
            for who, (exe, preload) in runs:
                res = run_child(exe, preload, lib, spec, who == "ours")
                print(table_row(content, who, threads, res), flush=True)


if __name__ == "__main__":
    main()

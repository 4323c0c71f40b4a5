"""The writer command lines (``kohakuclip-write``, ``kohakuclip-write-images``) under bad input,
signals and failing output folders: exit codes, one-line messages, nothing half-written left;
and what the video writer's ``--backend ffmpeg`` and ``--loop-filters`` change."""

from __future__ import annotations

import io
import json
import resource
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from functools import cache
from pathlib import Path

import av
import pyarrow.parquet as pq
import pytest
from PIL import Image

from kohakuclip import WriteError, write_images, write_videos
from kohakuclip.write import cli, image_cli
from kohakuclip.write.ffmpeg_backend import FFMPEG_ENV
from tests.image_media import encode, photo, write_tar
from tests.media import VideoSpec, make_video
from tests.test_av1_syntax import ffmpeg_trace

FAST = ["--preset", "12", "--no-progress"]  # --quiet elsewhere: both spellings
IMAGES = ["--min-short", "0", "--max-short", "64", "--no-progress"]


@cache
def clip(seed: int, frames: int = 12) -> bytes:
    return make_video(VideoSpec(width=128, height=80, frames=frames, seed=seed))


@cache
def jpeg(seed: int = 0) -> bytes:
    return encode(Image.fromarray(photo(96, 128, seed=seed)), "JPEG", quality=90)


def folder(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.rglob("*") if p.name.endswith(".tmp"))


def start(module: str, *args: str | Path, limit: int | None = None) -> subprocess.Popen[str]:
    """A writer CLI in its own process (default SIGINT handling; ``limit``: max file bytes)."""

    def setup() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    command = [sys.executable, "-m", f"kohakuclip.write.{module}", *map(str, args)]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=setup
    )


def wait_for(path: Path, proc: subprocess.Popen[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def stop(proc: subprocess.Popen[str], sig: signal.Signals) -> tuple[int, str, float]:
    """Send ``sig``; (exit status, stderr, seconds it took to exit)."""
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return proc.returncode, err, time.monotonic() - sent


EXPECTED = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_a_native_encode_promptly(tmp_path, sig) -> None:
    # a_short is stored in shard 0; b_long (tens of seconds at preset 2) is being encoded
    long = make_video(VideoSpec(width=160, height=120, frames=400, seed=1))
    src = folder(tmp_path / "src", {"a_short.mp4": clip(0), "b_long.mp4": long})
    out = tmp_path / "out"
    args = [out, src, "--preset", "2", "--per-shard", "1", "--workers", "1", "--quiet"]
    proc = start("cli", *args)
    wait_for(out / "shard_00000.zip", proc)
    time.sleep(0.5)
    code, err, seconds = stop(proc, sig)
    assert (code, err.strip().splitlines()[-1]) == (
        EXPECTED[sig][0],
        f"kohakuclip-write: {EXPECTED[sig][1]}",
    )
    assert "Traceback" not in err and seconds < 10
    assert leftovers(out) == []
    assert sorted(p.name for p in out.glob("shard_*")) == ["shard_00000.zip"]
    # the finished shard is kept; what is left resumes (here the short video alone)
    resume = [out, src / "a_short.mp4", "--resume", "--preset", "2", "--per-shard", "1", "--quiet"]
    done = start("cli", *resume)
    _, err = done.communicate(timeout=120)
    assert done.returncode == 0, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_an_image_run_without_partial_files(tmp_path, sig) -> None:
    write_tar(str(tmp_path / "many.tar"), {f"{i:04d}.jpg": jpeg(i % 4) for i in range(600)})
    out = tmp_path / "out"
    args = [out, tmp_path / "many.tar", "--per-shard", "20", "--codec", "webp", "--workers", "1"]
    proc = start("image_cli", *args, *IMAGES)
    wait_for(out / "shard_00000.zip", proc)
    code, err, seconds = stop(proc, sig)
    assert code == EXPECTED[sig][0], err
    assert err.strip().splitlines()[-1] == f"kohakuclip-write-images: {EXPECTED[sig][1]}"
    assert "Traceback" not in err and seconds < 10
    assert leftovers(out) == []
    assert image_cli.main([str(out), str(tmp_path / "many.tar"), *args[2:], *IMAGES]) == 2
    assert (
        image_cli.main([str(out), str(tmp_path / "many.tar"), *args[2:], *IMAGES, "--resume"]) == 0
    )
    assert len(list(out.glob("shard_*.zip"))) == 30 and leftovers(out) == []


def test_a_piped_progress_bar_prints_lines_not_redraws(tmp_path) -> None:
    write_tar(str(tmp_path / "few.tar"), {f"{i:02d}.jpg": jpeg(i % 4) for i in range(12)})
    options = [opt for opt in IMAGES if opt != "--no-progress"]
    command = [sys.executable, "-m", "kohakuclip.write.image_cli", tmp_path / "out"]
    # bytes, not text: text mode would turn the carriage returns looked for into newlines
    done = subprocess.run([*command, tmp_path / "few.tar", *options], capture_output=True)
    assert done.returncode == 0, done.stderr
    bar = [line for line in done.stderr.split(b"\n") if line.startswith(b"images: ")]
    assert bar and b"12img" in bar[-1] and b"\r" not in done.stderr


@pytest.mark.parametrize("module", ["cli", "image_cli"])
def test_a_full_disk_names_the_shard_and_leaves_nothing_partial(tmp_path, module) -> None:
    # RLIMIT_FSIZE makes the kernel refuse writes past 40 kB, as a full disk would (EFBIG)
    if module == "cli":
        src = folder(tmp_path / "src", {f"v{i}.mp4": clip(i, 24) for i in range(6)})
        extra = ["--codec", "h264", "--crf", "10", "--per-shard", "6", "--quiet"]
    else:
        src = folder(tmp_path / "src", {f"p{i}.png": photo_png(i) for i in range(8)})
        extra = ["--per-shard", "8", "--quality", "100", "--no-progress", "--min-short", "0"]
    out = tmp_path / "out"
    proc = start(module, out, src, *extra, limit=40_000)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    assert err.strip().splitlines() == [
        f"kohakuclip-write{'' if module == 'cli' else '-images'}: error: "
        f"{out / 'shard_00000.zip'}: File too large"
    ]
    assert leftovers(out) == [] and not list(out.glob("shard_*"))


@cache
def photo_png(seed: int) -> bytes:
    return encode(Image.fromarray(photo(200, 200, seed=seed)), "PNG")


@pytest.mark.parametrize("main", [cli.main, image_cli.main])
def test_an_output_that_is_not_a_folder_is_a_one_line_error(tmp_path, capsys, main) -> None:
    src = folder(tmp_path / "src", {"a.mp4": clip(0), "p.jpg": jpeg()})
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    prog = "kohakuclip-write" if main is cli.main else "kohakuclip-write-images"
    assert main([str(afile), str(src), *IMAGES[:2]] if main is image_cli.main else
                [str(afile), str(src), *FAST]) == 2  # fmt: skip
    assert capsys.readouterr().err == f"{prog}: error: {afile}: exists and is not a folder\n"
    below = afile / "out"
    assert main([str(below), str(src), *IMAGES[:2]] if main is image_cli.main else
                [str(below), str(src), *FAST]) == 2  # fmt: skip
    assert capsys.readouterr().err == f"{prog}: error: {below}: Not a directory\n"
    assert afile.read_text() == "not a folder"


def test_the_image_writer_refuses_an_earlier_run_without_resume(tmp_path, capsys) -> None:
    src = folder(tmp_path / "src", {"p.jpg": jpeg()})
    out = tmp_path / "out"
    write_images(out, [src], min_short=0, max_short=64, progress=False)  # IMAGES' settings
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(WriteError, match=r"holds an earlier run .*resume"):
        write_images(out, [src], min_short=0, max_short=64, progress=False)
    assert image_cli.main([str(out), str(src), *IMAGES]) == 2
    assert "--resume" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert image_cli.main([str(out), str(src), *IMAGES, "--resume"]) == 0
    for foreign in ("shard_00000.zip", "manifest.parquet"):  # another writer's files
        other = folder(tmp_path / foreign, {foreign: b"x"})
        with pytest.raises(WriteError, match=foreign):
            write_images(other, [src], min_short=0, progress=False)
        assert (other / foreign).read_bytes() == b"x"
    # a part refuses only its own earlier files
    parts = tmp_path / "parts"
    write_images(parts, [src], min_short=0, progress=False, part="0/2")
    write_images(parts, [src], min_short=0, progress=False, part="1/2")
    with pytest.raises(WriteError, match="part 0/2"):
        write_images(parts, [src], min_short=0, progress=False, part="0/2")
    # a folder of the video writer's: neither resumed (which would clear its shards) nor reused
    videos = tmp_path / "videos"
    assert cli.main([str(videos), str(folder(tmp_path / "vsrc", {"a.mp4": clip(0)})), *FAST]) == 0
    kept = {p.name: p.read_bytes() for p in videos.iterdir()}
    for resume in (False, True):
        with pytest.raises(WriteError, match="holds the video writer's run"):
            write_images(videos, [src], min_short=0, progress=False, resume=resume)
    assert {p.name: p.read_bytes() for p in videos.iterdir()} == kept


def test_the_image_part_summary_names_the_part_skip_log(tmp_path, capsys) -> None:
    src = folder(tmp_path / "src", {"p0.jpg": jpeg(0), "p1.jpg": jpeg(1)})
    out = tmp_path / "out"
    assert image_cli.main([str(out), str(src), *IMAGES, "--part", "0/2"]) == 0
    log = out / "part-00000-of-00002.skipped.jsonl"
    assert f"(see {log})" in capsys.readouterr().err and log.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--preset", "99"],
        ["--preset", "-2"],
        ["--crf", "64"],
        ["--gop", "0"],
        ["--workers", "0"],
        ["--workers", "-2"],
        ["--per-shard", "0"],
        ["--ray-parts", "2"],
        ["--part", "2/2"],
        ["--staging", "somewhere"],
    ],
)
def test_bad_video_options_are_usage_errors(tmp_path, capsys, argv) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([str(tmp_path / "out"), str(tmp_path), *argv])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("kohakuclip-write: error:")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--quality", "150"],
        ["--quality", "-1"],
        ["--workers", "0"],
        ["--max-short", "-1"],
        ["--part", "x"],
        ["--staging", "somewhere"],
        ["--ray-parts", "2"],
        ["--ray", "--ray-parts", "0"],
        ["--ray", "--part", "0/2"],
    ],
)
def test_bad_image_options_are_usage_errors(tmp_path, capsys, argv) -> None:
    with pytest.raises(SystemExit) as exit_:
        image_cli.main([str(tmp_path / "out"), str(tmp_path), *argv])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("kohakuclip-write-images: error:")
    assert not (tmp_path / "out").exists()


def test_bad_values_raise_from_the_python_api(tmp_path) -> None:
    src = [("a.mp4", clip(0))]
    for bad in ({"preset": 99}, {"workers": 0}, {"ray_parts": 2}):
        with pytest.raises(ValueError):
            write_videos(tmp_path / "v", src, progress=False, **bad)  # type: ignore[arg-type]
    for bad in ({"quality": 150}, {"quality": -1}, {"workers": -2}):
        with pytest.raises(ValueError):
            write_images(tmp_path / "i", [tmp_path], progress=False, **bad)  # type: ignore[arg-type]
    assert not (tmp_path / "v").exists() and not (tmp_path / "i").exists()


def test_runs_that_store_nothing_fail_with_a_message(tmp_path, capsys) -> None:
    empty = folder(tmp_path / "empty", {})
    assert cli.main([str(tmp_path / "o1"), str(empty), *FAST]) == 1
    assert capsys.readouterr().err == f"kohakuclip-write: error: no videos found under {empty}\n"
    bad = folder(tmp_path / "bad", {"text.mp4": b"not a video"})
    assert cli.main([str(tmp_path / "o2"), str(bad), *FAST]) == 1
    log = tmp_path / "o2" / "skipped.jsonl"
    err = capsys.readouterr().err
    assert err.startswith(f"kohakuclip-write: error: 0 of 1 videos stored, see {log}; the first: ")
    assert f"{bad / 'text.mp4'}: cannot open" in err
    shard = tmp_path / "shard.zip"
    shard.write_bytes(b"PK")
    assert cli.main([str(tmp_path / "o3"), str(shard), *FAST]) == 2
    assert "zip archives are not a video source" in capsys.readouterr().err
    assert image_cli.main([str(tmp_path / "o4"), str(empty), *IMAGES]) == 1
    err = capsys.readouterr().err
    assert err == f"kohakuclip-write-images: error: no images found under {empty}\n"
    small = folder(tmp_path / "small", {"p.jpg": jpeg()})
    assert image_cli.main([str(tmp_path / "o5"), str(small), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "0 of 1 images stored" in err and "p.jpg" in err  # the reason: too small
    # a part whose block is all bad is normal: merge still needs its files
    assert cli.main([str(tmp_path / "o6"), str(bad), "--part", "0/1", *FAST]) == 0
    assert (tmp_path / "o6" / "part-00000-of-00001.skipped.jsonl").exists()


@pytest.mark.parametrize(
    ("main", "prog"), [(cli.main, "kohakuclip-write"), (image_cli.main, "kohakuclip-write-images")]
)
def test_an_unreachable_bucket_fails_before_anything_is_written(
    tmp_path, capsys, monkeypatch, main, prog
) -> None:
    for name, value in {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",  # the discard port: nothing listens
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "nobody",
        "AWS_SECRET_ACCESS_KEY": "nothing",
    }.items():
        monkeypatch.setenv(name, value)
    src = folder(tmp_path / "src", {"a.mp4": clip(0), "p.jpg": jpeg()})
    url = f"s3://unreachable-{prog}/out/"
    staging = tmp_path / "staging"
    assert main([url, str(src), "--staging", str(staging)]) == 2
    assert capsys.readouterr().err.startswith(f"{prog}: error: {url}: ")
    assert not staging.exists()  # nothing was encoded


# --- the video writer's encoder options -------------------------------------------------------


def _ffmpeg_or_skip() -> str:
    """The ffmpeg binary ``--backend ffmpeg`` runs ($KOHAKUCLIP_FFMPEG, else imageio-ffmpeg's);
    the test is skipped where there is none."""
    from kohakuclip.write.ffmpeg_backend import ffmpeg_binary

    try:
        binary = ffmpeg_binary()
    except (ImportError, RuntimeError) as e:  # imageio-ffmpeg missing, or without its binary
        pytest.skip(f"no ffmpeg binary for --backend ffmpeg ({e})")
    if shutil.which(binary) is None:
        pytest.skip(f"no ffmpeg binary for --backend ffmpeg ({binary} cannot be run)")
    return binary


def test_the_ffmpeg_backend_runs_one_ffmpeg_per_video(tmp_path, monkeypatch) -> None:
    binary = _ffmpeg_or_skip()
    calls = tmp_path / "calls"
    wrapper = tmp_path / "ffmpeg"  # logs each run's arguments, then runs the real ffmpeg
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\nexec "{binary}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv(FFMPEG_ENV, str(wrapper))
    src = folder(tmp_path / "src", {"a.mp4": clip(0), "b.mp4": clip(1)})
    out = tmp_path / "out"
    assert cli.main([str(out), str(src), "--backend", "ffmpeg", "--workers", "1", *FAST]) == 0
    runs = calls.read_text().splitlines()
    assert len(runs) == 2 and all("-c:v libsvtav1" in run for run in runs)
    assert json.loads((out / "encoding.json").read_text())["backend"] == "ffmpeg"
    rows = pq.read_table(out / "manifest.parquet").to_pylist()
    assert [(r["member"], r["frames"], r["codec"]) for r in rows] == [
        ("a.mp4", 12, "av1"),
        ("b.mp4", 12, "av1"),
    ]


def _first_headers(mp4: bytes) -> tuple[dict[str, int], dict[str, int]]:
    """The AV1 sequence header and first frame header of a stored mp4, as FFmpeg's parser reads
    them."""
    with av.open(io.BytesIO(mp4)) as container:
        packet = next(p for p in container.demux(video=0) if p.size)
        sections, errors = ffmpeg_trace([bytes(packet)])
    assert not errors
    kinds = [s["_kind"] for s in sections]
    return sections[kinds.index("Sequence Header")], sections[kinds.index("Frame Header")]


def test_loop_filters_turn_on_deblocking_and_cdef(tmp_path) -> None:
    # loop restoration is left to SVT-AV1, which keeps it off for a picture this small
    src = folder(tmp_path / "src", {"a.mp4": clip(0)})
    found = {}
    for flags in ([], ["--loop-filters"]):
        out = tmp_path / f"out{len(flags)}"
        assert cli.main([str(out), str(src), *flags, *FAST]) == 0
        settings = json.loads((out / "encoding.json").read_text())
        with zipfile.ZipFile(out / "shard_00000.zip") as z:
            sequence, frame = _first_headers(z.read("a.mp4"))
        found[bool(flags)] = (
            settings["settings"]["loop_filters"],
            "enable-dlf=0:enable-cdef=0" in settings["encoder_options"]["svtav1-params"],
            sequence["enable_cdef"],
            frame["loop_filter_level[0]"] > 0,  # the key frame's deblocking strength
        )
    assert found == {False: (False, True, 0, False), True: (True, False, 1, True)}


def test_a_video_that_stops_decoding_is_skipped_without_encoder_noise(tmp_path) -> None:
    """A source whose data turns to garbage part way is named in the skip log and the exit
    status; the AV1 encoder it had opened is drained first, so nothing on stderr is a
    libsvtav1 line naming no file."""
    import numpy as np

    damaged = bytearray(make_video(VideoSpec(frames=24, seed=1)))
    middle = len(damaged) // 2
    noise = np.random.default_rng(0).integers(0, 256, 2000, dtype=np.uint8).tobytes()
    damaged[middle : middle + 2000] = noise
    (tmp_path / "damaged.mp4").write_bytes(bytes(damaged))
    proc = start("cli", tmp_path / "out", tmp_path / "damaged.mp4", *FAST, "--workers", "1")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "damaged.mp4: cannot decode" in err
    assert "Svt[" not in err, err
    skipped = (tmp_path / "out" / "skipped.jsonl").read_text()
    assert "damaged.mp4" in skipped and not leftovers(tmp_path / "out")


def test_a_killed_ffmpeg_backend_leaves_no_encoder_running_nor_scratch(tmp_path, monkeypatch):
    """SIGKILL (no handler runs) while ffmpeg encodes: ffmpeg dies with the writer's thread
    instead of encoding on, and the next run removes the dead writer's scratch folder."""
    binary = _ffmpeg_or_skip()
    pids = tmp_path / "pids"
    wrapper = tmp_path / "ffmpeg"  # records its pid, then becomes the real ffmpeg (same pid)
    wrapper.write_text(f'#!/bin/sh\necho $$ >> "{pids}"\nexec "{binary}" "$@"\n')
    wrapper.chmod(0o755)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv(FFMPEG_ENV, str(wrapper))
    monkeypatch.setenv("TMPDIR", str(scratch))
    long = make_video(VideoSpec(width=160, height=120, frames=400, seed=1))
    src = folder(tmp_path / "src", {"long.mp4": long})
    args = [src, "--backend", "ffmpeg", "--preset", "2", "--workers", "1", "--quiet"]
    proc = start("cli", tmp_path / "out", *args)
    wait_for(pids, proc)
    time.sleep(0.5)
    (work,) = scratch.iterdir()
    assert (work / ".lock").exists()
    proc.kill()
    proc.wait(timeout=30)
    ffmpeg = int(pids.read_text().split()[0])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{ffmpeg}").exists() and b"zombie" not in _state(ffmpeg):
        assert time.monotonic() < deadline, "ffmpeg kept running after its writer was killed"
        time.sleep(0.05)
    again = start("cli", tmp_path / "again", folder(tmp_path / "short", {"a.mp4": clip(0)}),
                  "--backend", "ffmpeg", *FAST)  # fmt: skip
    assert again.wait(timeout=120) == 0
    assert list(scratch.iterdir()) == []


def _state(pid: int) -> bytes:
    """A process's state line from /proc (b"" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/status").read_bytes().split(b"\n")[2].lower()
    except (OSError, IndexError):
        return b""


def test_the_sweep_leaves_a_held_scratch_folder_and_odd_names(tmp_path, monkeypatch) -> None:
    """A scratch folder whose lock a live writer holds (here: this process, which the sweep
    cannot tell from a writer in another container) stays; released, it goes. A fresh folder
    without a lock file (being made) and any name after the prefix are left alone."""
    import fcntl
    import os
    import tempfile

    from kohakuclip.write import ffmpeg_backend

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    held = tmp_path / "kohakuclip-ffmpeg-held"
    held.mkdir()
    fd = os.open(held / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    fresh = tmp_path / "kohakuclip-ffmpeg-99999999999999999999999-x"
    fresh.mkdir()
    sweep = ffmpeg_backend._sweep_abandoned.__wrapped__
    sweep()
    assert held.exists() and fresh.exists()
    os.close(fd)
    sweep()
    assert not held.exists() and fresh.exists()


def test_a_sweep_while_a_writer_locks_its_scratch_leaves_it(tmp_path, monkeypatch) -> None:
    """Another process's sweep at the worst moment, between the scratch folder's creation and
    its lock: the folder stays (its lock file takes its name only once locked)."""
    import fcntl
    import tempfile

    from kohakuclip.write import ffmpeg_backend

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    sweep = ffmpeg_backend._sweep_abandoned.__wrapped__
    real_flock = fcntl.flock

    def sweep_first(fd: int, operation: int) -> None:
        if operation == fcntl.LOCK_EX:  # the writer's blocking lock: a sweep runs just before
            sweep()
        real_flock(fd, operation)

    monkeypatch.setattr(ffmpeg_backend.fcntl, "flock", sweep_first)
    monkeypatch.setattr(ffmpeg_backend, "_sweep_abandoned", lambda: None)
    with ffmpeg_backend._scratch() as work:
        assert Path(work).is_dir()
        (Path(work) / "out.mp4").write_bytes(b"still here")

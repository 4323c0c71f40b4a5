"""Re-encode one video through an ffmpeg command-line binary (``--backend ffmpeg``).

For encoders or builds PyAV's FFmpeg lacks. The decisions (size, orientation, colour, frame
rate) are the in-process backend's, taken from the first decoded frame with PyAV, and the
filter chain is the same; only the encode runs in the subprocess. The binary is
``$KOHAKUCLIP_FFMPEG`` when set, otherwise the one imageio-ffmpeg ships.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from fractions import Fraction

import av

from kohakuclip.mp4.moov import parse_mp4_bytes
from kohakuclip.write.scheduling import encoder_subprocess_setup
from kohakuclip.write.settings import EncodeSettings
from kohakuclip.write.video import (
    EncodedVideo,
    EncodeError,
    SourceInput,
    SourceProbe,
    open_source,
    probe_frame,
    source_name,
)

__all__ = ["FFMPEG_ENV", "encode_video_ffmpeg"]


FFMPEG_ENV = "KOHAKUCLIP_FFMPEG"
_STOP_POLL_SECONDS = 0.2
_WORK_PREFIX = "kohakuclip-ffmpeg-"  # the writers' scratch folders
_LOCK = ".lock"  # in a scratch folder: its writer holds an exclusive flock on it
_UNLOCKED_AGE = 24 * 3600  # seconds after which a scratch folder without a lock file is stale


def ffmpeg_binary() -> str:
    """The ffmpeg executable: ``$KOHAKUCLIP_FFMPEG``, else imageio-ffmpeg's."""
    configured = os.environ.get(FFMPEG_ENV)
    if configured:
        return configured
    import imageio_ffmpeg

    return str(imageio_ffmpeg.get_ffmpeg_exe())


@functools.cache
def _sweep_abandoned() -> None:
    """Remove the scratch folders (``_WORK_PREFIX``) of writers that died without cleaning up
    (killed outright), once per process: those whose lock file no process holds (a lock is
    seen across PID namespaces and, on file systems that share locks, across nodes). A folder
    without a lock file is left alone unless it is a day old (another writer may be creating
    it right now)."""
    root = tempfile.gettempdir()
    try:
        names = [name for name in os.listdir(root) if name.startswith(_WORK_PREFIX)]
    except OSError:
        return
    for name in names:
        folder = os.path.join(root, name)
        if _abandoned(folder):
            shutil.rmtree(folder, ignore_errors=True)


def _abandoned(folder: str) -> bool:
    try:
        fd = os.open(os.path.join(folder, _LOCK), os.O_RDWR)  # NFS locks want it writable
    except FileNotFoundError:
        try:
            return time.time() - os.stat(folder).st_mtime > _UNLOCKED_AGE
        except OSError:
            return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: its writer is alive
    finally:
        os.close(fd)
    return True


@contextlib.contextmanager
def _scratch() -> Iterator[str]:
    """A scratch folder, locked (``_LOCK``) while the block runs, removed after it. The lock
    file is locked before it takes its name: a sweep never sees it unlocked."""
    _sweep_abandoned()
    with tempfile.TemporaryDirectory(prefix=_WORK_PREFIX, ignore_cleanup_errors=True) as work:
        fresh = os.path.join(work, _LOCK + ".new")
        fd = os.open(fresh, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(fresh, os.path.join(work, _LOCK))
            yield work
        finally:
            os.close(fd)


def _probe(source: SourceInput, settings: EncodeSettings, name: str) -> SourceProbe:
    container = open_source(source, name)
    try:
        if not container.streams.video:
            raise EncodeError(f"{name}: no video stream")
        stream = container.streams.video[0]
        stream.thread_count = 1
        try:
            frame = next(iter(container.decode(stream)), None)
        except av.error.FFmpegError as e:
            raise EncodeError(f"{name}: cannot decode ({e})") from None
        if frame is None:
            raise EncodeError(f"{name}: no decodable video frames")
        return probe_frame(frame, stream, settings.max_short)
    finally:
        container.close()


def _command(
    binary: str, source: str, output: str, probe: SourceProbe, settings: EncodeSettings
) -> list[str]:
    rate: Fraction = probe.rate
    timing = [("settb", f"{rate.denominator}/{rate.numerator}"), ("setpts", "N")]
    chain = [*probe.layout.filters(), *timing]
    vf = ",".join(f"{name}={args}" if args else name for name, args in chain)
    colour = probe.layout.colour
    command = [binary, "-nostdin", "-hide_banner", "-v", "error", "-y", "-threads", "1"]
    # our own filters turn the frames upright: neutralise the display matrix instead of autorotating
    command += ["-display_rotation", "0", "-i", source, "-map", "0:v:0", "-an", "-sn", "-dn"]
    command += ["-vf", vf, "-fps_mode", "passthrough", "-c:v", settings.encoder, "-threads", "1"]
    for key, value in settings.encoder_options().items():
        command += [f"-{key}", value]
    command += ["-colorspace", str(colour.matrix), "-color_primaries", str(colour.primaries)]
    command += ["-color_trc", str(colour.trc), "-color_range", "tv", "-pix_fmt", "yuv420p"]
    command += ["-movflags", "+faststart", "-f", "mp4", output]
    return command


def _run(command: list[str], name: str, stop: threading.Event | None) -> tuple[int, bytes]:
    """Run ffmpeg to the end (its exit status and stderr), or kill it once ``stop`` is set."""
    try:
        child = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=encoder_subprocess_setup(),
        )
    except OSError as e:
        raise EncodeError(f"{name}: cannot run ffmpeg ({e})") from None
    with child:
        while True:
            try:
                poll = None if stop is None else _STOP_POLL_SECONDS
                _, stderr = child.communicate(timeout=poll)
            except subprocess.TimeoutExpired:
                if stop is not None and stop.is_set():
                    child.kill()
                    raise EncodeError(f"{name}: interrupted") from None
            else:
                return child.returncode, stderr


def encode_video_ffmpeg(
    source: SourceInput,
    settings: EncodeSettings | None = None,
    name: str | None = None,
    binary: str | None = None,
    *,
    stop: threading.Event | None = None,
) -> EncodedVideo:
    """``encode_video`` through the ffmpeg command line; in-memory sources go through a
    temporary file (mp4 inputs need a seekable file). Setting ``stop`` kills the ffmpeg run."""
    settings = settings or EncodeSettings()
    name = name or source_name(source)
    probe = _probe(source, settings, name)
    with _scratch() as work:
        if isinstance(source, str | os.PathLike):
            path = os.fspath(source)
        else:
            path = os.path.join(work, "source")
            with open(path, "wb") as f:
                f.write(bytes(source))
        output = os.path.join(work, "out.mp4")
        command = _command(binary or ffmpeg_binary(), path, output, probe, settings)
        returncode, stderr = _run(command, name, stop)
        if returncode != 0:
            lines = stderr.decode("utf-8", "replace").strip().splitlines()
            raise EncodeError(f"{name}: ffmpeg failed ({lines[-1] if lines else returncode})")
        with open(output, "rb") as f:
            data = f.read()
    try:
        frames = parse_mp4_bytes(data, 0, name).n
    except ValueError as e:
        raise EncodeError(f"{name}: ffmpeg wrote an unreadable mp4 ({e})") from None
    return EncodedVideo.of(probe, data, frames)

"""Write a folder of video shards from many sources: ``kohakuclip.write_videos``.

Videos are encoded one per worker thread (the encoders release the GIL) and packed in source
order, ``per_shard`` to a shard, so the result does not depend on the worker count. Beside the
shards: ``encoding.json`` (the settings), ``manifest.parquet`` (a row per video, with its
captions and labels) and ``skipped.jsonl`` (each source that could not be used, and why).

Interruptions are safe: a shard is renamed into place only when complete, and its manifest rows
are saved right after it (in the hidden pending folder, with the run's settings). Running again
into the same folder with ``resume=True`` keeps the finished shards and continues with the videos
they do not hold; without it, the run refuses. ``out`` may be a URL prefix (``s3://...``): the
run is built in a local staging folder and each shard uploaded once finished (``write.upload``),
so a run resumed on another node keeps the shards the bucket holds.

``part="I/N"`` writes only part I of N of the job (see ``write.parts``): its own shards, manifest
and skip log, named after the part, beside the other parts' in the same folder; ``ray=True`` runs
every part as a Ray task (``write.ray_launcher``) and merges them (``write.merge``).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import av
import pyarrow as pa
import pyarrow.parquet as pq

from kohakuclip._cpus import usable_cpus
from kohakuclip._progress import progress_bar
from kohakuclip.formats import ENCODING_FILE, MANIFEST_FILE, VIDEO_MANIFEST_SCHEMA, VideoEntry
from kohakuclip.storage.remote import is_store_failure
from kohakuclip.write._atomic import TEMP_SUFFIX, naming, replacing, write_atomically
from kohakuclip.write.gulp_videos import encode_gulp_video
from kohakuclip.write.pack import Container, PackError, ShardWriter
from kohakuclip.write.parts import ANY_SHARD_RE, OutputNames, Part, earlier_run, left_to_do
from kohakuclip.write.settings import EncodeSettings
from kohakuclip.write.sources import Source, expand_sources
from kohakuclip.write.upload import Output, WriteError, check_staging, output
from kohakuclip.write.video import EncodedVideo, EncodeError, encode_video

__all__ = ["PARTS_DIR", "WriteError", "WriteResult", "check_ray_options", "write_videos"]


Backend = Literal["native", "ffmpeg"]


class Encoder(Protocol):
    """A backend's ``encode_video``."""

    def __call__(
        self,
        source: str | bytes,
        settings: EncodeSettings,
        name: str,
        *,
        stop: threading.Event | None = None,
    ) -> EncodedVideo: ...


PARTS_DIR = OutputNames().pending
"""Per-shard manifest rows of an unfinished run; merged into manifest.parquet at the end."""

_RESUME_KEYS = ("settings", "container", "per_shard", "backend", "gulp_fps", "parts")


@dataclass
class WriteResult:
    """What a ``write_videos`` call produced.

    Attributes:
        out: the output folder (or URL prefix).
        shards: the shard files this call wrote, by name (in ``out``).
        videos: videos this call packed.
        skipped: sources this call skipped (listed in ``skipped.jsonl``).
        seconds: seconds of video this call packed.
        resumed_videos: videos already there from an earlier run (``resume=True``).
    """

    out: str
    shards: list[str] = field(default_factory=list)
    videos: int = 0
    skipped: int = 0
    seconds: float = 0.0
    resumed_videos: int = 0


@dataclass
class _Done:
    """The finished part of an earlier run in the output folder."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)  # origin -> times skipped
    next_shard: int = 0


def _write_table(path: str, rows: list[dict[str, Any]]) -> None:
    """Manifest ``rows`` as the whole of the parquet file ``path`` (written atomically)."""
    table = pa.Table.from_pylist(rows, schema=VIDEO_MANIFEST_SCHEMA)
    with replacing(path) as f, naming(path):
        pq.write_table(table, f)


def _read_rows(path: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


def _run_config(
    settings: EncodeSettings,
    container: str,
    per_shard: int,
    backend: str,
    gulp_fps: float | None,
    parts: int | None,
) -> dict:
    from kohakuclip import __version__

    return {
        "format": "kohakuclip video shards (KCIDX1)",
        "settings": settings.to_json(),
        "container": container,
        "per_shard": per_shard,
        "backend": backend,
        "gulp_fps": gulp_fps,
        "parts": parts,
        "encoder": settings.encoder,
        "encoder_options": settings.encoder_options(),
        "kohakuclip": __version__,
        "libavcodec": ".".join(map(str, av.library_versions["libavcodec"])),
    }


def _prepare(target: Output, config: dict, resume: bool, names: OutputNames) -> _Done:
    """Check the output folder: new, an earlier run to resume with the same settings, or (for a
    part) a folder the other parts of the same job write into."""
    out = target.folder
    if os.path.exists(out) and not os.path.isdir(out):
        raise WriteError(f"{out}: exists and is not a folder")
    os.makedirs(out, exist_ok=True)
    settings_path = os.path.join(out, ENCODING_FILE)
    _restore_settings(out, names)
    listing = os.listdir(out)
    if not os.path.exists(settings_path):
        if any(ANY_SHARD_RE.match(n) or n == MANIFEST_FILE for n in listing):
            raise WriteError(f"{out}: holds shards without {ENCODING_FILE}; choose another folder")
        # the parts of a job race to write it: each under a temporary name of its own
        temp = os.path.join(out, f"{names.prefix}{ENCODING_FILE}{TEMP_SUFFIX}")
        write_atomically(settings_path, json.dumps(config, indent=2).encode(), temp)
        return _Done()
    with open(settings_path, "rb") as f:
        try:
            earlier = json.load(f)
        except ValueError as e:
            raise WriteError(f"{settings_path}: not a valid {ENCODING_FILE} ({e})") from None
    if not isinstance(earlier, dict):
        raise WriteError(f"{settings_path}: not a valid {ENCODING_FILE} (not a JSON object)")
    changed = [k for k in _RESUME_KEYS if earlier.get(k) != config[k]]
    what = "an earlier run" if names.part is None else f"an earlier run of part {names.part}"
    if not resume and earlier_run(listing, names.part) is not None:
        raise WriteError(
            f"{out}: holds {what}; pass resume=True (--resume) to continue it, "
            "or choose another folder"
        )
    if changed:
        verb = "resume" if names.part is None else "write a part"
        raise WriteError(f"{target.name}: cannot {verb} with different {', '.join(changed)}")
    return _load_done(target, names)


def _restore_settings(out: str, names: OutputNames) -> None:
    """The job's ``encoding.json`` and the run's skip log from their copies in the pending
    folder where only those are there: a run resumed from a bucket before it finished (the
    sidecars are uploaded last)."""
    for name, kept in (
        (ENCODING_FILE, names.pending_settings),
        (names.skipped, names.pending_skipped),
    ):
        path, copy = os.path.join(out, name), os.path.join(out, kept)
        if not os.path.exists(path) and os.path.exists(copy):
            with open(copy, "rb") as f:
                write_atomically(path, f.read())


def _keep_copies(out: str, names: OutputNames) -> None:
    """Copy the job's ``encoding.json`` (once: the pending rows' shards were written with it)
    and the run's skip log so far into the pending folder (``_restore_settings``)."""
    kept = os.path.join(out, names.pending_settings)
    if not os.path.exists(kept):
        with open(os.path.join(out, ENCODING_FILE), "rb") as f:
            write_atomically(kept, f.read())
    with open(os.path.join(out, names.skipped), "rb") as f:
        write_atomically(os.path.join(out, names.pending_skipped), f.read())


def _load_done(target: Output, names: OutputNames) -> _Done:
    """Finished shards (those whose manifest rows were saved, kept in the folder or, for a URL
    output, in the bucket), minus leftovers of a crash; only this run's (this part's) files are
    looked at."""
    out = target.folder
    done = _Done()
    shard_re = names.shard_pattern()
    by_shard: dict[str, list[dict[str, Any]]] = {}
    manifest = os.path.join(out, names.manifest)
    if os.path.exists(manifest):
        for row in _read_rows(manifest):
            by_shard.setdefault(row["shard"], []).append(row)
    parts = os.path.join(out, names.pending)
    if os.path.isdir(parts):
        for name in sorted(os.listdir(parts)):
            if name.endswith(".parquet"):
                by_shard[name[: -len(".parquet")]] = _read_rows(os.path.join(parts, name))
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if names.temporary(name):
            os.remove(path)
        elif shard_re.match(name) and name not in by_shard:
            os.remove(path)  # complete, but its manifest rows were never saved: redo it
    numbers = [-1]
    for shard, rows in sorted(by_shard.items()):
        if target.has_shard(shard):
            done.rows.extend(rows)
            match = shard_re.match(shard)
            numbers.append(int(match.group(1)) if match else -1)
    done.next_shard = max(numbers) + 1
    skipped = os.path.join(out, names.skipped)
    if os.path.exists(skipped):
        with open(skipped, encoding="utf-8") as f:
            done.skipped = Counter(json.loads(line)["source"] for line in f if line.strip())
    return done


def _member_name(name: str, used: set[str]) -> str:
    """The source's relative path with an .mp4 suffix, made unique within the run."""
    stem = posixpath.splitext(name.lstrip("/"))[0] or "video"
    candidate, k = f"{stem}.mp4", 1
    while candidate in used:
        candidate, k = f"{stem}_{k}.mp4", k + 1
    used.add(candidate)
    return candidate


def _encoder(backend: Backend) -> Encoder:
    if backend == "native":
        return encode_video
    if backend == "ffmpeg":
        from kohakuclip.write.ffmpeg_backend import encode_video_ffmpeg

        return encode_video_ffmpeg
    raise ValueError(f"backend must be 'native' or 'ffmpeg', got {backend!r}")


def _prepare_one(
    source: Source, settings: EncodeSettings, encoder: Encoder, stop: threading.Event
) -> tuple[EncodedVideo, dict[str, Any]]:
    """Worker: labels first (small, may fail), then open (a video in object storage:
    downloaded into a temporary file, deleted once encoded) and encode (gulp videos: from their
    frames, in process whatever the backend); ``stop`` abandons the encode."""
    labels = source.labels()
    if source.gulp is not None:
        return encode_gulp_video(source.gulp, settings, source.origin, stop=stop), labels
    with contextlib.ExitStack() as opened:
        try:
            data = opened.enter_context(source.opened(stop))
        except OSError as e:
            if is_store_failure(e):
                raise
            raise EncodeError(f"{source.origin}: cannot read ({e.strerror or e})") from None
        return encoder(data, settings, source.origin, stop=stop), labels


def _in_order(
    pool: ThreadPoolExecutor,
    sources: Iterable[Source],
    work: Callable[[Source], tuple[EncodedVideo, dict[str, Any]]],
    window: int,
) -> Iterator[tuple[Source, Future[tuple[EncodedVideo, dict[str, Any]]]]]:
    """Run ``work`` on the pool with at most ``window`` sources in flight, yielding in order."""
    pending: deque[tuple[Source, Future[tuple[EncodedVideo, dict[str, Any]]]]] = deque()
    items = iter(sources)
    for source in items:
        pending.append((source, pool.submit(work, source)))
        if len(pending) >= window:
            break
    while pending:
        source, future = pending.popleft()
        nxt = next(items, None)
        if nxt is not None:
            pending.append((nxt, pool.submit(work, nxt)))
        yield source, future


class _Run:
    """One ``write_videos`` call's state: the open shard, manifest rows, skip log and progress."""

    def __init__(
        self,
        target: Output,
        container: Container,
        per_shard: int,
        done: _Done,
        names: OutputNames,
    ) -> None:
        self.target = target
        self.out = target.folder
        self.names = names
        self.container = container
        self.per_shard = per_shard
        self.next_shard = done.next_shard
        self.used = {row["member"] for row in done.rows}
        self.shard: ShardWriter | None = None
        self.making = ""  # the shard last opened: an interrupt may land before ``shard`` is set
        self.rows: list[dict[str, Any]] = []
        self.result = WriteResult(target.name, resumed_videos=len(done.rows))
        self._skipped = open(os.path.join(self.out, names.skipped), "a", encoding="utf-8")

    def skip(self, origin: str, reason: str) -> None:
        line = json.dumps({"source": origin, "reason": reason}, ensure_ascii=False)
        with naming(self._skipped.name):
            self._skipped.write(line + "\n")
            self._skipped.flush()
        self.result.skipped += 1

    def add(self, source: Source, video: EncodedVideo, labels: dict[str, Any]) -> None:
        if self.shard is None:
            name = self.names.shard(self.next_shard, self.container)
            self.making = os.path.join(self.out, name)
            self.shard = ShardWriter(self.making, self.container)
        member = _member_name(source.name, self.used)
        try:
            entry = self.shard.add(member, video.data)
        except PackError as e:
            self.used.discard(member)
            self.skip(source.origin, str(e))
            return
        self.rows.append(self._row(source, video, entry, labels))
        self.result.videos += 1
        self.result.seconds += video.duration
        if len(self.shard) >= self.per_shard:
            self.finish_shard()

    def _row(
        self, source: Source, video: EncodedVideo, entry: VideoEntry, labels: dict[str, Any]
    ) -> dict[str, Any]:
        assert self.shard is not None
        return {
            "shard": os.path.basename(self.shard.path),
            "index": len(self.shard) - 1,
            "member": entry.member,
            "source": source.origin,
            "frames": entry.n,
            "fps": entry.fps,
            "duration": entry.n / entry.fps if entry.fps else 0.0,
            "width": entry.w,
            "height": entry.h,
            "source_width": video.source_width,
            "source_height": video.source_height,
            "bytes": len(video.data),
            "source_bytes": source.size,
            "codec": entry.codec,
            "colorspace": entry.colorspace,
            "prefix": entry.prefix,
            "full_range": entry.full_range,
            **labels,
        }

    def finish_shard(self) -> None:
        """Rename the complete shard into place, save its manifest rows (and the settings) in
        the pending folder, and hand them to the output (a URL output uploads them)."""
        if self.shard is None:
            return
        self.shard.close()
        name = os.path.basename(self.shard.path)
        os.makedirs(os.path.join(self.out, self.names.pending), exist_ok=True)
        _keep_copies(self.out, self.names)
        _write_table(os.path.join(self.out, self.names.pending_rows(name)), self.rows)
        state = [self.names.pending_settings, self.names.pending_skipped]
        self.target.publish(name, [*state, self.names.pending_rows(name)])
        self.result.shards.append(name)
        self.shard, self.rows = None, []
        self.next_shard += 1

    def abort(self) -> None:
        if self.shard is not None:
            self.shard.abort()
            self.shard = None
        elif self.making:  # interrupted between opening the shard and holding it
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.making + TEMP_SUFFIX)

    def close(self) -> None:
        self._skipped.close()


def _merge_manifest(target: Output, names: OutputNames) -> None:
    """The run's manifest from every finished shard's rows; the pending folder (the per-shard
    rows, the copies of the settings and the skip log) is then removed."""
    out = target.folder
    done = _load_done(target, names)
    _write_table(os.path.join(out, names.manifest), done.rows)
    parts = os.path.join(out, names.pending)
    if os.path.isdir(parts):
        for name in os.listdir(parts):
            os.remove(os.path.join(parts, name))
        os.rmdir(parts)


def check_ray_options(
    ray: bool, part: Part | str | None, ray_parts: int | None, staging: str | None = None
) -> None:
    """Refuse a part with ``ray`` (Ray runs every part itself), ``ray_parts`` without it (or
    below 1) and a staging folder with it (each task stages its part on its own node):
    ValueError naming the keyword and the command-line option."""
    if ray and part is not None:
        raise ValueError("ray (--ray) runs every part itself: pass part or ray, not both")
    if ray_parts is not None and (not ray or ray_parts < 1):
        raise ValueError(
            f"ray_parts (--ray-parts) must be at least 1 and needs ray (--ray), got {ray_parts}"
        )
    if ray and staging is not None:
        raise ValueError(
            "staging (--staging) does not go with ray (--ray): each Ray task builds its part in "
            "a temporary folder on its own node"
        )


def write_videos(
    out: str | os.PathLike[str],
    sources: Iterable[str | os.PathLike[str] | Source | tuple[str, bytes]],
    *,
    codec: str = "av1",
    crf: int | None = None,
    gop: int = 16,
    preset: int | str | None = None,
    max_short: int = 512,
    loop_filters: bool = False,
    per_shard: int = 1000,
    container: Container = "zip",
    workers: int | None = None,
    backend: Backend = "native",
    resume: bool = False,
    progress: bool = True,
    gulp_fps: float | None = None,
    part: Part | str | None = None,
    ray: bool = False,
    ray_parts: int | None = None,
    staging: str | os.PathLike[str] | None = None,
) -> WriteResult:
    """Re-encode ``sources`` into ``out/shard_00000.zip`` ... with ``encoding.json``,
    ``manifest.parquet`` and ``skipped.jsonl`` beside them.

    Args:
        out: the output folder, or a URL prefix (``s3://bucket/prefix/`` ...): built in
            ``staging``, each shard uploaded once finished, the sidecars last (``write.upload``).
        sources: video files, folders, tar archives, gulp directories, ``(name, bytes)`` pairs
            or ``Source`` objects; URLs of video objects, of tars and of prefixes (ending in
            ``/``: every video below it, with its sidecars, as a folder), each video downloaded
            when a worker takes it (see ``write.sources``).
        codec: ``av1`` (SVT-AV1), ``h264`` (libx264) or ``hevc`` (libx265).
        crf: the encoder's CRF (default per codec: AV1 36, H.264 23, HEVC 28).
        gop: frames per closed GOP (a keyframe every ``gop`` frames).
        preset: SVT-AV1's preset number for AV1 (default 6), an x264 / x265 preset name
            otherwise (default ``medium``).
        max_short: cap on the stored short side (0: none), never upscaled.
        loop_filters: keep AV1's deblocking, CDEF and loop restoration on (off by default:
            decoding is faster at the same size).
        per_shard: videos per shard.
        container: ``zip`` (stored) or ``tar``.
        workers: videos encoded at once (default: the usable CPUs; with ``ray``: per task,
            default 1).
        backend: ``native`` (PyAV in process) or ``ffmpeg`` (the command line).
        resume: continue an earlier run (or part) in ``out``, keeping its finished shards (of a
            URL output: those in the bucket, whatever ``staging``).
        progress: show a progress bar of videos.
        gulp_fps: frame rate of gulp videos (default: their meta_data's, else 12); their
            meta_data goes into the manifest like a JSON sidecar.
        part: ``"I/N"`` or a ``Part``: write only the I-th of N contiguous blocks of the sources
            sorted by origin, into files named after the part (see ``write.parts``).
        ray: run the job as Ray tasks, one per part, on the cluster ``RAY_ADDRESS`` names (or a
            local Ray), then ``merge`` them; needs ``kohakuclip[ray]``.
        ray_parts: parts (tasks) for ``ray`` (default: the cluster's CPUs / ``workers``).
        staging: the local folder a URL output is built in (default: a temporary folder,
            removed afterwards; not with ``ray``: each task stages its part on its node).

    Raises:
        WriteError: ``out`` holds an earlier run (without ``resume``, or with other settings).
        ValueError: an invalid setting.
        ObjectStoreError: a URL output that cannot be listed or written, a source URL whose
            store cannot be reached or that names no object.
    """
    out = os.fspath(out)
    stage = os.fspath(staging) if staging is not None else None
    check_staging(out, stage)
    settings = EncodeSettings(codec, crf, gop, preset, max_short, loop_filters)  # type: ignore[arg-type]
    if container not in ("zip", "tar"):
        raise ValueError(f"container must be 'zip' or 'tar', got {container!r}")
    if per_shard < 1:
        raise ValueError(f"per_shard must be at least 1, got {per_shard}")
    if gulp_fps is not None and not gulp_fps > 0:
        raise ValueError(f"gulp_fps must be positive, got {gulp_fps}")
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    check_ray_options(ray, part, ray_parts, stage)
    _encoder(backend)
    if isinstance(sources, str | os.PathLike):
        sources = [sources]
    job = _Job(settings, container, per_shard, workers, backend, gulp_fps)
    if ray:
        from kohakuclip.write.ray_launcher import write_on_ray

        return write_on_ray(out, list(sources), job, resume, progress, ray_parts)
    parsed = Part.parse(part) if part is not None else None
    return job.write(out, sources, parsed, resume, progress, stage)


@dataclass(frozen=True)
class _Job:
    """The settings of one write job, shared by all of its parts (picklable, for Ray)."""

    settings: EncodeSettings
    container: Container
    per_shard: int
    workers: int | None
    backend: Backend
    gulp_fps: float | None

    def config(self, parts: int | None) -> dict:
        return _run_config(
            self.settings, self.container, self.per_shard, self.backend, self.gulp_fps, parts
        )

    def write(
        self,
        out: str,
        sources: Iterable[str | os.PathLike[str] | Source | tuple[str, bytes]],
        part: Part | None,
        resume: bool,
        progress: bool,
        staging: str | None = None,
        on_video: Callable[[], None] | None = None,
    ) -> WriteResult:
        """Write the whole job (``part`` None) or one part of it into ``out``: a folder, or a
        URL prefix built in ``staging`` (None: a temporary folder) and uploaded shard by
        shard."""
        with output(out, staging, OutputNames(part), resume) as target:
            return self.run(target, sources, part, resume, progress, on_video)

    def run(
        self,
        target: Output,
        sources: Iterable[str | os.PathLike[str] | Source | tuple[str, bytes]],
        part: Part | None,
        resume: bool,
        progress: bool,
        on_video: Callable[[], None] | None = None,
    ) -> WriteResult:
        """Write the whole job (``part`` None) or one part of it into ``target``'s folder."""
        names = OutputNames(part)
        settings, encoder = self.settings, _encoder(self.backend)
        expansion = expand_sources(sources, self.gulp_fps)
        found, unreadable = expansion.sources, expansion.unreadable
        if part is not None:
            found = part.select(found, key=lambda s: s.origin)
            unreadable = part.select(unreadable, key=lambda u: u[0])
        done = _prepare(target, self.config(part.count if part else None), resume, names)
        finished = Counter(row["source"] for row in done.rows) + done.skipped
        todo = list(left_to_do(found, finished, lambda s: s.origin))
        workers = self.workers or usable_cpus()
        run = _Run(target, self.container, self.per_shard, done, names)
        for origin, reason in left_to_do(unreadable, finished, lambda u: u[0]):
            run.skip(origin, reason)
        bar = progress_bar(total=len(todo), unit="video", disable=not progress)
        started = time.perf_counter()
        stop = threading.Event()
        try:
            with ThreadPoolExecutor(workers, thread_name_prefix="kohakuclip-encode") as pool:
                work = lambda source: _prepare_one(source, settings, encoder, stop)  # noqa: E731
                try:
                    for source, future in _in_order(pool, todo, work, 2 * workers):
                        try:
                            video, labels = future.result()
                        except (EncodeError, ValueError, OSError, av.error.FFmpegError) as e:
                            if is_store_failure(e):
                                raise  # not the video's fault: a resumed run must retry it
                            run.skip(source.origin, str(e) or type(e).__name__)
                        else:
                            run.add(source, video, labels)
                        if on_video is not None:
                            on_video()
                        bar.update(1)
                        seconds = run.result.seconds
                        rate = seconds / max(time.perf_counter() - started, 1e-9)
                        bar.set_postfix(video=f"{seconds / 60:.1f} min", speed=f"{rate:.2f}x")
                    run.finish_shard()
                except BaseException:
                    stop.set()  # the encodes in flight end at their next frame
                    pool.shutdown(wait=False, cancel_futures=True)
                    run.abort()
                    raise
        finally:
            run.close()
            bar.close()
        target.drain()  # the merge removes the pending files the last uploads send
        _merge_manifest(target, names)
        return run.result

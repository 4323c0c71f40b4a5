"""``Reader``: batches of clips from shards and folders, decoded on a persistent thread pool."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from time import thread_time
from typing import Any, Literal, get_args

import numpy as np

from kohakuclip.decode.image import ImageDecoder
from kohakuclip.decode.pixels import Crop, OutputMode, PixelWriter, square_crop
from kohakuclip.decode.video import ClipDecoder, Planes
from kohakuclip.read.plan import FrameRangeError, Skip, plan_clip
from kohakuclip.read.pool import OwnedPool, Pending, ThreadPool, batch_buffer
from kohakuclip.read.sample import clip
from kohakuclip.read.seeding import generator
from kohakuclip.storage.catalog import Catalog, VideoTrack
from kohakuclip.storage.files import FileCache

CropMode = Literal["random", "center"]
Item = tuple[int, Sequence[int]]


class ClipError(RuntimeError):
    """A clip that could not be read; the message names the source, member and frames."""


@dataclass(frozen=True)
class VideoInfo:
    """What the reader knows about one video."""

    n: int
    fps: float
    height: int
    width: int
    codec: str
    colorspace: str
    source: str
    member: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Batch:
    """Decoded clips and what was done to them."""

    video: np.ndarray  # uint8 [N, T, 3, S, S] (rgb) or [N, T, S*S + 2*ceil(S/2)^2] (yuv_resized)
    items: list[tuple[int, list[int]]]
    crops: np.ndarray  # int32 [N, 4]: x, y, w, h of the window in stored pixels
    flips: np.ndarray  # bool [N, 2]: horizontal, vertical
    colorspaces: list[str]  # per clip: "bt601" | "bt709"
    full_range: np.ndarray  # bool [N]: full-range (JPEG-style) samples instead of limited
    mode: OutputMode = "rgb"


class _Worker:
    """Per-thread state: decoders and pixel buffers."""

    def __init__(self, size: int, mode: OutputMode, window: int) -> None:
        self.decoder = ClipDecoder()
        self.pixels = PixelWriter(size, mode, window)
        self.size, self.mode, self.window = size, mode, window
        self._jpeg: ImageDecoder | None = None
        self.seconds = {"plan": 0.0}

    @property
    def jpeg(self) -> ImageDecoder:
        """JPEG frames (GulpIO sources) go through the image reader's decoder."""
        if self._jpeg is None:
            self._jpeg = ImageDecoder(self.size, self.mode, self.window)
        return self._jpeg


class Reader:
    """Reads batches of clips (display-order frame indices) from zip / tar shards and folders.

    ``sources``: shard archives (with or without an index), folder trees of mp4 files and GulpIO
    directories (their JPEG frames read one by one; ``gulp_fps`` overrides the frame rate their
    meta records, unknown rates read as 0: clips then step one frame at a time).
    Each clip is cropped to the short-side square (random or centred), resized to ``size``,
    optionally flipped, and written into one uint8 batch. Decoding runs on ``threads`` threads.
    ``skip``: ``True`` decodes only what the wanted frames need (for AV1 shards with a dependency
    table, the frames they transitively reference; otherwise unwanted samples cut to the bytes
    later frames use), ``"keep"`` forces the latter, ``False`` decodes every sample from the
    keyframe on. All three give the same pixels.
    ``mode`` picks the output: ``rgb`` [N, T, 3, S, S]; ``yuv_resized`` packed 4:2:0 planes at
    ``size``; ``yuv`` the stored-resolution crop window, packed 4:2:0 in a ``window`` square
    (default: the largest short side the indexes announce, else 512), finished on the GPU by
    ``kohakuclip.torch.yuv_to_rgb``.
    """

    def __init__(
        self,
        sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        size: int = 256,
        mode: OutputMode = "rgb",
        threads: int = 1,
        crop: CropMode = "random",
        hflip: float = 0.0,
        vflip: float = 0.0,
        seed: int | None = None,
        skip: Skip = True,
        use_index: bool = True,
        open_files: int = 4096,
        moov_cache: int = 4096,
        window: int | None = None,
        gulp_fps: float | None = None,
    ) -> None:
        if mode not in get_args(OutputMode):
            raise ValueError(f"mode must be one of {get_args(OutputMode)}, got {mode!r}")
        if crop not in get_args(CropMode):
            raise ValueError(f"crop must be one of {get_args(CropMode)}, got {crop!r}")
        if not isinstance(size, int) or size < 2:
            raise ValueError(f"size must be an int >= 2, got {size!r}")
        for name, p in (("hflip", hflip), ("vflip", vflip)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if skip not in (True, False, "keep"):
            raise ValueError(f"skip must be True, False or 'keep', got {skip!r}")
        paths = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
        self.size, self.mode, self.threads = size, mode, threads
        self.crop, self.hflip, self.vflip, self.skip = crop, hflip, vflip, skip
        self._catalog = Catalog(
            [os.fspath(p) for p in paths],
            use_index,
            moov_cache,
            open_files,
            gulp_fps,
            analyze_av1=skip is not False,
        )
        self.window = window if window is not None else self._catalog.max_short_side(512)
        if self.window % 2:
            raise ValueError(f"window must be even, got {self.window}")
        self._rng = np.random.default_rng(seed)
        self._pid = -1
        # threads, decoders and descriptors end with close() or when the reader is collected
        self._pool = OwnedPool(
            self,
            threads,
            partial(_Worker, size, mode, self.window),
            self._catalog.close,
        )
        self._stats_lock = threading.Lock()
        self._stats = {
            "clips": 0,
            "frames_out": 0,
            "frames_decoded": 0,
            "packets": 0,
            "bytes_read": 0,
        }

    # -- catalog -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._catalog)

    def info(self, vid: int) -> VideoInfo:
        """Frame count, fps, stored size, codec, colorspace, source and member of one video."""
        self._check_vid(vid)
        return VideoInfo(**self._catalog.info(vid), meta=self._catalog.meta(vid))

    def _check_vid(self, vid: int) -> None:
        if not isinstance(vid, (int, np.integer)) or not 0 <= vid < len(self._catalog):
            raise IndexError(f"video id {vid!r} out of range (reader has {len(self)} videos)")

    def sample(
        self,
        n: int,
        frames: int,
        fps: float | None = None,
        spread: bool = False,
        seed: int | None = None,
        videos: Sequence[int] | None = None,
    ) -> list[tuple[int, list[int]]]:
        """``n`` clips of ``frames`` frames from random videos (or from ``videos``, in order).

        Short videos give squeezed clips (see ``kohakuclip.clip``), never an error.
        """
        rng = np.random.default_rng(seed) if seed is not None else self._rng
        if videos is None:
            if len(self) == 0:
                raise ValueError("the reader has no videos")
            chosen = rng.integers(0, len(self), size=n).tolist()
        else:
            chosen = [int(v) for v in videos]
            for v in chosen:
                self._check_vid(v)
        items = []
        for vid in chosen:
            info = self._catalog.info(vid)
            items.append(
                (vid, clip(info["n"], frames, rng, fps=fps, video_fps=info["fps"], spread=spread))
            )
        return items

    # -- reading -----------------------------------------------------------------------------
    def batch_shape(self, n_items: int, frames: int) -> tuple[int, ...]:
        """Shape of the ``video`` array of a batch of ``n_items`` clips of ``frames`` frames."""
        return (n_items, frames, *PixelWriter.frame_shape(self.size, self.mode, self.window))

    def _ensure_process(self) -> tuple[ThreadPool, FileCache]:
        """Threads and descriptors belong to one process: recreate them after a fork."""
        self._catalog.ensure_process()
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._stats_lock = threading.Lock()
        return self._pool.get(), self._catalog.files

    def submit(
        self,
        items: Sequence[Item],
        out: np.ndarray | None = None,
        seed: int | None = None,
    ) -> Pending[Batch]:
        """Queue a batch for decoding; returns at once. ``out`` (optional) receives the pixels."""
        clean: list[tuple[int, list[int]]] = []
        for item in items:
            try:
                vid, frames = item
                frames = [int(f) for f in frames]
            except (TypeError, ValueError):
                raise ValueError(
                    f"items must be (video id, [frame indices]), got {item!r}"
                ) from None
            self._check_vid(vid)
            if not frames:
                raise ValueError(f"clip of video {vid} has no frames")
            clean.append((int(vid), frames))
        if not clean:
            raise ValueError("a batch needs at least one item")
        t = len(clean[0][1])
        if any(len(f) != t for _, f in clean):
            raise ValueError("every clip of a batch must have the same number of frames")
        shape = self.batch_shape(len(clean), t)
        out = batch_buffer(out, shape)
        if seed is None:
            seed = int(self._rng.integers(0, 2**63 - 1))
        batch = Batch(
            video=out,
            items=clean,
            crops=np.zeros((len(clean), 4), np.int32),
            flips=np.zeros((len(clean), 2), bool),
            colorspaces=[""] * len(clean),
            full_range=np.zeros(len(clean), bool),
            mode=self.mode,
        )
        pool, files = self._ensure_process()
        pending: Pending[Batch] = Pending(len(clean), batch)
        tasks = [self._clip_task(batch, i, seed, files) for i in range(len(clean))]
        pool.submit(tasks, pending)
        return pending

    def read(
        self, items: Sequence[Item], out: np.ndarray | None = None, seed: int | None = None
    ) -> Batch:
        """Decode a batch and wait for it."""
        return self.submit(items, out, seed).result()

    def _clip_task(self, batch: Batch, i: int, seed: int, files: FileCache) -> Any:
        catalog = self._catalog

        def run(worker: _Worker) -> None:
            vid, frames = batch.items[i]
            try:
                self._read_clip(worker, batch, i, seed, files)
            except Exception as e:
                worker.decoder.reset(catalog.track_codec(vid))
                raise ClipError(f"{catalog.where(vid)}: frames {frames}: {e}") from e

        return run

    def _read_clip(
        self, worker: _Worker, batch: Batch, i: int, seed: int, files: FileCache
    ) -> None:
        vid, frames = batch.items[i]
        track = self._catalog.track(vid)
        rng = generator(seed, i)
        crop: Crop = square_crop(track.width, track.height, rng if self.crop == "random" else None)
        hflip = bool(rng.random() < self.hflip)
        vflip = bool(rng.random() < self.vflip)
        if self.mode == "yuv" and crop.w > self.window:
            raise ClipError(f"short side {crop.w} exceeds the yuv window {self.window} (window=)")
        batch.crops[i] = (crop.x, crop.y, crop.w, crop.h)
        batch.flips[i] = (hflip, vflip)
        batch.colorspaces[i] = track.colorspace
        batch.full_range[i] = track.full_range
        if track.codec == "jpeg":
            self._read_jpeg_clip(worker, track, batch.video[i], frames, crop, hflip, vflip, files)
            self._count(len(frames), len(set(frames)), len(set(frames)), 0)
            return
        start = thread_time()
        plan = plan_clip(track, frames, self.skip)
        worker.seconds["plan"] += thread_time() - start
        out = batch.video[i]
        written: dict[int, int] = {}
        pixels = worker.pixels
        colorspace, full_range = track.colorspace, track.full_range

        def on_frame(planes: Planes, display: int) -> None:
            if display in written:
                return
            positions = plan.targets[display]
            pixels.write(planes, crop, hflip, vflip, colorspace, full_range, out[positions[0]])
            for t in positions[1:]:
                out[t] = out[positions[0]]
            written[display] = positions[0]

        with files.open(track.path) as fd:
            worker.decoder.decode(track, plan, fd, on_frame)
        missing = [d for d in plan.targets if d not in written]
        if missing:
            raise ClipError(f"decoder produced no frame for display index {missing[0]}")
        self._count(len(frames), plan.decoded, plan.packets, plan.bytes_read)

    def _read_jpeg_clip(
        self,
        worker: _Worker,
        track: VideoTrack,
        out: np.ndarray,
        frames: list[int],
        crop: Crop,
        hflip: bool,
        vflip: bool,
        files: FileCache,
    ) -> None:
        """Every frame is a JPEG: one read and one decode per distinct wanted frame."""
        first: dict[int, int] = {}
        with files.open(track.path) as fd:
            for t, f in enumerate(frames):
                if not 0 <= f < track.n:
                    raise FrameRangeError(f"frame {f} out of range (video has {track.n} frames)")
                if f in first:
                    out[t] = out[first[f]]
                    continue
                data = os.pread(fd, int(track.sizes[f]), int(track.offsets[f]))
                worker.jpeg.write(
                    data, "jpeg", 0, track.width, track.height, crop, hflip, vflip, True, out[t]
                )
                first[f] = t

    def _count(self, frames_out: int, decoded: int, packets: int, bytes_read: int) -> None:
        with self._stats_lock:
            s = self._stats
            s["clips"] += 1
            s["frames_out"] += frames_out
            s["frames_decoded"] += decoded
            s["packets"] += packets
            s["bytes_read"] += bytes_read

    def stats(self) -> dict[str, float]:
        """Counters since creation: clips, frames out and decoded (``decoded_per_output``), packets,
        bytes read, and CPU seconds per stage summed over threads (``seconds_read``, ``_decode``,
        ``_pixels``: resize + convert + flips, ``_plan``)."""
        with self._stats_lock:
            s: dict[str, float] = dict(self._stats)
            for worker in self._pool.states:
                for stage, seconds in (*worker.seconds.items(), *worker.decoder.seconds.items()):
                    s[f"seconds_{stage}"] = s.get(f"seconds_{stage}", 0.0) + seconds
        s["decoded_per_output"] = s["frames_decoded"] / s["frames_out"] if s["frames_out"] else 0.0
        return s

    def close(self) -> None:
        """Join the threads (queued batches finish first) and close the files; the next use
        starts new threads. A reader dropped without ``close()`` is closed when collected."""
        self._pool.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

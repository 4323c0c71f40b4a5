"""``Reader``: batches of clips from shards and folders, decoded on a persistent thread pool."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from functools import partial
from time import thread_time
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from kohakuclip.decode import avcodec_found
from kohakuclip.decode.image import ImageDecoder, dct_denominator, scaled_window
from kohakuclip.decode.pixels import Crop, OutputMode, PixelWriter, Planes, square_crop
from kohakuclip.decode.video import ClipDecoder, takes_dav1d
from kohakuclip.errors import KohakuClipError
from kohakuclip.plan_types import ClipPlan
from kohakuclip.read._reader_base import (
    ReaderBase,
    Sources,
    merged_seconds,
    renamed,
    shown_sources,
    warn_renamed,
)
from kohakuclip.read.plan import FrameRangeError, Skip, check_frames, clip_targets, plan_clip
from kohakuclip.read.pool import OwnedPool, Pending, Task
from kohakuclip.read.profile import add_frames, add_seconds
from kohakuclip.read.sample import clip
from kohakuclip.read.seeding import generator
from kohakuclip.storage.cache import BlockCache
from kohakuclip.storage.files import FileCache
from kohakuclip.storage.remote import ObjectStoreError, fetch_ranges, is_store_failure
from kohakuclip.storage.video_catalog import Catalog
from kohakuclip.storage.video_listing import SourceError
from kohakuclip.tracks import VideoTrack

if TYPE_CHECKING:
    from kohakuclip.decode._clips import ShareTables

__all__ = ["Batch", "ClipError", "Reader", "VideoInfo"]


CropMode = Literal["random", "center"]
Item = tuple[int, Sequence[int]]


class ClipError(KohakuClipError, RuntimeError):
    """A clip that could not be read; the message names the source, member and frames."""


@dataclass(frozen=True)
class VideoInfo:
    """What the reader knows about one video."""

    n: int
    fps: float
    width: int  # stored size
    height: int
    codec: str
    colorspace: str  # "bt601" | "bt709"
    source: str
    member: str
    meta: dict[str, Any] = field(default_factory=dict)

    h = renamed("h", "height")  # KohakuClip 1.0.0's names
    w = renamed("w", "width")
    name = renamed("name", "member")


@dataclass
class Batch:
    """Decoded clips and what was done to them."""

    video: np.ndarray  # uint8 [N, T, 3, S, S] (rgb) or [N, T, S*S + 2*ceil(S/2)^2] (yuv_resized)
    items: list[tuple[int, list[int]]]
    crops: np.ndarray  # int32 [N, 4]: x, y, w, h of the window in stored pixels
    flips: np.ndarray  # bool [N, 2]: horizontal, vertical
    colorspaces: list[str]  # per clip, the YUV matrix: "bt601" | "bt709"
    full_range: np.ndarray  # bool [N]: full-range (JPEG-style) samples instead of limited
    mode: OutputMode = "rgb"
    item_keys: list[int] | None = None  # per clip, the key of its crop and flips (submit)

    colorspace = renamed("colorspace", "colorspaces")  # KohakuClip 1.0.0's name


# rows of a thread's libavcodec decoder table: H.264, HEVC, then MJPEG at lowres 0-3
_AVCODECS: list[tuple[Any, int]] = [("h264", 0), ("hevc", 0), *(("mjpeg", k) for k in range(4))]
_AVCODEC_ROWS = {"h264": 0, "hevc": 1, "jpeg": 2}
_REACH_BACK = 2  # keyframes a clip with frames the decoder dropped is retried from (plan_clip)


_DATA_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
"""Errors of the system about one file, which another try does not change."""


def _about_the_video(error: BaseException) -> bool:
    """Whether ``error`` (and what it came from) is about a video's own bytes or file, not
    storage or the system failing (a timeout, EMFILE, EIO: the next try may succeed)."""
    seen: BaseException | None = error
    for _ in range(8):  # a short chain; no loops
        if seen is None:
            return True
        if is_store_failure(seen) or (
            isinstance(seen, OSError) and not isinstance(seen, _DATA_OS_ERRORS)
        ):
            return False
        seen = seen.__cause__ or seen.__context__
    return True


@dataclass(frozen=True)
class _Bound:
    """A clip bound for a compiled decoder: its batch position, video, decoder and row, crop
    window (in the decoded picture's pixels) and flips."""

    i: int
    vid: int
    track: VideoTrack
    decoder: Any
    row: int
    window: tuple[int, int, int, int]
    flips: tuple[bool, bool]


_ALONE = "alone"
"""``_decode_groups``' outcome for a clip to decode again alone (its group failed)."""


def _decoding_groups(clips: list[_Bound]) -> list[list[_Bound]]:
    """Clips decoded together: those of one video, decoder row and crop window size (and
    parity: the resize weights are shared), in order of first appearance. Each group's frames
    are read and decoded once, whatever GOPs its clips share."""
    groups: dict[tuple[Any, ...], list[_Bound]] = {}
    for bound in clips:
        x, y, w, h = bound.window
        key = (bound.vid, id(bound.decoder), bound.row, w, h, x % 2, y % 2)
        groups.setdefault(key, []).append(bound)
    return list(groups.values())


def _shares_by_video(vids: list[int], threads: int) -> list[list[int]]:
    """Item positions per thread, the items of one video together where the balance allows
    (so their GOPs are decoded once): a video's items in runs of at most ceil(n / threads),
    largest first, each to the thread holding the fewest items, cut where it would make that
    thread hold more than ceil(n / threads) (so no thread holds more than with an even split).
    The balance is in clips, not decoding: a thread holding several clips of one video decodes
    less than one holding as many videos (the shares cannot know what clips share before
    they are planned)."""
    n = len(vids)
    count = min(threads, n)
    most = -(-n // count)
    by_video: dict[int, list[int]] = {}
    for i, vid in enumerate(vids):
        by_video.setdefault(vid, []).append(i)
    runs = [items[k : k + most] for items in by_video.values() for k in range(0, len(items), most)]
    runs.sort(key=len, reverse=True)
    shares: list[list[int]] = [[] for _ in range(count)]
    for run in runs:
        while run:
            share = min(shares, key=len)
            room = most - len(share)
            share.extend(run[:room])
            run = run[room:]
    return [sorted(share) for share in shares if share]


class _Worker:
    """Per-thread state: decoders and pixel buffers."""

    def __init__(self, size: int, mode: OutputMode, yuv_size: int, compiled: bool) -> None:
        self.decoder = ClipDecoder()
        self.pixels = PixelWriter(size, mode, yuv_size)
        self.size, self.mode, self.yuv_size = size, mode, yuv_size
        self._jpeg: ImageDecoder | None = None
        self._dav1d: Any = None
        self._avcodec: Any = None
        self._use_compiled = compiled
        self.seconds = {"plan": 0.0}

    def compiled(self, track: VideoTrack) -> tuple[Any, int] | None:
        """The compiled share decoder that takes this track and its decoder row, or None (the
        PyAV path)."""
        if not self._use_compiled:
            return None
        if takes_dav1d(track):
            if self._dav1d is None:
                from kohakuclip.decode._clips import Dav1dClips

                self._dav1d = Dav1dClips()
            return self._dav1d, 0
        annexb = bool(track.nal_length_size) or track.codec == "jpeg"
        if track.codec in _AVCODEC_ROWS and annexb and avcodec_found():
            if self._avcodec is None:
                from kohakuclip.decode._clips import AvcodecClips

                self._avcodec = AvcodecClips(_AVCODECS)
            return self._avcodec, _AVCODEC_ROWS[track.codec]
        return None

    def stage_seconds(self) -> dict[str, float]:
        """Thread CPU seconds per stage: planning, the PyAV path, the compiled share calls."""
        drivers = (d.stage_seconds() for d in (self._dav1d, self._avcodec) if d is not None)
        return merged_seconds(self.seconds, self.decoder.seconds, *drivers)

    @property
    def jpeg(self) -> ImageDecoder:
        """JPEG frames (GulpIO sources) go through the image reader's decoder."""
        if self._jpeg is None:
            self._jpeg = ImageDecoder(self.size, self.mode, self.yuv_size)
        return self._jpeg


class Reader(ReaderBase[Item, Batch]):
    """Reads batches of clips (display-order frame indices) from zip / tar shards and folders.

    Each clip is cropped to the short-side square (random or centred), resized to ``size``,
    optionally flipped, and written into one uint8 batch. Sources may be URLs (``s3://``,
    ``gs://``, ``az://``, ``http(s)://``, ``file://``; a URL ending in ``/`` lists the zip and
    tar shards, or the mp4 / m4v / mov files, under it): a clip's GOPs are then fetched by
    ranged GETs (concurrent, touching ranges coalesced) before it is decoded; credentials come
    from ``storage_options`` or the standard environment variables (``AWS_ACCESS_KEY_ID`` ...).
    Clips of one batch that read the same video (several views of it, contrastive pairs) are
    decoded together: frames and GOPs they share are read and decoded once.

    Args:
        sources: shard archives (with or without an index), folder trees of mp4 files, single
            mp4 files, GulpIO directories (their JPEG frames read one by one), a dataset view
            folder, or URLs; one or a sequence.
        size: output side in pixels (>= 2).
        mode: ``rgb`` [N, T, 3, S, S]; ``yuv_resized`` packed 4:2:0 planes at ``size``; ``yuv``
            the stored-resolution crop window, packed 4:2:0 in a ``yuv_size`` square, finished
            on the GPU by ``kohakuclip.torch.yuv_to_rgb``.
        threads: decoding threads (default 1; the ``kohakuclip.torch`` datasets share the
            usable CPUs by default).
        crop: ``random`` or ``center`` short-side square.
        hflip: probability of a horizontal flip per clip.
        vflip: probability of a vertical flip per clip.
        seed: seeds ``sample`` and the crops and flips of batches read without a seed (None:
            fresh entropy, another draw each run).
        skip: ``True`` decodes only what the wanted frames need (for AV1 shards with a
            dependency table, the frames they transitively reference; otherwise unwanted samples
            cut to the bytes later frames use), ``"keep"`` forces the latter, ``False`` decodes
            every sample from the keyframe on. All three give the same pixels.
        use_index: read a shard's index member (False: parse every member's moov).
        open_files: at most this many archive files held open.
        moov_cache: at most this many parsed mp4 tracks kept.
        yuv_size: ``yuv`` mode's square (even; default: the largest short side the indexes
            announce, else 512).
        gulp_fps: frame rate of every GulpIO video (default: what its meta records; unknown
            rates read as 0: clips then step one frame at a time).
        storage_options: keywords of the object store (``obstore.store.from_url``: e.g.
            ``endpoint``, ``region``, ``client_options``, ``retry_config``).
        cache_dir: a node-local cache of what is fetched from URLs (256 KiB blocks of each
            object version, shared safely by the processes of a node; ``storage.cache``).
        cache_size: about the most bytes ``cache_dir`` holds (default 64 GiB).
        window: deprecated name of ``yuv_size``.
    """

    _noun = "video"
    _catalog: Catalog
    window = renamed("window", "yuv_size")

    def __init__(
        self,
        sources: Sources,
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
        *,
        yuv_size: int | None = None,
        gulp_fps: float | None = None,
        storage_options: dict[str, Any] | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_size: int = 64 << 30,
        window: int | None = None,
    ) -> None:
        super().__init__(
            size=size,
            mode=mode,
            threads=threads,
            crop=crop,
            crops=CropMode,
            hflip=hflip,
            vflip=vflip,
            seed=seed,
        )
        if skip not in (True, False, "keep"):
            raise ValueError(f"skip must be True, False or 'keep', got {skip!r}")
        if window is not None:
            warn_renamed("Reader(window=)", "yuv_size=")
            yuv_size = window if yuv_size is None else yuv_size
        if yuv_size is not None and (yuv_size % 2 or yuv_size < 2):
            raise ValueError(f"yuv_size must be even and >= 2, got {yuv_size}")
        self.skip = skip
        self._catalog = Catalog(
            self._paths(sources),
            use_index,
            moov_cache,
            open_files,
            gulp_fps,
            skip_tables=skip is not False,
            storage_options=storage_options,
            cache=BlockCache(os.fspath(cache_dir), cache_size) if cache_dir else None,
        )
        if not len(self._catalog):
            self._catalog.close()
            raise SourceError(f"{shown_sources(self._paths(sources))}: no videos found")
        # the default is even: the largest short side rounded up
        self.yuv_size = yuv_size if yuv_size is not None else self._catalog.max_short_side(512)
        # threads, decoders and descriptors end with close() or when the reader is collected
        self._pool = OwnedPool(self, threads, self._catalog.close)
        self._fetcher: ThreadPoolExecutor | None = None  # prefetch threads (remote sources)
        self._unreadable: set[int] = set()  # drawn videos sample() found unreadable

    # -- catalog -----------------------------------------------------------------------------
    def info(self, vid: int) -> VideoInfo:
        """Frame count, fps, stored size, codec, colorspace, source and member of one video.

        Args:
            vid: the video id, in ``[0, len(reader))``.
        """
        self._check_id(vid)
        return VideoInfo(**self._catalog.info(vid), meta=self._catalog.meta(vid))

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

        Short videos give squeezed clips (see ``kohakuclip.clip``), never an error. A drawn
        video that cannot be read (a truncated file in a raw folder) is skipped with a warning
        naming it, once, and another is drawn in its place (the same ones for the same seed);
        one named in ``videos`` raises.

        Args:
            n: number of clips (ignored when ``videos`` is given).
            frames: frames per clip.
            fps: sample at this rate (None: consecutive stored frames).
            spread: spread the clip over the whole video instead.
            seed: draws from this seed (None: the reader's generator).
            videos: the video of each clip, in order (None: drawn uniformly).
        """
        rng = np.random.default_rng(seed) if seed is not None else self._rng
        if videos is not None:
            chosen = [int(v) for v in videos]
            for v in chosen:
                self._check_id(v)
            infos = [self._catalog.info(vid) for vid in chosen]
        else:
            chosen = rng.integers(0, len(self), size=n).tolist()
            infos = []
            for k, vid in enumerate(chosen):
                while (info := self._readable_info(vid)) is None:
                    vid = chosen[k] = int(rng.integers(0, len(self)))
                infos.append(info)
        return [
            (vid, clip(info["n"], frames, rng, fps=fps, video_fps=info["fps"], spread=spread))
            for vid, info in zip(chosen, infos, strict=True)
        ]

    def _readable_info(self, vid: int) -> dict[str, Any] | None:
        """The catalog's facts of a drawn video, or None (warned once) when its bytes cannot be
        read; storage or the system failing (which the next try may not) raises, as does every
        video being unreadable."""
        if vid not in self._unreadable:
            try:
                return self._catalog.info(vid)
            except SourceError as e:
                if not _about_the_video(e):
                    raise
                self._unreadable.add(vid)
                if len(self._unreadable) < len(self):
                    warnings.warn(f"sample() skips a video it cannot read: {e}", stacklevel=3)
        if len(self._unreadable) >= len(self):
            raise SourceError("no video of the sources can be read (sample() warned of each)")
        return None

    # -- reading -----------------------------------------------------------------------------
    def batch_shape(self, n_items: int, frames: int) -> tuple[int, ...]:
        """Shape of the ``video`` array of a batch of ``n_items`` clips of ``frames`` frames.

        Args:
            n_items: clips in the batch.
            frames: frames per clip.
        """
        return (n_items, frames, *PixelWriter.frame_shape(self.size, self.mode, self.yuv_size))

    def _forked(self) -> None:
        self._fetcher = None  # a forked child gets new prefetch threads

    def _make_worker(self) -> Callable[[], _Worker]:
        return partial(_Worker, self.size, self.mode, self.yuv_size, self._compiled)

    def _file_cache(self) -> FileCache:
        return self._catalog.files

    def submit(
        self,
        items: Sequence[Item],
        out: np.ndarray | None = None,
        seed: int | None = None,
        item_keys: Sequence[int] | None = None,
    ) -> Pending[Batch]:
        """Queue a batch for decoding; returns at once.

        Args:
            items: ``(video id, [display-order frame indices])`` per clip, the same count each.
            out: receives the pixels (optional; shape ``batch_shape``, uint8, C-contiguous).
            seed: clip ``i`` takes its crop and flips from ``(seed, i)`` (drawn when None).
            item_keys: one int in ``[0, 2**64)`` per clip: clip ``i`` takes its crop and flips
                from ``item_keys[i]`` alone, whatever its position (``seed`` is then unused).
        """
        clean: list[tuple[int, list[int]]] = []
        for item in items:
            try:
                vid, given = item
                given = list(given)
                frames = [int(f) for f in given]
                if frames != given:  # 1.7 is no frame index (1.0 and numpy ints are)
                    raise ValueError
            except (TypeError, ValueError):
                raise ValueError(
                    f"items must be (video id, [whole frame indices]), got {item!r}"
                ) from None
            self._check_id(vid)
            if not frames:
                raise ValueError(f"clip of video {vid} has no frames")
            clean.append((int(vid), frames))
        if not clean:
            raise ValueError("a batch needs at least one item")
        t = len(clean[0][1])
        if any(len(f) != t for _, f in clean):
            raise ValueError("every clip of a batch must have the same number of frames")
        out = self._buffers.batch(out, self.batch_shape(len(clean), t))
        batch = Batch(video=out, items=clean, **self._records(len(clean), item_keys))
        return self._dispatch(batch, len(clean), seed)

    def _shares(self, batch: Batch, n: int) -> list[list[int]]:
        """Per thread, the items of one video kept together (``_shares_by_video``)."""
        return _shares_by_video([vid for vid, _ in batch.items], self.threads)

    def _tasks(
        self, batch: Batch, shares: list[list[int]], seed: int, files: FileCache
    ) -> list[Task]:
        ahead = [self._prefetch(batch, s) for s in shares]
        return [self._share_task(batch, s, seed, files, a) for s, a in zip(shares, ahead)]

    def _prefetch(self, batch: Batch, share: list[int]) -> Future[dict] | None:
        """For object-storage sources: the share's GOP ranges fetched now, on the prefetch
        threads, while the decode threads work on earlier batches (latency hidden); None for
        local sources."""
        if not self._catalog.has_remote():
            return None
        if self._fetcher is None:
            self._fetcher = ThreadPoolExecutor(2, thread_name_prefix="kohakuclip-prefetch")
        items = [batch.items[i] for i in share]
        return self._fetcher.submit(self._fetch_share, items)

    def _fetch_share(self, items: list[tuple[int, list[int]]]) -> dict:
        """(URL, offset, length) -> bytes of every planned GOP read of remote clips; clips that
        fail to plan are left to the decode thread (which reports them)."""
        wanted = []
        by_video: dict[int, set[int]] = {}
        for vid, frames in items:  # by video: the decode thread's groups split no further here
            # (clips of a video share its crop size; a gulp video's frames are read one by one)
            try:
                check_frames(self._catalog.track(vid), frames)
            except Exception:
                continue
            by_video.setdefault(vid, set()).update(frames)
        for vid, union in by_video.items():
            try:
                track = self._catalog.track(vid)
                remote = self._catalog.remote(track.path)
                if remote is not None:
                    plan = plan_clip(track, sorted(union), self.skip)
                    wanted += [(remote, g.offset, g.offset + g.length) for g in plan.reads]
            except Exception:
                continue
        views = fetch_ranges(wanted)
        return {(o.url, a, b - a): v for (o, a, b), v in zip(wanted, views)}

    def _share_task(
        self,
        batch: Batch,
        share: list[int],
        seed: int,
        files: FileCache,
        ahead: Future[dict] | None = None,
    ) -> Any:
        """One thread's part of a batch: every clip a compiled decoder takes goes through it in
        one call (no GIL inside), the rest one by one through PyAV. The first failing clip's
        error is raised once the others are written."""

        def run(worker: _Worker) -> None:
            seconds = worker.stage_seconds()
            try:
                decode_share(worker)
            finally:
                add_seconds(seconds, worker.stage_seconds())

        def decode_share(worker: _Worker) -> None:
            errors: dict[int, BaseException] = {}
            later: list[int] = []
            fetched = self._prefetched(ahead)  # first: its tracks are then resolved
            with ExitStack() as descriptors:
                bound: dict[int, _Bound] = {}
                for i in share:
                    try:
                        one = self._bind_clip(worker, batch, i, seed)
                        if one is None:
                            later.append(i)
                        else:
                            bound[i] = one
                    except Exception as e:
                        errors[i] = e
                groups = _decoding_groups(list(bound.values()))
                while groups:  # a second round at most: clips of failed groups, each alone
                    undone = self._decode_groups(worker, batch, groups, files, descriptors, fetched)
                    for i, outcome in undone.items():
                        if outcome is None:
                            later.append(i)  # PyAV, from earlier keyframes if need be
                        elif isinstance(outcome, BaseException):
                            errors[i] = outcome
                    groups = [[bound[i]] for i, outcome in undone.items() if outcome == _ALONE]
            read_one = partial(self._read_clip, worker, batch, seed=seed, files=files)
            self._finish_share(batch, later, read_one, errors)

        return run

    def _decode_groups(
        self,
        worker: _Worker,
        batch: Batch,
        groups: list[list[_Bound]],
        files: FileCache,
        descriptors: ExitStack,
        fetched: dict | None,
    ) -> dict[int, BaseException | str | None]:
        """Plan decoding groups into their compiled decoders' tables and run them. Returns the
        clips not done: their error, None for the PyAV path, or ``_ALONE`` for a clip of a group
        that failed (or could not be planned together) before its frames were out."""
        from kohakuclip.decode import _clips  # numba loads with the first batch

        outcome: dict[int, BaseException | str | None] = {}
        tables: dict[int, tuple[Any, ShareTables]] = {}
        work: dict[int, tuple[int, int, int]] = {}  # per group leader: decoded, packets, bytes
        leader: dict[int, int] = {}
        for group in groups:
            try:
                work[group[0].i] = self._add_group(worker, batch, group, files, descriptors, tables)
                leader.update((member.i, group[0].i) for member in group)
            except Exception as e:
                for member in group:
                    outcome[member.i] = e if len(group) == 1 else _ALONE
        video = batch.video.reshape(*batch.video.shape[:2], -1)
        for decoder, share_tables in tables.values():
            try:
                share_tables.fetch(fetched)
            except ObjectStoreError:  # each clip tries alone: local ones read, failures named
                outcome.update((i, None) for i in share_tables.slots)
                continue
            status = decoder.run(share_tables, video)
            for i, (code, detail, at) in zip(share_tables.slots, status.tolist()):
                if code == _clips.OK:
                    # a group's reads and decoding count once, with the first clip done
                    self._count(len(batch.items[i][1]), *work.pop(leader[i], (0, 0, 0)))
                elif code in (_clips.UNSUPPORTED_FORMAT, _clips.MISSING_FRAME):
                    outcome[i] = None
                elif code == _clips.RETRY_ALONE:
                    outcome[i] = _ALONE
                else:
                    outcome[i] = ClipError(_clips.describe(code, detail, at))
        return outcome

    def _item_error(self, batch: Batch, i: int, error: BaseException) -> Exception:
        vid, frames = batch.items[i]
        return ClipError(f"{self._catalog.where(vid)}: frames {frames}: {error}")

    def _bind_clip(self, worker: _Worker, batch: Batch, i: int, seed: int) -> _Bound | None:
        """Clip ``i``'s compiled decoder, crop window and flips (its frames checked against the
        video), or None for a clip the PyAV path takes."""
        vid, frames = batch.items[i]
        track = self._catalog.track(vid)
        compiled = worker.compiled(track)
        if compiled is None:
            return None
        decoder, row = compiled
        crop, hflip, vflip = self._clip_geometry(batch, i, seed, track)
        check_frames(track, frames)
        window = (crop.x, crop.y, crop.w, crop.h)
        if track.codec == "jpeg":  # GulpIO frames: shrunk in the DCT as the image reader does
            d = (
                1
                if self.mode == "yuv"
                else dct_denominator(track.width, track.height, crop, self.size)
            )
            window = scaled_window(track.width, track.height, crop, d)
            row += d.bit_length() - 1
        return _Bound(i, vid, track, decoder, row, window, (hflip, vflip))

    def _add_group(
        self,
        worker: _Worker,
        batch: Batch,
        group: list[_Bound],
        files: FileCache,
        descriptors: ExitStack,
        tables: dict[int, tuple[Any, ShareTables]],
    ) -> tuple[int, int, int]:
        """Plan a decoding group (clips of one video, ``_decoding_groups``) into its compiled
        decoder's tables: one plan of all their frames, read and decoded once, the first clip
        holding it and the others following. Returns what the group decodes, feeds and reads."""
        from kohakuclip.decode._clips import Follower, ShareTables

        lead = group[0]
        track, decoder = lead.track, lead.decoder
        if id(decoder) not in tables:
            tables[id(decoder)] = (decoder, ShareTables(self.mode, self.size, self.yuv_size))
        share = tables[id(decoder)][1]
        frames = [batch.items[member.i][1] for member in group]
        start = thread_time()
        plan = plan_clip(
            track, sorted(set().union(*frames)) if len(group) > 1 else frames[0], self.skip
        )
        worker.seconds["plan"] += thread_time() - start
        if track.codec == "jpeg":
            share.gray = (max(share.gray[0], track.height), max(share.gray[1], track.width))
        remote = self._catalog.remote(track.path)
        share.add(
            lead.i,
            -1 if remote is not None else descriptors.enter_context(files.open(track.path)),
            replace(plan, targets=clip_targets(frames[0])),
            lead.window,
            lead.flips,
            worker.pixels.matrix(track.colorspace, track.full_range),
            track.prefix,
            track.nal_length_size,
            lead.row,
            remote,
            [
                Follower(member.i, clip_targets(member_frames), member.window, member.flips)
                for member, member_frames in zip(group[1:], frames[1:])
            ],
        )
        return plan.decoded, plan.packets, plan.bytes_read

    def _clip_geometry(
        self, batch: Batch, i: int, seed: int, track: VideoTrack
    ) -> tuple[Crop, bool, bool]:
        """Clip ``i``'s crop and flips (from its own seeded draw), recorded in the batch."""
        rng = generator(seed, i) if batch.item_keys is None else generator(batch.item_keys[i])
        crop: Crop = square_crop(track.width, track.height, rng if self.crop == "random" else None)
        hflip = bool(rng.random() < self.hflip)
        vflip = bool(rng.random() < self.vflip)
        if self.mode == "yuv" and crop.w > self.yuv_size:
            raise ClipError(
                f"short side {crop.w} exceeds the {self.yuv_size}-pixel yuv window (yuv_size=)"
            )
        batch.crops[i] = (crop.x, crop.y, crop.w, crop.h)
        batch.flips[i] = (hflip, vflip)
        batch.colorspaces[i] = track.colorspace
        batch.full_range[i] = track.full_range
        return crop, hflip, vflip

    def _read_clip(
        self, worker: _Worker, batch: Batch, i: int, seed: int, files: FileCache
    ) -> None:
        """One clip through PyAV (and GulpIO JPEG frames), frame by frame."""
        track = self._catalog.track(batch.items[i][0])
        try:
            self._decode_clip(worker, batch, i, seed, files, track)
        except Exception:
            worker.decoder.reset(track.codec)
            raise

    def _decode_clip(
        self, worker: _Worker, batch: Batch, i: int, seed: int, files: FileCache, track: VideoTrack
    ) -> None:
        frames = batch.items[i][1]
        crop, hflip, vflip = self._clip_geometry(batch, i, seed, track)
        if track.codec == "jpeg":
            self._read_jpeg_clip(worker, track, batch.video[i], frames, crop, hflip, vflip, files)
            self._count(len(frames), len(set(frames)), len(set(frames)), 0)
            return
        out = batch.video[i]
        pixels = worker.pixels
        colorspace, full_range = track.colorspace, track.full_range
        for reach_back in range(_REACH_BACK + 1):
            start = thread_time()
            plan = plan_clip(track, frames, self.skip, reach_back)
            worker.seconds["plan"] += thread_time() - start
            written: dict[int, int] = {}

            def on_frame(
                planes: Planes,
                display: int,
                plan: ClipPlan = plan,
                written: dict[int, int] = written,
            ) -> None:
                if display in written:
                    return
                positions = plan.targets[display]
                y, u, v, shifts = planes
                first = out[positions[0]]
                pixels.write((y, u, v), crop, hflip, vflip, colorspace, full_range, first, shifts)
                for t in positions[1:]:
                    out[t] = first
                written[display] = positions[0]

            with ExitStack() as stack:
                worker.decoder.decode(
                    track, plan, self._ranges(track, plan, files, stack), on_frame
                )
            missing = [d for d in plan.targets if d not in written]
            if not missing:
                break
        if missing:
            raise ClipError(f"decoder produced no frame for display index {missing[0]}")
        self._count(len(frames), plan.decoded, plan.packets, plan.bytes_read)

    def _ranges(self, track: VideoTrack, plan: ClipPlan, files: FileCache, stack: ExitStack) -> Any:
        """``read(offset, length)`` for the plan's GOPs: a pread of the local file, or the ranges
        fetched at once (concurrently) from object storage."""
        remote = self._catalog.remote(track.path)
        if remote is None:
            fd = stack.enter_context(files.open(track.path))
            return lambda offset, length: os.pread(fd, length, offset)
        reads = [(g.offset, g.length) for g in plan.reads]
        views = fetch_ranges([(remote, offset, offset + length) for offset, length in reads])
        fetched = dict(zip(reads, views))
        return lambda offset, length: fetched[(offset, length)]

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
        with self._catalog.objects.open(track.path) as source:
            for t, f in enumerate(frames):
                if not 0 <= f < track.n:
                    raise FrameRangeError(f"frame {f} out of range (video has {track.n} frames)")
                if f in first:
                    out[t] = out[first[f]]
                    continue
                data = source.read(int(track.offsets[f]), int(track.sizes[f]))
                worker.jpeg.write(
                    data, "jpeg", 0, track.width, track.height, crop, hflip, vflip, True, out[t]
                )
                first[f] = t

    def _count(self, frames_out: int, decoded: int, packets: int, bytes_read: int) -> None:
        add_frames(frames_out, decoded)
        self._add_counts(
            clips=1,
            frames_out=frames_out,
            frames_decoded=decoded,
            packets=packets,
            bytes_read=bytes_read,
        )

    def stats(self) -> dict[str, float]:
        """Counters since creation: clips, frames out and decoded (``decoded_per_output``), packets,
        bytes read, and CPU seconds per stage summed over threads (``seconds_read``, ``_decode``,
        ``_pixels``: resize + convert + flips, ``_plan``)."""
        s = self._counters(("clips", "frames_out", "frames_decoded", "packets", "bytes_read"))
        s["decoded_per_output"] = s["frames_decoded"] / s["frames_out"] if s["frames_out"] else 0.0
        return s

    @staticmethod
    def _prefetched(ahead: Future[dict] | None) -> dict | None:
        """What the prefetch threads fetched for a share (None: nothing, or it failed: the
        share then fetches, and reports, itself)."""
        if ahead is None:
            return None
        try:
            return ahead.result()
        except Exception:
            return None

    def close(self) -> None:
        """Join the threads and prefetch threads (queued batches finish first) and close the
        files; the next use starts new threads. A reader dropped without ``close()`` is closed
        when collected."""
        super().close()
        if self._fetcher is not None and self._pid == os.getpid():
            self._fetcher.shutdown(wait=True, cancel_futures=True)
        self._fetcher = None

"""``verify``: every check on every video of a set of sources, with a progress bar."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from kohakuclip._progress import progress_bar
from kohakuclip.check.frames import FrameDigests, FrameReader, consecutive, strided
from kohakuclip.check.problems import Problem, VerifyReport, capped, without_where
from kohakuclip.check.reference import ReferenceDecode, reference_decode
from kohakuclip.check.structure import PER_CHECK, archive_problems, member_moov, source_kind
from kohakuclip.formats import INDEX_MEMBER
from kohakuclip.read.plan import Skip
from kohakuclip.read.reader import Reader, VideoInfo
from kohakuclip.storage.remote import is_url
from kohakuclip.storage.video_catalog import Catalog
from kohakuclip.storage.zip import Member

__all__ = ["verify"]


FAST_MODES: tuple[Skip, ...] = ("keep", True)
"""The skipping reads checked against the full decode (``skip=False``)."""


def sampled_frames(n: int, sample: int | None, rng: np.random.Generator) -> list[int]:
    """All ``n`` frames, or ``sample`` of them: one at random from each of ``sample`` equal
    stretches of the video (sorted, distinct)."""
    if sample is None or sample >= n:
        return list(range(n))
    edges = np.linspace(0, n, sample + 1)
    starts, ends = np.ceil(edges[:-1]).astype(int), np.ceil(edges[1:]).astype(int)
    picks = [int(rng.integers(s, max(s + 1, e))) for s, e in zip(starts, ends)]
    return sorted(set(picks))


@dataclass(frozen=True)
class _Video:
    vid: int
    info: VideoInfo
    frames: list[int]
    location: tuple[str, int, int] | None  # file, offset, size of the mp4 (None: not one)
    gulp: bool  # JPEG frames: every frame stands alone, nothing to skip


class _Verifier:
    def __init__(
        self,
        sample: int | None,
        threads: int,
        seed: int,
        bar: tqdm | _NoBar,
        on_problem: Callable[[Problem], None] | None,
    ) -> None:
        self.sample, self.threads, self.seed = sample, threads, seed
        self.bar, self.on_problem = bar, on_problem
        self.report = VerifyReport()

    def add(self, problems: Iterable[Problem]) -> None:
        for problem in problems:
            self.report.problems.append(problem)
            if self.on_problem is not None:
                self.on_problem(problem)

    def source(self, path: str) -> None:
        """Structure first, then every readable video's frames; a folder of shards (a writer's
        output, merged or not) shard by shard."""
        if is_url(path) or not os.path.exists(path):
            self.report.sources += 1
            why = "verify reads local files (copy it here first)" if is_url(path) else ""
            self.add([Problem(path, "", None, why or "no such file or directory")])
            return
        kind = source_kind(path)
        if kind == "folder":
            try:
                shards = _shards_of(path)
            except (ValueError, OSError) as e:
                self.report.sources += 1
                self.add([Problem(path, "", None, f"the reader cannot open it: {e}")])
                return
            if shards:
                for shard in shards:
                    self.source(shard)
                return
        self.report.sources += 1
        members: dict[str, Member] = {}
        broken: set[str] = set()
        if kind in ("zip", "tar"):
            check = archive_problems(path, kind)
            self.add(check.problems)
            if check.members is None:
                return
            members, broken = check.members, check.broken
        try:
            catalog = Catalog([path], skip_tables=False)
            names = [ref.member for ref in catalog.videos]
            catalog.close()
            probe = Reader(path) if names else None
        except (ValueError, OSError) as e:
            self.add([Problem(path, "", None, f"the reader cannot open it: {e}")])
            return
        if probe is None:
            self.add([Problem(path, "", None, "no videos found")])
            return
        with probe:
            videos = self._videos(probe, path, kind, names, members, broken)
        self.report.videos += len(names)
        if videos:
            self._frames(path, videos)

    def _videos(
        self,
        probe: Reader,
        path: str,
        kind: str,
        names: list[str],
        members: dict[str, Member],
        broken: set[str],
    ) -> list[_Video]:
        """The videos whose frames can be checked; the moov of each video no index covers is
        checked on the way (an indexed one was, against its index). A member whose moov is
        broken or cut short (``broken``, or found here) is not read: every frame would fail."""
        moov_only = kind != "gulp" and INDEX_MEMBER not in members
        videos = []
        for vid, member in enumerate(names):
            if member in broken:
                continue
            location = _location(path, kind, member, members)
            if moov_only and location is not None:
                moov = member_moov(path, member, *location)
                self.add(moov.problems)
                if moov.problems:
                    continue
            try:
                info = probe.info(vid)
            except (ValueError, OSError) as e:
                message = without_where(str(e), f"{path}:{member}")
                self.add([Problem(path, member, None, f"the reader cannot open it: {message}")])
                continue
            rng = np.random.default_rng([self.seed, vid])
            frames = sampled_frames(info.n, self.sample, rng)
            videos.append(_Video(vid, info, frames, location, kind == "gulp"))
        return videos

    def _frames(self, path: str, videos: list[_Video]) -> None:
        sides = [min(v.info.height, v.info.width) for v in videos]
        window = max(sides) + max(sides) % 2
        self.bar.total += sum(len(v.frames) for v in videos)
        self.bar.refresh()
        readers = {
            mode: FrameReader(path, mode, window, self.threads, batch=self.threads)
            for mode in (False, *FAST_MODES)
        }
        try:
            for video in videos:
                self._video(path, video, readers)
        finally:
            for reader in readers.values():
                reader.close()

    def _video(self, path: str, video: _Video, readers: dict[Skip, FrameReader]) -> None:
        member, frames = video.info.member, video.frames
        modes = () if video.gulp else FAST_MODES
        steps = 1 + len(modes) + (video.location is not None)

        def tick(count: int) -> None:
            self.bar.update(count / steps)

        full = readers[False].read(video.vid, consecutive(frames), tick)
        where = f"{path}:{member}"
        found = [
            Problem(path, member, f, f"reader: {without_where(m, where)}")
            for f, m in sorted(full.errors.items())
        ]
        if video.location is not None:
            window = full.window or (0, 0, video.info.width, video.info.height)
            wanted = None if self.sample is None else set(frames)
            ref = reference_decode(*video.location, window, wanted)
            tick(len(frames))
            found += _against_reference(path, member, video.info.n, frames, full, ref)
        for mode in modes:
            fast = readers[mode].read(video.vid, strided(frames), tick)
            found += _against_full(path, member, mode, frames, full, fast)
        found.sort(key=lambda p: -1 if p.frame is None else p.frame)
        self.add(capped(found, 4 * PER_CHECK))
        self.report.frames += len(frames)


def _against_reference(
    path: str, member: str, n: int, frames: list[int], full: FrameDigests, ref: ReferenceDecode
) -> list[Problem]:
    found = []
    for at, message in sorted(ref.errors.items(), key=lambda e: -1 if e[0] is None else e[0]):
        found.append(Problem(path, member, at, message))
    if ref.shown and ref.shown != n:
        found.append(
            Problem(path, member, None, f"PyAV shows {ref.shown} frames, the reader has {n}")
        )
    for f in frames:
        mine, theirs = full.digests.get(f), ref.digests.get(f)
        if mine is None or f in ref.errors:
            continue
        if theirs is None:
            found.append(Problem(path, member, f, "PyAV decodes no such frame"))
        elif mine != theirs:
            found.append(Problem(path, member, f, "reader's pixels differ from a PyAV decode"))
    return found


def _against_full(
    path: str, member: str, mode: Skip, frames: list[int], full: FrameDigests, fast: FrameDigests
) -> list[Problem]:
    found = []
    what = "keep table" if mode == "keep" else "dependency closure"
    for f in frames:
        if f not in full.digests:
            continue  # the full decode failed already: reported once
        if f in fast.errors:
            found.append(Problem(path, member, f, f"skip={mode!r} ({what}): {fast.errors[f]}"))
        elif fast.digests.get(f) != full.digests[f]:
            found.append(
                Problem(
                    path,
                    member,
                    f,
                    f"skip={mode!r} gives other pixels than a full decode ({what} wrong?)",
                )
            )
    return found


def _shards_of(path: str) -> list[str]:
    """The shards a folder stands for when the reader reads it as a folder of shards (through
    its dataset view, or each shard in it); [] for a folder of mp4 files."""
    catalog = Catalog([path])
    try:
        return [src.path for src in catalog.sources if src.kind in ("zip", "tar")]
    finally:
        catalog.close()


def _location(
    path: str, kind: str, member: str, members: dict[str, Member]
) -> tuple[str, int, int] | None:
    """The file, offset and size of a video's mp4; None for gulp frames."""
    if kind == "gulp":
        return None
    if kind in ("folder", "video"):
        file = os.path.join(path, member) if kind == "folder" else path
        return file, 0, os.path.getsize(file)
    m = members.get(member)
    return None if m is None else (path, m.offset, m.size)


def verify(
    sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    sample: int | None = None,
    threads: int = 1,
    seed: int = 0,
    progress: bool = True,
    on_problem: Callable[[Problem], None] | None = None,
) -> VerifyReport:
    """Check every video of ``sources`` (shards, folders, mp4 files, gulp directories).

    Args:
        sources: paths as the ``Reader`` takes them.
        sample: check this many frames per video (one from each equal stretch), not all.
        threads: decode threads per reader.
        seed: picks the sampled frames.
        progress: show a progress bar on stderr.
        on_problem: called with each problem as it is found.

    Checks: zip members read back with their CRC-32; a shard's index against each member's
    moov (offsets, sizes, keyframes, frame count, codec facts); a member cut short; every
    (sampled) frame read through the ``Reader`` against an independent PyAV decode of the
    member (the stored-resolution centre window, bit for bit); and the same frames read with
    ``skip="keep"`` and ``skip=True`` against the full decode.
    """
    if sample is not None and sample < 1:
        raise ValueError(f"sample must be at least 1 frame per video, got {sample}")
    given = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
    paths = [os.fspath(p) for p in given]
    shape = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total} frames [{elapsed}<{remaining}]"
    with progress_bar(total=0, bar_format=shape) if progress else _NoBar() as bar:
        verifier = _Verifier(sample, max(1, threads), seed, bar, on_problem)
        for path in paths:
            bar.set_description(os.path.basename(path.rstrip("/")) or path)
            verifier.source(path)
    return verifier.report


class _NoBar:
    """Stands in for the progress bar when there is none (a disabled tqdm still starts its
    monitor thread)."""

    total = 0

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, n: float) -> None:
        return None

    def refresh(self) -> None:
        return None

    def set_description(self, text: str) -> None:
        return None

"""Checks that need no decoding: the zip's CRC-32s, each member's moov, and the shard index
against the moov of every member it describes.

The index and the moov are read here on their own (``storage.index``, ``mp4.moov``), not through
the catalog the reader uses, so that a wrong index is seen as one.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kohakuclip.check.problems import Problem, capped, without_where
from kohakuclip.formats import FLAG_KEYFRAME, INDEX_MEMBER, READ_VIDEO_SUFFIXES, VideoEntry
from kohakuclip.gulp.meta import is_gulp_directory
from kohakuclip.mp4.moov import Mp4Track, parse_mp4
from kohakuclip.storage.index import IndexFormatError, VideoIndex
from kohakuclip.storage.tar import list_tar
from kohakuclip.storage.zip import ArchiveError, Member, list_zip

__all__ = ["PER_CHECK", "archive_problems", "member_moov", "source_kind"]


PER_CHECK = 10
"""Problems printed per check of one video before the rest are only counted."""

_UNBOUNDED = 1 << 62
"""The size a truncated member is parsed at again, to learn which samples are missing."""


def source_kind(path: str) -> str:
    """``gulp``, ``folder``, ``video`` (one mp4 file), ``tar`` or ``zip``: how the reader opens
    ``path``."""
    if os.path.isdir(path):
        return "gulp" if is_gulp_directory(path) else "folder"
    if path.lower().endswith(READ_VIDEO_SUFFIXES):
        return "video"
    return "tar" if path.endswith(".tar") else "zip"


def archive_members(path: str, kind: str) -> dict[str, Member]:
    """The file members of a zip or tar shard by name (raises ArchiveError)."""
    listed = list_zip(path) if kind == "zip" else list_tar(path)
    return {m.name: m for m in listed}


def zip_crc(path: str) -> list[Problem]:
    """Every member of a zip read back through ``zipfile``, which checks its stored CRC-32."""
    problems = []
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.is_dir():
                    continue
                try:
                    with archive.open(info) as f:
                        while f.read(1 << 20):
                            pass
                except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
                    name = info.filename
                    problems.append(Problem(path, name, None, f"member does not read back: {e}"))
    except (zipfile.BadZipFile, OSError) as e:
        problems.append(Problem(path, "", None, f"not a readable zip archive: {e}"))
    return problems


@dataclass(frozen=True)
class MemberMoov:
    """A member's parsed moov (None if it does not parse; a cut member's moov as written) and
    what is wrong with it."""

    track: Mp4Track | None
    problems: list[Problem]


def _reader(fd: int, base: int, size: int) -> Callable[[int, int], bytes]:
    """Reads inside the member only; past its end reads zeros (a truncated member's tail)."""

    def read_at(offset: int, length: int) -> bytes:
        inside = max(0, min(length, size - offset))
        data = os.pread(fd, inside, base + offset) if inside else b""
        return data + b"\0" * (length - len(data))

    return read_at


def member_moov(source: str, member: str, path: str, base: int, size: int) -> MemberMoov:
    """Parse the moov of the ``size`` bytes at ``base`` of ``path`` (``member`` of ``source``).

    A member cut short still names its missing frames: its moov is parsed again as if the
    member went on, and the samples past its end are reported.
    """
    where = f"{source}:{member}"
    try:
        with open(path, "rb") as f:
            fd = f.fileno()
            try:
                return MemberMoov(parse_mp4(_reader(fd, base, size), size, base, where), [])
            except ValueError as e:
                first = Problem(source, member, None, f"moov: {without_where(str(e), where)}")
            try:
                track = parse_mp4(_reader(fd, base, size), _UNBOUNDED, base, where)
            except ValueError:
                return MemberMoov(None, [first])
    except OSError as e:
        return MemberMoov(None, [Problem(source, member, None, f"cannot read: {e.strerror}")])
    end = track.offsets.astype(np.int64) - base + track.sizes
    cut = np.flatnonzero(end > size)
    if len(cut) == 0:
        return MemberMoov(None, [first])
    shown = track.display[cut]
    shown = shown[shown >= 0]
    frame = int(shown.min()) if len(shown) else None
    message = (
        f"truncated: the member has {size} bytes, its moov places {len(cut)} of "
        f"{len(end)} samples (from sample {int(cut[0])} in decode order) up to byte "
        f"{int(end.max())}"
    )
    return MemberMoov(track, [Problem(source, member, frame, message)])


@dataclass
class ArchiveCheck:
    """A shard's members (None: it cannot be listed), its problems, and the members whose moov
    is broken or cut short (reading them would fail at every frame)."""

    members: dict[str, Member] | None
    problems: list[Problem]
    broken: set[str]


def index_vs_moov(source: str, members: dict[str, Member]) -> ArchiveCheck:
    """The shard's KCIDX1 index against the moov of every member (no problems when it has no
    index); what is wrong with a member's moov itself is reported too."""
    check = ArchiveCheck(members, [], set())
    index_member = members.get(INDEX_MEMBER)
    if index_member is None:
        return check
    where = f"{source}:{INDEX_MEMBER}"
    with open(source, "rb") as f:
        raw = os.pread(f.fileno(), index_member.size, index_member.offset)
    if len(raw) != index_member.size:
        check.problems.append(Problem(source, INDEX_MEMBER, None, "index member is truncated"))
        return check
    try:
        index = VideoIndex.from_buffer(raw, where)
    except IndexFormatError as e:
        check.problems.append(Problem(source, INDEX_MEMBER, None, without_where(str(e), where)))
        return check
    problems = check.problems
    indexed = {v.member for v in index.videos}
    for name in sorted(members):
        if name not in indexed and name.lower().endswith(READ_VIDEO_SUFFIXES):
            problems.append(Problem(source, name, None, "video member missing from the index"))
    for entry in index.videos:
        member = members.get(entry.member)
        if member is None:
            problems.append(Problem(source, entry.member, None, "indexed member not in archive"))
            continue
        rows = index.frames[entry.row : entry.row + entry.n]
        moov = member_moov(source, entry.member, source, member.offset, member.size)
        problems.extend(moov.problems)
        if moov.problems:
            check.broken.add(entry.member)
        problems.extend(_rows_inside(source, entry.member, rows, member, moov.track))
        if moov.track is not None:
            problems.extend(_entry_vs_track(source, entry, rows, moov.track))
    return check


def _rows_inside(
    source: str, name: str, rows: np.ndarray, member: Member, track: Mp4Track | None
) -> list[Problem]:
    """Index records must lie inside their member, ``keep`` within its sample."""

    def frame(sample: int) -> int | None:
        return None if track is None or sample >= len(track.display) else _display(track, sample)

    start = rows["offset"].astype(np.int64)
    end = start + rows["size"]
    problems = []
    outside = np.flatnonzero((start < member.offset) | (end > member.offset + member.size))
    problems += [
        Problem(
            source,
            name,
            frame(i),
            f"index sample {i}: bytes {start[i]}..{end[i]} lie outside "
            f"the member ({member.offset}..{member.offset + member.size})",
        )
        for i in outside.tolist()
    ]
    bad_keep = np.flatnonzero(rows["keep"] > rows["size"])
    problems += [
        Problem(
            source,
            name,
            frame(i),
            f"index sample {i}: keep {rows['keep'][i]} exceeds its size {rows['size'][i]}",
        )
        for i in bad_keep.tolist()
    ]
    return capped(problems, PER_CHECK)


def _entry_vs_track(
    source: str, entry: VideoEntry, rows: np.ndarray, track: Mp4Track
) -> list[Problem]:
    """The index entry's facts and records against the member's moov."""
    name = entry.member
    problems = []
    facts = (
        ("codec", entry.codec, track.codec),
        ("width", entry.w, track.width),
        ("height", entry.h, track.height),
        ("prefix", entry.prefix, track.prefix.hex()),
    )
    for key, indexed, parsed in facts:
        if indexed != parsed:
            message = f"index {key} {indexed!r}, moov {parsed!r}"
            problems.append(Problem(source, name, None, message))
    if abs(entry.fps - track.fps) > 1e-6 * max(1.0, track.fps):
        problems.append(Problem(source, name, None, f"index fps {entry.fps}, moov {track.fps}"))
    samples = len(track.sizes)
    if entry.n != samples:
        problems.append(
            Problem(source, name, None, f"index has {entry.n} frames, the moov {samples} samples")
        )
    n = min(entry.n, samples)
    key = (rows["flags"][:n] & FLAG_KEYFRAME) != 0
    checks = (
        ("offset", rows["offset"][:n].astype(np.int64), track.offsets[:n].astype(np.int64)),
        ("size", rows["size"][:n].astype(np.int64), track.sizes[:n].astype(np.int64)),
        ("keyframe flag", key, track.keyframes[:n]),
    )
    for field, in_index, in_moov in checks:
        wrong = np.flatnonzero(in_index != in_moov)
        found = [
            Problem(
                source,
                name,
                _display(track, i),
                f"index {field} {_value(in_index[i])} but the moov says {_value(in_moov[i])} "
                f"(sample {i} in decode order)",
            )
            for i in wrong.tolist()
        ]
        problems.extend(capped(found, PER_CHECK))
    return problems


def _display(track: Mp4Track, sample: int) -> int | None:
    shown = int(track.display[sample])
    return shown if shown >= 0 else None


def _value(v: Any) -> str:
    return str(bool(v)).lower() if isinstance(v, (bool, np.bool_)) else str(int(v))


def archive_problems(source: str, kind: str) -> ArchiveCheck:
    """The structural problems of a zip or tar shard: CRC, index vs moov, members cut short."""
    try:
        members = archive_members(source, kind)
    except (ArchiveError, OSError) as e:
        return ArchiveCheck(None, [Problem(source, "", None, without_where(str(e), source))], set())
    crc = zip_crc(source) if kind == "zip" else []
    check = index_vs_moov(source, members)
    check.problems[:0] = crc
    return check

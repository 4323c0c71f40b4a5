"""AV1 reference dependencies: what a decoder must be fed to output the wanted frames.

At write time ``analyze`` parses every frame header of a video and records, per mp4 sample, the
``keep`` byte count of KCIDX1 (the sample truncated after its last frame that a later frame
reads), and per frame its byte range and reference slots (AV1_FRAME_RECORD, in a KCAV1D table
stored with the shard's index). At read time ``closure`` walks back from the wanted frames through
the slots they read to the frames that last wrote them, so a clip decodes only those frames.

AV1 decoder state between frames lives entirely in the eight reference slots: a frame reads the
slots named by ``ref_frame_idx`` (its primary reference frame, motion-field projection and film
grain reference are among them), ``refresh_frame_flags`` says which slots it overwrites, and
``show_existing_frame`` outputs a slot again (and, for a key frame, reloads every slot from it).
A frame decodes exactly as in a full decode when every slot it reads holds the same frame, so
feeding the transitive closure of the wanted frames over "reads the slot last written by" gives
bit-identical output. Frames using ``frame_refs_short_signaling`` derive their references from
the order hints of all eight slots, so they count as reading every slot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kohakuclip.codecs.av1_syntax import (
    ALL_SLOTS,
    NUM_REF_FRAMES,
    OBU_FRAME,
    OBU_FRAME_HEADER,
    OBU_REDUNDANT_FRAME_HEADER,
    OBU_SEQUENCE_HEADER,
    OBU_TILE_GROUP,
    Av1ParseError,
    FrameHeader,
    RefState,
    SequenceHeader,
    iter_obus,
    parse_frame_header,
    parse_sequence_header,
)
from kohakuclip.formats import (
    AV1_DEPS_MAGIC,
    AV1_FRAME_RECORD,
    AV1_READS_ALL,
    AV1_SHOW_EXISTING,
    AV1_SHOW_FRAME,
    AV1_SHOWABLE,
    IndexFormatError,
    decode_index,
    encode_index,
)

__all__ = [
    "Av1Deps",
    "Av1DepsIndex",
    "Av1ParseError",
    "ClipFeed",
    "analyze",
    "closure",
    "feed_packets",
    "find_sequence_header",
    "sample_rows",
]

_SLOTS = tuple(tuple(s for s in range(NUM_REF_FRAMES) if mask >> s & 1) for mask in range(256))
"""The slot numbers set in each 8-bit slot mask."""

SampleSource = Sequence[bytes | memoryview] | Mapping[int, bytes | memoryview]


@dataclass(frozen=True)
class Av1Deps:
    """The dependency analysis of one AV1 video (samples in decode order)."""

    keep: np.ndarray  # uint32 per sample: bytes later frames depend on (0: droppable)
    frames: np.ndarray  # AV1_FRAME_RECORD per frame, in decode order
    sequence_header: bytes  # the first in-band sequence header OBU, else the one given


def find_sequence_header(data: bytes | memoryview) -> bytes | None:
    """The first sequence header OBU in a buffer of OBUs (a sample, av1C configOBUs), or None."""
    for obu in iter_obus(data):
        if obu.type == OBU_SEQUENCE_HEADER:
            return bytes(data[obu.start : obu.end])
    return None


def analyze(
    samples: Iterable[bytes | memoryview],
    sequence_header: bytes | memoryview | None = None,
    where: str = "video",
) -> Av1Deps:
    """Parse every frame header of a video's samples; ``sequence_header``: OBUs holding the
    sequence header (e.g. the av1C configOBUs or the KCIDX1 prefix), for streams that carry
    it only out of band. Raises Av1ParseError naming ``where`` and the sample."""
    seq: SequenceHeader | None = None
    given = inband = b""
    parsed: dict[bytes, SequenceHeader] = {}
    if sequence_header is not None:
        try:
            found = find_sequence_header(sequence_header)
            if found is not None:
                given = found
                seq = _sequence(given, parsed)
        except Av1ParseError as e:
            raise Av1ParseError(f"{where}: sequence header: {e}") from None
    state = RefState()
    rows: list[tuple[int, int, int, int, int, int, int]] = []
    count = 0
    for index, sample in enumerate(samples):
        count += 1
        view = memoryview(sample)
        try:
            frame: tuple[int, int, int, int, int] | None = None  # start, type, flags, slots
            end = 0
            for obu in iter_obus(sample):
                kind = obu.type
                if kind in (OBU_FRAME, OBU_FRAME_HEADER):
                    if frame is not None:
                        rows.append((index, frame[0], end, *frame[1:]))
                    if seq is None:
                        raise Av1ParseError("frame header before any sequence header")
                    hdr = parse_frame_header(
                        view[obu.payload : obu.end], seq, state, obu.temporal_id, obu.spatial_id
                    )
                    state.update(hdr)
                    frame = (obu.start, hdr.frame_type, *_flags_and_reads(hdr))
                    end = obu.end
                elif kind in (OBU_TILE_GROUP, OBU_REDUNDANT_FRAME_HEADER):
                    if frame is None:
                        raise Av1ParseError(f"OBU type {kind} at byte {obu.start} outside a frame")
                    end = obu.end
                elif kind == OBU_SEQUENCE_HEADER:
                    obu_bytes = bytes(view[obu.start : obu.end])
                    seq = _sequence(obu_bytes, parsed)
                    inband = inband or obu_bytes
            if frame is not None:
                rows.append((index, frame[0], end, *frame[1:]))
        except Av1ParseError as e:
            raise Av1ParseError(f"{where}: sample {index}: {e}") from None
    frames = np.array(rows, dtype=AV1_FRAME_RECORD)
    return Av1Deps(_keep(frames, count, where), frames, inband or given)


def _flags_and_reads(hdr: FrameHeader) -> tuple[int, int, int]:
    """AV1_FRAME_RECORD flags, refresh mask and read mask of a parsed frame header."""
    flags = AV1_SHOW_FRAME if hdr.show_frame else 0
    if hdr.showable_frame:
        flags |= AV1_SHOWABLE
    if hdr.show_existing_frame:
        return flags | AV1_SHOW_EXISTING, hdr.refresh_frame_flags, 1 << hdr.frame_to_show_map_idx
    if hdr.short_signaling:
        return flags | AV1_READS_ALL, hdr.refresh_frame_flags, ALL_SLOTS
    reads = 0
    for slot in hdr.ref_frame_idx:
        reads |= 1 << slot
    return flags, hdr.refresh_frame_flags, reads


def _sequence(obu: bytes, parsed: dict[bytes, SequenceHeader]) -> SequenceHeader:
    seq = parsed.get(obu)
    if seq is None:
        first = next(iter_obus(obu))
        seq = parsed[obu] = parse_sequence_header(obu[first.payload : first.end])
    return seq


def _keep(frames: np.ndarray, count: int, where: str) -> np.ndarray:
    """Per sample, the end of its last frame whose slot contents a later frame reads."""
    reads = frames["reads"].tolist()
    refresh = frames["refresh"].tolist()
    writer = [-1] * NUM_REF_FRAMES
    needed = np.zeros(len(frames), dtype=bool)
    for j, mask in enumerate(reads):
        for slot in _SLOTS[mask]:
            w = writer[slot]
            if w < 0:
                raise Av1ParseError(
                    f"{where}: sample {int(frames['sample'][j])}: reads reference slot {slot}, "
                    "which no earlier frame wrote (the stream does not start at a key frame)"
                )
            needed[w] = True
        for slot in _SLOTS[refresh[j]]:
            writer[slot] = j
    keep = np.zeros(count, dtype=np.uint32)
    np.maximum.at(keep, frames["sample"][needed], frames["end"][needed])
    return keep


@dataclass(frozen=True)
class ClipFeed:
    """What to feed a decoder for one clip: byte ranges of samples, and what comes out."""

    ranges: tuple[tuple[int, int, int], ...]  # (sample, start, end), in feed order
    outputs: tuple[int, ...]  # samples whose shown frame the decoder outputs, in order
    decoded: int  # frames decoded (show_existing_frame decodes nothing and is not counted)
    total: int  # frames from the start sample through the last wanted one


def sample_rows(frames: np.ndarray, samples: int) -> np.ndarray:
    """Per sample ``0..samples`` (one past the last too), the row of its first frame record."""
    return np.searchsorted(frames["sample"], np.arange(samples + 1), "left")


def closure(
    frames: np.ndarray, start: int, wanted: Iterable[int], rows: np.ndarray | None = None
) -> ClipFeed:
    """The minimal feed from sample ``start`` (a key frame) that outputs every wanted sample.

    ``frames``: the video's AV1_FRAME_RECORDs (``rows``: their ``sample_rows``, to skip two
    binary searches per call). Each wanted sample's shown frame comes out of the decoder exactly
    once; frames outside the wanted set come out too when a wanted frame needs them and they
    are shown (``outputs`` lists every sample that comes out). Each fed sample starts with its
    OBUs before the first frame (temporal delimiter, sequence header).
    """
    want = sorted(set(wanted))
    if not want:
        return ClipFeed((), (), 0, 0)
    if want[0] < start:
        raise ValueError(f"wanted sample {want[0]} comes before the start sample {start}")
    if rows is not None and want[-1] + 1 < len(rows):
        lo, hi = int(rows[start]), int(rows[want[-1] + 1])
    else:
        column = frames["sample"]
        lo = int(np.searchsorted(column, start, "left"))
        hi = int(np.searchsorted(column, want[-1] + 1, "left"))
    part = frames[lo:hi]
    samples = part["sample"].tolist()
    flags = part["flags"].tolist()
    reads = part["reads"].tolist()
    refresh = part["refresh"].tolist()
    writer = [-1] * NUM_REF_FRAMES
    deps: list[list[int]] = []
    shown: dict[int, int] = {}
    for j, mask in enumerate(reads):
        dep = []
        for slot in _SLOTS[mask]:
            w = writer[slot]
            if w < 0:
                raise ValueError(
                    f"sample {samples[j]} reads reference slot {slot}, which nothing from sample "
                    f"{start} on wrote: a clip must start at a key frame"
                )
            dep.append(w)
        deps.append(dep)
        for slot in _SLOTS[refresh[j]]:
            writer[slot] = j
        if flags[j] & AV1_SHOW_FRAME:
            shown[samples[j]] = j
    chosen = bytearray(len(samples))
    stack = []
    for sample in want:
        j = shown.get(sample, -1)
        if j < 0:
            raise ValueError(f"sample {sample} holds no shown frame")
        if not chosen[j]:
            chosen[j] = 1
            stack.append(j)
    while stack:
        for d in deps[stack.pop()]:
            if not chosen[d]:
                chosen[d] = 1
                stack.append(d)
    return _feed(part, samples, flags, chosen)


def _feed(part: np.ndarray, samples: list[int], flags: list[int], chosen: bytearray) -> ClipFeed:
    """Byte ranges per fed sample (its head, then chosen frames, adjacent ranges merged)."""
    begins = part["start"].tolist()
    ends = part["end"].tolist()
    ranges: list[tuple[int, int, int]] = []
    outputs = []
    decoded = total = 0
    head = -1
    current = -1
    for j, sample in enumerate(samples):
        existing = flags[j] & AV1_SHOW_EXISTING
        total += not existing
        if sample != current:
            current, head = sample, begins[j]
        if not chosen[j]:
            continue
        decoded += not existing
        if flags[j] & AV1_SHOW_FRAME:
            outputs.append(sample)
        begin, end = begins[j], ends[j]
        if head >= 0:  # first chosen frame of this sample: its head comes first
            if head > 0:
                ranges.append((sample, 0, head))
            head = -1
        if ranges and ranges[-1][0] == sample and ranges[-1][2] == begin:
            ranges[-1] = (sample, ranges[-1][1], end)
        else:
            ranges.append((sample, begin, end))
    return ClipFeed(tuple(ranges), tuple(outputs), decoded, total)


def feed_packets(feed: ClipFeed, data: SampleSource) -> list[tuple[int, bytes | memoryview]]:
    """One decoder packet per fed sample: ``(sample, bytes)``; ``data[sample]`` holds a
    sample's bytes (a list, or a mapping of the samples the feed uses)."""
    packets: list[tuple[int, bytes | memoryview]] = []
    pieces: list[memoryview] = []
    current = -1
    for sample, begin, end in feed.ranges:
        if sample != current:
            if pieces:
                packets.append((current, _join(pieces)))
            current, pieces = sample, []
        pieces.append(memoryview(data[sample])[begin:end])
    if pieces:
        packets.append((current, _join(pieces)))
    return packets


def _join(pieces: list[memoryview]) -> bytes | memoryview:
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


@dataclass(frozen=True)
class Av1DepsIndex:
    """A KCAV1D table (AV1_DEPS_MAGIC framing): per video (by member name) its frame records."""

    videos: dict[str, tuple[int, int, int]]  # member -> (row, n frames, n samples)
    frames: np.ndarray  # AV1_FRAME_RECORD, all videos

    def video_frames(self, member: str) -> np.ndarray | None:
        """The video's AV1_FRAME_RECORDs (a view), or None when the member has none."""
        entry = self.videos.get(member)
        if entry is None:
            return None
        row, n, _ = entry
        return self.frames[row : row + n]

    def to_bytes(self) -> bytes:
        header = {
            "videos": [
                {"member": m, "row": row, "n": n, "samples": samples}
                for m, (row, n, samples) in self.videos.items()
            ]
        }
        return encode_index(AV1_DEPS_MAGIC, header, self.frames)

    @classmethod
    def build(cls, videos: Sequence[tuple[str, Av1Deps]]) -> Av1DepsIndex:
        """Concatenate the analyses of a shard's AV1 videos (member name, analysis)."""
        entries: dict[str, tuple[int, int, int]] = {}
        row = 0
        for member, deps in videos:
            entries[member] = (row, len(deps.frames), len(deps.keep))
            row += len(deps.frames)
        parts = [deps.frames for _, deps in videos]
        frames = np.concatenate(parts) if parts else np.zeros(0, dtype=AV1_FRAME_RECORD)
        return cls(entries, frames)

    @classmethod
    def from_buffer(
        cls, buf: bytes | memoryview | np.ndarray, where: str = "av1 deps"
    ) -> Av1DepsIndex:
        header, frames = decode_index(buf, AV1_DEPS_MAGIC, AV1_FRAME_RECORD, where)
        entries: dict[str, tuple[int, int, int]] = {}
        try:
            for v in header["videos"]:
                row, n, samples = int(v["row"]), int(v["n"]), int(v["samples"])
                if row < 0 or n < 0 or row + n > len(frames):
                    raise IndexFormatError(f"{where}: video {v['member']!r} rows exceed the table")
                entries[str(v["member"])] = (row, n, samples)
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, IndexFormatError):
                raise
            raise IndexFormatError(f"{where}: bad video entry ({e!r})") from None
        return cls(entries, frames)

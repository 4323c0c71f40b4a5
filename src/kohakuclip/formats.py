"""Every on-disk layout kohakuclip reads or writes, declared once.

Video shards (KCIDX1) and image shards (KCIMG1) share one framing: an 8-byte magic, a u64
little-endian JSON length, the JSON header, zero padding to a multiple of 8, then fixed-size
little-endian records (one per frame, or one per image). The layouts are byte-compatible with
KohakuClip 1.x. ``encode_index`` writes that framing and ``read_index_header`` is the one reader
of it; the JSON header carries ``version`` (INDEX_VERSION).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast

import numpy as np
import pyarrow as pa

from kohakuclip.errors import KohakuClipError

__all__ = [
    "AV1_DEPS_KEY",
    "AV1_DEPS_MAGIC",
    "AV1_FRAME_RECORD",
    "AV1_READS_ALL",
    "AV1_SHOWABLE",
    "AV1_SHOW_EXISTING",
    "AV1_SHOW_FRAME",
    "COLOR_BT709",
    "COLOR_FULL_RANGE",
    "COLOR_GRAY",
    "COLOR_RGB",
    "DATASET_FILE",
    "DATASET_FORMAT",
    "ENCODING_FILE",
    "FLAG_KEYFRAME",
    "FRAME_RECORD",
    "GULP_ALIGNMENT",
    "GULP_DATA_PATTERN",
    "GULP_META_PATTERN",
    "IMAGE_CODECS",
    "IMAGE_INDEX_MAGIC",
    "IMAGE_MANIFEST_SCHEMA",
    "IMAGE_RECORD",
    "IMAGE_SUFFIXES",
    "INDEX_MEMBER",
    "INDEX_VERSION",
    "MANIFEST_FILE",
    "MAX_INFLATED_MEMBER",
    "PART_PREFIX",
    "READ_VIDEO_SUFFIXES",
    "SHARD_SUFFIXES",
    "SKIPPED_FILE",
    "VIDEO_INDEX_MAGIC",
    "VIDEO_MANIFEST_SCHEMA",
    "VIDEO_SUFFIXES",
    "Colorspace",
    "IndexFormatError",
    "VideoCodec",
    "VideoEntry",
    "decode_index",
    "encode_index",
    "manifest_columns",
    "manifest_table",
    "read_index_header",
]


INDEX_MEMBER = "__index__.bin"
"""Name of the index member inside a shard (zip or tar)."""

MANIFEST_FILE = "manifest.parquet"
"""Beside the shards: one row per video (VIDEO_MANIFEST_SCHEMA) or image (IMAGE_MANIFEST_SCHEMA)."""

ENCODING_FILE = "encoding.json"
"""Beside the shards: the writer's settings (``part-...encoding.json`` for a part of a run), so a
rerun in the same folder resumes, and refuses other settings."""

_MANIFEST_SHARED = [
    ("shard", pa.string()),  # shard file name, beside the manifest
    ("index", pa.int64()),  # position of the video (image) in its shard's index
    ("member", pa.string()),  # member name inside the shard
    ("source", pa.string()),  # the file it was written from ("archive:member" inside one)
    ("width", pa.int32()),  # stored size
    ("height", pa.int32()),
    ("source_width", pa.int32()),
    ("source_height", pa.int32()),
    ("bytes", pa.int64()),  # stored member size
    ("source_bytes", pa.int64()),
    ("caption", pa.string()),
    ("meta", pa.string()),  # the JSON sidecar, as JSON text
]

VIDEO_MANIFEST_SCHEMA = pa.schema(
    [
        *_MANIFEST_SHARED,
        ("frames", pa.int64()),
        ("fps", pa.float64()),
        ("duration", pa.float64()),
        ("codec", pa.string()),
        ("colorspace", pa.string()),
        ("label", pa.string()),
        ("prefix", pa.string()),  # hex decoder prefix, as in the index (for the dataset view)
        ("full_range", pa.bool_()),  # as in the index; merged manifests before 2026-12-03 lack it
    ]
)
"""The video manifest: the shared columns, then the per-video stream facts."""

IMAGE_MANIFEST_SCHEMA = pa.schema(
    [*_MANIFEST_SHARED, ("key", pa.string()), ("native_res", pa.bool_())]
)
"""The image manifest: the shared columns, then ``key`` (the member name without its suffix) and
``native_res`` (stored at the upright source's size, not resized; manifests written before
2026-12-02 lack the column)."""

MANIFEST_RENAMED = {"json": "meta", "stored_size": "bytes", "source_size": "source_bytes"}
"""Columns of image manifests written before the schemas were one family, and their names now
(those manifests also stored ``index`` as int32 in video manifests; ``manifest_table`` casts)."""


def manifest_table(table: pa.Table) -> pa.Table:
    """A manifest table (video or image, of any kohakuclip version) in today's column names and
    types: older column names renamed (MANIFEST_RENAMED) and ``index`` as int64.

    Args:
        table: a manifest as read from its parquet file (all columns or some).
    """
    names = [MANIFEST_RENAMED.get(name, name) for name in table.column_names]
    if names != table.column_names:
        table = table.rename_columns(names)
    if "index" in names and table.schema.field("index").type != pa.int64():
        table = table.set_column(
            names.index("index"), "index", table.column("index").cast(pa.int64())
        )
    return table


def manifest_columns(available: list[str], wanted: list[str]) -> list[str]:
    """The columns of a manifest file to read for ``wanted`` (today's names), in its own names.

    Args:
        available: the file's column names.
        wanted: the columns asked for, in today's names; those the file lacks are left out.
    """
    older = {new: old for old, new in MANIFEST_RENAMED.items()}
    out = []
    for name in wanted:
        if name in available:
            out.append(name)
        elif older.get(name) in available:
            out.append(older[name])
    return out


VIDEO_INDEX_MAGIC = b"KCIDX1\0\0"
IMAGE_INDEX_MAGIC = b"KCIMG1\0\0"

INDEX_VERSION = 1
"""The ``version`` key of every framed header we write (KCIDX1, KCIMG1, KCAV1D). A header without
one is version 1 (KohakuClip 1.x wrote none; it ignores the key); a newer one is refused."""

INDEX_HEAD_SIZE = 16
"""The framing before the JSON header: the 8-byte magic and the u64 little-endian JSON length."""

_OTHER_SHARDS = {
    VIDEO_INDEX_MAGIC: "a video shard's: read it with Reader",
    IMAGE_INDEX_MAGIC: "an image shard's: read it with ImageReader",
}
"""Why a framed index with another reader's magic was refused."""

_FIRST_READ = 1 << 12
"""Bytes ``read_index_header`` asks for first: the whole header of most members in one read."""


class IndexFormatError(KohakuClipError, ValueError):
    """A framed index (KCIDX1, KCIMG1, KCAV1D) that does not parse: wrong magic, truncated,
    inconsistent, or written by a newer kohakuclip."""


@dataclass(frozen=True)
class IndexHeader:
    """The parsed head of a framed index.

    Args:
        header: the JSON header (its ``version`` key included when it had one).
        version: the format version (1 when the header has no ``version`` key).
        records: byte offset of the first record from the start of the framed bytes.
    """

    header: dict[str, Any]
    version: int
    records: int


def encode_index(magic: bytes, header: dict[str, Any], records: np.ndarray) -> bytes:
    """Serialize ``magic | u64 len | JSON | pad to 8 | records``, the header versioned.

    Args:
        magic: the 8-byte magic of the layout (``VIDEO_INDEX_MAGIC``, ...).
        header: the JSON header; ``version`` is set to INDEX_VERSION (first key).
        records: the fixed-size records written after the header.
    """
    versioned = {"version": INDEX_VERSION} | {k: v for k, v in header.items() if k != "version"}
    body = json.dumps(versioned, separators=(",", ":"), ensure_ascii=False).encode()
    head = magic + len(body).to_bytes(8, "little") + body
    head += b"\0" * (-len(head) % 8)
    return head + np.ascontiguousarray(records).tobytes()


def read_index_header(
    read: Callable[[int, int], bytes],
    magic: bytes,
    size: int | None = None,
    where: str = "index",
) -> IndexHeader:
    """Read and check the framing and JSON header of a framed index: the one parser of it.

    Args:
        read: ``read(offset, size)`` returns bytes from the start of the framed bytes (a slice
            of a buffer, or a pread / ranged GET of a shard); short at the end of the data.
        magic: the expected 8-byte magic.
        size: the framed bytes' total size when known (a truncated header is reported then).
        where: what to name in error messages (``shard.zip:__index__.bin``).

    Raises:
        IndexFormatError: bad magic, truncated or non-JSON header, or a ``version`` that is not
            a positive integer or newer than INDEX_VERSION.
    """
    kind = magic.rstrip(b"\0").decode()
    first = bytes(read(0, _FIRST_READ if size is None else min(size, _FIRST_READ)))
    if len(first) < INDEX_HEAD_SIZE or first[:8] != magic:
        other = _OTHER_SHARDS.get(first[:8]) if first[:8] != magic else None
        hint = other or "bad magic or truncated"
        raise IndexFormatError(f"{where}: not a {kind} index ({hint})")
    length = int.from_bytes(first[8:16], "little")
    end = INDEX_HEAD_SIZE + length
    if size is not None and end > size:
        raise IndexFormatError(f"{where}: truncated index header ({length} bytes announced)")
    body = first[INDEX_HEAD_SIZE:end]
    if len(body) < length:
        body += bytes(read(len(first), end - len(first)))
    if len(body) < length:
        raise IndexFormatError(f"{where}: truncated index header ({length} bytes announced)")
    try:
        header = json.loads(body)
    except ValueError as e:
        raise IndexFormatError(f"{where}: index header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise IndexFormatError(f"{where}: index header is not a JSON object")
    version = header.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise IndexFormatError(f"{where}: bad {kind} version {version!r}")
    if version > INDEX_VERSION:
        raise IndexFormatError(
            f"{where}: {kind} version {version} is newer than this kohakuclip reads "
            f"(up to {INDEX_VERSION}): upgrade kohakuclip"
        )
    return IndexHeader(header, version, (end + 7) // 8 * 8)


def decode_index(
    buf: bytes | memoryview | np.ndarray,
    magic: bytes,
    dtype: np.dtype,
    where: str = "index",
    trailer_key: str | None = None,
) -> tuple[dict[str, Any], np.ndarray]:
    """Parse a whole framed index from bytes or a uint8 memmap; records are a view, not a copy.

    Args:
        buf: the framed bytes.
        magic: the expected 8-byte magic.
        dtype: the record dtype.
        where: what to name in error messages.
        trailer_key: a header key giving the size of a blob after the records (not records).
    """
    raw = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
    head = read_index_header(lambda at, n: bytes(raw[at : at + n]), magic, len(raw), where)
    header = head.header
    end = len(raw)
    if trailer_key is not None and trailer_key in header:
        trailer = header[trailer_key]
        if not isinstance(trailer, int) or not 0 <= trailer <= end - head.records:
            raise IndexFormatError(f"{where}: bad {trailer_key!r} size {trailer!r}")
        end -= trailer
    body = raw[min(head.records, end) : end]
    if len(body) % dtype.itemsize:
        raise IndexFormatError(
            f"{where}: index records are not a multiple of {dtype.itemsize} bytes"
        )
    return header, body.view(dtype)


FRAME_RECORD = np.dtype(
    [
        ("offset", "<u8"),  # absolute byte offset of the sample in the archive file
        ("size", "<u4"),  # sample size in bytes
        ("keep", "<u4"),  # bytes of this sample later frames depend on (0: droppable)
        ("flags", "u1"),  # bit 0: keyframe
        ("_pad", "V7"),
    ]
)
"""One video frame (mp4 sample) in decode order: 24 bytes."""
assert FRAME_RECORD.itemsize == 24

FLAG_KEYFRAME = 1

IMAGE_RECORD = np.dtype(
    [
        ("offset", "<u8"),  # absolute byte offset of the image member's data in the archive
        ("size", "<u4"),
        ("width", "<u4"),
        ("height", "<u4"),
        ("codec", "u1"),  # one of IMAGE_CODECS
        ("color", "u1"),  # COLOR_* bit flags
        ("_pad", "V2"),
    ]
)
"""One stored image: 24 bytes."""
assert IMAGE_RECORD.itemsize == 24

IMAGE_CODECS: tuple[str, ...] = ("jpeg", "av1", "jxl", "webp", "png")
"""Image codec ids: the position in this tuple is the byte stored in IMAGE_RECORD.codec."""

MAX_INFLATED_MEMBER = 1 << 28
"""Bytes a deflated zip member may inflate to; the readers refuse a larger one (a zip bomb)."""

COLOR_BT709 = 1
COLOR_FULL_RANGE = 2
COLOR_RGB = 4
COLOR_GRAY = 8

VideoCodec = Literal["av1", "h264", "hevc"]
Colorspace = Literal["bt601", "bt709"]


@dataclass(frozen=True, slots=True)
class VideoEntry:
    """Per-video header entry of a KCIDX1 index (one JSON object in ``videos``).

    Parsed from an index header; a reader keeps the listed videos' entries in columns
    (``storage.video_refs.VideoRefs``) and builds one when a video is opened.
    """

    member: str  # member name inside the archive
    row: int  # first FRAME_RECORD of this video
    n: int  # number of frames
    fps: float
    h: int
    w: int
    codec: VideoCodec
    prefix: str  # hex: the AV1 sequence header OBU, or Annex-B SPS/PPS(/VPS)
    colorspace: Colorspace
    full_range: bool = False  # stored only when True: limited-range entries read as before

    def to_json(self) -> dict[str, Any]:
        obj = asdict(self)
        if not self.full_range:
            del obj["full_range"]
        return obj

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> VideoEntry:
        return cls(
            member=str(obj["member"]),
            row=int(obj["row"]),
            n=int(obj["n"]),
            fps=float(obj["fps"]),
            h=int(obj["h"]),
            w=int(obj["w"]),
            codec=cast(VideoCodec, sys.intern(obj["codec"])),
            prefix=sys.intern(str(obj.get("prefix", ""))),
            colorspace=cast(Colorspace, sys.intern(obj.get("colorspace", "bt601"))),
            full_range=bool(obj.get("full_range", False)),
        )


GULP_DATA_PATTERN = "data_{}.gulp"
GULP_META_PATTERN = "meta_{}.gmeta"
GULP_ALIGNMENT = 4
"""GulpIO: JPEG frames right-padded with zero bytes to a multiple of 4 in data_<i>.gulp;
meta_<i>.gmeta is JSON ``{id: {"frame_info": [[offset, pad, length_with_pad], ...],
"meta_data": [{...}]}}``."""

AV1_DEPS_MAGIC = b"KCAV1D\0\0"
"""Same framing as KCIDX1; JSON ``{"videos": [{"member", "row", "n", "samples"}]}`` where ``row``
and ``n`` select the video's AV1_FRAME_RECORDs and ``samples`` is its number of mp4 samples."""

AV1_FRAME_RECORD = np.dtype(
    [
        ("sample", "<u4"),  # sample index within the video (decode order)
        ("start", "<u4"),  # byte range of the frame's OBUs (header + tile groups) in the sample
        ("end", "<u4"),
        ("frame_type", "u1"),  # 0 key, 1 inter, 2 intra-only, 3 switch
        ("flags", "u1"),  # AV1_SHOW_FRAME | AV1_SHOW_EXISTING | AV1_SHOWABLE | AV1_READS_ALL
        ("refresh", "u1"),  # refresh_frame_flags: the reference slots this frame writes
        ("reads", "u1"),  # the reference slots decoding it reads (show_existing: the shown slot)
    ]
)
"""One AV1 frame (a frame header OBU and its tile groups) in decode order: 16 bytes."""
assert AV1_FRAME_RECORD.itemsize == 16

AV1_SHOW_FRAME = 1  # the frame is output (show_frame, or show_existing_frame)
AV1_SHOW_EXISTING = 2  # show_existing_frame: outputs the frame in slot ``reads`` again
AV1_SHOWABLE = 4
AV1_READS_ALL = 8  # reads widened to every slot: the decoder derives refs from all slots' state

AV1_DEPS_KEY = "av1deps"
"""KCIDX1 header key: the byte size of a KCAV1D table (AV1_DEPS_MAGIC framing) stored right
after the frame records, at the end of the index member. The table cannot be a member of its
own: KohakuClip 1.0.0 counts every member but the index as a video, while it ignores both an
unknown header key and bytes after the records."""

IMAGE_SUFFIXES = (
    ".jpg", ".jpeg", ".jfif", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff",
    ".avif", ".jxl", ".heic", ".heif", ".ppm", ".pgm", ".pnm", ".tga", ".qoi",
)  # fmt: skip
"""File names (lower case) read as images in folders, plain zips and tars."""

VIDEO_SUFFIXES = (
    ".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".mpg", ".mpeg", ".ts", ".m2ts", ".mts",
    ".flv", ".wmv", ".3gp", ".ogv",
)  # fmt: skip
"""File names (lower case) of videos: the writer takes them all from folders and tar archives;
the reader opens ``READ_VIDEO_SUFFIXES`` and names the others it finds in a source."""

READ_VIDEO_SUFFIXES = (".mp4", ".m4v", ".mov")
"""The videos the reader opens as they are (the MP4 family, from its moov): in folders, tars and
zips without an index, and by name. The other ``VIDEO_SUFFIXES`` are written into shards first."""

SHARD_SUFFIXES = (".zip", ".tar")
"""Archive sources; a folder holding these and no videos (images) is read as its shards."""

SKIPPED_FILE = "skipped.jsonl"
"""Beside the shards: one JSON line per source left out, ``{"source", "reason", ...}``."""

PART_PREFIX = "part-{:05d}-of-{:05d}"
"""Prefix (then ``.``) of every file part I of N writes: ``part-00003-of-00010.shard_00000.zip``,
``part-00003-of-00010.manifest.parquet``, ``part-00003-of-00010.skipped.jsonl``."""

DATASET_FILE = "dataset.json"
"""The dataset view ``kohakuclip merge`` writes over every shard of a folder. JSON::

    {"format": DATASET_FORMAT, "version": 1, "kind": "video" | "image",
     "count": total videos (images), "bytes": total shard bytes, "manifest": "manifest.parquet",
     "shards": [{"name", "count", "bytes", "index": [offset, size],
                 "records": offset (video only), "deps": offset or -1 (video only)}, ...]}

``shards`` is sorted by name; ids run through them in that order, and within a shard in index
order. ``index`` is the byte range of the shard's index member, ``records`` the absolute offset
of its first FRAME_RECORD and ``deps`` that of its KCAV1D table, so a reader opens no shard until
it reads from it. The per-video facts (member, frames, fps, size, codec, colorspace, prefix,
full_range) are the merged manifest's columns; ``bytes`` lets a reader notice a shard replaced
after the merge."""

DATASET_FORMAT = "kohakuclip dataset view"

"""Every on-disk layout kohakuclip reads or writes, declared once.

Video shards (KCIDX1) and image shards (KCIMG1) share one framing: an 8-byte magic, a u64
little-endian JSON length, the JSON header, zero padding to a multiple of 8, then fixed-size
little-endian records (one per frame, or one per image). The layouts are byte-compatible with
KohakuClip 1.x.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

INDEX_MEMBER = "__index__.bin"
"""Name of the index member inside a shard (zip or tar)."""

MANIFEST_FILE = "manifest.parquet"
"""Beside the shards: one row per video or image (shard, member, sizes, caption, label, json)."""

VIDEO_INDEX_MAGIC = b"KCIDX1\0\0"
IMAGE_INDEX_MAGIC = b"KCIMG1\0\0"

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

COLOR_BT709 = 1
COLOR_FULL_RANGE = 2
COLOR_RGB = 4
COLOR_GRAY = 8

VideoCodec = Literal["av1", "h264", "hevc"]
Colorspace = Literal["bt601", "bt709"]


@dataclass(frozen=True)
class VideoEntry:
    """Per-video header entry of a KCIDX1 index (one JSON object in ``videos``)."""

    member: str  # member name inside the archive
    row: int  # first FRAME_RECORD of this video
    n: int  # number of frames
    fps: float
    h: int
    w: int
    codec: VideoCodec
    prefix: str  # hex: the AV1 sequence header OBU, or Annex-B SPS/PPS(/VPS)
    colorspace: Colorspace

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> VideoEntry:
        return cls(
            member=str(obj["member"]),
            row=int(obj["row"]),
            n=int(obj["n"]),
            fps=float(obj["fps"]),
            h=int(obj["h"]),
            w=int(obj["w"]),
            codec=obj["codec"],
            prefix=str(obj.get("prefix", "")),
            colorspace=obj.get("colorspace", "bt601"),
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
it reads from it. The per-video facts (member, frames, fps, size, codec, colorspace, prefix) are
the merged manifest's columns; ``bytes`` lets a reader notice a shard replaced after the merge."""

DATASET_FORMAT = "kohakuclip dataset view"

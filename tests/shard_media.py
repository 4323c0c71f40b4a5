"""A tiny corpus for ``inspect`` / ``verify``: the same AV1 and H.264 videos as a zip shard
(with a manifest of captions), a tar shard and a folder, plus a GulpIO directory; and a PyAV
probe of an mp4 that knows nothing of kohakuclip."""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import dataclass

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kohakuclip import pack
from kohakuclip.formats import MANIFEST_FILE
from kohakuclip.gulp.chunk import ChunkBuilder
from tests.media import VideoSpec, frame_rgb, make_video

SPECS = {
    "av1.mp4": VideoSpec(codec="av1", width=64, height=48, frames=40, blur=1.0, seed=1),
    "h264.mp4": VideoSpec(codec="h264", width=80, height=48, frames=36, blur=1.0, seed=2),
}
CAPTIONS = {"av1.mp4": "a chequered drift, in AV1", "h264.mp4": "the same in H.264 (ünïcode)"}


@dataclass(frozen=True)
class Corpus:
    root: str
    data: dict[str, bytes]  # member -> mp4 bytes
    zip: str
    tar: str
    folder: str
    gulp: str


def make_corpus(root: str) -> Corpus:
    data = {name: make_video(spec) for name, spec in SPECS.items()}
    members = sorted(data.items())
    shards = os.path.join(root, "shards")
    os.makedirs(shards)
    zip_path, tar_path = os.path.join(shards, "a.zip"), os.path.join(shards, "b.tar")
    pack(zip_path, members)
    pack(tar_path, members)
    names = [n for n, _ in members]
    table = pa.table(
        {"shard": ["a.zip"] * len(names), "member": names, "caption": [CAPTIONS[n] for n in names]}
    )
    pq.write_table(table, os.path.join(shards, MANIFEST_FILE))
    folder = os.path.join(root, "folder")
    os.makedirs(os.path.join(folder, "sub"))
    for name, blob in members:
        with open(os.path.join(folder, "sub", name), "wb") as f:
            f.write(blob)
    gulp = os.path.join(root, "gulp")
    os.makedirs(gulp)
    with ChunkBuilder(
        os.path.join(gulp, "data_0.gulp"), os.path.join(gulp, "meta_0.gmeta")
    ) as builder:
        for k in range(2):
            spec = VideoSpec(width=48, height=40, seed=10 + k, blur=1.5)
            builder.add(
                f"clip{k}",
                {"label": f"class {k}", "fps": 8},
                [frame_rgb(spec, i) for i in range(6 + k)],
            )
    return Corpus(root, data, zip_path, tar_path, folder, gulp)


def copy_of(path: str, directory: str, name: str) -> str:
    os.makedirs(directory, exist_ok=True)
    out = os.path.join(directory, name)
    shutil.copyfile(path, out)
    return out


@dataclass(frozen=True)
class Probe:
    """An mp4 as PyAV sees it."""

    codec: str
    width: int
    height: int
    fps: float
    frames: int  # frames decoded
    bytes: int  # packet bytes
    keyframes: int
    gop: int  # longest run from a keyframe packet to the next, in file order
    display: list[int]  # per packet in file order: its display index (rank of its pts)
    positions: list[tuple[int, int]]  # per packet in file order: (byte position, size)


def probe(data: bytes) -> Probe:
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        packets = [p for p in c.demux(stream) if p.size]
        codec = {"libdav1d": "av1", "libaom-av1": "av1"}.get(stream.codec.name, stream.codec.name)
        fps = float(stream.average_rate)
        width, height = stream.codec_context.width, stream.codec_context.height
        keys = [i for i, p in enumerate(packets) if p.is_keyframe]
        runs = np.diff([*keys, len(packets)])
        rank = {pts: i for i, pts in enumerate(sorted(p.pts for p in packets))}
        display = [rank[p.pts] for p in packets]
        positions = [(int(p.pos), int(p.size)) for p in packets]
        stored = sum(p.size for p in packets)
    with av.open(io.BytesIO(data)) as c:
        frames = sum(1 for _ in c.decode(video=0))
    return Probe(
        codec, width, height, fps, frames, stored, len(keys), int(runs.max()), display, positions
    )

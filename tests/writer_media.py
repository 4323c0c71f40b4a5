"""Sources for the writer tests: small videos with display matrices and colour tags (PyAV)."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np

from kohakuclip.formats import FRAME_RECORD
from kohakuclip.storage.index import VideoIndex
from kohakuclip.storage.tar import list_tar
from kohakuclip.storage.zip import find_zip_member
from tests.media import VideoSpec, decode_rgb, frame_rgb


def tagged_video(
    spec: VideoSpec,
    rotation: int = 0,
    hflip: bool = False,
    colorspace: int | None = None,
    color_range: int | None = None,
) -> bytes:
    """An H.264 (or spec.codec) mp4 with a display matrix and/or colour tags."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream(
            {"h264": "libx264", "hevc": "libx265"}.get(spec.codec, spec.codec),
            rate=Fraction(spec.fps).limit_denominator(1001),
        )
        stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, spec.pix_fmt
        stream.options = {"crf": "10", **spec.options}
        if rotation or hflip:
            stream.set_display_rotation(rotation, hflip=hflip)
        context = stream.codec_context
        if colorspace is not None:  # BT.709 (1) or BT.2020 (9) with its 10-bit SDR transfer
            context.colorspace = colorspace
            context.color_primaries = colorspace
            context.color_trc = {9: 14}.get(colorspace, colorspace)
        if color_range is not None:
            context.color_range = color_range
        for i in range(spec.frames):
            frame = av.VideoFrame.from_ndarray(frame_rgb(spec, i), format="rgb24")
            frame = frame.reformat(
                format=spec.pix_fmt,
                dst_colorspace=colorspace,
                dst_color_range=color_range,
            )
            if colorspace is not None:
                frame.colorspace = colorspace
            if color_range is not None:
                frame.color_range = color_range
            out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    return buf.getvalue()


def stream_facts(data: bytes) -> dict:
    """What PyAV reports about a stored video: codec, size, rate, colour, frames and packets."""
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        codec, width, height = stream.codec_context.name, stream.width, stream.height
        fps = float(stream.average_rate)
        packets = [p for p in c.demux(stream) if p.size]
    with av.open(io.BytesIO(data)) as c:
        frames = list(c.decode(video=0))
    first = frames[0]
    return {
        "codec": codec,
        "width": width,
        "height": height,
        "fps": fps,
        "pix_fmt": first.format.name,
        "colorspace": int(first.colorspace),
        "color_range": int(first.color_range),
        "rotation": first.rotation,
        "frames": len(frames),
        "keyframes": [i for i, p in enumerate(packets) if p.is_keyframe],
    }


def luma(data: bytes) -> list[np.ndarray]:
    """Every frame's Y plane as decoded, at its own bit depth (uint8 or uint16)."""
    out = []
    with av.open(io.BytesIO(data)) as c:
        for frame in c.decode(video=0):
            plane = frame.planes[0]
            deep = frame.format.components[0].bits > 8
            values = np.frombuffer(plane, np.uint16 if deep else np.uint8)
            rows = values.reshape(frame.height, -1)
            out.append(rows[:, : frame.width].copy())
    return out


def upright_reference(source: bytes, rotation: int, hflip: bool = False) -> list[np.ndarray]:
    """The source's frames as shown: PyAV's rotation is counter-clockwise, applied before the
    mirror (as ``set_display_rotation`` documents)."""
    frames = [np.rot90(f, rotation // 90) for f in decode_rgb(source)]
    return [np.ascontiguousarray(f[:, ::-1] if hflip else f) for f in frames]


def read_index(path: str) -> tuple[VideoIndex, bytes]:
    """The shard's parsed index and the whole archive's bytes."""
    with open(path, "rb") as f:
        archive = f.read()
    if path.endswith(".tar"):
        member = next(m for m in list_tar(path) if m.name == "__index__.bin")
    else:
        found = find_zip_member(path, "__index__.bin")
        assert found is not None
        member = found
    raw = archive[member.offset : member.offset + member.size]
    return VideoIndex.from_buffer(raw, where=path), archive


def video_records(index: VideoIndex, member: str) -> np.ndarray:
    entry = next(v for v in index.videos if v.member == member)
    records = index.frames[entry.row : entry.row + entry.n]
    assert records.dtype == FRAME_RECORD
    return records

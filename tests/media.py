"""Synthetic test media made with PyAV and numpy at test time (no binaries in the repo)."""

from __future__ import annotations

import io
import json
import os
import tempfile
from dataclasses import dataclass, field

import av
import numpy as np

from kohakuclip.gulp import LABEL2IDX_FILE, ChunkBuilder
from kohakuclip.write.scheduling import open_encoder

ENCODER_OPTIONS: dict[str, tuple[str, dict[str, str]]] = {
    # hierarchical mini-GOPs, hidden ARFs and show_existing_frame, like real SVT-AV1 output
    "av1": (
        "libsvtav1",
        {"preset": "10", "crf": "40", "svtav1-params": "keyint=16:enable-dlf=0:enable-cdef=0"},
    ),
    # B-pyramid, reordered output (ctts)
    "h264": (
        "libx264",
        {"g": "16", "bf": "3", "b-pyramid": "normal", "crf": "26", "preset": "fast"},
    ),
    "hevc": (
        "libx265",
        {
            "crf": "30",
            "preset": "fast",
            "x265-params": "keyint=16:min-keyint=16:bframes=3:log-level=0",
        },
    ),
    "mpeg4": ("mpeg4", {"g": "16"}),
}


@dataclass(frozen=True)
class VideoSpec:
    """What to generate: a moving colour pattern that makes every frame distinct."""

    codec: str = "h264"
    width: int = 160
    height: int = 96
    frames: int = 48
    fps: float = 24.0
    container: str = "mp4"
    pix_fmt: str = "yuv420p"
    seed: int = 0
    blur: float = 0.0  # Gaussian sigma: natural-looking, band-limited frames when > 0
    options: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)  # stream metadata, e.g. rotate
    muxer: dict[str, str] = field(default_factory=dict)  # muxer options, e.g. movflags


def frame_rgb(spec: VideoSpec, i: int) -> np.ndarray:
    """The i-th source frame (uint8 HxWx3): gradients, moving blocks and a frame counter bar."""
    h, w = spec.height, spec.width
    yy, xx = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(spec.seed)
    phase = rng.integers(0, 256, size=3)
    img = np.stack(
        [
            (xx * 2 + 5 * i + phase[0]) % 256,
            (yy * 3 + 3 * i + phase[1]) % 256,
            ((xx + yy) + 7 * i + phase[2]) % 256,
        ],
        axis=-1,
    ).astype(np.uint8)
    block = ((yy // 12 + xx // 12 + i // 4) % 2) == 0
    img[block] = img[block] // 2 + 64
    bar = min(w, 4 + (i * 7) % max(1, w - 4))
    img[: max(2, h // 16), :bar] = 255
    if spec.blur > 0:
        import cv2

        img = cv2.GaussianBlur(img, (0, 0), spec.blur)
    return img


def make_video(spec: VideoSpec, path: str | None = None) -> bytes:
    """Encode the spec; returns the file bytes (and writes them to ``path`` when given)."""
    # some muxer options (global_sidx) read their output back: they need a real file
    temp = tempfile.NamedTemporaryFile(suffix=".mp4") if spec.muxer else None
    buf: io.BytesIO | str = io.BytesIO() if temp is None else temp.name
    fmt = spec.container if spec.container != "mkv" else "matroska"
    out = av.open(buf, "w", format=fmt, options=spec.muxer)
    codec, opts = ENCODER_OPTIONS.get(spec.codec, (spec.codec, {}))
    from fractions import Fraction

    stream = out.add_stream(codec, rate=Fraction(spec.fps).limit_denominator(1001))
    stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, spec.pix_fmt
    stream.options = {**opts, **spec.options}
    for k, v in spec.metadata.items():
        stream.metadata[k] = v
    open_encoder(stream.codec_context)
    for i in range(spec.frames):
        frame = av.VideoFrame.from_ndarray(frame_rgb(spec, i), format="rgb24")
        for packet in stream.encode(frame):
            out.mux(packet)
    for packet in stream.encode():
        out.mux(packet)
    out.close()
    if temp is None:
        assert isinstance(buf, io.BytesIO)
        data = buf.getvalue()
    else:
        with temp:
            data = temp.read()
    if path is not None:
        with open(path, "wb") as f:
            f.write(data)
    return data


def decode_rgb(data: bytes | str) -> list[np.ndarray]:
    """Reference decode: every frame in display order as RGB (PyAV's own conversion)."""
    src = io.BytesIO(data) if isinstance(data, bytes) else data
    with av.open(src) as c:
        return [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]


def decode_planes(data: bytes | str) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Reference decode: every frame in display order as its Y, U, V planes (yuv420p)."""
    src = io.BytesIO(data) if isinstance(data, bytes) else data
    out = []
    with av.open(src) as c:
        for f in c.decode(video=0):
            a = f.reformat(format="yuv420p").to_ndarray()
            h, w = f.height, f.width
            ch, cw = (h + 1) // 2, (w + 1) // 2
            y = a[:h]
            rest = a[h:].reshape(-1)
            out.append(
                (y, rest[: ch * cw].reshape(ch, cw), rest[ch * cw : 2 * ch * cw].reshape(ch, cw))
            )
    return out


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    diff = a.astype(np.float64) - b.astype(np.float64)
    mse = float(np.mean(diff * diff))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def write_gulp_dir(
    root: str,
    lengths: dict[str, int],
    labels: dict[str, str],
    label2idx: dict[str, int],
    per_chunk: int,
) -> str:
    """A gulp directory: video ``v<k>`` of ``lengths[v<k>]`` 72 x 56 frames (``VideoSpec`` seed k)
    labelled ``labels[v<k>]`` (meta ``{"label", "fps": 12}``), ``per_chunk`` videos per chunk in
    order, and ``label2idx.json`` beside them."""
    ids = list(lengths)
    for number, first in enumerate(range(0, len(ids), per_chunk)):
        with ChunkBuilder(
            os.path.join(root, f"data_{number}.gulp"), os.path.join(root, f"meta_{number}.gmeta")
        ) as builder:
            for id_ in ids[first : first + per_chunk]:
                spec = VideoSpec(width=72, height=56, seed=int(id_[1:]))
                frames = [frame_rgb(spec, i) for i in range(lengths[id_])]
                builder.add(id_, {"label": labels[id_], "fps": 12}, frames)
    with open(os.path.join(root, LABEL2IDX_FILE), "w") as f:
        json.dump(label2idx, f)
    return root


def broken_gulp_copy(gulp_dir: str, into: str, id_: str, frame: int) -> str:
    """A copy of ``gulp_dir`` at ``into`` with frame ``frame`` of ``id_`` zeroed (a JPEG no
    decoder reads); returns ``into``."""
    import shutil

    from kohakuclip.gulp import open_gulp_source

    shutil.copytree(gulp_dir, into)
    index = open_gulp_source(into)
    path, offsets, sizes = index.frames(index.position(id_))
    with open(path, "r+b") as f:
        f.seek(int(offsets[frame]))
        f.write(b"\0" * int(sizes[frame]))
    return into

"""Re-encode one video for storage with PyAV: demux, decode, filter, encode and mux in memory.

Every heavy step (demuxing, decoding, the filter graph, encoding, muxing) runs in FFmpeg with the
GIL released, so one video per thread scales across cores.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import av
import av.filter
from av.sidedata.sidedata import SideData
from av.video.frame import PictureType

from kohakuclip.errors import KohakuClipError
from kohakuclip.formats import Colorspace
from kohakuclip.mp4.faststart import faststart
from kohakuclip.write.layout import (
    Layout,
    Orientation,
    choose_colour,
    display_matrix_orientation,
    plan_layout,
)
from kohakuclip.write.scheduling import open_encoder
from kohakuclip.write.settings import EncodeSettings

__all__ = [
    "EncodeError",
    "EncodedVideo",
    "SourceInput",
    "SourceProbe",
    "encode",
    "encode_frames",
    "encode_video",
    "open_source",
    "probe_frame",
    "source_name",
]


SourceInput = str | os.PathLike[str] | bytes | bytearray | memoryview


class EncodeError(KohakuClipError, ValueError):
    """A source that cannot be encoded (not a video, corrupt, no frames); names the source."""


@dataclass(frozen=True)
class EncodedVideo:
    """A stored video: faststart mp4 bytes and what it holds."""

    data: bytes
    frames: int
    fps: float
    width: int
    height: int
    colorspace: Colorspace
    source_width: int
    source_height: int

    @property
    def duration(self) -> float:
        return self.frames / self.fps

    @classmethod
    def of(cls, probe: SourceProbe, data: bytes, frames: int) -> EncodedVideo:
        """``frames`` frames of ``probe``'s source, stored as ``data`` in its layout."""
        layout = probe.layout
        return cls(
            data=data,
            frames=frames,
            fps=float(probe.rate),
            width=layout.width,
            height=layout.height,
            colorspace=layout.colour.stored,
            source_width=probe.width,
            source_height=probe.height,
        )


@dataclass(frozen=True)
class SourceProbe:
    """What the first decoded frame and the stream say about a source."""

    width: int
    height: int
    rate: Fraction
    layout: Layout


def source_name(source: SourceInput) -> str:
    """How errors name a source: its path, or ``<bytes>``."""
    return os.fspath(source) if isinstance(source, str | os.PathLike) else "<bytes>"


def open_source(source: SourceInput, name: str) -> Any:
    """Open a path or in-memory video with PyAV; EncodeError naming ``name`` if it cannot."""
    target = source if isinstance(source, str | os.PathLike) else io.BytesIO(bytes(source))
    try:
        return av.open(target, "r")
    except (av.error.FFmpegError, OSError, UnicodeDecodeError) as e:
        raise EncodeError(f"{name}: cannot open ({_reason(e)})") from None


def _reason(error: Exception) -> str:
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


def native_rate(stream: Any) -> Fraction:
    """The source frame rate: the average rate, or the container's nominal rate when the two
    agree within 1 % (cleaner fractions such as 24000/1001); 25 when neither is known."""
    average = stream.average_rate
    guessed = stream.guessed_rate
    if average and guessed and abs(float(guessed) / float(average) - 1) < 0.01:
        return Fraction(guessed)
    rate = average or guessed
    if not rate or rate <= 0 or rate > 1000:
        return Fraction(25)
    return Fraction(rate).limit_denominator(1001)


def _orientation(frame: av.VideoFrame) -> Orientation:
    matrix = frame.side_data.get("DISPLAYMATRIX")
    return display_matrix_orientation(bytes(matrix) if isinstance(matrix, SideData) else None)


def probe_frame(frame: av.VideoFrame, stream: Any, max_short: int) -> SourceProbe:
    """Plan the stored layout from the first decoded frame (size, orientation, colour)."""
    fmt = frame.format
    colour = choose_colour(
        int(frame.colorspace),
        int(frame.color_range),
        fmt.name,
        fmt.is_rgb,
        int(frame.color_primaries),
        int(frame.color_trc),
        frame.width,
        frame.height,
    )
    sar = stream.sample_aspect_ratio
    layout = plan_layout(frame.width, frame.height, sar, _orientation(frame), colour, max_short)
    return SourceProbe(frame.width, frame.height, native_rate(stream), layout)


def _shape(frame: av.VideoFrame) -> tuple[int, int, str, int, int]:
    """What a filter graph's source is configured for."""
    return (
        frame.width,
        frame.height,
        frame.format.name,
        int(frame.colorspace),
        int(frame.color_range),
    )


class _Filter:
    """The layout's filter chain as a PyAV graph, rebuilt if the source changes shape mid-way."""

    def __init__(self, layout: Layout, time_base: Fraction) -> None:
        self._layout = layout
        self._time_base = time_base
        self._graph: Any = None
        self._shape: tuple[int, int, str, int, int] | None = None

    def _build(self, frame: av.VideoFrame) -> None:
        graph = av.filter.Graph()
        nodes = [
            graph.add(
                "buffer",
                video_size=f"{frame.width}x{frame.height}",
                pix_fmt=frame.format.name,
                time_base=str(self._time_base),
                pixel_aspect="1/1",
                colorspace=str(int(frame.colorspace)),
                range=str(int(frame.color_range)),
            )
        ]
        nodes += [graph.add(name, args or None) for name, args in self._layout.filters()]
        nodes.append(graph.add("buffersink"))
        graph.link_nodes(*nodes).configure()
        self._graph = graph
        self._shape = _shape(frame)

    def __call__(self, frame: av.VideoFrame) -> av.VideoFrame:
        if _shape(frame) != self._shape:
            self._build(frame)
        self._graph.push(frame)
        return self._graph.vpull()


def _frames(container: Any, stream: Any, name: str) -> Iterator[av.VideoFrame]:
    try:
        yield from container.decode(stream)
    except av.error.FFmpegError as e:
        raise EncodeError(f"{name}: cannot decode ({_reason(e)})") from None


def encode_video(
    source: SourceInput,
    settings: EncodeSettings | None = None,
    name: str | None = None,
    *,
    stop: threading.Event | None = None,
) -> EncodedVideo:
    """Re-encode ``source`` (a path or a video file's bytes) as a faststart mp4 in memory.

    Native frame rate (frames renumbered at a constant rate), short side capped and even
    dimensions, upright, 8-bit 4:2:0 limited range tagged BT.601 / BT.709; audio is dropped.
    Setting ``stop`` abandons the encode before the next frame (EncodeError), once the encoder
    has drained the frames it holds (SVT-AV1's lookahead: about two seconds at most here).
    """
    settings = settings or EncodeSettings()
    name = name or source_name(source)
    container = open_source(source, name)
    try:
        if not container.streams.video:
            raise EncodeError(f"{name}: no video stream")
        stream = container.streams.video[0]
        stream.thread_count = 1
        return _transcode(container, stream, settings, name, stop)
    finally:
        container.close()


def _transcode(
    container: Any, stream: Any, settings: EncodeSettings, name: str, stop: threading.Event | None
) -> EncodedVideo:
    def plan(frame: av.VideoFrame) -> SourceProbe:
        return probe_frame(frame, stream, settings.max_short)

    return encode_frames(_frames(container, stream, name), plan, settings, name, stop=stop)


def encode_frames(
    frames: Iterable[av.VideoFrame],
    plan: Callable[[av.VideoFrame], SourceProbe],
    settings: EncodeSettings,
    name: str,
    *,
    stop: threading.Event | None = None,
) -> EncodedVideo:
    """Encode decoded frames as a faststart mp4 in memory (any frame source: a demuxed file,
    decoded JPEGs). ``plan`` takes the first frame and returns the stored layout and rate;
    every frame then goes through the layout's filter chain to the encoder, numbered at that
    constant rate. Setting ``stop`` (an interrupted writer) abandons it before the next frame,
    the encoder drained first."""
    buffer = io.BytesIO()
    output = av.open(buffer, "w", format="mp4")
    probe: SourceProbe | None = None
    encoder: Any = None
    count = 0
    finished = False
    try:
        for frame in frames:
            if stop is not None and stop.is_set():
                raise EncodeError(f"{name}: interrupted")
            if probe is None:
                probe = plan(frame)
                encoder = _add_encoder(output, probe, settings)
                time_base = 1 / probe.rate  # the stream's own time base changes once muxing starts
                convert = _Filter(probe.layout, time_base)
            out = convert(frame)
            out.pict_type = PictureType.NONE  # encoders would copy the source's frame types
            out.pts = count
            out.time_base = time_base
            count += 1
            output.mux(encoder.encode(out))
        if probe is None:
            raise EncodeError(f"{name}: no decodable video frames")
        output.mux(encoder.encode(None))
        output.close()
        finished = True
    except av.error.FFmpegError as e:
        raise EncodeError(f"{name}: encoding failed ({_reason(e)})") from None
    finally:
        if not finished:
            _discard(output, encoder)
    return EncodedVideo.of(probe, faststart(buffer.getvalue()), count)


def _discard(output: Any, encoder: Any) -> None:
    """Close an output abandoned mid-way (a source that stopped decoding, an interrupt): its
    encoder gets its end of stream first (SVT-AV1 prints an error naming no file when freed
    without one), the trailer may fail, and nothing of it is kept."""
    if encoder is not None:
        with contextlib.suppress(av.error.FFmpegError, ValueError):
            encoder.encode(None)
    with contextlib.suppress(av.error.FFmpegError):
        output.close()


def _add_encoder(output: Any, probe: SourceProbe, settings: EncodeSettings) -> Any:
    encoder = output.add_stream(settings.encoder, rate=probe.rate)
    encoder.width = probe.layout.width
    encoder.height = probe.layout.height
    encoder.pix_fmt = "yuv420p"
    encoder.time_base = 1 / probe.rate
    encoder.thread_count = 1
    context = encoder.codec_context
    colour = probe.layout.colour
    context.colorspace = colour.matrix
    context.color_range = 1
    context.color_primaries = colour.primaries
    context.color_trc = colour.trc
    encoder.options = settings.encoder_options()
    open_encoder(context)
    return encoder


def encode(
    source: SourceInput,
    codec: str = "av1",
    crf: int | None = None,
    gop: int = 16,
    preset: int | str | None = None,
    max_short: int = 512,
    loop_filters: bool = False,
) -> bytes:
    """Re-encode one video to kohakuclip's storage format, as ``write_videos`` stores it.

    Args:
        source: the video file's path, or its bytes.
        codec: ``av1``, ``h264`` or ``hevc``.
        crf: the encoder's CRF (default per codec: AV1 36, H.264 23, HEVC 28).
        gop: frames per closed GOP.
        preset: SVT-AV1's preset number for AV1 (default 6), an x264 / x265 preset name
            otherwise (default ``medium``).
        max_short: cap on the stored short side (0: none), never upscaled.
        loop_filters: keep AV1's deblocking, CDEF and loop restoration on.

    Returns:
        The faststart mp4 bytes, ready for ``pack``.

    Raises:
        EncodeError: a source that is not a video, is corrupt, or has no frames.
    """
    settings = EncodeSettings(codec, crf, gop, preset, max_short, loop_filters)  # type: ignore[arg-type]
    return encode_video(source, settings).data

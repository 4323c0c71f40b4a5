"""Decode a planned clip with a long-lived, single-threaded decoder per codec (one set per thread).

AV1 goes to libdav1d with the sequence header in front of each GOP when the keyframe lacks one
(8-bit 4:2:0 streams straight through its C API, ``_dav1d``; others through PyAV); H.264 / HEVC
samples are turned into Annex B with the parameter sets in front of each GOP, so one decoder
serves every video. Every other codec (vp9, mpeg4) goes through PyAV with the sample entry's
configuration as extradata, one decoder per configuration (a few kept per thread). Packets carry
their display index as timestamp, so outputs map back to wanted frames whatever the decode order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from functools import cache
from time import thread_time
from typing import Any

import av

from kohakuclip.codecs.av1_syntax import iter_obus, parse_sequence_header
from kohakuclip.decode import _dav1d
from kohakuclip.decode.pixels import Planes, frame_planes
from kohakuclip.errors import KohakuClipError
from kohakuclip.plan_types import ClipPlan, GopRead
from kohakuclip.tracks import VideoTrack

__all__ = ["ClipDecodeError", "ClipDecoder", "padded_packet", "takes_dav1d"]


ReadAt = Callable[[int, int], "bytes | memoryview"]  # (offset, length) -> bytes
_DECODERS = {"av1": "libdav1d", "h264": "h264", "hevc": "hevc", "vp9": "vp9", "mpeg4": "mpeg4"}
_PREFIXED = ("av1", "h264", "hevc")
"""Codecs whose configuration goes in-band in front of each GOP: one decoder serves all videos."""
_CONFIGURED = 4
"""Decoders kept per thread for the other codecs (one per configuration, least recent dropped)."""


def padded_packet(data: bytes | memoryview) -> av.Packet:
    """A packet owning a copy of ``data`` followed by the zero padding decoders read past the
    end (``av.Packet(buffer)`` would point into the buffer itself, padding-less)."""
    packet = av.Packet(len(data))
    packet.update(data)  # type: ignore[arg-type]  # any buffer
    return packet


class ClipDecodeError(KohakuClipError, RuntimeError):
    """Decoding failed; the message names the file, member and frames."""


def _has_sequence_header(sample: bytes | memoryview) -> bool:
    """True when the first OBU (after an optional temporal delimiter) is a sequence header."""
    pos = 0
    for _ in range(2):
        if pos >= len(sample):
            return False
        header = sample[pos]
        obu_type = (header >> 3) & 0xF
        if obu_type == 1:
            return True
        if obu_type != 2:  # not a temporal delimiter
            return False
        pos += 2 + ((header >> 2) & 1)  # TD: header (+ extension) + a zero size byte
    return False


def _is_8bit_420(prefix: bytes) -> bool:
    """True when the AV1 sequence header in ``prefix`` announces 8-bit 4:2:0 pictures."""
    try:
        obu = next(o for o in iter_obus(prefix) if o.type == 1)
        seq = parse_sequence_header(prefix[obu.payload : obu.end])
    except (StopIteration, ValueError, IndexError):  # no or unreadable sequence header
        return False
    return (
        seq.bit_depth == 8 and not seq.mono_chrome and seq.subsampling_x == seq.subsampling_y == 1
    )


@cache
def _direct(prefix: bytes) -> bool:
    return _is_8bit_420(prefix) and _dav1d.library() is not None


def takes_dav1d(track: VideoTrack) -> bool:
    """True when the track goes straight to libdav1d: 8-bit 4:2:0 AV1 with the library found."""
    return track.codec == "av1" and bool(track.prefix) and _direct(track.prefix)


class ClipDecoder:
    """One thread's PyAV decoders; feeds a ClipPlan and hands each wanted frame's planes to a
    callback. The path for what the compiled drivers (``_clips``) do not take, and their test
    twin."""

    def __init__(self) -> None:
        self._contexts: OrderedDict[tuple[str, bytes], Any] = OrderedDict()
        self.seconds = {"read": 0.0, "decode": 0.0, "pixels": 0.0}  # thread CPU time per stage

    def _context(self, track: VideoTrack) -> Any:
        """The PyAV decoder for the track: per codec, or per codec and configuration."""
        key = (track.codec, b"" if track.codec in _PREFIXED else track.config)
        ctx = self._contexts.get(key)
        if ctx is not None:
            self._contexts.move_to_end(key)
            return ctx
        name = _DECODERS.get(track.codec)
        if name is None:
            raise ClipDecodeError(f"unsupported codec {track.codec!r}")
        ctx = av.CodecContext.create(name, "r")
        if key[1]:
            ctx.extradata = key[1]
        ctx.thread_count = 1
        self._contexts[key] = ctx
        configured = [k for k in self._contexts if k[0] not in _PREFIXED]
        if len(configured) > _CONFIGURED:
            del self._contexts[configured[0]]
        return ctx

    def reset(self, codec: str) -> None:
        """Drop a decoder that may be in a bad state after an error."""
        for key in [k for k in self._contexts if k[0] == codec]:
            del self._contexts[key]

    def decode(
        self,
        track: VideoTrack,
        plan: ClipPlan,
        read: ReadAt,
        on_frame: Callable[[Planes, int], None],
    ) -> int:
        """Feed every planned packet (each GOP's bytes from ``read(offset, length)``: a pread
        of the video's file, or ranges fetched from object storage); calls
        ``on_frame(planes, display_index)`` for wanted frames (Y, U, V arrays over whole rows,
        valid during the call).

        Returns the number of frames the decoder produced. Thread CPU time goes to
        ``seconds``: ``read`` (preads), ``pixels`` (in ``on_frame``), ``decode`` (the rest).
        """
        seconds = self.seconds
        started, read_before = thread_time(), seconds["read"]
        produced, in_callbacks = self._decode_pyav(track, plan, read, on_frame)
        seconds["pixels"] += in_callbacks
        elapsed = thread_time() - started
        seconds["decode"] += elapsed - in_callbacks - (seconds["read"] - read_before)
        return produced

    def _decode_pyav(
        self,
        track: VideoTrack,
        plan: ClipPlan,
        read: ReadAt,
        on_frame: Callable[[Planes, int], None],
    ) -> tuple[int, float]:
        ctx = self._context(track)
        targets = plan.targets
        in_callbacks = 0.0
        produced = 0
        for packet in self._packets(track, plan, read):
            for frame in ctx.decode(packet):
                produced += 1
                display = frame.pts
                if display in targets:
                    start = thread_time()
                    on_frame(frame_planes(frame), display)
                    in_callbacks += thread_time() - start
        ctx.flush_buffers()
        return produced, in_callbacks

    def _read(self, read: ReadAt, gop: GopRead) -> bytes | memoryview:
        start = thread_time()
        buf = read(gop.offset, gop.length)
        self.seconds["read"] += thread_time() - start
        if len(buf) != gop.length:
            raise ClipDecodeError(
                f"short read: {len(buf)} of {gop.length} bytes at offset {gop.offset}"
            )
        return buf

    def _packets(
        self, track: VideoTrack, plan: ClipPlan, read: ReadAt
    ) -> Iterator[av.Packet | None]:
        """The plan's packets (display index as pts), one read per GOP, then None (drain)."""
        annexb = None
        if track.nal_length_size:
            from kohakuclip.codecs.annexb import to_annexb

            annexb = to_annexb
        prefix = track.prefix
        for gop in plan.reads:
            view = memoryview(self._read(read, gop))
            first = True
            for pieces, display in gop.packets:
                data: bytes | memoryview
                if len(pieces) == 1:
                    data = view[pieces[0][0] : pieces[0][1]]
                else:
                    data = b"".join([view[a:b] for a, b in pieces])
                if annexb is not None:
                    data = annexb(data, track.nal_length_size)
                    if first:
                        data = prefix + data
                elif first and prefix and not _has_sequence_header(data):
                    data = prefix + bytes(data)
                first = False
                packet = padded_packet(data)
                packet.pts = display
                yield packet
        yield None

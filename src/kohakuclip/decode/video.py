"""Decode a planned clip with a long-lived, single-threaded decoder per codec (one set per thread).

AV1 goes to libdav1d with the sequence header in front of each GOP when the keyframe lacks one;
H.264 / HEVC samples are turned into Annex B with the parameter sets in front of each GOP, so one
decoder serves every video. Packets carry their display index as pts, so outputs map back to
wanted frames whatever the decode order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from time import thread_time
from typing import Any

import av

from kohakuclip.read.plan import ClipPlan
from kohakuclip.storage.catalog import VideoTrack

_DECODERS = {"av1": "libdav1d", "h264": "h264", "hevc": "hevc"}


class ClipDecodeError(RuntimeError):
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


class ClipDecoder:
    """One thread's decoders; feeds a ClipPlan and hands each wanted frame to a callback."""

    def __init__(self) -> None:
        self._contexts: dict[str, Any] = {}
        self.seconds = {"read": 0.0, "decode": 0.0, "pixels": 0.0}  # thread CPU time per stage

    def _context(self, codec: str) -> Any:
        ctx = self._contexts.get(codec)
        if ctx is None:
            name = _DECODERS.get(codec)
            if name is None:
                raise ClipDecodeError(f"unsupported codec {codec!r}")
            ctx = av.CodecContext.create(name, "r")
            ctx.thread_count = 1
            self._contexts[codec] = ctx
        return ctx

    def reset(self, codec: str) -> None:
        """Drop a decoder that may be in a bad state after an error."""
        self._contexts.pop(codec, None)

    def decode(
        self,
        track: VideoTrack,
        plan: ClipPlan,
        fd: int,
        on_frame: Callable[[av.VideoFrame, int], None],
    ) -> int:
        """Feed every planned packet; calls ``on_frame(frame, display_index)`` for wanted frames.

        Returns the number of frames the decoder produced. Thread CPU time goes to
        ``seconds``: ``read`` (preads), ``pixels`` (in ``on_frame``), ``decode`` (the rest).
        """
        ctx = self._context(track.codec)
        targets = plan.targets
        seconds = self.seconds
        started, read_before = thread_time(), seconds["read"]
        in_callbacks = 0.0
        produced = 0
        for packet in self._packets(track, plan, fd):
            for frame in ctx.decode(packet):
                produced += 1
                display = frame.pts
                if display in targets:
                    start = thread_time()
                    on_frame(frame, display)
                    in_callbacks += thread_time() - start
        ctx.flush_buffers()
        seconds["pixels"] += in_callbacks
        elapsed = thread_time() - started
        seconds["decode"] += elapsed - in_callbacks - (seconds["read"] - read_before)
        return produced

    def _packets(self, track: VideoTrack, plan: ClipPlan, fd: int) -> Iterator[av.Packet | None]:
        """The plan's packets (display index as pts), one pread per GOP, then None (drain)."""
        annexb = None
        if track.nal_length_size:
            from kohakuclip.codecs.annexb import to_annexb

            annexb = to_annexb
        prefix = track.prefix
        seconds = self.seconds
        for gop in plan.reads:
            start = thread_time()
            buf = os.pread(fd, gop.length, gop.offset)
            seconds["read"] += thread_time() - start
            if len(buf) != gop.length:
                raise ClipDecodeError(
                    f"short read: {len(buf)} of {gop.length} bytes at offset {gop.offset}"
                )
            view = memoryview(buf)
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
                packet = av.Packet(data)  # type: ignore[arg-type]
                packet.pts = display
                yield packet
        yield None

"""CPU time per decoded frame: PyAV's decode loop against libavcodec called from numba.

    python benchmarks/avcodec_direct.py video.mp4 [--frames 200] [--rounds 3]

Decodes the first GOPs of an H.264 / HEVC mp4 (at least ``--frames`` frames) three ways, in
one process and alternating round by round: PyAV as ``decode/video.py`` feeds it (Annex B
samples, one ``av.Packet`` and ``decode`` call per packet, each frame's planes taken), the
Python-level ``decode_packets`` over the primitives, and one compiled call per GOP (Annex B
conversion, send, receive and a luma checksum all in numba, no GIL). Prints thread CPU ms per
frame, the best round of each.
"""

from __future__ import annotations

import argparse
import itertools
import time
from typing import Any

import av
import numba
import numpy as np

from kohakuclip.codecs.annexb import to_annexb
from kohakuclip.decode import _avcodec
from kohakuclip.decode._avcodec import (
    AGAIN,
    OK,
    PICTURE_FIELDS,
    AvcodecDecoder,
    annexb,
    decode_packets,
    flush,
    receive_frame,
    send_packet,
)
from kohakuclip.decode.pixels import frame_planes
from kohakuclip.mp4.moov import parse_mp4_file


@numba.njit(nogil=True, cache=True)
def _gop(
    handle: np.ndarray,
    src: np.ndarray,
    begins: np.ndarray,
    ends: np.ndarray,
    stamps: np.ndarray,
    prefix: np.ndarray,
    buf: np.ndarray,
) -> int:
    """One GOP in one call: Annex B into ``buf`` (prefix first), send, receive (each frame's
    record filled), drain, flush; returns the frames decoded."""
    picture = np.zeros(PICTURE_FIELDS, np.int64)
    frames = 0
    for k in range(len(stamps) + 1):
        size = 0
        if k < len(stamps):
            at = 0
            if k == 0:
                buf[: len(prefix)] = prefix
                at = len(prefix)
            n = annexb(src[begins[k] :].ctypes.data, ends[k] - begins[k], 4, buf[at:])
            if n < 0:
                return -1
            size = at + n
        while True:
            status = send_packet(handle, buf.ctypes.data, size, stamps[k] if size else 0)
            while receive_frame(handle, picture) == OK:
                frames += 1
            if status != AGAIN:
                break
        if status < 0:
            return status
    flush(handle)
    return frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("video")
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    assert _avcodec.library() is not None
    track = parse_mp4_file(args.video)
    with open(args.video, "rb") as f:
        data = f.read()
    keys = [int(i) for i in np.nonzero(track.keyframes)[0]] + [len(track.sizes)]
    gops: list[list[tuple[bytes, int]]] = []
    for a, b in itertools.pairwise(keys):
        gops.append(
            [
                (data[int(track.offsets[i]) : int(track.offsets[i] + track.sizes[i])], i)
                for i in range(a, b)
            ]
        )
        if sum(map(len, gops)) >= args.frames:
            break
    n_frames = sum(map(len, gops))
    codec: Any = track.codec
    size = f"{track.width}x{track.height}"
    print(f"{args.video}: {codec} {size}, {n_frames} frames in {len(gops)} GOPs")

    ctx: Any = av.CodecContext.create(codec, "r")
    ctx.thread_count = 1
    ctx.thread_type = "SLICE"

    def pyav() -> int:
        count = 0
        for gop in gops:
            for k, (sample, pts) in enumerate(gop):
                payload = to_annexb(sample, track.nal_length_size)
                packet = av.Packet(track.prefix + payload if k == 0 else payload)
                packet.pts = pts
                for frame in ctx.decode(packet):
                    frame_planes(frame)
                    count += 1
            for frame in ctx.decode(None):
                frame_planes(frame)
                count += 1
            ctx.flush_buffers()
        return count

    decoder = AvcodecDecoder(codec)

    def python_loop() -> int:
        return sum(
            len(decode_packets(decoder, gop, track.prefix, track.nal_length_size)) for gop in gops
        )

    prefix = np.frombuffer(track.prefix, np.uint8)
    arrays = []
    for gop in gops:
        blob = b"".join(sample for sample, _ in gop)
        ends = np.cumsum([len(s) for s, _ in gop]).astype(np.int64)
        begins = np.concatenate([[0], ends[:-1]]).astype(np.int64)
        stamps = np.array([pts for _, pts in gop], np.int64)
        buf = np.zeros(len(prefix) + 4 * len(blob) + 64, np.uint8)
        arrays.append((np.frombuffer(blob, np.uint8), begins, ends, stamps, buf))

    def compiled() -> int:
        return sum(
            _gop(decoder.handle, src, begins, ends, stamps, prefix, buf)
            for src, begins, ends, stamps, buf in arrays
        )

    ways = {"PyAV loop": pyav, "decode_packets": python_loop, "numba, one call per GOP": compiled}
    for way in ways.values():  # warm up (numba compile, decoder buffers)
        way()
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(args.rounds):
        for name, way in ways.items():
            start = time.thread_time()
            count = way()
            best[name] = min(best[name], (time.thread_time() - start) / count * 1e3)
            assert count == n_frames, (name, count)
    for name, ms in best.items():
        print(f"  {name:28s} {ms:7.3f} ms/frame ({ms / best['PyAV loop']:.3f}x)")
    decoder.close()


if __name__ == "__main__":
    main()

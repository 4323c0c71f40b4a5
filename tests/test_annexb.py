"""Annex B conversion: checked by decoding without extradata, and against FFmpeg's mp4toannexb."""

from __future__ import annotations

import io
from functools import cache

import av
import av.bitstream
import numpy as np
import pytest

from kohakuclip.codecs.annexb import (
    AnnexBError,
    annexb_in_place,
    nal_length_size,
    nal_units,
    parameter_sets_annexb,
    to_annexb,
)
from kohakuclip.mp4.moov import parse_mp4_bytes
from tests.media import VideoSpec, decode_rgb, make_video

CODECS = ["h264", "hevc"]


@cache
def video(codec: str) -> bytes:
    return make_video(VideoSpec(codec=codec, frames=40))


def samples(data: bytes) -> tuple[object, list[bytes]]:
    track = parse_mp4_bytes(data)
    return track, [data[int(o) : int(o) + int(s)] for o, s in zip(track.offsets, track.sizes)]


def decode_annexb(codec: str, stream: list[bytes], pts: list[int]) -> dict[int, np.ndarray]:
    """Decode Annex B access units with a bare decoder (no extradata); frames by pts."""
    ctx = av.CodecContext.create(codec, "r")
    frames = {}
    for payload, p in zip(stream, pts):
        packet = av.Packet(payload)
        packet.pts = p
        for frame in ctx.decode(packet):
            frames[frame.pts] = frame.to_ndarray(format="rgb24")
    for frame in ctx.decode(None):
        frames[frame.pts] = frame.to_ndarray(format="rgb24")
    return frames


def split_annexb(stream: bytes) -> list[bytes]:
    """NAL units of an Annex B stream (3- or 4-byte start codes)."""
    units = stream.split(b"\x00\x00\x01")[1:]
    return [unit.rstrip(b"\x00") if i < len(units) - 1 else unit for i, unit in enumerate(units)]


@pytest.mark.parametrize("codec", CODECS)
def test_prefix_and_samples_decode_like_the_file(codec):
    data = video(codec)
    track, raw = samples(data)
    stream = [track.prefix + to_annexb(raw[0], track.nal_length_size)]
    stream += [to_annexb(sample, track.nal_length_size) for sample in raw[1:]]
    frames = decode_annexb(codec, stream, track.display.tolist())
    reference = decode_rgb(data)
    assert sorted(frames) == list(range(len(reference)))
    for i, expected in enumerate(reference):
        np.testing.assert_array_equal(frames[i], expected)


@pytest.mark.parametrize("codec", CODECS)
def test_matches_ffmpeg_mp4toannexb(codec):
    data = video(codec)
    track, raw = samples(data)
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        bsf = av.bitstream.BitStreamFilterContext(f"{codec}_mp4toannexb", stream)
        packets = [p for p in container.demux(stream) if p.size]
        filtered = [bytes(out) for p in packets for out in bsf.filter(p)]
    assert len(filtered) == len(raw)
    # FFmpeg repeats the parameter sets before every keyframe: compare them apart
    ours = [split_annexb(track.prefix + to_annexb(raw[0], track.nal_length_size))]
    ours += [split_annexb(to_annexb(sample, track.nal_length_size)) for sample in raw[1:]]
    theirs = [split_annexb(sample) for sample in filtered]
    header = set(split_annexb(track.prefix))  # what the decoder configuration record carries
    assert [u for u in ours[0] if u in header] == [u for u in theirs[0] if u in header]
    for mine, reference in zip(ours, theirs):
        assert [u for u in mine if u not in header] == [u for u in reference if u not in header]


def relength(sample: bytes, size: int) -> bytes:
    """The sample with its 4-byte NAL lengths rewritten as ``size``-byte lengths."""
    return b"".join(len(unit).to_bytes(size, "big") + bytes(unit) for unit in nal_units(sample, 4))


@pytest.mark.parametrize("size", [1, 2])
def test_short_length_fields(size):
    _, raw = samples(video("h264"))
    small = [s for s in raw if all(len(u) < 256 for u in nal_units(s, 4))][:5]
    pool = small if size == 1 else raw
    assert pool
    for sample in pool:
        assert to_annexb(relength(sample, size), size) == to_annexb(sample, 4)


def test_in_place_on_a_run_of_samples():
    _, raw = samples(video("hevc"))
    buf = bytearray(b"".join(raw[:10]))
    annexb_in_place(buf)
    assert bytes(buf) == b"".join(to_annexb(sample, 4) for sample in raw[:10])
    view = memoryview(bytearray(b"".join(raw[:3])))
    annexb_in_place(view[: len(raw[0])])  # a slice of a larger buffer
    assert bytes(view[: len(raw[0])]) == to_annexb(raw[0], 4)
    assert bytes(view[len(raw[0]) :]) == raw[1] + raw[2]


def test_broken_lengths_name_the_sample():
    _, raw = samples(video("h264"))
    sample = raw[3]
    for size, broken in [(4, sample[:-1]), (2, relength(sample, 2)[:-2]), (4, sample + b"\0")]:
        with pytest.raises(AnnexBError, match=r"clip\.mp4#3"):
            to_annexb(broken, size, where="clip.mp4#3")
    with pytest.raises(AnnexBError, match=r"NAL length size 5"):
        to_annexb(sample, 5)


@pytest.mark.parametrize("codec", CODECS)
def test_parameter_sets(codec):
    track, _ = samples(video(codec))
    assert nal_length_size(codec, track.config) == 4
    units = split_annexb(parameter_sets_annexb(codec, track.config))
    kinds = [u[0] & 31 if codec == "h264" else (u[0] >> 1) & 63 for u in units]
    expected = [7, 8] if codec == "h264" else [32, 33, 34]  # (VPS,) SPS, PPS
    assert kinds[: len(expected)] == expected
    with av.open(io.BytesIO(video(codec))) as container:
        extradata = container.streams.video[0].codec_context.extradata
    assert all(unit in extradata for unit in units)


@pytest.mark.parametrize("codec", CODECS)
def test_bad_configuration_raises(codec):
    track, _ = samples(video(codec))
    for broken in (b"", b"\x02" + track.config[1:], track.config[:12], track.config[:30]):
        with pytest.raises(AnnexBError, match=r"cfg\.mp4"):
            parameter_sets_annexb(codec, broken, where="cfg.mp4")
    with pytest.raises(AnnexBError):
        parameter_sets_annexb("av1", track.config)

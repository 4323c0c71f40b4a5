"""Non-reference H.264 / HEVC samples: skipping the unwanted ones leaves wanted frames bit-exact."""

from __future__ import annotations

import io
from functools import cache

import av
import numpy as np
import pytest

from kohakuclip.codecs.annexb import to_annexb
from kohakuclip.codecs.h26x import highest_temporal_id, is_reference
from kohakuclip.mp4.moov import parse_mp4_bytes
from tests.media import VideoSpec, make_video

HEVC_LAYERED = {"x265-params": "keyint=16:min-keyint=16:bframes=3:log-level=0:temporal-layers=3"}


@cache
def stream(codec: str, layered: bool = False):
    """(track, samples, is_reference per sample) of a B-pyramid test video."""
    options = HEVC_LAYERED if layered else {}
    data = make_video(VideoSpec(codec=codec, frames=48, options=options))
    track = parse_mp4_bytes(data)
    samples = [data[int(o) : int(o) + int(s)] for o, s in zip(track.offsets, track.sizes)]
    top = highest_temporal_id(track.prefix) if codec == "hevc" else 0
    refs = np.array([is_reference(s, codec, track.nal_length_size, top) for s in samples])
    return data, track, samples, refs


def decode(codec: str, track, samples: list[bytes], chosen: np.ndarray) -> dict[int, bytes]:
    """Decode the chosen samples (decode order, Annex B, pts = display index); frames by pts."""
    ctx = av.CodecContext.create(codec, "r")
    frames: dict[int, bytes] = {}
    first = True
    for i in np.flatnonzero(chosen):
        payload = to_annexb(samples[i], track.nal_length_size)
        packet = av.Packet(track.prefix + payload if first else payload)
        first = False
        packet.pts = int(track.display[i])
        for frame in ctx.decode(packet):
            frames[frame.pts] = frame.to_ndarray().tobytes()
    for frame in ctx.decode(None):
        frames[frame.pts] = frame.to_ndarray().tobytes()
    return frames


@pytest.mark.parametrize("codec, layered", [("h264", False), ("hevc", False), ("hevc", True)])
def test_skipping_unwanted_non_reference_samples(codec, layered):
    _, track, samples, refs = stream(codec, layered)
    n = len(samples)
    assert 0 < int((~refs).sum()) < n
    assert refs[track.keyframes].all()
    full = decode(codec, track, samples, np.ones(n, bool))
    assert sorted(full) == list(range(track.n))
    rng = np.random.default_rng(7)
    for trial in range(6):
        wanted = rng.random(n) < (0.1 if trial % 2 else 0.4)
        chosen = refs | wanted
        assert not chosen.all()
        frames = decode(codec, track, samples, chosen)
        for i in np.flatnonzero(wanted):
            assert frames[int(track.display[i])] == full[int(track.display[i])]


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_dropping_a_reference_sample_is_noticed(codec):
    """The check above can fail: drop one reference B/P sample and later frames change."""
    _, track, samples, refs = stream(codec)
    full = decode(codec, track, samples, np.ones(len(samples), bool))
    victim = int(np.flatnonzero(refs & ~track.keyframes)[0])
    chosen = np.ones(len(samples), bool)
    chosen[victim] = False
    frames = decode(codec, track, samples, chosen)
    assert any(frames.get(p) != full[p] for p in full if p != track.display[victim])


@pytest.mark.parametrize("layered", [False, True])
def test_hevc_matches_ffmpeg_disposable_flags(layered):
    """FFmpeg's muxer records libx265's disposable frames in sdtp; the demuxer reports them."""
    data, _, _, refs = stream("hevc", layered)
    with av.open(io.BytesIO(data)) as container:
        disposable = np.array([p.is_disposable for p in container.demux(video=0) if p.size])
    assert not (~refs & ~disposable).any()  # never non-reference where x265 says otherwise
    if layered:
        # x265 also knows that a lower sub-layer's _N picture nobody followed went unused
        assert int((disposable & refs).sum()) <= 2
    else:
        np.testing.assert_array_equal(~refs, disposable)


def nal(header: bytes, body: bytes = b"\x88\x84") -> bytes:
    unit = header + body
    return len(unit).to_bytes(4, "big") + unit


def test_hevc_sub_layer_rules():
    trail_n_tid0 = nal(bytes([0 << 1, 1]))  # TRAIL_N, TemporalId 0
    trail_n_tid2 = nal(bytes([0 << 1, 3]))
    rasl_n = nal(bytes([8 << 1, 1]))
    trail_r = nal(bytes([1 << 1, 1]))
    sps = nal(bytes([33 << 1, 1]))
    sei = nal(bytes([39 << 1, 1]))
    assert not is_reference(trail_n_tid0, "hevc", 4)
    assert is_reference(trail_n_tid0, "hevc", 4, highest_tid=2)  # higher sub-layers may use it
    assert not is_reference(trail_n_tid2, "hevc", 4, highest_tid=2)
    assert not is_reference(sei + rasl_n, "hevc", 4)
    assert is_reference(rasl_n + trail_r, "hevc", 4)
    assert is_reference(sps + trail_n_tid0, "hevc", 4)  # parameter sets are kept
    assert is_reference(sei, "hevc", 4)  # no slice: keep


def test_h264_rules():
    b_nonref = nal(bytes([0x01]))  # nal_ref_idc 0, non-IDR slice
    b_ref = nal(bytes([0x21]))
    idr = nal(bytes([0x65]))
    sei = nal(bytes([0x06]))
    pps = nal(bytes([0x68]))
    assert not is_reference(sei + b_nonref, "h264", 4)
    assert is_reference(b_ref, "h264", 4) and is_reference(idr, "h264", 4)
    assert is_reference(pps + b_nonref, "h264", 4)
    assert is_reference(sei, "h264", 4)
    with pytest.raises(ValueError, match=r"s\.mp4"):
        is_reference(b_nonref[:-1], "h264", 4, where="s.mp4")
    with pytest.raises(ValueError, match=r"av1"):
        is_reference(b_nonref, "av1", 4)


def test_highest_temporal_id():
    assert highest_temporal_id(stream("hevc")[1].prefix) == 0
    assert highest_temporal_id(stream("hevc", True)[1].prefix) == 2
    assert highest_temporal_id(b"") == 0

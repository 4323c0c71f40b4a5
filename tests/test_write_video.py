"""Re-encoding one video for storage (PyAV in process, and the ffmpeg command-line backend),
checked with PyAV's own demuxer and decoder."""

from __future__ import annotations

import io
from functools import cache

import av
import numpy as np
import pytest

from kohakuclip.mp4.boxes import iter_boxes
from kohakuclip.write.ffmpeg_backend import FFMPEG_ENV, encode_video_ffmpeg
from kohakuclip.write.layout import Orientation, stored_size
from kohakuclip.write.settings import EncodeSettings
from kohakuclip.write.video import EncodeError, encode, encode_video
from tests.media import VideoSpec, decode_planes, decode_rgb, frame_rgb, make_video, psnr
from tests.writer_media import luma, stream_facts, tagged_video, upright_reference

DECODERS = {"av1": "libdav1d", "h264": "h264", "hevc": "hevc"}
FAST = {"av1": 10, "h264": "veryfast", "hevc": "veryfast"}


def fast(codec: str, **kw) -> EncodeSettings:
    return EncodeSettings(codec=codec, preset=FAST[codec], **kw)  # type: ignore[arg-type]


@cache
def source(frames: int = 40, width: int = 160, height: int = 96, seed: int = 0) -> bytes:
    return make_video(VideoSpec(width=width, height=height, frames=frames, seed=seed))


def decode_from(data: bytes, start: int) -> list[np.ndarray]:
    """Decode the packets from decode-order position ``start`` on in a fresh decoder; frames
    keyed by display index (pts order)."""
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        packets = [p for p in c.demux(stream) if p.size]
        decoder = av.CodecContext.create(stream.codec_context.name, "r")
        decoder.extradata = stream.codec_context.extradata
        out = {}
        for p in packets[start:]:
            for f in decoder.decode(p):
                out[f.pts] = f.to_ndarray(format="rgb24")
        for f in decoder.decode(None):
            out[f.pts] = f.to_ndarray(format="rgb24")
    return [out[k] for k in sorted(out)]


@pytest.mark.parametrize("codec", ["av1", "h264", "hevc"])
def test_each_codec_stores_every_frame_in_closed_gops(codec: str) -> None:
    src = source()
    video = encode_video(src, fast(codec, crf=20, gop=16))
    facts = stream_facts(video.data)
    assert facts["codec"] == DECODERS[codec]
    assert (facts["width"], facts["height"], facts["frames"], facts["fps"]) == (160, 96, 40, 24.0)
    assert (video.width, video.height, video.frames, video.fps) == (160, 96, 40, 24.0)
    assert facts["pix_fmt"] == "yuv420p"
    assert facts["keyframes"] == [0, 16, 32]
    assert min(psnr(a, b) for a, b in zip(luma(src), luma(video.data), strict=True)) > 33
    stored = decode_rgb(video.data)
    # closed GOPs: decoding from any keyframe alone gives the same frames as a full decode
    for start in facts["keyframes"][1:]:
        alone = decode_from(video.data, start)
        assert len(alone) == 40 - start
        for a, b in zip(alone, stored[start:], strict=True):
            np.testing.assert_array_equal(a, b)


def test_mp4_is_faststart_and_video_only() -> None:
    spec = VideoSpec(width=96, height=64, frames=8)
    data = encode(make_video(spec), codec="h264", preset="veryfast")
    kinds = [box.type for box in iter_boxes(data, 0, len(data))]
    assert kinds.index(b"moov") < kinds.index(b"mdat")
    with av.open(io.BytesIO(data)) as c:
        assert len(c.streams) == 1


def test_av1_defaults_turn_the_loop_filters_off() -> None:
    options = EncodeSettings().encoder_options()
    assert options["preset"] == "6" and options["crf"] == "36"
    params = options["svtav1-params"].split(":")
    for name in ("enable-dlf=0", "enable-cdef=0", "enable-restoration=0", "keyint=16"):
        assert name in params
    with_filters = EncodeSettings(loop_filters=True).encoder_options()["svtav1-params"]
    assert "enable-cdef" not in with_filters


def test_bytes_and_path_give_identical_output(tmp_path) -> None:
    path = tmp_path / "clip.mp4"
    path.write_bytes(source(frames=20))
    settings = fast("av1")
    assert encode_video(str(path), settings).data == encode_video(path.read_bytes(), settings).data


@pytest.mark.parametrize(
    ("width", "height", "cap", "expected"),
    [
        (1280, 720, 512, (910, 512)),  # 910.2 -> nearest even
        (600, 1000, 512, (512, 854)),  # portrait: 853.3 -> 854
        (161, 97, 512, (160, 96)),  # odd, not capped: short side down to even, aspect kept
        (200, 120, 64, (106, 64)),
        (200, 120, 0, (200, 120)),  # no cap
        (320, 240, 1000, (320, 240)),  # never upscaled
    ],
)
def test_stored_size(width, height, cap, expected) -> None:
    assert stored_size(width, height, cap) == expected
    w, h = expected
    assert w % 2 == 0 and h % 2 == 0
    assert abs(w / h - width / height) < 2 / min(w, h) * (width / height) + 1e-9


def test_short_side_cap_and_odd_sizes() -> None:
    odd = make_video(
        VideoSpec(codec="ffv1", container="mkv", width=161, height=97, frames=6, pix_fmt="yuv444p")
    )
    video = encode_video(odd, fast("h264", crf=12))
    assert (video.width, video.height) == (160, 96)
    planes = decode_planes(video.data)[0]
    assert [p.shape for p in planes] == [(96, 160), (48, 80), (48, 80)]
    small = encode_video(source(frames=6), fast("hevc", crf=12, max_short=64))
    facts = stream_facts(small.data)
    assert (facts["width"], facts["height"]) == (106, 64) == (small.width, small.height)
    # the content is the source's, shrunk (OpenCV's area filter as the independent resize)
    import cv2

    for ref, got in zip(decode_rgb(source(frames=6)), decode_rgb(small.data), strict=True):
        assert psnr(cv2.resize(ref, (106, 64), interpolation=cv2.INTER_AREA), got) > 24


@pytest.mark.parametrize(
    ("rotation", "hflip"), [(90, False), (180, False), (270, False), (90, True)]
)
def test_rotation_is_applied_so_frames_are_stored_upright(rotation: int, hflip: bool) -> None:
    src = tagged_video(VideoSpec(width=128, height=80, frames=6), rotation=rotation, hflip=hflip)
    video = encode_video(src, fast("h264", crf=8))
    facts = stream_facts(video.data)
    assert facts["rotation"] == 0
    upright = upright_reference(src, rotation, hflip)
    assert (video.height, video.width) == upright[0].shape[:2]
    stored = decode_rgb(video.data)
    assert min(psnr(a, b) for a, b in zip(upright, stored, strict=True)) > 38
    # and the unrotated pixels would not pass (the check can fail)
    plain = decode_rgb(src)[0]
    if plain.shape == stored[0].shape:
        assert psnr(plain, stored[0]) < 25


def test_display_matrix_orientation() -> None:
    # FFmpeg's matrices for a 90 degree counter-clockwise turn and a mirror
    assert Orientation.from_display_matrix([0, -65536, 0, 65536, 0, 0, 0, 0, 1 << 30]) == (
        Orientation(transpose=True, hflip=False, vflip=True)
    )
    assert Orientation.from_display_matrix([-65536, 0, 0, 0, 65536, 0, 0, 0, 1 << 30]) == (
        Orientation(transpose=False, hflip=True, vflip=False)
    )


def test_untagged_sources_are_tagged_by_size_and_tagged_ones_kept() -> None:
    sd = encode_video(source(frames=4), fast("h264"))
    facts = stream_facts(sd.data)
    assert sd.colorspace == "bt601"
    assert (facts["colorspace"], facts["color_range"]) == (6, 1)  # SMPTE 170M, limited
    hd_source = make_video(VideoSpec(width=1280, height=720, frames=3))
    hd = encode_video(hd_source, fast("h264", max_short=64))
    assert hd.colorspace == "bt709" and stream_facts(hd.data)["colorspace"] == 1
    tagged = tagged_video(VideoSpec(width=160, height=96, frames=4), colorspace=1)
    kept = encode_video(tagged, fast("h264", crf=10))
    assert kept.colorspace == "bt709" and stream_facts(kept.data)["colorspace"] == 1
    # the pixels keep their BT.709 meaning: decoding with the tag gives the source colours
    for a, b in zip(decode_rgb(tagged), decode_rgb(kept.data), strict=True):
        assert psnr(a, b) > 38


@pytest.mark.parametrize("codec", ["av1", "hevc"])
def test_full_range_sources_are_stored_limited_range(codec: str) -> None:
    full = tagged_video(VideoSpec(width=160, height=96, frames=4), color_range=2)
    assert stream_facts(full)["color_range"] == 2
    video = encode_video(full, fast(codec, crf=10))
    facts = stream_facts(video.data)
    assert (facts["pix_fmt"], facts["color_range"]) == ("yuv420p", 1)
    for y_full, y in zip(luma(full), luma(video.data), strict=True):
        expected = np.round(16 + y_full.astype(np.float64) * 219 / 255)
        assert psnr(expected, y) > 40
        assert psnr(y_full, y) < psnr(expected, y) - 8  # a copy of full-range values fails


@pytest.mark.parametrize("codec", ["av1", "hevc"])
def test_10_bit_422_sources_are_stored_8_bit_420(codec: str) -> None:
    deep = make_video(
        VideoSpec(codec="hevc", width=160, height=96, frames=4, pix_fmt="yuv422p10le")
    )
    video = encode_video(deep, fast(codec, crf=10))
    facts = stream_facts(video.data)
    assert (facts["pix_fmt"], facts["color_range"]) == ("yuv420p", 1)
    assert [p.shape for p in decode_planes(video.data)[0]] == [(96, 160), (48, 80), (48, 80)]
    for y10, y in zip(luma(deep), luma(video.data), strict=True):
        assert y10.dtype == np.uint16
        assert psnr(y10.astype(np.float64) / 4, y) > 40


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: b"this is not a video at all" * 50, "cannot open"),
        (lambda: b"", "cannot open"),
        (lambda: source(frames=20)[:1500], "encoding failed|cannot|no decodable"),
    ],
)
def test_bad_sources_raise_naming_the_source(make, message) -> None:
    with pytest.raises(EncodeError, match=rf"broken\.mp4: ({message})"):
        encode_video(make(), fast("h264"), name="broken.mp4")


def test_source_without_video_stream() -> None:
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("aac", rate=48000)
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 1024), np.float32), format="fltp", layout="mono"
        )
        frame.rate = 48000
        out.mux(stream.encode(frame))
        out.mux(stream.encode(None))
    with pytest.raises(EncodeError, match=r"song\.m4a: no video stream"):
        encode_video(buf.getvalue(), name="song.m4a")


@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_ffmpeg_backend_matches_the_native_one(codec: str, tmp_path) -> None:
    src = tagged_video(VideoSpec(width=128, height=80, frames=20), rotation=90)
    native = encode_video(src, fast(codec, crf=14))
    path = tmp_path / "rotated.mp4"
    path.write_bytes(src)
    for given in (str(path), src):
        cli = encode_video_ffmpeg(given, fast(codec, crf=14))
        facts = stream_facts(cli.data)
        assert (cli.width, cli.height, cli.frames, cli.fps) == (80, 128, 20, 24.0)
        assert (facts["width"], facts["height"], facts["frames"]) == (80, 128, 20)
        assert (facts["colorspace"], facts["color_range"], facts["rotation"]) == (6, 1, 0)
        assert facts["keyframes"] == stream_facts(native.data)["keyframes"] == [0, 16]
        kinds = [box.type for box in iter_boxes(cli.data, 0, len(cli.data))]
        assert kinds.index(b"moov") < kinds.index(b"mdat")
        upright = upright_reference(src, 90)
        for a, b in zip(upright, decode_rgb(cli.data), strict=True):
            assert psnr(a, b) > 32


def test_ffmpeg_backend_errors(monkeypatch) -> None:
    with pytest.raises(EncodeError, match=r"junk\.bin: cannot open"):
        encode_video_ffmpeg(b"junk" * 100, name="junk.bin")
    monkeypatch.setenv(FFMPEG_ENV, "/nonexistent/ffmpeg")
    with pytest.raises(EncodeError, match=r"clip\.mp4: cannot run ffmpeg"):
        encode_video_ffmpeg(source(frames=4), name="clip.mp4")


def test_rgb_sources_become_bt601_yuv() -> None:
    spec = VideoSpec(codec="png", container="mov", width=160, height=96, frames=3, pix_fmt="rgb24")
    video = encode_video(make_video(spec), fast("hevc", crf=4))
    assert (video.colorspace, stream_facts(video.data)["colorspace"]) == ("bt601", 6)
    for i, y in enumerate(luma(video.data)):
        rgb = frame_rgb(spec, i).astype(np.float64)
        bt601 = 16 + (65.481 * rgb[..., 0] + 128.553 * rgb[..., 1] + 24.966 * rgb[..., 2]) / 255
        bt709 = 16 + (46.559 * rgb[..., 0] + 156.629 * rgb[..., 1] + 15.812 * rgb[..., 2]) / 255
        assert psnr(bt601, y) > 40
        assert psnr(bt709, y) < psnr(bt601, y) - 10


def test_other_matrices_are_converted() -> None:
    bt2020 = tagged_video(VideoSpec(width=160, height=96, frames=3), colorspace=9)
    assert stream_facts(bt2020)["colorspace"] == 9
    for encoder in (encode_video, encode_video_ffmpeg):
        video = encoder(bt2020, fast("h264", crf=4))
        assert (video.colorspace, stream_facts(video.data)["colorspace"]) == ("bt601", 6)
        for a, b in zip(decode_rgb(bt2020), decode_rgb(video.data), strict=True):
            assert psnr(a, b) > 36  # only retagging the values would give about 32 dB

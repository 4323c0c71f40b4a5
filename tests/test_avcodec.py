"""libavcodec's send / receive primitives (``decode/_avcodec``) against PyAV decoding the same
packets (their slow twin): identical planes, timestamps and formats for H.264, HEVC and lowres
MJPEG, GOP by GOP; the same outcome on corrupt input; Annex B against its Python twin."""

from __future__ import annotations

import io
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import av
import numba
import numpy as np
import pytest
from PIL import Image

from kohakuclip.codecs.annexb import AnnexBError, to_annexb
from kohakuclip.decode import _avcodec
from kohakuclip.decode._avcodec import (
    AGAIN,
    CORRUPT,
    END,
    FORMAT,
    FULL_RANGE,
    GRAY,
    HEIGHT,
    OK,
    OTHER,
    PICTURE_FIELDS,
    PTS,
    RGB,
    WIDTH,
    Y_ADDRESS,
    Y_STRIDE,
    AvcodecDecoder,
    AvcodecError,
    annexb,
    decode_packets,
    flush,
    receive_frame,
    send_packet,
)
from kohakuclip.decode.video import padded_packet
from kohakuclip.mp4.moov import parse_mp4_bytes
from tests.media import VideoSpec, make_video

Frame = tuple[int, tuple[np.ndarray, ...]]


@dataclass(frozen=True)
class Stream:
    codec: str
    prefix: bytes  # Annex B parameter sets (from avcC / hvcC)
    length_size: int
    gops: list[list[tuple[bytes, int]]]  # per GOP: (length-prefixed sample, display index)


def _stream(codec: str, spec: VideoSpec) -> Stream:
    data = make_video(spec)
    track = parse_mp4_bytes(data)
    gops: list[list[tuple[bytes, int]]] = []
    for i, (offset, size) in enumerate(zip(track.offsets, track.sizes)):
        if track.keyframes[i]:
            gops.append([])
        gops[-1].append((data[int(offset) : int(offset) + int(size)], int(track.display[i])))
    return Stream(codec, track.prefix, track.nal_length_size, gops)


@pytest.fixture(scope="module")
def streams() -> dict[str, Stream]:
    assert _avcodec.library() is not None
    return {
        # B-pyramid, GOP 16, odd macroblock count
        "h264": _stream("h264", VideoSpec(codec="h264", width=98, height=70, frames=40)),
        # tiny x265 sizes crash: 96x64 is the smallest used here
        "hevc": _stream("hevc", VideoSpec(codec="hevc", width=96, height=64, frames=34, seed=3)),
    }


def _pyav(codec: str, packets: list[tuple[bytes, int]], lowres: int = 0) -> list[Any]:
    """PyAV decoding whole packets (drained): its frames, in output order."""
    ctx: Any = av.CodecContext.create(codec, "r")
    ctx.thread_count = 1
    if codec == "mjpeg":  # as AvcodecDecoder opens it
        ctx.options = {"lowres": str(lowres), "err_detect": "explode"}
    frames = []
    for data, pts in packets:
        packet = padded_packet(data)
        packet.pts = pts
        frames += ctx.decode(packet)
    return frames + ctx.decode(None)


def _planes(frame: Any) -> tuple[np.ndarray, ...]:
    out = []
    for k, plane in enumerate(frame.planes):
        rows = frame.height if k == 0 else plane.height
        out.append(np.frombuffer(plane, np.uint8).reshape(rows, plane.line_size)[:, : plane.width])
    return tuple(out)


def _annexb_gop(stream: Stream, gop: list[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
    """How decode/video.py feeds PyAV: Annex B samples, parameter sets before the first."""
    return [
        ((stream.prefix if k == 0 else b"") + to_annexb(sample, stream.length_size), pts)
        for k, (sample, pts) in enumerate(gop)
    ]


def _assert_same(ours: list[tuple[int, np.ndarray, Any, Any]], pyav: list[Any]) -> None:
    assert [pts for pts, *_ in ours] == [int(f.pts) for f in pyav]
    for (pts, *planes), frame in zip(ours, pyav):
        theirs = _planes(frame)
        got = [p for p in planes if p is not None]
        assert len(got) == len(theirs), pts
        for a, b in zip(got, theirs):
            np.testing.assert_array_equal(a, b, err_msg=f"pts {pts}")


def test_layout_check_passes_on_this_pyav() -> None:
    assert _avcodec.layout() == ()
    lib = _avcodec.library()
    assert lib is not None
    assert lib.version == tuple(av.library_versions["libavcodec"])


def test_a_failed_check_warns_once_and_turns_the_path_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_avcodec, "_checked", [])
    monkeypatch.setattr(_avcodec, "layout", lambda: ("AVFrame.pts reads 7",))
    with pytest.warns(RuntimeWarning, match=r"AVFrame\.pts reads 7"):
        assert _avcodec.library() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _avcodec.library() is None
    with pytest.raises(AvcodecError, match="unavailable"):
        AvcodecDecoder("h264")


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_gop_by_gop_equals_pyav_bit_for_bit(streams: dict[str, Stream], codec: str) -> None:
    stream = streams[codec]
    assert len(stream.gops) >= 3
    order = [1, 0, len(stream.gops) - 1, 1]  # flushed between GOPs, taken out of order
    with AvcodecDecoder(codec) as decoder:  # type: ignore[arg-type]
        for g in order:
            gop = stream.gops[g]
            ours = decode_packets(decoder, gop, stream.prefix, stream.length_size)
            pyav = _pyav(codec, _annexb_gop(stream, gop))
            shown = sorted(pts for pts, *_ in ours)
            if codec == "h264":  # closed GOPs; x265's open GOPs drop the leading pictures
                assert shown == sorted(pts for _, pts in gop)
            assert shown and set(shown) <= {pts for _, pts in gop}
            _assert_same(ours, pyav)


@numba.njit(nogil=True, cache=True)
def _decode_gop(
    handle: np.ndarray, buf: np.ndarray, ends: np.ndarray, stamps: np.ndarray, luma: np.ndarray
) -> int:
    """How the per-clip driver calls the primitives from compiled code: send each packet,
    take every frame, copy its Y plane into ``luma[pts]``. Returns frames, or a status."""
    picture = np.zeros(PICTURE_FIELDS, np.int64)
    start = 0
    frames = 0
    for k in range(len(ends) + 1):
        drain = k == len(ends)
        while True:
            if drain:
                status = send_packet(handle, 0, 0, 0)
            else:
                status = send_packet(handle, buf[start:].ctypes.data, ends[k] - start, stamps[k])
            while True:
                got = receive_frame(handle, picture)
                if got != OK:
                    break
                frames += 1
                rows, cols = luma.shape[1], luma.shape[2]
                y = numba.carray(
                    _avcodec._voidptr(picture[Y_ADDRESS]), (rows, picture[Y_STRIDE]), np.uint8
                )
                luma[picture[PTS]] = y[:, :cols]
            if got < 0:
                return got
            if status != AGAIN:
                break
        if status < 0 and status != END:
            return status
        if not drain:
            start = ends[k]
    flush(handle)
    return frames


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_compiled_caller_decodes_a_gop_like_pyav(streams: dict[str, Stream], codec: str) -> None:
    stream = streams[codec]
    gop = _annexb_gop(stream, stream.gops[0])
    pyav = _pyav(codec, gop)
    height, width = _planes(pyav[0])[0].shape
    buf = np.frombuffer(b"".join(data for data, _ in gop), np.uint8)
    ends = np.cumsum([len(data) for data, _ in gop]).astype(np.int64)
    stamps = np.array([pts for _, pts in gop], np.int64)
    luma = np.zeros((int(stamps.max()) + 1, height, width), np.uint8)
    with AvcodecDecoder(codec) as decoder:  # type: ignore[arg-type]
        assert _decode_gop(decoder.handle, buf, ends, stamps, luma) == len(gop)
    for frame in pyav:
        np.testing.assert_array_equal(luma[frame.pts], _planes(frame)[0])


def test_threads_decode_side_by_side(streams: dict[str, Stream]) -> None:
    stream = streams["h264"]

    def run(g: int) -> list[tuple[int, np.ndarray, Any, Any]]:
        with AvcodecDecoder("h264") as decoder:
            return decode_packets(decoder, stream.gops[g], stream.prefix, stream.length_size)

    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(run, [0, 1, 0, 1]))
    for g, result in zip([0, 1, 0, 1], together):
        _assert_same(result, _pyav("h264", _annexb_gop(stream, stream.gops[g])))


def _jpegs(width: int, height: int) -> list[tuple[bytes, str]]:
    """Pillow JPEGs at 4:2:0, 4:2:2, 4:4:4 and gray, with the PyAV format each decodes to."""
    rng = np.random.default_rng(4)
    yy, xx = np.mgrid[0:height, 0:width]
    rgb = np.dstack([(xx * 5 + yy * 2) % 256, (yy * 7) % 256, rng.integers(0, 256, yy.shape)])
    image = Image.fromarray(rgb.astype(np.uint8))
    out = []
    for mode, subsampling, fmt in (
        ("RGB", 2, "yuvj420p"),
        ("RGB", 1, "yuvj422p"),
        ("RGB", 0, "yuvj444p"),
        ("L", 0, "gray"),
    ):
        buf = io.BytesIO()
        image.convert(mode).save(buf, "JPEG", quality=85, subsampling=subsampling)
        out.append((buf.getvalue(), fmt))
    return out


@pytest.mark.parametrize("lowres", [0, 1, 2, 3])
def test_lowres_mjpeg_equals_pyav(lowres: int) -> None:
    jpegs = _jpegs(101, 67)
    packets = [(data, k) for k, (data, _) in enumerate(jpegs)]
    pyav = _pyav("mjpeg", packets, lowres)
    assert [f.format.name for f in pyav] == [fmt for _, fmt in jpegs]
    with AvcodecDecoder("mjpeg", lowres) as decoder:
        ours = decode_packets(decoder, packets, length_size=0)
        _assert_same(ours, pyav)
        # the picture record: size, format code, full range
        picture = np.zeros(PICTURE_FIELDS, np.int64)
        for (data, fmt), frame in zip(jpegs, pyav):
            buf = np.frombuffer(data, np.uint8)
            assert send_packet(decoder.handle, buf.ctypes.data, len(buf), 9) == OK
            assert receive_frame(decoder.handle, picture) == OK
            assert receive_frame(decoder.handle, picture) == AGAIN
            assert (picture[PTS], picture[WIDTH], picture[HEIGHT]) == (
                9,
                frame.width,
                frame.height,
            )
            assert -(-101 // 2**lowres) == frame.width
            codes = {"yuvj420p": 0, "yuvj422p": 1, "yuvj444p": 2, "gray": GRAY}
            assert picture[FORMAT] == codes[fmt]
            assert picture[FULL_RANGE] == 1 and picture[CORRUPT] == 0
        flush(decoder.handle)


def test_pngs_of_one_size_in_a_row_decode_as_pillow_does() -> None:
    """RGB and gray PNGs, several of one size and format in a row: each decodes whole, as
    Pillow decodes it (libavcodec takes a packet without the key-frame flag, of the last
    picture's size and format, as a difference to that picture)."""
    rng = np.random.default_rng(4)
    images = [Image.fromarray(rng.integers(0, 256, (45, 61, 3), dtype=np.uint8)) for _ in range(3)]
    images += [images[0].convert("L"), images[1].convert("L"), images[2]]
    packets = []
    for k, image in enumerate(images):
        buf = io.BytesIO()
        image.save(buf, "PNG")
        packets.append((buf.getvalue(), k))
    with AvcodecDecoder("png") as decoder:
        frames = decode_packets(decoder, packets, length_size=0)
        for (data, _), (_, y, u, v) in zip(packets, frames, strict=True):
            pillow = np.asarray(Image.open(io.BytesIO(data)))
            assert u is None and v is None
            np.testing.assert_array_equal(y, pillow.reshape(45, -1))
        picture = np.zeros(PICTURE_FIELDS, np.int64)
        buf = np.frombuffer(packets[0][0], np.uint8)
        assert send_packet(decoder.handle, buf.ctypes.data, len(buf), 3) == OK
        assert receive_frame(decoder.handle, picture) == OK
        assert (picture[FORMAT], picture[WIDTH], picture[HEIGHT]) == (RGB, 61, 45)
        assert picture[Y_STRIDE] >= 3 * 61
        flush(decoder.handle)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="vp9"):
        AvcodecDecoder("vp9")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lowres"):
        AvcodecDecoder("h264", lowres=1)
    with pytest.raises(ValueError, match="lowres"):
        AvcodecDecoder("mjpeg", lowres=4)
    decoder = AvcodecDecoder("mjpeg")
    handle = decoder.handle
    decoder.close()
    decoder.close()
    assert not handle.any()  # a closed decoder: the primitives refuse, nothing crashes
    assert send_packet(handle, 0, 0, 0) < 0
    assert receive_frame(handle, np.zeros(PICTURE_FIELDS, np.int64)) < 0


def _fix_length(sample: bytes, keep: int) -> bytes:
    """A sample's first ``keep`` bytes after its first length field, as one NAL unit (the
    length field rewritten): a picture cut short, framed correctly."""
    return keep.to_bytes(4, "big") + sample[4 : 4 + keep]


def _ours_summary(
    decoder: AvcodecDecoder, packets: list[tuple[bytes, int]], prefix: bytes, length_size: int
) -> tuple[Any, ...]:
    """What a decode gave: per frame (pts, plane shapes, flagged corrupt), or that it failed.
    Pixels are left out: where a damaged picture was not decoded, its buffer holds whatever
    the decoder's pool held before."""
    try:
        got = _avcodec._decode(decoder, packets, prefix, length_size)
    except AvcodecError:
        return ("error",)
    return (
        "frames",
        [
            (int(pic[PTS]), [p.shape for p in planes if p is not None], bool(pic[CORRUPT]))
            for pic, *planes in got
        ],
    )


def _pyav_summary(codec: str, packets: list[tuple[bytes, int]]) -> tuple[Any, ...]:
    try:
        got = _pyav(codec, packets)
    except av.FFmpegError:
        return ("error",)
    return ("frames", [(int(f.pts), [p.shape for p in _planes(f)], f.is_corrupt) for f in got])


@pytest.mark.parametrize("codec", ["h264", "hevc"])
def test_corrupt_input_gives_what_pyav_gives_and_the_decoder_recovers(
    streams: dict[str, Stream], codec: str
) -> None:
    stream = streams[codec]
    gop = stream.gops[0]
    rng = np.random.default_rng(11)
    flipped = []
    for sample, pts in gop:
        damaged = bytearray(sample)
        for at in rng.integers(8, len(damaged), 6):
            damaged[at] = int(rng.integers(0, 256))
        flipped.append((bytes(damaged), pts))
    first = gop[0][0]
    cases = {
        "no parameter sets": (gop, b""),
        "bytes changed": (flipped, stream.prefix),
        "keyframe cut short": ([(_fix_length(first, 40), gop[0][1]), *gop[1:]], stream.prefix),
        "P-frame cut short": (
            [gop[0], (_fix_length(gop[1][0], len(gop[1][0]) // 2), gop[1][1]), *gop[2:]],
            stream.prefix,
        ),
        "garbage": ([((200).to_bytes(4, "big") + rng.bytes(200), 0)], stream.prefix),
    }
    clean = _pyav(codec, _annexb_gop(stream, stream.gops[1]))
    outcomes = {}
    for name, (packets, prefix) in cases.items():
        # fresh decoders on both sides: parameter sets outlive a flush
        with AvcodecDecoder(codec) as decoder:  # type: ignore[arg-type]
            ours = _ours_summary(decoder, packets, prefix, stream.length_size)
            broken = Stream(codec, prefix, stream.length_size, [packets])
            assert ours == _pyav_summary(codec, _annexb_gop(broken, packets)), name
            outcomes[name] = ours
            # the decoder was flushed: a clean GOP decodes exactly
            again = decode_packets(decoder, stream.gops[1], stream.prefix, stream.length_size)
            _assert_same(again, clean)
    # H.264 rejects slices without parameter sets (an error status); HEVC drops them
    assert outcomes["no parameter sets"] == (("error",) if codec == "h264" else ("frames", []))
    if codec == "h264":  # the damaged picture is flagged (AVFrame.decode_error_flags)
        assert any(corrupt for *_, corrupt in outcomes["P-frame cut short"][1])


def test_corrupt_jpeg_gives_what_pyav_gives_and_the_decoder_recovers() -> None:
    (good, _), *_ = _jpegs(64, 48)
    clean = _pyav("mjpeg", [(good, 0)])
    garbage = b"\xff\xd8" + bytes(range(200))
    outcomes = []
    with AvcodecDecoder("mjpeg") as decoder:
        for bad in (garbage, good[: len(good) // 3], good[:400] + bytes(300), b"\x00" * 16):
            ours = _ours_summary(decoder, [(bad, 0)], b"", 0)
            assert ours == _pyav_summary("mjpeg", [(bad, 0)])
            outcomes.append(ours[0])
            _assert_same(decode_packets(decoder, [(good, 0)], length_size=0), clean)
        buf = np.frombuffer(garbage, np.uint8)
        assert send_packet(decoder.handle, buf.ctypes.data, len(buf), 0) < 0
        flush(decoder.handle)
    assert outcomes == ["error"] * 4  # err_detect=explode: every damaged picture is an error


def test_unsupported_pixel_format_is_flagged() -> None:
    encoder: Any = av.CodecContext.create("libx264", "w")
    encoder.width, encoder.height, encoder.pix_fmt = 64, 48, "yuv420p10le"
    encoder.time_base = Fraction(1, 24)
    frame = av.VideoFrame(64, 48, "yuv420p10le")
    frame.pts = 0
    packets = [bytes(p) for p in [*encoder.encode(frame), *encoder.encode(None)]]
    with AvcodecDecoder("h264") as decoder:
        buf = np.frombuffer(packets[0], np.uint8)
        assert send_packet(decoder.handle, buf.ctypes.data, len(buf), 0) == OK
        assert send_packet(decoder.handle, 0, 0, 0) == OK
        picture = np.zeros(PICTURE_FIELDS, np.int64)
        assert receive_frame(decoder.handle, picture) == OK
        assert picture[FORMAT] == OTHER and (picture[WIDTH], picture[HEIGHT]) == (64, 48)
        assert receive_frame(decoder.handle, picture) == END
        flush(decoder.handle)
        with pytest.raises(AvcodecError, match="8-bit"):
            decode_packets(decoder, [(packets[0], 0)], length_size=0)


def _annexb(sample: bytes, length_size: int, capacity: int | None = None) -> bytes | int:
    src = np.frombuffer(sample, np.uint8)
    dst = np.zeros(4 * len(sample) + 8 if capacity is None else capacity, np.uint8)
    n = annexb(src.ctypes.data if len(src) else 0, len(src), length_size, dst)
    return n if n < 0 else dst[:n].tobytes()


@pytest.mark.parametrize("length_size", [1, 2, 3, 4])
def test_annexb_equals_its_python_twin(length_size: int) -> None:
    rng = np.random.default_rng(length_size)
    for _ in range(30):
        units = [bytes(rng.integers(0, 256, int(n), np.uint8)) for n in rng.integers(0, 60, 4)]
        sample = b"".join(len(u).to_bytes(length_size, "big") + u for u in units)
        assert _annexb(sample, length_size) == to_annexb(sample, length_size)
        cut = sample[: int(rng.integers(1, len(sample)))] if len(sample) > 1 else b"\x05"
        try:
            want: bytes | int = to_annexb(cut, length_size)
        except AnnexBError:
            want = -1
        assert _annexb(cut, length_size) == want
    assert _annexb(b"", length_size) == to_annexb(b"", length_size) == b""


def test_annexb_on_real_samples_and_limits(streams: dict[str, Stream]) -> None:
    for stream in streams.values():
        for gop in stream.gops:
            for sample, _ in gop:
                want = to_annexb(sample, stream.length_size)
                assert _annexb(sample, stream.length_size) == want
                assert _annexb(sample, stream.length_size, len(want)) == want
                assert _annexb(sample, stream.length_size, len(want) - 1) == -2
    assert _annexb(b"\x00\x00\x00\x01\x65", 5) == -3

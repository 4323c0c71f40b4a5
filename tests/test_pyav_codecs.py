"""VP9 (``vp09``) and MPEG-4 Part 2 (``mp4v``) in mp4: read through the PyAV decoder from each
clip's keyframe, the same pixels as PyAV decoding the whole file; other codecs name themselves."""

from __future__ import annotations

import io
import os

import av
import numpy as np
import pytest

from kohakuclip import ClipError, Reader, pack
from kohakuclip.mp4.moov import UnsupportedVideo, parse_mp4_bytes
from kohakuclip.write.pack import PackError
from tests.fmp4_media import remux
from tests.media import VideoSpec, decode_planes, make_video, psnr
from tests.test_mp4 import assert_matches_pyav

SIZE = 64
VP9 = {"g": "8", "cpu-used": "8"}
SPECS = {
    "vp9": VideoSpec(codec="libvpx-vp9", width=96, height=64, frames=24, options=VP9),
    "mpeg4_bframes": VideoSpec(
        codec="mpeg4", width=96, height=64, frames=24, options={"g": "8", "bf": "2"}
    ),
    "mpeg4": VideoSpec(codec="mpeg4", width=96, height=64, frames=24, seed=3, options={"g": "8"}),
}


@pytest.fixture(scope="module")
def media() -> dict[str, bytes]:
    out = {name: make_video(spec) for name, spec in SPECS.items()}
    out["vp9_fragmented"] = remux(out["vp9"], "frag_keyframe+empty_moov+default_base_moof")
    return out


@pytest.mark.parametrize("name", ["vp9", "mpeg4_bframes", "mpeg4", "vp9_fragmented"])
def test_tables_match_pyav(media: dict[str, bytes], name: str) -> None:
    data = media[name]
    track = parse_mp4_bytes(data, where=name)
    assert track.codec == name.split("_")[0]
    assert_matches_pyav(data, track)
    assert track.prefix == b"" and track.nal_length_size == 0
    with av.open(io.BytesIO(data)) as container:
        extradata = container.streams.video[0].codec_context.extradata
    if track.codec == "mpeg4":
        assert track.config == extradata and track.config.startswith(b"\0\0\1\xb0")  # VOS
    else:
        assert track.config[0] == 1 and len(track.config) == 12  # vpcC version 1
    if name == "mpeg4_bframes":
        assert not np.array_equal(track.display, np.arange(track.n))
    assert track.keyframes.sum() >= 3 and not track.keyframes.all()


def test_clips_equal_pyav_full_decode(media: dict[str, bytes], tmp_path) -> None:
    """Clips across GOPs, repeated and unordered frames, both skip modes, two threads, videos
    of different configurations in one batch: all three planes equal PyAV's full decode."""
    for name, data in media.items():
        (tmp_path / f"{name}.mp4").write_bytes(data)
    shown = {name: decode_planes(data) for name, data in media.items()}
    frames = [[0, 5, 23, 9, 12, 3, 17, 16], [22, 1, 1, 8, 15, 7, 20, 11]]
    c = (SIZE + 1) // 2
    for skip in (True, False):
        with Reader(
            str(tmp_path), size=SIZE, crop="center", mode="yuv_resized", threads=2, skip=skip
        ) as reader:
            names = [reader.info(v).member.removesuffix(".mp4") for v in range(len(reader))]
            items = [(v, f) for v in range(len(reader)) for f in frames]
            batch = reader.read(items)
            for (vid, wanted), clip in zip(items, batch.video):
                info = reader.info(vid)
                assert (info.n, info.fps, info.width, info.height) == (24, 24.0, 96, 64)
                assert info.codec == names[vid].split("_")[0]
                for t, f in enumerate(wanted):
                    y, u, v = shown[names[vid]][f]
                    luma = clip[t, : SIZE * SIZE].reshape(SIZE, SIZE)
                    assert np.array_equal(luma, y[:, 16:80]), (names[vid], f, skip)
                    chroma = clip[t, SIZE * SIZE :].reshape(2, c, c)
                    assert np.array_equal(chroma[0], u[:, 8:40]), (names[vid], f)
                    assert np.array_equal(chroma[1], v[:, 8:40]), (names[vid], f)
    for name in ("vp9", "mpeg4"):  # keyframes 0, 8, 16: frame 20 decodes 16..20
        with Reader(str(tmp_path), size=SIZE) as reader:
            reader.read([(names.index(name), [20])])
            assert reader.stats()["frames_decoded"] == 5


def test_other_codecs_name_file_and_codec(media: dict[str, bytes], tmp_path) -> None:
    mpeg2 = make_video(VideoSpec(codec="mpeg2video", width=96, height=64, frames=4))
    (tmp_path / "m2v.mp4").write_bytes(mpeg2)
    with pytest.raises(UnsupportedVideo, match=r"m2v\.mp4: unsupported video codec 'mpeg2video'"):
        parse_mp4_bytes(mpeg2, where="m2v.mp4")
    with Reader(str(tmp_path), size=32) as reader:
        with pytest.raises(ClipError, match=r"m2v\.mp4.*'mpeg2video'"):
            reader.read([(0, [0])])
        with pytest.raises(ValueError, match=r"m2v\.mp4.*'mpeg2video'"):
            reader.info(0)
    for name in ("vp9", "mpeg4"):  # the index holds av1 / h264 / hevc: a folder reads them
        with pytest.raises(PackError, match=rf"s\.zip:{name}\.mp4: a shard index holds .*'{name}'"):
            pack(tmp_path / "s.zip", [(f"{name}.mp4", media[name])])


def test_write_cli_takes_fragmented_vp9_and_mpeg4_sources(
    media: dict[str, bytes], tmp_path
) -> None:
    """``kohakuclip-write`` re-encodes them; the shards read back as the sources decode."""
    from kohakuclip.write import cli

    sources = tmp_path / "sources"
    sources.mkdir()
    plain = make_video(VideoSpec(width=96, height=64, frames=24, options={"g": "8"}))
    files = {"vp9.mp4": media["vp9"], "mpeg4.mp4": media["mpeg4_bframes"]}
    files["fragmented.mp4"] = remux(plain, "frag_every_frame+empty_moov+default_base_moof")
    files["vp9_fragmented.mp4"] = media["vp9_fragmented"]
    for name, data in files.items():
        (sources / name).write_bytes(data)
    out = tmp_path / "out"
    args = [str(out), str(sources), "--codec", "h264", "--crf", "8", "--preset", "ultrafast"]
    assert cli.main([*args, "--workers", "1", "--quiet"]) == 0
    shards = sorted(str(p) for p in out.glob("shard_*.zip"))
    frames = [0, 7, 8, 23, 12]
    with Reader(shards, size=SIZE, crop="center", mode="yuv_resized") as reader:
        assert sorted(reader.info(v).member for v in range(len(reader))) == sorted(files)
        for vid in range(len(reader)):
            info = reader.info(vid)
            assert (info.n, info.fps, info.codec) == (24, 24.0, "h264")
            shown = decode_planes(files[info.member])
            clip = reader.read([(vid, frames)]).video[0]
            for t, f in enumerate(frames):
                luma = clip[t, : SIZE * SIZE].reshape(SIZE, SIZE)
                assert psnr(luma, shown[f][0][:, 16:80]) > 40, (info.member, f)


def test_more_configurations_than_kept_decoders(tmp_path) -> None:
    """Six MPEG-4 videos, six VOL headers, one thread keeping four decoders: clips alternate
    between them (decoders dropped and made again) and still equal PyAV's decode."""
    shown = {}
    for k, width in enumerate(range(64, 160, 16)):
        spec = VideoSpec(
            codec="mpeg4", width=width, height=64, frames=8, seed=k, options={"g": "4"}
        )
        data = make_video(spec)
        (tmp_path / f"w{width}.mp4").write_bytes(data)
        shown[f"w{width}.mp4"] = decode_planes(data)
    frames = [6, 1, 3]
    with Reader(str(tmp_path), size=SIZE, crop="center", mode="yuv_resized", threads=1) as r:
        assert len({r.info(v).width for v in range(len(r))}) == 6
        items = [(v, frames) for _ in range(2) for v in range(len(r))]
        batch = r.read(items)
        for (vid, wanted), clip in zip(items, batch.video):
            info = r.info(vid)
            x = (info.width - SIZE) // 2
            for t, f in enumerate(wanted):
                luma = clip[t, : SIZE * SIZE].reshape(SIZE, SIZE)
                assert np.array_equal(luma, shown[info.member][f][0][:, x : x + SIZE])


def test_packets_end_in_zero_padding(media: dict[str, bytes], tmp_path) -> None:
    """FFmpeg decoders may read 64 bytes past a packet (AV_INPUT_BUFFER_PADDING_SIZE), which must
    be zeros. PyAV wraps a buffer without copying, so a packet cut from the GOP read had the next
    sample there, or stray heap bytes after the last one (MPEG-4 then concealed the bottom of
    that frame, now and then): each packet now owns a padded copy."""
    import ctypes

    from kohakuclip.decode.video import ClipDecoder
    from kohakuclip.read.plan import plan_clip
    from kohakuclip.storage.video_catalog import Catalog

    (tmp_path / "m.mp4").write_bytes(media["mpeg4"])
    catalog = Catalog([str(tmp_path)])
    track = catalog.track(0)
    plan = plan_clip(track, [3, 7, 12])
    with open(track.path, "rb") as f:

        def read(offset: int, length: int) -> bytes:
            return os.pread(f.fileno(), length, offset)

        packets = [p for p in ClipDecoder()._packets(track, plan, read) if p is not None]
    catalog.close()
    assert len(packets) == plan.packets == 13
    for packet in packets:
        assert ctypes.string_at(packet.buffer_ptr + packet.size, 64) == bytes(64)

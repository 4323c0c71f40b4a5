"""Fragmented mp4 (moof / traf / tfhd / tfdt / trun): the same samples, frames and pixels as the
same packets muxed plainly, whichever way the fragments place their data and give their values."""

from __future__ import annotations

import io
import os
import re
import tarfile
import zipfile

import numpy as np
import pytest

from kohakuclip import ClipError, Reader, pack
from kohakuclip.mp4.boxes import Mp4Error, iter_boxes
from kohakuclip.mp4.moov import parse_mp4, parse_mp4_bytes
from tests.fmp4_media import HAND_LAYOUTS, hand_fragmented, remux, with_edit_list
from tests.media import ENCODER_OPTIONS, VideoSpec, decode_planes, make_video
from tests.test_mp4 import assert_matches_pyav, boxes_at_top, mux, pyav_table

FFMPEG_LAYOUTS = {
    "empty_moov": "frag_keyframe+empty_moov",  # tfhd base-data-offset (absolute)
    "moof_base": "frag_keyframe+empty_moov+default_base_moof",
    "moof_relative": "frag_keyframe+empty_moov+omit_tfhd_offset",  # implicit: the moof
    "every_frame": "frag_every_frame+empty_moov+default_base_moof",
    "moov_samples": "frag_keyframe",  # the first GOP in the moov's own tables
    "global_sidx": "frag_keyframe+empty_moov+default_base_moof+global_sidx",
    "sidx_each": "dash",  # a sidx before every moof
}
SIZE = 64  # the short side: yuv_resized at this size is the stored window, bit for bit
FRAMES = [0, 5, 23, 9, 12, 3, 17, 16]


@pytest.fixture(scope="module")
def media() -> dict[str, bytes]:
    """Plain h264 (B-frames, 3 GOPs) and AV1, and their fragmented twins, by name."""
    plain = make_video(VideoSpec(width=96, height=64, frames=24, options={"g": "8"}))
    av1 = make_video(VideoSpec(codec="av1", width=96, height=64, frames=24))
    out = {"plain": plain, "av1": av1, "av1_every_frame": remux(av1, FFMPEG_LAYOUTS["every_frame"])}
    out.update({name: remux(plain, flags) for name, flags in FFMPEG_LAYOUTS.items()})
    out.update({name: hand_fragmented(plain, name) for name in HAND_LAYOUTS})
    return out


def twin(name: str) -> str:
    return "av1" if name.startswith("av1") else "plain"


def payloads(data: bytes, track) -> list[bytes]:
    return [data[int(o) : int(o) + int(z)] for o, z in zip(track.offsets, track.sizes)]


def assert_same_samples(media: dict[str, bytes], name: str) -> None:
    """Sample bytes, keyframes, display order, frame count and fps equal the plain twin's."""
    track = parse_mp4_bytes(media[name], where=name)
    plain = parse_mp4_bytes(media[twin(name)])
    assert payloads(media[name], track) == payloads(media[twin(name)], plain)
    np.testing.assert_array_equal(track.keyframes, plain.keyframes)
    np.testing.assert_array_equal(track.display, plain.display)
    assert (track.n, track.fps, track.codec) == (plain.n, plain.fps, plain.codec)
    assert track.prefix == plain.prefix and track.nal_length_size == plain.nal_length_size


@pytest.mark.parametrize("name", [*FFMPEG_LAYOUTS, "av1_every_frame"])
def test_ffmpeg_fragments_match_pyav_and_plain(media: dict[str, bytes], name: str) -> None:
    data = media[name]
    top = boxes_at_top(data)
    moofs = top.count(b"moof")
    assert moofs == (24 if "every_frame" in name else 2 if name == "moov_samples" else 3)
    assert (b"sidx" in top) == ("sidx" in name)
    if name == "sidx_each":
        assert top.count(b"sidx") == moofs
    track = parse_mp4_bytes(data, where=name)
    assert_matches_pyav(data, track)
    assert_same_samples(media, name)
    plain = parse_mp4_bytes(media[twin(name)])
    assert not np.array_equal(plain.offsets, track.offsets)  # really another layout


@pytest.mark.parametrize("name", HAND_LAYOUTS)
def test_hand_made_fragments(media: dict[str, bytes], name: str) -> None:
    """trex defaults, tfhd defaults over wrong trex ones, two runs in a traf, two trafs in a
    moof, an absolute base without tfdt: the plain file's samples. FFmpeg reads all but one
    the same; it starts a run without a data offset at the base again (ISO/IEC 14496-12
    8.8.8.1: right after the previous run), so there the plain twin is the only reference."""
    data = media[name]
    assert_same_samples(media, name)
    if name != "two_runs":
        assert_matches_pyav(data)
    else:
        assert pyav_table(data)["offsets"].tolist() != parse_mp4_bytes(data).offsets.tolist()


@pytest.mark.parametrize("edits", [[(800, 1024 + 5 * 512)], [(500, -1), (1000, 1024)]])
def test_edit_list_of_a_fragmented_file_hides_nothing(media: dict[str, bytes], edits) -> None:
    """FFmpeg shows every fragment sample whatever the edit list says (a trim, an empty edit)."""
    data = with_edit_list(media["moof_base"], edits)
    assert b"elst" in data and b"elst" not in media["moof_base"]
    assert_matches_pyav(data)
    assert_same_samples({**media, "edited": data}, "edited")


@pytest.mark.parametrize("every_frame", [False, True])
def test_audio_and_video_fragments(every_frame: bool, tmp_path) -> None:
    """AAC trafs beside the video's, no tfhd base: a traf's data starts where the previous traf's
    (audio or video) ended. One fragment per frame, FFmpeg's muxer gives a sample no duration
    and FFmpeg never shows the next one (its decode time does not advance): neither do we."""
    flags = ("frag_every_frame" if every_frame else "frag_keyframe") + "+empty_moov"
    flags += "+omit_tfhd_offset"
    data = mux(ENCODER_OPTIONS["h264"], audio_first=True, options={"movflags": flags})
    moofs = [b for b in iter_boxes(data) if b.type == b"moof"]
    trafs = [[b.type for b in iter_boxes(data, m.body, m.end)].count(b"traf") for m in moofs]
    assert max(trafs) == (1 if every_frame else 2)
    tfhd_flags = [data[m.start() + 7] for m in re.finditer(b"tfhd", data)]
    assert len(tfhd_flags) == sum(trafs) and not any(f & 1 for f in tfhd_flags)  # no base
    track = parse_mp4_bytes(data)
    assert_matches_pyav(data, track)
    shown = decode_planes(data)
    assert track.n == len(shown) == (23 if every_frame else 24)
    (tmp_path / "av.mp4").write_bytes(data)
    frames = list(range(track.n))
    with Reader(str(tmp_path), size=SIZE, crop="center", mode="yuv_resized") as reader:
        clip = reader.read([(0, frames)]).video[0]
    for f in frames:
        luma = clip[f, : SIZE * SIZE].reshape(SIZE, SIZE)
        assert np.array_equal(luma, shown[f][0][:, 16:80]), f


def test_fragment_walk_reads_little(media: dict[str, bytes]) -> None:
    """One fragment per frame: about one read per 4 KiB window, not one per box."""
    data = media["every_frame"]
    reads = []

    def read_at(offset: int, length: int) -> bytes:
        reads.append(length)
        return data[offset : offset + length]

    track = parse_mp4(read_at, len(data), where="every_frame")
    assert track.n == 24
    assert len(reads) <= 2 + len(data) // 4096 + 24 // 4, reads


def folder_of(root, media: dict[str, bytes]) -> dict[str, str]:
    os.makedirs(root, exist_ok=True)
    for name, data in media.items():
        with open(os.path.join(root, name + ".mp4"), "wb") as f:
            f.write(data)
    return {name: name + ".mp4" for name in media}


def read_all(sources, skip=True) -> dict[str, tuple[np.ndarray, object]]:
    """Each video's clip of FRAMES (yuv_resized at the stored short side) and its info."""
    out = {}
    with Reader(sources, size=SIZE, crop="center", mode="yuv_resized", threads=2, skip=skip) as r:
        batch = r.read([(v, FRAMES) for v in range(len(r))])
        for v in range(len(r)):
            info = r.info(v)
            out[os.path.basename(info.member).removesuffix(".mp4")] = (batch.video[v], info)
    return out


def test_reader_fragmented_equals_plain(media: dict[str, bytes], tmp_path) -> None:
    """Folder, zip and tar (moov fallback) and an indexed shard: every fragmented twin gives
    the plain file's clip, and the plain clip is PyAV's decode (all three planes, exactly)."""
    folder_of(tmp_path / "folder", media)
    clips = read_all(str(tmp_path / "folder"))
    assert set(clips) == set(media)
    c = (SIZE + 1) // 2
    for name in ("plain", "av1"):
        shown = decode_planes(media[name])
        for t, f in enumerate(FRAMES):
            y, u, v = shown[f]
            frame = clips[name][0][t]
            assert np.array_equal(frame[: SIZE * SIZE].reshape(SIZE, SIZE), y[:, 16:80]), (name, f)
            chroma = frame[SIZE * SIZE :].reshape(2, c, c)
            assert np.array_equal(chroma[0], u[:, 8:40]) and np.array_equal(chroma[1], v[:, 8:40])
    for name, (clip, info) in clips.items():
        plain, plain_info = clips[twin(name)]
        assert np.array_equal(clip, plain), name
        assert (info.n, info.fps, info.codec) == (plain_info.n, plain_info.fps, plain_info.codec)

    fragmented = {k: v for k, v in media.items() if k not in ("plain", "av1")}
    with zipfile.ZipFile(tmp_path / "frag.zip", "w", zipfile.ZIP_STORED) as z:
        for name, data in fragmented.items():
            z.writestr(name + ".mp4", data)
    with tarfile.open(tmp_path / "frag.tar", "w") as t:
        for name, data in fragmented.items():
            entry = tarfile.TarInfo(name + ".mp4")
            entry.size = len(data)
            t.addfile(entry, io.BytesIO(data))
    pack(tmp_path / "indexed.zip", [(k + ".mp4", v) for k, v in fragmented.items()])
    for source, skip in (("frag.zip", True), ("frag.tar", False), ("indexed.zip", True)):
        for name, (clip, _) in read_all(str(tmp_path / source), skip).items():
            assert np.array_equal(clip, clips[twin(name)][0]), (source, name)


def truncated(data: bytes) -> bytes:
    last_mdat = [b for b in iter_boxes(data) if b.type == b"mdat"][-1]
    return data[: last_mdat.body + 10]


def test_bad_fragments_raise_naming_the_file(media: dict[str, bytes], tmp_path) -> None:
    data = media["moof_base"]
    with pytest.raises(Mp4Error, match=r"cut\.mp4.*truncated"):
        parse_mp4_bytes(truncated(data), where="cut.mp4")
    moov_only = data[: next(b for b in iter_boxes(data) if b.type == b"moov").end]
    with pytest.raises(Mp4Error, match=r"head\.mp4: video track has no samples"):
        parse_mp4_bytes(moov_only, where="head.mp4")
    at = data.find(b"trun") + 8  # the first trun's sample count
    for count, problem in ((500, "trun table truncated"), (10**9, "trun claims 1000000000")):
        many = data[:at] + count.to_bytes(4, "big") + data[at + 4 :]
        with pytest.raises(Mp4Error, match=rf"count\.mp4: {problem}"):
            parse_mp4_bytes(many, where="count.mp4")
    at = data.find(b"tfhd") + 8  # the first tfhd's track id
    other = data[:at] + (7).to_bytes(4, "big") + data[at + 4 :]
    with pytest.raises(Mp4Error, match=r"track\.mp4: fragment of track 7"):
        parse_mp4_bytes(other, where="track.mp4")

    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "cut.mp4").write_bytes(truncated(data))
    with Reader(str(folder), size=32) as reader, pytest.raises(ClipError, match=r"cut\.mp4"):
        reader.read([(0, [0])])

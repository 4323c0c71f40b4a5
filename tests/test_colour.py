"""Colour matrix and range of stored videos (codecs/colour.py): a file without a ``colr`` box is
read with what its bitstream declares (H.264 / HEVC VUI, AV1's sequence header), exactly as
the same file with the box; sources that declare nothing get the same size guess from readers
and writers."""

from __future__ import annotations

import os

import numpy as np
import pytest

from kohakuclip import Reader, pack
from kohakuclip.codecs.colour import guessed_colorspace, is_hd, stream_colour
from kohakuclip.formats import VideoEntry
from kohakuclip.mp4.moov import parse_mp4_bytes
from tests.media import VideoSpec, make_video

BT709_FULL = {"colorspace": "bt709", "color_primaries": "bt709", "color_trc": "bt709"}
BT709_FULL = {**BT709_FULL, "color_range": "pc"}
BT601 = {"colorspace": "smpte170m", "color_primaries": "smpte170m", "color_trc": "smpte170m"}


def _without_colr(data: bytes) -> bytes:
    """The file with its ``colr`` box renamed to ``free`` (a box every parser skips)."""
    assert data.count(b"colr") == 1
    return data.replace(b"colr", b"free")


def _first_sample(data: bytes) -> tuple[str, bytes, bytes, int]:
    track = parse_mp4_bytes(data)
    start, size = int(track.offsets[0]), int(track.sizes[0])
    return track.codec, track.prefix, data[start : start + size], track.nal_length_size


def _clips(source: str) -> tuple[np.ndarray, list[tuple[str, bool]]]:
    """A batch of every video, and each clip's matrix and full-range flag."""
    with Reader(source, size=32, threads=2, seed=1) as r:
        batch = r.read([(v, [0, 3, 5]) for v in range(len(r))])
    return batch.video, list(zip(batch.colorspaces, batch.full_range.tolist(), strict=True))


@pytest.mark.parametrize("codec", ["h264", "hevc", "av1"])
def test_the_stream_declares_what_the_colr_box_says(codec: str, tmp_path) -> None:
    tagged = make_video(VideoSpec(codec=codec, width=64, height=48, frames=6, options=BT709_FULL))
    track = parse_mp4_bytes(tagged)
    assert (track.matrix, track.full_range) == ("bt709", True)  # the box, as muxed
    stripped = _without_colr(tagged)
    assert parse_mp4_bytes(stripped).matrix is None
    assert stream_colour(*_first_sample(stripped)) == ("bt709", True)
    for folder, data in (("tagged", tagged), ("stripped", stripped)):
        os.makedirs(tmp_path / folder)
        (tmp_path / folder / "v.mp4").write_bytes(data)
    want, want_infos = _clips(str(tmp_path / "tagged"))
    got, infos = _clips(str(tmp_path / "stripped"))
    assert infos == want_infos == [("bt709", True)]  # 64x48 would be guessed bt601, limited
    np.testing.assert_array_equal(got, want)
    for name, data in (("tagged", tagged), ("stripped", stripped)):
        shard = str(tmp_path / f"{name}.zip")
        index = pack(shard, [("v.mp4", data)])
        assert index.videos[0].to_json()["full_range"] is True
        packed, packed_infos = _clips(shard)
        assert packed_infos == [("bt709", True)]  # the index records the range too
        np.testing.assert_array_equal(packed, want)


def test_a_limited_range_entry_is_stored_as_before(tmp_path) -> None:
    """The index of a limited-range video carries no ``full_range`` key (shards stay
    byte-compatible with readers that predate it); an entry without one reads as limited."""
    data = make_video(VideoSpec(codec="h264", width=64, height=48, frames=2, options=BT601))
    entry = pack(str(tmp_path / "s.zip"), [("v.mp4", data)]).videos[0]
    assert entry.full_range is False and "full_range" not in entry.to_json()
    assert VideoEntry.from_json(entry.to_json()) == entry
    assert VideoEntry.from_json({**entry.to_json(), "full_range": True}).full_range is True


def test_a_declared_bt601_beats_the_hd_guess() -> None:
    data = make_video(VideoSpec(codec="h264", width=1280, height=720, frames=2, options=BT601))
    assert stream_colour(*_first_sample(_without_colr(data))) == ("bt601", False)


def test_undeclared_colour_is_guessed_alike_by_readers_and_writers(tmp_path) -> None:
    """No box, nothing in the stream: BT.709 from 720p up or 1280 wide (a 1280x536 film), else
    BT.601; the reader of a raw folder and the packer's index agree."""
    assert (is_hd(1280, 536), is_hd(536, 1280), is_hd(720, 720), is_hd(1278, 718)) == (
        True,
        True,
        True,
        False,
    )
    folder = tmp_path / "raw"
    folder.mkdir()
    members = []
    for name, (w, h) in {"film.mp4": (1280, 536), "sd.mp4": (640, 480)}.items():
        data = make_video(VideoSpec(codec="h264", width=w, height=h, frames=2))
        assert b"colr" not in data
        assert stream_colour(*_first_sample(data))[0] is None
        (folder / name).write_bytes(data)
        members.append((name, data))
    pack(str(tmp_path / "packed.zip"), members)
    for source in (str(folder), str(tmp_path / "packed.zip")):
        with Reader(source) as r:
            got = {r.info(v).member: r.info(v).colorspace for v in range(len(r))}
        assert got == {"film.mp4": "bt709", "sd.mp4": "bt601"}, source
    assert guessed_colorspace(1280, 536) == "bt709"


def test_an_undecodable_first_sample_declares_nothing() -> None:
    data = make_video(VideoSpec(codec="h264", width=64, height=48, frames=2, options=BT709_FULL))
    codec, prefix, sample, length_size = _first_sample(data)
    assert stream_colour(codec, b"", b"\x00\x00\x00\x05garbage", length_size) == (None, None)
    assert stream_colour("mpeg4", prefix, sample, length_size) == (None, None)

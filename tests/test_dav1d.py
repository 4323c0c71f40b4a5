"""The direct libdav1d path against PyAV's decoder (its slow twin): identical pixels for every
plan, clear errors on corrupt input, and PyAV for the streams the direct path does not take."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import numpy as np
import pytest
from media import VideoSpec, make_video

from kohakuclip import ClipError, Reader
from kohakuclip.decode import _dav1d
from kohakuclip.decode.video import ClipDecoder
from kohakuclip.read.plan import plan_clip
from kohakuclip.write.pack import pack

SPECS = {
    "odd.mp4": VideoSpec(codec="av1", width=98, height=70, frames=40, blur=1.5),
    "wide.mp4": VideoSpec(codec="av1", width=160, height=96, frames=48, seed=5, blur=1.5),
}


@dataclass(frozen=True)
class Shards:
    zip: str
    folder: str


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Shards:
    root = tmp_path_factory.mktemp("dav1d")
    members = [(name, make_video(spec)) for name, spec in SPECS.items()]
    pack(str(root / "shard.zip"), members)
    os.makedirs(root / "folder")
    for name, data in members:
        (root / "folder" / name).write_bytes(data)
    return Shards(str(root / "shard.zip"), str(root / "folder"))


def _items(n_frames: int, rng: np.random.Generator) -> list[tuple[int, list[int]]]:
    """Per video: 6 random frames, and a 4-frame clip with its first frame repeated twice."""
    items = []
    for vid in (0, 1):
        items.append((vid, sorted(rng.choice(n_frames, 6, replace=False).tolist())))
        start = int(rng.integers(0, n_frames - 12))
        items.append((vid, [*range(start, start + 12, 3), start, start]))
    return items


def test_the_wheel_ships_a_usable_libdav1d() -> None:
    assert _dav1d.library() is not None


@pytest.mark.parametrize("skip", [True, "keep", False])
@pytest.mark.parametrize("source", ["zip", "folder"])
def test_direct_path_matches_pyav_pixel_for_pixel(
    shards: Shards, source: str, skip: bool | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = _items(40, np.random.default_rng(7))
    path = getattr(shards, source)
    with Reader(path, size=24, threads=2, skip=skip, hflip=0.5) as reader:  # type: ignore[arg-type]
        direct = reader.read(items, seed=3)
        stats = reader.stats()
    monkeypatch.setattr(_dav1d, "library", lambda: None)
    with Reader(path, size=24, threads=2, skip=skip, hflip=0.5) as reader:  # type: ignore[arg-type]
        pyav = reader.read(items, seed=3)
        assert reader.stats()["frames_decoded"] == stats["frames_decoded"]
    np.testing.assert_array_equal(direct.video, pyav.video)
    np.testing.assert_array_equal(direct.crops, pyav.crops)


def test_decoders_produce_the_same_frames_and_planes(shards: Shards) -> None:
    with Reader(shards.zip) as reader:
        track = reader._catalog.track(0)
    plan = plan_clip(track, [3, 9, 17, 30], True)
    got: dict[str, dict[int, tuple[np.ndarray, ...]]] = {}
    produced = {}
    for name, use in (("direct", True), ("pyav", False)):
        decoder = ClipDecoder(use_dav1d=use)
        assert (decoder._direct_decoder(track) is not None) == use
        frames: dict[int, tuple[np.ndarray, ...]] = {}

        def keep(planes: tuple[np.ndarray, ...], display: int, frames=frames) -> None:
            h, w = track.height, track.width
            ch, cw = (h + 1) // 2, (w + 1) // 2
            frames[display] = (
                planes[0][:h, :w].copy(),
                planes[1][:ch, :cw].copy(),
                planes[2][:ch, :cw].copy(),
            )

        fd = os.open(track.path, os.O_RDONLY)
        try:
            produced[name] = decoder.decode(track, plan, fd, keep)
        finally:
            os.close(fd)
        got[name] = frames
    assert produced["direct"] == produced["pyav"]
    assert sorted(got["direct"]) == [3, 9, 17, 30] == sorted(got["pyav"])
    for display, planes in got["direct"].items():
        for a, b in zip(planes, got["pyav"][display]):
            np.testing.assert_array_equal(a, b)


def test_corrupt_av1_sample_names_the_member_and_the_pool_keeps_working(
    shards: Shards, tmp_path
) -> None:
    bad = str(tmp_path / "bad.zip")
    shutil.copy(shards.zip, bad)
    with Reader(bad) as probe:
        track = probe._catalog.track(1)
        start, length = int(track.offsets[0]), int(track.sizes[0])
    with open(bad, "r+b") as f:  # the first keyframe becomes noise
        f.seek(start)
        f.write(np.random.default_rng(1).integers(0, 256, length, dtype=np.uint8).tobytes())
    with Reader(bad, size=16, threads=2) as reader:
        with pytest.raises(ClipError, match=r"bad.zip:wide.mp4"):
            reader.read([(1, [0, 1, 2])])
        for _ in range(3):
            assert reader.read([(0, [0, 5]), (0, [7, 8])]).video.shape[0] == 2


def test_ten_bit_av1_takes_the_pyav_path(tmp_path) -> None:
    spec = VideoSpec(codec="av1", width=64, height=48, frames=20, pix_fmt="yuv420p10le", blur=1.5)
    path = str(tmp_path / "deep.zip")
    pack(path, [("deep.mp4", make_video(spec))])
    with Reader(path, size=16) as reader:
        track = reader._catalog.track(0)
        assert ClipDecoder()._direct_decoder(track) is None
        batch = reader.read([(0, [2, 11])])
    assert batch.video.shape == (1, 2, 3, 16, 16) and batch.video.std() > 1

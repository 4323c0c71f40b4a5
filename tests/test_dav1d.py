"""The compiled libdav1d share path against PyAV's decoder (its slow twin): identical pixels for
every plan and mode, clear errors on corrupt input, and PyAV for the streams it does not take."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, replace

import numpy as np
import pytest

from kohakuclip import ClipError, Reader
from kohakuclip.decode import _dav1d
from kohakuclip.decode._clips import Dav1dClips, Follower, ShareTables
from kohakuclip.decode.pixels import yuv420_frame_bytes
from kohakuclip.decode.video import ClipDecoder, takes_dav1d
from kohakuclip.read.plan import ClipPlan, plan_clip
from kohakuclip.write.pack import pack
from tests.media import VideoSpec, make_video

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


@pytest.mark.parametrize("mode", ["rgb", "yuv_resized", "yuv"])
@pytest.mark.parametrize("skip", [True, "keep", False])
@pytest.mark.parametrize("source", ["zip", "folder"])
def test_compiled_path_matches_pyav_pixel_for_pixel(
    shards: Shards, source: str, skip: bool | str, mode: str
) -> None:
    items = _items(40, np.random.default_rng(7))
    path = getattr(shards, source)
    got = {}
    for compiled in (True, False):
        with Reader(path, size=24, threads=2, skip=skip, hflip=0.5, vflip=0.3, mode=mode) as reader:  # type: ignore[arg-type]
            reader._compiled = compiled
            out = np.zeros(reader.batch_shape(len(items), 6), np.uint8)  # yuv: window only
            got[compiled] = reader.read(items, out, seed=3)
    np.testing.assert_array_equal(got[True].video, got[False].video)
    np.testing.assert_array_equal(got[True].crops, got[False].crops)
    np.testing.assert_array_equal(got[True].flips, got[False].flips)


def test_compiled_decoder_produces_what_pyav_produces(shards: Shards) -> None:
    with Reader(shards.zip) as reader:
        track = reader._catalog.track(0)
    assert takes_dav1d(track)
    plans = [plan_clip(track, f, True) for f in ([3, 9, 17, 30], [0, 1], [39])]
    tables = ShareTables("yuv", 16, 128)
    fd = os.open(track.path, os.O_RDONLY)
    try:
        for slot, plan in enumerate(plans):
            tables.add(
                slot,
                fd,
                plan,
                (0, 0, 70, 70),
                (False, False),
                np.eye(3, 4, dtype=np.float32),
                track.prefix,
                0,
            )
        out = np.zeros((3, 4, yuv420_frame_bytes(128)), np.uint8)
        status = Dav1dClips().run(tables, out)
        decoder = ClipDecoder()
        produced = [
            decoder.decode(track, plan, lambda o, n: os.pread(fd, n, o), lambda p, d: None)
            for plan in plans
        ]
    finally:
        os.close(fd)
    assert status[:, 0].tolist() == [0, 0, 0]
    assert status[:, 2].tolist() == produced


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
        assert not takes_dav1d(track)
        batch = reader.read([(0, [2, 11])])
    assert batch.video.shape == (1, 2, 3, 16, 16) and batch.video.std() > 1


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mode", ["rgb", "yuv_resized"])
def test_clips_of_one_video_decode_once_and_match_reading_each_alone(
    shards: Shards, mode: str, threads: int
) -> None:
    """Several views of one video in a batch (evaluation crops, contrastive pairs) share one
    decoding of their GOPs; each clip's bytes are what reading it alone gives."""
    items = [
        (0, [2, 9, 17, 30]),
        (1, [5, 6, 7, 8]),
        (0, [3, 9, 16, 31]),
        (0, [30, 2, 2, 39]),
        (1, [40, 7, 22, 47]),
        (0, [10, 11, 12, 13]),
    ]
    keys = [101, 202, 303, 404, 505, 606]  # a clip's crop and flips whatever its batch
    options = dict(size=24, hflip=0.5, vflip=0.5, mode=mode)
    with Reader(shards.zip, threads=threads, **options) as reader:  # type: ignore[arg-type]
        together = reader.read(items, item_keys=keys)
        shared = reader.stats()
    alone = []
    decoded_alone = 0
    with Reader(shards.zip, threads=1, **options) as reader:  # type: ignore[arg-type]
        for item, key in zip(items, keys):
            alone.append(reader.read([item], item_keys=[key]).video[0])
        decoded_alone = reader.stats()["frames_decoded"]
    np.testing.assert_array_equal(together.video, np.stack(alone))
    assert len({tuple(c) for c in together.crops[[0, 2, 3, 5]].tolist()}) > 1  # views differ
    assert shared["frames_out"] == 24
    assert shared["frames_decoded"] < decoded_alone


def test_a_bad_frame_index_fails_its_clip_not_the_clips_sharing_its_video(shards: Shards) -> None:
    with Reader(shards.zip, size=16, threads=1) as reader:
        out = np.zeros(reader.batch_shape(3, 2), np.uint8)
        with pytest.raises(ClipError, match=r"odd.mp4: frames \[3, 400\]: frame 400 out of range"):
            reader.read([(0, [1, 2]), (0, [3, 400]), (0, [5, 6])], out, seed=4)
        alone = reader.read([(0, [1, 2]), (0, [3, 4]), (0, [5, 6])], seed=4).video
    np.testing.assert_array_equal(out[[0, 2]], alone[[0, 2]])
    assert out[1].max() == 0


def test_a_follower_needs_the_crop_size_of_the_clip_it_follows(shards: Shards) -> None:
    with Reader(shards.zip) as reader:
        track = reader._catalog.track(0)
    tables = ShareTables("rgb", 16, 16)
    plan = plan_clip(track, [1, 2], True)
    eye = np.eye(3, 4, dtype=np.float32)
    for crop in [(0, 0, 64, 64), (1, 0, 70, 70), (0, 1, 70, 70)]:
        with pytest.raises(ValueError, match="differs in size"):
            follower = Follower(1, {1: [0]}, crop, (False, False))
            tables.add(0, -1, plan, (0, 0, 70, 70), (False, False), eye, followers=[follower])
        assert len(tables) == 0 and tables.gops == [] and tables.targets == []  # nothing added
    tables.add(
        0,
        -1,
        plan,
        (0, 0, 70, 70),
        (False, False),
        eye,
        followers=[Follower(1, {1: [0]}, (2, 0, 70, 70), (True, False))],
    )
    assert len(tables) == 2 and tables.slots == [0, 1]


def _corrupt_last_gop(source: str, target: str, vid: int) -> int:
    """A copy of ``source`` whose video ``vid`` has its last keyframe turned to noise; returns
    that keyframe's index."""
    shutil.copy(source, target)
    with Reader(target) as probe:
        track = probe._catalog.track(vid)
        key = int(track.key_positions[-1])
        start, length = int(track.offsets[key]), int(track.sizes[key])
    with open(target, "r+b") as f:
        f.seek(start)
        f.write(np.random.default_rng(1).integers(0, 256, length, dtype=np.uint8).tobytes())
    return key


@pytest.mark.parametrize("threads", [1, 2])
def test_a_corrupt_gop_fails_the_clip_that_needs_it_not_its_group(
    shards: Shards, tmp_path, threads: int
) -> None:
    bad = str(tmp_path / "bad.zip")
    key = _corrupt_last_gop(shards.zip, bad, 1)
    late = [key, key + 1, key + 2]
    items = [(1, [0, 1, 2]), (1, late), (1, [3, 5, 7])]
    with Reader(bad, size=16, threads=threads) as reader:
        out = np.zeros(reader.batch_shape(3, 3), np.uint8)
        with pytest.raises(ClipError, match=rf"wide.mp4: frames \[{key}, {key + 1}, {key + 2}\]"):
            reader.read(items, out, seed=3)
        good = reader.read([items[0], (1, [4, 4, 4]), items[2]], seed=3).video
    np.testing.assert_array_equal(out[[0, 2]], good[[0, 2]])
    assert out[0].std() > 1


def test_a_group_counts_its_decoding_once_when_its_first_clip_falls_back(
    shards: Shards, monkeypatch
) -> None:
    """The first clip of a group holds the group's plan; when it alone goes to PyAV (here: it
    wants a frame the plan never decodes), the group's decoding still counts, with the clips
    it wrote."""
    items = [(1, [0, 1, 2]), (1, [33, 34, 35])]
    with Reader(shards.zip, size=16, threads=1) as reader:
        grouped = reader.read(items, seed=1).video
        group = reader.stats()["frames_decoded"]
    with Reader(shards.zip, size=16, threads=1) as reader:
        reader.read(items[:1], seed=1)
        first_alone = reader.stats()["frames_decoded"]
    add = ShareTables.add

    def lead_wants_more(self: ShareTables, slot: int, fd: int, plan: ClipPlan, *args, **kw):
        targets = dict(plan.targets)
        targets[47] = targets.pop(next(iter(targets)))  # beyond the plan: MISSING_FRAME
        return add(self, slot, fd, replace(plan, targets=targets), *args, **kw)

    monkeypatch.setattr(ShareTables, "add", lead_wants_more)
    with Reader(shards.zip, size=16, threads=1) as reader:
        fallback = reader.read(items, seed=1).video
        stats = reader.stats()
    np.testing.assert_array_equal(fallback, grouped)
    assert stats["clips"] == 2 and stats["frames_decoded"] == group + first_alone


def test_a_group_that_cannot_be_planned_together_is_decoded_clip_by_clip(
    shards: Shards, monkeypatch
) -> None:
    import kohakuclip.read.reader as reader_module

    plan = reader_module.plan_clip

    def refuses_frame_40(track, frames, *args, **kwargs):  # type: ignore[no-untyped-def]
        if 40 in frames:
            raise ValueError("frame 40 cannot be planned")
        return plan(track, frames, *args, **kwargs)

    items = [(1, [0, 1, 2]), (1, [38, 39, 40]), (1, [3, 5, 7])]
    with Reader(shards.zip, size=16, threads=1) as reader:
        good = reader.read([items[0], (1, [4, 4, 4]), items[2]], seed=3).video
    monkeypatch.setattr(reader_module, "plan_clip", refuses_frame_40)
    with Reader(shards.zip, size=16, threads=1) as reader:
        out = np.zeros(reader.batch_shape(3, 3), np.uint8)
        with pytest.raises(ClipError, match=r"frames \[38, 39, 40\]: frame 40 cannot be planned"):
            reader.read(items, out, seed=3)
    np.testing.assert_array_equal(out[[0, 2]], good[[0, 2]])

"""kohakuclip.profile(): every video reader of the process summed, as each reports itself."""

from __future__ import annotations

import multiprocessing

import pytest

import kohakuclip
from kohakuclip.write.pack import pack
from tests.media import VideoSpec, make_video


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("profile") / "shard.zip")
    videos = [
        (f"{codec}.mp4", make_video(VideoSpec(codec=codec, width=64, height=48, frames=24, seed=k)))
        for k, codec in enumerate(("av1", "h264"))
    ]
    pack(path, videos)
    return path


def _read(shard: str, compiled: bool) -> dict[str, float]:
    with kohakuclip.Reader(shard, size=32, threads=2, seed=0) as reader:
        reader._compiled = compiled
        reader.read([(0, [0, 5, 9]), (1, [2, 3, 20]), (0, [11, 12, 12])])
        return reader.stats()


@pytest.mark.parametrize("compiled", [True, False])
def test_profile_sums_the_readers_stats(shard: str, compiled: bool) -> None:
    kohakuclip.profile(reset=True)
    first, second = _read(shard, compiled), _read(shard, compiled)
    counts = kohakuclip.profile()
    assert counts["frames"] == first["frames_out"] + second["frames_out"] == 18
    assert counts["decoded"] == first["frames_decoded"] + second["frames_decoded"]
    for name, stage in (("read", "read"), ("decode", "decode"), ("convert", "pixels")):
        total = first.get(f"seconds_{stage}", 0.0) + second.get(f"seconds_{stage}", 0.0)
        assert counts[name] == pytest.approx(total, rel=1e-9, abs=1e-9), name
    assert counts["decode"] > 0 and counts["resize"] == 0
    assert kohakuclip.profile(reset=True) == counts
    after = kohakuclip.profile()
    assert all(value == 0 for value in after.values())
    assert [type(v) for v in after.values()] == [type(v) for v in counts.values()]  # as 1.0.0


def _child_profile(queue: multiprocessing.Queue) -> None:
    queue.put(kohakuclip.profile())


def test_a_forked_child_starts_from_zero(shard: str) -> None:
    kohakuclip.profile(reset=True)
    _read(shard, True)
    assert kohakuclip.profile()["frames"] == 9
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_profile, args=(queue,))
    child.start()
    counts = queue.get(timeout=60)
    child.join(timeout=60)
    assert counts["frames"] == 0 and counts["decode"] == 0

"""Long-run hygiene: bounded descriptors and caches, fork safety, failures that do not poison the
pool, and resources released on close (the slow, 1500-batch runs live in benchmarks/)."""

from __future__ import annotations

import gc
import os
import shutil
import threading
import time
import weakref

import numpy as np
import pytest

from kohakuclip import ClipError, Reader
from kohakuclip.write.pack import pack
from tests.media import VideoSpec, make_video


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture(scope="module")
def many_files(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("many")
    data = make_video(VideoSpec(codec="h264", width=64, height=48, frames=12))
    for i in range(50):
        (root / f"v{i:02d}.mp4").write_bytes(data)
    return str(root)


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("shard")
    members = [
        (f"{c}.mp4", make_video(VideoSpec(codec=c, width=96, height=64, frames=24, seed=i)))
        for i, c in enumerate(["av1", "h264", "hevc"])
    ]
    path = str(root / "s.zip")
    pack(path, members)
    return path


def test_open_files_stay_under_the_limit(many_files: str) -> None:
    before = _open_fds()
    with Reader(many_files, size=16, threads=3, open_files=8, moov_cache=5) as reader:
        assert len(reader) == 50
        peak = 0
        for start in range(0, 50, 10):
            items = [(v, [0, 5]) for v in range(start, start + 10)]
            reader.read(items)
            peak = max(peak, _open_fds() - before)
            assert len(reader._catalog.files) <= 8
            assert len(reader._catalog._tracks) <= 5
        assert peak <= 8 + 6, f"{peak} descriptors opened for 8 allowed (+ pool/pipe slack)"
    assert _open_fds() <= before + 1


def test_close_joins_threads_and_closes_files(shard: str) -> None:
    before_threads = threading.active_count()
    before_fds = _open_fds()
    reader = Reader(shard, size=16, threads=4)
    reader.read([(0, [0, 1])])
    assert threading.active_count() >= before_threads + 4
    reader.close()
    assert threading.active_count() == before_threads
    assert _open_fds() == before_fds


def test_dropped_pending_frees_its_buffer(shard: str) -> None:
    with Reader(shard, size=32, threads=2) as reader:
        out = np.empty(reader.batch_shape(3, 4), np.uint8)
        ref = weakref.ref(out)
        pending = reader.submit([(v, [0, 1, 2, 3]) for v in range(3)], out=out)
        del out, pending
        reader.read([(0, [0])] * 2)  # FIFO: the dropped batch's tasks were taken before these
        deadline = time.monotonic() + 10
        while ref() is not None and time.monotonic() < deadline:
            gc.collect()
            time.sleep(0.01)
        assert ref() is None


def test_errors_do_not_poison_the_pool(shard: str, tmp_path) -> None:
    bad = str(tmp_path / "bad.zip")
    shutil.copy(shard, bad)
    with Reader(bad, size=16) as probe:
        track = probe._catalog.track(1)
        start, size = int(track.offsets[0]), int(track.sizes[0])
    with open(bad, "r+b") as f:
        f.seek(start)
        f.write(b"\x00\x00\x00\x01" + b"\xff" * (size - 4))
    with Reader(bad, size=16, threads=2) as reader, Reader(shard, size=16) as good:
        with pytest.raises(ClipError, match=r"bad\.zip:h264\.mp4"):
            reader.read([(0, [0, 2]), (1, [0, 1]), (2, [0, 3])])
        rng = np.random.default_rng(0)
        for _ in range(100):
            vid = int(rng.choice([0, 2]))
            frames = sorted(rng.choice(24, 2, replace=False).tolist())
            got = reader.read([(vid, frames)], seed=1).video
            assert np.array_equal(got, good.read([(vid, frames)], seed=1).video)


def test_fork_parent_workers_parent(shard: str) -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset

    reader = Reader(shard, size=24, threads=2, seed=0)
    items = [(v, [0, 3, 6]) for v in range(3)]
    expected = reader.read(items, seed=5).video  # threads and files exist before the fork

    class Batches(IterableDataset):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            for k in range(2):
                if info is None or k % info.num_workers == info.id:
                    yield torch.from_numpy(reader.read(items, seed=5).video)

    loader = DataLoader(
        Batches(), batch_size=None, num_workers=2, timeout=120, multiprocessing_context="fork"
    )
    got = list(loader)
    assert len(got) == 2
    for batch in got:
        assert np.array_equal(batch.numpy(), expected)
    assert np.array_equal(reader.read(items, seed=5).video, expected)  # the parent still works
    reader.close()

"""kohakuclip.torch: batch datasets, the loader, resume, ranks, epochs and worker processes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import kohakuclip
from kohakuclip.torch import (
    STATE_VERSION,
    ClipDataset,
    ClipLoader,
    collate_meta,
    rank_and_world,
    sample_key,
    sample_rng,
    yuv_to_rgb,
)
from tests.media import VideoSpec, make_video, psnr

SIZE, FRAMES, BATCH = 32, 4, 3
LENGTHS = [24, 31, 40, 28, 36, 26]
WORKER_TIMEOUT = 120  # seconds a DataLoader waits for a worker: a hung worker fails the test
# Tests fork DataLoader workers from this process, so they leave readers open and idle rather
# than closing them (a thread still exiting at a fork can hand the child a locked native mutex),
# and the writer, with its encode threads, runs in a subprocess.

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture(scope="session")
def videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of six small H.264 videos of different sizes and lengths."""
    root = tmp_path_factory.mktemp("clips")
    for i, n in enumerate(LENGTHS):
        spec = VideoSpec(codec="h264", width=64 + 16 * i, height=48 + 8 * i, frames=n, seed=i)
        make_video(spec, str(root / f"v{i}.mp4"))
    return root


@pytest.fixture(scope="session")
def shards(videos: Path, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The same videos re-encoded into two indexed zip shards by the writer, with sidecars:
    ``v<i>.json`` (label 10 i, score i / 2, for odd i a nested field) and ``v<i>.txt`` captions
    for even i."""
    src = tmp_path_factory.mktemp("labelled")
    for i in range(len(LENGTHS)):
        shutil.copy(videos / f"v{i}.mp4", src / f"v{i}.mp4")
        sidecar: dict[str, Any] = {"label": 10 * i, "score": i / 2}
        if i % 2:
            sidecar["extra"] = {"odd": True}
        (src / f"v{i}.json").write_text(json.dumps(sidecar))
        if i % 2 == 0:
            (src / f"v{i}.txt").write_text(f"video {i}")
    out = tmp_path_factory.mktemp("shards")
    code = (
        "import sys; from kohakuclip import write_videos\n"
        "result = write_videos(\n"
        "    sys.argv[1], [sys.argv[2]], codec='h264', per_shard=3, progress=False\n"
        ")\n"
        "print(*result.shards)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(out), str(src)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return [str(out / name) for name in done.stdout.split()]


@pytest.fixture(scope="session")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with one video whose sample data is garbage (the moov box is intact)."""
    root = tmp_path_factory.mktemp("broken")
    data = bytearray(make_video(VideoSpec(codec="h264", width=64, height=48, frames=24)))
    at = data.index(b"mdat")
    size = int.from_bytes(data[at - 4 : at], "big")
    data[at + 4 : at - 4 + size] = b"\xff" * (size - 8)
    (root / "broken.mp4").write_bytes(bytes(data))
    return root


def dataset(source: Any, **kw: object) -> ClipDataset:
    options: dict[str, Any] = dict(batch_size=BATCH, frames=FRAMES, size=SIZE, threads=1)
    options.update(hflip=0.5, **kw)
    return ClipDataset(str(source) if isinstance(source, Path) else source, **options)


def take(loader: ClipLoader, n: int) -> list:
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def assert_same_batches(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert type(x) is type(y)  # (batch, meta) tuples whatever the workers
        if isinstance(x, tuple):
            assert x[1]["batch"] == y[1]["batch"]
            assert torch.equal(x[1]["video"], y[1]["video"])
            assert torch.equal(x[1]["frames"], y[1]["frames"])
            x, y = x[0], y[0]
        assert torch.equal(x, y)


def test_batches_follow_from_the_global_sample_stream(videos: Path) -> None:
    """Item j of batch b of rank 1 of 2 is sample g = (2 b + 1) B + j: its video and frames
    come from sample_rng(seed, g) and kohakuclip.clip, its crop and flips from sample_key."""
    ds = dataset(videos, seed=5, fps=12.0, rank=1, world_size=2, with_meta=True)
    batches = take(ClipLoader(ds), 3)
    reader = kohakuclip.Reader(str(videos), size=SIZE, hflip=0.5)  # left open: see the top
    for b, (video, meta) in enumerate(batches):
        samples = [(2 * b + 1) * BATCH + j for j in range(BATCH)]
        items = []
        for g in samples:
            rng = sample_rng(5, g)
            vid = int(rng.integers(len(reader)))
            info = reader.info(vid)
            items.append((vid, kohakuclip.clip(info.n, FRAMES, rng, 12.0, info.fps)))
        assert meta["batch"] == b and meta["sample"].tolist() == samples
        assert meta["video"].tolist() == [vid for vid, _ in items]
        assert meta["frames"].tolist() == [f for _, f in items]
        keys = [sample_key(5, g) for g in samples]
        expected = reader.read(items, item_keys=keys).video
        assert video.shape == (BATCH, FRAMES, 3, SIZE, SIZE) and video.dtype == torch.uint8
        np.testing.assert_array_equal(video.numpy(), expected)
    # not a constant stream: batches differ from each other
    assert not torch.equal(batches[0][0], batches[1][0])


def test_a_clip_is_the_same_at_any_position_of_a_batch(videos: Path) -> None:
    """item_keys: the crop and flips follow the key, not the position in the batch."""
    reader = kohakuclip.Reader(str(videos), size=SIZE, hflip=0.5)
    items = [(1, [0, 2, 4, 6]), (3, [1, 2, 3, 4]), (4, [5, 6, 7, 8])]
    keys = [11, 12, 13]
    straight = reader.read(items, item_keys=keys)
    turned = reader.read(items[::-1], item_keys=keys[::-1])
    np.testing.assert_array_equal(straight.video, turned.video[::-1])
    np.testing.assert_array_equal(straight.crops, turned.crops[::-1])
    flips = [reader.read(items[:1], item_keys=[k]).flips[0, 0] for k in range(16)]
    assert 0 < sum(flips) < 16  # the key decides the flip
    legacy = reader.read(items, seed=3)  # without keys: (seed, position) as before
    assert np.array_equal(legacy.video, reader.read(items, seed=3).video)
    with pytest.raises(ValueError, match="2 keys for 3 items"):
        reader.submit(items, item_keys=[1, 2])


@pytest.mark.parametrize("epochs", [False, True])
def test_one_rank_of_batch_4_equals_two_ranks_of_batch_2(videos: Path, epochs: bool) -> None:
    """The ranks of a step hold together what one rank with their summed batch reads: ids,
    frames and pixels (crop and flips included)."""
    one = take(ClipLoader(dataset(videos, batch_size=4, epochs=epochs, with_meta=True)), 3)
    ranks = [
        take(
            ClipLoader(
                dataset(videos, batch_size=2, epochs=epochs, rank=r, world_size=2, with_meta=True)
            ),
            3,
        )
        for r in range(2)
    ]
    for step, (video, meta) in enumerate(one):
        parts = [ranks[r][step] for r in range(2)]
        assert torch.equal(video, torch.cat([v for v, _ in parts]))
        for key in ("sample", "video", "frames"):
            assert torch.equal(meta[key], torch.cat([m[key] for _, m in parts]))
        assert meta["sample"].tolist() == list(range(4 * step, 4 * step + 4))


@pytest.fixture(scope="session")
def two_folders(videos: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Folder "a" holds v0 and v1, folder "b" v2, v3 and v4 (copies of the session's videos)."""
    root = tmp_path_factory.mktemp("mix")
    out = {}
    for name, ids in (("a", [0, 1]), ("b", [2, 3, 4])):
        (root / name).mkdir()
        for i in ids:
            shutil.copy(videos / f"v{i}.mp4", root / name / f"v{i}.mp4")
        out[name] = str(root / name)
    return out


def names_digest(names: list[str]) -> str:
    """A state fingerprint's digest of a source holding ``names`` (16 or fewer: each sampled)."""
    return hashlib.blake2b("\0".join(names).encode(), digest_size=8).hexdigest()


def rank_loaders(
    source: Any,
    world: int,
    batch: int,
    state: dict | None,
    workers: tuple[int, ...] | None = None,
    **kw: Any,
) -> list:
    """One loader per rank of ``world``, each given ``state`` (rank 0's, as Lightning does)."""
    loaders = []
    for r in range(world):
        ds = dataset(source, batch_size=batch, rank=r, world_size=world, with_meta=True, **kw)
        count = workers[r] if workers is not None else 0
        loader = ClipLoader(ds, workers=count, timeout=WORKER_TIMEOUT)
        if state is not None:
            loader.load_state_dict(state)
        loaders.append(loader)
    return loaders


def by_sample(batches: list) -> dict[int, tuple[int, list[int], torch.Tensor]]:
    """Global sample index -> (video id, frames, pixels) over (video, meta) batches."""
    out = {}
    for video, meta in batches:
        for j, g in enumerate(meta["sample"].tolist()):
            out[g] = (int(meta["video"][j]), meta["frames"][j].tolist(), video[j])
    return out


def test_random_stream_resumes_on_another_world_size_and_batch(videos: Path) -> None:
    """Two ranks of batch 2 for 2 steps, then three ranks of batch 3 from rank 0's state: the
    same samples (ids, frames, pixels) as one rank of batch 4 straight through."""
    straight = by_sample(take(ClipLoader(dataset(videos, batch_size=4, with_meta=True)), 5))
    first = rank_loaders(videos, 2, 2, None)
    got = by_sample([b for loader in first for b in take(loader, 2)])
    state = first[0].state_dict()
    assert state["samples"] == 8 and state == first[1].state_dict()
    got |= by_sample([b for loader in rank_loaders(videos, 3, 3, state) for b in take(loader, 1)])
    assert sorted(got) == list(range(17))
    for g, (vid, frames, pixels) in got.items():
        assert (vid, frames) == straight[g][:2], g
        assert torch.equal(pixels, straight[g][2]), g


def test_epoch_started_on_two_ranks_resumed_on_three_visits_every_video_once(
    videos: Path,
) -> None:
    n = len(LENGTHS)
    first = rank_loaders(videos, 2, 1, None, epochs=True)
    before = by_sample([b for loader in first for b in take(loader, 2)])
    state = first[0].state_dict()
    assert sorted(before) == [0, 1, 2, 3] and state["samples"] == 4
    # the rest on three ranks of batch 1, rank 2 in two DataLoader worker processes
    loaders = rank_loaders(videos, 3, 1, state, epochs=True, workers=(0, 0, 2))
    after = by_sample([b for loader in loaders for b in take(loader, 2)])
    assert sorted(after) == list(range(4, 10))
    epoch0 = [before[g][0] for g in range(4)] + [after[g][0] for g in range(4, n)]
    assert sorted(epoch0) == list(range(n))  # every video exactly once
    epoch1 = [after[g][0] for g in range(n, 10)]
    assert len(set(epoch1)) == len(epoch1)  # the next epoch starts without repeats


def test_mixed_sources_record_their_source_and_keep_their_proportions(
    two_folders: dict[str, str],
) -> None:
    ds = ClipDataset(
        two_folders,
        4,
        frames=FRAMES,
        size=SIZE,
        threads=1,
        weights={"a": 3, "b": 1},
        with_meta=True,
    )
    assert ds.source_sizes() == [2, 3]
    batches = take(ClipLoader(ds), 3)
    for _, meta in batches:
        for vid, mix, name, source in zip(
            meta["video"].tolist(), meta["mix"].tolist(), meta["mix_name"], meta["source"]
        ):
            assert (mix, name) == ((0, "a") if vid < 2 else (1, "b"))
            assert source == two_folders[name]
    # the proportions, over many samples (ids only, no decoding)
    n = 4000
    ids = np.concatenate([ds.indices(b) for b in range(n // 4)])
    share = float(np.mean(ids < 2))
    assert abs(share - 0.75) < 5 * (0.75 * 0.25 / n) ** 0.5
    state = ClipLoader(ds).state_dict()
    assert state["sources"] == {
        "kind": "videos",
        "items": [2, 3],
        "names": [names_digest(["v0.mp4", "v1.mp4"]), names_digest(["v2.mp4", "v3.mp4", "v4.mp4"])],
        "epochs": False,
        "weights": [0.75, 0.25],
    }
    # epoch mode: each folder once per epoch, at its own pace
    epochs = ClipDataset(two_folders, 4, frames=FRAMES, weights=[3, 1], epochs=True, size=SIZE)
    ids = np.concatenate([epochs.indices(b) for b in range(10)])
    a, b = ids[ids < 2], ids[ids >= 2]
    assert sorted(a[:2].tolist()) == [0, 1] and sorted(b[:3].tolist()) == [2, 3, 4]
    assert len(a) > 2 * len(b)


def test_a_folder_of_shards_in_a_mixture_counts_every_shard(
    shards: list[str], two_folders: dict[str, str]
) -> None:
    """A mixture's source may be a folder of shards (the writer's output), listed as one source
    per shard: its videos are those of all of them, and the next source's come after them."""
    folder = os.path.dirname(shards[0])
    ds = ClipDataset(
        {"shards": folder, "b": two_folders["b"]},
        4,
        frames=FRAMES,
        size=SIZE,
        threads=1,
        weights=[1, 1],
        with_meta=True,
    )
    assert ds.source_sizes() == [6, 3]
    for _, meta in take(ClipLoader(ds), 2):
        mixes = [int(vid >= 6) for vid in meta["video"].tolist()]
        assert meta["mix"].tolist() == mixes
        assert meta["mix_name"] == [("shards", "b")[k] for k in mixes]
    ids = np.concatenate([ds.indices(b) for b in range(100)])
    assert sorted(set(ids.tolist())) == list(range(9))


def test_a_state_from_other_sources_is_refused(videos: Path, two_folders: dict[str, str]) -> None:
    state = ClipLoader(dataset(videos)).state_dict()
    with pytest.raises(ValueError, match=r"other sources.*saved for 6 videos.*reads 2 videos"):
        ClipLoader(dataset(two_folders["a"])).load_state_dict(state)
    mixed = ClipLoader(dataset(two_folders, weights=[1, 1]))
    with pytest.raises(ValueError, match=r"reads 2 mixed sources of 2 \+ 3 videos"):
        mixed.load_state_dict(state)
    ours = mixed.state_dict()
    with pytest.raises(ValueError, match="other sources"):
        ClipLoader(dataset(two_folders, weights={"b": 1, "a": 1})).load_state_dict(
            {**ours, "sources": {"kind": "videos", "items": [3, 2]}}
        )
    mixed.load_state_dict(ours)  # its own state loads
    reweighted = ClipLoader(dataset(two_folders, weights=[3, 1]))
    with pytest.warns(UserWarning, match=r"other mix weights: \[0\.5, 0\.5\] when saved, \[0\.75"):
        reweighted.load_state_dict(ours)  # a curriculum: the stream continues (test_stream.py)
    assert reweighted.state_dict()["samples"] == ours["samples"]
    with pytest.raises(ValueError, match="other settings: epochs False"):
        ClipLoader(dataset(two_folders, weights=[1, 1], epochs=True)).load_state_dict(ours)
    recorded_before = {k: ours["sources"][k] for k in ("kind", "items")}  # states of 2026-12-03
    ClipLoader(dataset(two_folders, weights=[3, 1])).load_state_dict(
        {**ours, "sources": recorded_before}
    )


def test_a_state_of_as_many_other_videos_is_refused_and_a_moved_copy_loads(
    videos: Path, tmp_path: Path
) -> None:
    """The counts match, the names do not: refused. The same files in another folder: loaded."""
    state = ClipLoader(dataset(videos)).state_dict()
    renamed, moved = tmp_path / "renamed", tmp_path / "moved"
    renamed.mkdir()
    for i in range(len(LENGTHS)):
        shutil.copy(videos / f"v{i}.mp4", renamed / f"w{i}.mp4")
    shutil.copytree(videos, moved)
    with pytest.raises(ValueError, match="reads as many, but other items"):
        ClipLoader(dataset(renamed)).load_state_dict(state)
    resumed = ClipLoader(dataset(moved))
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    without = {**state, "sources": {k: v for k, v in state["sources"].items() if k != "names"}}
    ClipLoader(dataset(renamed)).load_state_dict(without)  # states saved before 2026-12-04


def test_a_state_saved_before_the_stream_version_resumes_its_old_epoch_orders(
    two_folders: dict[str, str],
) -> None:
    """A state without ``stream`` (saved before 2026-12-04) continues the epoch orders its run
    started with (version 1); new runs and their states use version 2."""

    def make() -> ClipDataset:
        return ClipDataset(two_folders, 2, frames=FRAMES, weights=[1, 1], epochs=True, size=SIZE)

    old = make()
    old.stream_version = 1  # as kohakuclip drew them before
    straight_old = [old.indices(b).tolist() for b in range(12)]
    straight_new = [make().indices(b).tolist() for b in range(12)]
    assert straight_old != straight_new
    loader = ClipLoader(old)
    loader.load_state_dict({**loader.state_dict(), "stream": 1})
    for _ in zip(range(5), loader):
        pass
    state = loader.state_dict()
    assert state["stream"] == 1 and state["batch"] == 5
    del state["stream"]  # as states saved before recorded it
    resumed = make()
    ClipLoader(resumed).load_state_dict(state)
    assert resumed.stream_version == 1
    assert [resumed.indices(b).tolist() for b in range(5, 12)] == straight_old[5:]
    fresh = ClipLoader(make()).state_dict()
    assert fresh["stream"] == 2


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_same_batches_for_any_worker_count(videos: Path, workers: int) -> None:
    reference = take(ClipLoader(dataset(videos, with_meta=True)), 7)
    got = take(
        ClipLoader(dataset(videos, with_meta=True), workers=workers, timeout=WORKER_TIMEOUT), 7
    )
    assert [m["batch"] for _, m in got] == list(range(7))
    assert_same_batches(reference, got)


@pytest.mark.parametrize("workers", [1, 2])
def test_indexed_shards_give_the_same_batches_in_workers(shards: list[str], workers: int) -> None:
    def make() -> ClipDataset:
        return ClipDataset(
            shards, BATCH, frames=FRAMES, fps=12.0, threads=1, size=SIZE, with_meta=True
        )

    reference = take(ClipLoader(make()), 5)
    assert {m for _, meta in reference for m in meta["source"]} == set(shards)
    got = take(ClipLoader(make(), workers=workers, timeout=WORKER_TIMEOUT), 5)
    assert_same_batches(reference, got)


def test_plain_dataloader_gives_the_same_batches(videos: Path) -> None:
    ds = dataset(videos)
    reference = [ds.read_batch(i) for i in range(4)]  # opens a reader in this process first
    got = []
    for batch in DataLoader(ds, batch_size=None, num_workers=2, timeout=WORKER_TIMEOUT):
        got.append(batch)
        if len(got) == 4:
            break
    assert_same_batches(reference, got)


def test_direct_iteration_gives_the_same_batches_pinned_where_cuda_is(videos: Path) -> None:
    """Iterated without a loader, the dataset decodes here: its batches are the stream's, in
    pinned memory when CUDA is available (so ``.cuda(non_blocking=True)`` overlaps)."""
    ds = dataset(videos)
    reference = [ds.read_batch(i) for i in range(3)]
    stream = iter(dataset(videos))
    got = [next(stream) for _ in range(3)]
    stream.close()  # type: ignore[attr-defined]
    assert_same_batches(reference, got)
    assert all(batch.is_pinned() == torch.cuda.is_available() for batch in got)


def test_the_dataset_iterates_from_its_resume_point_after_a_loader_with_workers(
    videos: Path,
) -> None:
    """A ClipLoader whose workers started at batch 3 leaves the dataset as it was: iterating
    the dataset itself starts at its resume point (batch 0; after ``resume_at``, that batch)."""
    ds = dataset(videos)
    first, third = ds.read_batch(0), ds.read_batch(3)
    loader = ClipLoader(ds, workers=1, timeout=WORKER_TIMEOUT)
    take(loader, 3)
    take(loader, 1)  # a second iteration: its workers start at batch 3
    assert torch.equal(next(iter(ds)), first)
    ds.resume_at(ds.seed, 3 * BATCH, 3)
    assert torch.equal(next(iter(ds)), third)


def test_a_loader_made_around_a_resumed_dataset_starts_at_its_resume_point(
    videos: Path,
) -> None:
    """A dataset resumed by one loader (or ``resume_at``) and given to a new one, as a training
    framework makes a loader per stage: the new loader continues there, and saves that state."""
    straight = take(ClipLoader(dataset(videos, seed=3)), 5)
    first = ClipLoader(dataset(videos, seed=3))
    take(first, 3)
    state = first.state_dict()
    ds = dataset(videos)
    ClipLoader(ds).load_state_dict(state)
    again = ClipLoader(ds)
    assert again.state_dict() == state
    assert_same_batches(take(again, 2), straight[3:])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [0, 1, 3, 5])
def test_resume_continues_with_the_batches_of_a_straight_run(
    videos: Path, workers: int, stop: int
) -> None:
    straight = take(ClipLoader(dataset(videos, seed=3)), 7)
    first = ClipLoader(dataset(videos, seed=3), workers=workers, timeout=WORKER_TIMEOUT)
    assert_same_batches(take(first, stop) if stop else [], straight[:stop])
    state = first.state_dict()
    assert state == {
        "version": STATE_VERSION,
        "stream": 2,
        "seed": 3,
        "samples": stop * BATCH,
        "source_samples": [stop * BATCH],
        "batch": stop,
        "sources": {
            "kind": "videos",
            "items": [len(LENGTHS)],
            "names": [names_digest([f"v{i}.mp4" for i in range(len(LENGTHS))])],
            "epochs": False,
            "weights": [1.0],
        },
    }
    resumed = ClipLoader(
        dataset(videos, seed=999), workers=workers, timeout=WORKER_TIMEOUT
    )  # the state brings the seed
    resumed.load_state_dict(state)
    assert_same_batches(take(resumed, 7 - stop), straight[stop:])


def test_lookahead_counts_fetched_ahead_batches_as_unseen(videos: Path) -> None:
    loader = ClipLoader(dataset(videos), lookahead=1)
    assert loader.state_dict()["batch"] == 0
    it = iter(loader)
    next(it)
    assert loader.state_dict()["batch"] == 0  # fetched batch 0, training on it: nothing done yet
    next(it)
    next(it)
    assert loader.state_dict()["batch"] == 2
    # a new iteration (as after a checkpoint) starts at the first batch not trained on
    again = iter(loader)
    assert next(again).equal(dataset(videos).read_batch(2))
    with pytest.raises(StopIteration):
        next(it)  # the older iteration is superseded


def test_a_new_iteration_continues_the_stream(videos: Path) -> None:
    straight = take(ClipLoader(dataset(videos)), 5)
    loader = ClipLoader(dataset(videos))
    got = take(loader, 2) + take(loader, 3)
    assert_same_batches(got, straight)


def test_ranks_take_interleaved_blocks_of_one_stream(
    videos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    per_rank = [
        [dataset(videos, rank=r, world_size=3).indices(b, 1000).tolist() for b in range(20)]
        for r in range(3)
    ]
    one = [dataset(videos, batch_size=3 * BATCH).indices(b, 1000).tolist() for b in range(20)]
    for b in range(20):
        assert per_rank[0][b] + per_rank[1][b] + per_rank[2][b] == one[b]
    assert len({tuple(x) for r in per_rank for x in r}) == 60  # no two batches alike
    # ranks from the environment when torch.distributed is not initialised
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert rank_and_world() == (2, 3)
    from_env = dataset(videos)
    assert [from_env.indices(b, 1000).tolist() for b in range(20)] == per_rank[2]
    loader_batches = take(ClipLoader(dataset(videos, with_meta=True)), 2)
    explicit = take(ClipLoader(dataset(videos, rank=2, world_size=3, with_meta=True)), 2)
    assert_same_batches(loader_batches, explicit)
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(ValueError, match="RANK"):
        rank_and_world()


def test_torch_distributed_takes_precedence_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        assert rank_and_world() == (0, 1)
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize(("n", "world", "batch"), [(6, 1, 3), (6, 2, 3), (7, 3, 2), (10, 4, 3)])
def test_epochs_visit_every_video_once_per_epoch_across_ranks(
    videos: Path, n: int, world: int, batch: int
) -> None:
    rounds = 4 * n  # batches per rank: enough for several epochs whatever n, world and batch
    streams = [
        np.concatenate(
            [
                dataset(
                    videos, batch_size=batch, epochs=True, seed=7, rank=r, world_size=world
                ).indices(b, n)
                for b in range(rounds)
            ]
        )
        for r in range(world)
    ]
    # the global stream: step s holds rank 0's batch, then rank 1's, ...
    merged = np.stack([x.reshape(rounds, batch) for x in streams], axis=1).reshape(-1)
    epochs = len(merged) // n
    assert epochs >= 4
    orders = merged[: epochs * n].reshape(epochs, n)
    for order in orders:
        np.testing.assert_array_equal(np.sort(order), np.arange(n))
    assert len({tuple(o) for o in orders}) > 1  # each epoch has its own order
    assert any(sorted(s.tolist()) != s.tolist() for s in orders)


def test_epoch_mode_batches_hold_the_drawn_videos(videos: Path) -> None:
    n = len(LENGTHS)
    seen: list[int] = []
    for rank in range(2):
        ds = dataset(videos, epochs=True, rank=rank, world_size=2, with_meta=True)
        batches = take(
            ClipLoader(ds, workers=rank, timeout=WORKER_TIMEOUT), 2
        )  # in process for rank 0, a worker for 1
        for b, (_, meta) in enumerate(batches):
            assert meta["video"].tolist() == ds.indices(b, n).tolist()
            seen += meta["video"].tolist()
    assert sorted(seen) == sorted(list(range(n)) * 2)  # 2 ranks x 2 batches x 3 = two epochs


@pytest.mark.parametrize("workers", [0, 1])
def test_errors_reach_the_training_loop_naming_the_file(broken: Path, workers: int) -> None:
    loader = ClipLoader(dataset(broken), workers=workers, timeout=WORKER_TIMEOUT)
    with pytest.raises(Exception, match=r"broken\.mp4") as raised:
        take(loader, 2)
    assert "NAL" in str(raised.value) or "frames" in str(raised.value)


@pytest.fixture(scope="session")
def mostly_good(videos: Path, broken: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The six good videos, one whose samples are garbage (fails while decoding) and one with
    no video track (fails while planning)."""
    root = tmp_path_factory.mktemp("mostly_good")
    for i in range(len(LENGTHS)):
        shutil.copy(videos / f"v{i}.mp4", root / f"v{i}.mp4")
    shutil.copy(broken / "broken.mp4", root / "broken.mp4")
    (root / "silent.mp4").write_bytes(b"\0\0\0\x18ftypisom\0\0\0\0isomavc1" + b"\0" * 64)
    return root


def test_replace_fills_every_batch_and_names_what_it_replaced(mostly_good: Path) -> None:
    """``on_error="replace"``: every batch full, the bad videos never in it, a warning naming
    each (in the process that reads), and the same batches in worker processes and from
    ``read_batch`` alone."""
    with pytest.warns(UserWarning, match=r"replaced: .*(broken|silent)\.mp4") as caught:
        replacing = dataset(mostly_good, on_error="replace", with_meta=True, seed=5)
        batches = take(ClipLoader(replacing, timeout=WORKER_TIMEOUT), 6)
    named = {name for w in caught for name in ("broken.mp4", "silent.mp4") if name in str(w)}
    assert named == {"broken.mp4", "silent.mp4"}
    members = [m for _, meta in batches for m in meta["member"]]
    assert len(members) == 6 * BATCH
    assert not {"broken.mp4", "silent.mp4"} & set(members)
    in_workers = dataset(mostly_good, on_error="replace", with_meta=True, seed=5)
    loader = ClipLoader(in_workers, workers=2, timeout=WORKER_TIMEOUT)
    assert_same_batches(batches, take(loader, 6))
    alone = dataset(mostly_good, on_error="replace", with_meta=True, seed=5)
    with pytest.warns(UserWarning):
        assert_same_batches(batches, [alone.read_batch(b) for b in range(6)])


@pytest.fixture(scope="session")
def two_matrices(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two natural-looking H.264 videos: one BT.601 (untagged), one tagged BT.709."""
    root = tmp_path_factory.mktemp("matrices")
    bt709 = {"colorspace": "bt709", "color_primaries": "bt709", "color_trc": "bt709"}
    for name, options in (("bt601", {}), ("bt709", bt709)):
        spec = VideoSpec(codec="h264", width=96, height=72, frames=24, blur=1.5, options=options)
        make_video(spec, str(root / f"{name}.mp4"))
    return root


def rgb_and_yuv_batches(source: Path, mode: str, **kw: Any) -> list[tuple[Any, Any]]:
    """Batches 0-3 of the same dataset in rgb mode and in ``mode``, side by side."""
    options: dict[str, Any] = dict(with_meta=True, seed=2, vflip=0.5, crop="random", **kw)
    rgb, yuv = dataset(source, **options), dataset(source, mode=mode, **options)
    return [(rgb.read_batch(b), yuv.read_batch(b)) for b in range(4)]


@pytest.mark.parametrize("mode", ["yuv", "yuv_resized"])
def test_yuv_batches_with_their_meta_finish_as_the_rgb_batches(
    two_matrices: Path, mode: str
) -> None:
    """``yuv_to_rgb((batch, meta))`` takes each clip's matrix, range, crop and flips from the
    meta: ``yuv`` gives the rgb batch up to the conversion's last bit; ``yuv_resized`` (chroma
    resized before upsampling) stays close. Converting the BT.709 clips as BT.601 does not."""
    for (rgb, rgb_meta), (yuv, meta) in rgb_and_yuv_batches(two_matrices, mode):
        assert meta["mode"] == mode and meta["size"] == SIZE
        assert torch.equal(meta["crops"], rgb_meta["crops"])
        assert torch.equal(meta["flips"], rgb_meta["flips"])
        assert meta["colorspaces"] == [m.removesuffix(".mp4") for m in meta["member"]]
        assert not meta["full_range"].any()
        finished = yuv_to_rgb((yuv, meta))
        wrong = yuv_to_rgb((yuv, meta), colorspaces="bt601")
        assert finished.shape == rgb.shape
        if mode == "yuv":
            diff = (finished.int() - rgb.int()).abs()
            assert diff.max() <= 1 and (diff > 0).float().mean() < 0.01
        for k, name in enumerate(meta["colorspaces"]):
            right = psnr(finished[k].numpy(), rgb[k].numpy())
            assert right > 30
            if name == "bt709":
                assert psnr(wrong[k].numpy(), rgb[k].numpy()) < right - 1


def test_replaced_items_keep_their_pixel_meta(mostly_good: Path) -> None:
    """A batch mended item by item (``on_error="replace"``) still carries every item's crop,
    flips and matrix."""
    with pytest.warns(UserWarning, match="replaced"):
        pairs = rgb_and_yuv_batches(mostly_good, "yuv", on_error="replace")
    for (rgb, rgb_meta), (yuv, meta) in pairs:
        assert torch.equal(meta["video"], rgb_meta["video"])
        assert meta["crops"].shape == (BATCH, 4) and len(meta["colorspaces"]) == BATCH
        diff = (yuv_to_rgb((yuv, meta)).int() - rgb.int()).abs()
        assert diff.max() <= 1


def test_yuv_modes_need_the_meta(videos: Path) -> None:
    with pytest.raises(ValueError, match="with_meta=True"):
        dataset(videos, mode="yuv_resized")


def test_raise_is_the_default_and_names_the_file(mostly_good: Path) -> None:
    loader = ClipLoader(dataset(mostly_good, seed=5), timeout=WORKER_TIMEOUT)
    with pytest.raises(kohakuclip.KohakuClipError, match=r"(broken|silent)\.mp4"):
        take(loader, 6)


def test_only_errors_about_an_item_s_data_are_replaced() -> None:
    from kohakuclip.torch import _about_data

    def caused(error: Exception, cause: Exception) -> Exception:
        error.__cause__ = cause
        return error

    storage = kohakuclip.ObjectStoreError("s3://b/x.zip: timed out after retries")
    assert _about_data(kohakuclip.ClipError("x.zip:a.mp4: frames [0]: libavcodec: ..."))
    assert _about_data(kohakuclip.MissingObjectError("s3://b/x.zip: not found"))
    assert not _about_data(storage)
    assert not _about_data(caused(kohakuclip.ClipError("x.zip:a.mp4: frames [0]"), storage))
    assert not _about_data(kohakuclip.PoolClosedError("the pool is closed"))
    resolved = caused(kohakuclip.SourceError("s3://b/x.zip: timed out"), storage)
    assert not _about_data(caused(kohakuclip.ClipError("x.zip:a.mp4: frames [0]"), resolved))


def test_missing_sources_fail_at_first_use(tmp_path: Path) -> None:
    loader = ClipLoader(ClipDataset(str(tmp_path / "nowhere"), batch_size=2, size=SIZE))
    with pytest.raises(Exception, match="nowhere"):
        take(loader, 1)


def test_empty_folder_is_a_clear_error(tmp_path: Path) -> None:
    loader = ClipLoader(ClipDataset(str(tmp_path), batch_size=2, size=SIZE))
    with pytest.raises(ValueError, match="no videos"):
        take(loader, 1)


class _ReaderReportingClips(ClipDataset):
    """Adds to each batch's meta which process made it and with which reader object."""

    def _meta(self, reader: Any, batch: int, items: list[Any]) -> dict[str, Any]:
        return {"pid": os.getpid(), "reader": id(reader)}


def test_worker_processes_never_use_the_parents_reader(videos: Path) -> None:
    ds = _ReaderReportingClips(
        str(videos), BATCH, frames=FRAMES, size=SIZE, threads=1, with_meta=True
    )
    reference = [ds.read_batch(i) for i in range(3)]
    parent = ds._reader
    assert {m["reader"] for _, m in reference} == {id(parent)}
    got = take(ClipLoader(ds, workers=2, timeout=WORKER_TIMEOUT), 3)
    for (video, meta), (expected, _) in zip(got, reference):
        assert torch.equal(video, expected)
        assert meta["pid"] != os.getpid()
        assert meta["reader"] != id(parent)  # the inherited copy sits at the parent's address
    assert len({m["pid"] for _, m in got}) == 2
    assert ds._reader is parent  # left open and idle in the parent, and still working
    assert torch.equal(ds.read_batch(1)[0], reference[1][0])


def test_global_random_state_is_untouched(videos: Path) -> None:
    np.random.seed(1)
    torch.manual_seed(1)
    np_state, torch_state = np.random.get_state()[1].copy(), torch.get_rng_state().clone()
    take(ClipLoader(dataset(videos)), 2)
    take(ClipLoader(dataset(videos, epochs=True), workers=1, timeout=WORKER_TIMEOUT), 2)
    np.testing.assert_array_equal(np.random.get_state()[1], np_state)
    assert torch.equal(torch.get_rng_state(), torch_state)


def test_metadata_names_each_clip(videos: Path) -> None:
    _, meta = take(ClipLoader(dataset(videos, with_meta=True, seed=2)), 1)[0]
    assert set(meta) == {
        *("batch", "video", "frames", "source", "member", "meta"),
        *("sample", "mix", "mix_name"),
        *("mode", "size", "crops", "flips", "colorspaces", "full_range"),
    }
    assert meta["sample"].tolist() == list(range(BATCH))
    assert meta["mix"].tolist() == [0] * BATCH and meta["mix_name"] == ["0"] * BATCH
    assert meta["video"].dtype == torch.int64 and meta["video"].shape == (BATCH,)
    assert meta["frames"].shape == (BATCH, FRAMES)
    for vid, member, frames in zip(meta["video"].tolist(), meta["member"], meta["frames"]):
        assert member == f"v{vid}.mp4"
        assert int(frames.min()) >= 0 and int(frames.max()) < LENGTHS[vid]
        assert (frames[1:] - frames[:-1]).eq(1).all()  # native rate: consecutive frames
    assert meta["source"] == [str(videos)] * BATCH
    assert isinstance(meta["meta"], dict)


def test_collate_meta_batches_values_by_type() -> None:
    records = [
        {"label": 3, "score": 0.5, "caption": "a cat", "ok": True, "tags": ["x"]},
        {"label": 7, "score": 1, "caption": "a dog", "ok": False},
    ]
    out = collate_meta(records)
    assert out["label"].dtype == torch.int64 and out["label"].tolist() == [3, 7]
    assert out["score"].dtype == torch.float32 and out["score"].tolist() == [0.5, 1.0]
    assert out["ok"].dtype == torch.bool and out["ok"].tolist() == [True, False]
    assert out["caption"] == ["a cat", "a dog"]
    assert out["tags"] == [["x"], None]
    assert collate_meta([{}, {}]) == {}


def test_custom_sampler_and_spread(videos: Path) -> None:
    ds = dataset(videos, sampler=kohakuclip.random_frames, frames=5, with_meta=True)
    _, meta = ds.read_batch(0)
    for j, (vid, frames) in enumerate(zip(meta["video"].tolist(), meta["frames"].tolist())):
        rng = sample_rng(0, j)
        assert vid == int(rng.integers(len(LENGTHS)))
        assert frames == kohakuclip.random_frames(LENGTHS[vid], 5, rng)
    _, meta = dataset(videos, spread=True, with_meta=True).read_batch(0)
    for vid, frames in zip(meta["video"].tolist(), meta["frames"].tolist()):
        assert frames[-1] - frames[0] >= LENGTHS[vid] // 2  # spans the video


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(batch_size=0), "batch_size"),
        (dict(frames=0), "frames"),
        (dict(fps=0.0), "fps"),
        (dict(threads=0), "threads"),
        (dict(rank=1), "rank"),
        (dict(rank=2, world_size=2), "rank"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.5), "seed"),
        (dict(on_error="skip"), "on_error"),
    ],
)
def test_bad_dataset_arguments(videos: Path, kw: dict, match: str) -> None:
    with pytest.raises((ValueError, TypeError), match=match):
        dataset(videos, **kw)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(workers=-1), "workers"),
        (dict(prefetch=0), "prefetch"),
        (dict(lookahead=-1), "lookahead"),
    ],
)
def test_bad_loader_arguments(videos: Path, kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ClipLoader(dataset(videos), **kw)


def test_bad_state_is_refused(videos: Path) -> None:
    loader = ClipLoader(dataset(videos))
    good = loader.state_dict()
    with pytest.raises(ValueError, match="version 3"):
        loader.load_state_dict({**good, "version": 3})
    with pytest.raises(ValueError, match=">= 0"):
        loader.load_state_dict({**good, "samples": -1})
    with pytest.raises(ValueError, match="add up"):
        loader.load_state_dict({**good, "samples": 5})
    with pytest.raises(ValueError, match="no 'samples', 'source_samples', 'batch', 'sources'"):
        loader.load_state_dict({"version": STATE_VERSION, "seed": 0})
    with pytest.raises(ValueError, match="sources: no 'items'"):
        loader.load_state_dict({**good, "sources": {"kind": "videos"}})
    for key, value in (("stream", None), ("seed", "x"), ("source_samples", [None])):
        with pytest.raises(ValueError, match=f"state's '{key}' must be whole numbers"):
            loader.load_state_dict({**good, key: value})
    with pytest.raises(TypeError, match="dict"):
        loader.load_state_dict([("seed", 0)])  # type: ignore[arg-type]
    # a state without a version (the seed and a batch count) still loads, with a warning
    with pytest.raises(ValueError, match="batch"):
        loader.load_state_dict({"seed": 0, "batch": -1})
    with pytest.raises(ValueError, match="no 'seed'"):
        loader.load_state_dict({"batch": 2})
    with pytest.raises(ValueError, match="no 'seed', 'batch'"):
        loader.load_state_dict({"weight": 1.0})
    with pytest.warns(UserWarning, match="without a version"):
        loader.load_state_dict({"seed": 4, "batch": 2})
    state = loader.state_dict()
    assert (state["seed"], state["samples"], state["batch"]) == (4, 2 * BATCH, 2)
    _, meta = ClipLoader(dataset(videos, with_meta=True, seed=4)).dataset.read_batch(2)
    loader.dataset.with_meta = True
    assert take(loader, 1)[0][1]["sample"].tolist() == meta["sample"].tolist()


def test_kohakuclip_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import kohakuclip, kohakuclip.read.permute\n"
        "try:\n    import kohakuclip.torch\nexcept ImportError:\n    print('no torch layer')\n"
    )
    src = str(Path(__file__).parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "no torch layer"


EXAMPLES = Path(__file__).parents[1] / "examples"


def run_torch_loop(videos: Path, steps: int, checkpoint: Path, *extra: str) -> list[float]:
    """The plain-loop example in its own process; returns the losses it printed."""
    cmd = [
        sys.executable, str(EXAMPLES / "torch_loop.py"), str(videos), "--steps", str(steps),
        "--checkpoint", str(checkpoint), "--save-every", "2", "--batch-size", "2",
        "--frames", "4", "--size", "32", "--threads", "1", *extra,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [float(line.split()[-1]) for line in done.stdout.splitlines() if " loss " in line]


def test_torch_loop_example_resumes_exactly(videos: Path, tmp_path: Path) -> None:
    straight = run_torch_loop(videos, 6, tmp_path / "straight.pt")
    interrupted = tmp_path / "interrupted.pt"
    first = run_torch_loop(videos, 3, interrupted)
    state = torch.load(interrupted)
    assert state["step"] == 3
    assert state["loader"]["seed"] == 0 and state["loader"]["batch"] == 3
    assert state["loader"]["samples"] == 3 * 2
    rest = run_torch_loop(videos, 6, interrupted, "--workers", "2")
    assert len(straight) == 6 and len(first) == 3 and len(rest) == 3
    np.testing.assert_allclose(first + rest, straight, rtol=1e-5)
    assert len(set(straight)) == 6


def read_trace(path: Path) -> tuple[dict[tuple[int, int], tuple[int, int, float]], dict]:
    """From the Lightning example's --trace file: (rank, step) -> (epoch, batch checksum, loss),
    and global sample index -> clip checksum."""
    steps, samples = {}, {}
    for line in path.read_text().splitlines():
        rank, step, epoch, checksum, loss, *clips = line.split()
        steps[int(rank), int(step)] = (int(epoch), int(checksum), float(loss))
        for clip in clips:
            g, crc = clip.split(":")
            assert int(g) not in samples, g  # no sample twice
            samples[int(g)] = int(crc)
    return steps, samples


def run_lightning(videos: Path, tmp_path: Path, trace: str, *extra: str) -> None:
    """The Lightning example on tiny clips, in its own process (DDP re-launches the script)."""
    cmd = [
        sys.executable, str(EXAMPLES / "lightning_module.py"), str(videos),
        "--accelerator", "cpu", "--save-every", "2", "--batch-size", "2", "--frames", "4",
        "--size", "32", "--threads", "1", "--checkpoints", str(tmp_path / "ckpt"),
        "--trace", str(tmp_path / trace), *extra,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def assert_resumed_matches(resumed: dict, straight: dict) -> None:
    for key, (epoch, checksum, loss) in resumed.items():
        assert (epoch, checksum) == straight[key][:2], key
        assert loss == pytest.approx(straight[key][2], rel=1e-5)


def loader_state(ckpt: Path) -> dict:
    state = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]
    (loader,) = state["combined_loader"]
    return loader


@pytest.mark.slow
def test_lightning_ddp_resume_matches_a_straight_run(videos: Path, tmp_path: Path) -> None:
    """Two DDP ranks of batch 2, resumed at step 2 on two ranks and at step 4 on one device of
    batch 4: the same samples, and (gradients being averaged over the ranks) the same losses."""
    pytest.importorskip("lightning", reason="Lightning is not installed")
    ddp = ("--devices", "2", "--steps", "6")
    run_lightning(videos, tmp_path, "straight.txt", *ddp)
    straight, samples = read_trace(tmp_path / "straight.txt")
    assert sorted(straight) == [(r, s) for r in range(2) for s in range(6)]
    assert sorted(samples) == list(range(24))  # step s of rank r: samples (2 s + r) 2 + j
    for step in range(6):  # two DDP ranks, two different batches at every step
        assert straight[0, step][1] != straight[1, step][1]
    ckpt = tmp_path / "ckpt" / "step2.ckpt"
    state = loader_state(ckpt)
    assert (state["seed"], state["samples"], state["batch"]) == (0, 8, 2)
    run_lightning(videos, tmp_path, "resumed2.txt", *ddp, "--resume", str(ckpt), "--workers", "1")
    resumed, clips = read_trace(tmp_path / "resumed2.txt")
    assert sorted(resumed) == [(r, s) for r in range(2) for s in range(2, 6)]
    assert_resumed_matches(resumed, straight)
    assert clips == {g: samples[g] for g in range(8, 24)}
    # another device count and batch: one device of batch 4 from the DDP run's step 4
    ckpt = tmp_path / "ckpt" / "step4.ckpt"
    assert loader_state(ckpt)["samples"] == 16
    one = ("--devices", "1", "--steps", "6", "--batch-size", "4")
    run_lightning(videos, tmp_path, "resumed4.txt", *one, "--resume", str(ckpt))
    resumed, clips = read_trace(tmp_path / "resumed4.txt")
    assert sorted(resumed) == [(0, 4), (0, 5)]
    assert clips == {g: samples[g] for g in range(16, 24)}
    for step in (4, 5):
        mean = (straight[0, step][2] + straight[1, step][2]) / 2
        assert resumed[0, step][2] == pytest.approx(mean, rel=1e-4)


@pytest.mark.slow
def test_lightning_epochs_resume_mid_epoch_and_at_a_boundary(videos: Path, tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="Lightning is not installed")
    epochs = ("--devices", "1", "--epoch-batches", "3", "--epochs", "3")
    run_lightning(videos, tmp_path, "straight.txt", *epochs)
    straight, samples = read_trace(tmp_path / "straight.txt")
    assert sorted(straight) == [(0, s) for s in range(9)]
    assert [straight[0, s][0] for s in range(9)] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert len({checksum for _, checksum, _ in straight.values()}) == 9  # no batch repeats
    assert sorted(samples) == list(range(18))
    for at in (4, 6):  # inside epoch 1, and the end of epoch 1
        ckpt = tmp_path / "ckpt" / f"step{at}.ckpt"
        state = loader_state(ckpt)
        assert (state["seed"], state["samples"], state["batch"]) == (0, 2 * at, at)
        run_lightning(videos, tmp_path, f"resumed{at}.txt", *epochs, "--resume", str(ckpt))
        resumed, clips = read_trace(tmp_path / f"resumed{at}.txt")
        assert sorted(resumed) == [(0, s) for s in range(at, 9)]
        assert_resumed_matches(resumed, straight)
        assert clips == {g: samples[g] for g in range(2 * at, 18)}


def test_forkserver_workers_give_the_same_batches(videos: Path) -> None:
    reference = take(ClipLoader(dataset(videos)), 3)
    loader = ClipLoader(
        dataset(videos), workers=1, timeout=WORKER_TIMEOUT, multiprocessing_context="forkserver"
    )
    assert_same_batches(take(loader, 3), reference)


def test_url_sources_choose_forkserver_and_carry_credentials_local_ones_do_not(
    videos: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A URL anywhere in a mixture makes ClipLoader's workers start with forkserver and the
    pickled dataset carry the AWS_* / GOOGLE_* / AZURE_* variables; a local dataset carries no
    credentials (it could be pickled to disk)."""
    import pickle

    from kohakuclip.torch import _context_for

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not for local datasets")
    mixed = dataset(
        {"local": str(videos), "bucket": "s3://bucket/x.zip"}, weights={"local": 1, "bucket": 1}
    )
    local = dataset(videos)
    assert (_context_for(mixed), _context_for(local)) == ("forkserver", None)
    assert b"not for local datasets" in pickle.dumps(mixed)
    assert b"not for local datasets" not in pickle.dumps(local)


def test_an_abandoned_iteration_leaves_the_decode_threads_idle(videos: Path) -> None:
    loader = ClipLoader(dataset(videos, threads=2), prefetch=4)
    it = iter(loader)
    next(it)
    reader = loader.dataset._reader
    it.close()  # three batches were still decoding
    stats = reader.stats()
    assert stats["clips"] == 4 * BATCH  # all of them finished before close() returned


def test_in_process_loading_keeps_four_batches_decoding_by_default(videos: Path) -> None:
    """One batch ahead left 15 threads 61 % busy on 16 cores (each waits for the batch's
    slowest share); four keep them busy. Worker processes keep the DataLoader's two."""
    loader = ClipLoader(dataset(videos, threads=2))
    direct = dataset(videos, threads=2)
    for source, ds in ((loader, loader.dataset), (direct, direct)):
        it = iter(source)
        next(it)
        it.close()
        assert ds._reader.stats()["clips"] == 4 * BATCH
    assert ClipLoader(dataset(videos), workers=2).prefetch == 2


def test_nothing_is_decoded_past_an_epochs_end(videos: Path) -> None:
    """With ``batches=N`` the loader stops at the epoch's end, so it decodes no batch after it
    (4 are in flight by default); the next epoch goes on where this one stopped."""
    loader = ClipLoader(dataset(videos, threads=2), batches=2)
    first = list(loader)
    assert len(first) == 2
    assert loader.dataset._reader.stats()["clips"] == 2 * BATCH
    straight = take(ClipLoader(dataset(videos, threads=2)), 4)
    assert_same_batches(first + list(loader), straight)
    workers = ClipLoader(dataset(videos), workers=2, batches=3, timeout=WORKER_TIMEOUT)
    assert_same_batches(list(workers) + list(workers), take(ClipLoader(dataset(videos)), 6))


def test_default_threads_share_the_cpus(videos: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cpus = len(os.sched_getaffinity(0))
    ds = dataset(videos, threads=None)
    ds.read_batch(0)
    assert ds._reader.threads == cpus
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cpus * 2))  # more ranks than CPUs: one each
    ds = dataset(videos, threads=None)
    ds.read_batch(0)
    assert ds._reader.threads == 1


def test_write_time_metadata_is_collated_into_the_batch(shards: list[str]) -> None:
    ds = ClipDataset(shards, 4, frames=FRAMES, seed=4, size=SIZE, threads=1, with_meta=True)
    for _, meta in take(ClipLoader(ds, workers=1, timeout=WORKER_TIMEOUT), 3):
        ids = [int(m[1:-4]) for m in meta["member"]]  # v<i>.mp4
        assert meta["meta"]["label"].dtype == torch.int64
        assert meta["meta"]["label"].tolist() == [10 * i for i in ids]
        assert meta["meta"]["score"].tolist() == [i / 2 for i in ids]
        captions = meta["meta"].get("caption", [None] * len(ids))
        assert captions == [f"video {i}" if i % 2 == 0 else None for i in ids]
        extra = meta["meta"].get("extra", [None] * len(ids))
        assert extra == [{"odd": True} if i % 2 else None for i in ids]


def test_epochs_of_a_fixed_number_of_batches(videos: Path) -> None:
    straight = [dataset(videos).read_batch(i) for i in range(7)]
    loader = ClipLoader(dataset(videos), batches=3, lookahead=1)
    assert len(loader) == 3
    assert_same_batches(list(loader), straight[0:3])
    # the consumer asked past the end: nothing was fetched ahead, the next epoch starts at 3
    assert loader.state_dict()["batch"] == 3
    it = iter(loader)
    assert_same_batches([next(it), next(it)], straight[3:5])
    assert loader.state_dict()["batch"] == 4  # mid-epoch, one fetched ahead
    resumed = ClipLoader(dataset(videos), batches=3)
    resumed.load_state_dict(loader.state_dict())
    assert_same_batches(list(resumed), straight[4:6])  # the rest of epoch 1 only
    assert_same_batches(
        list(resumed), straight[6:7] + [dataset(videos).read_batch(i) for i in (7, 8)]
    )
    with pytest.raises(TypeError, match="length"):
        len(ClipLoader(dataset(videos)))
    with pytest.raises(ValueError, match="batches"):
        ClipLoader(dataset(videos), batches=0)

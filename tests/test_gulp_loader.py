"""kohakuclip.gulp.loader.DataLoader against the dataset's own items, in and out of workers."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kohakuclip.gulp import GulpError
from kohakuclip.gulp.dataset import GulpImageDataset, GulpVideoDataset
from kohakuclip.gulp.loader import DataLoader, collate
from kohakuclip.gulp.transforms import ComposeVideo, RandHorFlipVideo, RandomCropVideo
from tests.media import write_gulp_dir

LENGTHS = {f"v{i}": n for i, n in enumerate((12, 9, 15, 7, 11, 10, 14))}
LABEL2IDX = {"a": 0, "b": 1, "c": 2}
WORKER_TIMEOUT = 120  # seconds: a hung worker fails the test


@pytest.fixture(scope="module")
def gulp_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Seven videos of 56 x 72 frames over two chunks, labelled a, b, c in turn."""
    root = tmp_path_factory.mktemp("gulp_loader")
    labels = {id_: "abc"[k % 3] for k, id_ in enumerate(LENGTHS)}
    return write_gulp_dir(str(root), LENGTHS, labels, LABEL2IDX, per_chunk=4)


def training_set(gulp_dir: str, seed: int = 1) -> GulpVideoDataset:
    """Random clip starts, crops and flips: every item depends on (seed, epoch, index)."""
    transform = ComposeVideo([], [RandomCropVideo(40), RandHorFlipVideo()])
    return GulpVideoDataset(gulp_dir, 4, 2, is_val=False, transform=transform, seed=seed)


def expected_batch(dataset: Any, epoch: int, indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
    dataset.set_epoch(epoch)
    items = [dataset[i] for i in indices]
    return np.stack([frames for frames, _ in items]), np.array([label for _, label in items])


def assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for (frames_a, labels_a), (frames_b, labels_b) in zip(a, b, strict=True):
        assert np.array_equal(frames_a, frames_b)
        assert np.array_equal(labels_a, labels_b)


def test_batches_are_the_items_in_order_as_numpy(gulp_dir: str) -> None:
    dataset = GulpVideoDataset(gulp_dir, 3, 2, is_val=True)
    loader = DataLoader(dataset, batch_size=3)
    batches = list(loader)
    assert len(loader) == len(batches) == 3
    for b, (frames, labels) in enumerate(batches):
        indices = list(range(3 * b, min(3 * b + 3, 7)))
        want_frames, want_labels = expected_batch(dataset, 0, indices)
        assert isinstance(frames, np.ndarray) and frames.dtype == np.uint8
        assert frames.shape == (len(indices), 3, 56, 72, 3)
        assert labels.dtype == np.int64
        assert np.array_equal(frames, want_frames)
        assert np.array_equal(labels, want_labels)
    dropped = DataLoader(dataset, batch_size=3, drop_last=True)
    assert len(dropped) == 2 and [len(labels) for _, labels in dropped] == [3, 3]


@pytest.mark.parametrize("workers", [0, 2])
def test_small_and_empty_datasets(gulp_dir: str, workers: int) -> None:
    whole = list(DataLoader(GulpImageDataset(gulp_dir), batch_size=100, num_workers=workers))
    assert len(whole) == 1 and whole[0][1].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert list(DataLoader(GulpImageDataset(gulp_dir), 100, drop_last=True)) == []
    assert list(DataLoader([], batch_size=2, num_workers=workers)) == []
    assert not multiprocessing.active_children()


def test_shuffled_epochs_visit_every_item_once_in_a_new_order(gulp_dir: str) -> None:
    loader = DataLoader(GulpImageDataset(gulp_dir), batch_size=2, shuffle=True, seed=4)
    orders = [[i for batch in loader.batches(epoch) for i in batch] for epoch in range(3)]
    assert all(sorted(order) == list(range(7)) for order in orders)
    assert len({tuple(order) for order in orders}) == 3
    again = DataLoader(GulpImageDataset(gulp_dir), batch_size=2, shuffle=True, seed=4)
    assert again.batches(1) == loader.batches(1)
    dataset = GulpImageDataset(gulp_dir)
    for epoch in range(2):
        got = list(loader)
        assert_same(got, [expected_batch(dataset, epoch, i) for i in loader.batches(epoch)])


@pytest.mark.parametrize("workers", [0, 2])
def test_samplers_choose_the_items(gulp_dir: str, workers: int) -> None:
    dataset = GulpImageDataset(gulp_dir)
    drawn = [6, 6, 0, 3, 5]  # with repeats, as weighted draws give
    by_sampler = DataLoader(dataset, 2, sampler=drawn, num_workers=workers)
    assert len(by_sampler) == 3 and by_sampler.batches(0) == [[6, 6], [0, 3], [5]]
    assert_same(list(by_sampler), [expected_batch(dataset, 0, b) for b in ([6, 6], [0, 3], [5])])
    groups = [[1, 2, 3], [4], [0, 6]]
    by_batches = DataLoader(dataset, batch_sampler=groups, num_workers=workers)
    assert len(by_batches) == 3
    assert_same(list(by_batches), [expected_batch(dataset, 0, b) for b in groups])
    as_array = DataLoader(dataset, 2, sampler=np.array(drawn))  # any iterable of indices
    assert as_array.batches(0) == by_sampler.batches(0)
    with pytest.raises(ValueError, match="batch_sampler replaces"):
        DataLoader(dataset, sampler=[], batch_sampler=groups)  # an empty sampler is given too
    with pytest.raises(ValueError, match="shuffle=True or a sampler"):
        DataLoader(dataset, shuffle=True, sampler=drawn)
    with pytest.raises(ValueError, match="batch_sampler replaces"):
        DataLoader(dataset, 2, batch_sampler=groups)


def test_gulpios_positional_order_and_pin_memory(gulp_dir: str) -> None:
    """GulpIO's DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers,
    collate_fn, pin_memory, drop_last), positionally as GulpIO code calls it; pin_memory=True
    warns and changes nothing."""
    dataset = GulpImageDataset(gulp_dir)
    drawn = [6, 6, 0, 3, 5]
    want = DataLoader(dataset, 2, sampler=drawn, drop_last=True)
    with pytest.warns(UserWarning, match=r"pin_memory=True\) does nothing"):
        positional = DataLoader(dataset, 2, False, drawn, None, 0, collate, True, True)
    assert positional.batches(0) == want.batches(0) == [[6, 6], [0, 3]]
    assert_same(list(positional), list(want))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_give_the_batches_of_one_process(gulp_dir: str, context: str) -> None:
    """Each iteration is the next epoch, with the same draws in workers as in this process."""
    here = DataLoader(training_set(gulp_dir), batch_size=3, shuffle=True)
    straight = [list(here) for _ in range(2)]
    assert not np.array_equal(straight[0][0][0], straight[1][0][0])  # epochs differ
    workers = DataLoader(
        training_set(gulp_dir),
        batch_size=3,
        shuffle=True,
        num_workers=2,
        timeout=WORKER_TIMEOUT,
        multiprocessing_context=context,
    )
    for epoch in range(2):
        assert_same(list(workers), straight[epoch])
    workers.set_epoch(1)
    assert_same(list(workers), straight[1])


class FailsAt:
    """A dataset whose item ``bad`` raises."""

    def __init__(self, dataset: Any, bad: int) -> None:
        self.dataset, self.bad = dataset, bad

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        if index == self.bad:
            raise GulpError(f"item {index}: broken on purpose")
        return self.dataset[index]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_item_error_reaches_the_loop_and_the_loader_keeps_working(
    gulp_dir: str, workers: int
) -> None:
    loader = DataLoader(
        FailsAt(GulpImageDataset(gulp_dir), 4),
        batch_size=2,
        num_workers=workers,
        timeout=WORKER_TIMEOUT,
    )
    got = []
    with pytest.raises(GulpError, match="item 4: broken on purpose"):
        for batch in loader:
            got.append(batch)
    assert len(got) == 2  # the batches before the broken one came through
    loader.dataset.bad = -1
    assert len(list(loader)) == 4


def test_an_abandoned_iteration_lets_its_workers_go(gulp_dir: str) -> None:
    loader = DataLoader(GulpImageDataset(gulp_dir), batch_size=1, num_workers=2, prefetch=2)
    batches = iter(loader)
    next(batches)
    assert multiprocessing.active_children()
    batches.close()  # type: ignore[attr-defined]
    assert not multiprocessing.active_children()  # closing joined them


class WorkerPid(FailsAt):
    """Items that say which process loaded them, beside the dataset's own."""

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __getitem__(self, index: int) -> Any:
        frames, label = self.dataset[index]
        return frames, label, os.getpid()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_serve_every_epoch(gulp_dir: str, context: str) -> None:
    """The same batches as in this process, epoch after epoch, from the same worker processes;
    an epoch left half-way leaves the next one whole; ``close`` stops them."""
    here = DataLoader(training_set(gulp_dir), batch_size=3, shuffle=True)
    straight = [list(here) for _ in range(3)]
    loader = DataLoader(
        WorkerPid(training_set(gulp_dir), -1),
        batch_size=3,
        shuffle=True,
        num_workers=2,
        timeout=WORKER_TIMEOUT,
        multiprocessing_context=context,
        persistent_workers=True,
    )
    try:
        first = list(loader)
        assert loader._workers is not None
        processes = list(loader._workers.processes)
        pids = {int(pid) for *_, batch_pids in first for pid in batch_pids}
        assert pids and pids <= {p.pid for p in processes}
        assert_same([(f, lab) for f, lab, _ in first], straight[0])
        abandoned = iter(loader)
        next(abandoned)
        abandoned.close()  # type: ignore[attr-defined]
        loader.set_epoch(1)
        again = list(loader)
        assert_same([(f, lab) for f, lab, _ in again], straight[1])
        served = {int(pid) for *_, batch_pids in again for pid in batch_pids}
        assert served <= {p.pid for p in processes}  # the same processes (either may serve)
        assert loader._workers is not None and loader._workers.processes == processes
        loader.close()
        assert not any(p.is_alive() for p in processes)
        assert_same([(f, lab) for f, lab, _ in loader], straight[2])  # new workers
    finally:
        loader.close()


def test_a_new_iteration_replaces_an_unfinished_persistent_one(gulp_dir: str) -> None:
    dataset = GulpImageDataset(gulp_dir)
    loader = DataLoader(dataset, batch_size=1, num_workers=1, persistent_workers=True)
    old = iter(loader)
    next(old)
    assert [labels.tolist() for _, labels in loader] == [[0], [1], [2], [0], [1], [2], [0]]
    with pytest.raises(RuntimeError, match="a newer iteration"):
        next(old)
    loader.close()


class DiesAt(FailsAt):
    """A dataset whose worker process dies (exit code 3) at item ``bad``."""

    def __getitem__(self, index: int) -> Any:
        if index == self.bad:
            os._exit(3)
        return self.dataset[index]


@pytest.mark.parametrize("persistent", [False, True])
def test_a_worker_that_dies_fails_the_iteration(gulp_dir: str, persistent: bool) -> None:
    dataset = DiesAt(GulpImageDataset(gulp_dir), 5)
    loader = DataLoader(dataset, batch_size=2, num_workers=2, persistent_workers=persistent)
    with pytest.raises(RuntimeError, match=r"gulp-loader-\d exited \(code 3\)"):
        list(loader)
    assert not multiprocessing.active_children()
    dataset.bad = -1  # persistent or not, the next epoch starts workers that have it
    assert len(list(loader)) == 4
    loader.close()


class Slow(FailsAt):
    """A dataset that takes ``seconds`` per item."""

    def __init__(self, dataset: Any, seconds: float) -> None:
        super().__init__(dataset, -1)
        self.seconds = seconds

    def __getitem__(self, index: int) -> Any:
        time.sleep(self.seconds)
        return self.dataset[index]


def test_a_batch_slower_than_the_timeout_fails(gulp_dir: str) -> None:
    slow = Slow(GulpImageDataset(gulp_dir), 5.0)
    loader = DataLoader(slow, batch_size=2, num_workers=1, timeout=1.0)
    with pytest.raises(TimeoutError, match=r"batch 0 of epoch 0 took longer than timeout=1"):
        next(iter(loader))


class Locked(FailsAt):
    """Items that hold a lock: a batch no process can pickle."""

    def __getitem__(self, index: int) -> Any:
        return threading.Lock(), self.dataset[index][1]


class Unpicklable(Exception):
    """An exception that pickles but does not unpickle (its ``__init__`` takes two args)."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"{name}: {detail}")


class RaisesUnpicklable(FailsAt):
    def __getitem__(self, index: int) -> Any:
        raise Unpicklable(f"item {index}", "odd exception")


def test_what_cannot_travel_from_a_worker_is_reported(gulp_dir: str) -> None:
    """A batch or an exception that cannot be pickled fails the iteration, naming the problem
    (a queue's feeder thread would drop the batch and leave the loop waiting forever)."""
    locked = DataLoader(Locked(GulpImageDataset(gulp_dir), -1), batch_size=2, num_workers=1)
    with pytest.raises(TypeError, match="pickle"):
        list(locked)
    odd = DataLoader(RaisesUnpicklable(GulpImageDataset(gulp_dir), -1), num_workers=1)
    with pytest.raises(RuntimeError, match="Unpicklable: item 0: odd exception"):
        list(odd)


STOPPING_SCRIPT = """
import signal, sys, time
from kohakuclip.gulp.dataset import GulpImageDataset
from kohakuclip.gulp.loader import DataLoader

class Slow:
    def __init__(self, dataset):
        self.dataset = dataset
    def __len__(self):
        return len(self.dataset)
    def __getitem__(self, index):
        time.sleep(2.0)
        return self.dataset[index]

signal.signal(signal.SIGTERM, lambda *_: None)  # a training script's handler, forked along
dataset = Slow(GulpImageDataset(sys.argv[1]))
persistent = sys.argv[2] == "persistent"
loader = DataLoader(
    dataset, 2, num_workers=2, multiprocessing_context="fork", persistent_workers=persistent
)
for batch in loader:
    print(time.time(), flush=True)
    raise SystemExit(7)  # the training loop stops with batches 2 and 3 still queued
"""


@pytest.mark.parametrize("workers", ["per-epoch", "persistent"])
def test_a_stopping_script_does_not_wait_for_queued_batches(gulp_dir: str, workers: str) -> None:
    """Waiting for the queued batches would take 4 s more (2 batches of 4 s on 2 workers); the
    script exits at once with its own exit code, its SIGTERM handler notwithstanding."""
    done = subprocess.run(
        [sys.executable, "-c", STOPPING_SCRIPT, gulp_dir, workers],
        capture_output=True,
        text=True,
        timeout=120,
    )
    exited = time.time()
    assert done.returncode == 7, done.stderr[-2000:]
    assert exited - float(done.stdout) < 2.5


ORPHAN_SCRIPT = """
import os, signal, sys
from kohakuclip.gulp.dataset import GulpImageDataset
from kohakuclip.gulp.loader import DataLoader

loader = DataLoader(GulpImageDataset(sys.argv[1]), num_workers=2, multiprocessing_context="fork")
batches = iter(loader)
next(batches)
import multiprocessing
print(*[p.pid for p in multiprocessing.active_children()], flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would
"""


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_workers_of_a_killed_process_exit(gulp_dir: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", ORPHAN_SCRIPT, gulp_dir],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 20
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(pid) for pid in pids)


def test_collate() -> None:
    items = [
        ({"name": f"v{i}", "score": i / 2, "frames": [np.full((2, 2), i, np.uint8)]}, i)
        for i in range(3)
    ]
    meta, labels = collate(items)
    assert meta["name"] == ["v0", "v1", "v2"]
    assert np.array_equal(meta["score"], [0.0, 0.5, 1.0])
    assert meta["frames"][0].shape == (3, 2, 2) and meta["frames"][0][2, 0, 0] == 2
    assert labels.tolist() == [0, 1, 2]
    with pytest.raises(GulpError, match="different shapes"):
        collate([np.zeros((2, 2)), np.zeros((3, 2))])


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(num_workers=-1), "num_workers"),
        (dict(prefetch=0), "prefetch"),
        (dict(timeout=-1), "timeout"),
        (dict(persistent_workers=True), "persistent_workers needs num_workers"),
    ],
)
def test_bad_arguments(gulp_dir: str, kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DataLoader(GulpImageDataset(gulp_dir), **kw)


def run_example(gulp_dir: str, workers: int) -> list[float]:
    """examples/gulp_numpy_loop.py in its own process; the loss it printed per epoch."""
    example = Path(__file__).parents[1] / "examples" / "gulp_numpy_loop.py"
    cmd = [sys.executable, str(example), gulp_dir, "--epochs", "4", "--batch-size", "3"]
    done = subprocess.run(
        [*cmd, "--workers", str(workers)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 4 and all("3 batches" in line for line in lines)
    return [float(line.split()[-1]) for line in lines]


def test_numpy_training_example_is_the_same_with_workers(gulp_dir: str) -> None:
    here = run_example(gulp_dir, 0)
    assert here == run_example(gulp_dir, 2)
    assert len(set(here)) == 4  # each epoch draws other clips and updates the model

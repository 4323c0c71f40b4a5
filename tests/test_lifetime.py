"""Reader lifetime and clean exits.

A reader dropped without ``close()`` gives back its threads, descriptors and memory; a script that
ends with batches in flight or a half-iterated loader exits at once with its own exit code.
The exit scenarios run as small scripts in subprocesses, one at a time, each under a timeout,
its whole process group killed if it overruns.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import kohakuclip
from kohakuclip import ImageReader, Reader
from kohakuclip.read import pool as pool_module
from kohakuclip.read.pool import Pending, PoolClosedError, ThreadPool
from kohakuclip.write.pack import pack
from tests.image_media import encode, photo, write_zip
from tests.media import VideoSpec, make_video

SRC = str(Path(kohakuclip.__file__).resolve().parents[1])
SCRIPT_TIMEOUT = 90  # seconds: a hang fails the test instead of stalling the run
PROMPT = 20  # seconds from the script's last statement to the end of its process (loaded CI)
FRAMES = 24


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A video shard (AV1 + H.264) and a zip of JPEGs; both read once here, so the compiled
    kernels are cached before any script starts."""
    root = tmp_path_factory.mktemp("lifetime")
    video = str(root / "v.zip")
    members = [
        (f"{c}.mp4", make_video(VideoSpec(codec=c, width=96, height=64, frames=FRAMES, seed=i)))
        for i, c in enumerate(["av1", "h264"])
    ]
    pack(video, members)
    images = str(root / "i.zip")
    jpegs = {f"{i}.jpg": encode(Image.fromarray(photo(48, 64, seed=i)), "JPEG") for i in range(4)}
    write_zip(images, jpegs)
    with Reader(video, size=32) as reader:
        reader.read([(0, [0, 5]), (1, [0, 5])])
    with ImageReader(images, size=32) as image_reader:
        image_reader.read([0, 1])
    return {"video": video, "images": images}


def _pool_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kohakuclip-")]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _anon_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1])
    raise RuntimeError("no Anonymous line in /proc/self/smaps_rollup")


# --- the pool ----------------------------------------------------------------------------------


def _blocked_pool(threads: int = 1) -> tuple[ThreadPool, threading.Event, Pending[str]]:
    """A pool whose threads all sit in a task until the returned event is set."""
    pool = ThreadPool(threads, lambda: None)
    release = threading.Event()
    started = threading.Barrier(threads + 1, timeout=30)

    def wait(state: object) -> None:
        started.wait()
        release.wait(30)

    running: Pending[str] = Pending(threads, "ran")
    pool.submit([wait] * threads, running)
    started.wait()
    return pool, release, running


def test_cancel_fails_queued_batches_and_lets_running_ones_finish() -> None:
    pool, release, running = _blocked_pool(2)
    queued: Pending[str] = Pending(3, "never")
    ran = []
    pool.submit([lambda s: ran.append(1)] * 3, queued)
    closer = threading.Thread(target=pool.close, kwargs={"cancel": True})
    closer.start()
    time.sleep(0.05)
    release.set()
    closer.join(30)
    assert not closer.is_alive()
    assert running.result(0) == "ran"
    with pytest.raises(PoolClosedError):
        queued.result(0)
    assert ran == []
    assert not any(t.is_alive() for t in pool._threads)
    with pytest.raises(PoolClosedError, match="closed"):
        pool.submit([lambda s: None], Pending(1, None))


def test_a_thread_whose_state_fails_reports_it_to_every_batch() -> None:
    def broken() -> None:
        raise OSError("no decoder today")

    pool = ThreadPool(2, broken)
    try:
        for _ in range(3):
            pending: Pending[None] = Pending(2, None)
            pool.submit([lambda s: None] * 2, pending)
            with pytest.raises(OSError, match="no decoder today"):
                pending.result(30)
    finally:
        pool.close()


def test_a_pool_thread_may_close_its_own_pool() -> None:
    pool = ThreadPool(2, lambda: None)
    first: Pending[str] = Pending(1, "closed")
    after: Pending[str] = Pending(1, "queued before close")
    pool.submit([lambda s: pool.close()], first)
    pool.submit([lambda s: None], after)
    assert first.result(30) == "closed"
    assert after.result(30) == "queued before close"  # close lets queued work finish
    pool.close()  # the owner's later close joins what is left
    assert not any(t.is_alive() for t in pool._threads)


def test_a_fork_waits_for_running_tasks_and_the_child_never_waits_for_queued_ones() -> None:
    """A task holds a lock while it runs (as a first import holds the import lock): the fork
    waits until it has finished, so the child finds the lock free; the batch queued behind it
    waits for the fork, and in the child it fails at once instead of waiting for threads that
    do not exist there."""
    pool, release, running = _blocked_pool(1)
    held = threading.Lock()
    locked = threading.Event()

    def hold(state: object) -> None:
        with held:
            locked.set()
            time.sleep(0.3)

    holding: Pending[str] = Pending(1, "held")
    queued: Pending[str] = Pending(1, "queued")
    try:
        release.set()
        pool.submit([hold], holding)
        assert locked.wait(30)
        pool.submit([lambda s: None], queued)
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                if held.acquire(timeout=5):
                    queued.result()
            except PoolClosedError:
                code = 0
            finally:
                os._exit(code)
        assert holding.done()  # the fork waited for it
        assert _wait_child(pid, "a lock held by a task, or the parent's batch") == 0
        assert queued.result(30) == "queued"  # in the parent it runs after the fork
    finally:
        pool.close()
    assert running.result(0) == "ran"


def test_a_fork_behind_a_task_that_never_ends_warns_and_goes_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pool_module, "FORK_WAIT", 0.3)
    pool, release, running = _blocked_pool(1)
    try:
        with pytest.warns(RuntimeWarning, match="1 kohakuclip decode task"):
            pid = os.fork()
        if pid == 0:
            os._exit(0)
        assert _wait_child(pid, "a bare child") == 0
        after: Pending[str] = Pending(1, "after")
        pool.submit([lambda s: None], after)  # the gate opened again after the fork
        release.set()
        assert after.result(30) == "after"
    finally:
        release.set()
        pool.close()
    assert running.result(0) == "ran"


FORK_MID_FIRST_BATCH = """
import os, sys, time
from kohakuclip import Reader

shard, delay = sys.argv[1], float(sys.argv[2])
reader = Reader(shard, size=32, threads=2)
pending = [reader.submit([(0, [0, 5]), (1, [2, 9])]) for _ in range(5)]  # first use: imports
time.sleep(delay)
pid = os.fork()  # while the decode threads import their compiled drivers
if pid == 0:
    child = Reader(shard, size=32, threads=2)
    child.read([(0, [1, 3])])
    os._exit(0)
_, status = os.waitpid(pid, 0)
for p in pending:
    p.result()
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_fork_during_a_reader_s_first_batches_leaves_the_child_working(
    media: dict[str, str],
) -> None:
    """The decode threads' first batch imports the compiled drivers: a fork at that moment
    used to copy the import lock held (the child's first read waited forever) or the module
    half-initialised (the child's read failed)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
    for delay in ("0", "0.02", "0.05", "0.1", "0.2"):
        done = subprocess.run(
            [sys.executable, "-c", FORK_MID_FIRST_BATCH, media["video"], delay],
            capture_output=True,
            text=True,
            env=env,
            timeout=SCRIPT_TIMEOUT,
        )
        assert done.returncode == 0, done.stderr[-3000:]


# --- readers dropped without close() -----------------------------------------------------------


def _clip_reader(media: dict[str, str]) -> object:
    reader = Reader(media["video"], size=32, threads=2)
    reader.read([(0, [0, 7]), (1, [3, 9])])
    return reader


def _image_reader(media: dict[str, str]) -> object:
    reader = ImageReader(media["images"], size=32, threads=2)
    reader.read([0, 3])
    return reader


def _clip_dataset(media: dict[str, str]) -> object:
    from kohakuclip.torch import ClipDataset

    dataset = ClipDataset(media["video"], batch_size=2, frames=2, threads=2, size=32)
    dataset.read_batch(0)
    return dataset


def _image_dataset(media: dict[str, str]) -> object:
    from kohakuclip.torch import ImageDataset

    dataset = ImageDataset(media["images"], batch_size=2, threads=2, size=32)
    dataset.read_batch(0)
    return dataset


class _Holder:
    """Keeps things alive together (and can be weakly referenced)."""

    def __init__(self, *things: object) -> None:
        self.things = things


def _clip_loader(media: dict[str, str]) -> object:
    """A half-iterated in-process ClipLoader, dropped together with its iterator."""
    from kohakuclip.torch import ClipDataset, ClipLoader

    dataset = ClipDataset(media["video"], batch_size=2, frames=2, threads=2, size=32)
    loader = ClipLoader(dataset)
    batches = iter(loader)
    next(batches)
    return _Holder(loader, batches)


MAKERS = {
    "Reader": _clip_reader,
    "ImageReader": _image_reader,
    "ClipDataset": _clip_dataset,
    "ImageDataset": _image_dataset,
    "ClipLoader": _clip_loader,
}


@pytest.mark.parametrize("kind", list(MAKERS))
def test_a_dropped_reader_is_collected_at_once(media: dict[str, str], kind: str) -> None:
    if kind.startswith("Clip") or kind == "ImageDataset":
        pytest.importorskip("torch")
    threads, fds = len(_pool_threads()), _open_fds()
    owner = MAKERS[kind](media)
    assert len(_pool_threads()) == threads + 2
    ref = weakref.ref(owner)
    del owner  # no gc.collect(): nothing may hold the reader in a reference cycle
    assert ref() is None
    assert len(_pool_threads()) == threads  # the finalizer joined them
    assert _open_fds() == fds


@pytest.mark.parametrize("kind", list(MAKERS))
def test_a_hundred_dropped_readers_leave_no_thread_and_little_memory(
    media: dict[str, str], kind: str
) -> None:
    if kind.startswith("Clip") or kind == "ImageDataset":
        pytest.importorskip("torch")
    make = MAKERS[kind]
    for _ in range(5):  # allocator arenas and caches settle first
        make(media)
    gc.collect()
    threads, fds, memory = len(_pool_threads()), _open_fds(), _anon_kb()
    n = 100
    for _ in range(n):
        make(media)
    gc.collect()
    assert len(_pool_threads()) == threads
    assert _open_fds() == fds
    per_reader = (_anon_kb() - memory) / n
    assert per_reader < 50, f"{per_reader:.1f} KB kept per dropped {kind}"


def test_a_reader_dropped_with_a_batch_in_flight(media: dict[str, str]) -> None:
    threads = len(_pool_threads())
    reader = Reader(media["video"], size=32, threads=2)
    with Reader(media["video"], size=32) as twin:
        expected = twin.read([(0, [1, 4])] * 3, seed=7).video
    pending = reader.submit([(0, [1, 4])] * 3, seed=7)
    ref = weakref.ref(reader)
    del reader
    np.testing.assert_array_equal(pending.result(30).video, expected)
    deadline = time.monotonic() + 30
    while (ref() is not None or len(_pool_threads()) > threads) and time.monotonic() < deadline:
        time.sleep(0.01)  # the last task let go of the reader on a pool thread
    assert ref() is None
    assert len(_pool_threads()) == threads


def _wait_child(pid: int, what: str, limit: float = 30) -> int:
    """The exit code of a forked child, killed (and the test failed) if it outlives ``limit``."""
    deadline = time.monotonic() + limit
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"{what}: the child hung")
        time.sleep(0.005)


def _os_threads(threads: list[threading.Thread]) -> list[int]:
    """Those of ``threads`` the OS still runs (a joined thread may still be in its native exit,
    thread-local destructors that take library locks a fork would copy locked)."""
    return [t.native_id for t in threads if os.path.exists(f"/proc/self/task/{t.native_id}")]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
@pytest.mark.parametrize("how", ["close", "drop"])
def test_a_closed_reader_s_threads_are_gone_from_the_os(media: dict[str, str], how: str) -> None:
    for _ in range(10):
        before = set(_pool_threads())
        reader = Reader(media["video"], size=32, threads=4, hflip=1.0)  # hflip: OpenCV's TLS
        reader.read([(0, [0, 7]), (1, [3, 9])] * 2)
        threads = [t for t in _pool_threads() if t not in before]
        assert len(threads) == 4
        if how == "close":
            reader.close()
        else:
            del reader
        assert _os_threads(threads) == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_a_fork_first_waits_for_a_pool_closed_by_its_own_thread() -> None:
    pool = ThreadPool(2, lambda: None)
    threads = list(pool._threads)
    closed = threading.Event()

    def close_then_linger(state: object) -> None:
        pool.close()  # on a pool thread: nothing is joined yet
        closed.set()
        time.sleep(0.3)

    pool.submit([close_then_linger], Pending(1, None))
    assert closed.wait(30)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    assert _os_threads(threads) == []  # the fork hook joined them before forking
    assert _wait_child(pid, "a bare child") == 0


def test_a_fork_after_a_pool_closed_itself_with_work_queued_does_not_hang() -> None:
    """The closed pool's threads still run its queued tasks: the fork joins them before it
    closes the gate to new tasks (the other order waited forever)."""
    pool = ThreadPool(1, lambda: None)
    closed = threading.Event()

    def close(state: object) -> None:
        pool.close()  # on the pool's own thread: the queued tasks still run
        closed.set()

    queued: Pending[None] = Pending(2, None)
    pool.submit([close], Pending(1, None))
    pool.submit([lambda s: time.sleep(0.2)] * 2, queued)
    assert closed.wait(30)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    assert _wait_child(pid, "a bare child") == 0
    assert queued.done()


# --- scripts that end with work in flight ------------------------------------------------------

SCRIPT = textwrap.dedent(
    """
    import json, sys, time

    import torch  # loaded in every run: its native teardown is what aborted mid-decode

    from kohakuclip import ImageReader, Reader
    from kohakuclip.torch import ClipDataset, ClipLoader, ImageDataset

    config = json.loads(sys.argv[1])
    video, images = config["video"], config["images"]
    closing, iterating = [], []
    for workers in config["loaders"]:  # half-iterated: prefetched batches are still decoding
        dataset = ClipDataset(video, batch_size=2, frames=4, threads=2, size=32)
        loader = ClipLoader(dataset, workers=workers, timeout=60)
        iterating.append(iter(loader))
        next(iterating[-1]), next(iterating[-1])
        closing.append(loader)
        if workers == 0:
            image_loader = ClipLoader(ImageDataset(images, batch_size=4, threads=2, size=32))
            iterating.append(iter(image_loader))
            next(iterating[-1])
            closing.append(image_loader)
    reader = Reader(video, size=64, threads=2, skip=False)
    image_reader = ImageReader(images, size=64, threads=2)
    closing += [reader, image_reader]
    reader.read([(0, [0]), (1, [0])])  # the threads are decoding when the script ends
    image_reader.read([0])
    batches_each = 2 if config["close"] else 24
    pending = [reader.submit([(v % 2, list(range(24)))] * 4) for v in range(batches_each)]
    pending += [image_reader.submit([0, 1, 2, 3] * 4) for _ in range(batches_each)]
    if config["close"]:
        for thing in closing:
            thing.close()
    print("END", time.time(), flush=True)
    if config["end"] == "raise":
        raise RuntimeError("scripted failure")
    sys.exit(3)
    """
)


def _run_script(config: dict[str, object], temp: str) -> tuple[int, float, str]:
    """Exit status, seconds from the script's last statement to its exit, and stderr; the
    script's temporary files go to ``temp``."""
    path = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, TMPDIR=temp)
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, json.dumps(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its loader workers share its process group
    )
    try:
        out, err = proc.communicate(timeout=SCRIPT_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{config}: still running after {SCRIPT_TIMEOUT} s\n{out}\n{err[-3000:]}")
    ended = time.time()
    marks = [line.split() for line in out.splitlines() if line.startswith("END ")]
    assert marks, f"{config}: never reached its end (rc {proc.returncode})\n{err[-3000:]}"
    return proc.returncode, ended - float(marks[-1][1]), err


@pytest.mark.parametrize(
    ("loaders", "close", "end", "runs"),
    [
        ([2, 1, 0], False, "exit", 3),  # loaders with 2, 1 and 0 workers (forks come first)
        ([0], True, "raise", 1),
        ([], False, "raise", 1),  # readers only
    ],
)
def test_a_script_ends_promptly_with_its_own_exit_code(
    media: dict[str, str], loaders: list[int], close: bool, end: str, runs: int, tmp_path: Path
) -> None:
    """Batches in flight on a Reader and an ImageReader, loaders half-iterated, closed or not:
    the script exits with its status (3, or 1 for the uncaught exception) soon after its end,
    and its terminated loader workers leave no multiprocessing folder (pymp-*) behind."""
    pytest.importorskip("torch")
    config = dict(media, loaders=loaders, close=close, end=end)
    for _ in range(runs):  # one at a time: many dying processes at once load CI's kernel
        rc, teardown, err = _run_script(config, str(tmp_path))
        assert [p.name for p in tmp_path.glob("pymp-*")] == []
        for crash in ("terminate called", "Fatal Python error", "killed by signal"):
            assert crash not in err, err[-3000:]
        if end == "raise":
            assert rc == 1 and "RuntimeError: scripted failure" in err, err[-3000:]
        else:
            assert rc == 3, f"exit status {rc}\n{err[-3000:]}"
        assert teardown < PROMPT, f"{teardown:.1f} s from sys.exit to the end of the process"

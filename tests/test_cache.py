"""storage.cache.BlockCache: hits and misses, least-recently-used eviction, stale temporary
files, several processes on one directory, and a Reader reading through it."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest

from kohakuclip import Reader
from kohakuclip.storage.cache import STALE_TEMP, BlockCache
from tests.media import VideoSpec, make_video
from tests.servers import http_server

BLOCK = 1 << 12


def _block(seed: int, length: int = BLOCK) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, length, np.uint8).tobytes()


def test_a_block_is_served_only_for_its_url_etag_and_length(tmp_path: Path) -> None:
    cache = BlockCache(str(tmp_path), 1 << 20, block=BLOCK)
    data = _block(0)
    cache.put("s3://b/x.zip", '"e1"', 3, data)
    assert cache.get("s3://b/x.zip", '"e1"', 3, BLOCK) == data
    assert cache.get("s3://b/x.zip", '"e2"', 3, BLOCK) is None  # a replaced object
    assert cache.get("s3://b/y.zip", '"e1"', 3, BLOCK) is None
    assert cache.get("s3://b/x.zip", '"e1"', 4, BLOCK) is None
    assert cache.get("s3://b/x.zip", '"e1"', 3, BLOCK - 1) is None  # not the block expected
    assert cache.size() == BLOCK


def test_eviction_keeps_the_recently_used_blocks(tmp_path: Path) -> None:
    cache = BlockCache(str(tmp_path), 10 * BLOCK, block=BLOCK)
    for n in range(10):
        cache.put("u", None, n, _block(n))
    for n in range(10):  # oldest first, one second apart; blocks 0 and 1 used last
        path = cache._path("u", None, n)
        os.utime(path, (1000 + n, 1000 + n if n > 1 else 2000 + n))
    cache.put("u", None, 10, _block(10))  # over the limit: trimmed to 90 %
    cache.trim()
    kept = [n for n in range(11) if cache.get("u", None, n, BLOCK) is not None]
    assert cache.size() <= 9 * BLOCK
    assert kept == [0, 1, 4, 5, 6, 7, 8, 9, 10]  # 2 and 3 were the least recently used


def test_a_killed_writer_s_temporary_file_goes_once_stale(tmp_path: Path) -> None:
    cache = BlockCache(str(tmp_path), 1 << 20, block=BLOCK)
    cache.put("u", None, 0, _block(0))
    folder = os.path.dirname(cache._path("u", None, 0))
    old, fresh = os.path.join(folder, "kcblock-old.tmp"), os.path.join(folder, "kcblock-new.tmp")
    mine = tmp_path / "project"  # a cache directory shared with other files: left alone
    mine.mkdir()
    others = [os.path.join(folder, "notes.tmp"), str(mine / "kcblock-x.tmp")]
    for path in (old, fresh, *others):
        Path(path).write_bytes(b"half a block")
    past = time.time() - STALE_TEMP - 60
    for path in (old, *others):
        os.utime(path, (past, past))
    cache.trim()
    assert not os.path.exists(old) and os.path.exists(fresh)  # fresh: maybe another writer's
    assert all(os.path.exists(path) for path in others)
    assert cache.get("u", None, 0, BLOCK) == _block(0)


def _hammer(directory: str, worker: int, rounds: int) -> int:
    """Put, get and trim blocks shared with other processes; the number of bad reads."""
    cache = BlockCache(directory, 8 * BLOCK, block=BLOCK)
    bad = 0
    for i in range(rounds):
        n = (i * 7 + worker) % 24
        got = cache.get("shared", None, n, BLOCK)
        if got is None:
            cache.put("shared", None, n, _block(n))
        elif got != _block(n):
            bad += 1
        if i % 16 == worker:
            cache.trim()
    return bad


def test_processes_share_a_directory_without_torn_reads(tmp_path: Path) -> None:
    """Four processes of a node on one small cache: every hit is the whole block, evictions
    and trims of the others never break a reader, and the bound holds."""
    directory = str(tmp_path / "cache")
    BlockCache(directory, 8 * BLOCK, block=BLOCK)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        bad = pool.starmap(_hammer, [(directory, w, 300) for w in range(4)])
    assert bad == [0, 0, 0, 0]
    cache = BlockCache(directory, 8 * BLOCK, block=BLOCK)
    assert cache.size() <= 8 * BLOCK
    leftovers = [name for _, _, names in os.walk(directory) for name in names]
    assert all(name.endswith(".kcblock") for name in leftovers)


def test_reader_cache_arguments_serve_repeat_reads_within_the_bound(tmp_path: Path) -> None:
    """``Reader(url, cache_dir=, cache_size=)``: a second reader of the node (same directory)
    fetches none of the video's bytes again, the pixels equal the local file's, and a cache
    smaller than the video stays under its ``cache_size``."""
    spec = VideoSpec(codec="h264", width=480, height=272, frames=96, options={"crf": "4"})
    video = make_video(spec)
    local = tmp_path / "v.mp4"
    local.write_bytes(video)
    items = [(0, [0, 30, 31, 95])]
    with Reader(str(local), size=24) as reader:
        want = reader.read(items, seed=1).video
    limit = 1 << 18  # one default block
    assert len(video) > 2 * limit
    with http_server() as (base, files):
        files.put("/v.mp4", video)
        for directory, size, refetched in (("big", 1 << 30, False), ("small", limit, True)):
            cache = str(tmp_path / directory)
            for again in (False, True):
                before = len(files.requests)
                with Reader(f"{base}/v.mp4", size=24, cache_dir=cache, cache_size=size) as r:
                    np.testing.assert_array_equal(r.read(items, seed=1).video, want)
                fetched = [req for req in files.requests[before:] if req[0] == "GET"]
                assert bool(fetched) == (not again or refetched), fetched
            assert BlockCache(cache, size).size() <= size
    with pytest.raises(ValueError, match="smaller than one block"):
        Reader(str(local), size=24, cache_dir=str(tmp_path / "tiny"), cache_size=1000)

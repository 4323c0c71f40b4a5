"""Numba cache files are dropped when a compiled module's source is newer than any of them
(numba itself checks only each function's own file), and kept otherwise."""

from __future__ import annotations

import os

from kohakuclip.decode._jit_cache import drop_stale


def _touch(path: str, mtime: float) -> None:
    with open(path, "w") as f:
        f.write("x")
    os.utime(path, (mtime, mtime))


def test_a_newer_source_drops_every_cache_file(tmp_path) -> None:
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    _touch(str(tmp_path / "_frame.py"), 1000)
    _touch(str(tmp_path / "_clips.py"), 1000)
    names = ["_clips.drive-1.py311.nbi", "_clips.drive-1.py311.1.nbc", "_frame.w-2.py311.nbi"]
    for name in names:
        _touch(str(cache / name), 2000)
    _touch(str(cache / "_frame.cpython-311.pyc"), 500)
    drop_stale(str(tmp_path))
    assert sorted(os.listdir(cache)) == sorted([*names, "_frame.cpython-311.pyc"])
    _touch(str(tmp_path / "_frame.py"), 3000)  # edited after the driver was cached
    _touch(str(cache / "_frame.w-2.py311.nbi"), 3500)  # numba recompiled only its own function
    drop_stale(str(tmp_path))
    assert os.listdir(cache) == ["_frame.cpython-311.pyc"]


def test_missing_folders_are_fine(tmp_path) -> None:
    drop_stale(str(tmp_path / "nowhere"))
    drop_stale(str(tmp_path))


def test_processes_dropping_at_once_all_start(tmp_path) -> None:
    """DataLoader workers import the package together: each finds the stale files that the
    others are deleting, and none of them fails for it."""
    import multiprocessing

    cache = tmp_path / "__pycache__"
    cache.mkdir()
    _touch(str(tmp_path / "_clips.py"), 3000)
    for k in range(3000):
        _touch(str(cache / f"_clips.f-{k}.py311.nbi"), 2000)
    context = multiprocessing.get_context("fork")
    with context.Pool(6) as pool:
        results = [pool.apply_async(drop_stale, (str(tmp_path),)) for _ in range(12)]
        for result in results:
            result.get(timeout=60)
    assert os.listdir(cache) == []

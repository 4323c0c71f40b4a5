"""storage.folder.list_folder: what a folder source holds, in a stable order."""

from __future__ import annotations

import os

import pytest

from kohakuclip.storage.folder import list_folder


def test_files_by_suffix_sorted_hidden_left_out(tmp_path) -> None:
    (tmp_path / "b").mkdir()
    for name in ("b/z.MP4", "a.mp4", ".hidden.mp4", "notes.txt", "b/c.mov"):
        (tmp_path / name).write_bytes(b"x")
    assert list_folder(tmp_path, (".mp4", ".mov")) == ["a.mp4", "b/c.mov", "b/z.MP4"]


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_linked_folders_are_followed_once_and_cycles_end(tmp_path) -> None:
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "a.mp4").write_bytes(b"x")
    (tmp_path / "clips" / "loop").symlink_to("..")  # back up the tree
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "b.mp4").write_bytes(b"x")
    (tmp_path / "linked").symlink_to(tmp_path / "elsewhere")  # a second way to one folder
    found = list_folder(tmp_path, (".mp4",))
    assert found == ["clips/a.mp4", "elsewhere/b.mp4"]

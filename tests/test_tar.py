"""kohakuclip.storage.tar: listing plain tars, and refusing cut or damaged ones by name."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from kohakuclip.storage.ranged import LocalFile
from kohakuclip.storage.tar import list_tar
from kohakuclip.storage.zip import ArchiveError

SIZE = 3000  # data per member: 6 blocks, the last one padded
STRIDE = 512 + 3072  # a member's header and padded data


def _tar(members: int = 3) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(members):
            info = tarfile.TarInfo(f"m{i}.bin")
            info.size = SIZE
            tar.addfile(info, io.BytesIO(bytes([i + 1]) * SIZE))
    return out.getvalue()


def _listed(path: Path, by_ranges: bool) -> list[str]:
    if not by_ranges:
        return [m.name for m in list_tar(path)]
    fd = os.open(path, os.O_RDONLY)
    try:
        return [m.name for m in list_tar(LocalFile(fd, str(path)))]
    finally:
        os.close(fd)


@pytest.mark.parametrize("by_ranges", [False, True])
def test_whole_tars_list_with_or_without_their_end_marker(tmp_path: Path, by_ranges: bool) -> None:
    """The members where their data lies, as tarfile reads them; an archive ending right after
    its last member (no zero blocks) and one with other bytes after its end marker list too."""
    data = _tar()
    for name, blob in (
        ("whole", data),
        ("no_end_marker", data[: 3 * STRIDE]),
        ("junk_after_the_end", data + b"junk" * 300),
    ):
        path = tmp_path / f"{name}.tar"
        path.write_bytes(blob)
        assert _listed(path, by_ranges) == ["m0.bin", "m1.bin", "m2.bin"], name
    members = list_tar(tmp_path / "whole.tar")
    with tarfile.open(tmp_path / "whole.tar") as tar:
        for member, info in zip(members, tar.getmembers(), strict=True):
            assert (member.offset, member.size) == (info.offset_data, info.size)


@pytest.mark.parametrize("by_ranges", [False, True])
def test_a_cut_or_damaged_tar_is_refused_naming_the_last_whole_member(
    tmp_path: Path, by_ranges: bool
) -> None:
    """tarfile takes a header it cannot parse for the end of the archive and lists the members
    before it: the listing names the archive and its last whole member instead."""
    data = _tar()
    third = 2 * STRIDE
    for name, blob, match in (
        ("cut_in_a_header", data[: third + 100], r"cut after member 'm1\.bin' \(byte 7168\)"),
        ("damaged_header", data[:third] + b"x" * 512 + data[third + 512 :], "damaged or cut"),
        ("cut_in_data", data[: third + 512 + 1000], "cannot read|cut inside member 'm2.bin'"),
    ):
        path = tmp_path / f"{name}.tar"
        path.write_bytes(blob)
        with pytest.raises(ArchiveError, match=rf"{name}\.tar: .*({match})"):
            _listed(path, by_ranges)

"""VideoRefs: the listed videos kept in columns read back exactly as the refs that went in."""

from __future__ import annotations

import pickle
import tracemalloc

import numpy as np
import pytest

from kohakuclip.formats import VideoEntry
from kohakuclip.storage.video_refs import VideoRef, VideoRefs


def _entry(member: str, k: int, **changes: object) -> VideoEntry:
    fields: dict[str, object] = {
        "member": member,
        "row": 1000 * k,
        "n": 30 + k,
        "fps": 24000 / 1001 if k % 2 else 25.0,
        "h": 360 + 2 * k,
        "w": 640 - k,
        "codec": ("av1", "h264", "hevc")[k % 3],
        "prefix": f"0a0b{k % 4:04x}",
        "colorspace": ("bt601", "bt709")[k % 2],
        "full_range": k % 5 == 0,
    }
    fields.update(changes)
    return VideoEntry(**fields)  # type: ignore[arg-type]


def _refs() -> list[VideoRef]:
    names = ["a.mp4", "dir/b c.mp4", "ünïcode/ß.mp4", "bad-\udcff-byte.mp4", "", "x" * 300]
    refs = [VideoRef(k % 3, name, _entry(name, k)) for k, name in enumerate(names)]
    refs += [VideoRef(7, "no-index.mp4"), VideoRef(0, "dir/no-index-\udce9.mkv")]
    return refs


def test_every_ref_reads_back_equal_with_and_without_entries() -> None:
    refs = _refs()
    columns = VideoRefs(refs)
    assert len(columns) == len(refs)
    assert list(columns) == refs
    assert [columns[k] for k in range(len(refs))] == refs


def test_negative_indices_and_slices_read_as_a_list_would() -> None:
    refs = _refs()
    columns = VideoRefs(refs)
    assert columns[-1] == refs[-1]
    assert columns[-len(refs)] == refs[0]
    for part in (slice(None), slice(1, 5), slice(None, None, -2), slice(-3, None), slice(9, 20)):
        assert columns[part] == refs[part]
    with pytest.raises(IndexError, match="video 8 of 8"):
        columns[len(refs)]
    with pytest.raises(IndexError):
        columns[-len(refs) - 1]


def test_many_prefixes_and_fields_out_of_range() -> None:
    """Thousands of distinct decoder prefixes (sizes, encoder settings) beside few codecs;
    a field the columns cannot hold is refused naming the video, and nothing of it is kept."""
    refs = [VideoRef(0, f"{k}.mp4", _entry(f"{k}.mp4", k, prefix=f"{k:06x}")) for k in range(3000)]
    refs.append(VideoRef(1, "last.mp4", _entry("last.mp4", 4, codec="hevc", colorspace="bt709")))
    columns = VideoRefs(refs)
    assert list(columns) == refs
    for bad in (
        _entry("x.mp4", 1, h=2**31),
        _entry("x.mp4", 1, fps=None),
        _entry("x.mp4", 1, codec=None),
    ):
        with pytest.raises(ValueError, match=r"video 'x\.mp4'"):
            columns.append(VideoRef(0, "x.mp4", bad))
        assert len(columns) == len(refs) and list(columns[-2:]) == refs[-2:]
        assert columns.nbytes() == VideoRefs(refs).nbytes()
    with pytest.raises(ValueError, match="without a name"):
        columns.append(VideoRef(0, None, _entry(None, 1)))  # type: ignore[arg-type]
    fresh = VideoRef(2, "fresh.mp4", _entry("fresh.mp4", 5, prefix="never-seen"))
    columns.append(fresh)  # the strings table is whole after the refusals
    assert list(columns[-3:]) == [*refs[-2:], fresh]


def test_an_entry_for_another_member_is_refused() -> None:
    with pytest.raises(ValueError, match=r"names 'b\.mp4'"):
        VideoRefs([VideoRef(0, "a.mp4", _entry("b.mp4", 1))])


def test_columns_survive_pickling_as_workers_receive_them() -> None:
    columns = VideoRefs(_refs())
    again = pickle.loads(pickle.dumps(columns))
    assert list(again) == list(columns)
    again.append(VideoRef(1, "later.mp4", _entry("later.mp4", 2, codec="av1")))
    assert again[-1].entry == _entry("later.mp4", 2, codec="av1")


def test_sources_and_short_sides_match_the_refs() -> None:
    refs = [VideoRef(k % 4, f"{k}.mp4", _entry(f"{k}.mp4", k)) for k in range(12)]
    columns = VideoRefs(refs)
    assert columns.sources().tolist() == [r.source for r in refs]
    sides = columns.short_sides()
    assert sides is not None
    assert sides.tolist() == [min(r.entry.w, r.entry.h) for r in refs if r.entry is not None]
    columns.append(VideoRef(0, "unindexed.mp4"))
    assert columns.short_sides() is None
    assert VideoRefs().short_sides() is None
    assert VideoRefs().sources().dtype == np.int32


def test_a_hundred_thousand_videos_take_a_fraction_of_their_objects_memory() -> None:
    count = 100_000
    prefix = "0a0b0000000246bff9fffe4380"

    def refs() -> list[VideoRef]:
        made = []
        for k in range(count):
            name = f"videos/clip_{k:08d}_cam.mp4"
            made.append(VideoRef(0, name, _entry(name, 0, prefix=prefix, row=k)))
        return made

    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        as_objects = refs()
        objects_bytes = tracemalloc.get_traced_memory()[0] - start
        start = tracemalloc.get_traced_memory()[0]
        columns = VideoRefs(as_objects)
        columns_bytes = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert columns[count - 1] == as_objects[-1]
    name_bytes = len(as_objects[0].member)
    assert columns.nbytes() == count * (name_bytes + 58)
    assert columns_bytes < 1.2 * columns.nbytes()
    assert columns_bytes < objects_bytes / 3

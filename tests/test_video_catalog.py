"""storage.video_catalog: tracks resolved once per video while cached; what resolving computed
from a whole read of a video (skip tables, the stream's colour) outlives the track in the
cache, so a random-access folder larger than ``moov_cache`` is not read whole per clip."""

from __future__ import annotations

import numpy as np

from kohakuclip import Reader
from kohakuclip.mp4 import moov
from kohakuclip.storage import video_catalog, video_resolve
from tests.media import VideoSpec, make_video

SPECS = {
    "a.mp4": VideoSpec(codec="h264", width=96, height=64, frames=24, seed=1),
    "b.mp4": VideoSpec(codec="hevc", width=96, height=64, frames=24, seed=2),
    "c.mp4": VideoSpec(codec="av1", width=96, height=64, frames=24, seed=3),
    "d.mp4": VideoSpec(codec="h264", width=80, height=48, frames=20, seed=4),
}


def _read(folder: str, moov_cache: int) -> np.ndarray:
    """Clips visiting every video in turn, three times over."""
    with Reader(folder, size=32, threads=1, moov_cache=moov_cache, seed=0) as r:
        items = [(v % len(r), [1, 9, 17]) for v in range(3 * len(r))]
        return np.concatenate([r.read(items[i : i + 4]).video for i in range(0, len(items), 4)])


def test_a_video_is_read_whole_once_however_small_the_track_cache(tmp_path, monkeypatch) -> None:
    for name, spec in SPECS.items():
        make_video(spec, str(tmp_path / name))
    whole_reads: list[int] = []
    colours: list[str] = []
    read_samples, completed_colour = video_resolve._read_samples, moov.completed_colour

    def counted_read(f, offsets, sizes):
        whole_reads.append(len(sizes))
        return read_samples(f, offsets, sizes)

    def counted_colour(matrix, full_range, size, codec, *args):
        colours.append(codec)
        return completed_colour(matrix, full_range, size, codec, *args)

    want = _read(str(tmp_path), moov_cache=4096)
    monkeypatch.setattr(video_resolve, "_read_samples", counted_read)
    monkeypatch.setattr(moov, "completed_colour", counted_colour)
    got = _read(str(tmp_path), moov_cache=1)  # every clip resolves its video again
    np.testing.assert_array_equal(got, want)
    assert sorted(whole_reads) == sorted(s.frames for s in SPECS.values())  # once each
    assert sorted(colours) == sorted(s.codec for s in SPECS.values())


def test_kept_tables_stay_within_their_budget(tmp_path, monkeypatch) -> None:
    for name, spec in SPECS.items():
        make_video(spec, str(tmp_path / name))
    monkeypatch.setattr(video_catalog, "DERIVED_BYTES", 150)  # one H.264 keep column (96 B)
    whole_reads: list[int] = []
    read_samples = video_resolve._read_samples

    def counted_read(f, offsets, sizes):
        whole_reads.append(len(sizes))
        return read_samples(f, offsets, sizes)

    monkeypatch.setattr(video_resolve, "_read_samples", counted_read)
    with Reader(str(tmp_path), size=32, threads=1, moov_cache=1) as r:
        for v in [0, 1, 2, 3] * 2:
            r.read([(v, [1, 9])])
        catalog = r._catalog
        assert catalog._derived_bytes <= 150
        assert catalog._derived_bytes == sum(d.nbytes for d in catalog._derived.values())
    assert len(whole_reads) > len(SPECS)  # the budget forgot some: read again, still correct

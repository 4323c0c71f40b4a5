"""GulpIO byte layout, random access, and bad chunks (kohakuclip.gulp storage side)."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from kohakuclip.gulp import (
    ChunkBuilder,
    GulpChunk,
    GulpDirectory,
    GulpError,
    check_gulp_directory,
    encode_frame,
    open_gulp_source,
)
from kohakuclip.gulp.sanity import SanityReport
from tests.media import VideoSpec, frame_rgb, psnr


def pil_jpeg(rgb: np.ndarray, quality: int = 85) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def pil_decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def clip(n: int, seed: int = 0, w: int = 64, h: int = 48) -> list[np.ndarray]:
    spec = VideoSpec(width=w, height=h, seed=seed)
    return [frame_rgb(spec, i) for i in range(n)]


def write_by_hand(root: str, number: int, videos: dict[str, list[bytes]]) -> dict:
    """A chunk laid out exactly as the GulpIO format description says, without our writer."""
    data = bytearray()
    meta: dict = {}
    for id_, jpegs in videos.items():
        infos = []
        for jpeg in jpegs:
            pad = (4 - len(jpeg) % 4) % 4
            infos.append([len(data), pad, len(jpeg) + pad])
            data += jpeg + b"\0" * pad
        meta[id_] = {"frame_info": infos, "meta_data": [{"label": f"label of {id_}", "id": id_}]}
    with open(os.path.join(root, f"data_{number}.gulp"), "wb") as f:
        f.write(data)
    with open(os.path.join(root, f"meta_{number}.gmeta"), "w") as f:
        json.dump(meta, f)
    return meta


@pytest.fixture
def hand_dir(tmp_path):
    """Two chunks written by hand; JPEGs from Pillow (an independent encoder)."""
    jpegs = {
        "702766": [pil_jpeg(f) for f in clip(12, seed=1)],
        "803959": [pil_jpeg(f) for f in clip(7, seed=2)],
        "42": [pil_jpeg(f) for f in clip(5, seed=3, w=50, h=70)],
    }
    write_by_hand(str(tmp_path), 0, {k: jpegs[k] for k in ("702766", "803959")})
    write_by_hand(str(tmp_path), 1, {"42": jpegs["42"]})
    return str(tmp_path), jpegs


def test_reads_a_hand_made_gulpio_directory(hand_dir):
    root, jpegs = hand_dir
    gd = GulpDirectory(root)
    assert gd.num_chunks == 2 and len(gd) == 3
    assert gd.chunk_lookup == {"702766": 0, "803959": 0, "42": 1}
    assert set(gd.merged_meta_dict) == set(jpegs)
    for id_, raw in jpegs.items():
        frames, meta = gd[id_]
        assert meta == {"label": f"label of {id_}", "id": id_}
        assert len(frames) == len(raw)
        for frame, data in zip(frames, raw, strict=True):
            expected = pil_decode(data)
            assert frame.dtype == np.uint8 and frame.shape == expected.shape
            assert np.abs(frame.astype(int) - expected).max() <= 2  # two libjpeg-turbo builds
    # ids given as ints, as GulpIO allowed
    assert len(gd[42][0]) == 5
    # iterate chunks, then videos
    seen = [meta["id"] for chunk in gd for _, meta in chunk]
    assert seen == ["702766", "803959", "42"]


def test_index_gives_the_stored_jpeg_bytes_with_one_pread(hand_dir):
    root, jpegs = hand_dir
    index = open_gulp_source(root)
    assert index.ids == ["702766", "803959", "42"]
    for id_, raw in jpegs.items():
        v = index.position(id_)
        path, offsets, sizes = index.frames(v)
        assert list(sizes) == [len(j) for j in raw]
        fd = os.open(path, os.O_RDONLY)
        try:
            for i, data in enumerate(raw):
                assert os.pread(fd, int(sizes[i]), int(offsets[i])) == data
        finally:
            os.close(fd)
        assert index.read(v, [len(raw) - 1, 0, 0]) == [raw[-1], raw[0], raw[0]]
        assert index.meta(v)["label"] == f"label of {id_}"
        assert index.frame_size(v) == pil_decode(raw[0]).shape[:2]
    assert index.fps(0) is None
    with pytest.raises(KeyError, match="nope"):
        index.position("nope")
    with pytest.raises(IndexError, match="702766"):
        index.read(0, [12])


def test_slices_and_index_lists(hand_dir):
    root, _ = hand_dir
    gd = GulpDirectory(root)
    everything, _ = gd["702766"]
    cases = [
        (slice(1, 10, 2), [1, 3, 5, 7, 9]),
        (slice(None, None, -3), [11, 8, 5, 2]),
        (slice(20, 30), []),
        ([0, 5, 9], [0, 5, 9]),
        ([-1, 2, 2], [11, 2, 2]),
    ]
    for selection, expected in cases:
        frames, meta = gd["702766", selection]
        assert meta["id"] == "702766"
        assert len(frames) == len(expected)
        for got, i in zip(frames, expected, strict=True):
            assert np.array_equal(got, everything[i])
    frames, _ = gd["702766", 1:10:2]
    assert len(frames) == 5
    with pytest.raises(IndexError, match="702766"):
        gd["702766", [12]]
    with pytest.raises(KeyError, match="missing"):
        gd["missing"]
    with pytest.raises(TypeError):
        gd[1.5]


def test_written_chunks_follow_the_gulpio_layout(tmp_path):
    frames = clip(6, seed=4, w=61, h=37)  # odd sizes
    data_path, meta_path = str(tmp_path / "data_0.gulp"), str(tmp_path / "meta_0.gmeta")
    with ChunkBuilder(data_path, meta_path) as builder:
        builder.add("a", {"label": "x"}, frames[:4])
        builder.add(7, {"label": "y"}, frames[4:])
    data = open(data_path, "rb").read()
    meta = json.load(open(meta_path))
    assert list(meta) == ["a", "7"]
    assert meta["a"]["meta_data"] == [{"label": "x"}] and meta["7"]["meta_data"] == [{"label": "y"}]
    expected_offset = 0
    records = [info for id_ in ("a", "7") for info in meta[id_]["frame_info"]]
    assert len(records) == 6
    for (offset, pad, length), frame in zip(records, frames, strict=True):
        assert offset == expected_offset and offset % 4 == 0 and length % 4 == 0
        record = data[offset : offset + length]
        jpeg = record[: length - pad]
        assert 0 <= pad < 4 and (len(jpeg) + pad) % 4 == 0 and pad == -len(jpeg) % 4
        assert record[length - pad :] == b"\0" * pad
        assert jpeg.startswith(b"\xff\xd8") and jpeg.rstrip(b"\0").endswith(b"\xff\xd9")
        assert psnr(pil_decode(jpeg), frame) > 24  # q90 4:2:0; a channel swap is ~10 dB
        expected_offset += length
    assert len(data) == expected_offset
    assert check_gulp_directory(str(tmp_path)).ok


def test_round_trip_and_append(tmp_path):
    root = str(tmp_path)
    frames = clip(5, seed=5)
    with ChunkBuilder(f"{root}/data_0.gulp", f"{root}/meta_0.gmeta") as builder:
        builder.add("v", {"label": "a"}, frames)
    chunk = GulpChunk(f"{root}/data_0.gulp", f"{root}/meta_0.gmeta")
    chunk.append("w", {"label": "b"}, frames[:2])
    chunk.append("v", {"label": "a", "part": 2}, frames[:1])  # GulpIO extends an existing id
    gd = GulpDirectory(root)
    got, meta = gd["v"]
    assert len(got) == 6 and meta == {"label": "a"}
    assert gd.merged_meta_dict["v"]["meta_data"] == [{"label": "a"}, {"label": "a", "part": 2}]
    for a, b in zip(got, [*frames, frames[0]], strict=True):
        assert psnr(a, b) > 24
    assert np.array_equal(got[5], got[0])
    assert len(gd["w"][0]) == 2 and "w" in gd and "x" not in gd
    assert check_gulp_directory(root).ok
    new = gd.new_chunks(2)
    assert [os.path.basename(c.data_file_path) for c in new] == ["data_1.gulp", "data_2.gulp"]


def test_frame_kinds(tmp_path):
    rgb = clip(1, seed=6)[0]
    gray = rgb[:, :, 1].copy()
    rgba = np.dstack([rgb, np.full(rgb.shape[:2], 255, np.uint8)])
    cmyk = io.BytesIO()
    Image.fromarray(rgb).convert("CMYK").save(cmyk, format="JPEG", quality=95)
    as_pil = Image.fromarray(rgb)
    jpeg = pil_jpeg(rgb)
    with ChunkBuilder(f"{tmp_path}/data_0.gulp", f"{tmp_path}/meta_0.gmeta") as builder:
        builder.add("k", {}, [rgb, gray, rgba, cmyk.getvalue(), as_pil, jpeg])
    frames, meta = GulpDirectory(str(tmp_path))["k"]
    assert meta == {}
    assert all(f.shape == rgb.shape and f.dtype == np.uint8 for f in frames)
    assert psnr(frames[0], rgb) > 24
    assert psnr(frames[1], np.dstack([gray] * 3)) > 24
    assert psnr(frames[2], rgb) > 24
    assert psnr(frames[3], pil_decode(cmyk.getvalue())) > 30  # Pillow fallback path
    assert psnr(frames[4], rgb) > 24
    index = open_gulp_source(str(tmp_path))
    assert index.read(0, [5]) == [jpeg]  # JPEG bytes stored verbatim
    stacked = index.decode_stack(0, [0, 3, 1, 3, 5])  # decoded in place, CMYK and gray included
    assert stacked.shape == (5, *rgb.shape)
    for got, i in zip(stacked, [0, 3, 1, 3, 5], strict=True):
        assert np.array_equal(got, frames[i])
    for bad in (b"not a jpeg", rgb.astype(np.float32), np.zeros((4, 4, 2), np.uint8)):
        with pytest.raises(GulpError):
            encode_frame(bad)


def test_builder_leaves_nothing_on_error(tmp_path):
    with (
        pytest.raises(RuntimeError),
        ChunkBuilder(f"{tmp_path}/data_0.gulp", f"{tmp_path}/meta_0.gmeta") as b,
    ):
        b.add("a", {}, clip(2))
        raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []


def test_duplicate_ids_are_detected(hand_dir):
    root, jpegs = hand_dir
    write_by_hand(root, 5, {"803959": jpegs["803959"][:2]})
    for opener in (GulpDirectory, open_gulp_source):
        with pytest.raises(GulpError, match=r"803959.*meta_0\.gmeta.*meta_5\.gmeta"):
            opener(root)
    report = check_gulp_directory(root)
    assert not report.ok and list(report.duplicates) == ["803959"]
    assert report.bad_files == [f"{root}/meta_0.gmeta", f"{root}/meta_5.gmeta"]


def test_duplicate_key_inside_one_meta_file(tmp_path):
    root = str(tmp_path)
    write_by_hand(root, 0, {"a": [pil_jpeg(clip(1)[0])]})
    text = open(f"{root}/meta_0.gmeta").read()
    entry = text[text.index("{", 1) : -1]
    with open(f"{root}/meta_0.gmeta", "w") as f:
        f.write('{"a": ' + entry + ', "a": ' + entry + "}")
    report = check_gulp_directory(root)
    assert report.duplicates == {"a": [f"{root}/meta_0.gmeta", f"{root}/meta_0.gmeta"]}


def corrupt(root: str, how: str) -> str:
    """Damage chunk 0 of a good directory; returns the file expected in the error."""
    data, meta = f"{root}/data_0.gulp", f"{root}/meta_0.gmeta"
    if how == "truncated data":
        os.truncate(data, os.path.getsize(data) - 10)
        return data
    if how == "empty data":
        os.truncate(data, 0)
        return data
    if how == "bad json":
        with open(meta, "w") as f:
            f.write('{"702766": {"frame_info": [[0, 1')
        return meta
    if how == "bad record":
        m = json.load(open(meta))
        m["803959"]["frame_info"][1] = [0, 7, 100]
        json.dump(m, open(meta, "w"))
        return meta
    if how == "no meta":
        os.remove(meta)
        return data
    raise AssertionError(how)


@pytest.mark.parametrize(
    "how", ["truncated data", "empty data", "bad json", "bad record", "no meta"]
)
def test_corrupted_chunks(hand_dir, how):
    root, _ = hand_dir
    bad_file = corrupt(root, how)
    with pytest.raises(GulpError, match=os.path.basename(bad_file)):
        open_gulp_source(root)
    with pytest.raises(GulpError, match=os.path.basename(bad_file)):
        if how in ("truncated data", "empty data"):  # the directory opens; reading fails
            GulpDirectory(root)["803959"]
        else:
            GulpDirectory(root)
    report = check_gulp_directory(root)
    assert not report.ok
    assert bad_file in report.bad_files
    assert f"{root}/data_1.gulp" not in report.bad_files  # the good chunk is not blamed


def test_corrupt_jpeg_and_short_reads_name_the_file(hand_dir):
    root, _ = hand_dir
    meta = json.load(open(f"{root}/meta_0.gmeta"))
    offset, pad, length = meta["803959"]["frame_info"][3]
    with open(f"{root}/data_0.gulp", "r+b") as f:
        f.seek(offset)
        f.write(b"\x00" * (length - pad))
    gd = GulpDirectory(root)
    with pytest.raises(GulpError, match=r"data_0\.gulp.*803959.*frame 3"):
        gd["803959"]
    assert len(gd["803959", [0, 1, 2]][0]) == 3  # the rest still reads
    index = open_gulp_source(root)
    with pytest.raises(GulpError, match=r"data_0\.gulp.*803959.*frame 3"):
        index.decode(index.position("803959"), [3])
    with pytest.raises(GulpError, match=r"data_0\.gulp.*803959.*frame 3"):
        index.decode_stack(index.position("803959"), [1, 5, 3])
    os.truncate(f"{root}/data_1.gulp", 100)
    with pytest.raises(GulpError, match=r"data_1\.gulp"):
        GulpDirectory(root)["42"]


def test_stacking_frames_of_different_sizes_names_the_frame(tmp_path):
    frames = [*clip(2, w=40, h=30), clip(1, w=41, h=30)[0]]
    with ChunkBuilder(f"{tmp_path}/data_0.gulp", f"{tmp_path}/meta_0.gmeta") as builder:
        builder.add("mixed", {}, frames)
    index = open_gulp_source(str(tmp_path))
    assert [f.shape for f in index.decode(0, [0, 2])] == [(30, 40, 3), (30, 41, 3)]
    assert index.frame_size(0, 2) == (30, 41)
    with pytest.raises(GulpError, match=r"'mixed' frame 2: size"):
        index.decode_stack(0, [0, 1, 2])


def test_empty_and_missing_directories(tmp_path):
    assert GulpDirectory(str(tmp_path)).num_chunks == 0
    empty = check_gulp_directory(str(tmp_path))  # nothing to check is a failed check
    assert not empty.ok and empty.bad_files == [str(tmp_path)]
    assert empty.lines() == [f"{tmp_path}: no gulp chunks (data_<i>.gulp and meta_<i>.gmeta files)"]
    with pytest.raises(GulpError, match="no gulp chunks"):
        open_gulp_source(str(tmp_path))
    with pytest.raises(GulpError, match="not a directory"):
        GulpDirectory(str(tmp_path / "nope"))
    (tmp_path / "meta_3.gmeta").write_text("{}")  # an unfinished write: skipped when reading
    assert GulpDirectory(str(tmp_path)).num_chunks == 0
    report = check_gulp_directory(str(tmp_path))
    assert isinstance(report, SanityReport)
    assert report.problems == {f"{tmp_path}/meta_3.gmeta": ["no data file"]}

"""Interchangeability with gulpio2 (a maintained fork of GulpIO), as an independent reference.

Directories gulpio2 writes (its GulpIngestor, ChunkWriter and GulpChunk, the JPEGs encoded by
gulpio2 itself) are read here by GulpDirectory, the datasets, Reader and ImageReader; directories
written here (the ingestor and the ``gulp_*`` commands) are read by gulpio2's GulpDirectory; each
extends the other's directories. Frames are compared as JPEG bytes (identical), and decoded
against Pillow's decode of the same bytes (an independent libjpeg-turbo build).

gulpio2 is not a test dependency: it requires Pillow-SIMD, which has no wheels and would replace
Pillow. ``pip install --no-deps gulpio2==0.0.4 sh`` runs these tests; without it they skip.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from kohakuclip import ImageReader, Reader
from kohakuclip.gulp import (
    LABEL2IDX_FILE,
    GulpDirectory,
    GulpError,
    check_gulp_directory,
    load_label2idx,
    open_gulp_source,
)
from kohakuclip.gulp.cli import image_folder_main, json_videos_main
from kohakuclip.gulp.dataset import GulpImageDataset, GulpVideoDataset
from tests.media import VideoSpec, frame_rgb, make_video, psnr

g2fileio = pytest.importorskip("gulpio2.fileio")
g2adapters = pytest.importorskip("gulpio2.adapters")
g2sanity = pytest.importorskip("gulpio2.sanity_utils")
g2utils = pytest.importorskip("gulpio2.utils")

SIDE = 64  # video frames are SIDE x SIDE: Reader and ImageReader then read them without resizing
# libavcodec's MJPEG decoder and the readers' own YCbCr -> RGB against Pillow (libjpeg-turbo):
# measured 59.6-66.1 dB on these frames
READER_PSNR = 50
# gulpio2 decodes with libjpeg-turbo's fast IDCT (luma: measured 48.8-50.9 dB from Pillow) and
# fast upsampling: nearest-neighbour chroma on 4:2:0 JPEGs (ours), where Pillow interpolates
# (RGB: measured 31.5 dB on sharp colour edges; 45-51 on gulpio2's own 4:4:4 JPEGs)
GULPIO2_LUMA_PSNR = 40
GULPIO2_PSNR = 28

Item = tuple[Any, str, list[np.ndarray]]  # (id as the adapter gives it, label, frames)


def _video(seed: int, n: int) -> list[np.ndarray]:
    spec = VideoSpec(width=SIDE, height=SIDE, seed=seed, blur=1.0)
    return [frame_rgb(spec, i) for i in range(n)]


VIDEO_ITEMS: list[Item] = [
    ("v0", "class a", _video(0, 6)),
    ("v1", "class b", _video(1, 7)),
    ("v2", "class a", _video(2, 8)),
    (1234, "class b", _video(3, 5)),  # an int id: stored as "1234", the meta keeps the int
    ("nothing", "class a", []),  # no frames: gulpio2 skips it, and this chunk ends up empty
    ("nothing either", "class b", []),
    ("gray", "class a", [np.ascontiguousarray(f[:, :, 1]) for f in _video(4, 4)]),  # 2-D: gray
]
STORED = {str(id_): frames for id_, _, frames in VIDEO_ITEMS if frames}


class _Gulpio2Videos(g2adapters.AbstractDatasetAdapter, g2adapters.Custom20BNAdapterMixin):
    """A gulpio2 adapter over in-memory frames; gulpio2's mixin makes and writes its label map
    (extending a ``label2idx.json`` already in ``output_folder``, as gulpio2's JSON adapters do).
    Module-level so that gulpio2's ingestor can pickle it into its worker process."""

    def __init__(self, items: list[Item], output_folder: str) -> None:
        self.items = items
        self.data = [{"label": label} for _, label, _ in items]
        self.output_folder = output_folder
        self.labels2idx = self.create_label2idx_dict("label")

    def __len__(self) -> int:
        return len(self.items)

    def iter_data(self, slice_element: slice | None = None) -> Iterator[dict[str, Any]]:
        for id_, label, frames in self.items[slice_element or slice(None)]:
            meta = {"id": id_, "label": label, "idx": self.labels2idx[label]}
            yield {"id": id_, "meta": meta, "frames": frames}
        self.write_label2idx_dict()


def _gulpio2_ingest(items: list[Item], root: Path, per_chunk: int) -> None:
    os.makedirs(root, exist_ok=True)
    g2fileio.GulpIngestor(_Gulpio2Videos(items, str(root)), str(root), per_chunk, 1)()


def _pillow_rgb(jpeg: bytes) -> np.ndarray:
    """The independent reference decode: Pillow, to RGB."""
    with Image.open(io.BytesIO(jpeg)) as image:
        return np.asarray(image.convert("RGB"))


def _max_diff(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())


def _luma(rgb: np.ndarray) -> np.ndarray:
    return rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])


def _assert_gulpio2_decode(frame: np.ndarray, jpeg: bytes, where: object) -> None:
    """gulpio2's decode of ``jpeg`` (a gray one as 2-D) is Pillow's within what gulpio2's
    libjpeg-turbo options change (see GULPIO2_PSNR)."""
    if frame.ndim == 2:
        frame = np.repeat(frame[:, :, None], 3, axis=2)
    reference = _pillow_rgb(jpeg)
    assert psnr(_luma(frame), _luma(reference)) >= GULPIO2_LUMA_PSNR, where
    assert psnr(frame, reference) >= GULPIO2_PSNR, where


def _jpegs(root: Path) -> tuple[Any, GulpDirectory]:
    """gulpio2's and our GulpDirectory over ``root``, both giving the stored JPEG bytes."""
    theirs = g2fileio.GulpDirectory(str(root), jpeg_decoder=bytes)
    return theirs, GulpDirectory(root, jpeg_decoder=bytes)


def _check_index(root: Path, id_: str, jpegs: list[bytes], meta: dict[str, Any]) -> None:
    """The readers' flat index of ``root`` has these JPEG bytes and meta for ``id_``."""
    index = open_gulp_source(root)
    position = index.position(id_)
    assert index.read(position, range(len(jpegs))) == jpegs and index.meta(position) == meta


def _png_folder(root: Path, labels: dict[str, int], seed: int) -> Path:
    """``root/<label>/<k>.png``: ``labels[label]`` smooth 40 x 56 RGB images per label (random
    5 x 7 colours, enlarged)."""
    rng = np.random.default_rng(seed)
    for label, count in labels.items():
        (root / label).mkdir(parents=True)
        for k in range(count):
            small = rng.integers(0, 256, (5, 7, 3), np.uint8)
            Image.fromarray(small).resize((56, 40), Image.BILINEAR).save(root / label / f"{k}.png")
    return root


# -- gulpio2 writes, kohakuclip reads ------------------------------------------------------------
@pytest.fixture(scope="module")
def g2_videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gulpio2's GulpIngestor over VIDEO_ITEMS, 2 per chunk: chunk 2 holds only the two items
    without frames (gulpio2 writes it empty), chunk 3 the gray video."""
    root = tmp_path_factory.mktemp("g2") / "videos"
    _gulpio2_ingest(VIDEO_ITEMS, root, 2)
    return root


def test_gulpio2_videos_have_the_same_ids_meta_and_jpeg_bytes(g2_videos: Path) -> None:
    theirs, ours = _jpegs(g2_videos)
    assert list(ours.merged_meta_dict) == open_gulp_source(g2_videos).ids == list(STORED)
    chunks = {"v0": 0, "v1": 0, "v2": 1, "1234": 1, "gray": 3}
    assert ours.chunk_lookup == theirs.chunk_lookup == chunks
    for id_, frames in STORED.items():
        jpegs, meta = theirs[id_]
        assert jpegs == [g2utils.img_to_jpeg_bytes(f) for f in frames]  # encoded by gulpio2
        assert ours[id_] == (jpegs, meta)
        _check_index(g2_videos, id_, jpegs, meta)
        assert ours[id_, 1:5:2] == theirs[id_, 1:5:2]
        assert ours[id_, [3, 0]] == theirs[id_, [3, 0]]
    assert ours["gray"][1] == {"id": "gray", "label": "class a", "idx": 0}
    assert ours["1234"][1]["id"] == 1234
    by_chunk = [[meta for _, meta in chunk] for chunk in ours]
    assert by_chunk == [[meta for _, meta in chunk] for chunk in theirs]
    assert load_label2idx(str(g2_videos / LABEL2IDX_FILE)) == {"class a": 0, "class b": 1}


def test_gulpio2_frames_decode_like_pillow(g2_videos: Path) -> None:
    raw, _ = _jpegs(g2_videos)
    theirs, ours = g2fileio.GulpDirectory(str(g2_videos)), GulpDirectory(g2_videos)
    for id_ in STORED:
        jpegs = raw[id_][0]
        frames, their_frames = ours[id_][0], theirs[id_][0]
        for jpeg, frame, their_frame in zip(jpegs, frames, their_frames, strict=True):
            reference = _pillow_rgb(jpeg)
            assert frame.shape == (SIDE, SIDE, 3) and _max_diff(frame, reference) <= 1, id_
            # gulpio2 gives gray frames as 2-D arrays, we as RGB
            assert their_frame.shape == ((SIDE, SIDE) if id_ == "gray" else frame.shape)
            _assert_gulpio2_decode(their_frame, jpeg, id_)


def test_gulpio2_videos_through_the_datasets(g2_videos: Path) -> None:
    raw, _ = _jpegs(g2_videos)
    label2idx = {"class a": 0, "class b": 1}
    videos = GulpVideoDataset(g2_videos, num_frames=0, step_size=1, is_val=True)
    images = GulpImageDataset(g2_videos)
    assert len(videos) == len(images) == len(STORED)
    for k, id_ in enumerate(STORED):
        jpegs, meta = raw[id_]
        reference = np.stack([_pillow_rgb(j) for j in jpegs])
        clip, target = videos[k]
        assert clip.shape == reference.shape and _max_diff(clip, reference) <= 1, id_
        assert target == label2idx[meta["label"]] == meta["idx"]
        image, target = images[k]
        assert _max_diff(image, reference[0]) <= 1 and target == meta["idx"], id_


def test_gulpio2_videos_through_reader(g2_videos: Path) -> None:
    raw, _ = _jpegs(g2_videos)
    with Reader(str(g2_videos), size=SIDE, crop="center") as reader:
        assert [reader.info(v).member for v in range(len(reader))] == list(STORED)
        for v, id_ in enumerate(STORED):
            jpegs, meta = raw[id_]
            info = reader.info(v)
            assert (info.n, info.width, info.height, info.meta) == (len(jpegs), SIDE, SIDE, meta)
            clip = reader.read([(v, list(range(info.n)))]).video[0]
            for t, jpeg in enumerate(jpegs):
                reference = _pillow_rgb(jpeg).transpose(2, 0, 1)
                assert psnr(clip[t], reference) >= READER_PSNR, (id_, t)


def test_gulpio2_videos_through_image_reader(g2_videos: Path) -> None:
    raw, _ = _jpegs(g2_videos)
    frames = [(id_, t, jpeg) for id_ in STORED for t, jpeg in enumerate(raw[id_][0])]
    with ImageReader(str(g2_videos), size=SIDE, crop="center", dct_scale=False) as reader:
        assert len(reader) == len(frames)
        batch = reader.read(range(len(frames)))
        for i, (id_, t, jpeg) in enumerate(frames):
            info = reader.info(i)
            assert (info.member, info.frame, info.meta) == (id_, t, raw[id_][1])
            reference = _pillow_rgb(jpeg).transpose(2, 0, 1)
            assert psnr(batch.image[i], reference) >= READER_PSNR, (id_, t)


def test_an_empty_gulpio2_chunk_reads_as_empty_and_both_checks_report_it(g2_videos: Path) -> None:
    """gulpio2 writes a chunk whose items all lack frames as an empty data file and ``{}``."""
    empty = g2_videos / "data_2.gulp"
    assert empty.stat().st_size == 0 and (g2_videos / "meta_2.gmeta").read_text() == "{}"
    assert len(GulpDirectory(g2_videos).chunk_objs_lookup[2]) == 0
    assert str(empty) in check_gulp_directory(str(g2_videos)).problems
    theirs = g2fileio.GulpDirectory(str(g2_videos))
    assert g2sanity.check_data_file_size_larger_zero(theirs) == [str(empty)]


@pytest.fixture(scope="module")
def g2_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gulpio2's own ImageFolderAdapter (label map and meta its own way), 2 images per chunk."""
    base = tmp_path_factory.mktemp("g2_images")
    images = _png_folder(base / "in", {"cat": 2, "dog": 3}, seed=5)
    root = base / "out"
    adapter = g2adapters.ImageFolderAdapter(f"{images}/", str(root))
    g2fileio.GulpIngestor(adapter, str(root), 2, 1)()
    return root


def test_gulpio2_image_folder_through_our_readers(g2_images: Path) -> None:
    raw, ours = _jpegs(g2_images)
    ids = list(raw.merged_meta_dict)
    assert list(ours.merged_meta_dict) == ids and len(ids) == 5
    dataset = GulpImageDataset(g2_images)
    with ImageReader(str(g2_images), size=40, crop="center", dct_scale=False) as reader:
        batch = reader.read(range(len(ids)))
        for k, id_ in enumerate(ids):
            (jpeg,), meta = raw[id_]
            assert ours[id_] == ([jpeg], meta) and meta["id"] == id_
            reference = _pillow_rgb(jpeg)
            image, target = dataset[k]
            assert _max_diff(image, reference) <= 1 and target == meta["idx"], id_
            assert reader.metadata(k) == {"key": id_, "caption": None, "meta": meta}
            x, y, w, h = (int(c) for c in batch.crops[k])
            window = reference[y : y + h, x : x + w].transpose(2, 0, 1)
            assert (w, h) == (40, 40) and psnr(batch.image[k], window) >= READER_PSNR, id_


# -- kohakuclip writes, gulpio2 reads ------------------------------------------------------------
@pytest.fixture(scope="module")
def our_videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gulp_20bn_json_videos over three generated videos (two not square), 1 per chunk."""
    base = tmp_path_factory.mktemp("ours_videos")
    specs = {
        "11": VideoSpec(width=96, height=64, frames=24, fps=24.0, seed=11),
        "12": VideoSpec(width=48, height=80, frames=12, fps=12.0, seed=12),
        "13": VideoSpec(frames=16, fps=8.0, seed=13),
    }
    for id_, spec in specs.items():
        make_video(spec, str(base / f"{id_}.mp4"))
    items = [{"id": id_, "label": f"label {int(id_) % 2}", "extra": [1, 2]} for id_ in specs]
    (base / "list.json").write_text(json.dumps(items))
    argv = [str(base / "list.json"), str(base), str(base / "out"), "--frame_rate", "4"]
    assert json_videos_main([*argv, "--videos_per_chunk", "1", "--quiet"]) == 0
    return base / "out"


@pytest.fixture(scope="module")
def our_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gulp_image_folder over 12 images, 1 per chunk: gulpio2 lists data_10 before data_2."""
    base = tmp_path_factory.mktemp("ours_images")
    images = _png_folder(base / "in", {"cat": 5, "dog": 7}, seed=6)
    Image.open(images / "dog" / "6.png").convert("L").save(images / "dog" / "6.png")
    argv = [str(images), str(base / "out"), "--images_per_chunk", "1", "--quiet"]
    assert image_folder_main(argv) == 0
    return base / "out"


@pytest.mark.parametrize("written", ["our_videos", "our_images"])
def test_gulpio2_reads_what_we_write(written: str, request: pytest.FixtureRequest) -> None:
    root: Path = request.getfixturevalue(written)
    raw, ours = _jpegs(root)
    theirs = g2fileio.GulpDirectory(str(root))
    index = open_gulp_source(root)
    assert set(raw.merged_meta_dict) == set(index.ids) and raw.chunk_lookup == ours.chunk_lookup
    assert theirs.num_chunks == ours.num_chunks == (3 if written == "our_videos" else 12)
    for id_ in index.ids:
        jpegs, meta = raw[id_]
        assert ours[id_] == (jpegs, meta)
        _check_index(root, id_, jpegs, meta)
        for jpeg, frame in zip(jpegs, theirs[id_][0], strict=True):
            _assert_gulpio2_decode(frame, jpeg, id_)
    seen = [meta["label"] for chunk in theirs for _, meta in chunk]
    assert sorted(seen) == sorted(index.meta(v)["label"] for v in range(len(index)))
    label2idx = json.loads((root / LABEL2IDX_FILE).read_text())
    assert label2idx == load_label2idx(str(root / LABEL2IDX_FILE)) and len(label2idx) == 2
    assert all(label2idx[meta["label"]] == meta["idx"] for meta in map(index.meta, range(3)))
    assert g2sanity.check_meta_file_size_larger_zero(theirs) == []
    assert g2sanity.check_data_file_size_larger_zero(theirs) == []
    assert g2sanity.check_data_file_size(theirs) == []
    assert g2sanity.check_for_duplicate_ids(theirs) == []


# -- appending to each other's directories, and what else gulpio2 writes -------------------------
def test_extending_a_gulpio2_directory_keeps_its_label_map(tmp_path: Path) -> None:
    """GulpIO's --extend kept the map in the folder and numbered new labels after it; a map made
    from only the new items' labels ({ant: 0, dog: 1}) used to clash with it and stop."""
    root = tmp_path / "out"
    first = _png_folder(tmp_path / "first", {"cat": 1, "dog": 1}, seed=7)
    g2fileio.GulpIngestor(g2adapters.ImageFolderAdapter(f"{first}/", str(root)), str(root), 5, 1)()
    more = _png_folder(tmp_path / "more", {"ant": 1, "dog": 1}, seed=8)
    assert image_folder_main([str(more), str(root), "--extend", "--quiet"]) == 0
    assert load_label2idx(str(root / LABEL2IDX_FILE)) == {"cat": 0, "dog": 1, "ant": 2}
    theirs = g2fileio.GulpDirectory(str(root))
    labels = {id_: theirs[id_][1]["label"] for id_ in theirs.merged_meta_dict}
    assert labels == {
        "cat-0.png": "cat",
        "dog-0.png": "dog",
        "ant/0.png": "ant",
        "dog/0.png": "dog",
    }
    dataset = GulpImageDataset(root)
    for k, id_ in enumerate(open_gulp_source(root).ids):
        assert dataset[k][1] == theirs[id_][1]["idx"] == {"cat": 0, "dog": 1, "ant": 2}[labels[id_]]


def test_gulpio2_extends_a_directory_written_here(our_videos: Path, tmp_path: Path) -> None:
    root = tmp_path / "out"
    shutil.copytree(our_videos, root)
    items: list[Item] = [("new", "label 1", _video(9, 3)), ("other", "label 2", _video(10, 2))]
    _gulpio2_ingest(items, root, 1)  # gulpio2's mixin extends our label2idx.json
    assert load_label2idx(str(root / LABEL2IDX_FILE)) == {"label 0": 0, "label 1": 1, "label 2": 2}
    ours = GulpDirectory(root)
    assert ours.chunk_lookup == {"11": 0, "12": 1, "13": 2, "new": 3, "other": 4}
    dataset = GulpVideoDataset(root, num_frames=2, step_size=1, is_val=True)
    assert [dataset[k][1] for k in range(5)] == [1, 0, 1, 1, 2]
    frames, meta = ours["other"]
    assert meta == {"id": "other", "label": "label 2", "idx": 2}
    # gulpio2's 4:4:4 JPEGs at quality 90 of these blurred frames, decoded here
    assert all(psnr(f, g) >= 40 for f, g in zip(frames, items[1][2], strict=True))


def test_gulpio2_appends_to_an_id_and_stores_ids_without_frames(tmp_path: Path) -> None:
    """gulpio2's GulpChunk.append adds frames and a meta_data dict to an id already there
    (reads keep the first dict), and stores an id given no frames."""
    data, meta = str(tmp_path / "data_0.gulp"), str(tmp_path / "meta_0.gmeta")
    frames = _video(12, 5)
    chunk = g2fileio.GulpChunk(data, meta)
    with chunk.open("wb"):
        chunk.append("a", {"label": "x", "part": 1}, frames[:2])
        chunk.append("empty", {"label": "x"}, [])
    chunk = g2fileio.GulpChunk(data, meta)
    with chunk.open("ab"):
        chunk.append("a", {"label": "x", "part": 2}, frames[2:])
    theirs, ours = _jpegs(tmp_path)
    assert ours["a"] == theirs["a"] and len(ours["a"][0]) == 5
    assert ours["a"][1] == {"label": "x", "part": 1} and ours["empty"] == ([], {"label": "x"})
    with Reader(str(tmp_path), size=SIDE) as reader:
        assert reader.read([(0, [0, 4])]).video.shape[:2] == (1, 2)
        with pytest.raises(GulpError, match=r"data_0\.gulp: id 'empty' has no frame 0"):
            reader.info(1)
    with ImageReader(str(tmp_path), size=SIDE) as images:
        assert len(images) == 5


def test_a_pickled_meta_file_is_named_as_such(tmp_path: Path) -> None:
    """gulpio2's PickleSerializer: not read (unpickling can run code), and the error says why."""
    data, meta = str(tmp_path / "data_0.gulp"), str(tmp_path / "meta_0.gmeta")
    chunk = g2fileio.GulpChunk(data, meta, serializer=g2fileio.pickle_serializer)
    with chunk.open("wb"):
        chunk.append("a", {"label": "x"}, _video(13, 2))
    with open(meta, "rb") as f:
        assert pickle.load(f)["a"]["meta_data"] == [{"label": "x"}]
    with pytest.raises(GulpError, match=r"meta_0\.gmeta: .*a pickle \(GulpIO's PickleSerializer\)"):
        GulpDirectory(tmp_path)

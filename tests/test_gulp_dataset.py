"""GulpVideoDataset / GulpImageDataset against frames read directly, with torch's DataLoader."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from kohakuclip.gulp import LABEL2IDX_FILE, GulpDirectory, GulpError
from kohakuclip.gulp.dataset import GulpImageDataset, GulpVideoDataset
from kohakuclip.gulp.transforms import (
    CenterCrop,
    ComposeVideo,
    RandHorFlipVideo,
    RandomCropVideo,
    Scale,
)
from tests.media import write_gulp_dir

LENGTHS = {"v0": 20, "v1": 9, "v2": 3, "v3": 14, "v4": 1}
LABELS = {"v0": "jump", "v1": "run", "v2": "jump", "v3": "sit", "v4": "run"}
LABEL2IDX = {"jump": 0, "run": 1, "sit": 2}


@pytest.fixture(scope="module")
def gulp_dir(tmp_path_factory):
    """Five videos of different lengths over two chunks, and label2idx.json beside them."""
    root = tmp_path_factory.mktemp("gulp")
    return write_gulp_dir(str(root), LENGTHS, LABELS, LABEL2IDX, per_chunk=3)


def test_validation_clips_are_the_first_frames(gulp_dir):
    gd = GulpDirectory(gulp_dir)
    ds = GulpVideoDataset(gulp_dir, num_frames=4, step_size=2, is_val=True)
    assert len(ds) == 5
    for index, id_ in enumerate(LENGTHS):
        frames, target = ds[index]
        assert target == LABEL2IDX[LABELS[id_]]
        assert frames.shape == (4, 56, 72, 3) and frames.dtype == np.uint8
        everything, _ = gd[id_]
        n = LENGTHS[id_]
        expected = [everything[min(i, n - 1)] for i in (0, 2, 4, 6)]  # short videos: last frame
        assert np.array_equal(frames, np.stack(expected))
    assert np.array_equal(ds[-1][0], ds[4][0])
    with pytest.raises(IndexError):
        ds[5]


def test_training_clips_start_at_seeded_random_offsets(gulp_dir):
    gd = GulpDirectory(gulp_dir)
    ds = GulpVideoDataset(gulp_dir, num_frames=3, step_size=3, is_val=False, seed=7)
    starts = set()
    for epoch in range(6):
        ds.set_epoch(epoch)
        frames, _ = ds[0]
        matches = [
            s
            for s in range(0, 20 - 9 + 1)
            if np.array_equal(frames, np.stack(gd["v0", s : s + 9 : 3][0]))
        ]
        assert len(matches) == 1
        starts.add(matches[0])
        assert np.array_equal(ds[0][0], frames)  # same (seed, epoch, index): same clip
    assert len(starts) > 1  # epochs differ
    again = GulpVideoDataset(gulp_dir, num_frames=3, step_size=3, is_val=False, seed=7)
    again.set_epoch(5)
    assert np.array_equal(again[0][0], ds[0][0])
    fixed = GulpVideoDataset(gulp_dir, 3, 3, is_val=False, random_offset=False)
    assert np.array_equal(fixed[0][0], np.stack(gd["v0", 0:9:3][0]))


def test_all_frames_lists_and_target_transform(gulp_dir):
    gd = GulpDirectory(gulp_dir)
    ds = GulpVideoDataset(
        gulp_dir,
        num_frames=-1,
        step_size=1,
        is_val=True,
        stack=False,
        target_transform=lambda t: t * 10,
    )
    frames, target = ds[3]
    assert isinstance(frames, list) and len(frames) == 14 and target == 20
    assert all(np.array_equal(a, b) for a, b in zip(frames, gd["v3"][0], strict=True))


def test_transforms_get_the_items_generator(gulp_dir):
    transform = ComposeVideo([Scale(40)], [RandomCropVideo(32), RandHorFlipVideo()])
    ds = GulpVideoDataset(gulp_dir, 4, 1, is_val=False, transform=transform, seed=3)
    a = [ds[i][0] for i in range(5)]
    b = [ds[i][0] for i in range(5)]
    assert all(x.shape == (4, 32, 32, 3) for x in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    plain = GulpVideoDataset(gulp_dir, 4, 1, is_val=True, transform=lambda clip: clip[:2])
    assert plain[0][0].shape == (2, 56, 72, 3)


def test_labels(gulp_dir, tmp_path):
    os.symlink(f"{gulp_dir}/data_0.gulp", tmp_path / "data_0.gulp")
    os.symlink(f"{gulp_dir}/meta_0.gmeta", tmp_path / "meta_0.gmeta")
    with pytest.raises(GulpError, match=LABEL2IDX_FILE):
        GulpVideoDataset(str(tmp_path), 2, 1, is_val=True)
    ds = GulpVideoDataset(str(tmp_path), 2, 1, is_val=True, label2idx=["run", "jump"])
    assert [ds[i][1] for i in range(3)] == [1, 0, 1]
    with pytest.raises(GulpError, match=r"'v0'.*'jump'"):
        GulpVideoDataset(str(tmp_path), 2, 1, is_val=True, label2idx={"run": 0})
    with pytest.raises(GulpError, match="nothing_here: not a directory"):
        GulpImageDataset(str(tmp_path / "nothing_here"), label2idx=["x"])
    os.mkdir(tmp_path / "empty")
    with pytest.raises(GulpError, match="empty: no gulp chunks"):
        GulpImageDataset(str(tmp_path / "empty"), label2idx=["x"])


def test_image_dataset(gulp_dir):
    gd = GulpDirectory(gulp_dir)
    ds = GulpImageDataset(gulp_dir, transform=CenterCrop(40))
    image, target = ds[1]
    assert target == LABEL2IDX["run"]
    assert np.array_equal(image, gd["v1"][0][0][8:48, 16:56])
    assert GulpImageDataset(gulp_dir)[4][0].shape == (56, 72, 3)


def test_dataloader_with_two_workers_gives_the_same_batches(gulp_dir):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    transform = ComposeVideo([], [RandomCropVideo(48), RandHorFlipVideo()])
    ds = GulpVideoDataset(gulp_dir, 4, 2, is_val=False, transform=transform, seed=1)
    batches = {}
    for workers in (0, 2):
        loader = DataLoader(ds, batch_size=2, shuffle=False, num_workers=workers)
        batches[workers] = [(v.clone(), t.clone()) for v, t in loader]
    assert len(batches[0]) == 3
    for (va, ta), (vb, tb) in zip(batches[0], batches[2], strict=True):
        assert torch.equal(va, vb) and torch.equal(ta, tb)
    assert batches[0][0][0].shape == (2, 4, 48, 48, 3) and batches[0][0][0].dtype == torch.uint8
    expected = torch.tensor([LABEL2IDX[LABELS[i]] for i in LENGTHS])
    assert torch.equal(torch.cat([t for _, t in batches[0]]), expected)


def test_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import kohakuclip.gulp, kohakuclip.gulp.dataset, kohakuclip.gulp.transforms\n"
        "import kohakuclip.gulp.cli\n"
        "print('ok')"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


class GulpioStyleDataset(GulpVideoDataset):
    """A subclass as written for GulpIO: ``__getitem__`` reads ``self.items`` and ``self.gd``."""

    def __getitem__(self, index):
        item_id, item_info = self.items[index]
        label = item_info["meta_data"][0]["label"]
        frames, _ = self.gd[item_id, 0 : self.num_frames]
        return np.stack(frames), self.label2idx[label]


def test_gulpio_subclasses_find_its_attributes(gulp_dir):
    ds = GulpioStyleDataset(gulp_dir, num_frames=2, step_size=1, is_val=True)
    assert ds.num_chunks == 2 and ds.classes == list(LABEL2IDX)
    assert [id_ for id_, _ in ds.items] == list(LENGTHS)
    gd = GulpDirectory(gulp_dir)
    for index, id_ in enumerate(LENGTHS):
        frames, target = ds[index]
        assert target == LABEL2IDX[LABELS[id_]]
        assert np.array_equal(frames, np.stack(gd[id_][0][:2]))
        assert ds.items[index][1]["frame_info"] == gd.merged_meta_dict[id_]["frame_info"]

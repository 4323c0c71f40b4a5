"""kohakuclip.torch.ImageDataset: worker counts, resumption, epochs, captions from the manifest."""

from __future__ import annotations

import hashlib
import json
import os
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from kohakuclip import write_images
from kohakuclip.formats import INDEX_MEMBER
from kohakuclip.read.image_reader import ImageReader
from kohakuclip.torch import ClipLoader, ImageDataset, sample_key, yuv_to_rgb
from tests.image_media import photo
from tests.media import psnr

SIZE, BATCH, IMAGES = 32, 4, 10


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Two KCIMG1 shards of 10 captioned images, with manifest.parquet beside them."""
    root = tmp_path_factory.mktemp("imageset")
    src = root / "src"
    src.mkdir()
    for i in range(IMAGES):
        Image.fromarray(photo(60 + 4 * i, 80, seed=200 + i)).save(src / f"{i:02d}.png")
        (src / f"{i:02d}.txt").write_text(f"picture {i}")
        (src / f"{i:02d}.json").write_text(json.dumps({"n": i}))
    summary = write_images(root / "out", [src], per_shard=6, min_short=0, progress=False)
    return summary.shards


def dataset(shards: list[str], **kw: object) -> ImageDataset:
    options: dict = dict(batch_size=BATCH, size=SIZE, threads=1, hflip=0.5, crop="resized")
    options.update(kw)
    return ImageDataset(shards, **options)  # type: ignore[arg-type]


def take(loader: ClipLoader, n: int) -> list:
    out = []
    for batch in loader:
        out.append(batch)
        if len(out) == n:
            break
    return out


def test_batches_are_the_reader_with_the_sample_keys(shards: list[str]) -> None:
    ds = dataset(shards, with_meta=True, seed=4)
    images, meta = take(ClipLoader(ds), 2)[1]
    assert images.shape == (BATCH, 3, SIZE, SIZE) and images.dtype == torch.uint8
    ids = meta["image"].tolist()
    assert ids == ds.indices(1, IMAGES).tolist()
    samples = list(range(BATCH, 2 * BATCH))
    assert meta["sample"].tolist() == samples
    with ImageReader(shards, size=SIZE, hflip=0.5, crop="resized") as reader:
        expected = reader.read(ids, item_keys=[sample_key(4, g) for g in samples])
        np.testing.assert_array_equal(images.numpy(), expected.image)
        turned = reader.read(ids[::-1], item_keys=[sample_key(4, g) for g in samples[::-1]])
    np.testing.assert_array_equal(turned.image[::-1], expected.image)  # keys, not positions
    np.testing.assert_array_equal(turned.crops[::-1], expected.crops)


@pytest.mark.parametrize("epochs", [False, True])
def test_two_ranks_of_batch_2_hold_one_rank_of_batch_4(shards: list[str], epochs: bool) -> None:
    """Ids and pixels (random resized crops and flips included) follow the global sample."""
    one = take(ClipLoader(dataset(shards, epochs=epochs, with_meta=True)), 2)
    ranks = [
        take(
            ClipLoader(
                dataset(shards, epochs=epochs, batch_size=2, rank=r, world_size=2, with_meta=True)
            ),
            2,
        )
        for r in range(2)
    ]
    for step, (images, meta) in enumerate(one):
        parts = [ranks[0][step], ranks[1][step]]
        assert torch.equal(images, torch.cat([x for x, _ in parts]))
        assert torch.equal(meta["image"], torch.cat([m["image"] for _, m in parts]))


def test_mixed_image_shards_and_a_refused_state(shards: list[str]) -> None:
    ds = dataset(shards, weights=[1, 1], with_meta=True)
    assert ds.source_sizes() == [6, 4]
    for _, meta in take(ClipLoader(ds), 2):
        assert meta["mix"].tolist() == [int(i >= 6) for i in meta["image"].tolist()]
        assert meta["source"] == [shards[k] for k in meta["mix"].tolist()]
    state = ClipLoader(ds).state_dict()
    members = [
        [n for n in zipfile.ZipFile(shard).namelist() if n != INDEX_MEMBER] for shard in shards
    ]
    assert state["sources"] == {
        "kind": "images",
        "items": [6, 4],
        "names": [
            hashlib.blake2b("\0".join(m).encode(), digest_size=8).hexdigest() for m in members
        ],
        "epochs": False,
        "weights": [0.5, 0.5],
    }
    with pytest.raises(ValueError, match="saved for 2 mixed sources of 6 \\+ 4 images"):
        ClipLoader(dataset(shards)).load_state_dict(state)


def test_a_folder_of_shards_in_a_mixture_counts_every_shard(shards: list[str]) -> None:
    """A mixture's source may be a folder of shards (the writer's output), listed as one source
    per shard: its images are those of all of them, and the next source's come after them."""
    folder = os.path.dirname(shards[0])
    ds = dataset({"all": folder, "first": shards[0]}, weights=[1, 1], with_meta=True)
    assert ds.source_sizes() == [IMAGES, 6]
    for _, meta in take(ClipLoader(ds), 3):
        mixes = [int(i >= IMAGES) for i in meta["image"].tolist()]
        assert meta["mix"].tolist() == mixes
        assert meta["mix_name"] == [("all", "first")[k] for k in mixes]
    ids = np.concatenate([ds.indices(b) for b in range(100)])
    assert sorted(set(ids.tolist())) == list(range(IMAGES + 6))


def test_meta_carries_captions_and_sidecars(shards: list[str]) -> None:
    _, meta = take(ClipLoader(dataset(shards, with_meta=True)), 1)[0]
    for image_id, key, caption, n in zip(
        meta["image"].tolist(), meta["key"], meta["caption"], meta["meta"]["n"].tolist()
    ):
        assert key == f"{image_id:02d}" and caption == f"picture {image_id}" and n == image_id


@pytest.mark.parametrize("workers", [2])
def test_same_batches_for_any_worker_count(shards: list[str], workers: int) -> None:
    reference = take(ClipLoader(dataset(shards)), 5)
    got = take(ClipLoader(dataset(shards), workers=workers), 5)
    for a, b in zip(reference, got):
        assert torch.equal(a, b)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_continues_exactly(shards: list[str], workers: int) -> None:
    straight = take(ClipLoader(dataset(shards, seed=3)), 6)
    first = ClipLoader(dataset(shards, seed=3), workers=workers)
    take(first, 2)
    state = first.state_dict()
    resumed = ClipLoader(dataset(shards, seed=99), workers=workers)
    resumed.load_state_dict(state)
    for a, b in zip(straight[2:], take(resumed, 4)):
        assert torch.equal(a, b)


def test_epochs_visit_every_image_once_across_ranks(shards: list[str]) -> None:
    seen = []
    for rank in range(2):
        ds = dataset(shards, epochs=True, rank=rank, world_size=2, batch_size=5)
        seen += [int(i) for b in range(2) for i in ds.indices(b, IMAGES)]
    assert sorted(seen) == sorted(list(range(IMAGES)) * 2)  # two epochs, each image in each
    first_epoch = sorted(seen[:5] + seen[10:15])
    assert first_epoch == list(range(IMAGES))


def test_replace_fills_a_batch_around_a_broken_image(tmp_path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(6):
        Image.fromarray(photo(40, 48, seed=i)).save(folder / f"{i}.png")
    (folder / "3.png").write_bytes(b"not a png")  # fails while decoding
    replacing = ImageDataset(
        str(folder), batch_size=6, size=16, threads=1, on_error="replace", with_meta=True
    )
    with pytest.warns(UserWarning, match=r"replaced: .*3\.png"):
        images, meta = replacing.read_batch(0)
    assert images.shape == (6, 3, 16, 16) and 3 not in meta["image"].tolist()
    with ImageReader(str(folder), size=16) as reader:
        for k, image_id in enumerate(meta["image"].tolist()):
            key = sample_key(replacing.seed, int(meta["sample"][k]))
            alone = reader.read([image_id], item_keys=[key]).image[0]
            assert np.array_equal(images[k].numpy(), alone)
    with pytest.raises(Exception, match=r"3\.png"):
        ImageDataset(str(folder), batch_size=6, size=16, threads=1).read_batch(0)


def test_yuv_batches_with_their_meta_finish_as_the_rgb_batches(shards: list[str]) -> None:
    """The meta of a yuv-mode batch carries each image's crop, flips, matrix and range (JPEG:
    full range): ``yuv_to_rgb((images, meta))`` gives the rgb batch but for its chroma, kept
    at half resolution; converting as limited range does not."""
    rgb = dataset(shards, with_meta=True, seed=6)
    yuv = dataset(shards, with_meta=True, seed=6, mode="yuv")
    for batch in range(3):
        expected, rgb_meta = rgb.read_batch(batch)
        images, meta = yuv.read_batch(batch)
        assert torch.equal(meta["crops"], rgb_meta["crops"])
        assert meta["full_range"].all() and set(meta["colorspaces"]) == {"bt601"}
        finished = yuv_to_rgb((images, meta))
        limited = yuv_to_rgb((images, meta), full_range=False)
        for k in range(BATCH):
            right = psnr(finished[k].numpy(), expected[k].numpy())
            assert right > 30 and psnr(limited[k].numpy(), expected[k].numpy()) < right - 3

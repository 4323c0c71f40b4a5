"""ImageReader: pixels against Pillow, every source kind alike, crops, flips, modes, errors."""

from __future__ import annotations

import io
import os
import shutil
import zipfile
import zlib
from dataclasses import fields

import numpy as np
import pytest
from PIL import Image

from kohakuclip import write_images
from kohakuclip.decode.image import dct_denominator
from kohakuclip.decode.pixels import Crop
from kohakuclip.read.image_reader import ImageInfo, ImageReader, ImageReadError
from kohakuclip.read.reader import VideoInfo
from kohakuclip.storage.image_index import map_image_index
from kohakuclip.storage.image_listing import ImageSourceError
from tests.image_media import APPLE_DOUBLE, encode, photo, psnr, write_tar, write_zip
from tests.media import broken_gulp_copy

SIZE = 96


@pytest.fixture(scope="module")
def shard_dir(tmp_path_factory):
    """A KCIMG1 shard of 8 photo-like images stored at short side 256, quality 95."""
    root = tmp_path_factory.mktemp("images")
    src = root / "src"
    src.mkdir()
    for i in range(8):
        h, w = (300 + 20 * i, 420) if i % 2 else (400, 330 + 10 * i)
        Image.fromarray(photo(h, w, seed=100 + i)).save(src / f"{i:03d}.png")
        (src / f"{i:03d}.txt").write_text(f"caption {i}")
    write_images(root / "out", [src], max_short=256, min_short=0, quality=95, progress=False)
    return root / "out"


@pytest.fixture(scope="module")
def shard(shard_dir):
    return str(shard_dir / "shard_00000.zip")


def _stored(shard: str) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(shard) as z:
        return [(n, z.read(n)) for n in z.namelist() if n != "__index__.bin"]


def _reference(data: bytes, crop: np.ndarray, size: int = SIZE) -> np.ndarray:
    """Pillow's full decode, the window cut out, Pillow's resize with the reader's filter
    (BILINEAR, or reduce at an exact integer shrink): uint8 [3, size, size]."""
    return _pillow_window(Image.open(io.BytesIO(data)).convert("RGB"), crop, size)


def _pillow_window(image: Image.Image, crop: np.ndarray, size: int) -> np.ndarray:
    """The crop window of a Pillow image resized with the reader's filter: uint8 [3, S, S]."""
    x, y, w, h = (int(v) for v in crop)
    window = image.crop((x, y, x + w, y + h))
    if w % size == 0 and h % size == 0 and w > size and h > size:
        out = window.reduce((w // size, h // size))
    else:
        out = window.resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(out).transpose(2, 0, 1)


@pytest.mark.parametrize("crop", ["random", "center", "resized"])
def test_pixels_match_pillow_without_dct_scaling(shard, crop):
    stored = _stored(shard)
    with ImageReader(shard, size=SIZE, crop=crop, dct_scale=False) as reader:
        batch = reader.read(range(8), seed=5)
    assert batch.image.shape == (8, 3, SIZE, SIZE) and batch.image.dtype == np.uint8
    for i, (_, data) in enumerate(stored):
        assert psnr(batch.image[i], _reference(data, batch.crops[i])) >= 40, (crop, i)


def test_dct_scaling_stays_close(tmp_path):
    """Windows of 4x the output decode at 1/4 in the DCT; where the window starts on a multiple
    of 4 (here: offsets 0 and 32) the scaled decode covers exactly its pixels."""
    src = tmp_path / "src"
    src.mkdir()
    for i, (h, w) in enumerate([(256, 256), (256, 320), (320, 256)]):
        Image.fromarray(photo(h, w, seed=200 + i)).save(src / f"{i}.png")
    write_images(tmp_path / "out", [src], max_short=256, min_short=0, quality=95, progress=False)
    shard = str(tmp_path / "out" / "shard_00000.zip")
    stored = _stored(shard)
    size = 64
    with ImageReader(shard, size=size, crop="center") as reader:
        scaled = reader.read(range(3), seed=5)
    with ImageReader(shard, size=size, crop="center", dct_scale=False) as reader:
        full = reader.read(range(3), seed=5)
    assert not np.array_equal(scaled.image, full.image), "the DCT shrink was not used"
    for i, (_, data) in enumerate(stored):
        assert int(scaled.crops[i][0]) % 4 == 0 and int(scaled.crops[i][1]) % 4 == 0
        # a different low-pass than the 4x4 box of the full decode's resize
        assert psnr(scaled.image[i], _reference(data, scaled.crops[i], size)) >= 38, i


def test_no_half_size_dct_decode(shard):
    """At windows of 2-4x the output the JPEG is decoded whole (the half-size inverse DCT is
    slower than a full decode and our resize): the same pixels as with dct_scale=False."""
    with ImageReader(shard, size=SIZE, crop="center") as reader:
        default = reader.read(range(8), seed=5)
    with ImageReader(shard, size=SIZE, crop="center", dct_scale=False) as reader:
        full = reader.read(range(8), seed=5)
    np.testing.assert_array_equal(default.image, full.image)


def test_dct_denominator():
    assert dct_denominator(512, 512, Crop(0, 0, 512, 512), 256) == 1  # no 1/2 shrink
    assert dct_denominator(1000, 1000, Crop(0, 0, 1000, 1000), 256) == 1
    assert dct_denominator(1024, 1024, Crop(0, 0, 1024, 1024), 256) == 4
    assert dct_denominator(512, 512, Crop(0, 0, 512, 512), 128) == 4
    assert dct_denominator(512, 512, Crop(0, 0, 300, 512), 128) == 1
    assert dct_denominator(1024, 1024, Crop(0, 0, 1024, 1024), 100) == 8


def test_indexed_zip_listed_zip_tar_folder_and_deflated_zip_agree(shard, tmp_path):
    stored = _stored(shard)
    members = dict(stored)
    write_tar(str(tmp_path / "plain.tar"), members)
    write_zip(str(tmp_path / "deflated.zip"), members, deflate=True)
    folder = tmp_path / "folder"
    folder.mkdir()
    for name, data in stored:
        (folder / name).write_bytes(data)
    outputs = {}
    for name, kwargs in [
        ("indexed", dict(sources=shard)),
        ("listed", dict(sources=shard, use_index=False)),
        ("tar", dict(sources=str(tmp_path / "plain.tar"))),
        ("deflated", dict(sources=str(tmp_path / "deflated.zip"))),
        ("folder", dict(sources=str(folder))),
    ]:
        with ImageReader(**kwargs, size=SIZE, crop="resized", hflip=0.5) as reader:
            assert len(reader) == 8
            info = reader.info(3)
            assert (info.codec, info.member) == ("jpeg", stored[3][0])
            if name != "deflated":  # there: the compressed size
                assert info.size == len(stored[3][1])
            outputs[name] = reader.read(range(8), seed=11)
            # the compiled path, sizes from the index or the JPEG headers (inflated first)
            assert "seconds_pixels" in reader.stats(), name
    ref = outputs.pop("indexed")
    for name, batch in outputs.items():
        np.testing.assert_array_equal(batch.image, ref.image, err_msg=name)
        np.testing.assert_array_equal(batch.crops, ref.crops, err_msg=name)


def test_macos_resource_members_of_archives_are_not_images(tmp_path):
    """A zip or tar made on macOS holds ``__MACOSX/._x.jpg`` / ``._x.jpg`` beside ``x.jpg``:
    resource data, not images, left out as a folder's hidden files are."""
    picture = encode(Image.fromarray(photo(40, 48, seed=1)), "JPEG")
    members = {"x.jpg": picture, "__MACOSX/._x.jpg": APPLE_DOUBLE, "._y.png": APPLE_DOUBLE}
    write_zip(str(tmp_path / "mac.zip"), members)
    write_tar(str(tmp_path / "mac.tar"), members)
    for archive in ("mac.zip", "mac.tar"):
        with ImageReader(str(tmp_path / archive), size=16) as reader:
            assert len(reader) == 1
            assert reader.read([0]).image.shape[0] == 1


def test_plain_archive_jpegs_take_the_compiled_path_and_agree_with_python(tmp_path):
    """Tar and plain zip members have no size in any index: their JPEG headers give it, and
    they decode on the compiled path (``seconds_pixels``), to the bytes of the Python path;
    what the compiled path leaves (four components, PNG) or fails on (a broken scan) goes
    through the Python path as before, and a broken image's error names the member."""
    from tests.test_clips import _jpeg_variants

    members = {f"{name}.jpg": data for name, data in _jpeg_variants().items()}
    broken = bytearray(members["baseline.jpg"])
    broken[len(broken) // 2 : len(broken) // 2 + 64] = b"\xff\xd9" * 32
    members["broken.jpg"] = bytes(broken)
    write_tar(str(tmp_path / "plain.tar"), members)
    write_zip(str(tmp_path / "plain.zip"), members)
    write_zip(str(tmp_path / "deflated.zip"), members, deflate=True)
    items = list(range(len(members) - 1))
    for archive in ("plain.tar", "plain.zip", "deflated.zip"):
        outputs, stats = {}, {}
        for compiled in (True, False):
            with ImageReader(str(tmp_path / archive), size=40, crop="resized", hflip=0.5) as r:
                r._compiled = compiled
                outputs[compiled] = r.read(items, seed=5)
                stats[compiled] = r.stats()
                with pytest.raises(ImageReadError, match=rf"{archive}:broken\.jpg: "):
                    r.read([len(members) - 1, 0], seed=5)
                assert r.read([0], seed=5).image.any()  # the pool still serves
        two = list(members).index("two_frame_headers.jpg")
        assert outputs[True].crops[two, 2] > 16  # the frame libavcodec decodes, not 16x16
        assert stats[True]["seconds_pixels"] > 0 and "seconds_pixels" not in stats[False]
        assert stats[True]["images"] == stats[False]["images"] == len(items)
        np.testing.assert_array_equal(outputs[True].image, outputs[False].image, err_msg=archive)
        np.testing.assert_array_equal(outputs[True].crops, outputs[False].crops)


def _deflated_member(data: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, -15)
    return packer.compress(data) + packer.flush()


def _zip_of_deflated(path: str, payloads: dict[str, bytes]) -> None:
    """A zip whose members hold ``payloads`` as raw deflate data (sizes as given, however
    broken the data): written stored, then marked deflated in both headers."""
    write_zip(path, payloads)
    archive = bytearray(open(path, "rb").read())
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
    directory = archive.rindex(b"PK\x05\x06")
    directory = int.from_bytes(archive[directory + 16 : directory + 20], "little")
    for info in infos:
        archive[info.header_offset + 8 : info.header_offset + 10] = b"\x08\x00"
    at = directory
    for info in infos:
        archive[at + 10 : at + 12] = b"\x08\x00"
        at += 46 + len(info.filename.encode()) + len(info.extra) + len(info.comment)
    open(path, "wb").write(bytes(archive))


def test_damaged_deflated_members_are_named_and_the_rest_read(tmp_path):
    """A deflated member whose stream is damaged, or ends before its deflate stream does, is
    named in its error on both paths; the other images of the batch are read, and the same as
    from a stored zip."""
    from tests.test_clips import _jpeg_variants

    variants = _jpeg_variants()
    members = {"a.jpg": variants["baseline"], "b.jpg": variants["progressive"]}
    write_zip(str(tmp_path / "stored.zip"), members)
    packed = _deflated_member(variants["baseline"])
    payloads = {name: _deflated_member(data) for name, data in members.items()}
    payloads["cut.jpg"] = packed[: len(packed) // 2]
    payloads["bad.jpg"] = b"\xff\xff\xff\xff" + packed[4:]  # a reserved block type
    _zip_of_deflated(str(tmp_path / "deflated.zip"), payloads)
    with ImageReader(str(tmp_path / "stored.zip"), size=24, crop="center") as reader:
        want = reader.read([0, 1], seed=2).image
    for compiled in (True, False):
        with ImageReader(str(tmp_path / "deflated.zip"), size=24, crop="center") as reader:
            reader._compiled = compiled
            for broken in ("bad", "cut"):
                position = list(payloads).index(f"{broken}.jpg")
                with pytest.raises(ImageReadError, match=rf"deflated\.zip:{broken}\.jpg"):
                    reader.read([0, position, 1], seed=2)
            np.testing.assert_array_equal(reader.read([0, 1], seed=2).image, want)
            assert ("seconds_pixels" in reader.stats()) == compiled


def test_a_member_inflating_past_the_limit_is_refused_on_both_paths(tmp_path, monkeypatch):
    """A deflated member that inflates to more than MAX_INFLATED_MEMBER (a zip bomb; here a
    lowered limit) is named, not inflated whole; the other images read."""
    from tests.test_clips import _jpeg_variants

    limit = 1 << 20
    monkeypatch.setattr("kohakuclip.decode._inflate.MAX_INFLATED_MEMBER", limit)
    monkeypatch.setattr("kohakuclip.storage.image_resolve.MAX_INFLATED_MEMBER", limit)
    good = _jpeg_variants()["baseline"]
    bomb = good[:-2] + bytes(2 * limit) + b"\xff\xd9"  # zeros before the end marker
    write_zip(str(tmp_path / "bomb.zip"), {"a.jpg": good, "bomb.jpg": bomb}, deflate=True)
    for compiled in (True, False):
        with ImageReader(str(tmp_path / "bomb.zip"), size=16, crop="center") as reader:
            reader._compiled = compiled
            with pytest.raises(ImageReadError, match=rf"bomb\.jpg: inflates to over {limit}"):
                reader.read([0, 1], seed=0)
            assert reader.read([0], seed=0).image.any()


def test_a_directory_size_past_the_archive_is_refused_at_open(tmp_path):
    """A central directory entry whose compressed size runs past the end of the archive (it
    would size the buffers a share reads into) is refused when the zip is listed."""
    write_zip(str(tmp_path / "a.zip"), {"a.jpg": b"x" * 100, "b.jpg": b"y" * 100}, deflate=True)
    archive = bytearray((tmp_path / "a.zip").read_bytes())
    entry = archive.index(b"PK\x01\x02")  # the first member's directory entry
    archive[entry + 20 : entry + 24] = (1 << 30).to_bytes(4, "little")  # its compressed size
    (tmp_path / "a.zip").write_bytes(bytes(archive))
    with pytest.raises(ImageSourceError, match=r"a\.zip: member 'a\.jpg' runs past the end"):
        ImageReader(str(tmp_path / "a.zip"))


def test_inflate_members_matches_zlib_and_refuses_what_zlib_refuses(tmp_path):
    """The compiled inflate gives zlib's bytes for members read from a file or from a buffer,
    empty and large ones (past its first output buffer) included, and -1 where zlib fails."""
    from kohakuclip.decode._inflate import inflate_members, zlib_found

    assert zlib_found()
    rng = np.random.default_rng(7)
    plain = [b"", b"x", rng.integers(0, 3, 5000, np.uint8).tobytes(), bytes(3_000_000)]
    packed = [_deflated_member(p) for p in plain]
    blob = b"".join(packed)
    offsets = np.cumsum([0, *map(len, packed)])[:-1].tolist()
    (tmp_path / "members").write_bytes(blob)
    fd = os.open(tmp_path / "members", os.O_RDONLY)
    try:
        source = np.frombuffer(blob, np.uint8)
        for fds, given in (([fd] * 4, None), ([-1] * 4, source)):
            data, table = inflate_members(fds, offsets, [len(p) for p in packed], given)
            for want, (start, length) in zip(plain, table.tolist(), strict=True):
                assert bytes(data[start : start + length]) == want
        damaged = [packed[2][: len(packed[2]) // 2], b"\xff" * 40, packed[3][:100]]
        broken = np.frombuffer(b"".join(damaged), np.uint8)
        starts = np.cumsum([0, *map(len, damaged)])[:-1].tolist()
        data, table = inflate_members([-1] * 3, starts, [len(d) for d in damaged], broken)
        for d, (start, length) in zip(damaged, table.tolist(), strict=True):
            with pytest.raises(zlib.error):
                zlib.decompress(d, -15)
            assert (start, length) == (-1, -1)
        data, table = inflate_members([fd], [len(blob) - 10], [100])  # past the file's end
        assert table.tolist() == [[-1, -1]]
    finally:
        os.close(fd)


def test_inflate_members_stops_at_the_limit_and_keeps_the_rest(monkeypatch):
    """A member inflating to exactly the limit is kept, one byte more is refused, and a
    member after a refused bomb still inflates to zlib's bytes."""
    from kohakuclip.decode._inflate import inflate_members

    limit = 100_000
    monkeypatch.setattr("kohakuclip.decode._inflate.MAX_INFLATED_MEMBER", limit)
    plain = [bytes(limit), bytes(limit + 1), bytes(50 * limit), b"after the bomb" * 100]
    packed = [_deflated_member(p) for p in plain]
    starts = np.cumsum([0, *map(len, packed)])[:-1].tolist()
    source = np.frombuffer(b"".join(packed), np.uint8)
    data, table = inflate_members([-1] * 4, starts, [len(p) for p in packed], source)
    assert table[1:3].tolist() == [[-1, -1], [-1, -1]]
    for k in (0, 3):
        start, length = table[k].tolist()
        assert bytes(data[start : start + length]) == plain[k]


def test_a_jpeg_decoding_to_another_size_than_its_header_is_never_cropped_silently(tmp_path):
    """A header walk can size a JPEG otherwise than libavcodec decodes it: the compiled path
    checks the decoded size, leaves the image to the Python path, which refuses it, naming it;
    the other images of the batch are read."""
    from tests.test_clips import _jpeg_variants, dqt_tail_frame_header

    members = {"good.jpg": _jpeg_variants()["baseline"], "odd.jpg": dqt_tail_frame_header()}
    write_tar(str(tmp_path / "plain.tar"), members)
    for compiled in (True, False):
        with ImageReader(str(tmp_path / "plain.tar"), size=8, crop="resized") as reader:
            reader._compiled = compiled
            with pytest.raises(ImageReadError, match=r"plain\.tar:odd\.jpg: "):
                reader.read([0, 1], seed=0)
            assert reader.read([0], seed=0).image.any()


def test_a_jpeg_libavcodec_turns_upside_down_reads_as_stored(tmp_path):
    """A "Metasoft MJPEG Codec" comment makes libavcodec hand the picture over bottom-up, and
    keeps doing so for every later picture of that decoder: both paths read the rows as stored
    (as Pillow does), and the images after it on the same thread stay right."""
    from tests.test_clips import _jpeg_variants

    variants = _jpeg_variants()
    comment = b"Metasoft MJPEG Codec\0"
    segment = b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment
    members = {
        "metasoft.jpg": variants["baseline"][:2] + segment + variants["baseline"][2:],
        **{f"{name}.jpg": variants[name] for name in ("baseline", "gray", "444")},
    }
    write_tar(str(tmp_path / "plain.tar"), members)
    for compiled in (True, False):
        with ImageReader(str(tmp_path / "plain.tar"), size=SIZE, dct_scale=False) as reader:
            reader._compiled = compiled
            batch = reader.read(range(len(members)), seed=2)
            assert ("seconds_pixels" in reader.stats()) == compiled
        for i, data in enumerate(members.values()):
            assert psnr(batch.image[i], _reference(data, batch.crops[i])) >= 40, (compiled, i)


def test_an_archive_gone_is_an_error_per_image_naming_it(tmp_path):
    members = {f"{k}.jpg": data for k, data in enumerate(_stored_variants()[:2])}
    write_tar(str(tmp_path / "plain.tar"), members)
    with ImageReader(str(tmp_path / "plain.tar"), size=32) as reader:
        os.rename(tmp_path / "plain.tar", tmp_path / "moved.tar")
        with pytest.raises(ImageReadError, match=r"plain\.tar:0\.jpg: .*No such file"):
            reader.read([0, 1], seed=0)


def _stored_variants() -> list[bytes]:
    from tests.test_clips import _jpeg_variants

    return list(_jpeg_variants().values())


FOLDER_AT_A_LOW_FILE_LIMIT = """
import os, resource, sys
from kohakuclip import ImageReader
folder = sys.argv[1]
with ImageReader(folder, size=16, threads=2) as reader:
    reader.read([0], seed=0)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    batch = reader.read(list(range(len(reader))), seed=1)
    print(reader.stats()["images"], int("seconds_pixels" in reader.stats()))
"""


def test_a_folder_batch_larger_than_the_file_limit_reads(tmp_path):
    """A share opens at most a group of a folder's files at once, well under a limit of 256."""
    import subprocess
    import sys

    from tests.paths import child_env

    folder = tmp_path / "many"
    folder.mkdir()
    data = encode(Image.fromarray(photo(24, 32, seed=1)), "JPEG")
    for k in range(600):
        (folder / f"{k:04d}.jpg").write_bytes(data)
    done = subprocess.run(
        [sys.executable, "-c", FOLDER_AT_A_LOW_FILE_LIMIT, str(folder)],
        capture_output=True, text=True, env=child_env(), timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["601", "1"]


def test_folder_jpegs_take_the_compiled_path_and_leave_no_descriptor_open(tmp_path):
    """A folder's JPEG files are opened and sized in compiled code and decoded there, to the
    bytes of the Python path; a FIFO or a folder named like a JPEG, a CMYK JPEG, a PNG named
    .jpg go the Python path (which names what it cannot read); no descriptor stays open."""
    from tests.test_clips import _jpeg_variants

    folder = tmp_path / "images"
    folder.mkdir()
    for name, data in _jpeg_variants().items():
        (folder / f"{name}.jpg").write_bytes(data)
    items = list(range(len(_jpeg_variants())))
    open_before = len(os.listdir("/proc/self/fd"))
    outputs, stats = {}, {}
    for compiled in (True, False):
        with ImageReader(str(folder), size=40, crop="resized", hflip=0.5, threads=2) as reader:
            reader._compiled = compiled
            outputs[compiled] = reader.read(items, seed=3)
            stats[compiled] = reader.stats()
    assert stats[True]["seconds_pixels"] > 0 and "seconds_pixels" not in stats[False]
    np.testing.assert_array_equal(outputs[True].image, outputs[False].image)
    os.mkfifo(folder / "z_fifo.jpg")
    with ImageReader(str(folder), size=40) as reader:
        fifo = len(reader) - 1
        with pytest.raises(ImageReadError, match=r"z_fifo\.jpg: .*not a regular file"):
            reader.read([fifo, 0], seed=3)
        assert reader.read(items, seed=3).image.any()
    assert len(os.listdir("/proc/self/fd")) == open_before


def test_info_from_the_index_without_listing(shard):
    with ImageReader(shard, size=SIZE) as reader:
        reader.read([0, 5], seed=0)
        assert reader._catalog.sources[0].names == []  # the central directory was not listed
        info = reader.info(5)
        h, w = Image.open(io.BytesIO(_stored(shard)[5][1])).size[::-1]
        assert (info.width, info.height, info.codec) == (w, h, "jpeg")
        assert info.source == shard and info.member == "005.jpg"


def test_same_seed_same_batch_any_thread_count(shard):
    with ImageReader(shard, size=SIZE, crop="resized", hflip=0.5, vflip=0.5) as one:
        a = one.read([0, 1, 2, 3, 4, 5, 6, 7, 0, 1], seed=3)
        b = one.read([0, 1, 2, 3, 4, 5, 6, 7, 0, 1], seed=4)
    with ImageReader(shard, size=SIZE, crop="resized", hflip=0.5, vflip=0.5, threads=3) as many:
        c = many.read([0, 1, 2, 3, 4, 5, 6, 7, 0, 1], seed=3)
    np.testing.assert_array_equal(a.image, c.image)
    assert not np.array_equal(a.crops, b.crops)


def test_flips_mirror_the_same_crop(shard):
    outs = {}
    for h, v in [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (1.0, 1.0)]:
        with ImageReader(shard, size=SIZE, crop="resized", hflip=h, vflip=v) as reader:
            outs[(h, v)] = reader.read(range(8), seed=9)
    base = outs[(0.0, 0.0)].image
    np.testing.assert_array_equal(outs[(1.0, 0.0)].image, base[..., ::-1])
    np.testing.assert_array_equal(outs[(0.0, 1.0)].image, base[..., ::-1, :])
    np.testing.assert_array_equal(outs[(1.0, 1.0)].image, base[..., ::-1, ::-1])
    assert outs[(1.0, 1.0)].flips.all() and not outs[(0.0, 0.0)].flips.any()


def test_crop_geometry(shard):
    stored = _stored(shard)
    sizes = [Image.open(io.BytesIO(d)).size for _, d in stored]
    with ImageReader(shard, size=SIZE, crop="center") as reader:
        center = reader.read(range(8)).crops
    with ImageReader(shard, size=SIZE, crop="random") as reader:
        random = reader.read(list(range(8)) * 4, seed=1).crops
    scale, ratio = (0.25, 0.5), (0.8, 1.25)
    with ImageReader(shard, size=SIZE, crop="resized", scale=scale, ratio=ratio) as reader:
        resized = reader.read(list(range(8)) * 4, seed=1).crops
    for i, (w, h) in enumerate(sizes):
        side = min(w, h)
        x, y, cw, ch = center[i]
        assert (cw, ch) == (side, side)
        assert abs(x - (w - side) / 2) <= 2 and abs(y - (h - side) / 2) <= 2  # even start
    starts = set()
    for k, (x, y, cw, ch) in enumerate(random):
        w, h = sizes[k % 8]
        assert cw == ch == min(w, h) and x + cw <= w and y + ch <= h and x % 2 == y % 2 == 0
        starts.add((k % 8, x, y))
    assert len(starts) > 10  # positions vary
    for k, (x, y, cw, ch) in enumerate(resized):
        w, h = sizes[k % 8]
        assert x >= 0 and y >= 0 and x + cw <= w and y + ch <= h
        area = cw * ch / (w * h)
        assert scale[0] * 0.95 <= area <= scale[1] * 1.05
        assert ratio[0] * 0.95 <= cw / ch <= ratio[1] * 1.05


@pytest.mark.parametrize("mode", ["yuv_resized", "yuv"])
@pytest.mark.parametrize("crop", ["center", "resized"])
def test_yuv_modes_finish_to_the_rgb_output(shard, mode, crop):
    torch = pytest.importorskip("torch")
    from kohakuclip.torch import yuv_to_rgb

    options = dict(size=SIZE, crop=crop, hflip=0.5, vflip=0.5, dct_scale=False, yuv_size=256)
    with ImageReader(shard, **options) as reader:
        rgb = reader.read(range(8), seed=2)
    with ImageReader(shard, mode=mode, **options) as reader:
        side = 256 if mode == "yuv" else SIZE
        assert reader.batch_shape(8) == (8, side * side + 2 * ((side + 1) // 2) ** 2)
        yuv = reader.read(range(8), seed=2)
    assert yuv.colorspaces == ["bt601"] * 8 and yuv.full_range.all()  # JFIF
    np.testing.assert_array_equal(yuv.crops, rgb.crops)
    np.testing.assert_array_equal(yuv.flips, rgb.flips)
    back = yuv_to_rgb(yuv, size=SIZE, backend="torch")
    assert isinstance(back, torch.Tensor) and tuple(back.shape) == (8, 3, SIZE, SIZE)
    for i in range(8):
        assert psnr(back[i].numpy(), rgb.image[i]) > 30, i  # chroma at half resolution


@pytest.fixture(scope="module")
def other_sources(tmp_path_factory) -> dict[str, str]:
    """The same four photos stored as AVIF, WebP and JPEG XL shards, and as a PNG folder."""
    root = tmp_path_factory.mktemp("other-codecs")
    src = root / "png"
    src.mkdir()
    for i in range(4):
        Image.fromarray(photo(180 + 16 * i, 240, seed=60 + i)).save(src / f"{i}.png")
    found = {"png": str(src)}
    for codec in ("avif", "webp", "jxl"):
        try:
            summary = write_images(root / codec, [src], codec=codec, quality=90, min_short=0,
                                   progress=False)  # fmt: skip
        except ImportError:  # jxl without the [jxl] extra
            continue
        found[codec] = summary.shards[0]
    return found


@pytest.mark.parametrize("kind", ["avif", "webp", "jxl", "png"])
@pytest.mark.parametrize("mode", ["yuv_resized", "yuv"])
def test_yuv_modes_of_other_codecs_finish_to_the_rgb_output(other_sources, kind, mode):
    torch = pytest.importorskip("torch")
    from kohakuclip.torch import yuv_to_rgb

    if kind not in other_sources:
        pytest.skip(f"no {kind} encoder here")
    options = dict(size=SIZE, crop="center", hflip=0.5, dct_scale=False, yuv_size=256)
    with ImageReader(other_sources[kind], **options) as reader:
        rgb = reader.read(range(4), seed=3)
    with ImageReader(other_sources[kind], mode=mode, **options) as reader:
        yuv = reader.read(range(4), seed=3)
    np.testing.assert_array_equal(yuv.flips, rgb.flips)
    back = yuv_to_rgb(yuv, size=SIZE, backend="torch")
    assert isinstance(back, torch.Tensor) and tuple(back.shape) == (4, 3, SIZE, SIZE)
    for i in range(4):
        assert psnr(back[i].numpy(), rgb.image[i]) > 30, (kind, i)


@pytest.mark.parametrize("mode", ["rgb", "yuv_resized", "yuv"])
@pytest.mark.parametrize("kind", ["avif", "webp"])
def test_av1_and_webp_images_decode_compiled_to_the_pixels_of_the_python_path(
    other_sources, kind, mode
):
    """AV1 images (8-bit 4:2:0) and lossy WebP decode in the compiled call (libdav1d,
    libavcodec's WebP decoder), no GIL inside, to the bytes, colorspaces and ranges of the
    Python path (the same libraries through PyAV)."""
    options = dict(size=SIZE, crop="resized", hflip=0.5, vflip=0.5, mode=mode, yuv_size=256)
    batches, stats = {}, {}
    for compiled in (True, False):
        with ImageReader(other_sources[kind], **options) as reader:
            reader._compiled = compiled
            batches[compiled] = reader.read([3, 0, 2, 1, 0], seed=11)
            stats[compiled] = reader.stats()
    assert stats[True]["seconds_pixels"] > 0 and "seconds_pixels" not in stats[False]
    np.testing.assert_array_equal(batches[True].image, batches[False].image)
    assert batches[True].colorspaces == batches[False].colorspaces
    np.testing.assert_array_equal(batches[True].full_range, batches[False].full_range)
    np.testing.assert_array_equal(batches[True].crops, batches[False].crops)


def _compiled_as_python(source: str, count: int) -> np.ndarray:
    """The first ``count`` images of ``source`` (32 pixels, centre crops) read with the
    compiled path on and off: the same bytes, the compiled call used only when on."""
    batches = {}
    for compiled in (True, False):
        with ImageReader(source, size=32, crop="center") as reader:
            reader._compiled = compiled
            batches[compiled] = reader.read(range(count), seed=1).image
            assert ("seconds_pixels" in reader.stats()) == compiled
    np.testing.assert_array_equal(batches[True], batches[False])
    return batches[True]


def test_av1_images_the_compiled_path_leaves_read_through_pyav(tmp_path):
    """A 10-bit AV1 image leaves the compiled call (libdav1d reports its depth) for the Python
    path, beside 8-bit ones that stay; both read as PyAV decodes them."""
    import av

    from kohakuclip.formats import COLOR_FULL_RANGE
    from kohakuclip.write.images import EncodedImage, pack_images

    pixels = photo(72, 96, seed=81)
    images = []
    for name, pix_fmt in (("eight", "yuv420p"), ("ten", "yuv420p10le"), ("again", "yuv420p")):
        ctx = av.CodecContext.create("libsvtav1", "w")
        ctx.width, ctx.height, ctx.pix_fmt = 96, 72, pix_fmt
        ctx.time_base, ctx.color_range = 1, 2
        ctx.options = {"crf": "30", "preset": "10"}
        frame = av.VideoFrame.from_ndarray(pixels, format="rgb24").reformat(format=pix_fmt)
        frame.pts = 0
        data = b"".join(bytes(p) for p in ctx.encode(frame) + ctx.encode(None))
        stored = EncodedImage(data, "av1", COLOR_FULL_RANGE, ".obu", 96, 72, 96, 72, len(data))
        images.append((name, stored))
    pack_images(tmp_path / "av1.zip", images)
    reference = Image.fromarray(pixels).resize((32, 32), Image.Resampling.BOX, box=(12, 0, 84, 72))
    for image in _compiled_as_python(str(tmp_path / "av1.zip"), 3):
        assert psnr(image, np.asarray(reference).transpose(2, 0, 1)) > 25


def test_webp_the_compiled_path_leaves_reads_through_pillow(tmp_path):
    """Lossless and transparent WebP (libavcodec gives them as RGB) leave the compiled call for
    Pillow, alpha composited onto white as the writer does; lossy WebP beside them stays. Each
    reads as Pillow decodes it."""
    from kohakuclip.formats import COLOR_RGB
    from kohakuclip.write.images import EncodedImage, pack_images

    pixels = photo(72, 96, seed=83)
    alpha = np.dstack([pixels, np.full((72, 96), 255, np.uint8)])
    alpha[:20, :30, 3] = 0  # a transparent corner: white once composited
    images, references = [], []
    for name, image, options in (
        ("lossy", Image.fromarray(pixels), {"quality": 90}),
        ("lossless", Image.fromarray(pixels), {"lossless": True}),
        ("alpha", Image.fromarray(alpha, "RGBA"), {"quality": 90}),
    ):
        out = io.BytesIO()
        image.save(out, "WEBP", **options)
        data = out.getvalue()
        stored = EncodedImage(data, "webp", COLOR_RGB, ".webp", 96, 72, 96, 72, len(data))
        images.append((name, stored))
        decoded = Image.open(io.BytesIO(data))
        white = Image.new("RGB", decoded.size, (255, 255, 255))
        white.paste(decoded, mask=decoded.getchannel("A") if decoded.mode == "RGBA" else None)
        references.append(white.resize((32, 32), Image.Resampling.BOX, box=(12, 0, 84, 72)))
    pack_images(tmp_path / "webp.zip", images)
    batch = _compiled_as_python(str(tmp_path / "webp.zip"), 3)
    for image, reference in zip(batch, references, strict=True):
        assert psnr(image, np.asarray(reference).transpose(2, 0, 1)) > 30


def _python_path_codecs(reader: ImageReader, items: list[int]) -> list[str]:
    """The codecs of ``items`` that ``reader`` decodes on the Python path (one read)."""
    from kohakuclip.decode.image import ImageDecoder

    seen: list[str] = []
    original = ImageDecoder.write

    def spy(self, data, codec, *args):  # type: ignore[no-untyped-def]
        seen.append(codec)
        return original(self, data, codec, *args)

    ImageDecoder.write = spy  # type: ignore[method-assign]
    try:
        reader.read(items, seed=2)
    finally:
        ImageDecoder.write = original  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("mode", ["rgb", "yuv_resized", "yuv"])
@pytest.mark.parametrize("container", ["folder", "tar", "zip", "deflated_zip"])
def test_pngs_decode_compiled_to_the_pixels_of_the_python_path(tmp_path, container, mode):
    """8-bit PNGs of every colour type (interlaced too, several of one size in a row; alpha
    and tRNS transparency composited onto white) decode in the compiled call through
    libavcodec, to the bytes, colorspaces and ranges of the Python path (Pillow); 16-bit and
    1-bit PNGs leave it for Pillow. Every image is close to Pillow's own resize of its crop."""
    from tests.test_clips import _png_variants

    variants = _png_variants()
    members = {f"{k:02d}_{name}.png": data for k, (name, data) in enumerate(variants.items())}
    members["20_again_rgb.png"] = encode(Image.fromarray(photo(70, 90, seed=9)), "PNG")
    members["21_odd.png"] = encode(Image.fromarray(photo(37, 51, seed=10)), "PNG")
    source = tmp_path / {"folder": "pngs", "tar": "pngs.tar"}.get(container, "pngs.zip")
    if container == "folder":
        source.mkdir()
        for name, data in members.items():
            (source / name).write_bytes(data)
    elif container == "tar":
        write_tar(str(source), members)
    else:
        write_zip(str(source), members, deflate=container == "deflated_zip")
    items = [*range(len(members)), 0, 8, 0]  # 8: again_rgb, of png_rgb's size
    options = dict(size=32, crop="resized", hflip=0.5, vflip=0.5, mode=mode, yuv_size=128)
    batches = {}
    for compiled in (True, False):
        with ImageReader(str(source), **options) as reader:
            reader._compiled = compiled
            batches[compiled] = reader.read(items, seed=6)
            python = _python_path_codecs(reader, items)
            assert ("seconds_pixels" in reader.stats()) == compiled
        left = ["_16bit", "_1bit"]
        assert len(python) == (len(left) if compiled else len(items)), python
    ours, theirs = batches[True], batches[False]
    np.testing.assert_array_equal(ours.image, theirs.image)
    assert ours.colorspaces == theirs.colorspaces
    np.testing.assert_array_equal(ours.full_range, theirs.full_range)
    np.testing.assert_array_equal(ours.crops, theirs.crops)
    if mode != "rgb":
        return
    for k, item in enumerate(items):
        decoded = Image.open(io.BytesIO(list(members.values())[item]))
        white = Image.new("RGBA", decoded.size, (255, 255, 255, 255))
        flat = Image.alpha_composite(white, decoded.convert("RGBA")).convert("RGB")
        if decoded.mode == "I;16":
            flat = decoded.point(lambda v: v / 257).convert("RGB")
        elif decoded.mode == "1":
            flat = decoded.convert("RGB")
        x, y, w, h = ours.crops[k]
        ref = np.asarray(flat.resize((32, 32), Image.Resampling.BILINEAR, box=(x, y, x + w, y + h)))
        ref = ref.transpose(2, 0, 1)
        hflip, vflip = ours.flips[k]
        ref = ref[:, ::-1] if vflip else ref
        ref = ref[:, :, ::-1] if hflip else ref
        assert psnr(ours.image[k], ref) > 30, list(members)[item]


def test_a_png_that_ends_its_image_early_reads_as_pillow_reads_it(tmp_path):
    """A well-formed PNG whose image data stops after 20 of 64 rows reads as Pillow reads it
    (the rows never decoded are zero): the compiled path hands it to Pillow, also right after
    an image of its size and format whose rows the decoder's reused buffer held, and keeps the
    whole ones."""
    from tests.image_media import raw_png

    folder = tmp_path / "pngs"
    folder.mkdir()
    for name, pixels, rows in (
        ("a_good", photo(64, 64, seed=1), None),
        ("b_short", photo(64, 64, seed=7), 20),
        ("c_good_gray", photo(64, 64, seed=2)[..., 0], None),
        ("d_short_gray", photo(64, 64, seed=8)[..., 0], 20),
    ):
        (folder / f"{name}.png").write_bytes(raw_png(np.ascontiguousarray(pixels), rows=rows))
    batches = {}
    for compiled in (True, False):
        with ImageReader(str(folder), size=64, crop="center") as reader:
            reader._compiled = compiled
            batches[compiled] = reader.read([0, 1, 1, 2, 3, 3], seed=1).image
            if compiled:
                assert _python_path_codecs(reader, [0, 1, 2, 3]) == ["png", "png"]
    np.testing.assert_array_equal(batches[True], batches[False])
    assert not batches[True][1][:, 40:].any()  # black: what was never decoded


def test_damaged_pngs_are_named_on_both_paths(tmp_path):
    """A PNG whose image data is damaged (its checksum fails), cut short, or a well-formed file
    whose compressed image data stops midway (checksums right) raises an ``ImageReadError``
    naming it, on the compiled path as on the Python one; the images beside it are read, and
    the pool keeps serving."""
    import struct

    good = encode(Image.fromarray(photo(60, 80, seed=12)), "PNG")
    damaged = bytearray(good)
    idat = damaged.index(b"IDAT")
    damaged[idat + 40 : idat + 48] = bytes(8)
    (length,) = struct.unpack(">I", good[idat - 4 : idat])
    kept = good[idat + 4 : idat + 4 + length // 2]  # half the zlib stream, in a valid chunk
    stopped = struct.pack(">I", len(kept)) + b"IDAT" + kept
    stopped += struct.pack(">I", zlib.crc32(b"IDAT" + kept))
    stopped = good[: idat - 4] + stopped + good[idat + 8 + length :]
    Image.open(io.BytesIO(stopped)).verify()  # every chunk well-formed
    folder = tmp_path / "pngs"
    folder.mkdir()
    (folder / "a_good.png").write_bytes(good)
    (folder / "b_damaged.png").write_bytes(bytes(damaged))
    (folder / "c_cut.png").write_bytes(good[: len(good) // 2])
    (folder / "d_stream_stops.png").write_bytes(stopped)
    for compiled in (True, False):
        with ImageReader(str(folder), size=24, crop="center") as reader:
            reader._compiled = compiled
            alone = reader.read([0], seed=1).image[0]
            for k, name in ((1, "b_damaged"), (2, "c_cut"), (3, "d_stream_stops")):
                with pytest.raises(ImageReadError, match=rf"{name}\.png: "):
                    reader.read([0, k, 0], seed=1)
            np.testing.assert_array_equal(reader.read([0], seed=1).image[0], alone)


def test_sources_without_images_are_refused_at_open(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("not an image")
    with zipfile.ZipFile(tmp_path / "texts.zip", "w") as z:
        z.writestr("a.txt", "not an image")
    for source in ("empty", "notes", "texts.zip"):
        with pytest.raises(ImageSourceError, match=rf"{source}: no images found"):
            ImageReader(str(tmp_path / source))


def test_yuv_window_must_fit(shard):
    reader = ImageReader(shard, size=SIZE, mode="yuv", yuv_size=128, crop="center")
    with reader, pytest.raises(ImageReadError, match="exceeds the 128-pixel yuv window"):
        reader.read([0])


def test_other_codecs_and_plain_odd_jpegs(tmp_path):
    pixels = photo(200, 240, seed=40)
    src = tmp_path / "src"
    src.mkdir()
    Image.fromarray(pixels).save(src / "p.png")
    for codec in ("avif", "webp"):
        summary = write_images(tmp_path / codec, [src], codec=codec, quality=90, min_short=0,
                               progress=False)  # fmt: skip
        with ImageReader(summary.shards[0], size=SIZE, crop="center", dct_scale=False) as reader:
            assert reader.info(0).codec == ("av1" if codec == "avif" else "webp")
            batch = reader.read([0], seed=0)
        ref = np.asarray(
            Image.fromarray(pixels).resize(
                (SIZE, SIZE), Image.Resampling.BOX, box=(20, 0, 220, 200)
            )
        ).transpose(2, 0, 1)
        assert psnr(batch.image[0], ref) > 30, codec
    plain = tmp_path / "plain"
    plain.mkdir()
    gray = pixels[..., 1]
    (plain / "a_gray.jpg").write_bytes(encode(Image.fromarray(gray, "L"), "JPEG", quality=95))
    (plain / "b_cmyk.jpg").write_bytes(encode(Image.fromarray(pixels).convert("CMYK"), "JPEG"))
    (plain / "c_alpha.png").write_bytes(encode(Image.fromarray(np.dstack([pixels, gray])), "PNG"))
    with ImageReader(str(plain), size=SIZE, crop="center", dct_scale=False) as reader:
        assert [reader.info(i).codec for i in range(3)] == ["jpeg", "jpeg", "png"]
        batch = reader.read([0, 1, 2], seed=0)
    box = (20, 0, 220, 200)
    gray_ref = np.asarray(Image.fromarray(gray).resize((SIZE, SIZE), Image.Resampling.BOX, box=box))
    for c in range(3):
        assert psnr(batch.image[0, c], gray_ref) > 35
    cmyk_ref = Image.open(plain / "b_cmyk.jpg").convert("RGB")
    cmyk_ref = np.asarray(cmyk_ref.resize((SIZE, SIZE), Image.Resampling.BOX, box=box))
    assert psnr(batch.image[1], cmyk_ref.transpose(2, 0, 1)) > 35


def test_batch_and_info_names_are_those_of_clip_batches(shard, tmp_path):
    """Items, colorspace names and ranges as a clip batch records them, info fields in the
    order of VideoInfo; the old batch name still answers, with a warning."""
    with ImageReader(shard, size=SIZE) as reader:
        batch = reader.read([3, 1])
    assert batch.items == [3, 1] and batch.colorspaces == ["rgb", "rgb"]
    assert not batch.full_range.any()
    with pytest.warns(DeprecationWarning, match="items"):
        assert batch.ids == [3, 1]
    plain = tmp_path / "plain"
    plain.mkdir()
    Image.fromarray(photo(60, 80, seed=41)).save(plain / "p.png")  # RGB, through Pillow
    with ImageReader(str(plain), size=SIZE, mode="yuv_resized") as reader:
        batch = reader.read([0])
    assert batch.colorspaces == ["bt601"] and batch.full_range.tolist() == [True]
    video = [f.name for f in fields(VideoInfo)]
    image = [f.name for f in fields(ImageInfo)]
    assert [n for n in video if n in image] == [n for n in image if n in video]
    assert video.index("height") == video.index("width") + 1


def test_corrupt_member_names_the_file_and_the_pool_survives(shard, tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    stored = _stored(shard)
    (folder / "bad.jpg").write_bytes(stored[0][1][: len(stored[0][1]) // 2])
    (folder / "good.jpg").write_bytes(stored[1][1])
    with ImageReader(str(folder), size=SIZE, threads=2) as reader:
        assert len(reader) == 2
        with pytest.raises(ImageReadError, match=r"bad\.jpg"):
            reader.read([0, 1])
        assert reader.read([1, 1]).image.shape == (2, 3, SIZE, SIZE)
    broken = tmp_path / "broken.zip"
    data = bytearray(open(shard, "rb").read())
    with ImageReader(shard, size=SIZE) as reader:
        loc = reader._catalog.locate(2)
    data[loc.offset : loc.offset + loc.size] = b"\0" * loc.size
    broken.write_bytes(bytes(data))
    with ImageReader(str(broken), size=SIZE) as reader:
        with pytest.raises(ImageReadError, match=r"broken\.zip:002\.jpg"):
            reader.read([2])
        reader.read([3])


def test_bad_arguments(shard, tmp_path):
    with pytest.raises(ValueError, match="mode"):
        ImageReader(shard, mode="bgr")
    with pytest.raises(ValueError, match="crop"):
        ImageReader(shard, crop="left")
    with pytest.raises(ValueError, match="scale"):
        ImageReader(shard, scale=(0.5, 0.2))
    with pytest.raises(ValueError, match="no such file"):
        ImageReader(str(tmp_path / "missing.zip"))
    with ImageReader(shard, size=SIZE) as reader:
        with pytest.raises(IndexError):
            reader.read([8])
        with pytest.raises(ValueError, match="out must be"):
            reader.read([0], out=np.empty((1, 3, 10, 10), np.uint8))
        out = np.zeros((2, 3, SIZE, SIZE), np.uint8)
        assert reader.read([0, 1], out=out).image is out
        assert out.any()
        assert len(reader.sample(5, seed=1)) == 5 and reader.sample(5, seed=1) == reader.sample(
            5, seed=1
        )


def test_reader_after_fork_reopens(shard):
    if not hasattr(os, "fork"):
        pytest.skip("no fork")
    with ImageReader(shard, size=SIZE, threads=2) as reader:
        before = reader.read([0, 1], seed=1).image.copy()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: new pool and maps, same pixels
            ok = np.array_equal(reader.read([0, 1], seed=1).image, before)
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
        os.close(w)
        assert os.read(r, 1) == b"1"
        os.waitpid(pid, 0)


# -- GulpIO directories -------------------------------------------------------------------------
GULP_IMAGES = {f"img{i}": photo(90 + 10 * i, 130 - 8 * i, seed=300 + i) for i in range(3)}
GULP_VIDEO = [photo(72, 100, seed=400 + t) for t in range(4)]
GULP_FRAMES = len(GULP_IMAGES) + len(GULP_VIDEO)  # the image gulp, then the video's frames
# Below every window the crops below give, so the resize always shrinks, by ratios under 2. The
# reader resizes these 4:2:0 JPEGs' chroma from its half-resolution planes, the reference (Pillow's
# BILINEAR on the decoded RGB) after the decoder's upsampling: 36.9-45.9 dB apart at this size
# (random resized crops at the low end; the old test's 38 assumed the old filter against a box).
GULP_SIZE = 48
GULP_PSNR = 36
GULP_SCALE = (0.5, 1.0)


@pytest.fixture(scope="module")
def gulp_dir(tmp_path_factory):
    """Chunk 0: three images (one frame per id, labelled); chunk 1: a 4-frame video."""
    from kohakuclip.gulp import ChunkBuilder

    root = tmp_path_factory.mktemp("gulp")
    with ChunkBuilder(str(root / "data_0.gulp"), str(root / "meta_0.gmeta")) as chunk:
        for i, (id_, pixels) in enumerate(GULP_IMAGES.items()):
            chunk.add(id_, {"label": f"class {i % 2}", "idx": i % 2}, [pixels])
    with ChunkBuilder(str(root / "data_1.gulp"), str(root / "meta_1.gmeta")) as chunk:
        chunk.add("clip", {"label": "moving", "fps": 8, "caption": "a clip"}, GULP_VIDEO)
    return str(root)


def _reference_array(pixels: np.ndarray, crop: np.ndarray, size: int = GULP_SIZE) -> np.ndarray:
    return _pillow_window(Image.fromarray(pixels), crop, size)


def _gulp_items(gulp_dir: str) -> list[tuple[str, int, np.ndarray, dict]]:
    """(id, frame, stored RGB pixels, meta) of every stored frame, read with GulpDirectory."""
    from kohakuclip.gulp import GulpDirectory

    gd = GulpDirectory(gulp_dir)
    items = []
    for chunk in gd:
        for id_ in chunk.ids():
            frames, meta = gd[id_]
            items += [(id_, f, pixels, meta) for f, pixels in enumerate(frames)]
    return items


@pytest.mark.parametrize("crop", ["resized", "center"])
def test_gulp_frames_match_gulp_directory(gulp_dir, crop):
    items = _gulp_items(gulp_dir)
    options = dict(size=GULP_SIZE, crop=crop, scale=GULP_SCALE, hflip=0.5, dct_scale=False)
    with ImageReader(gulp_dir, **options) as reader:
        assert len(reader) == len(items) == GULP_FRAMES
        batch = reader.read(range(GULP_FRAMES), seed=7)
        for i, (id_, frame, pixels, meta) in enumerate(items):
            info = reader.info(i)
            assert (info.member, info.frame, info.codec) == (id_, frame, "jpeg")
            assert (info.height, info.width) == pixels.shape[:2]
            assert info.source == gulp_dir and info.meta == meta
            ref = _reference_array(pixels, batch.crops[i])
            if batch.flips[i, 0]:
                ref = ref[..., ::-1]
            assert psnr(batch.image[i], ref) >= GULP_PSNR, (id_, frame)
        assert reader.stats()["seconds_pixels"] > 0  # the compiled path (sizes from headers)
    assert batch.flips[:, 0].any() and not batch.flips[:, 0].all()


def test_gulp_frames_with_dct_scaling_stay_close(gulp_dir):
    items = _gulp_items(gulp_dir)
    with ImageReader(gulp_dir, size=32, crop="center") as reader:
        batch = reader.read(range(GULP_FRAMES), seed=1)
    # windows of 72-110 px: DCT shrink by 2, a different low-pass than the resize's, on top of
    # the chroma path (see GULP_SIZE): measured 30.4-34.6 dB against the full decode's reference
    for i, (id_, _, pixels, _) in enumerate(items):
        assert psnr(batch.image[i], _reference_array(pixels, batch.crops[i], 32)) >= 29, id_


def test_gulp_metadata_carries_the_labels(gulp_dir):
    with ImageReader(gulp_dir, size=SIZE) as reader:
        records = [reader.metadata(i) for i in range(GULP_FRAMES)]
    assert [r["key"] for r in records] == ["img0", "img1", "img2"] + ["clip"] * 4
    assert [r["meta"]["label"] for r in records[:3]] == ["class 0", "class 1", "class 0"]
    assert records[0]["caption"] is None
    assert records[3] == {"key": "clip", "caption": "a clip",
                          "meta": {"label": "moving", "fps": 8, "caption": "a clip"}}  # fmt: skip


def test_gulp_dir_beside_an_image_shard(gulp_dir, shard):
    stored = _stored(shard)
    items = _gulp_items(gulp_dir)
    options = dict(size=GULP_SIZE, crop="resized", scale=GULP_SCALE, dct_scale=False)
    with ImageReader([shard, gulp_dir], **options) as reader:
        assert len(reader) == len(stored) + GULP_FRAMES
        ids = [1, 8, 3, 9, 14, 0]
        batch = reader.read(ids, seed=2)
        for i, image_id in enumerate(ids):
            if image_id < len(stored):
                ref = _reference(stored[image_id][1], batch.crops[i], GULP_SIZE)
                assert reader.metadata(image_id)["caption"] == f"caption {image_id}"
                assert reader.info(image_id).meta == {"caption": f"caption {image_id}"}
                assert reader.info(image_id).frame is None
            else:
                id_, frame, pixels, meta = items[image_id - len(stored)]
                ref = _reference_array(pixels, batch.crops[i])
                assert reader.metadata(image_id)["meta"] == meta
                assert (reader.info(image_id).member, reader.info(image_id).frame) == (id_, frame)
            assert psnr(batch.image[i], ref) >= GULP_PSNR, image_id
        assert reader.origin(9) == (gulp_dir, 1)


def test_gulp_corrupt_frame_names_file_id_and_frame(gulp_dir, tmp_path):
    broken = tmp_path / "broken"
    broken_gulp_copy(gulp_dir, str(broken), "clip", 2)
    with ImageReader(str(broken), size=SIZE, threads=2) as reader:
        with pytest.raises(ImageReadError, match=r"data_1\.gulp: id 'clip' frame 2"):
            reader.read([5, 0])
        assert reader.read([6, 4]).image.shape == (2, 3, SIZE, SIZE)
    os.remove(broken / "meta_0.gmeta")
    with pytest.raises(ValueError, match=r"data_0\.gulp: data file without its meta file"):
        ImageReader(str(broken))


def test_image_dataset_meta_from_a_gulp_dir(gulp_dir):
    pytest.importorskip("torch")
    from kohakuclip.torch import ClipLoader, ImageDataset

    dataset = ImageDataset(gulp_dir, batch_size=4, size=SIZE, epochs=True, with_meta=True)
    images, meta = next(iter(ClipLoader(dataset)))
    assert tuple(images.shape) == (4, 3, SIZE, SIZE)
    with ImageReader(gulp_dir, size=SIZE) as reader:
        expected = [reader.metadata(i) for i in meta["image"].tolist()]
    assert meta["key"] == [r["key"] for r in expected]
    assert meta["meta"]["label"] == [r["meta"]["label"] for r in expected]


def test_a_folder_of_shards_reads_as_its_shards(shard_dir, shard):
    with ImageReader(str(shard_dir), size=SIZE) as folder, ImageReader(shard, size=SIZE) as one:
        assert len(folder) == len(one) == 8
        np.testing.assert_array_equal(
            folder.read(range(8), seed=1).image, one.read(range(8), seed=1).image
        )


def test_a_folder_of_shards_and_loose_images_is_refused(shard, tmp_path):
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(shard, mixed / "shard_00000.zip")
    Image.fromarray(photo(40, 40, seed=1)).save(mixed / "stray.jpg")
    with pytest.raises(ImageSourceError, match=r"mixed: holds both media files \(1, e.g. stray"):
        ImageReader(str(mixed), size=SIZE)


def test_info_of_an_unreadable_image_names_the_file(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "empty.png").write_bytes(b"")
    (folder / "text.jpg").write_bytes(b"not a picture at all\n" * 4)
    with ImageReader(str(folder), size=SIZE) as reader:
        for k, name in enumerate(["empty.png", "text.jpg"]):
            with pytest.raises(ImageReadError, match=rf"bad.{name}: ") as caught:
                reader.info(k)
            assert "BytesIO" not in str(caught.value)
            with pytest.raises(ImageReadError, match=rf"bad.{name}: ") as caught:
                reader.read([k])
            assert "BytesIO" not in str(caught.value)


def test_stats_count_images_bytes_and_stage_time_on_both_paths(shard):
    """The compiled JPEG path and the Python path count the same images and stored bytes;
    each reports its stages (the compiled one its pixels apart)."""
    stored = [len(data) for _, data in _stored(shard)]
    items = [0, 3, 5, 3]
    counted = {}
    for compiled in (True, False):
        with ImageReader(shard, size=SIZE, threads=2) as reader:
            reader._compiled = compiled
            assert reader.stats() == {"images": 0, "bytes_read": 0}
            reader.read(items, seed=0)
            stats = reader.stats()
        counted[compiled] = (stats["images"], stats["bytes_read"])
        assert stats["seconds_decode"] > 0 and stats["seconds_read"] >= 0
        assert ("seconds_pixels" in stats) == compiled
    assert counted[True] == counted[False] == (len(items), sum(stored[i] for i in items))


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("offset", 1 << 62, "damaged index: offset 4611686018427387904"),
        ("size", 0xFFFFFFF0, "damaged index: offset .* runs past the images"),
        ("width", 99936417, "damaged index: an image of 99936417x"),
        ("codec", 250, r"bad\.zip:003\.jpg: .*unknown codec id 250"),
    ],
)
def test_a_damaged_index_record_is_a_clear_error(shard, tmp_path, field, value, match) -> None:
    """Found by tests/test_mutated_shards.py: a record pointing past the images failed with an
    OverflowError, and a width of ~10^8 made the reader allocate a 258 GiB gray plane."""
    bad = tmp_path / "bad.zip"
    shutil.copy(shard, bad)
    data = bytearray(bad.read_bytes())
    table = map_image_index(str(bad))
    assert table is not None
    record = table[3].copy()
    at = data.find(record.tobytes())
    del table
    record[field] = value
    data[at : at + record.itemsize] = record.tobytes()
    bad.write_bytes(bytes(data))
    with ImageReader(str(bad), size=32, threads=2) as reader:
        with pytest.raises(ImageReadError, match=match):
            reader.read([0, 3, 5])
        assert reader.read([0, 5, 6]).image.std() > 5

"""ImageReader: pixels against Pillow, every source kind alike, crops, flips, modes, errors."""

from __future__ import annotations

import io
import os
import shutil
import zipfile

import numpy as np
import pytest
from image_media import encode, photo, psnr, write_tar, write_zip
from PIL import Image

from kohakuclip.decode.image import JPEG_COLORSPACE, dct_denominator, resize_into
from kohakuclip.decode.pixels import Crop
from kohakuclip.image_writer import write_images
from kohakuclip.read.image_reader import ImageReader, ImageReadError

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
    """Pillow's full decode, the window, an area-filtered resize: uint8 [3, size, size]."""
    x, y, w, h = (int(v) for v in crop)
    image = Image.open(io.BytesIO(data)).convert("RGB")
    out = image.resize((size, size), Image.Resampling.BOX, box=(x, y, x + w, y + h))
    return np.asarray(out).transpose(2, 0, 1)


@pytest.mark.parametrize("crop", ["random", "center", "resized"])
def test_pixels_match_pillow_without_dct_scaling(shard, crop):
    stored = _stored(shard)
    with ImageReader(shard, size=SIZE, crop=crop, dct_scale=False) as reader:
        batch = reader.read(range(8), seed=5)
    assert batch.image.shape == (8, 3, SIZE, SIZE) and batch.image.dtype == np.uint8
    for i, (_, data) in enumerate(stored):
        assert psnr(batch.image[i], _reference(data, batch.crops[i])) >= 40, (crop, i)


def test_dct_scaling_stays_close(shard):
    stored = _stored(shard)
    with ImageReader(shard, size=SIZE, crop="center") as reader:
        batch = reader.read(range(8), seed=5)
    values = [
        psnr(batch.image[i], _reference(d, batch.crops[i])) for i, (_, d) in enumerate(stored)
    ]
    # A 256 window shrunk 1/2 in the DCT: a sharper low-pass than the area filter; here about
    # 3.5 dB below the full decode (42.7 against 46.3 dB at the worst image).
    assert min(values) >= 38, values


def test_dct_denominator():
    assert dct_denominator(512, 512, Crop(0, 0, 512, 512), 256) == 2
    assert dct_denominator(512, 512, Crop(0, 0, 512, 512), 128) == 4
    assert dct_denominator(512, 512, Crop(0, 0, 300, 512), 256) == 1
    assert dct_denominator(1024, 1024, Crop(0, 0, 1024, 1024), 100) == 8


def test_resize_into_matches_area_filter():
    src = photo(300, 410, seed=7)
    dst = np.empty((128, 128, 3), np.uint8)
    resize_into(src, dst)
    ref = np.asarray(Image.fromarray(src).resize((128, 128), Image.Resampling.BOX))
    assert psnr(dst, ref) > 38
    up = np.empty((500, 500, 3), np.uint8)
    resize_into(src, up)
    ref = np.asarray(Image.fromarray(src).resize((500, 500), Image.Resampling.BILINEAR))
    assert psnr(up, ref) > 38


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
    ref = outputs.pop("indexed")
    for name, batch in outputs.items():
        np.testing.assert_array_equal(batch.image, ref.image, err_msg=name)
        np.testing.assert_array_equal(batch.crops, ref.crops, err_msg=name)


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
    assert yuv.colorspaces == [JPEG_COLORSPACE] * 8 and yuv.full_range.all()
    np.testing.assert_array_equal(yuv.crops, rgb.crops)
    np.testing.assert_array_equal(yuv.flips, rgb.flips)
    back = yuv_to_rgb(yuv, size=SIZE, backend="torch")
    assert isinstance(back, torch.Tensor) and tuple(back.shape) == (8, 3, SIZE, SIZE)
    for i in range(8):
        assert psnr(back[i].numpy(), rgb.image[i]) > 30, i  # chroma at half resolution


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


def test_corrupt_member_names_the_file_and_the_pool_survives(shard, tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    shutil.copy(shard, folder / "s.zip")
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

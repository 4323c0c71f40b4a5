"""Image shard writing: sources, odd inputs, the KCIMG1 index, manifest, codecs, CLI."""

from __future__ import annotations

import io
import json
import os
import zipfile

import numpy as np
import pyarrow.parquet as pq
import pytest
import simplejpeg
from PIL import Image

from kohakuclip import ImageSkip, encode_image, pack_images, write_images
from kohakuclip.formats import (
    COLOR_FULL_RANGE,
    COLOR_GRAY,
    IMAGE_CODECS,
    INDEX_MEMBER,
)
from kohakuclip.storage.image_index import map_image_index, member_names
from kohakuclip.storage.zip import list_zip
from kohakuclip.write.image_cli import main as cli_main
from kohakuclip.write.image_codecs import encode_pixels, quality_table
from tests.image_media import (
    APPLE_DOUBLE,
    encode,
    oriented_jpeg,
    photo,
    psnr,
    write_tar,
    write_zip,
)
from tests.paths import run_locked_out


def _reference(upright: np.ndarray, max_short: int) -> np.ndarray:
    """Pillow's Lanczos resize of the upright pixels to the stored size."""
    h, w = upright.shape[:2]
    s = max_short / min(h, w)
    if s >= 1:
        return upright
    size = (round(w * s), round(h * s))
    size = (max(size[0], max_short), max(size[1], max_short))
    return np.asarray(Image.fromarray(upright).resize(size, Image.Resampling.LANCZOS))


def _jpeg_markers(data: bytes) -> list[int]:
    """Marker codes up to the first scan."""
    pos, out = 2, []
    while pos < len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        out.append(marker)
        if marker == 0xDA:
            break
        pos += 2 + int.from_bytes(data[pos + 2 : pos + 4], "big")
    return out


def _sampling(data: bytes) -> list[tuple[int, int]]:
    pos = data.index(b"\xff\xc0") + 9
    count = data[pos]
    return [(data[pos + 2 + 3 * i] >> 4, data[pos + 2 + 3 * i] & 15) for i in range(count)]


def _decode(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


# --- the stored JPEG ------------------------------------------------------------------------


def test_default_jpeg_is_baseline_444_and_libjpeg_turbo_decodes_it():
    upright = photo(300, 420, seed=1)
    stored = encode_image(encode(Image.fromarray(upright), "PNG"), max_short=256)
    assert (stored.codec, stored.suffix, stored.color) == ("jpeg", ".jpg", COLOR_FULL_RANGE)
    markers = _jpeg_markers(stored.data)
    assert 0xC0 in markers and not ({0xC1, 0xC2} & set(markers))  # baseline, not progressive
    assert _sampling(stored.data) == [(1, 1)] * 3  # 4:4:4
    h, w, colorspace, sub = simplejpeg.decode_jpeg_header(stored.data)
    assert (w, h, colorspace, sub) == (stored.width, stored.height, "YCbCr", "444")
    assert (stored.width, stored.height) == (358, 256)
    decoded = simplejpeg.decode_jpeg(stored.data)
    assert psnr(decoded, _reference(upright, 256)) > 33


def test_tuned_encoder_beats_libjpeg_turbo_at_equal_psnr():
    pixels = photo(384, 512, seed=2)
    tuned = encode_pixels(pixels, "jpeg", 70, "tuned")
    tuned_psnr = psnr(simplejpeg.decode_jpeg(tuned.data), pixels)
    for q in range(60, 101):
        turbo = encode_pixels(pixels, "jpeg", q, "turbo")
        if psnr(simplejpeg.decode_jpeg(turbo.data), pixels) >= tuned_psnr:
            break
    assert len(tuned.data) < 0.97 * len(turbo.data), (len(tuned.data), len(turbo.data), q)


def test_jpegli_encoder_stores_baseline_jpegs_every_reader_decodes(tmp_path):
    """``jpeg_encoder="jpegli"`` (the [jpegli] extra): baseline JFIF (full range, colour even
    for gray inputs), close to the source through libjpeg-turbo, and read back by ImageReader
    as Pillow decodes it."""
    pytest.importorskip("pyjpegli")
    from kohakuclip import ImageReader

    pixels = photo(240, 320, seed=4)
    stored = encode_pixels(pixels, "jpeg", 70, "jpegli")
    assert (stored.codec, stored.color) == ("jpeg", COLOR_FULL_RANGE)
    markers = _jpeg_markers(stored.data)
    assert 0xC0 in markers and not ({0xC1, 0xC2} & set(markers))
    assert psnr(simplejpeg.decode_jpeg(stored.data), pixels) > 30
    gray = encode_pixels(pixels[:, :, 0], "jpeg", 70, "jpegli")
    assert gray.color == COLOR_FULL_RANGE and len(_sampling(gray.data)) == 3
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.fromarray(pixels).save(folder / "p.png")
    write_images(tmp_path / "out", [folder], jpeg_encoder="jpegli", min_short=0, progress=False)
    shard = str(tmp_path / "out" / "shard_00000.zip")
    with zipfile.ZipFile(shard) as z:
        data = z.read("p.jpg")
    assert data[:2] == b"\xff\xd8" and 0xC0 in _jpeg_markers(data)
    with ImageReader(shard, size=240, crop="center", dct_scale=False) as reader:
        got = reader.read([0]).image[0]
    want = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))[:, 40:280].transpose(2, 0, 1)
    assert psnr(got, want) > 40


def test_one_source_may_be_given_alone(tmp_path):
    """A folder given as a str or a path, not in a list, is that one source (as for videos)."""
    folder = tmp_path / "photos"
    folder.mkdir()
    for k in range(2):
        Image.fromarray(photo(60, 80, seed=k)).save(folder / f"p{k}.png")
    for n, given in enumerate((str(folder), folder)):
        summary = write_images(tmp_path / f"out{n}", given, min_short=0, progress=False)
        assert summary.images == 2


def test_quality_table_follows_libjpeg_scaling():
    assert quality_table(50)[:3] == [16, 16, 16]
    assert quality_table(100) == [1] * 64
    assert max(quality_table(1)) == 255  # baseline tables stay 8-bit
    assert quality_table(70)[-1] == round(418 * 0.6)


def test_gray_source_is_stored_as_gray_jpeg():
    gray = photo(200, 260, seed=3)[..., 1]
    stored = encode_image(encode(Image.fromarray(gray, "L"), "PNG"), max_short=0)
    assert stored.color == COLOR_FULL_RANGE | COLOR_GRAY
    assert simplejpeg.decode_jpeg_header(stored.data)[2] == "Gray"
    decoded = simplejpeg.decode_jpeg(stored.data, colorspace="GRAY")[..., 0]
    assert psnr(decoded, gray) > 35


# --- odd inputs -------------------------------------------------------------------------------


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("backend", ["native", "pillow"])
def test_exif_orientation_is_applied(orientation, backend):
    upright = photo(160, 240, seed=4)
    data = oriented_jpeg(upright, orientation)
    stored = encode_image(data, max_short=0, quality=95, backend=backend)
    assert (stored.width, stored.height) == (240, 160)
    assert (stored.source_width, stored.source_height) == (240, 160)
    assert psnr(_decode(stored.data), upright) > 35


def test_exif_orientation_with_dct_scaled_decode():
    upright = photo(400, 640, seed=5)
    data = oriented_jpeg(upright, 6)
    native = encode_image(data, max_short=128, quality=95)
    pillow = encode_image(data, max_short=128, quality=95, backend="pillow")
    assert (native.width, native.height) == (205, 128)
    assert psnr(_decode(native.data), _reference(upright, 128)) > 30
    assert psnr(_decode(native.data), _decode(pillow.data)) > 38


def test_alpha_is_composited_onto_white():
    rgb = photo(120, 150, seed=6)
    alpha = np.zeros((120, 150), np.uint8)
    alpha[:, 75:] = 255
    alpha[:60, :75] = 128
    rgba = np.dstack([rgb, alpha])
    stored = encode_image(encode(Image.fromarray(rgba, "RGBA"), "PNG"), max_short=0, quality=95)
    a = alpha[..., None].astype(np.float64) / 255
    expected = np.round(rgb * a + 255 * (1 - a)).astype(np.uint8)
    decoded = _decode(stored.data)
    assert psnr(decoded, expected) > 35
    assert decoded[100:, :60].min() > 240  # fully transparent: white


def test_palette_with_transparency():
    rgb = photo(100, 140, seed=7)
    pal = Image.fromarray(rgb).quantize(16)
    pal.info["transparency"] = 0
    data = encode(pal, "PNG", transparency=0)
    stored = encode_image(data, max_short=0, quality=95)
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGBA"))
    a = expected[..., 3:].astype(np.float64) / 255
    expected = np.round(expected[..., :3] * a + 255 * (1 - a)).astype(np.uint8)
    assert psnr(_decode(stored.data), expected) > 33


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_a_transparent_colour_of_an_rgb_or_gray_png_turns_white(mode):
    """A tRNS colour of an RGB or gray PNG is transparent, as an alpha channel would be: those
    pixels are stored white, the others as they are."""
    pixels = np.asarray(Image.fromarray(photo(64, 80, seed=8)).convert(mode)).copy()
    key = (10, 20, 30) if mode == "RGB" else 10
    pixels[:16, :16] = key
    data = encode(Image.fromarray(pixels), "PNG", transparency=key)
    stored = _decode(encode_image(data, max_short=0, min_short=0, quality=100).data)
    gray = stored if stored.ndim == 2 else stored.mean(axis=2)
    assert gray[2:14, 2:14].min() >= 250  # white (JPEG leaves a level or two)
    rest = pixels[24:, 24:] if mode == "L" else pixels[24:, 24:].mean(axis=2)
    assert np.abs(gray[24:, 24:].astype(float) - rest).mean() < 3


def test_cmyk_jpeg():
    rgb = photo(100, 130, seed=8)
    cmyk = Image.fromarray(rgb).convert("CMYK")
    data = encode(cmyk, "JPEG", quality=95)
    stored = encode_image(data, max_short=0, quality=95)
    expected = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert stored.color == COLOR_FULL_RANGE
    assert psnr(_decode(stored.data), expected) > 35
    assert psnr(_decode(stored.data), rgb) > 28


def test_sixteen_bit_gray_png_is_scaled_not_clipped():
    gray8 = photo(90, 110, seed=9)[..., 0]
    gray16 = gray8.astype(np.uint16) * 257
    data = encode(Image.fromarray(gray16), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    stored = encode_image(data, max_short=0, quality=95)
    assert stored.color & COLOR_GRAY
    assert psnr(simplejpeg.decode_jpeg(stored.data, colorspace="GRAY")[..., 0], gray8) > 35


def test_sixteen_bit_rgb_tiff_through_ffmpeg():
    import av

    rgb8 = photo(64, 80, seed=10)
    rgb16 = rgb8.astype(np.uint16) * 257
    out = io.BytesIO()
    with av.open(out, "w", format="image2pipe") as container:
        stream = container.add_stream("tiff")
        stream.width, stream.height, stream.pix_fmt = 80, 64, "rgb48le"
        for packet in stream.encode(av.VideoFrame.from_ndarray(rgb16, format="rgb48le")):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    stored = encode_image(out.getvalue(), max_short=0, quality=95)
    assert psnr(_decode(stored.data), rgb8) > 35


@pytest.mark.parametrize("backend", ["native", "pillow"])
def test_truncated_and_garbage_inputs_are_skipped(backend):
    good = encode(Image.fromarray(photo(200, 200, seed=11)), "JPEG", quality=90)
    for data, reason in ((good[: len(good) // 2], "corrupt"), (b"not an image", "corrupt"),
                         (b"", "empty")):  # fmt: skip
        with pytest.raises(ImageSkip) as err:
            encode_image(data, backend=backend)
        assert err.value.reason == reason


def test_short_side_capped_never_upscaled_and_min_short():
    big = encode(Image.fromarray(photo(600, 900, seed=12)), "PNG")
    small = encode(Image.fromarray(photo(300, 500, seed=13)), "PNG")
    capped = encode_image(big, max_short=512)
    assert (capped.width, capped.height, capped.source_width) == (768, 512, 900)
    kept = encode_image(small, max_short=512)
    assert (kept.width, kept.height) == (500, 300)
    with pytest.raises(ImageSkip) as err:
        encode_image(small, min_short=384)
    assert err.value.reason == "too small" and "500x300" in str(err.value)


# --- source formats, through the writer -------------------------------------------------------

FORMAT_MAX_SHORT = 96


def _source_file(kind: str, pixels: np.ndarray) -> tuple[str, bytes]:
    """A source image file (name, bytes) of ``kind`` showing ``pixels``: for "gif", as its first
    of two frames; for "alpha", with a transparent left third and a half-transparent band."""
    image = Image.fromarray(pixels)
    if kind == "gif":
        other = Image.fromarray(photo(*pixels.shape[:2], seed=99))
        first, second = (im.quantize(256, dither=Image.Dither.NONE) for im in (image, other))
        return "a.gif", encode(first, "GIF", save_all=True, append_images=[second], duration=100)
    if kind == "avif":
        return "a.avif", encode(image, "AVIF", quality=90)
    if kind == "jxl":
        pytest.importorskip("pillow_jxl")
        return "a.jxl", encode(image, "JXL", quality=90)
    if kind == "cmyk":
        return "a.jpg", encode(image.convert("CMYK"), "JPEG", quality=95)
    alpha = np.full(pixels.shape[:2], 255, np.uint8)
    width = pixels.shape[1]
    alpha[:, : width // 3] = 0
    alpha[: pixels.shape[0] // 2, width // 3 : 2 * width // 3] = 128
    return "a.png", encode(Image.fromarray(np.dstack([pixels, alpha]), "RGBA"), "PNG")


def _pillow_reference(data: bytes, frame: int = 0) -> np.ndarray:
    """Pillow's own decode of ``data`` (its ``frame``), composited onto white and resized as the
    writer resizes: what the stored image should show, up to the JPEG error."""
    image = Image.open(io.BytesIO(data))
    image.seek(frame)
    rgba = np.asarray(image.convert("RGBA")).astype(np.float64)
    a = rgba[..., 3:] / 255
    flat = np.round(rgba[..., :3] * a + 255 * (1 - a)).astype(np.uint8)
    return _reference(flat, FORMAT_MAX_SHORT)


@pytest.mark.parametrize("kind", ["gif", "avif", "jxl", "cmyk", "alpha"])
def test_source_formats_are_stored_as_pillow_decodes_them(kind, tmp_path):
    name, data = _source_file(kind, photo(150, 210, seed=40))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / name).write_bytes(data)
    out = tmp_path / "out"
    summary = write_images(
        out, [tmp_path / "src"], quality=95, max_short=FORMAT_MAX_SHORT, min_short=0, progress=False
    )
    assert (summary.images, summary.skipped) == (1, 0)
    (row,) = pq.read_table(out / "manifest.parquet").to_pylist()
    assert (row["width"], row["height"], row["source_width"], row["source_height"]) == (
        134, 96, 210, 150
    )  # fmt: skip
    with zipfile.ZipFile(out / row["shard"]) as z:
        stored = _decode(z.read(row["member"]))
    assert psnr(stored, _pillow_reference(data)) >= 35
    if kind == "gif":  # the first frame is stored, not the second
        assert psnr(stored, _pillow_reference(data, frame=1)) < 20
    if kind == "alpha":  # the transparent third (away from its edge) is white
        assert stored[:, :32].min() >= 245


# --- other storage codecs ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "codec, index_codec, suffix, floor",
    [("avif", "av1", ".obu", 33), ("webp", "webp", ".webp", 33), ("jxl", "jxl", ".jxl", 33)],
)
def test_other_storage_codecs_round_trip(codec, index_codec, suffix, floor):
    pixels = photo(130, 170, seed=14)
    if codec == "jxl":
        pytest.importorskip("pillow_jxl")
    stored = encode_pixels(pixels, codec, 80)
    assert (stored.codec, stored.suffix) == (index_codec, suffix)
    if codec == "avif":
        import av

        decoder = av.CodecContext.create("libdav1d", "r")
        frames = decoder.decode(av.Packet(stored.data)) + decoder.decode(None)
        frame = frames[0]
        assert (frame.width, frame.height, frame.format.name) == (170, 130, "yuv420p")
        decoded = frame.reformat(
            format="rgb24", src_colorspace="ITU601", src_color_range="JPEG", dst_color_range="JPEG"
        ).to_ndarray()
    else:
        decoded = _decode(stored.data)
    assert psnr(decoded, pixels) > floor


def test_unknown_codec_and_encoder_are_refused():
    with pytest.raises(ValueError, match="codec"):
        encode_image(b"x", codec="bmp")
    with pytest.raises(ValueError, match="encoder"):
        encode_image(b"x", jpeg_encoder="mozjpeg")


# --- shards, sources, manifest ----------------------------------------------------------------


def _sources(tmp_path):
    """One of each source kind, with captions and json sidecars; returns (paths, expected)."""
    expected = {}  # key -> (upright pixels, caption, json text)
    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    for i, name in enumerate(["a", "sub/b"]):
        px = photo(400 + 10 * i, 500, seed=20 + i)
        Image.fromarray(px).save(folder / f"{name}.png")
        (folder / f"{name}.txt").write_text(f"caption {name}\n")
        (folder / f"{name}.json").write_text(json.dumps({"n": i}))
        expected[name] = (px, f"caption {name}", json.dumps({"n": i}))
    tar_members = {}
    for i in range(2):
        px = photo(420, 480, seed=30 + i)
        key = f"{i:06d}"
        tar_members[f"{key}.jpg"] = encode(Image.fromarray(px), "JPEG", quality=95, subsampling=0)
        tar_members[f"{key}.txt"] = f"tar caption {i}".encode()
        expected[key] = (px, f"tar caption {i}", None)
    write_tar(str(tmp_path / "wds.tar"), tar_members)
    for deflate in (False, True):
        px = photo(390, 410, seed=40 + deflate)
        key = f"zipped{int(deflate)}"
        write_zip(
            str(tmp_path / f"{key}.zip"),
            {f"{key}.webp": encode(Image.fromarray(px), "WEBP", lossless=True),
             f"{key}.json": b'{"z": 1}'},
            deflate=deflate,
        )  # fmt: skip
        expected[key] = (px, None, '{"z": 1}')
    single = photo(500, 400, seed=50)
    Image.fromarray(single).save(tmp_path / "single.bmp")
    (tmp_path / "single.txt").write_text("single")
    expected["single"] = (single, "single", None)
    paths = [str(folder), str(tmp_path / "wds.tar"), str(tmp_path / "zipped0.zip"),
             str(tmp_path / "zipped1.zip"), str(tmp_path / "single.bmp")]  # fmt: skip
    return paths, expected


def test_write_images_every_source_kind(tmp_path):
    paths, expected = _sources(tmp_path)
    out = tmp_path / "out"
    summary = write_images(out, paths, per_shard=3, workers=2, max_short=384, progress=False)
    assert summary.images == len(expected) and summary.skipped == 0
    assert [os.path.basename(p) for p in summary.shards] == [f"shard_0000{i}.zip" for i in range(3)]
    assert sorted(os.listdir(out)) == sorted(
        ["encoding.json", "manifest.parquet", "skipped.jsonl"]
        + [os.path.basename(p) for p in summary.shards]
    )
    rows = pq.read_table(out / "manifest.parquet").to_pylist()
    assert [r["key"] for r in rows] == ["a", "sub/b", "000000", "000001", "zipped0", "zipped1",
                                        "single"]  # fmt: skip
    for row in rows:
        px, caption, meta = expected[row["key"]]
        assert (row["caption"], row["meta"]) == (caption, meta)
        assert (row["source_width"], row["source_height"]) == (px.shape[1], px.shape[0])
        assert row["native_res"] is False  # every source is larger than max_short
        shard = out / row["shard"]
        records = map_image_index(shard)
        record = records[row["index"]]
        with zipfile.ZipFile(shard) as z:
            data = z.read(row["member"])
        assert row["bytes"] == record["size"] == len(data)
        assert (row["width"], row["height"]) == (record["width"], record["height"])
        assert min(row["width"], row["height"]) == 384
        decoded = simplejpeg.decode_jpeg(data)
        assert psnr(decoded, _reference(px, 384)) > 33, row["key"]
    encoding = json.loads((out / "encoding.json").read_text())
    assert encoding["codec"] == "jpeg" and encoding["quality"] == 70
    assert encoding["images"] == len(expected)


def test_an_archive_that_cannot_be_listed_is_skipped_and_the_run_goes_on(tmp_path):
    """A corrupt tar or zip is listed when its turn comes: it goes to the skip log, named, and
    the sources after it are still stored (an error would stop every resumed run there too)."""
    for name in ("bad.tar", "bad.zip"):
        (tmp_path / name).write_bytes(b"not an archive at all" * 40)
    Image.fromarray(photo(60, 70, seed=3)).save(tmp_path / "after.png")
    sources = [str(tmp_path / n) for n in ("bad.tar", "bad.zip", "after.png")]
    summary = write_images(tmp_path / "out", sources, min_short=0, progress=False)
    assert (summary.images, summary.skipped) == (1, 2)
    lines = [json.loads(x) for x in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert [(line["source"], line["reason"]) for line in lines] == [
        (sources[0], "unreadable"),
        (sources[1], "unreadable"),
    ]
    assert all("bad." in line["detail"] for line in lines)


def test_index_matches_the_zip_listing(tmp_path):
    paths, _ = _sources(tmp_path)
    summary = write_images(tmp_path / "out", paths, per_shard=4, progress=False, max_short=400)
    for shard in summary.shards:
        listing = list_zip(shard)
        assert listing[-1].name == INDEX_MEMBER
        records = map_image_index(shard)
        assert isinstance(records, np.memmap) or isinstance(records.base, np.memmap)
        images = listing[:-1]
        assert len(records) == len(images)
        assert records["offset"].tolist() == [m.offset for m in images]
        assert records["size"].tolist() == [m.size for m in images]
        assert member_names(shard, records) == [m.name for m in images]
        assert set(records["codec"].tolist()) == {IMAGE_CODECS.index("jpeg")}
        with open(shard, "rb") as f:
            for rec in records:
                f.seek(int(rec["offset"]))
                h, w, _, _ = simplejpeg.decode_jpeg_header(f.read(int(rec["size"])))
                assert (w, h) == (rec["width"], rec["height"])


def test_skipped_images_and_min_short(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    Image.fromarray(photo(400, 500, seed=60)).save(src / "ok.png")
    Image.fromarray(photo(200, 500, seed=61)).save(src / "small.png")
    good = encode(Image.fromarray(photo(400, 400, seed=62)), "JPEG")
    (src / "broken.jpg").write_bytes(good[: len(good) // 3])
    summary = write_images(tmp_path / "out", [src], progress=False)
    assert (summary.images, summary.skipped) == (1, 2)
    lines = [json.loads(x) for x in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert {(x["key"], x["reason"]) for x in lines} == {("broken", "corrupt"),
                                                        ("small", "too small")}  # fmt: skip
    keep_all = write_images(tmp_path / "all", [src], min_short=0, progress=False)
    assert (keep_all.images, keep_all.skipped) == (2, 1)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifos_and_link_loops_in_an_image_folder(tmp_path):
    """A FIFO named like an image is skipped as unreadable (opening it would wait forever for
    a writer); a link back up the tree is not walked again."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    Image.fromarray(photo(400, 500, seed=63)).save(src / "sub" / "ok.png")
    os.mkfifo(src / "pipe.png")
    (src / "sub" / "up").symlink_to("..")
    summary = write_images(tmp_path / "out", [src], progress=False)
    assert (summary.images, summary.skipped) == (1, 1)
    lines = [json.loads(x) for x in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert [(x["key"], x["reason"]) for x in lines] == [("pipe", "unreadable")]
    assert "not a regular file" in lines[0]["detail"]


def test_write_images_other_codec_and_pillow_backend(tmp_path):
    paths, _expected = _sources(tmp_path)
    summary = write_images(tmp_path / "out", paths[:2], codec="webp", backend="pillow",
                           per_shard=100, max_short=256, progress=False)  # fmt: skip
    records = map_image_index(summary.shards[0])
    assert set(records["codec"].tolist()) == {IMAGE_CODECS.index("webp")}
    assert all(n.endswith(".webp") for n in member_names(summary.shards[0], records))


def test_pack_images_is_atomic_and_names_are_unique(tmp_path):
    image = encode_image(encode(Image.fromarray(photo(64, 64)), "PNG"), max_short=0)
    path = tmp_path / "shard.zip"
    names = pack_images(path, [("x", image), ("x", image), ("__index__", image)])
    assert names == ["x.jpg", "x_1.jpg", "__index__.jpg"]

    def failing():
        yield "y", image
        raise RuntimeError("encoder died")

    with pytest.raises(RuntimeError):
        pack_images(tmp_path / "broken.zip", failing())
    assert sorted(os.listdir(tmp_path)) == ["shard.zip"]


def test_missing_source_fails_before_writing(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        write_images(tmp_path / "out", [tmp_path / "nope"], progress=False)
    assert not (tmp_path / "out" / "manifest.parquet").exists()


def test_cli(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    Image.fromarray(photo(100, 120, seed=70)).save(src / "p.png")
    code = cli_main([str(tmp_path / "out"), str(src), "--min-short", "0", "--quality", "80",
                     "--jpeg-encoder", "turbo", "--workers", "1", "--no-progress"])  # fmt: skip
    assert code == 0
    assert "1 images in 1 shards" in capsys.readouterr().err
    records = map_image_index(tmp_path / "out" / "shard_00000.zip")
    assert (records["width"][0], records["height"][0]) == (120, 100)
    assert pq.read_table(tmp_path / "out" / "manifest.parquet")["native_res"].to_pylist() == [True]
    assert cli_main([str(tmp_path / "o2"), str(tmp_path / "missing")]) == 2


def test_av1_names_the_avif_codec(tmp_path):
    """``--codec av1`` stores what ``avif`` stores (raw OBUs), and the run records ``avif``."""
    src = tmp_path / "src"
    src.mkdir()
    Image.fromarray(photo(100, 120, seed=71)).save(src / "p.png")
    for codec in ("av1", "avif"):
        argv = [str(tmp_path / codec), str(src), "--min-short", "0", "--codec", codec]
        assert cli_main([*argv, "--workers", "1", "--no-progress"]) == 0
    stored = [
        zipfile.ZipFile(tmp_path / codec / "shard_00000.zip").read("p.obu")
        for codec in ("av1", "avif")
    ]
    assert stored[0] == stored[1]
    settings = json.loads((tmp_path / "av1" / "encoding.json").read_text())
    assert settings["codec"] == "avif" and settings["index_codec"] == "av1"
    assert (
        encode_pixels(photo(64, 64, seed=72), "av1").data
        == encode_pixels(photo(64, 64, seed=72), "avif").data
    )
    png = io.BytesIO()
    Image.fromarray(photo(100, 120, seed=73)).save(png, format="PNG")
    both = [encode_image(png.getvalue(), codec=c, min_short=0) for c in ("av1", "avif")]
    assert both[0].data == both[1].data and both[0].codec == "av1"


UNLISTABLE = """
import json, sys
from kohakuclip import write_images

summary = write_images(sys.argv[2], [sys.argv[1]], min_short=0, progress=False)
print(summary.images, summary.skipped)
"""


def test_a_folder_the_writer_may_not_list_is_in_the_skip_log(tmp_path):
    import sys

    src = tmp_path / "src"
    (src / "locked").mkdir(parents=True)
    Image.fromarray(photo(40, 48, seed=1)).save(src / "ok.png")
    Image.fromarray(photo(40, 48, seed=2)).save(src / "locked" / "hidden.png")
    command = [sys.executable, "-c", UNLISTABLE, str(src), str(tmp_path / "out")]
    done = run_locked_out(command, src / "locked", 120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "1"]
    lines = [json.loads(x) for x in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert [(x["key"], x["reason"]) for x in lines] == [("locked", "unreadable")]
    assert "cannot list the folder" in lines[0]["detail"]


def test_an_interrupt_while_a_shard_opens_leaves_no_partial_file(tmp_path, monkeypatch) -> None:
    """As for videos: Ctrl-C between the shard's temporary file and the writer holding it."""
    from kohakuclip.write import images

    src = tmp_path / "src"
    src.mkdir()
    Image.fromarray(photo(64, 80, seed=1)).save(src / "a.png")

    class Interrupted(images._ShardWriter):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            raise KeyboardInterrupt

    monkeypatch.setattr(images, "_ShardWriter", Interrupted)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        write_images(out, [src], min_short=0, progress=False)
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


def test_macos_resource_members_are_not_written_or_skipped(tmp_path):
    """``__MACOSX/._a.jpg`` beside ``a.jpg`` is no image: left out, not reported as one that
    failed to decode."""
    picture = encode(Image.fromarray(photo(40, 48, seed=2)), "PNG")
    archive = str(tmp_path / "mac.zip")
    write_zip(archive, {"a.jpg": picture, "__MACOSX/._a.jpg": APPLE_DOUBLE})
    summary = write_images(tmp_path / "out", [archive], min_short=0, progress=False)
    assert (summary.images, summary.skipped) == (1, 0)


def test_every_image_of_an_archive_is_stored_repeats_too_and_resumes(tmp_path, monkeypatch):
    """Images sharing a WebDataset key (``frame.0001.jpg`` beside ``frame.0002.jpg``, ``a.jpg``
    beside ``a.png``) and a member name the tar repeats are each stored, with their key's
    caption; each has its own source, so a run stopped after the first of two repeated names
    resumes to a straight run's shards."""
    from kohakuclip.write import images as writer

    pictures = [encode(Image.fromarray(photo(40, 48, seed=s)), "PNG") for s in range(6)]
    members = [
        ("frame.0001.jpg", pictures[0]),
        ("frame.0002.jpg", pictures[1]),
        ("frame.txt", b"a caption"),
        ("a.jpg", pictures[2]),
        ("a.png", pictures[3]),
        ("dup.jpg", pictures[4]),
        ("dup.jpg", pictures[5]),
    ]
    tar = str(tmp_path / "wds.tar")
    write_tar(tar, members)
    options = dict(per_shard=2, workers=1, min_short=0, progress=False)
    straight = tmp_path / "straight"
    summary = write_images(straight, [tar], **options)
    assert (summary.images, summary.skipped) == (6, 0)
    rows = pq.read_table(straight / "manifest.parquet").to_pylist()
    assert [r["key"] for r in rows] == ["frame.0001", "frame.0002", "a", "a_1", "dup", "dup_1"]
    assert [r["caption"] for r in rows] == ["a caption", "a caption", None, None, None, None]
    sources = [r["source"] for r in rows]
    assert sources[-2:] == [f"{tar}:dup.jpg", f"{tar}:dup.jpg#2"] and len(set(sources)) == 6
    job = writer._job

    def stopping(item, settings):
        if item.origin.endswith("dup.jpg#2"):
            raise KeyboardInterrupt  # after the shard holding a, a_1: the first dup is pending
        return job(item, settings)

    out = tmp_path / "out"
    monkeypatch.setattr(writer, "_job", stopping)
    with pytest.raises(KeyboardInterrupt):
        write_images(out, [tar], **options)
    monkeypatch.setattr(writer, "_job", job)
    write_images(out, [tar], resume=True, **options)
    assert pq.read_table(out / "manifest.parquet").to_pylist() == rows
    for shard in sorted(p.name for p in straight.glob("shard_*.zip")):
        assert (out / shard).read_bytes() == (straight / shard).read_bytes(), shard


def test_an_image_given_twice_is_stored_twice_on_resume_too(tmp_path, monkeypatch):
    """An image reached through two inputs (its folder, and the file itself) is stored twice by
    a straight run, and so by a run stopped after the first copy and resumed."""
    from kohakuclip.write import images as writer

    folder = tmp_path / "photos"
    folder.mkdir()
    for k in range(3):
        Image.fromarray(photo(40, 48, seed=k)).save(folder / f"p{k}.png")
    sources = [folder, folder / "p0.png"]
    options = dict(per_shard=1, workers=1, min_short=0, progress=False)
    straight = tmp_path / "straight"
    assert write_images(straight, sources, **options).images == 4
    rows = pq.read_table(straight / "manifest.parquet").to_pylist()
    job, calls = writer._job, []

    def stopping(item, settings):
        calls.append(item.origin)
        if len(calls) == 4:
            raise KeyboardInterrupt  # the second copy of p0
        return job(item, settings)

    out = tmp_path / "out"
    monkeypatch.setattr(writer, "_job", stopping)
    with pytest.raises(KeyboardInterrupt):
        write_images(out, sources, **options)
    monkeypatch.setattr(writer, "_job", job)
    assert write_images(out, sources, resume=True, **options).images == 4
    assert pq.read_table(out / "manifest.parquet").to_pylist() == rows


def test_image_names_that_are_not_utf8_are_stored_escaped_and_resume(tmp_path):
    """An image file and a tar member whose names are not UTF-8 are stored with the bad bytes
    as ``\\xNN`` in their keys and sources; a name that prints as another does gets its own
    source (``#2``), and a resumed run finds them all done."""
    raw = os.fsdecode(b"n\xff\xfe.png")
    folder = tmp_path / "images"
    folder.mkdir()
    (folder / raw).write_bytes(encode(Image.fromarray(photo(40, 48, seed=1)), "PNG"))
    (folder / "n\\xff\\xfe.png").write_bytes(encode(Image.fromarray(photo(40, 48, seed=3)), "PNG"))
    tar = str(tmp_path / "images.tar")
    write_tar(tar, [(raw, encode(Image.fromarray(photo(40, 48, seed=2)), "PNG"))])
    out = tmp_path / "out"
    summary = write_images(out, [str(folder), tar], min_short=0, progress=False)
    assert (summary.images, summary.skipped) == (3, 0)
    rows = pq.read_table(out / "manifest.parquet").to_pylist()
    assert [r["key"] for r in rows] == ["n\\xff\\xfe", "n\\xff\\xfe_1", "n\\xff\\xfe_2"]
    assert sorted(r["source"] for r in rows) == sorted(
        [f"{folder}/n\\xff\\xfe.png", f"{folder}/n\\xff\\xfe.png#2", f"{tar}:n\\xff\\xfe.png"]
    )
    again = write_images(out, [str(folder), tar], min_short=0, progress=False, resume=True)
    assert again.images == 3
    assert pq.read_table(out / "manifest.parquet").to_pylist() == rows

"""The compiled share paths (``decode._clips``) against their PyAV twins: H.264 / HEVC clips,
GulpIO JPEG frames and JPEG images give the same bytes either way, in every output mode;
broken input gives an error naming the file and member, and the pool keeps working."""

from __future__ import annotations

import io
import os
import shutil
import zipfile
from dataclasses import dataclass

import numpy as np
import pytest
from PIL import Image

from kohakuclip import ClipError, ImageReader, Reader
from kohakuclip.read.image_reader import ImageReadError
from kohakuclip.write.pack import pack
from tests.image_media import photo
from tests.media import VideoSpec, make_video

VIDEOS = {
    "bframes.mp4": VideoSpec(width=98, height=70, frames=36, options={"bf": "2", "g": "12"}),
    "hevc.mp4": VideoSpec(codec="hevc", width=128, height=96, frames=30, options={"g": "10"}),
    "h422.mp4": VideoSpec(width=96, height=64, frames=24, pix_fmt="yuv422p", options={"g": "8"}),
    "h444.mp4": VideoSpec(width=96, height=64, frames=24, pix_fmt="yuv444p", options={"g": "8"}),
}
MODES = ["rgb", "yuv_resized", "yuv"]


@dataclass(frozen=True)
class Sources:
    folder: str
    zip: str
    images: str
    gulp: str


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Sources:
    from kohakuclip.gulp import ChunkBuilder
    from kohakuclip.write.images import write_images

    root = tmp_path_factory.mktemp("clips")
    members = [(name, make_video(spec)) for name, spec in VIDEOS.items()]
    os.makedirs(root / "folder")
    for name, data in members:
        (root / "folder" / name).write_bytes(data)
    pack(str(root / "shard.zip"), members)
    src = root / "photos"
    src.mkdir()
    for i, (mode, subsampling) in enumerate([("RGB", 2), ("RGB", 1), ("RGB", 0), ("L", 0)]):
        h, w = (150 + 10 * i, 210) if i % 2 else (200, 130 + 10 * i)
        image = Image.fromarray(photo(h, w, seed=i)).convert(mode)
        image.save(src / f"{i}.jpg", quality=92, subsampling=subsampling)
    write_images(root / "images", [src], quality=95, max_short=128, min_short=0, progress=False)
    with ChunkBuilder(str(root / "data_0.gulp"), str(root / "meta_0.gmeta")) as chunk:
        frames = [photo(72, 88, seed=10 + k) for k in range(6)]
        chunk.add("clip", {"fps": 8}, frames)
    return Sources(
        str(root / "folder"),
        str(root / "shard.zip"),
        str(root / "images" / "shard_00000.zip"),
        str(root),
    )


def _clip_twins(path: str, mode: str, skip: bool | str = True, **options: object) -> list:
    """The same batch read with the compiled path and with PyAV only."""
    got = []
    for compiled in (True, False):
        with Reader(path, size=24, mode=mode, hflip=0.5, vflip=0.5, skip=skip, **options) as r:  # type: ignore[arg-type]
            r._compiled = compiled
            items = [(v, [1, 4, 3, 3, r.info(v).n - 1]) for v in range(len(r))]
            out = np.zeros(r.batch_shape(len(items), 5), np.uint8)  # yuv: the window only
            got.append(r.read(items, out, seed=11))
            if compiled:
                got.append(r._pool.states)
    return got


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("mode", MODES)
def test_h26x_compiled_matches_pyav(sources: Sources, mode: str, skip: bool) -> None:
    compiled, workers, pyav = _clip_twins(sources.folder, mode, skip, threads=2)
    assert any(w._avcodec is not None for w in workers)  # the compiled path ran
    np.testing.assert_array_equal(compiled.video, pyav.video)
    np.testing.assert_array_equal(compiled.crops, pyav.crops)
    np.testing.assert_array_equal(compiled.flips, pyav.flips)
    assert compiled.video.std() > 5


def test_zip_and_folder_agree_on_the_compiled_path(sources: Sources) -> None:
    got = {}
    for path in (sources.folder, sources.zip):
        with Reader(path, size=24, crop="center") as reader:
            for v in range(len(reader)):
                got.setdefault(os.path.basename(reader.info(v).member), []).append(
                    reader.read([(v, [0, 5, 9])]).video
                )
    assert len(got) == len(VIDEOS)
    for folder, shard in got.values():
        np.testing.assert_array_equal(folder, shard)


def test_ten_bit_h264_falls_back_to_pyav(tmp_path) -> None:
    spec = VideoSpec(width=64, height=48, frames=12, pix_fmt="yuv420p10le", options={"g": "6"})
    (tmp_path / "deep.mp4").write_bytes(make_video(spec))
    compiled, _, pyav = _clip_twins(str(tmp_path), "rgb")
    np.testing.assert_array_equal(compiled.video, pyav.video)
    assert compiled.video.std() > 5


def test_broken_samples_name_the_file_and_the_pool_keeps_working(sources: Sources, tmp_path):
    folder = tmp_path / "f"
    shutil.copytree(sources.folder, folder)
    with Reader(str(folder), size=16, threads=2) as reader:
        good = reader.read([(1, [2, 3])], seed=1).video.copy()
        track = reader._catalog.track(0)
        path = track.path
        # a NAL unit length that runs past its sample (frame 4), then a file cut short
        with open(path, "r+b") as f:
            f.seek(int(track.offsets[4]))
            f.write(b"\x7f\xff\xff\xff")
        with pytest.raises(ClipError, match=r"bframes\.mp4: frames .*NAL unit lengths"):
            reader.read([(0, list(range(6)))])
        os.truncate(path, int(track.offsets[20]))
        with pytest.raises(ClipError, match=r"bframes\.mp4.*short read"):
            reader.read([(1, [2, 3]), (0, [25, 30])])
        for _ in range(2):
            np.testing.assert_array_equal(reader.read([(1, [2, 3])], seed=1).video, good)


def test_a_broken_gop_fails_the_clip_that_needs_it_not_its_group(sources: Sources, tmp_path):
    folder = tmp_path / "f"
    shutil.copytree(sources.folder, folder)
    items = [(0, [0, 1, 2]), (0, [25, 26, 27]), (0, [5, 7, 9])]
    with Reader(str(folder), size=16, threads=1) as reader:
        good = reader.read(items, seed=2).video.copy()
        track = reader._catalog.track(0)
        with open(track.path, "r+b") as f:  # the keyframe of the last GOP (frames 24-35)
            f.seek(int(track.offsets[24]))
            f.write(b"\x7f\xff\xff\xff")
        out = np.zeros_like(good)
        with pytest.raises(ClipError, match=r"bframes\.mp4: frames \[25, 26, 27\]: .*NAL unit"):
            reader.read(items, out, seed=2)
    np.testing.assert_array_equal(out[[0, 2]], good[[0, 2]])


@pytest.mark.parametrize("mode", MODES)
def test_gulp_jpeg_clips_compiled_match_pyav(sources: Sources, mode: str) -> None:
    compiled, workers, pyav = _clip_twins(sources.gulp, mode, yuv_size=96)
    assert workers[0]._avcodec is not None
    np.testing.assert_array_equal(compiled.video, pyav.video)
    assert compiled.video.std() > 5


@pytest.mark.parametrize("source", ["folder", "gulp"])
def test_clips_sharing_a_video_decode_it_once_and_match_pyav(sources: Sources, source: str):
    """Three clips per video in one batch: the compiled path decodes their GOPs (frames) once
    for all three and writes the bytes PyAV gives clip by clip."""
    got, decoded = {}, {}
    for compiled in (True, False):
        with Reader(getattr(sources, source), size=24, hflip=0.5, vflip=0.5, yuv_size=96) as r:
            r._compiled = compiled
            items = []
            for v in range(len(r)):
                n = r.info(v).n
                items += [(v, [0, 2, 4]), (v, [1, 2, n - 1]), (v, [n - 1, 3, 3])]
            got[compiled] = r.read(items, seed=5)
            decoded[compiled] = r.stats()["frames_decoded"]
    np.testing.assert_array_equal(got[True].video, got[False].video)
    assert got[True].video.std() > 5
    assert decoded[True] < decoded[False]


def _image_twins(path: str, **options: object) -> list:
    got = []
    for compiled in (True, False):
        with ImageReader(path, size=32, hflip=0.5, vflip=0.5, yuv_size=256, **options) as r:  # type: ignore[arg-type]
            r._compiled = compiled
            out = np.zeros(r.batch_shape(8), np.uint8)
            got.append(r.read([0, 1, 2, 3, 3, 2, 1, 0], out, seed=5))
    return got


@pytest.mark.parametrize("dct_scale", [True, False])
@pytest.mark.parametrize("crop", ["random", "resized"])
@pytest.mark.parametrize("mode", MODES)
def test_jpeg_images_compiled_match_pyav(
    sources: Sources, mode: str, crop: str, dct_scale: bool
) -> None:
    compiled, pyav = _image_twins(sources.images, mode=mode, crop=crop, dct_scale=dct_scale)
    np.testing.assert_array_equal(compiled.image, pyav.image)
    np.testing.assert_array_equal(compiled.crops, pyav.crops)
    assert compiled.colorspaces == pyav.colorspaces
    np.testing.assert_array_equal(compiled.full_range, pyav.full_range)
    assert compiled.image.std() > 5


def test_jpeg_images_are_close_to_pillow(sources: Sources) -> None:
    with ImageReader(sources.images, size=32, dct_scale=False) as reader:
        batch = reader.read([0, 1, 2, 3], seed=2)
    with zipfile.ZipFile(sources.images) as z:
        names = sorted(n for n in z.namelist() if n != "__index__.bin")
        stored = [z.read(reader.info(i).member) for i in range(4)]
    assert len(names) == 4
    for i, data in enumerate(stored):
        x, y, w, h = (int(v) for v in batch.crops[i])
        ref = Image.open(io.BytesIO(data)).convert("RGB")
        ref = ref.resize((32, 32), Image.Resampling.BILINEAR, box=(x, y, x + w, y + h))
        diff = batch.image[i].astype(float) - np.asarray(ref).transpose(2, 0, 1)
        assert 10 * np.log10(255**2 / np.mean(diff**2)) > 33, i


def test_corrupt_jpeg_names_the_member_and_the_batch_still_fills(sources: Sources, tmp_path):
    bad = str(tmp_path / "bad.zip")
    shutil.copy(sources.images, bad)
    with ImageReader(bad, size=16) as probe:
        loc = probe._catalog.locate(2)
        good = probe.read([0, 1], seed=1).image.copy()
    with open(bad, "r+b") as f:  # the entropy-coded data of image 2 becomes noise
        f.seek(loc.offset + loc.size // 2)
        f.write(np.random.default_rng(3).integers(0, 256, loc.size // 2, np.uint8).tobytes())
    with ImageReader(bad, size=16, threads=2) as reader:
        member = reader.info(2).member
        with pytest.raises(ImageReadError, match=f"bad.zip:{member}"):
            reader.read([0, 2, 1])
        np.testing.assert_array_equal(reader.read([0, 1], seed=1).image, good)


def test_reach_back_starts_decoding_keyframes_earlier(sources: Sources) -> None:
    from kohakuclip.read.plan import plan_clip

    with Reader(sources.folder, size=24, crop="center") as reader:
        track = reader._catalog.track(0)
        keys = track.key_positions
        wanted = [int(keys[2]) + 1]
        plans = [plan_clip(track, wanted, False, reach_back) for reach_back in (0, 1, 2)]
        assert [p.reads[0].offset for p in plans] == [int(track.offsets[k]) for k in keys[2::-1]]
        assert plans[0].reads[0].length < plans[1].reads[0].length < plans[2].reads[0].length
        assert plan_clip(track, [0], False, 5).reads[0].offset == int(track.offsets[0])


GIL_CHILD = r"""
import json
import sys
# a long switch interval: a loaded machine stretches the Python planning past 5 ms, and the
# forced hand-overs that adds are scheduling, not the per-clip / packet / frame takes counted
sys.setswitchinterval(1.0)
from benchmarks._gil_count import GilCounter, difference
from kohakuclip import ImageReader, Reader
counter = GilCounter()
out = {}
for name, make, draw in (
    ("h26x", lambda: Reader(FOLDER, size=32, threads=2), lambda r, k: r.sample(16, 4, seed=k)),
    ("images", lambda: ImageReader(IMAGES, size=32, threads=2), lambda r, k: r.sample(64, seed=k)),
):
    with make() as reader:
        reader.read(draw(reader, 0))  # threads started, numba loaded
        before = counter.takes()
        for k in range(1, 5):
            reader.read(draw(reader, k))
        takes = counter.by_name(difference(counter.takes(), before))
    out[name] = sum(v for k, v in takes.items() if k.startswith("kohakuclip-"))
print(json.dumps(out))
"""


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc missing: the GIL counter needs it")
def test_a_share_takes_the_gil_a_few_times_not_per_clip(sources: Sources, tmp_path) -> None:
    """4 batches of 16 clips (64 images) on 2 threads: a handful of GIL takes per share, where
    per-packet or per-frame Python would take it hundreds of times."""
    import json
    import subprocess
    import sys

    from benchmarks import _gil_count
    from tests.paths import child_env

    lib = _gil_count.build(str(tmp_path))
    code = f"FOLDER, IMAGES = {sources.folder!r}, {sources.images!r}\n" + GIL_CHILD
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(_gil_count.preload_env(lib)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    takes = json.loads(proc.stdout.strip().splitlines()[-1])
    shares = 4 * 2
    assert takes["h26x"] <= 4 * shares, takes  # 64 clips, 320 packets
    assert takes["images"] <= 4 * shares, takes  # 256 images


def _jpeg_variants() -> dict[str, bytes]:
    """JPEGs the compiled path takes, and files it must leave to the Python path."""
    from tests.image_media import encode

    rgb = Image.fromarray(photo(90, 130, seed=3))
    baseline = encode(rgb, "JPEG", quality=90)
    small = encode(rgb.resize((16, 16)), "JPEG")
    small_sof = small[small.index(b"\xff\xc0") :][:19]  # a 16x16 frame header
    return {
        "baseline": baseline,
        "progressive": encode(rgb, "JPEG", quality=90, progressive=True),
        "gray": encode(rgb.convert("L"), "JPEG"),
        "444": encode(rgb, "JPEG", subsampling=0),
        "long_exif": encode(rgb, "JPEG", exif=b"Exif\0\0" + bytes(range(256)) * 80),
        "cmyk": encode(rgb.convert("CMYK"), "JPEG"),
        "png": encode(rgb, "PNG"),
        # a frame header before the real one: libavcodec takes the last
        "two_frame_headers": baseline[:2] + small_sof + baseline[2:],
        # a thumbnail in a JPG0 segment, inside which libavcodec looks for markers
        "jpg0_thumbnail": baseline[:2]
        + b"\xff\xf0"
        + (len(small) + 2).to_bytes(2, "big")
        + small
        + baseline[2:],
    }


def dqt_tail_frame_header() -> bytes:
    """A 130x90 4:2:0 JPEG with a 144x96 frame header (the same 16x16 blocks) in a DQT
    segment's spare tail (under 65 bytes): libavcodec scans that tail for markers and decodes
    144x96; a walk over the segments sees 130x90 (Pillow refuses the tail)."""
    from tests.image_media import encode

    data = encode(Image.fromarray(photo(90, 130, seed=3)), "JPEG")
    sof = data.index(b"\xff\xc0")
    sof_end = sof + 2 + int.from_bytes(data[sof + 2 : sof + 4], "big")
    wider = data[sof : sof + 5] + (96).to_bytes(2, "big") + (144).to_bytes(2, "big")
    tail = b"\x00" + bytes(range(1, 65)) + b"\xff\xff" + wider + data[sof + 9 : sof_end]
    dqt = b"\xff\xdb" + (len(tail) + 2).to_bytes(2, "big") + tail
    return data[:sof_end] + dqt + data[sof_end:]


def _png_variants() -> dict[str, bytes]:
    """PNGs of each colour type and depth: the 8-bit ones (interlaced too) are what libavcodec
    decodes to rgb24, gray8, pal8, ya8 and rgba, the compiled path's pixel formats; 16-bit
    and 1-bit ones are not."""
    from tests.image_media import encode, raw_png

    rgb = Image.fromarray(photo(70, 90, seed=5))
    return {
        "png_rgb": encode(rgb, "PNG"),
        "png_gray": encode(rgb.convert("L"), "PNG"),
        "png_interlaced": raw_png(np.asarray(rgb), interlaced=True),  # Pillow writes none
        "png_palette": encode(rgb.convert("P"), "PNG"),
        "png_alpha": encode(rgb.convert("RGBA"), "PNG"),
        "png_gray_alpha": encode(rgb.convert("LA"), "PNG"),
        "png_16bit": encode(Image.fromarray(np.asarray(rgb.convert("L"), np.uint16) * 257), "PNG"),
        "png_rgb_transparent": encode(rgb, "PNG", transparency=(1, 2, 3)),
        "png_palette_transparent": encode(rgb.convert("P"), "PNG", transparency=7),
        "png_1bit": encode(rgb.convert("1", dither=Image.Dither.NONE), "PNG"),
    }


def test_picture_sizes_walk_the_headers(tmp_path):
    """Sizes as Pillow reads them, from JPEGs and PNGs at any offset of a file (a JPEG header
    past the first 4 KB window too), and their codec; (0, 0, 0) for four components, other
    formats and PNG types, cut headers, and where libavcodec could decode another frame header
    than the first."""
    from kohakuclip.decode._clips import PROBED_CODECS, picture_sizes

    variants = {**_jpeg_variants(), **_png_variants()}
    variants["cut"] = variants["long_exif"][:6000]  # ends inside the Exif segment
    variants["png_cut"] = variants["png_rgb"][:28]  # ends inside IHDR
    variants["empty"] = b""
    variants["dqt_tail"] = dqt_tail_frame_header()
    path = tmp_path / "all.bin"
    offsets, sizes, blob = [], [], b"junk"
    for data in variants.values():
        offsets.append(len(blob))
        sizes.append(len(data))
        blob += data
    path.write_bytes(blob)
    fd = os.open(path, os.O_RDONLY)
    try:
        found = picture_sizes([fd] * len(variants), offsets, sizes).tolist()
    finally:
        os.close(fd)
    fetched = picture_sizes([-1] * len(variants), offsets, sizes, np.frombuffer(blob, np.uint8))
    assert fetched.tolist() == found
    assert len(variants["long_exif"]) > 20000
    refused = ("cmyk", "cut", "empty", "two_frame_headers", "jpg0_thumbnail", "png_cut")
    refused += ("png_16bit", "png_1bit")
    for (name, data), size in zip(variants.items(), found, strict=True):
        if name == "dqt_tail":  # the segments' header: the compiled drivers check the decoder's
            assert size == [130, 90, 0]
            continue
        readable = name not in refused
        image = Image.open(io.BytesIO(data)) if readable else None
        codec = PROBED_CODECS.index(image.format.lower()) if image else 0
        expected = [*image.size, codec] if image else [0, 0, 0]
        assert size == expected, name

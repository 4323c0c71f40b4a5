"""1.0.0's writer entry points (writer.py, image_writer.py, _core.py): ``kohakuclip.writer.write``
takes its arguments in 1.0.0's order and writes what ``write_videos`` writes, bit for bit;
``kohakuclip._core.encode`` and ``pack`` take 1.0.0's arguments."""

from __future__ import annotations

import os

import kohakuclip
from kohakuclip import write_images, write_videos
from kohakuclip.writer import Encoding, write
from tests.media import VideoSpec, make_video


def test_write_is_write_videos_in_1_0_0s_argument_order(tmp_path) -> None:
    sources = tmp_path / "videos"
    sources.mkdir()
    for i in range(3):
        make_video(VideoSpec(width=96, height=64, frames=12, seed=i), str(sources / f"v{i}.mp4"))
    enc = Encoding(preset=12, crf=40, gop=8, max_short=48)
    out = str(tmp_path / "old-api")
    paths = write([str(sources)], out, enc, per_shard=2, workers=1, container="tar")
    assert paths == [os.path.join(out, "shard_00000.tar"), os.path.join(out, "shard_00001.tar")]
    fields = {"codec": "av1", "preset": 12, "crf": 40, "gop": 8, "max_short": 48}
    new = tmp_path / "new-api"
    write_videos(new, [sources], per_shard=2, workers=1, container="tar", progress=False, **fields)
    assert sorted(os.listdir(out)) == sorted(os.listdir(new))
    for name in os.listdir(new):
        assert (new / name).read_bytes() == open(os.path.join(out, name), "rb").read(), name
    with kohakuclip.Reader(out) as r:
        assert len(r) == 3 and r.info(0).height == 48


def test_the_spec_module_names() -> None:
    assert kohakuclip.image_writer.write_images is write_images
    assert kohakuclip.writer.write is write


def test_core_encode_and_pack_take_1_0_0s_arguments(tmp_path) -> None:
    source = make_video(VideoSpec(width=96, height=64, frames=12), str(tmp_path / "v.mp4"))
    options = dict(codec="av1", crf=40, gop=8, preset=12, max_short=48, loop_filters=False)
    from_path = kohakuclip._core.encode(str(tmp_path / "v.mp4"), **options)
    assert kohakuclip._core.encode(source, **options) == from_path  # the bytes of a video too
    shard = str(tmp_path / "shard.zip")
    kohakuclip._core.pack(shard, [("v.mp4", from_path)])
    with kohakuclip.Reader(shard) as reader:
        info = reader.info(0)
        assert (info.codec, info.height, info.width, info.n) == ("av1", 48, 72, 12)
    assert kohakuclip._core.encode_image is kohakuclip.encode_image
    assert kohakuclip._core.pack_images is kohakuclip.pack_images

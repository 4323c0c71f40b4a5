"""Ingestion from generated videos and images, the CLIs, and the sanity check command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest
from PIL import Image

from kohakuclip.gulp import (
    LABEL2IDX_FILE,
    AbstractDatasetAdapter,
    ChunkBuilder,
    ChunkWriter,
    GulpDirectory,
    GulpError,
    GulpIngestor,
    ImageFolderAdapter,
    ImageListAdapter,
    JsonVideoAdapter,
    calculate_chunk_slices,
    check_gulp_directory,
    encode_frame,
    open_gulp_source,
    read_video_frames,
)
from kohakuclip.gulp.cli import (
    image_folder_main,
    image_list_main,
    json_videos_main,
    register_adapter_main,
    sanity_check_main,
    script_name,
)
from tests.media import VideoSpec, decode_rgb, frame_rgb, make_video, psnr
from tests.paths import child_env

SPECS = {
    "101": VideoSpec(frames=48, fps=24.0, seed=1),
    "102": VideoSpec(codec="h264", frames=30, fps=30.0, width=96, height=128, seed=2),
    "103": VideoSpec(codec="mpeg4", container="avi", frames=20, fps=10.0, seed=3),
}


@pytest.fixture(scope="module")
def video_set(tmp_path_factory):
    """Three videos in the two 20BN layouts and a JSON list with labels and templates."""
    root = tmp_path_factory.mktemp("videos")
    data = {}
    for id_, spec in SPECS.items():
        if id_ == "102":
            os.makedirs(root / id_)
            path = str(root / id_ / "clip.mp4")
        else:
            path = str(root / f"{id_}.{spec.container}")
        data[id_] = make_video(spec, path)
    items = [
        {"id": 101, "label": "opening a door", "template": "Opening [something]"},
        {"id": "102", "label": "closing a box", "template": "Closing [something]"},
        {"id": "103", "label": "opening a box", "template": "Opening [something]"},
    ]
    (root / "list.json").write_text(json.dumps(items))
    return root, data


def nearest_source(k: int, fps: float, source_fps: float, n: int) -> int:
    return min(n - 1, int(np.floor(k * source_fps / fps + 0.5)))


def test_read_video_frames_matches_pyav(video_set):
    root, data = video_set
    reference = decode_rgb(data["101"])  # 48 frames at 24 fps
    frames, fps = read_video_frames(str(root / "101.mp4"), frame_rate=8, frame_size=-1)
    assert fps == 8.0 and len(frames) == 16
    for k, frame in enumerate(frames):
        assert np.array_equal(frame, reference[nearest_source(k, 8, 24, 48)])
    # upsampling repeats frames; short side resized with the area filter
    frames, fps = read_video_frames(data["103"], frame_rate=25, frame_size=48)
    reference = decode_rgb(data["103"])  # 20 frames at 10 fps
    assert fps == 25.0 and len(frames) == 50
    for k, frame in enumerate(frames):
        src = reference[nearest_source(k, 25, 10, 20)]
        assert frame.shape == (48, 80, 3)
        assert psnr(frame, cv2.resize(src, (80, 48), interpolation=cv2.INTER_AREA)) > 45
    frames, fps = read_video_frames(data["102"], frame_rate=0)
    assert fps == 30.0 and len(frames) == 30 and frames[0].shape == (128, 96, 3)
    with pytest.raises(GulpError, match=r"nothing\.mp4"):
        read_video_frames(str(root / "nothing.mp4"))
    (root / "junk.mp4").write_bytes(b"\0" * 1000)
    with pytest.raises(GulpError, match=r"junk\.mp4"):
        read_video_frames(str(root / "junk.mp4"))


def test_json_video_ingestion(video_set, tmp_path):
    root, data = video_set
    adapter = JsonVideoAdapter(str(root / "list.json"), str(root), frame_rate=6, frame_size=64)
    assert adapter.label_name == "template" and len(adapter) == 3
    assert adapter.label2idx == {"Closing [something]": 0, "Opening [something]": 1}
    report = GulpIngestor(adapter, tmp_path, 2, 1, progress=False)()
    assert report.written == 3 and report.empty == [] and len(report.chunks) == 2
    assert json.load(open(tmp_path / LABEL2IDX_FILE)) == adapter.label2idx
    assert check_gulp_directory(str(tmp_path)).ok
    gd = GulpDirectory(tmp_path)
    assert gd.chunk_lookup == {"101": 0, "102": 0, "103": 1}
    frames, meta = gd["102"]
    assert meta["label"] == "Closing [something]" and meta["idx"] == 0 and meta["fps"] == 6.0
    assert meta["template"] == "Closing [something]" and meta["id"] == "102"
    reference = decode_rgb(data["102"])
    assert len(frames) == 6  # 1 s at 6 fps
    for k, frame in enumerate(frames):
        src = reference[nearest_source(k, 6, 30, 30)]
        expected = cv2.resize(src, (64, 85), interpolation=cv2.INTER_AREA)
        assert frame.shape == expected.shape and psnr(frame, expected) > 24
    index = open_gulp_source(tmp_path)
    assert index.fps(index.position("101")) == 6.0
    assert list(index.count) == [12, 6, 12]


def test_parallel_ingestion_writes_the_same_bytes(video_set, tmp_path):
    root, _ = video_set
    outs = []
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        adapter = JsonVideoAdapter(str(root / "list.json"), str(root), frame_rate=4, frame_size=32)
        GulpIngestor(adapter, out, 1, workers, progress=False)()
        outs.append(out)
    names = sorted(os.listdir(outs[0]))
    assert names == sorted(os.listdir(outs[1])) and len(names) == 7
    for name in names:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes()


def test_reingestion_skips_existing_ids_and_numbers_new_chunks(video_set, tmp_path):
    root, _ = video_set
    items = json.loads((root / "list.json").read_text())
    (tmp_path / "a.json").write_text(json.dumps(items[:2]))
    (tmp_path / "b.json").write_text(json.dumps(items))
    out = tmp_path / "out"
    labels = sorted(i["label"] for i in items)
    first = JsonVideoAdapter(
        str(tmp_path / "a.json"), str(root), frame_rate=2, label_name="label", label2idx=labels
    )
    GulpIngestor(first, out, 5, 1, progress=False)()
    assert json.load(open(out / LABEL2IDX_FILE)) == {label: i for i, label in enumerate(labels)}
    clashing = JsonVideoAdapter(
        str(tmp_path / "b.json"), str(root), label_name="label", label2idx=labels[::-1]
    )
    with pytest.raises(GulpError, match=LABEL2IDX_FILE):
        GulpIngestor(clashing, out, 5, 1, progress=False)()
    second = JsonVideoAdapter(str(tmp_path / "b.json"), str(root), frame_rate=2, label_name="label")
    report = GulpIngestor(second, out, 5, 1, progress=False)()
    assert report.existing == ["101", "102"] and report.written == 1
    assert report.chunks == [str(out / "data_1.gulp")]
    assert GulpDirectory(out).chunk_lookup == {"101": 0, "102": 0, "103": 1}


def test_missing_and_duplicate_videos(video_set, tmp_path):
    root, _ = video_set
    items = [{"id": "101", "label": "a"}, {"id": "999", "label": "b"}]
    (tmp_path / "l.json").write_text(json.dumps(items))
    adapter = JsonVideoAdapter(str(tmp_path / "l.json"), str(root), frame_rate=2)
    with pytest.warns(UserWarning, match="999"):
        report = GulpIngestor(adapter, tmp_path / "out", 10, 1, progress=False)()
    assert report.written == 1 and report.empty == ["999"]
    strict = JsonVideoAdapter(str(tmp_path / "l.json"), str(root), frame_rate=2, strict=True)
    with pytest.raises(GulpError, match="999"):
        list(strict.iter_data())
    (tmp_path / "dup.json").write_text(json.dumps([*items, {"id": 101, "label": "c"}]))
    with pytest.raises(GulpError, match="duplicate id '101'"):
        JsonVideoAdapter(str(tmp_path / "dup.json"), str(root))
    kept = JsonVideoAdapter(str(tmp_path / "dup.json"), str(root), remove_duplicate_ids=True)
    assert [i["id"] for i in kept.items] == ["101", "999"]
    (tmp_path / "bad.json").write_text('{"id": 1}')
    with pytest.raises(GulpError, match=r"bad\.json"):
        JsonVideoAdapter(str(tmp_path / "bad.json"), str(root))


def make_images(root, count_per_label=3):
    expected = {}
    for li, label in enumerate(["cat", "dog"]):
        os.makedirs(root / label / "sub", exist_ok=True)
        for i in range(count_per_label):
            rgb = frame_rgb(VideoSpec(width=90, height=60, seed=li), i)
            rel = f"{label}/sub/{i}.png" if i == 0 else f"{label}/{i}.png"
            Image.fromarray(rgb).save(root / rel)
            expected[rel] = rgb
    return expected


def test_image_folder_and_list_ingestion(tmp_path):
    expected = make_images(tmp_path / "imgs")
    (tmp_path / "imgs" / "cat" / "notes.txt").write_text("not an image")
    adapter = ImageFolderAdapter(str(tmp_path / "imgs"), image_size=30)
    assert adapter.label2idx == {"cat": 0, "dog": 1} and len(adapter) == 6
    GulpIngestor(adapter, tmp_path / "out", 4, 1, progress=False)()
    gd = GulpDirectory(tmp_path / "out")
    assert sorted(gd.merged_meta_dict) == sorted(expected)
    for rel, rgb in expected.items():
        frames, meta = gd[rel]
        assert (
            meta["label"] == rel.split("/")[0] and meta["idx"] == adapter.label2idx[meta["label"]]
        )
        small = cv2.resize(rgb, (45, 30), interpolation=cv2.INTER_AREA)
        assert len(frames) == 1 and psnr(frames[0], small) > 24

    lines = [f"{rel}, {rel.split('/')[0]}" for rel in expected] + ["", "dog/1.png,dog"]
    (tmp_path / "list.txt").write_text("\n".join(lines))
    with pytest.raises(GulpError, match=r"duplicate id 'dog/1\.png'"):
        ImageListAdapter(str(tmp_path / "list.txt"), root_folder=str(tmp_path / "imgs"))
    listed = ImageListAdapter(
        str(tmp_path / "list.txt"), root_folder=str(tmp_path / "imgs"), remove_duplicate_ids=True
    )
    GulpIngestor(listed, tmp_path / "out2", 100, 1, progress=False)()
    frames, meta = GulpDirectory(tmp_path / "out2")["dog/2.png"]
    assert meta["label"] == "dog" and psnr(frames[0], expected["dog/2.png"]) > 24
    (tmp_path / "bad.txt").write_text("just_a_path.png\n")
    with pytest.raises(GulpError, match=r"bad.txt:1"):
        ImageListAdapter(str(tmp_path / "bad.txt"))


def test_chunk_slices():
    assert calculate_chunk_slices(3, 7) == [slice(0, 3), slice(3, 6), slice(6, 7)]
    assert calculate_chunk_slices(5, 0) == []
    with pytest.raises(ValueError):
        calculate_chunk_slices(0, 3)


def test_cli_ingest_and_sanity_check(video_set, tmp_path, capsys):
    root, _ = video_set
    out = str(tmp_path / "out")
    argv = [str(root / "list.json"), str(root), out, "--frame_rate", "3", "--frame-size", "40"]
    assert (
        json_videos_main([*argv, "--videos_per_chunk", "2", "--num_workers", "1", "--quiet"]) == 0
    )
    assert "3 items in 2 new chunks" in capsys.readouterr().out
    assert sanity_check_main([out]) == 0
    assert "no problems" in capsys.readouterr().out
    frames, meta = GulpDirectory(out)["103"]
    assert len(frames) == 6 and min(frames[0].shape[:2]) == 40 and meta["fps"] == 3.0

    with open(f"{out}/data_1.gulp", "ab") as f:
        f.write(b"extra")
    assert sanity_check_main([out]) == 1
    printed = capsys.readouterr().out
    assert f"{out}/data_1.gulp" in printed and f"{out}/data_0.gulp" not in printed
    assert sanity_check_main([str(tmp_path / "missing")]) == 1
    assert "not a directory" in capsys.readouterr().err

    make_images(tmp_path / "imgs", 2)
    assert image_folder_main([str(tmp_path / "imgs"), f"{tmp_path}/img_out", "--quiet"]) == 0
    assert len(GulpDirectory(f"{tmp_path}/img_out")) == 4
    (tmp_path / "l.txt").write_text("cat/1.png, cat\n")
    list_argv = [
        str(tmp_path / "l.txt"),
        f"{tmp_path}/list_out",
        "--root_path",
        str(tmp_path / "imgs"),
    ]
    assert image_list_main([*list_argv, "--quiet"]) == 0
    assert GulpDirectory(f"{tmp_path}/list_out")["cat/1.png"][1]["label"] == "cat"
    assert json_videos_main([str(tmp_path / "l.txt"), str(root), out]) == 1
    assert "l.txt" in capsys.readouterr().err


ADAPTER_MODULE = '''
import numpy as np
from kohakuclip.gulp import AbstractDatasetAdapter


class SquaresAdapter(AbstractDatasetAdapter):
    """n videos of solid squares; options to check the generated command line."""

    def __init__(self, count: int, side: int = 16, frames: int = 3, gray: bool = False, name="sq"):
        self.count, self.side, self.frames, self.gray, self.name = count, side, frames, gray, name
        self.label2idx = {"odd": 0, "even": 1}

    def __len__(self):
        return self.count

    def iter_data(self, slice_element=None):
        for i in range(self.count)[slice_element or slice(None)]:
            value = 0 if self.gray else 40 * i
            shape = (self.side, self.side, 3)
            frames = [np.full(shape, value + t, np.uint8) for t in range(self.frames)]
            label = "even" if i % 2 == 0 else "odd"
            yield {"id": f"{self.name}{i}", "frames": frames, "meta": {"label": label}}
'''


def test_register_adapter_writes_a_working_command(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_adapters.py").write_text(ADAPTER_MODULE)
    monkeypatch.chdir(tmp_path)
    assert script_name("SquaresAdapter") == "squares_adapter"
    assert register_adapter_main(["my_adapters", "SquaresAdapter"]) == 0
    script = tmp_path / "squares_adapter"
    assert os.access(script, os.X_OK)
    assert capsys.readouterr().out == "wrote squares_adapter: run ./squares_adapter --help\n"
    assert register_adapter_main(["my_adapters", "Nope"]) == 1
    assert register_adapter_main(["no_such_module", "X"]) == 1
    (tmp_path / "afile").write_text("a file, not a folder")
    assert register_adapter_main(["my_adapters", "SquaresAdapter", "-o", "afile/x"]) == 2
    err = capsys.readouterr().err
    assert err.endswith("gulp_register_adapter: error: afile/x: Not a directory\n")
    (tmp_path / "bin").mkdir()
    assert register_adapter_main(["my_adapters", "SquaresAdapter", "-o", "bin/sq"]) == 0
    assert capsys.readouterr().out == "wrote bin/sq: run bin/sq --help\n"
    printed = subprocess.run(
        ["bin/sq", "--help"], capture_output=True, text=True, env=child_env(), cwd=tmp_path
    )
    assert printed.returncode == 0 and printed.stdout.startswith("usage: sq ")
    env = child_env()
    run = subprocess.run(
        [str(script), "5", "out", "--side", "24", "--name", "v", "--videos-per-chunk", "2",
         "--num_workers", "1", "--quiet"],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    gd = GulpDirectory(tmp_path / "out")
    assert gd.num_chunks == 3 and len(gd) == 5
    frames, meta = gd["v3"]
    assert meta == {"label": "odd"} and frames[0].shape == (24, 24, 3) and len(frames) == 3
    assert abs(int(frames[2][5, 5, 0]) - 122) <= 2
    assert json.load(open(tmp_path / "out" / LABEL2IDX_FILE)) == {"odd": 0, "even": 1}
    helptext = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, env=env, cwd=tmp_path, check=True
    ).stdout
    assert "--gray" in helptext and "--no-gray" in helptext and "count" in helptext


def test_abstract_adapter_needs_both_methods():
    class Incomplete(AbstractDatasetAdapter):
        def __len__(self):
            return 0

    with pytest.raises(TypeError):
        Incomplete()


def test_cli_options_reach_the_adapter(tmp_path):
    """The shared ingest options (size, label map, duplicates, shuffle, seed) take effect."""
    expected = make_images(tmp_path / "imgs", 2)
    (tmp_path / "map.json").write_text(json.dumps({"cat": 7, "dog": 3}))
    (tmp_path / "l.txt").write_text("cat/1.png, cat\ndog/1.png, dog\ncat/1.png, cat\n")
    out = tmp_path / "out"
    argv = [str(tmp_path / "l.txt"), str(out), "--root-path", str(tmp_path / "imgs")]
    assert image_list_main([*argv, "--quiet"]) == 1  # a duplicate id, not removed
    options = ["--image_size", "20", "--label2idx", str(tmp_path / "map.json"), "--quiet"]
    assert image_list_main([*argv, *options, "--remove-duplicate-ids"]) == 0
    gulp = GulpDirectory(out)
    assert len(gulp) == 2 and json.loads((out / "label2idx.json").read_text()) == {
        "cat": 7,
        "dog": 3,
    }
    frames, meta = gulp["dog/1.png"]
    assert meta["idx"] == 3 and min(frames[0].shape[:2]) == 20
    assert frames[0].shape[1] * 60 == 20 * 90 and expected["dog/1.png"].shape == (60, 90, 3)

    def order(seed: int) -> list[str]:
        folder = tmp_path / f"shuffled_{seed}"
        images = str(tmp_path / "imgs")
        shuffle = ["--shuffle", "--seed", str(seed), "--quiet", "--images-per-chunk", "1"]
        assert image_folder_main([images, str(folder), *shuffle]) == 0
        return [key for chunk in GulpDirectory(folder).chunks() for key in chunk.ids()]

    assert sorted(order(1)) == sorted(expected) and order(1) != order(2)


def _json_list(path, ids: list[str]) -> str:
    """A 20BN JSON list of ``ids`` (of ``video_set``'s videos, all of one label) at ``path``."""
    path.write_text(json.dumps([{"id": id_, "label": "moving"} for id_ in ids]))
    return str(path)


def _json_videos(video_set, listed: str, out, *options: str) -> int:
    """gulp_20bn_json_videos on ``listed``, 2 fps, quiet, one process."""
    root, _ = video_set
    fast = ["--frame_rate", "2", "--num_workers", "1", "--quiet"]
    return json_videos_main([listed, str(root), str(out), *fast, *options])


def test_cli_takes_gulpio_remove_duplicates(video_set, tmp_path):
    """GulpIO spells --remove_duplicate_ids --remove_duplicates."""
    listed = _json_list(tmp_path / "dup.json", ["103", "103"])
    assert _json_videos(video_set, listed, tmp_path / "o1") == 1  # a duplicate id
    assert _json_videos(video_set, listed, tmp_path / "o2", "--remove_duplicates") == 0
    assert list(GulpDirectory(tmp_path / "o2").merged_meta_dict) == ["103"]


def test_cli_extend_adds_to_an_existing_directory(video_set, tmp_path, capsys):
    """GulpIO's --extend: what always happens here (new chunks after the old, ids kept)."""
    out = tmp_path / "out"
    assert _json_videos(video_set, _json_list(tmp_path / "a.json", ["103"]), out) == 0
    before = (out / "data_0.gulp").read_bytes()
    capsys.readouterr()
    listed = _json_list(tmp_path / "b.json", ["103", "101"])
    assert _json_videos(video_set, listed, out, "--extend") == 0
    printed = capsys.readouterr().out
    assert "1 items in 1 new chunks" in printed and "1 ids already present" in printed
    assert (out / "data_0.gulp").read_bytes() == before
    gulp = GulpDirectory(out)
    assert gulp.chunk_lookup == {"103": 0, "101": 1}


def test_cli_takes_and_ignores_gulpio_shm_dir(video_set, tmp_path):
    """GulpIO's --shm_dir (where it burst frames to disk): taken, and nothing goes there."""
    listed = _json_list(tmp_path / "one.json", ["103"])
    shm = tmp_path / "shm"
    assert _json_videos(video_set, listed, tmp_path / "o1", "--shm_dir", str(shm)) == 0
    assert _json_videos(video_set, listed, tmp_path / "o2") == 0
    assert not shm.exists()
    for name in ("data_0.gulp", "meta_0.gmeta"):
        assert (tmp_path / "o1" / name).read_bytes() == (tmp_path / "o2" / name).read_bytes()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--quality", "500"),
        ("--quality", "0"),
        ("--quality", "-3"),
        ("--videos_per_chunk", "0"),
        ("--num_workers", "0"),
        ("--num-workers", "-2"),
    ],
)
def test_cli_bad_options_are_usage_errors(video_set, tmp_path, capsys, option, value):
    root, _ = video_set
    argv = [str(root / "list.json"), str(root), str(tmp_path / "out"), option, value]
    with pytest.raises(SystemExit) as exit_:
        json_videos_main(argv)
    assert exit_.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("gulp_20bn_json_videos: error: argument ") and value in last
    assert not os.path.exists(tmp_path / "out")


def test_cli_missing_inputs_and_unwritable_outputs(video_set, tmp_path, capsys):
    """Files that cannot be read or written: one line naming the file, exit 2; inputs that
    give nothing to write: exit 1."""
    root, _ = video_set
    make_images(tmp_path / "imgs", 1)
    (tmp_path / "l.txt").write_text("cat/1.png, cat\n")
    afile = tmp_path / "afile"
    afile.write_text("a file, not a folder")
    nope = tmp_path / "nope.txt"
    images = ["--root_path", str(tmp_path / "imgs"), "--quiet"]

    assert image_list_main([str(nope), str(tmp_path / "o1"), *images]) == 2
    assert capsys.readouterr().err == f"gulp_image_list: error: {nope}: No such file or directory\n"
    labels = tmp_path / "nope.json"
    argv = [str(tmp_path / "l.txt"), str(tmp_path / "o2"), *images, "--label2idx", str(labels)]
    assert image_list_main(argv) == 2
    assert (
        capsys.readouterr().err == f"gulp_image_list: error: {labels}: No such file or directory\n"
    )
    labels.write_text("{not json")
    assert image_list_main(argv) == 1
    assert capsys.readouterr().err.startswith(f"gulp_image_list: error: {labels}: unreadable JSON")
    out = afile / "out"
    assert image_list_main([str(tmp_path / "l.txt"), str(out), *images]) == 2
    assert capsys.readouterr().err == f"gulp_image_list: error: {out}: Not a directory\n"

    videos = [str(root / "list.json"), str(tmp_path / "missing"), str(tmp_path / "o3")]
    videos += ["--quiet", "--num_workers", "1"]
    assert json_videos_main(videos) == 1
    err = capsys.readouterr().err
    assert err == f"gulp_20bn_json_videos: error: {tmp_path / 'missing'}: not a directory\n"
    (tmp_path / "no_videos").mkdir()
    videos[1] = str(tmp_path / "no_videos")
    with pytest.warns(UserWarning, match="no video for id"):
        assert json_videos_main(videos) == 1
    err = capsys.readouterr().err
    assert err.endswith(f"{tmp_path / 'o3'}: nothing written (3 items, none with frames)\n")

    dup = tmp_path / "dup.txt"
    dup.write_text("cat/1.png, cat\ncat/1.png, cat\n")
    assert image_list_main([str(dup), str(tmp_path / "o4"), *images]) == 1
    assert "--remove_duplicate_ids" in capsys.readouterr().err

    assert sanity_check_main([str(tmp_path / "no_videos")]) == 1
    assert "no gulp chunks" in capsys.readouterr().out


def test_alias_commands_use_their_own_name(tmp_path):
    """The ``kohakuclip-gulp-*`` scripts name themselves in usage and errors, not GulpIO's
    name."""
    script = os.path.join(os.path.dirname(sys.executable), "kohakuclip-gulp-sanity-check")
    env = child_env()

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [script, *argv], capture_output=True, text=True, env=env, timeout=120, check=False
        )

    helptext = run("--help")
    assert helptext.returncode == 0
    assert helptext.stdout.startswith("usage: kohakuclip-gulp-sanity-check ")
    missing = str(tmp_path / "missing")
    failed = run(missing)
    assert failed.returncode == 1
    assert failed.stderr == f"kohakuclip-gulp-sanity-check: error: {missing}: not a directory\n"


class RepeatingAdapter(AbstractDatasetAdapter):
    """Ids a0..a4, then a1 and a3 again (other frames): repeats in one slice and across."""

    ids = ("a0", "a1", "a1", "a2", "a3", "a4", "a3")

    def __len__(self):
        return len(self.ids)

    def iter_data(self, slice_element=None):
        for k in range(len(self.ids))[slice_element or slice(None)]:
            frames = [np.full((16, 16, 3), 20 * k, np.uint8)]
            yield {"id": self.ids[k], "frames": frames, "meta": {"k": k}}


@pytest.mark.parametrize("workers", [1, 2])
def test_an_id_given_twice_is_written_once(tmp_path, workers):
    """The directory stays readable (readers refuse an id in two chunks) and holds each id's
    first item, one process or several."""
    report = GulpIngestor(RepeatingAdapter(), tmp_path, 2, workers, progress=False)()
    assert sorted(report.repeated) == ["a1", "a3"] and report.written == 5
    gd = GulpDirectory(tmp_path)
    assert sorted(gd.merged_meta_dict) == ["a0", "a1", "a2", "a3", "a4"]
    for id_ in gd.merged_meta_dict:
        frames, meta = gd[id_]
        first = RepeatingAdapter.ids.index(id_)
        assert meta == {"k": first} and len(frames) == 1
        assert abs(int(frames[0][8, 8, 0]) - 20 * first) <= 2
    assert check_gulp_directory(str(tmp_path)).ok
    assert report.chunks == [str(tmp_path / f"data_{i}.gulp") for i in range(3)]


class OnlyRepeats(AbstractDatasetAdapter):
    """A chunk of ids an earlier chunk of the run wrote: the parallel run deletes it."""

    def __len__(self):
        return 4

    def iter_data(self, slice_element=None):
        for k in range(4)[slice_element or slice(None)]:
            yield {"id": f"b{k % 2}", "frames": [np.zeros((8, 8, 3), np.uint8)], "meta": {}}


def test_a_parallel_chunk_of_repeats_only_is_removed(tmp_path):
    report = GulpIngestor(OnlyRepeats(), tmp_path, 2, 2, progress=False)()
    assert report.written == 2 and report.repeated == ["b0", "b1"]
    assert sorted(os.listdir(tmp_path)) == ["data_0.gulp", "meta_0.gmeta"]


class GulpioStyleAdapter:
    """An adapter written for GulpIO: no base class of ours, no label map attributes."""

    def __init__(self, output_folder: str, count: int = 3):
        self.output_folder, self.count = output_folder, count

    def __len__(self):
        return self.count

    def iter_data(self, slice_element=None):
        for i in range(self.count)[slice_element or slice(None)]:
            yield {"id": i, "frames": [np.full((8, 8, 3), 50 * i, np.uint8)], "meta": {"i": i}}


def test_adapters_that_do_not_subclass_ours_ingest(tmp_path):
    report = GulpIngestor(GulpioStyleAdapter(str(tmp_path)), tmp_path, 2, 1, progress=False)()
    assert report.written == 3 and not (tmp_path / LABEL2IDX_FILE).exists()
    assert GulpDirectory(tmp_path)["2"][1] == {"i": 2}


def test_chunk_writer_takes_gulpio_new_chunks(tmp_path):
    """GulpIO's pattern: ``ChunkWriter(adapter).write_chunk(gd.new_chunks(1)[0], slice)``."""
    adapter = GulpioStyleAdapter(str(tmp_path))
    GulpIngestor(adapter, tmp_path, 1, 1, progress=False)()
    gd = GulpDirectory(tmp_path)
    more = SquaresAdapterForWriter()
    report = ChunkWriter(more).write_chunk(gd.new_chunks(1)[0], slice(0, 2))
    assert report.written == 2 and report.chunks == [str(tmp_path / "data_3.gulp")]
    assert sorted(GulpDirectory(tmp_path).merged_meta_dict) == ["0", "1", "2", "s0", "s1"]


class SquaresAdapterForWriter(GulpioStyleAdapter):
    def __init__(self):
        super().__init__("", 2)

    def iter_data(self, slice_element=None):
        for item in super().iter_data(slice_element):
            yield {**item, "id": f"s{item['id']}"}


ADAPTER_WITH_INGEST_NAMES = '''
import numpy as np


class Busy:
    """Takes parameters named as the ingest options, and a float with an int default."""

    def __init__(self, output_folder, num_workers: int = 1, quality=None, frame_rate: float = 8):
        self.output_folder, self.num_workers = output_folder, num_workers
        self.frame_rate = frame_rate

    def __len__(self):
        return 2

    def iter_data(self, slice_element=None):
        for i in range(2)[slice_element or slice(None)]:
            meta = {"rate": self.frame_rate, "workers": self.num_workers}
            yield {"id": i, "frames": [np.zeros((8, 8, 3), np.uint8)], "meta": meta}
'''


def test_adapter_parameters_named_as_ingest_options_are_shared(tmp_path, monkeypatch, capsys):
    from kohakuclip.gulp.cli import adapter_main

    (tmp_path / "busy_adapter.py").write_text(ADAPTER_WITH_INGEST_NAMES)
    monkeypatch.syspath_prepend(str(tmp_path))
    import busy_adapter

    out = tmp_path / "out"
    argv = [str(out), "--num_workers", "1", "--frame_rate", "2.5", "--quality", "x", "--quiet"]
    assert adapter_main(busy_adapter.Busy, argv) == 0
    assert GulpDirectory(out)["1"][1] == {"rate": 2.5, "workers": 1}
    assert "2 items in 1 new chunks" in capsys.readouterr().out
    stored = GulpDirectory(out, jpeg_decoder=bytes)["1"][0][0]
    assert stored == encode_frame(np.zeros((8, 8, 3), np.uint8), 90)  # "x": the default
    # an option typed by nothing (default None) still gives the ingestor the number typed
    again = tmp_path / "again"
    assert adapter_main(busy_adapter.Busy, [str(again), "--quality", "50", "--quiet"]) == 0
    stored = GulpDirectory(again, jpeg_decoder=bytes)["1"][0][0]
    assert stored == encode_frame(np.zeros((8, 8, 3), np.uint8), 50)


def test_a_repeat_dropped_from_the_end_of_a_chunk_leaves_it_sane(tmp_path):
    """The sanity check wants a data file to end at its last frame: dropping the last id of a
    parallel chunk cuts the data file there."""
    from kohakuclip.gulp.ingest import IngestReport, _drop_repeated
    from kohakuclip.gulp.meta import chunk_paths

    files = chunk_paths(str(tmp_path), 0)
    with ChunkBuilder(files.data_path, files.meta_path) as builder:
        builder.add("x", {"k": 0}, [np.full((16, 16, 3), 10, np.uint8)])
        builder.add("y", {"k": 1}, [np.full((16, 16, 3), 200, np.uint8)] * 2)
    report = IngestReport(chunks=[files.data_path], written=2)
    _drop_repeated(files, report, {"y"})
    assert report.repeated == ["y"] and report.written == 1
    assert check_gulp_directory(str(tmp_path)).ok
    assert sorted(GulpDirectory(tmp_path).merged_meta_dict) == ["x"]
    assert abs(int(GulpDirectory(tmp_path)["x"][0][0][4, 4, 0]) - 10) <= 2


def test_ingesting_clears_what_an_interrupted_run_left(tmp_path):
    """A meta file whose data file never got its name, and a data file still under its
    temporary one, go: the sanity check then passes, and no chunk number is skipped."""
    GulpIngestor(GulpioStyleAdapter(str(tmp_path), 2), tmp_path, 2, 1, progress=False)()
    (tmp_path / "meta_1.gmeta").write_text('{"9": {"frame_info": [[0, 0, 4]], "meta_data": []}}')
    (tmp_path / "data_1.gulp.tmp").write_bytes(b"\xff\xd8partial")
    (tmp_path / "data_backup.gulp.tmp").write_bytes(b"a user's file")
    assert not check_gulp_directory(str(tmp_path)).ok
    report = GulpIngestor(SquaresAdapterForWriter(), tmp_path, 2, 1, progress=False)()
    assert report.chunks == [str(tmp_path / "data_1.gulp")]
    assert check_gulp_directory(str(tmp_path)).ok
    assert sorted(GulpDirectory(tmp_path).merged_meta_dict) == ["0", "1", "s0", "s1"]
    assert (tmp_path / "data_backup.gulp.tmp").exists()


def test_video_folder_ingestion(video_set, tmp_path):
    """gulp_video_folder: <label>/ subfolders of videos, frames as the JSON adapter takes them,
    a video that cannot be read skipped with a warning."""
    from kohakuclip.gulp import VideoFolderAdapter
    from kohakuclip.gulp.cli import video_folder_main

    _, data = video_set
    folder = tmp_path / "videos"
    for label, id_ in (("open", "101"), ("open", "103"), ("close", "102")):
        (folder / label).mkdir(parents=True, exist_ok=True)
        suffix = ".avi" if id_ == "103" else ".mp4"
        (folder / label / f"v{id_}{suffix}").write_bytes(data[id_])
    (folder / "close" / "broken.mp4").write_bytes(b"\0" * 100)
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match=r"broken\.mp4"):
        code = video_folder_main([str(folder), str(out), "--frame_rate", "4", "--quiet",
                                  "--num_workers", "1", "--videos_per_chunk", "2"])  # fmt: skip
    assert code == 0
    gd = GulpDirectory(out)
    assert sorted(gd.merged_meta_dict) == ["close/v102.mp4", "open/v101.mp4", "open/v103.avi"]
    assert json.load(open(out / LABEL2IDX_FILE)) == {"close": 0, "open": 1}
    frames, meta = gd["open/v101.mp4"]
    assert (meta["label"], meta["idx"], meta["fps"]) == ("open", 1, 4.0)
    expected, _ = read_video_frames(str(folder / "open" / "v101.mp4"), 4, -1)
    assert len(frames) == len(expected) == 8  # 2 s at 4 fps
    for got, want in zip(frames, expected, strict=True):
        assert psnr(got, want) > 30  # JPEG at quality 90
    with pytest.raises(GulpError, match="no videos"):
        VideoFolderAdapter(str(tmp_path / "out"))

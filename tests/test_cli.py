"""The ``kohakuclip`` command line: bad options and outputs that cannot be written are one-line
usage errors (exit 2, no traceback), and ``demo --out`` writes only into a new or empty folder
or an earlier demo's output."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kohakuclip.cli import main
from tests.media import VideoSpec, make_video
from tests.paths import child_env

BIN = os.path.dirname(sys.executable)
DEMO = ["--videos", "1", "--seconds", "0.5", "--codec", "h264", "--batches", "1"]
DEMO += ["--batch", "2", "--size", "16", "--threads", "1", "--workers", "1"]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    """The installed ``kohakuclip`` script with ``argv``."""
    return subprocess.run(
        [os.path.join(BIN, "kohakuclip"), *argv],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--size", "1"],
        ["demo", "--batch", "0"],
        ["demo", "--batches", "0"],
        ["demo", "--videos", "0"],
        ["demo", "--seconds", "0"],
        ["demo", "--workers", "-2"],
        ["inspect", "x", "--columns", "0"],
        ["inspect", "x", "--thumb", "-5"],
        ["inspect", "x", "--max-videos", "0"],
        ["inspect", "x", "--threads", "0"],
        ["inspect", "x", "--gulp-fps", "-1"],
        ["verify", "x", "--sample", "0"],
        ["verify", "x", "--threads", "0"],
        ["verify", "x", "--sample", "two"],
    ],
)
def test_bad_options_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"kohakuclip {argv[0]}: error: argument {argv[-2]}: ")
    assert argv[-1] in last


def test_outputs_that_cannot_be_written(tmp_path: str) -> None:
    afile = os.path.join(tmp_path, "afile")
    with open(afile, "w") as f:
        f.write("a file, not a folder")
    empty = os.path.join(tmp_path, "empty")
    os.makedirs(empty)
    sheet = os.path.join(afile, "sheet.png")
    run = _run("inspect", empty, "--sheet", sheet)
    assert run.returncode == 2
    assert run.stderr == f"kohakuclip inspect: error: {sheet}: Not a directory\n"
    assert run.stdout == ""  # refused before any work
    named = os.path.join(tmp_path, "sheet.nope")
    run = _run("inspect", empty, "--sheet", named)
    assert run.returncode == 2 and run.stderr.startswith(f"kohakuclip inspect: error: {named}: ")
    assert not os.path.exists(named)
    out = os.path.join(afile, "demo")
    run = _run("demo", "--out", out, *DEMO)
    assert run.returncode == 2
    assert run.stderr == f"kohakuclip demo: error: {out}: Not a directory\n"


def test_demo_out_refuses_a_folder_it_did_not_write(
    tmp_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = os.path.join(tmp_path, "dataset")
    os.makedirs(dataset)
    with open(os.path.join(dataset, "shard_00000.zip"), "wb") as f:
        f.write(b"someone's shard")
    assert main(["demo", "--out", dataset, *DEMO]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"kohakuclip demo: error: {dataset}: not empty and not an earlier demo's output; "
        "choose a new or empty folder\n"
    )
    assert os.listdir(dataset) == ["shard_00000.zip"]

    out = os.path.join(tmp_path, "demo")
    assert main(["demo", "--out", out, *DEMO]) == 0
    assert sorted(os.listdir(out)) == [".kohakuclip-demo", "shards", "sources"]
    assert sorted(os.listdir(os.path.join(out, "sources"))) == ["sample_000.mp4", "sample_000.txt"]
    again = [*DEMO, "--videos", "2"]  # an earlier demo's output: replaced
    assert main(["demo", "--out", out, *again]) == 0
    assert len(os.listdir(os.path.join(out, "sources"))) == 4
    assert "wrote 2 videos" in capsys.readouterr().out
    shards_only = os.path.join(tmp_path, "data")  # an empty sources/ beside real shards
    os.makedirs(os.path.join(shards_only, "sources"))
    os.makedirs(os.path.join(shards_only, "shards"))
    with open(os.path.join(shards_only, "shards", "shard_00000.zip"), "wb") as f:
        f.write(b"someone's shard")
    assert main(["demo", "--out", shards_only, *DEMO]) == 2
    assert os.listdir(os.path.join(shards_only, "shards")) == ["shard_00000.zip"]


def test_output_into_a_closed_pipe_ends_quietly(tmp_path) -> None:
    """``kohakuclip inspect ... | head``: no BrokenPipeError traceback when the reader of the
    pipe has gone (``true`` leaves at once, before anything is printed)."""
    folder = tmp_path / "videos"
    folder.mkdir()
    for i in range(3):
        make_video(VideoSpec(width=32, height=32, frames=2, seed=i), str(folder / f"{i}.mp4"))
    command = f"{sys.executable} -m kohakuclip.cli inspect {folder} | true"
    done = subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, timeout=120, env=child_env()
    )
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr

"""yuv_to_rgb: the torch path against the CPU rgb path on the same planes (the same filter and
integer arithmetic), the yuv modes against the rgb mode through the Reader, and the Triton kernel
against the torch path (interpreter and CUDA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from kohakuclip import Reader
from kohakuclip._yuv_torch import packed_side
from kohakuclip.decode.pixels import Crop, PixelWriter, yuv420_frame_bytes, yuv420_planes
from kohakuclip.torch import yuv_to_rgb
from tests.media import VideoSpec, make_video, psnr
from tests.paths import child_env

# -- the reference: the CPU rgb path (PixelWriter, numba) on the same planes ---------------------


def _cpu_rgb(
    frame: np.ndarray,
    mode: str,
    size: int,
    crop: np.ndarray,
    flip: np.ndarray,
    colorspace: str,
    full: bool,
) -> np.ndarray:
    """One packed frame [L] through the Reader's rgb mode pixel path: uint8 [3, size, size]."""
    side = packed_side(frame.size)
    planes = yuv420_planes(frame, side)
    w, h = (int(crop[2]), int(crop[3])) if mode == "yuv" else (side, side)
    hflip, vflip = (bool(flip[0]), bool(flip[1])) if mode == "yuv" else (False, False)
    out = np.empty((3, size, size), np.uint8)
    PixelWriter(size).write(planes, Crop(0, 0, w, h), hflip, vflip, colorspace, full, out)
    return out


def _random_case(seed: int, items: int, frames: int, side: int) -> dict:
    rng = np.random.default_rng(seed)
    # smooth-ish random planes: noise plus a ramp, so resizing matters but stays well defined
    data = rng.integers(0, 256, (items, frames, yuv420_frame_bytes(side)), dtype=np.uint8)
    w = rng.integers(1, side + 1, items)
    h = np.where(rng.random(items) < 0.5, w, rng.integers(1, side + 1, items))
    crops = np.stack([np.zeros(items), np.zeros(items), w, h], axis=1).astype(np.int32)
    crops[0, 2:] = side  # one full window
    return {
        "data": data,
        "crops": crops,
        "flips": rng.random((items, 2)) < 0.5,
        "colorspaces": [["bt601", "bt709"][i % 2] for i in range(items)],
        "full_range": rng.random(items) < 0.5,
    }


@pytest.mark.parametrize(
    ("mode", "side", "size"),
    [
        ("yuv_resized", 32, None),  # chroma upsampling only
        ("yuv_resized", 33, 20),  # odd packed side, shrink
        ("yuv", 40, 16),  # >= 2x shrinks (the full window: exactly 2.5x)
        ("yuv", 32, 16),  # the full window exactly 2x: the 2x2 box
        ("yuv", 41, 13),  # odd everything
        ("yuv", 24, 37),  # enlargement
    ],
)
def test_torch_path_matches_the_cpu_rgb_path(mode: str, side: int, size: int | None) -> None:
    """Same taps, same integer rounding of the resized planes: only the float32 conversion's
    last bit may differ (a wrong tap, rounding, window or flip moves whole levels)."""
    case = _random_case(side, items=5, frames=2, side=side)
    out = size or side
    got = yuv_to_rgb(case["data"], mode=mode, size=size, **_meta(case))
    assert got.shape == (5, 2, 3, out, out) and got.dtype == torch.uint8
    for i in range(5):
        for t in range(2):
            ref = _cpu_rgb(
                case["data"][i, t],
                mode,
                out,
                case["crops"][i],
                case["flips"][i],
                case["colorspaces"][i],
                bool(case["full_range"][i]),
            )
            diff = np.abs(got[i, t].numpy().astype(int) - ref)
            assert diff.max() <= 1 and (diff > 0).mean() < 0.01, (i, t)
    as_float = yuv_to_rgb(case["data"], mode=mode, size=size, dtype=torch.float64, **_meta(case))
    assert as_float.dtype == torch.float64
    assert (got.double() - as_float.round()).abs().max() <= 1  # rounding ties only


def _meta(case: dict) -> dict:
    return {k: case[k] for k in ("crops", "flips", "colorspaces", "full_range")}


def test_image_shaped_input_and_batch_objects() -> None:
    case = _random_case(7, items=4, frames=1, side=30)
    clips = yuv_to_rgb(case["data"], mode="yuv", size=17, **_meta(case))
    images = yuv_to_rgb(case["data"][:, 0], mode="yuv", size=17, **_meta(case))
    assert images.shape == (4, 3, 17, 17)
    assert torch.equal(images, clips[:, 0])
    batch = SimpleNamespace(image=case["data"][:, 0], mode="yuv", **_meta(case))
    assert torch.equal(yuv_to_rgb(batch, size=17), images)
    # metadata as torch tensors, and keyword arguments overriding the batch's fields
    tensors = {k: torch.as_tensor(case[k]) for k in ("crops", "flips", "full_range")}
    as_tensors = yuv_to_rgb(
        torch.from_numpy(case["data"]), mode="yuv", size=17, **{**_meta(case), **tensors}
    )
    assert torch.equal(as_tensors[:, 0], images)
    unflipped = yuv_to_rgb(batch, size=17, flips=np.zeros((4, 2), bool))
    for i, (h, v) in enumerate(case["flips"]):
        dims = [d for d, f in ((-1, h), (-2, v)) if f]
        assert torch.equal(unflipped[i].flip(dims) if dims else unflipped[i], images[i])


def test_colorspace_names_and_full_range() -> None:
    side = 16
    grey = np.full((1, yuv420_frame_bytes(side)), 128, np.uint8)
    grey[0, : side * side] = 235  # limited-range white, neutral chroma
    limited = yuv_to_rgb(grey, mode="yuv_resized", colorspaces="bt709")
    assert (limited == 255).all()
    full = yuv_to_rgb(grey, mode="yuv_resized", full_range=True)
    assert (full == 235).all()
    assert torch.equal(yuv_to_rgb(grey, mode="yuv_resized", full_range=[True]), full)
    with pytest.warns(DeprecationWarning, match="full_range"):  # the old name of the range
        assert torch.equal(yuv_to_rgb(grey, mode="yuv_resized", colorspaces="bt601-full"), full)
    # a coloured frame tells the matrices apart
    rng = np.random.default_rng(1)
    colour = rng.integers(0, 256, grey.shape, dtype=np.uint8)
    bt601 = yuv_to_rgb(colour, mode="yuv_resized", colorspaces="bt601")
    bt709 = yuv_to_rgb(colour, mode="yuv_resized", colorspaces="bt709")
    assert not torch.equal(bt601, bt709)


def test_float_outputs_scale_and_offset() -> None:
    case = _random_case(3, items=3, frames=2, side=24)
    kwargs = dict(mode="yuv", size=12, **_meta(case))
    base = yuv_to_rgb(case["data"], dtype=torch.float32, **kwargs)
    assert base.min() >= 0 and base.max() <= 255
    signed = yuv_to_rgb(case["data"], dtype=torch.float32, scale=2 / 255, offset=-1.0, **kwargs)
    torch.testing.assert_close(signed, base * (2 / 255) - 1)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    normal = yuv_to_rgb(
        case["data"], dtype=torch.float32, scale=1 / (255 * std), offset=-mean / std, **kwargs
    )
    mean_t, std_t = (torch.tensor(a, dtype=torch.float32).view(3, 1, 1) for a in (mean, std))
    expected = (base / 255 - mean_t) / std_t
    torch.testing.assert_close(normal, expected, atol=1e-5, rtol=1e-5)
    half = yuv_to_rgb(case["data"], dtype=torch.bfloat16, **kwargs)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), base, atol=1.0, rtol=0.01)


def test_bad_input_raises_clear_errors() -> None:
    good = np.zeros((2, 3, yuv420_frame_bytes(20)), np.uint8)
    crops = np.array([[0, 0, 20, 20]] * 2, np.int32)
    with pytest.raises(ValueError, match="not a packed 4:2:0"):
        yuv_to_rgb(np.zeros((2, 3, 401), np.uint8), mode="yuv_resized")
    with pytest.raises(ValueError, match="uint8"):
        yuv_to_rgb(good.astype(np.float32), mode="yuv_resized")
    with pytest.raises(ValueError, match="uint8"):
        yuv_to_rgb(good[0, 0], mode="yuv_resized")
    with pytest.raises(ValueError, match="mode"):
        yuv_to_rgb(good, size=8)
    with pytest.raises(ValueError, match="mode"):
        yuv_to_rgb(SimpleNamespace(video=good, mode="rgb"), size=8)
    with pytest.raises(ValueError, match="size= is needed"):
        yuv_to_rgb(good, mode="yuv", crops=crops)
    with pytest.raises(ValueError, match="crops are needed"):
        yuv_to_rgb(good, mode="yuv", size=8)
    with pytest.raises(ValueError, match="do not fit"):
        yuv_to_rgb(good, mode="yuv", size=8, crops=crops + np.array([0, 0, 2, 0]))
    with pytest.raises(ValueError, match="crops must have shape"):
        yuv_to_rgb(good, mode="yuv", size=8, crops=crops[:1])
    with pytest.raises(ValueError, match="unknown colorspace 'bt2020'"):
        yuv_to_rgb(good, mode="yuv_resized", colorspaces=["bt601", "bt2020"])
    with pytest.raises(ValueError, match="2 items"):
        yuv_to_rgb(good, mode="yuv_resized", colorspaces=["bt601"])
    with pytest.raises(ValueError, match="float outputs"):
        yuv_to_rgb(good, mode="yuv_resized", scale=0.5)
    with pytest.raises(ValueError, match="dtype"):
        yuv_to_rgb(good, mode="yuv_resized", dtype=torch.int32)
    with pytest.raises(ValueError, match="backend"):
        yuv_to_rgb(good, mode="yuv_resized", backend="numpy")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="list"):
        yuv_to_rgb([1, 2, 3], mode="yuv_resized")


# -- the yuv modes against the rgb mode, through the Reader --------------------------------------

_BT709 = {"colorspace": "bt709", "color_primaries": "bt709", "color_trc": "bt709"}


@pytest.fixture(scope="module")
def smooth_videos(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("yuv_videos")
    specs = [
        VideoSpec(codec="av1", width=192, height=108, frames=12, seed=0, blur=3.0),
        VideoSpec(codec="h264", width=160, height=96, frames=12, seed=1, blur=3.0, options=_BT709),
        VideoSpec(codec="h264", width=98, height=134, frames=12, seed=2, blur=3.0),  # odd chroma
    ]
    for i, spec in enumerate(specs):
        make_video(spec, str(root / f"v{i}.mp4"))
    return str(root)


def _read_modes(root: str, size: int, modes: tuple[str, ...]) -> dict:
    items = [(v, [0, 5, 11]) for v in range(3)] * 2
    out = {}
    for mode in modes:
        with Reader(root, size=size, mode=mode, hflip=0.5, vflip=0.5, seed=3) as reader:
            out[mode] = reader.read(items, seed=2)
    assert sorted(set(out["rgb"].colorspaces)) == ["bt601", "bt709"]
    assert out["rgb"].flips.any() and not out["rgb"].flips.all()
    return out


@pytest.mark.parametrize("size", [64, 37])
def test_yuv_mode_matches_rgb_mode(smooth_videos: str, size: int) -> None:
    """Same window, same filter, same integer arithmetic, same matrix: only the float32
    conversion's last bit may differ (a wrong window, flip or matrix lands below 25 dB)."""
    out = _read_modes(smooth_videos, size, ("rgb", "yuv"))
    got = yuv_to_rgb(out["yuv"], size=size).numpy()
    rgb = out["rgb"].video
    assert got.shape == rgb.shape
    assert np.abs(got.astype(int) - rgb).max() <= 1


@pytest.mark.parametrize(("size", "threshold"), [(64, 39.0), (37, 33.0)])
def test_yuv_resized_mode_matches_rgb_mode(smooth_videos: str, size: int, threshold: float) -> None:
    """Chroma travels at half the output resolution, so this is bounded by the chroma detail of
    the synthetic hue ramps, which is far above real video's: measured 40.1-41.7 dB per clip at
    64 px and 34.3-36.2 dB at 37 px (a 3x shrink leaves more chroma detail per output pixel).
    The antialiased triangle removes more of that chroma detail on the way to half resolution
    than the old plain bilinear did (42.7-44.1 and 32.0-36.0 dB then), hence 39 dB here, not 41.
    A wrong layout, flip or matrix lands near 10-20 dB."""
    out = _read_modes(smooth_videos, size, ("rgb", "yuv_resized"))
    got = yuv_to_rgb(out["yuv_resized"]).numpy()
    rgb = out["rgb"].video
    assert got.shape == rgb.shape
    for i in range(len(rgb)):
        assert psnr(got[i], rgb[i]) >= threshold, i


# -- the Triton kernel ---------------------------------------------------------------------------

_KERNEL_CHECK = r"""
import json, sys
import numpy as np, torch
from tests.test_yuv_torch import _meta, _random_case
from kohakuclip.torch import yuv_to_rgb
import triton, triton.language as tl

@triton.jit
def _probe(x, n):
    for i in range(0, n):  # a loop bound from a scalar argument, as the kernel's taps
        tl.store(x + i, 1.0)

try:
    _probe[(1,)](torch.zeros(2, device=sys.argv[1]), 2)
except Exception as e:
    if sys.argv[1] != "cpu":  # on a GPU a failing kernel is a failure, not a skip
        raise
    print(json.dumps({"skip": f"the interpreter cannot run kernels here: {e}"}))
    raise SystemExit
device = sys.argv[1]
report = []
for mode, side, size in [("yuv_resized", 21, None), ("yuv", 40, 16), ("yuv", 25, 31)]:
    case = _random_case(side, items=3, frames=2, side=side)
    data = torch.from_numpy(case["data"])
    row = {"mode": mode}
    for dtype in (torch.float32, torch.uint8):
        outs = [
            yuv_to_rgb(data, mode=mode, size=size, dtype=dtype, device=device, backend=b,
                       **_meta(case)).cpu().double()
            for b in ("torch", "triton")
        ]
        row[str(dtype)] = float((outs[0] - outs[1]).abs().max())
    report.append(row)
print(json.dumps({"report": report}))
"""


def _kernel_report(device: str, env: dict[str, str], tmp_path: Path) -> list[dict]:
    script = tmp_path / "kernel_check.py"  # not -c: triton.jit reads its kernels' source files
    script.write_text(_KERNEL_CHECK)
    proc = subprocess.run(
        [sys.executable, str(script), device],
        capture_output=True,
        text=True,
        env=child_env({**os.environ, **env}),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    return result["report"]


def _assert_kernel_agrees(report: list[dict]) -> None:
    for row in report:
        assert row["torch.float32"] <= 2e-3, row  # float rounding of 0..255 values
        assert row["torch.uint8"] <= 1, row  # a rounding tie may land either side


def test_triton_kernel_in_the_interpreter_matches_torch(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    _assert_kernel_agrees(_kernel_report("cpu", {"TRITON_INTERPRET": "1"}, tmp_path))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_triton_kernel_on_cuda_matches_torch(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    _assert_kernel_agrees(_kernel_report("cuda", {"TRITON_INTERPRET": "0"}, tmp_path))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_torch_path_on_cuda_matches_cpu() -> None:
    case = _random_case(5, items=4, frames=3, side=48)
    kwargs = dict(mode="yuv", size=20, dtype=torch.float32, backend="torch", **_meta(case))
    cpu = yuv_to_rgb(case["data"], **kwargs)
    cuda = yuv_to_rgb(case["data"], device="cuda", **kwargs)
    assert cuda.is_cuda
    torch.testing.assert_close(cuda.cpu(), cpu, atol=2e-3, rtol=0)

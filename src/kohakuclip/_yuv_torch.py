"""``yuv_to_rgb``: finish a ``yuv`` or ``yuv_resized`` batch in torch, on the GPU or the CPU.

The Reader's yuv modes ship 4:2:0 planes (half the bytes of rgb at the output size, or the
stored-resolution crop window) and leave the rest to the device that trains: per plane the
window is resized to the output with the CPU's filter and its integer arithmetic
(``decode._resize``: the same taps, vertical pass first, rounded to 8 bits after each pass; a
luma window of exactly twice the output is the 2x2 mean the CPU's conversion takes unrounded,
a chroma one the 2x2 box rounded once; chroma goes straight from its half-resolution window to
the output), then the clip's own matrix and range, flips, and scaling. So the finish gives the
rgb mode's pixels, to within the last bit of the float32 conversion.

Two implementations share one description of the work (per item: windows, rounding, flips,
matrix, and the taps of each plane and axis): plain torch here, which resizes with two small
batched float64 matmuls per plane (exact on these integers; flips folded into the weights) and
runs anywhere, and a single-pass Triton kernel (``kohakuclip.gpu``, integer taps) used for CUDA
tensors when triton imports.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from kohakuclip.decode._resize import PRECISION_BITS, resize_taps
from kohakuclip.decode.pixels import yuv420_frame_bytes, yuv_to_rgb_matrix

__all__ = ["Backend", "packed_side", "yuv_to_rgb"]


Backend = Literal["auto", "torch", "triton"]

_COLORSPACES = ("bt601", "bt709")

# Columns of the per-item geometry table shared with the Triton kernel.
_LUMA_H, _LUMA_W, _LUMA_ROUND, _CHROMA_H, _CHROMA_W, _CHROMA_ROUND, _HFLIP, _VFLIP = range(8)

# Rounding of a plane's resize: after each pass (the general filter), once at the end (the 2x2
# box of a chroma window twice the output), or never (a luma window twice the output: the CPU
# averages its 2x2 boxes inside the conversion).
ROUND_EACH_PASS, ROUND_AT_END, ROUND_NEVER = 2, 1, 0


@dataclass(frozen=True)
class _Job:
    """One conversion, device-ready: frames [F, L], per-item geometry and matrices."""

    frames: torch.Tensor  # uint8 [N * T, L], contiguous, on the target device
    items: int
    per_item: int  # frames per item (T; 1 for image batches)
    side: int  # packed square side of each frame's planes
    size: int  # output side
    geometry: np.ndarray  # int32 [N, 8], columns _LUMA_H ... _VFLIP
    starts: np.ndarray  # int32 [N, 2 (luma, chroma), 2 (rows, columns), size]
    weights: np.ndarray  # int32 [N, 2, 2, size, K], fixed point (PRECISION_BITS)
    matrices: np.ndarray  # float32 [N, 3, 4]: [R G B] = M @ [Y U V 1]
    scale: np.ndarray  # float32 [3]
    offset: np.ndarray  # float32 [3]
    dtype: torch.dtype
    shape: tuple[int, ...]  # of the result: [N, T, 3, S, S], or [N, 3, S, S] for [N, L] input


def yuv_to_rgb(
    data: Any,
    *,
    size: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.uint8,
    mode: str | None = None,
    crops: Any = None,
    flips: Any = None,
    colorspaces: str | Sequence[str] | None = None,
    full_range: Any = None,
    scale: float | Sequence[float] = 1.0,
    offset: float | Sequence[float] = 0.0,
    backend: Backend = "auto",
) -> torch.Tensor:
    """RGB frames ``[N, T, 3, size, size]`` (``[N, 3, size, size]`` for ``[N, L]`` input) from
    a yuv-mode batch.

    ``data``: a ``Batch`` / image batch (``video`` or ``image``, ``mode``, ``crops``, ``flips``,
    ``colorspaces``, ``full_range`` are taken from it; keyword arguments override them), a
    dataset's ``(batch, meta)`` pair (``with_meta=True``: those fields and ``size`` from its
    meta), or a uint8 tensor / array ``[N, T, L]`` or ``[N, L]`` of packed Y|U|V frames plus
    ``mode`` and the metadata. ``size``: the output side; defaults to the packed side in
    ``yuv_resized`` and is required in ``yuv``. ``device``: where to convert (the input is
    copied there, asynchronously from pinned memory; default: where it is). ``colorspaces``:
    per item (or one for all) ``"bt601"`` / ``"bt709"``; default ``"bt601"`` (a ``"-full"``
    suffix is deprecated: pass ``full_range``). ``full_range``: per item, or one for all
    (default limited range).
    ``flips`` (``yuv`` only; ``yuv_resized`` planes come flipped): bool ``[N, 2]``, horizontal
    then vertical.

    Output: ``uint8`` rounds and clamps to 0..255. Float dtypes give ``clamp(rgb, 0, 255) *
    scale + offset`` (per channel when sequences of 3; e.g. ``scale=2/255, offset=-1`` for
    [-1, 1]). ``backend``: ``"auto"`` uses the Triton kernel for CUDA tensors when triton imports,
    plain torch otherwise (its float32 matmuls follow torch's TF32 setting on CUDA).
    """
    fields = _batch_fields(data)
    size = size if size is not None else fields.get("size")
    mode = mode if mode is not None else fields.get("mode")
    crops = crops if crops is not None else fields.get("crops")
    flips = flips if flips is not None else fields.get("flips")
    colorspaces = colorspaces if colorspaces is not None else fields.get("colorspaces")
    full_range = full_range if full_range is not None else fields.get("full_range")
    frames = fields.get("pixels", data)
    job = _prepare(
        frames, size, device, dtype, mode, crops, flips, colorspaces, full_range, scale, offset
    )
    out = _convert_triton(job) if _use_triton(backend, job.frames) else _convert_torch(job)
    return out.reshape(job.shape)


def _batch_fields(data: Any) -> dict[str, Any]:
    """Pixels and metadata of a Reader / ImageReader batch or of a dataset's (batch, meta)
    pair; empty for a bare tensor or array."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[1], Mapping):
        pixels, meta = data
        names = ("mode", "size", "crops", "flips", "colorspaces", "full_range")
        return {"pixels": pixels, **{name: meta.get(name) for name in names}}
    if isinstance(data, (torch.Tensor, np.ndarray)) or not hasattr(data, "mode"):
        return {}
    pixels = getattr(data, "video", None)
    if pixels is None:
        pixels = getattr(data, "image", None)
    if pixels is None:
        raise ValueError(f"{type(data).__name__} has neither a video nor an image field")
    fields = {"pixels": pixels, "mode": data.mode}
    for name in ("crops", "flips", "colorspaces", "full_range"):
        fields[name] = getattr(data, name, None)
    return fields


def _use_triton(backend: Backend, frames: torch.Tensor) -> bool:
    """Whether this conversion runs the Triton kernel (imported only then: triton is slow to
    import)."""
    if backend == "torch":
        return False
    if backend == "triton":
        from kohakuclip import gpu

        if not gpu.available():
            raise RuntimeError("backend='triton' needs the triton package")
        if not (frames.is_cuda or gpu.interpreting()):
            raise ValueError("the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1)")
        return True
    if backend != "auto":
        raise ValueError(f"backend must be 'auto', 'torch' or 'triton', got {backend!r}")
    if not frames.is_cuda:
        return False
    from kohakuclip import gpu

    return gpu.available()


def packed_side(length: int) -> int:
    """The square side whose packed 4:2:0 frame (Y, then U and V at ceil(side/2)) is ``length``
    bytes long."""
    guess = math.isqrt(max(0, int(length / 1.5)))
    for side in range(max(1, guess - 2), guess + 3):
        if yuv420_frame_bytes(side) == length:
            return side
    raise ValueError(f"{length} bytes per frame is not a packed 4:2:0 square frame")


def _prepare(
    frames: Any,
    size: int | None,
    device: torch.device | str | None,
    dtype: torch.dtype,
    mode: str | None,
    crops: Any,
    flips: Any,
    colorspaces: str | Sequence[str] | None,
    full_range: Any,
    scale: float | Sequence[float],
    offset: float | Sequence[float],
) -> _Job:
    tensor = torch.from_numpy(frames) if isinstance(frames, np.ndarray) else frames
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a batch, tensor or array, got {type(frames).__name__}")
    if tensor.dtype != torch.uint8 or tensor.ndim not in (2, 3):
        raise ValueError(
            f"pixels must be uint8 [N, T, L] or [N, L], got {tensor.dtype} {tuple(tensor.shape)}"
        )
    if mode not in ("yuv", "yuv_resized"):
        raise ValueError(f"mode must be 'yuv' or 'yuv_resized' (the batch's mode), got {mode!r}")
    if not (dtype.is_floating_point or dtype == torch.uint8):
        raise ValueError(f"dtype must be torch.uint8 or a float type, got {dtype}")
    items = tensor.shape[0]
    per_item = tensor.shape[1] if tensor.ndim == 3 else 1
    side = packed_side(tensor.shape[-1])
    if size is None:
        if mode == "yuv":
            raise ValueError("size= is needed in yuv mode (the Reader's output size)")
        size = side
    if not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"size must be a positive int, got {size!r}")
    size = int(size)
    geometry = _geometry(mode, items, side, size, crops, flips)
    starts, weights = _taps(geometry, size)
    flat = tensor.reshape(items * per_item, tensor.shape[-1])
    if device is not None and torch.device(device) != flat.device:
        flat = flat.to(device, non_blocking=flat.is_pinned())
    return _Job(
        frames=flat.contiguous(),
        items=items,
        per_item=per_item,
        side=side,
        size=size,
        geometry=geometry,
        starts=starts,
        weights=weights,
        matrices=_matrices(items, colorspaces, full_range),
        scale=_per_channel("scale", scale, dtype),
        offset=_per_channel("offset", offset, dtype),
        dtype=dtype,
        shape=(items, *tensor.shape[1:-1], 3, size, size),
    )


def _as_numpy(name: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    if array.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
    return array


def _rounding(height: np.ndarray, width: np.ndarray, size: int, never: int) -> np.ndarray:
    """Per item: how the CPU rounds this plane's resize (``never``: what a 2x2 box gets)."""
    box2 = (height == 2 * size) & (width == 2 * size)
    return np.where(box2, never, ROUND_EACH_PASS)


def _taps(geometry: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Starts [N, 2, 2, size] and weights [N, 2, 2, size, K] (zero-padded) of the shared filter,
    per item, plane (luma, chroma) and axis (rows, columns)."""
    items = geometry.shape[0]
    columns = ((_LUMA_H, _LUMA_W), (_CHROMA_H, _CHROMA_W))
    taps = {
        (i, p, a): resize_taps(int(geometry[i, columns[p][a]]), size)
        for i in range(items)
        for p in range(2)
        for a in range(2)
    }
    k = max(w.shape[1] for _, w in taps.values())
    starts = np.zeros((items, 2, 2, size), np.int32)
    weights = np.zeros((items, 2, 2, size, k), np.int32)
    for (i, p, a), (s, w) in taps.items():
        starts[i, p, a] = s
        weights[i, p, a, :, : w.shape[1]] = w
    return starts, weights


def _geometry(mode: str, items: int, side: int, size: int, crops: Any, flips: Any) -> np.ndarray:
    """Per item: luma and chroma windows (top-left of each plane), rounding, flips."""
    table = np.zeros((items, 8), np.int64)
    if mode == "yuv_resized":
        chroma = (side + 1) // 2
        table[:, [_LUMA_H, _LUMA_W]] = side
        table[:, [_CHROMA_H, _CHROMA_W]] = chroma
    else:
        if crops is None:
            raise ValueError("crops are needed in yuv mode (the batch's crop windows)")
        windows = _as_numpy("crops", crops, (items, 4)).astype(np.int64)
        w, h = windows[:, 2], windows[:, 3]
        if (w < 1).any() or (h < 1).any() or (w > side).any() or (h > side).any():
            raise ValueError(f"crop windows {windows.tolist()} do not fit the {side}-pixel planes")
        table[:, _LUMA_H], table[:, _LUMA_W] = h, w
        table[:, _CHROMA_H], table[:, _CHROMA_W] = (h + 1) // 2, (w + 1) // 2
        if flips is not None:
            table[:, [_HFLIP, _VFLIP]] = _as_numpy("flips", flips, (items, 2)).astype(bool)
    table[:, _LUMA_ROUND] = _rounding(table[:, _LUMA_H], table[:, _LUMA_W], size, ROUND_NEVER)
    table[:, _CHROMA_ROUND] = _rounding(
        table[:, _CHROMA_H], table[:, _CHROMA_W], size, ROUND_AT_END
    )
    return table.astype(np.int32)


def _matrices(items: int, colorspaces: str | Sequence[str] | None, full_range: Any) -> np.ndarray:
    """Per item 3x4 matrices from colorspace names (one for all, or per item) and ranges."""
    if colorspaces is None or isinstance(colorspaces, str):
        names = [colorspaces or "bt601"] * items
    else:
        names = [str(c) for c in colorspaces]
    if len(names) != items:
        raise ValueError(f"colorspaces has {len(names)} entries for {items} items")
    if full_range is None:
        full = np.zeros(items, bool)
    elif np.ndim(full_range) == 0:
        full = np.full(items, bool(full_range))
    else:
        full = _as_numpy("full_range", full_range, (items,)).astype(bool)
    out = np.empty((items, 3, 4), np.float32)
    cache: dict[tuple[str, bool], np.ndarray] = {}
    suffixed = False
    for i, (name, is_full) in enumerate(zip(names, full.tolist())):
        base, _, suffix = name.partition("-")
        if base not in _COLORSPACES or suffix not in ("", "full"):
            raise ValueError(f"unknown colorspace {name!r} (expected bt601 or bt709)")
        suffixed = suffixed or suffix == "full"
        key = (base, is_full or suffix == "full")
        if key not in cache:
            cache[key] = yuv_to_rgb_matrix(*key)
        out[i] = cache[key]
    if suffixed:
        warnings.warn(
            'colorspace names suffixed "-full" are deprecated: pass full_range=True',
            DeprecationWarning,
            stacklevel=4,  # the caller of yuv_to_rgb
        )
    return out


def _per_channel(name: str, value: float | Sequence[float], dtype: torch.dtype) -> np.ndarray:
    array = np.broadcast_to(np.asarray(value, np.float32), (3,)).copy()
    default = 1.0 if name == "scale" else 0.0
    if not dtype.is_floating_point and (array != default).any():
        raise ValueError(f"{name} applies to float outputs; uint8 output is always 0..255")
    return array


def _dense(
    starts: torch.Tensor, weights: torch.Tensor, extent: int, flip: torch.Tensor
) -> torch.Tensor:
    """[N, size, extent] float64 matrices of one axis's taps (exact: fixed point scaled by a
    power of two); rows reversed where ``flip``."""
    n, size, k = weights.shape
    index = starts.long()[..., None] + torch.arange(k, device=starts.device)
    inside = index < extent
    values = torch.where(inside, weights.double(), 0.0) * 2.0**-PRECISION_BITS
    dense = torch.zeros((n, size, extent), dtype=torch.float64, device=starts.device)
    dense.scatter_add_(2, index.clamp(max=extent - 1), values)
    return torch.where(flip[:, None, None], dense.flip(1), dense)


def _round8(x: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """``x`` rounded half up and clamped to 0..255 for the items ``where`` says ([N] bool)."""
    rounded = torch.floor(x + 0.5).clamp_(0.0, 255.0)
    return torch.where(where.view(-1, *([1] * (x.ndim - 1))), rounded, x)


def _resize_planes(
    planes: torch.Tensor,
    geometry: torch.Tensor,
    taps: tuple[torch.Tensor, torch.Tensor],
    plane: int,
    job: _Job,
) -> torch.Tensor:
    """[N, T, size, size] float64: each item's top-left window of uint8 ``planes`` [N, T, P, P]
    resized as the CPU does (``plane``: 0 luma, 1 chroma; its geometry columns and taps).

    Two matmuls batched over items (frames fold into the rows), vertical first, each rounded
    to 8 bits where the CPU rounds.
    """
    h_col, w_col, r_col = (
        (_LUMA_H, _LUMA_W, _LUMA_ROUND)
        if plane == 0
        else (
            _CHROMA_H,
            _CHROMA_W,
            _CHROMA_ROUND,
        )
    )
    starts, weights = taps
    rows = int(job.geometry[:, h_col].max())
    columns = int(job.geometry[:, w_col].max())
    along_y = _dense(starts[:, plane, 0], weights[:, plane, 0], rows, geometry[:, _VFLIP].bool())
    along_x = _dense(starts[:, plane, 1], weights[:, plane, 1], columns, geometry[:, _HFLIP].bool())
    rounding = geometry[:, r_col]
    window = planes[..., :rows, :columns].double()
    tall = along_y[:, None] @ window  # [N, T, S, columns]
    tall = _round8(tall, rounding == ROUND_EACH_PASS)
    done = tall @ along_x.transpose(1, 2)[:, None]  # [N, T, S, S]
    return _round8(done, rounding != ROUND_NEVER)


def _upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host table on ``device``; through pinned memory on CUDA so that the copy is
    asynchronous (a pageable copy would stall the host until the GPU stream drains)."""
    table = torch.from_numpy(np.ascontiguousarray(array))
    if device.type != "cuda":
        return table.to(device)
    return table.pin_memory().to(device, non_blocking=True)


def _tables(
    job: _Job,
) -> tuple[
    torch.Tensor, tuple[torch.Tensor, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor
]:
    """Geometry, taps (starts, weights), matrices [N, 3, 4], scale [3] and offset [3] on the
    job's device, in 2 copies."""
    device = job.frames.device
    floats = _upload(np.concatenate([job.matrices.ravel(), job.scale, job.offset]), device)
    end = job.items * 12
    matrices = floats[:end].view(job.items, 3, 4)
    ints = _upload(
        np.concatenate([job.geometry.ravel(), job.starts.ravel(), job.weights.ravel()]), device
    )
    g, st = job.geometry.size, job.starts.size
    geometry = ints[:g].view(job.geometry.shape)
    starts = ints[g : g + st].view(job.starts.shape)
    weights = ints[g + st :].view(job.weights.shape)
    return geometry, (starts, weights), matrices, floats[end : end + 3], floats[end + 3 :]


def _convert_triton(job: _Job) -> torch.Tensor:
    """The Triton kernel: [N * T, 3, size, size] in ``job.dtype``."""
    from kohakuclip import gpu

    geometry, (starts, weights), matrices, scale, offset = _tables(job)
    out = torch.empty(
        (job.items * job.per_item, 3, job.size, job.size), dtype=job.dtype, device=geometry.device
    )
    gpu.convert(
        job.frames, geometry, starts, weights, matrices, scale, offset, job.per_item, job.side, out
    )
    return out


def _convert_torch(job: _Job) -> torch.Tensor:
    """The plain torch path: [N * T, 3, size, size] in ``job.dtype``."""
    compute = torch.float64 if job.dtype == torch.float64 else torch.float32
    n, t, p, s = job.items, job.per_item, job.side, job.size
    c = (p + 1) // 2
    flat = job.frames.reshape(n, t, -1)
    luma = flat[..., : p * p].reshape(n, t, p, p)
    chroma = flat[..., p * p : p * p + 2 * c * c].reshape(n, t * 2, c, c)  # U, V of each frame
    geometry, taps, matrices, scale, offset = _tables(job)
    luma_size = _resize_planes(luma, geometry, taps, 0, job).to(compute)
    chroma_size = _resize_planes(chroma, geometry, taps, 1, job).to(compute)
    yuv = torch.cat([luma_size[:, :, None], chroma_size.reshape(n, t, 2, s, s)], dim=2)
    m = matrices.to(compute)[:, None]
    rgb = m[..., :3] @ yuv.reshape(n, t, 3, s * s)
    rgb += m[..., 3:]
    rgb.clamp_(0.0, 255.0)
    if job.dtype == torch.uint8:
        return rgb.add_(0.5).to(torch.uint8).reshape(n * t, 3, s, s)  # truncation: rounding
    rgb = rgb * scale.to(compute)[:, None] + offset.to(compute)[:, None]
    return rgb.to(job.dtype).reshape(n * t, 3, s, s)

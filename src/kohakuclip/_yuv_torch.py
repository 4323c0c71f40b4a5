"""``yuv_to_rgb``: finish a ``yuv`` or ``yuv_resized`` batch in torch, on the GPU or the CPU.

The Reader's yuv modes ship 4:2:0 planes (half the bytes of rgb at the output size, or the
stored-resolution crop window) and leave the rest to the device that trains: per plane the
window is resized to the output with the same filter as the CPU rgb mode (for shrinks of 2x or
more a box prefilter by the integer factor, then bilinear with half-pixel centres, edges
clamped; chroma goes straight from its half-resolution window to the output), then the clip's
own matrix and range, flips, and scaling.

Two implementations share one description of the work (per item: windows, box factors, flips,
matrix): plain torch here, which resizes with two small batched matmuls per plane (flips folded
into the weights) and runs anywhere, and a single-pass Triton kernel (``kohakuclip.gpu``) used
for CUDA tensors when triton imports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from kohakuclip.decode.pixels import yuv420_frame_bytes, yuv_to_rgb_matrix

Backend = Literal["auto", "torch", "triton"]

_COLORSPACES = ("bt601", "bt709")

# Columns of the per-item geometry table shared with the Triton kernel.
_LUMA_H, _LUMA_W, _LUMA_K, _CHROMA_H, _CHROMA_W, _CHROMA_K, _HFLIP, _VFLIP = range(8)


@dataclass(frozen=True)
class _Job:
    """One conversion, device-ready: frames [F, L], per-item geometry and matrices."""

    frames: torch.Tensor  # uint8 [N * T, L], contiguous, on the target device
    items: int
    per_item: int  # frames per item (T; 1 for image batches)
    side: int  # packed square side of each frame's planes
    size: int  # output side
    geometry: np.ndarray  # int32 [N, 8], columns _LUMA_H ... _VFLIP
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
    ``colorspaces``, ``full_range`` are taken from it; keyword arguments override them), or a
    uint8 tensor / array ``[N, T, L]`` or ``[N, L]`` of packed Y|U|V frames plus ``mode`` and the
    metadata. ``size``: the output side; defaults to the packed side in ``yuv_resized`` and is
    required in ``yuv``. ``device``: where to convert (the input is copied there, asynchronously
    from pinned memory; default: where it is). ``colorspaces``: per item (or one for all)
    ``"bt601"`` / ``"bt709"``, optionally suffixed ``"-full"``; default ``"bt601"``.
    ``full_range``: per item (default limited range). ``flips`` (``yuv`` only; ``yuv_resized``
    planes come flipped): bool ``[N, 2]``, horizontal then vertical.

    Output: ``uint8`` rounds and clamps to 0..255. Float dtypes give ``clamp(rgb, 0, 255) *
    scale + offset`` (per channel when sequences of 3; e.g. ``scale=2/255, offset=-1`` for
    [-1, 1]). ``backend``: ``"auto"`` uses the Triton kernel for CUDA tensors when triton imports,
    plain torch otherwise (its float32 matmuls follow torch's TF32 setting on CUDA).
    """
    fields = _batch_fields(data)
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
    """Pixels and metadata of a Reader / ImageReader batch; empty for a bare tensor or array."""
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


def _box_factor(height: np.ndarray, width: np.ndarray, size: int) -> np.ndarray:
    """The integer box prefilter of a >=2x shrink (1 = none), as the CPU rgb mode picks it."""
    k = np.minimum(height // size, width // size)
    return np.where(k >= 2, k, 1)


def _geometry(mode: str, items: int, side: int, size: int, crops: Any, flips: Any) -> np.ndarray:
    """Per item: luma and chroma windows (top-left of each plane), box factors, flips."""
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
    table[:, _LUMA_K] = _box_factor(table[:, _LUMA_H], table[:, _LUMA_W], size)
    table[:, _CHROMA_K] = _box_factor(table[:, _CHROMA_H], table[:, _CHROMA_W], size)
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
    for i, (name, is_full) in enumerate(zip(names, full.tolist())):
        base, _, suffix = name.partition("-")
        if base not in _COLORSPACES or suffix not in ("", "full"):
            raise ValueError(f"unknown colorspace {name!r} (expected bt601 or bt709[-full])")
        key = (base, is_full or suffix == "full")
        if key not in cache:
            cache[key] = yuv_to_rgb_matrix(*key)
        out[i] = cache[key]
    return out


def _per_channel(name: str, value: float | Sequence[float], dtype: torch.dtype) -> np.ndarray:
    array = np.broadcast_to(np.asarray(value, np.float32), (3,)).copy()
    default = 1.0 if name == "scale" else 0.0
    if not dtype.is_floating_point and (array != default).any():
        raise ValueError(f"{name} applies to float outputs; uint8 output is always 0..255")
    return array


def _axis_weights(
    length: torch.Tensor,
    box: torch.Tensor,
    flip: torch.Tensor,
    size: int,
    extent: int,
    compute: torch.dtype,
) -> torch.Tensor:
    """[N, size, extent] resampling weights along one axis: output ``i`` of item ``n`` reads
    two boxes of ``box[n]`` source samples, bilinear between them; rows reversed when flipped."""
    device = length.device
    cells = length // box  # prefiltered grid length
    last = (cells - 1)[:, None]
    centre = (torch.arange(size, device=device, dtype=compute) + 0.5)[None, :]
    pos = (centre * cells[:, None].to(compute)) / size - 0.5
    pos = torch.minimum(pos.clamp_min(0.0), last.to(compute))
    first = pos.floor()
    frac = (pos - first)[..., None]
    lo = first.long()
    hi = torch.minimum(lo + 1, last)
    src = torch.arange(extent, device=device)[None, None, :]
    cell = src // box[:, None, None]  # samples past the last whole box match no cell
    weights = (cell == lo[..., None]) * (1.0 - frac) + (cell == hi[..., None]) * frac
    weights = weights / box[:, None, None].to(compute)
    return torch.where(flip[:, None, None], weights.flip(1), weights)


def _resize_planes(
    planes: torch.Tensor,
    geometry: torch.Tensor,
    cols: tuple[int, int, int],
    job: _Job,
    compute: torch.dtype,
) -> torch.Tensor:
    """[N, T, size, size]: each item's top-left window of uint8 ``planes`` [N, T, P, P], resized.

    Two matmuls batched over items only (frames fold into the rows), so the weights are never
    expanded per frame.
    """
    h_col, w_col, k_col = cols
    n, t, s = planes.shape[0], planes.shape[1], job.size
    rows = int(job.geometry[:, h_col].max())
    columns = int(job.geometry[:, w_col].max())
    box = geometry[:, k_col].long()
    along_y = _axis_weights(
        geometry[:, h_col].long(), box, geometry[:, _VFLIP].bool(), s, rows, compute
    )
    along_x = _axis_weights(
        geometry[:, w_col].long(), box, geometry[:, _HFLIP].bool(), s, columns, compute
    )
    window = planes[..., :rows, :columns].to(compute)
    wide = window.reshape(n, t * rows, columns) @ along_x.transpose(1, 2)  # [N, T*rows, S]
    wide = wide.reshape(n, t, rows, s).transpose(2, 3).reshape(n, t * s, rows)
    done = wide @ along_y.transpose(1, 2)  # [N, T*S (x), S (y)]
    return done.reshape(n, t, s, s).transpose(2, 3)


def _upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A small host table on ``device``; through pinned memory on CUDA so that the copy is
    asynchronous (a pageable copy would stall the host until the GPU stream drains)."""
    table = torch.from_numpy(np.ascontiguousarray(array))
    if device.type != "cuda":
        return table.to(device)
    return table.pin_memory().to(device, non_blocking=True)


def _tables(job: _Job) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Geometry, matrices [N, 3, 4], scale [3] and offset [3] on the job's device, in 2 copies."""
    device = job.frames.device
    floats = _upload(np.concatenate([job.matrices.ravel(), job.scale, job.offset]), device)
    end = job.items * 12
    matrices = floats[:end].view(job.items, 3, 4)
    return _upload(job.geometry, device), matrices, floats[end : end + 3], floats[end + 3 :]


def _convert_triton(job: _Job) -> torch.Tensor:
    """The Triton kernel: [N * T, 3, size, size] in ``job.dtype``."""
    from kohakuclip import gpu

    geometry, matrices, scale, offset = _tables(job)
    out = torch.empty(
        (job.items * job.per_item, 3, job.size, job.size), dtype=job.dtype, device=geometry.device
    )
    gpu.convert(job.frames, geometry, matrices, scale, offset, job.per_item, job.side, out)
    return out


def _convert_torch(job: _Job) -> torch.Tensor:
    """The plain torch path: [N * T, 3, size, size] in ``job.dtype``."""
    compute = torch.float64 if job.dtype == torch.float64 else torch.float32
    n, t, p, s = job.items, job.per_item, job.side, job.size
    c = (p + 1) // 2
    flat = job.frames.reshape(n, t, -1)
    luma = flat[..., : p * p].reshape(n, t, p, p)
    chroma = flat[..., p * p : p * p + 2 * c * c].reshape(n, t * 2, c, c)  # U, V of each frame
    geometry, matrices, scale, offset = _tables(job)
    luma_size = _resize_planes(luma, geometry, (_LUMA_H, _LUMA_W, _LUMA_K), job, compute)
    chroma_size = _resize_planes(chroma, geometry, (_CHROMA_H, _CHROMA_W, _CHROMA_K), job, compute)
    yuv = torch.cat([luma_size[:, :, None], chroma_size.reshape(n, t, 2, s, s)], dim=2)
    m = matrices.to(compute)[:, None]
    rgb = m[..., :3] @ yuv.reshape(n, t, 3, s * s)
    rgb += m[..., 3:]
    rgb.clamp_(0.0, 255.0)
    if job.dtype == torch.uint8:
        return rgb.add_(0.5).to(torch.uint8).reshape(n * t, 3, s, s)  # truncation: rounding
    rgb = rgb * scale.to(compute)[:, None] + offset.to(compute)[:, None]
    return rgb.to(job.dtype).reshape(n * t, 3, s, s)

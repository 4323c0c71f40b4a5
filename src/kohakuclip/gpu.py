"""The Triton kernel behind ``kohakuclip.torch.yuv_to_rgb`` on CUDA: one pass per output pixel.

Each program writes a block of output pixels of one frame: per plane it applies the taps of the
shared resize (``decode._resize``: per item, plane and axis, integer fixed point) in the CPU's
integer arithmetic (vertical pass first, each pass rounded to 8 bits, or the 2x2 box rounded
once or not at all, as the item's rounding column says; chroma straight from its
half-resolution window), applies the item's YUV -> RGB matrix, clamps, scales and stores R, G
and B. Flips only change which output's taps a pixel uses. The plain torch path in
``kohakuclip._yuv_torch`` does the same arithmetic and is the reference for this kernel.

Importable without triton: ``available()`` says whether the kernel can run.
"""

from __future__ import annotations

import os
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the plain torch path covers machines without triton
    triton = None

__all__ = ["available", "convert", "interpreting"]


_BLOCK = 256


def available() -> bool:
    """Whether triton imported (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)."""
    return triton is not None


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


if triton is not None:

    @triton.jit
    def _sample_plane(plane, stride, starts, weights, taps, rounding, sy, sx, size, mask):
        """Resized value at (``sy``, ``sx``) of one plane's top-left window: ``starts`` [2, S]
        and ``weights`` [2, S, taps] (rows, then columns) of this item and plane."""
        bias = 1 << 21  # PRECISION_BITS = 22
        unit = 1.0 / 4194304.0
        row0 = tl.load(starts + sy, mask=mask, other=0)
        col0 = tl.load(starts + size + sx, mask=mask, other=0)
        row_w = weights + sy * taps
        col_w = weights + size * taps + sx * taps
        exact = tl.zeros(sy.shape, tl.int32)
        unrounded = tl.zeros(sy.shape, tl.float32)
        for i in range(0, taps):
            wh = tl.load(col_w + i, mask=mask, other=0)
            column = plane + col0 + i
            acc = tl.zeros(sy.shape, tl.int32)
            for j in range(0, taps):
                wv = tl.load(row_w + j, mask=mask, other=0)
                live = mask & (wv != 0) & (wh != 0)
                pixel = tl.load(column + (row0 + j) * stride, mask=live, other=0)
                acc += pixel.to(tl.int32) * wv
            exact += tl.minimum(tl.maximum((acc + bias) >> 22, 0), 255) * wh
            unrounded += acc.to(tl.float32) * unit * (wh.to(tl.float32) * unit)
        exact = tl.minimum(tl.maximum((exact + bias) >> 22, 0), 255)
        once = tl.minimum(tl.maximum(tl.floor(unrounded + 0.5), 0.0), 255.0)
        value = tl.where(rounding == 1, once, unrounded)
        return tl.where(rounding == 2, exact.to(tl.float32), value)

    @triton.jit
    def _yuv_to_rgb_kernel(
        src,
        out,
        geometry,
        starts,
        weights,
        taps,
        matrices,
        scale,
        offset,
        frame_bytes,
        per_item,
        side,
        size,
        BLOCK: tl.constexpr,
        ROUND: tl.constexpr,
    ):
        frame = tl.program_id(0)
        item = frame // per_item
        pixel = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = pixel < size * size
        oy = pixel // size
        ox = pixel % size
        meta = geometry + item * 8
        hflip = tl.load(meta + 6)
        vflip = tl.load(meta + 7)
        sx = tl.where(hflip != 0, size - 1 - ox, ox)
        sy = tl.where(vflip != 0, size - 1 - oy, oy)
        luma = src + frame.to(tl.int64) * frame_bytes
        half = (side + 1) // 2
        u_plane = luma + side * side
        v_plane = u_plane + half * half
        luma_round = tl.load(meta + 2)
        chroma_round = tl.load(meta + 5)
        # per item: [plane (luma, chroma)][axis (rows, columns)][size] starts, [.., taps] weights
        luma_starts = starts + item.to(tl.int64) * 4 * size
        luma_weights = weights + item.to(tl.int64) * 4 * size * taps
        chroma_starts = luma_starts + 2 * size
        chroma_weights = luma_weights + 2 * size * taps
        y = _sample_plane(
            luma, side, luma_starts, luma_weights, taps, luma_round, sy, sx, size, mask
        )
        u = _sample_plane(
            u_plane, half, chroma_starts, chroma_weights, taps, chroma_round, sy, sx, size, mask
        )
        v = _sample_plane(
            v_plane, half, chroma_starts, chroma_weights, taps, chroma_round, sy, sx, size, mask
        )
        m = matrices + item * 12
        dst = out + frame.to(tl.int64) * 3 * size * size + pixel
        for channel in tl.static_range(3):
            row = m + channel * 4
            value = (
                tl.load(row) * y + tl.load(row + 1) * u + tl.load(row + 2) * v + tl.load(row + 3)
            )
            value = tl.minimum(tl.maximum(value, 0.0), 255.0)
            if ROUND:
                value = tl.floor(value + 0.5)
            else:
                value = value * tl.load(scale + channel) + tl.load(offset + channel)
            tl.store(dst + channel * size * size, value.to(dst.dtype.element_ty), mask=mask)


def convert(
    frames: torch.Tensor,
    geometry: torch.Tensor,
    starts: torch.Tensor,
    weights: torch.Tensor,
    matrices: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    per_item: int,
    side: int,
    out: torch.Tensor,
) -> None:
    """Fill ``out`` [F, 3, S, S] from packed frames [F, L] (uint8) on one device.

    ``geometry``: int32 [N, 8] per item: luma window height, width, rounding (2: after each
    pass, 1: once at the end, 0: never), chroma window height, width, rounding, horizontal
    flip, vertical flip. ``starts`` / ``weights``: int32 [N, 2, 2, S] / [N, 2, 2, S, K], the
    resize taps per item, plane (luma, chroma) and axis (rows, columns). ``matrices``: float32
    [N, 12] (3x4 row-major, on 8-bit values). ``scale`` / ``offset``: float32 [3], used for float
    outputs (uint8 outputs are rounded instead). Frame ``f`` belongs to item ``f // per_item``.
    """
    if triton is None:
        raise RuntimeError("the Triton kernel needs the triton package")
    size = out.shape[-1]
    args: list[Any] = [
        frames,
        out,
        geometry.to(torch.int32).contiguous(),
        starts.to(torch.int32).contiguous(),
        weights.to(torch.int32).contiguous(),
        weights.shape[-1],
        matrices.to(torch.float32).contiguous(),
        scale.to(torch.float32).contiguous(),
        offset.to(torch.float32).contiguous(),
        frames.shape[1],
        per_item,
        side,
        size,
    ]
    grid = (frames.shape[0], triton.cdiv(size * size, _BLOCK))
    _yuv_to_rgb_kernel[grid](*args, BLOCK=_BLOCK, ROUND=out.dtype == torch.uint8)

"""The Triton kernel behind ``kohakuclip.torch.yuv_to_rgb`` on CUDA: one pass per output pixel.

Each program writes a block of output pixels of one frame: per plane it reads the two by two
boxes of the antialiased resize (box prefilter by the item's integer factor, bilinear between
boxes, half-pixel centres, clamped edges; chroma straight from its half-resolution window),
applies the item's YUV -> RGB matrix, clamps, scales and stores R, G and B. Flips only change
which source position an output pixel reads. The plain torch path in ``kohakuclip._yuv_torch``
does the same arithmetic and is the reference for this kernel.

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

_BLOCK = 256


def available() -> bool:
    """Whether triton imported (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1)."""
    return triton is not None


def interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


if triton is not None:

    @triton.jit
    def _sample_plane(plane, stride, height, width, box, sy, sx, size, mask):
        """Resampled value of the top-left ``height`` x ``width`` window of one plane."""
        rows = height // box
        cols = width // box
        py = ((sy.to(tl.float32) + 0.5) * rows.to(tl.float32)) / size - 0.5
        px = ((sx.to(tl.float32) + 0.5) * cols.to(tl.float32)) / size - 0.5
        py = tl.minimum(tl.maximum(py, 0.0), (rows - 1).to(tl.float32))
        px = tl.minimum(tl.maximum(px, 0.0), (cols - 1).to(tl.float32))
        y0 = py.to(tl.int32)  # truncation is floor: positions are >= 0
        x0 = px.to(tl.int32)
        fy = py - y0.to(tl.float32)
        fx = px - x0.to(tl.float32)
        top = y0 * box * stride
        bottom = tl.minimum(y0 + 1, rows - 1) * box * stride
        left = x0 * box
        right = tl.minimum(x0 + 1, cols - 1) * box
        a = tl.zeros(fy.shape, tl.float32)
        b = tl.zeros(fy.shape, tl.float32)
        c = tl.zeros(fy.shape, tl.float32)
        d = tl.zeros(fy.shape, tl.float32)
        for dy in range(0, box):
            for dx in range(0, box):
                at = plane + dy * stride + dx
                a += tl.load(at + top + left, mask=mask, other=0).to(tl.float32)
                b += tl.load(at + top + right, mask=mask, other=0).to(tl.float32)
                c += tl.load(at + bottom + left, mask=mask, other=0).to(tl.float32)
                d += tl.load(at + bottom + right, mask=mask, other=0).to(tl.float32)
        upper = (1.0 - fx) * a + fx * b
        lower = (1.0 - fx) * c + fx * d
        return ((1.0 - fy) * upper + fy * lower) / (box * box).to(tl.float32)

    @triton.jit
    def _yuv_to_rgb_kernel(
        src,
        out,
        geometry,
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
        lh = tl.load(meta + 0)
        lw = tl.load(meta + 1)
        lk = tl.load(meta + 2)
        ch = tl.load(meta + 3)
        cw = tl.load(meta + 4)
        ck = tl.load(meta + 5)
        y = _sample_plane(luma, side, lh, lw, lk, sy, sx, size, mask)
        u = _sample_plane(u_plane, half, ch, cw, ck, sy, sx, size, mask)
        v = _sample_plane(v_plane, half, ch, cw, ck, sy, sx, size, mask)
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
    matrices: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    per_item: int,
    side: int,
    out: torch.Tensor,
) -> None:
    """Fill ``out`` [F, 3, S, S] from packed frames [F, L] (uint8) on one device.

    ``geometry``: int32 [N, 8] per item: luma window height, width, box factor, chroma window
    height, width, box factor, horizontal flip, vertical flip. ``matrices``: float32 [N, 12]
    (3x4 row-major, on 8-bit values). ``scale`` / ``offset``: float32 [3], used for float
    outputs (uint8 outputs are rounded instead). Frame ``f`` belongs to item ``f // per_item``.
    """
    if triton is None:
        raise RuntimeError("the Triton kernel needs the triton package")
    size = out.shape[-1]
    args: list[Any] = [
        frames,
        out,
        geometry.to(torch.int32).contiguous(),
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

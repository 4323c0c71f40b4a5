"""Batch buffers: the caller's ``out`` is checked; pooled buffers come back only once no array
over them is left (slices and torch tensors included), the pool stays small, and a reader's
batches read into recycled memory are the bytes of batches read into fresh memory."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import kohakuclip
from kohakuclip.read.buffers import BatchBuffers
from kohakuclip.write.pack import pack
from tests.media import VideoSpec, make_video

SHAPE = (4, 8, 3, 16, 16)


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def test_the_caller_s_array_is_checked() -> None:
    buffers = BatchBuffers()
    out = np.zeros((2, 3), np.uint8)
    assert buffers.batch(out, (2, 3)) is out
    for bad in (
        np.zeros((3, 2), np.uint8),
        np.zeros((2, 3), np.int16),
        np.zeros((3, 2), np.uint8).T,
    ):
        with pytest.raises(ValueError, match="C-contiguous uint8"):
            buffers.batch(bad, (2, 3))
    frozen = np.zeros((2, 3), np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        buffers.batch(frozen, (2, 3))


def test_a_buffer_comes_back_when_its_last_view_is_gone() -> None:
    buffers = BatchBuffers()
    first = buffers.batch(None, SHAPE)
    assert first.shape == SHAPE and first.dtype == np.uint8 and first.flags.writeable
    at = _address(first)
    kept = first[1:, 2]  # a slice outlives the batch array
    del first
    gc.collect()
    assert buffers.idle == 0
    second = buffers.batch(None, SHAPE)
    assert not np.shares_memory(second, kept)
    del kept
    assert buffers.idle == 1
    third = buffers.batch(None, SHAPE)
    assert _address(third) == at
    del second, third
    assert buffers.idle == 2


def test_a_torch_tensor_keeps_its_buffer() -> None:
    torch = pytest.importorskip("torch")
    buffers = BatchBuffers()
    batch = buffers.batch(None, SHAPE)
    batch[:] = 7
    tensor = torch.from_numpy(batch[2])
    del batch
    gc.collect()
    other = buffers.batch(None, SHAPE)
    other[:] = 9
    assert int(tensor.min()) == int(tensor.max()) == 7
    del tensor
    assert buffers.idle == 1


def test_the_pool_keeps_few_and_fitting_buffers() -> None:
    buffers = BatchBuffers(idle=2)
    batches = [buffers.batch(None, SHAPE) for _ in range(5)]
    del batches
    assert buffers.idle == 2
    small = buffers.batch(None, (1, 1, 3, 8, 8))  # far smaller: a new buffer, the big ones go
    assert small.nbytes == 192 and buffers.idle == 0
    half = BatchBuffers()
    big = half.batch(None, SHAPE)
    at = _address(big)
    del big
    assert _address(half.batch(None, (2, *SHAPE[1:]))) == at  # half the size: reused


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("buffers")
    videos = [
        ("wide.mp4", make_video(VideoSpec(codec="h264", width=96, height=64, frames=24))),
        ("small.mp4", make_video(VideoSpec(codec="h264", width=48, height=40, frames=24, seed=1))),
    ]
    path = os.path.join(root, "s.zip")
    pack(path, videos)
    return path


@pytest.mark.parametrize("mode", ["rgb", "yuv"])
def test_recycled_batches_are_the_bytes_of_fresh_ones(shard: str, mode: str) -> None:
    """Batches read into reused memory equal batches read into a caller's buffer full of 255s
    (yuv windows smaller than ``yuv_size`` included: the margin is zeros, whatever was there)."""
    big = [(0, [0, 5, 10])] * 4
    small = [(1, [1, 2, 3])] * 4
    with kohakuclip.Reader(shard, size=32, mode=mode, yuv_size=64, seed=0) as reader:
        first = reader.read(big, seed=3).video
        at = _address(first)
        del first
        recycled = reader.read(small, seed=4).video
        assert _address(recycled) == at
        filled = np.full(reader.batch_shape(4, 3), 255, np.uint8)
        reader.read(small, seed=4, out=filled)
    np.testing.assert_array_equal(recycled, filled)
    if mode == "yuv":
        assert (recycled[:, :, 40 * 64 :][:, :, :64] == 0).all()  # luma rows under the window

"""Map-style datasets over a gulp directory, as GulpIO's: items are (frames, label index).

They need no torch, and work as they are with ``torch.utils.data.DataLoader`` (any number of
workers: nothing open is shared across the fork). Labels come from each video's meta_data
through ``label2idx.json`` beside the chunks. Randomness (the clip's start, the transforms) is
a pure function of (seed, epoch, index): the same items whatever the worker count.

The directory may also be a URL prefix in object storage (``gulp.remote``): the same items,
each frame one ranged read. Its listing is made where the dataset is, so its workers must start
with "forkserver" or "spawn" (a forked one raises ``ObjectStoreError`` saying so).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from kohakuclip.gulp.adapters import Label2Idx, load_label2idx
from kohakuclip.gulp.directory import GulpDirectory
from kohakuclip.gulp.frames import GulpError
from kohakuclip.gulp.index import GulpIndex, open_gulp_source
from kohakuclip.gulp.ingest import LABEL2IDX_FILE
from kohakuclip.gulp.remote import fetch_label2idx, open_gulp_url
from kohakuclip.gulp.transforms import call_transform
from kohakuclip.storage.remote import is_url, local_path

__all__ = ["GulpImageDataset", "GulpVideoDataset"]


def _load_labels(
    given: Label2Idx | Sequence[str] | str | None, root: str, options: Mapping[str, Any]
) -> Label2Idx:
    """``label2idx=`` as given (a map, or a JSON file's local path, ``file://`` or object-storage
    URL), else ``label2idx.json`` beside the chunks (``root``: a directory, or a URL prefix
    ending in ``/``); GulpError naming the file when it is missing."""
    if given is None:
        if is_url(root):
            return fetch_label2idx(root + LABEL2IDX_FILE, options)
        given = os.path.join(root, LABEL2IDX_FILE)
        if not os.path.exists(given):
            raise GulpError(f"{given}: missing (pass label2idx= to the dataset)")
    if isinstance(given, str):
        given = local_path(given)
        if is_url(given):
            return fetch_label2idx(given, options)
    return load_label2idx(given)


class _GulpDataset:
    """Shared part: the index, the targets, the per-item generator."""

    def __init__(
        self,
        data_path: str | os.PathLike[str],
        transform: Callable[..., Any] | None,
        target_transform: Callable[[int], Any] | None,
        seed: int,
        label_key: str,
        label2idx: Label2Idx | Sequence[str] | str | None,
        storage_options: Mapping[str, Any] | None,
    ) -> None:
        self.data_path = local_path(os.fspath(data_path))
        options = dict(storage_options or {})
        if is_url(self.data_path):
            self.index: GulpIndex = open_gulp_url(self.data_path, options)
        else:
            self.index = open_gulp_source(self.data_path)
        self.transform = transform
        self.target_transform = target_transform
        self.seed = seed
        self.epoch = 0
        self.label2idx = _load_labels(label2idx, self.index.root, options)
        self.targets = np.array(
            [self._target(v, label_key) for v in range(len(self.index))], np.int64
        )

    def _target(self, video: int, label_key: str) -> int:
        label = self.index.meta(video).get(label_key)
        if label is None or str(label) not in self.label2idx:
            raise GulpError(
                f"{self.data_path}: id {self.index.ids[video]!r} has label {label!r}, "
                f"not in label2idx"
            )
        return self.label2idx[str(label)]

    def __len__(self) -> int:
        return len(self.index)

    @cached_property
    def gd(self) -> GulpDirectory:
        """GulpIO's attribute, for subclasses written for it (``frames, meta = self.gd[id]``):
        the directory as a ``GulpDirectory`` (a local one; ``index`` serves URLs too)."""
        if is_url(self.data_path):
            raise GulpError(f"{self.data_path}: a URL dataset has no GulpDirectory; use .index")
        return GulpDirectory(self.data_path)

    @cached_property
    def items(self) -> list[tuple[str, dict[str, Any]]]:
        """GulpIO's attribute: per item, its id and meta entry (``frame_info``, ``meta_data``),
        in the dataset's order."""
        merged = self.gd.merged_meta_dict
        return [(id_, merged[id_]) for id_ in self.index.ids]

    @property
    def num_chunks(self) -> int:
        """GulpIO's attribute: the directory's chunk count."""
        return self.gd.num_chunks

    @property
    def classes(self) -> list[str]:
        """GulpIO's attribute: the label names, in ``label2idx`` order."""
        return list(self.label2idx)

    def set_epoch(self, epoch: int) -> None:
        """Vary the random draws per epoch (call before creating the epoch's iterator)."""
        self.epoch = epoch

    def _rng(self, index: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch, index])

    def _check(self, index: int) -> int:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} items")
        return index % len(self)

    def _finish_target(self, video: int) -> Any:
        target = int(self.targets[video])
        return self.target_transform(target) if self.target_transform else target


class GulpVideoDataset(_GulpDataset):
    """Clips of ``num_frames`` frames, ``step_size`` apart, from each video.

    Training (``is_val=False`` and ``random_offset``) starts each clip at a random frame; else at
    frame 0. Videos too short are padded with their last frame. ``num_frames <= 0`` takes every
    frame. Items are (frames, label index); frames is a T x H x W x 3 uint8 array when
    ``stack``, else a list (``transform`` sees the list).

    ``data_path`` is a gulp directory or its URL prefix (``s3://``, ``gs://``, ``az://``,
    ``http(s)://``, ``file://``; ``storage_options``: the store's options, as ``Reader``
    takes them). Workers of a URL dataset must start with "forkserver" or "spawn".
    """

    def __init__(
        self,
        data_path: str | os.PathLike[str],
        num_frames: int,
        step_size: int,
        is_val: bool,
        transform: Callable[..., Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        stack: bool = True,
        random_offset: bool = True,
        *,
        seed: int = 0,
        label_key: str = "label",
        label2idx: Label2Idx | Sequence[str] | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            data_path, transform, target_transform, seed, label_key, label2idx, storage_options
        )
        if step_size < 1:
            raise ValueError(f"step_size must be >= 1, got {step_size}")
        self.num_frames = num_frames
        self.step_size = step_size
        self.is_val = is_val
        self.stack = stack
        self.random_offset = random_offset

    def frame_indices(self, video: int, rng: np.random.Generator) -> np.ndarray:
        """Which stored frames make the clip of a video (repeats = padding)."""
        n = int(self.index.count[video])
        span = self.num_frames * self.step_size if self.num_frames > 0 else n
        start = 0
        if span < n and self.random_offset and not self.is_val:
            start = int(rng.integers(0, n - span + 1))
        return np.minimum(np.arange(start, start + span, self.step_size), n - 1)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        video = self._check(index)
        rng = self._rng(video)
        stacked = self.index.decode_stack(video, self.frame_indices(video, rng))
        if self.transform is None:
            return (stacked if self.stack else list(stacked)), self._finish_target(video)
        frames = call_transform(self.transform, list(stacked), rng)
        return (np.stack(frames) if self.stack else frames), self._finish_target(video)


class GulpImageDataset(_GulpDataset):
    """The first frame of each item as an H x W x 3 uint8 image, and its label index.

    ``data_path`` and ``storage_options`` as for ``GulpVideoDataset`` (a URL prefix too).
    """

    def __init__(
        self,
        data_path: str | os.PathLike[str],
        is_val: bool = False,
        transform: Callable[..., Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        *,
        seed: int = 0,
        label_key: str = "label",
        label2idx: Label2Idx | Sequence[str] | str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            data_path, transform, target_transform, seed, label_key, label2idx, storage_options
        )
        self.is_val = is_val

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        video = self._check(index)
        image: Any = self.index.decode(video, [0])[0]
        if self.transform is not None:
            image = call_transform(self.transform, image, self._rng(video))
        return image, self._finish_target(video)

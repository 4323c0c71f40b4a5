"""Dataset adapters: what a GulpIngestor turns into chunks.

An adapter knows its items (``len``) and yields, for a slice of them, dicts with ``id`` (unique),
``frames`` (RGB arrays, PIL images or JPEG bytes) and ``meta`` (a JSON-able dict). Adapters with
labels also carry ``label2idx``, which the ingestor writes beside the chunks.
"""

from __future__ import annotations

import gzip
import json
import os
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from kohakuclip.formats import VIDEO_SUFFIXES
from kohakuclip.gulp.frames import GulpError
from kohakuclip.gulp.media import read_image, read_video_frames
from kohakuclip.storage.folder import list_folder

__all__ = [
    "VIDEO_EXTENSIONS",
    "AbstractDatasetAdapter",
    "Custom20BNJsonVideoAdapter",
    "ImageFolderAdapter",
    "ImageListAdapter",
    "JsonVideoAdapter",
    "Label2Idx",
    "VideoFolderAdapter",
    "load_label2idx",
]


VIDEO_EXTENSIONS = VIDEO_SUFFIXES
"""The videos the adapters take: those the shard writer takes (PyAV decodes them all)."""
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif")

Label2Idx = dict[str, int]


class AbstractDatasetAdapter(ABC):
    """Base class of adapters: implement ``iter_data`` and ``__len__``."""

    label2idx: Label2Idx | None = None
    """Label name -> class index, written to ``label2idx.json`` by the ingestor when set."""

    label2idx_derived: bool = False
    """True when ``label2idx`` was made from the items' labels (sorted), not given: ingesting into
    a folder that has a ``label2idx.json`` then keeps that map and numbers new labels after it
    (GulpIO's ``--extend``), and the items' ``idx`` follow."""

    @abstractmethod
    def iter_data(self, slice_element: slice | None = None) -> Iterator[dict[str, Any]]:
        """Yield ``{"id": ..., "frames": [...], "meta": {...}}`` for the items in the slice."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of items."""


def load_label2idx(source: Label2Idx | Sequence[str] | str) -> Label2Idx:
    """A label map from a dict, a list of labels (index = position) or a JSON file of either.

    Values may be strings of integers (the 20BN ``labels.json`` style).
    """
    where = f"{source}: " if isinstance(source, str) else ""
    if isinstance(source, str):
        with open(source, encoding="utf-8") as f:
            try:
                source = json.load(f)
            except ValueError as exc:
                raise GulpError(f"{where}unreadable JSON ({exc})") from exc
    try:
        if isinstance(source, dict):
            return {str(k): int(v) for k, v in source.items()}
        if not isinstance(source, (str, bytes)):
            return {str(label): i for i, label in enumerate(source)}
    except (TypeError, ValueError):
        pass
    raise GulpError(f"{where}a label map is a dict of label -> index or a list of labels")


def _label_map(
    labels: Sequence[str], given: Label2Idx | Sequence[str] | str | None, where: str
) -> Label2Idx:
    label2idx = (
        load_label2idx(given)
        if given is not None
        else {label: i for i, label in enumerate(sorted(set(labels)))}
    )
    missing = sorted(set(labels) - label2idx.keys())
    if missing:
        raise GulpError(f"{where}: labels missing from label2idx: {missing[:5]}")
    return label2idx


def _shuffled(items: list[Any], shuffle: bool, seed: int) -> list[Any]:
    if not shuffle:
        return items
    return [items[i] for i in np.random.default_rng(seed).permutation(len(items))]


def _skip_or_raise(error: GulpError, strict: bool) -> None:
    if strict:
        raise error
    warnings.warn(f"skipped: {error}", stacklevel=3)


class JsonVideoAdapter(AbstractDatasetAdapter):
    """A 20BN-style JSON list of videos (``[{"id": ..., "label"/"template": ...}, ...]``).

    Each video is ``folder/<id>.<ext>`` or the single video file in ``folder/<id>/``; its frames
    are taken at ``frame_rate`` (<= 0: every frame) with the short side resized to
    ``frame_size`` (<= 0: stored size). ``meta`` is the JSON item, with ``label`` set to the
    class (``item[label_name]``), ``idx`` its index and ``fps`` the rate of the stored frames.
    ``label_name`` defaults to ``template`` when every item has one, else ``label``; items
    without any label are stored without one. Videos that cannot be read are skipped with a
    warning (``strict=True`` raises instead).
    """

    def __init__(
        self,
        json_file: str,
        folder: str,
        *,
        shuffle: bool = False,
        frame_size: int = -1,
        frame_rate: float = 8,
        label_name: str | None = None,
        label2idx: Label2Idx | Sequence[str] | str | None = None,
        remove_duplicate_ids: bool = False,
        seed: int = 0,
        strict: bool = False,
    ) -> None:
        if not os.path.isdir(folder):
            raise GulpError(f"{folder}: not a directory")
        self.json_file = json_file
        self.folder = folder
        self.frame_size = frame_size
        self.frame_rate = frame_rate
        self.strict = strict
        items = _read_json_list(json_file)
        self.label_name = label_name or (
            "template" if items and all("template" in i for i in items) else "label"
        )
        with_label = [self.label_name in item for item in items]
        if any(with_label) and not all(with_label):
            raise GulpError(f"{json_file}: some items have no {self.label_name!r}")
        if any(with_label):
            self.label2idx = _label_map(
                [str(i[self.label_name]) for i in items], label2idx, json_file
            )
            self.label2idx_derived = label2idx is None
        self.items = _shuffled(_unique_ids(items, remove_duplicate_ids, json_file), shuffle, seed)

    def __len__(self) -> int:
        return len(self.items)

    def iter_data(self, slice_element: slice | None = None) -> Iterator[dict[str, Any]]:
        for item in self.items[slice_element or slice(None)]:
            id_ = str(item["id"])
            try:
                frames, fps = read_video_frames(
                    self.video_path(id_), self.frame_rate, self.frame_size
                )
            except GulpError as exc:
                _skip_or_raise(exc, self.strict)
                frames, fps = [], 0.0
            meta = dict(item)
            if self.label2idx is not None:
                label = str(item[self.label_name])
                meta.update(label=label, idx=self.label2idx[label])
            meta["fps"] = fps
            yield {"id": id_, "frames": frames, "meta": meta}

    def video_path(self, id_: str) -> str:
        """The video file of an id; GulpError when there is none (or several)."""
        for ext in VIDEO_EXTENSIONS:
            path = os.path.join(self.folder, id_ + ext)
            if os.path.isfile(path):
                return path
        subfolder = os.path.join(self.folder, id_)
        found = list_folder(subfolder, VIDEO_EXTENSIONS) if os.path.isdir(subfolder) else []
        if len(found) != 1:
            what = "no video" if not found else f"{len(found)} videos"
            raise GulpError(
                f"{subfolder}: {what} for id {id_!r} (want {id_}.<ext> or one in {id_}/)"
            )
        return os.path.join(subfolder, found[0])


Custom20BNJsonVideoAdapter = JsonVideoAdapter
"""GulpIO's name for the JSON video adapter."""


def _label_folders(
    input_folder: str, extensions: Sequence[str], what: str
) -> list[tuple[str, str, str]]:
    """(id, path, label) of every file below ``input_folder/<label>/``, id = its path below the
    folder; GulpError when there is none."""
    items = []
    for label in sorted(os.listdir(input_folder)):
        class_dir = os.path.join(input_folder, label)
        if os.path.isdir(class_dir) and not label.startswith("."):
            for rel in list_folder(class_dir, extensions):
                items.append((f"{label}/{rel}", os.path.join(class_dir, rel), label))
    if not items:
        raise GulpError(f"{input_folder}: no {what} in <label>/ subfolders")
    return items


class VideoFolderAdapter(AbstractDatasetAdapter):
    """``input_folder/<label>/**/<video>``: one item per video, id = its path below the folder.

    Frames and ``fps`` as ``JsonVideoAdapter`` takes them (``frame_rate``, ``frame_size``);
    ``meta`` is the label, its index ``idx``, the video's ``path`` and ``fps``. Videos that
    cannot be read are skipped with a warning (``strict=True`` raises instead).
    """

    label2idx: Label2Idx

    def __init__(
        self,
        input_folder: str,
        *,
        file_extensions: Sequence[str] = VIDEO_EXTENSIONS,
        frame_size: int = -1,
        frame_rate: float = 8,
        shuffle: bool = False,
        seed: int = 0,
        label2idx: Label2Idx | Sequence[str] | str | None = None,
        strict: bool = False,
    ) -> None:
        if not os.path.isdir(input_folder):
            raise GulpError(f"{input_folder}: not a directory")
        self.frame_size = frame_size
        self.frame_rate = frame_rate
        self.strict = strict
        items = _label_folders(input_folder, file_extensions, "videos")
        self.label2idx = _label_map([label for _, _, label in items], label2idx, input_folder)
        self.label2idx_derived = label2idx is None
        self.items = _shuffled(items, shuffle, seed)

    def __len__(self) -> int:
        return len(self.items)

    def iter_data(self, slice_element: slice | None = None) -> Iterator[dict[str, Any]]:
        for id_, path, label in self.items[slice_element or slice(None)]:
            try:
                frames, fps = read_video_frames(path, self.frame_rate, self.frame_size)
            except GulpError as exc:
                _skip_or_raise(exc, self.strict)
                frames, fps = [], 0.0
            meta = {"label": label, "idx": self.label2idx[label], "path": path, "fps": fps}
            yield {"id": id_, "frames": frames, "meta": meta}


def _read_json_list(path: str) -> list[dict[str, Any]]:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            items = json.load(f)
    except (OSError, ValueError) as exc:
        raise GulpError(f"{path}: unreadable JSON ({exc})") from exc
    if not isinstance(items, list) or not all(isinstance(i, dict) and "id" in i for i in items):
        raise GulpError(f"{path}: expected a JSON list of objects with an 'id'")
    return items


def _unique_ids(items: list[Any], remove_duplicates: bool, where: str) -> list[Any]:
    seen: set[str] = set()
    out = []
    for item in items:
        id_ = str(item["id"] if isinstance(item, dict) else item[0])
        if id_ in seen:
            if not remove_duplicates:
                raise GulpError(
                    f"{where}: duplicate id {id_!r} (pass remove_duplicate_ids=True, on the "
                    "command line --remove_duplicate_ids, to keep the first)"
                )
            continue
        seen.add(id_)
        out.append(item)
    return out


class _ImageAdapter(AbstractDatasetAdapter):
    """Items (id, path, label); each yields one frame."""

    label2idx: Label2Idx

    def __init__(
        self,
        items: list[tuple[str, str, str]],
        where: str,
        image_size: int,
        shuffle: bool,
        seed: int,
        label2idx: Label2Idx | Sequence[str] | str | None,
        strict: bool,
    ) -> None:
        self.image_size = image_size
        self.strict = strict
        self.label2idx = _label_map([label for _, _, label in items], label2idx, where)
        self.label2idx_derived = label2idx is None
        self.items = _shuffled(items, shuffle, seed)

    def __len__(self) -> int:
        return len(self.items)

    def iter_data(self, slice_element: slice | None = None) -> Iterator[dict[str, Any]]:
        for id_, path, label in self.items[slice_element or slice(None)]:
            try:
                frames = [read_image(path, self.image_size)]
            except GulpError as exc:
                _skip_or_raise(exc, self.strict)
                frames = []
            meta = {"label": label, "idx": self.label2idx[label], "path": path}
            yield {"id": id_, "frames": frames, "meta": meta}


class ImageFolderAdapter(_ImageAdapter):
    """``input_folder/<label>/**/<image>``: one item per image, id = its path below the folder."""

    def __init__(
        self,
        input_folder: str,
        *,
        file_extensions: Sequence[str] = IMAGE_EXTENSIONS,
        image_size: int = -1,
        shuffle: bool = False,
        seed: int = 0,
        label2idx: Label2Idx | Sequence[str] | str | None = None,
        strict: bool = False,
    ) -> None:
        if not os.path.isdir(input_folder):
            raise GulpError(f"{input_folder}: not a directory")
        items = _label_folders(input_folder, file_extensions, "images")
        super().__init__(items, input_folder, image_size, shuffle, seed, label2idx, strict)


class ImageListAdapter(_ImageAdapter):
    """A text file of ``path, label`` lines (paths relative to ``root_folder``); id = the path."""

    def __init__(
        self,
        input_file: str,
        *,
        root_folder: str = "",
        image_size: int = -1,
        shuffle: bool = False,
        seed: int = 0,
        label2idx: Label2Idx | Sequence[str] | str | None = None,
        remove_duplicate_ids: bool = False,
        strict: bool = False,
    ) -> None:
        items = []
        with open(input_file, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                path, sep, label = line.rstrip("\n").rpartition(",")
                if not sep or not path.strip() or not label.strip():
                    raise GulpError(f"{input_file}:{number}: expected 'path, label'")
                path = path.strip()
                items.append((path, os.path.join(root_folder, path), label.strip()))
        items = _unique_ids(items, remove_duplicate_ids, input_file)
        super().__init__(items, input_file, image_size, shuffle, seed, label2idx, strict)

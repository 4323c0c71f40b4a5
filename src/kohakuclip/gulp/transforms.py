"""GulpIO-style augmentations on numpy frames (H x W x C), with OpenCV.

Image transforms take one frame; video transforms take a clip (a list of frames or a T x H x W x C
array, returned in the same kind) and apply the same geometry to every frame. Sizes are an int
(square) or ``(w, h)``, as in GulpIO.

Randomness comes from a numpy Generator: pass ``rng=`` when calling (the datasets pass one
seeded per item), or each random transform uses its own, seeded by ``seed``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import cv2
import numpy as np

__all__ = [
    "CenterCrop",
    "Compose",
    "ComposeVideo",
    "JitterCrop",
    "JitterCropVideo",
    "Normalize",
    "RandHorFlipVideo",
    "RandVerFlipVideo",
    "RandomCrop",
    "RandomCropVideo",
    "Scale",
    "UnitNorm",
    "call_transform",
]


Size = int | tuple[int, int]
Clip = list[np.ndarray] | np.ndarray


def _wh(size: Size) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    w, h = size
    return int(w), int(h)


def _each(clip: Clip, fn: Callable[[np.ndarray], np.ndarray]) -> Clip:
    """Apply ``fn`` to every frame; a list stays a list, an array is stacked back."""
    frames = [fn(frame) for frame in clip]
    return np.stack(frames) if isinstance(clip, np.ndarray) else frames


def _pad(image: np.ndarray, padding: int) -> np.ndarray:
    if padding <= 0:
        return image
    return cv2.copyMakeBorder(
        image, padding, padding, padding, padding, cv2.BORDER_CONSTANT, value=0
    )


class Transform:
    """Base class: ``t(x)`` or ``t(x, rng=generator)``; subclasses implement ``apply``."""

    def __init__(self, seed: int = 0) -> None:
        self._rng = np.random.default_rng(seed)

    def __call__(self, x: Any, rng: np.random.Generator | None = None) -> Any:
        return self.apply(x, self._rng if rng is None else rng)

    def apply(self, x: Any, rng: np.random.Generator) -> Any:
        raise NotImplementedError


def call_transform(t: Callable[..., Any], x: Any, rng: np.random.Generator) -> Any:
    """Call a transform with ``rng`` if it is one of ours, plainly otherwise."""
    return t(x, rng=rng) if isinstance(t, Transform) else t(x)


class Compose(Transform):
    """Apply transforms in order (one generator feeds them all)."""

    def __init__(self, transforms: Sequence[Callable[..., Any]]) -> None:
        super().__init__()
        self.transforms = list(transforms)

    def apply(self, x: Any, rng: np.random.Generator) -> Any:
        for t in self.transforms:
            x = call_transform(t, x, rng)
        return x


class ComposeVideo(Transform):
    """Per-frame ``img_transforms`` on each frame, then ``video_transforms`` on the clip.

    Every frame's image transforms get a generator in the same state, so random image
    transforms (e.g. RandomCrop) also take the same geometry on every frame of a clip.
    """

    def __init__(
        self,
        img_transforms: Sequence[Callable[..., Any]] = (),
        video_transforms: Sequence[Callable[..., Any]] = (),
    ) -> None:
        super().__init__()
        self.img_transforms = list(img_transforms)
        self.video_transforms = list(video_transforms)

    def apply(self, clip: Clip, rng: np.random.Generator) -> Clip:
        if self.img_transforms:
            frame_seed = int(rng.integers(2**63))

            def per_frame(frame: np.ndarray) -> np.ndarray:
                frame_rng = np.random.default_rng(frame_seed)
                for t in self.img_transforms:
                    frame = call_transform(t, frame, frame_rng)
                return frame

            clip = _each(clip, per_frame)
        for t in self.video_transforms:
            clip = call_transform(t, clip, rng)
        return clip


class Scale(Transform):
    """Resize: an int sets the short side (aspect kept), ``(w, h)`` sets both.

    Shrinking to half or less uses OpenCV's area filter (antialiased); anything else uses
    ``interpolation`` (a mild shrink barely aliases, and the area filter is ~5x slower there).
    """

    def __init__(self, size: Size, interpolation: int = cv2.INTER_LINEAR) -> None:
        super().__init__()
        self.size = size
        self.interpolation = interpolation

    def apply(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        h, w = image.shape[:2]
        if isinstance(self.size, int):
            scale = self.size / min(h, w)
            out_w, out_h = max(1, round(w * scale)), max(1, round(h * scale))
            out_w, out_h = (self.size, out_h) if w <= h else (out_w, self.size)
        else:
            out_w, out_h = _wh(self.size)
        if (out_w, out_h) == (w, h):
            return image
        strong_shrink = 2 * out_w <= w and 2 * out_h <= h
        interpolation = cv2.INTER_AREA if strong_shrink else self.interpolation
        return cv2.resize(image, (out_w, out_h), interpolation=interpolation)


class CenterCrop(Transform):
    """The central ``size`` window; an image smaller than it is first enlarged to cover it."""

    def __init__(self, size: Size) -> None:
        super().__init__()
        self.size = _wh(size)

    def apply(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        tw, th = self.size
        h, w = image.shape[:2]
        if w < tw or h < th:
            scale = max(tw / w, th / h)
            image = cv2.resize(image, (max(tw, round(w * scale)), max(th, round(h * scale))))
            h, w = image.shape[:2]
        x, y = (w - tw) // 2, (h - th) // 2
        return image[y : y + th, x : x + tw]


def _random_window(h: int, w: int, tw: int, th: int, rng: np.random.Generator) -> tuple[int, int]:
    if tw > w or th > h:
        raise ValueError(f"crop {tw}x{th} is larger than the {w}x{h} frame")
    return int(rng.integers(0, w - tw + 1)), int(rng.integers(0, h - th + 1))


class RandomCrop(Transform):
    """A ``size`` window at a random place, after zero ``padding`` on every border."""

    def __init__(self, size: Size, padding: int = 0, *, seed: int = 0) -> None:
        super().__init__(seed)
        self.size = _wh(size)
        self.padding = padding

    def apply(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        image = _pad(image, self.padding)
        tw, th = self.size
        x, y = _random_window(image.shape[0], image.shape[1], tw, th, rng)
        return image[y : y + th, x : x + tw]


class RandomCropVideo(RandomCrop):
    """RandomCrop with one window for every frame of the clip."""

    def apply(self, clip: Clip, rng: np.random.Generator) -> Clip:  # type: ignore[override]
        tw, th = self.size
        h, w = clip[0].shape[:2]
        p = max(self.padding, 0)
        x, y = _random_window(h + 2 * p, w + 2 * p, tw, th, rng)
        return _each(clip, lambda f: _pad(f, self.padding)[y : y + th, x : x + tw])


class JitterCrop(Transform):
    """A window whose width and height are each drawn from ``sample_sizes`` (capped at the
    frame), at a random place, after zero ``padding``; not resized."""

    def __init__(
        self, sample_sizes: Sequence[int] = (256, 224, 192, 168), padding: int = 0, *, seed: int = 0
    ) -> None:
        super().__init__(seed)
        self.sample_sizes = list(sample_sizes)
        self.padding = padding

    def _window(self, h: int, w: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        tw = min(w, int(rng.choice(self.sample_sizes)))
        th = min(h, int(rng.choice(self.sample_sizes)))
        x, y = _random_window(h, w, tw, th, rng)
        return x, y, tw, th

    def apply(self, image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        image = _pad(image, self.padding)
        x, y, tw, th = self._window(image.shape[0], image.shape[1], rng)
        return image[y : y + th, x : x + tw]


class JitterCropVideo(JitterCrop):
    """JitterCrop with one window for every frame of the clip."""

    def apply(self, clip: Clip, rng: np.random.Generator) -> Clip:  # type: ignore[override]
        h, w = clip[0].shape[:2]
        p = max(self.padding, 0)
        x, y, tw, th = self._window(h + 2 * p, w + 2 * p, rng)
        return _each(clip, lambda f: _pad(f, self.padding)[y : y + th, x : x + tw])


class RandHorFlipVideo(Transform):
    """Mirror every frame left-right, with probability ``p``."""

    axis = 1

    def __init__(self, p: float = 0.5, *, seed: int = 0) -> None:
        super().__init__(seed)
        self.p = p

    def apply(self, clip: Clip, rng: np.random.Generator) -> Clip:
        if rng.random() >= self.p:
            return clip
        return _each(clip, lambda f: np.ascontiguousarray(np.flip(f, self.axis)))


class RandVerFlipVideo(RandHorFlipVideo):
    """Flip every frame upside down, with probability ``p``."""

    axis = 0


class Normalize(Transform):
    """``(x - mean) / std`` per channel (last axis), as float32; a list is done item by item."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        super().__init__()
        self.mean = np.asarray(mean, np.float32)
        self.std = np.asarray(std, np.float32)

    def apply(self, x: Any, rng: np.random.Generator) -> Any:
        if isinstance(x, list):
            return [self.apply(item, rng) for item in x]
        return (np.asarray(x, np.float32) - self.mean) / self.std


class UnitNorm(Transform):
    """Instance-wise ``(x - mean) / std`` over every value of the input, as float32 (a list is
    done item by item; pass a stacked clip for clip-wide statistics)."""

    def apply(self, x: Any, rng: np.random.Generator) -> Any:
        if isinstance(x, list):
            return [self.apply(item, rng) for item in x]
        x = np.asarray(x, np.float32)
        return (x - x.mean()) / (x.std() + 1e-8)

"""Training on a GulpIO directory with numpy batches only: no torch, as GulpIO's loader did.

    python examples/gulp_numpy_loop.py GULP_DIR --epochs 3 --workers 2

The dataset draws a random clip start, crop and flip per item from (seed, epoch, index), the
loader shuffles per epoch and yields (frames uint8 [B, T, H, W, 3], labels int64 [B]); the same
batches come out for any ``--workers``. The model, a softmax regression on each clip's mean
colour, stands in for a real one.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from kohakuclip.gulp.dataset import GulpVideoDataset
from kohakuclip.gulp.loader import DataLoader
from kohakuclip.gulp.transforms import ComposeVideo, RandHorFlipVideo, RandomCropVideo, Scale


def features(frames: np.ndarray) -> np.ndarray:
    """[B, T, H, W, 3] uint8 -> [B, 4]: mean colour in [0, 1] and a bias term."""
    mean = frames.reshape(len(frames), -1, 3).mean(axis=1) / 255.0
    return np.concatenate([mean, np.ones((len(frames), 1))], axis=1)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gulp_dir")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--frames", type=int, default=4)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--lr", type=float, default=0.5)
    args = ap.parse_args(argv)

    transform = ComposeVideo(
        img_transforms=[Scale(args.size)],
        video_transforms=[RandomCropVideo(args.size), RandHorFlipVideo()],
    )
    dataset = GulpVideoDataset(
        args.gulp_dir, args.frames, step_size=1, is_val=False, transform=transform, seed=0
    )
    loader = DataLoader(
        dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, seed=0
    )
    classes = len(dataset.label2idx)
    weights = np.zeros((4, classes))
    for epoch in range(args.epochs):
        losses = []
        for frames, labels in loader:
            x = features(frames)
            logits = x @ weights
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            losses.append(-np.log(p[np.arange(len(labels)), labels] + 1e-12).mean())
            p[np.arange(len(labels)), labels] -= 1.0
            weights -= args.lr * x.T @ p / len(labels)
        print(f"epoch {epoch}: {len(losses)} batches, loss {np.mean(losses):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

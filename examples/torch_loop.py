"""A plain PyTorch training loop on kohakuclip batches, with checkpoints and exact resume.

    python examples/torch_loop.py SHARD [SHARD ...] --steps 200 --checkpoint run.pt
    python examples/torch_loop.py SHARD [SHARD ...] --steps 400 --checkpoint run.pt  # resumes

The checkpoint holds the model, the optimiser and the loader state (the seed and the global
samples consumed), so a resumed run trains on exactly the batches the uninterrupted run would
have seen (also with another ``--batch-size``: the run continues the same stream of samples).
The toy task (predict each clip's mean colour) stands in for a real model.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch
from torch import nn

from kohakuclip.torch import ClipDataset, ClipLoader


class TinyVideoNet(nn.Module):
    """A 3D convolution, global pooling and a linear head: [B, T, 3, S, S] -> [B, 3]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv3d(3, 8, kernel_size=3, stride=2, padding=1)
        self.head = nn.Linear(8, 3)

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(video.transpose(1, 2)))  # to [B, 3, T, S, S]
        return self.head(x.mean(dim=(2, 3, 4)))


def save_checkpoint(path: str, state: dict) -> None:
    """Write to a temporary name and rename: a crash never leaves a half-written checkpoint."""
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def train(
    sources: Sequence[str],
    steps: int,
    checkpoint: str,
    save_every: int = 50,
    workers: int = 0,
    threads: int | None = None,
    batch_size: int = 16,
    frames: int = 8,
    fps: float | None = 6.0,
    size: int = 128,
    seed: int = 0,
) -> list[float]:
    """Train until ``steps`` (resuming from ``checkpoint`` if it exists); returns the new losses."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    model = TinyVideoNet().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dataset = ClipDataset(
        list(sources),
        batch_size,
        frames=frames,
        fps=fps,
        seed=seed,
        threads=threads,
        size=size,
        hflip=0.5,
    )
    loader = ClipLoader(dataset, workers=workers)
    step = 0
    if os.path.exists(checkpoint):
        state = torch.load(checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        step = state["step"]
        print(f"resumed at step {step}")
    losses: list[float] = []
    batches = iter(loader)  # endless: one batch per step
    while step < steps:
        video = next(batches)
        video = video.to(device, non_blocking=True).float() / 127.5 - 1
        target = video.mean(dim=(1, 3, 4))  # mean colour per clip: [B, 3]
        loss = nn.functional.mse_loss(model(video), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        step += 1
        losses.append(loss.item())
        print(f"step {step} loss {losses[-1]:.6f}")
        if step % save_every == 0 or step == steps:
            state = {
                "step": step,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "loader": loader.state_dict(),
            }
            save_checkpoint(checkpoint, state)
    loader.close()
    return losses


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="shards (zip / tar) or folders of mp4 files")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--checkpoint", default="torch_loop.pt")
    parser.add_argument("--save-every", type=int, default=50)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--threads", type=int, default=None, help="decode threads per process")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--fps", type=float, default=6.0)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    train(
        args.sources,
        args.steps,
        args.checkpoint,
        args.save_every,
        args.workers,
        args.threads,
        args.batch_size,
        args.frames,
        args.fps,
        args.size,
        args.seed,
    )


if __name__ == "__main__":
    main()

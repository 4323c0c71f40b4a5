"""PyTorch Lightning on kohakuclip batches: DDP over several processes and resume with ckpt_path.

    python examples/lightning_module.py SHARD [SHARD ...] --devices 2 --steps 1000
    python examples/lightning_module.py SHARD [SHARD ...] --devices 2 --steps 2000 \\
        --resume checkpoints/last.ckpt

Each DDP rank takes its own block of one global sample stream (the rank comes from
torch.distributed), so no sampler is involved. Lightning saves the loader's state (rank 0's) in
every checkpoint and restores it with ckpt_path, also on another number of devices or another
``--batch-size``: the run continues the same stream of samples.
By default the stream is endless and ``--steps`` bounds training; Lightning then fetches one batch
ahead of the one it trains on, hence ``lookahead=1``. With ``--epoch-batches N`` the loader has a
length (N batches per epoch, ``--epochs`` of them) and Lightning fetches nothing ahead
(``lookahead=0``). ``--trace FILE`` appends, per rank and step, the epoch, a checksum of the batch,
the loss and per clip its global sample index and checksum (to check that a resumed run sees
what a straight one would).
"""

from __future__ import annotations

import argparse
import zlib
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from kohakuclip.torch import ClipDataset, ClipLoader


class VideoModule(L.LightningModule):
    """A toy video model (predicts each clip's mean colour) standing in for a real one."""

    def __init__(self, lr: float = 1e-3, trace: str | None = None) -> None:
        super().__init__()
        self.lr = lr
        self.trace = trace
        self.conv = nn.Conv3d(3, 8, kernel_size=3, stride=2, padding=1)
        self.head = nn.Linear(8, 3)

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv(video.transpose(1, 2)))  # [B, T, 3, S, S] -> [B, 3, T, S, S]
        return self.head(x.mean(dim=(2, 3, 4)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        clips, meta = batch if isinstance(batch, (tuple, list)) else (batch, None)
        video = clips.float() / 127.5 - 1
        loss = nn.functional.mse_loss(self(video), video.mean(dim=(1, 3, 4)))
        self.log("loss", loss, prog_bar=True)
        if self.trace and meta is not None:
            pixels = clips.cpu().numpy()
            checksum = zlib.crc32(pixels.tobytes())
            per_clip = " ".join(
                f"{g}:{zlib.crc32(clip.tobytes())}" for g, clip in zip(meta["sample"], pixels)
            )
            with open(self.trace, "a") as f:
                f.write(
                    f"{self.global_rank} {self.global_step} {self.current_epoch} {checksum} "
                    f"{loss.item():.8f} {per_clip}\n"
                )
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="+", help="shards (zip / tar) or folders of mp4 files")
    parser.add_argument("--steps", type=int, default=1000, help="for the endless stream")
    parser.add_argument("--epoch-batches", type=int, default=None, help="batches per epoch")
    parser.add_argument("--epochs", type=int, default=1, help="with --epoch-batches")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    parser.add_argument("--threads", type=int, default=None, help="decode threads per process")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--fps", type=float, default=6.0)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoints", default="checkpoints")
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--resume", default=None, help="a checkpoint to continue from")
    parser.add_argument("--trace", default=None, help="append rank, step, checksum, loss here")
    args = parser.parse_args(argv)

    L.seed_everything(args.seed, workers=False)
    dataset = ClipDataset(
        args.sources,
        args.batch_size,
        frames=args.frames,
        fps=args.fps,
        seed=args.seed,
        threads=args.threads,
        size=args.size,
        hflip=0.5,
        with_meta=args.trace is not None,  # the trace names each clip's sample
    )
    epochs = args.epoch_batches is not None
    lookahead = 0 if epochs else 1  # Lightning fetches ahead only when the length is unknown
    loader = ClipLoader(
        dataset, workers=args.workers, lookahead=lookahead, batches=args.epoch_batches
    )
    checkpoints = ModelCheckpoint(
        dirpath=args.checkpoints,
        filename="step{step}",
        every_n_train_steps=args.save_every,
        save_top_k=-1,
        save_last=True,
        auto_insert_metric_name=False,
    )
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_steps=-1 if epochs else args.steps,
        max_epochs=args.epochs if epochs else -1,
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(VideoModule(trace=args.trace), train_dataloaders=loader, ckpt_path=args.resume)


if __name__ == "__main__":
    main()

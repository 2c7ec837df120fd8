"""A small byte-level language model trained with PyTorch Lightning.

It predicts each byte of a text (this repository's README by default) from the bytes before
it, checkpoints with ModelCheckpoint every --ckpt_every steps and validates on held-out text.
Lightning's own strings come straight from the command line: --accelerator (cpu, cuda, mps),
--devices, --precision (32-true, bf16-mixed, 16-mixed).

On its own:
    python examples/lightning/train.py --out /tmp/lit --max_steps 200

Under cockpit (the device preset fills accelerator, precision, batch and accumulation):
    cockpit run -d cpu -- python examples/lightning/train.py --out {run_dir}/out \\
        --accelerator {device} --precision {lightning_precision} \\
        --batch_size {batch_size} --accumulate {accumulation} --max_steps 200

`CockpitCallback` reports steps, validations and checkpoints to cockpit and does nothing
outside it; --no_callback leaves it out (cockpit then reads Lightning's progress bar).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.nn import functional as F

README = Path(__file__).resolve().parents[2] / "README.md"


class Bytes(torch.utils.data.Dataset):
    """(the `context` bytes before a position, the byte at it) for every position of a text."""

    def __init__(self, data: bytes, context: int):
        self.data = torch.tensor(list(data), dtype=torch.long)
        self.context = context

    def __len__(self):
        return len(self.data) - self.context

    def __getitem__(self, i):
        return self.data[i:i + self.context], self.data[i + self.context]


class ByteModel(L.LightningModule):
    def __init__(self, context: int = 16, hidden: int = 128, lr: float = 3e-3):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(256, 32)
        self.mlp = nn.Sequential(nn.Linear(context * 32, hidden), nn.GELU(), nn.Linear(hidden, 256))

    def forward(self, x):
        return self.mlp(self.embed(x).flatten(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--text_file", default=str(README))
    p.add_argument("--out", default="lightning_out", help="checkpoints and logs")
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--devices", default="1")
    p.add_argument("--precision", default="32-true")
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--max_steps", type=int, default=300)
    p.add_argument("--ckpt_every", type=int, default=50, help="optimizer steps between checkpoints")
    p.add_argument("--val_every", type=int, default=50, help="batches between validations")
    p.add_argument("--ckpt_path", default=None, help="resume from this checkpoint")
    p.add_argument("--no_callback", action="store_true", help="do not report to cockpit")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    L.seed_everything(args.seed, verbose=False)
    data = Path(args.text_file).read_bytes()
    split = len(data) * 9 // 10
    model = ByteModel()
    train = torch.utils.data.DataLoader(Bytes(data[:split], model.hparams.context),
                                        batch_size=args.batch_size, shuffle=True)
    val = torch.utils.data.DataLoader(Bytes(data[split:], model.hparams.context), batch_size=256)
    callbacks = [ModelCheckpoint(dirpath=Path(args.out) / "checkpoints", save_top_k=-1,
                                 every_n_train_steps=args.ckpt_every)]
    if not args.no_callback:
        from cockpit.integrations.lightning import CockpitCallback

        callbacks.append(CockpitCallback())
    trainer = L.Trainer(accelerator=args.accelerator, devices=int(args.devices),
                        precision=args.precision, max_steps=args.max_steps,
                        accumulate_grad_batches=args.accumulate, val_check_interval=args.val_every,
                        limit_val_batches=4, log_every_n_steps=10, callbacks=callbacks,
                        default_root_dir=args.out, logger=False, enable_model_summary=False)
    trainer.fit(model, train, val, ckpt_path=args.ckpt_path)
    # A run resumed past its last validation has validated nothing in this process.
    val = trainer.callback_metrics.get("val_loss")
    print(f"done: step {trainer.global_step}" + (f" val_loss {val:.4f}" if val is not None else ""))


if __name__ == "__main__":
    main()

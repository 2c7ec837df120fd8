"""A plain PyTorch training script that knows nothing of cockpit: cockpit runs it unmodified.

A small MLP learns a fixed random linear map (plus noise) on synthetic data drawn from the
seed. It does what careful scripts do: gradient accumulation, a tqdm bar, atomic checkpoints
with the RNG state, --resume, and a checkpoint on Ctrl-C.

    python examples/command/train.py --steps 300 --out /tmp/run
    python examples/command/train.py --out /tmp/run --resume /tmp/run/ckpt-000150.pt

Its pieces are functions so that train_reported.py can reuse them.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

D_IN, D_OUT, HIDDEN = 16, 4, 64
SAMPLES, HELD_OUT = 4096, 512
POSTFIX_EVERY = 10  # .item() waits for the device: only when the bar shows the loss


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bs", type=int, default=32, help="micro-batch size")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--device", default="cpu", help="cpu, cuda or mps")
    p.add_argument("--out", default="./out", help="where checkpoints go")
    p.add_argument("--resume", metavar="PATH", help="a checkpoint to continue from")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps in all")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-every", type=int, default=50, help="optimizer steps between checkpoints")
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step")
    return p.parse_args(argv)


def make_data(seed: int):
    """(x, y, x_val, y_val) on the CPU. Drawn from the seed alone, so a resumed run (even with
    another batch size or device) trains on the same data."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(D_IN, D_OUT, generator=g)
    x = torch.randn(SAMPLES + HELD_OUT, D_IN, generator=g)
    y = x @ w + 0.1 * torch.randn(SAMPLES + HELD_OUT, D_OUT, generator=g)
    return x[:SAMPLES], y[:SAMPLES], x[SAMPLES:], y[SAMPLES:]


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, D_OUT))


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=lr)


def sampler(seed: int) -> torch.Generator:
    """Draws the batches; its state goes into checkpoints so a resume sees the batches that
    would have come next."""
    return torch.Generator().manual_seed(seed + 1)


def train_step(model, optimizer, x, y, bs: int, accum: int, gen: torch.Generator,
               device: torch.device) -> torch.Tensor:
    """One optimizer step over `accum` micro-batches of `bs`; the mean loss, left on the device."""
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=device)
    for _ in range(accum):
        idx = torch.randint(len(x), (bs,), generator=gen)
        loss = nn.functional.mse_loss(model(x[idx].to(device)), y[idx].to(device))
        # Divided by accum: the summed gradients are those of one batch of bs * accum.
        (loss / accum).backward()
        total += loss.detach() / accum
    optimizer.step()
    return total


@torch.no_grad()
def evaluate(model, x_val, y_val, device: torch.device) -> float:
    """The mean loss on the held-out samples."""
    model.eval()
    loss = nn.functional.mse_loss(model(x_val.to(device)), y_val.to(device)).item()
    model.train()
    return loss


def save_checkpoint(out: Path, step: int, model, optimizer, gen: torch.Generator) -> Path:
    """OUT/ckpt-{step:06d}.pt, written to a temporary file and renamed: a crash mid-save
    leaves the previous checkpoints whole, never a torn one under the final name."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"ckpt-{step:06d}.pt"
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "rng": {"torch": torch.get_rng_state(), "sampler": gen.get_state()}}, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path, model, optimizer, gen: torch.Generator) -> int:
    """Restores a checkpoint into these objects; the step to continue at. Loaded onto the CPU
    first, so a run can resume on another device than the one that saved it."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    gen.set_state(state["rng"]["sampler"])
    return int(state["step"])


def setup(args: argparse.Namespace):
    """Data, model, optimizer and batch sampler, resumed from --resume when given; prints the
    held-out loss it starts from ("step N: val_loss X", a line cockpit reads as an eval)."""
    device = torch.device(args.device)
    x, y, x_val, y_val = make_data(args.seed)
    model = make_model(args.seed).to(device)
    optimizer = make_optimizer(model, args.lr)
    gen = sampler(args.seed)
    start = 0
    if args.resume:
        start = load_checkpoint(args.resume, model, optimizer, gen)
        print(f"resumed from {args.resume} at step {start}", flush=True)
    print(f"step {start}: val_loss {evaluate(model, x_val, y_val, device):.4f}", flush=True)
    return device, (x, y, x_val, y_val), model, optimizer, gen, start


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    device, (x, y, x_val, y_val), model, optimizer, gen, start = setup(args)

    step, loss = start, None
    bar = tqdm(range(start, args.steps), initial=start, total=args.steps)
    try:
        for i in bar:
            loss = train_step(model, optimizer, x, y, args.bs, args.accum, gen, device)
            step = i + 1  # optimizer steps completed
            if step % POSTFIX_EVERY == 0 or step == args.steps:
                # refresh=False: shown at the bar's next redraw, beside the step it belongs to
                lr = optimizer.param_groups[0]["lr"]
                bar.set_postfix(loss=loss.item(), lr=lr, refresh=False)
            if step % args.ckpt_every == 0:
                save_checkpoint(out, step, model, optimizer, gen)
            if args.step_delay:
                time.sleep(args.step_delay)
    except KeyboardInterrupt:
        # Ctrl-C (or a supervisor's SIGINT): keep the work done so far, then stop.
        bar.close()
        path = save_checkpoint(out, step, model, optimizer, gen)
        print(f"interrupted: saved {path} at step {step}", file=sys.stderr, flush=True)
        return 130
    bar.close()
    if step % args.ckpt_every:  # the last step's checkpoint, unless the loop just wrote it
        save_checkpoint(out, step, model, optimizer, gen)
    print(f"step {step}: val_loss {evaluate(model, x_val, y_val, device):.4f}")
    trained = "" if loss is None else f" loss {loss.item():.4f}"  # None: resumed at the end
    print(f"done: step {step}{trained}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A script shaped like PyTorch Lightning's `Trainer.fit` with its RichProgressBar and no cockpit
callback, printing what they print: the accelerator lines and the model summary, then Rich's
live display on stdout (one frame per batch: `Epoch 0/-2 ━━━━╸━━━ 12/40 0:00:01 • 0:00:03
12.06it/s v_num: 0 train_loss: 1.230 val_loss: 1.500`, in Lightning's theme colours, each frame
erasing the last with Rich's cursor controls; a Validation row below it at each epoch's end),
accumulate_grad_batches (optimizer steps = batches / accumulation), ModelCheckpoint's
`epoch=E-step=S.ckpt` every N optimizer steps (the last one kept), `--ckpt_path`, and
"`Trainer.fit` stopped: `max_steps=N` reached.". Torch only; writes OUT/truth.json.

    python lightning.py --out DIR --max_steps 60 --accumulate_grad_batches 2 --batch_size 4
"""

import argparse
import glob
import os
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

from shapetruth import Truth

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--max_steps", type=int, default=60)
p.add_argument("--accumulate_grad_batches", type=int, default=2)
p.add_argument("--batch_size", type=int, default=4)
p.add_argument("--accelerator", default="cpu")
p.add_argument("--ckpt_path", default=None)
p.add_argument("--every_n_train_steps", type=int, default=20)
p.add_argument("--step_delay", type=float, default=0.015, help="sleep per batch")
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
accum, bs = args.accumulate_grad_batches, args.batch_size
N = 40                                     # training batches per epoch
x = torch.randn(N * bs, 8, generator=torch.Generator().manual_seed(1))
y = x @ torch.linspace(-1, 1, 8) + 0.1 * torch.randn(N * bs, generator=torch.Generator().manual_seed(2))
vx, vy = x[:5 * bs] + 0.05, y[:5 * bs]     # 5 validation batches
model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

# Rich, as Lightning's RichProgressBarTheme colours it
WHITE, PURPLE, DIM, GREY54, GREY70 = "\x1b[37m", "\x1b[38;2;98;6;224m", "\x1b[38;5;237m", "\x1b[38;5;245m", "\x1b[38;5;249m"
END = "\x1b[0m"
WIDTH = 40
live_height = 0


def clock(s):
    s = int(s)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def row(desc, n, total, started, metrics=""):
    elapsed = time.time() - started
    speed = n / elapsed if elapsed > 0 and n else 0.0
    left = clock((total - n) / speed) if speed else "-:--:--"
    done = WIDTH * n / total
    full = int(done)
    half = "╸" if done - full >= 0.5 and full < WIDTH else ""
    rest = WIDTH - full - len(half)
    bar = f"{PURPLE}{'━' * full}{half}{END}" + (f"{DIM}{'━' * rest}{END}" if rest else "")
    text = (f"{WHITE}{desc:<10}{END} {bar} {WHITE}{n}/{total}{END} {GREY54}{clock(elapsed)} • {left}{END} "
            f"{GREY70}{speed:.2f}it/s{END}")
    return text + (f" {WHITE}{metrics}{END}" if metrics else "")


def frame(*rows):
    """Rich's Live refresh: back over the last frame (carriage return, erase, cursor up), then
    the new one; no newline until the display stops."""
    global live_height
    back = "\r\x1b[2K" + "\x1b[1A\x1b[2K" * (live_height - 1) if live_height else "\x1b[?25l"
    sys.stdout.write(back + "\n".join(rows))
    sys.stdout.flush()
    live_height = len(rows)


def stop_live():
    sys.stdout.write("\n\x1b[?25h")
    sys.stdout.flush()


global_step, epoch, start_batch = 0, 0, 0
print("GPU available: False, used: False", file=sys.stderr)
print("TPU available: False, using: 0 TPU cores", file=sys.stderr)
print("HPU available: False, using: 0 HPUs", file=sys.stderr, flush=True)
if args.ckpt_path:
    print(f"Restoring states from the checkpoint path at {args.ckpt_path}", file=sys.stderr, flush=True)
    state = torch.load(args.ckpt_path)
    model.load_state_dict(state["state_dict"])
    optimizer.load_state_dict(state["optimizer_states"][0])
    global_step = state["global_step"]
    epoch, start_batch = divmod(global_step * accum, N)
print(f"\n  | Name | Type   | Params | Mode \n----------------------------------------\n"
      f"0 | net  | Linear | 9      | train\n----------------------------------------\n"
      f"9         Trainable params\n0         Non-trainable params\n9         Total params\n"
      f"0.000     Total estimated model params size (MB)\n", flush=True)
if args.ckpt_path:
    print(f"Restored all states from the checkpoint at {args.ckpt_path}", file=sys.stderr, flush=True)
truth = Truth(args.out, "lightning", total=args.max_steps, samples_per_step=bs * accum,
              tokens_per_step=None, first_index=1, resumed_from=global_step, eval_name="val_loss")


def validate(train_row=None):
    started = time.time()
    losses = []
    with torch.no_grad():
        for i in range(5):
            losses.append(F.mse_loss(model(vx[i * bs:(i + 1) * bs]).squeeze(-1), vy[i * bs:(i + 1) * bs]).item())
            desc = "Validation" if train_row else "Sanity Checking"
            frame(*([train_row] if train_row else []), row(desc, i + 1, 5, started))
    return sum(losses) / len(losses)


if not args.ckpt_path:
    validate()            # the sanity check: two batches in Lightning, five here, then erased
    frame("")
metrics = {"v_num": 0}
while global_step < args.max_steps:
    started = time.time()
    desc = f"Epoch {epoch}/-2"   # max_epochs -1 (max_steps given): Lightning shows max_epochs - 1
    for b in range(start_batch, N):
        loss = F.mse_loss(model(x[b * bs:(b + 1) * bs]).squeeze(-1), y[b * bs:(b + 1) * bs])
        (loss / accum).backward()
        time.sleep(args.step_delay)
        stepped = (b + 1) % accum == 0
        if stepped:
            optimizer.step()
            optimizer.zero_grad()
            global_step += 1
        metrics["train_loss"] = float(f"{loss.item():.3f}")
        shown = " ".join(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}" for k, v in metrics.items())
        with truth.shown(global_step if global_step > truth.attempt["resumed_from"] else None,
                         loss=metrics["train_loss"]):
            frame(row(desc, b + 1, N, started, shown))
        if stepped and global_step % args.every_n_train_steps == 0:
            for old in glob.glob(os.path.join(args.out, "*.ckpt")):
                os.remove(old)     # save_top_k=1: the newest alone is kept
            path = os.path.join(args.out, f"epoch={epoch}-step={global_step}.ckpt")
            torch.save({"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()],
                        "global_step": global_step, "epoch": epoch}, path)
            truth.checkpoint(path, global_step)
        if global_step >= args.max_steps:
            break
    last = row(desc, b + 1, N, started, shown)
    val = validate(last)
    metrics["val_loss"] = float(f"{val:.3f}")
    shown = " ".join(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}" for k, v in metrics.items())
    with truth.shown(eval=metrics["val_loss"]):
        frame(row(desc, b + 1, N, started, shown))
    epoch, start_batch = epoch + 1, 0
stop_live()
print(f"`Trainer.fit` stopped: `max_steps={args.max_steps}` reached.", file=sys.stderr, flush=True)
truth.finished()

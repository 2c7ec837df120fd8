"""A hand-written loop of slow steps under a Rich progress bar laid out as Lightning's (`train
━━━━╸━━━ 4/10 0:00:06 • 0:00:09 0.66it/s loss: 1.43`), live: Rich redraws the same count
several times a second while a step of seconds trains. Its batch and accumulation in its argv
(`--bs 4 --accum 2`: 8 samples a step), a `last.pt` (JSON) rewritten every --save_every steps,
`--resume PATH`. Writes what it did to OUT/truth.json (shapetruth).

    python richbar.py --out DIR --steps 10 --step_s 1.2 --bs 4 --accum 2
"""

import argparse
import json
import os
import random
import time

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from shapetruth import Truth

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=10)
p.add_argument("--step_s", type=float, default=1.2)   # each step's sleep, +-10 % seeded jitter
p.add_argument("--bs", type=int, default=4)
p.add_argument("--accum", type=int, default=2)
p.add_argument("--save_every", type=int, default=2)
p.add_argument("--resume")
args = p.parse_args()

step = 0
if args.resume:
    with open(args.resume) as f:
        step = json.load(f)["step"]
    print(f"resumed from {args.resume} at step {step}", flush=True)
truth = Truth(args.out, "richbar", total=args.steps, samples_per_step=args.bs * args.accum,
              tokens_per_step=None, first_index=1, resumed_from=step)
jitter = random.Random(step)
ckpt = os.path.join(args.out, "last.pt")

columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
           TextColumn("•"), TimeRemainingColumn(), TextColumn("{task.fields[rate]}"),
           TextColumn("loss: {task.fields[loss]}"))
# Rich's default refresh (10 a second): the same count drawn again and again through each step
with Progress(*columns, console=Console(), refresh_per_second=10) as bar:
    task = bar.add_task("train", total=args.steps, completed=step, rate="", loss="-")
    begun = time.time()
    while step < args.steps:
        time.sleep(args.step_s * jitter.uniform(0.9, 1.1))
        loss = round(2.0 / (1.0 + 0.1 * (step + 1)), 4)
        with truth.shown(step + 1, loss=loss):
            step += 1
            done = step - truth.attempt["resumed_from"]
            bar.update(task, completed=step, loss=f"{loss:.4f}",
                       rate=f"{done / (time.time() - begun):.2f}it/s")
            bar.refresh()   # the frame of this step now, as a Rich bar draws on its update
        if step % args.save_every == 0:
            with open(ckpt + ".tmp", "w") as f:
                json.dump({"step": step}, f)
            os.replace(ckpt + ".tmp", ckpt)
            truth.checkpoint(ckpt, step)
truth.finished()
print("done", flush=True)

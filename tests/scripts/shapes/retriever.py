"""A two-tower retriever script shaped like field notes 000/001's train_twotower_v4.py:
`--bs --accum --device --out --resume`, its own gradient accumulation, one line per micro-batch
(`epoch 1 batch 12/48 loss 0.6931`, epochs from 1, as note 001's `batch 927/2244`), recall@10 on
held-out queries after each epoch (`epoch 1 val_loss: 0.61 recall@10: 0.4120`), one `last.pt`
rewritten at each epoch's end. Torch only; writes OUT/truth.json.

    python retriever.py --bs 4 --accum 4 --device cpu --out DIR [--resume DIR/last.pt]
"""

import argparse
import os
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

from shapetruth import Truth

p = argparse.ArgumentParser()
p.add_argument("--bs", type=int, default=4)
p.add_argument("--accum", type=int, default=4)
p.add_argument("--device", default="cpu")
p.add_argument("--out", required=True)
p.add_argument("--resume", default=None)
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--pairs", type=int, default=192)
p.add_argument("--step_delay", type=float, default=0.008, help="sleep per micro-batch")
args = p.parse_args()

sys.stdout.reconfigure(line_buffering=True)
torch.manual_seed(0)
torch.set_num_threads(1)
g = torch.Generator().manual_seed(3)
topics = torch.randn(64, 16, generator=g)
docs = topics + 0.3 * torch.randn(64, 16, generator=g)         # the bank: one doc per topic
which = torch.randint(64, (args.pairs + 32,), generator=g)
queries = topics[which] + 0.8 * torch.randn(len(which), 16, generator=g)
train_q, train_d = queries[:args.pairs], which[:args.pairs]
val_q, val_d = queries[args.pairs:], which[args.pairs:]
N = args.pairs // args.bs                                         # micro-batches per epoch


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.d = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, q, d):
        return F.normalize(self.q(q), dim=-1) @ F.normalize(self.d(d), dim=-1).T / 0.1


model = Tower().to(args.device)
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
start_epoch, step = 1, 0
if args.resume:
    state = torch.load(args.resume)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start_epoch, step = state["epoch"] + 1, state["step"]
    print(f"resumed from {args.resume}: epoch {state['epoch']}, step {step}")
print(f"pairs {args.pairs}, bank {len(docs)}, bs {args.bs} x accum {args.accum}, device {args.device}")
truth = Truth(args.out, "retriever", total=args.epochs * N // args.accum, samples_per_step=args.bs * args.accum,
              tokens_per_step=None, first_index=1, resumed_from=step, eval_name="val_loss",
              main_metric="recall@10")

for epoch in range(start_epoch, args.epochs + 1):
    order = torch.randperm(args.pairs, generator=torch.Generator().manual_seed(epoch))
    for b in range(1, N + 1):
        idx = order[(b - 1) * args.bs:b * args.bs]
        scores = model(train_q[idx], docs)
        loss = F.cross_entropy(scores, train_d[idx])
        (loss / args.accum).backward()
        time.sleep(args.step_delay)
        if b % args.accum == 0:
            optimizer.step()
            optimizer.zero_grad()
            step += 1
        shown = float(f"{loss.item():.4f}")
        with truth.shown(step if step > truth.attempt["resumed_from"] else None, loss=shown):
            print(f"epoch {epoch} batch {b}/{N} loss {shown:.4f}")
    with torch.no_grad():
        scores = model(val_q, docs)
        val_loss = F.cross_entropy(scores, val_d).item()
        top = scores.topk(10, dim=-1).indices
        recall = (top == val_d[:, None]).any(-1).float().mean().item()
    shown_val, shown_recall = float(f"{val_loss:.4f}"), float(f"{recall:.4f}")
    with truth.shown(eval=shown_val, metric=shown_recall):
        print(f"epoch {epoch} val_loss: {shown_val:.4f} recall@10: {shown_recall:.4f}")
    path = os.path.join(args.out, "last.pt")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch, "step": step}, path)
    truth.checkpoint(path, step)
    print(f"saved {path}")
print("done")
truth.finished()

"""A nanoGPT-shaped training script (karpathy/nanoGPT's train.py, in miniature): its own gradient
accumulation, its configurator's `--key=value` overrides (`Overriding: max_iters = 60`),
`tokens per iteration will be: N`, `iter N: loss X, time Yms, mfu Z%` per iteration,
`step N: train loss X, val loss Y` every eval_interval, one `ckpt.pt` rewritten (re-saved at the
step it resumed from, as nanoGPT does: its eval at that step comes first), `--init_from=resume`.
Writes what it did to OUT_DIR/truth.json (shapetruth).

    python nanogpt.py --out_dir=DIR --batch_size=4 --gradient_accumulation_steps=4 --max_iters=60
"""

import math
import os
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

from shapetruth import Truth

# default config values, overridable from the command line as nanoGPT's configurator does
out_dir = "out"
eval_interval = 20
log_interval = 1
eval_iters = 2
always_save_checkpoint = True
init_from = "scratch"
batch_size = 4
block_size = 16
gradient_accumulation_steps = 4
max_iters = 60
learning_rate = 1e-2
step_delay = 0.03   # seconds of sleep per iteration: a steady, measurable speed on a busy machine
device = "cpu"
compile = False   # nanoGPT's: torch.compile the model (benchmarks/startup.py)

# -----------------------------------------------------------------------------
# configurator.py, as nanoGPT has it (minus config files)
for arg in sys.argv[1:]:
    assert arg.startswith("--"), arg
    key, val = arg.split("=", 1)
    key = key[2:]
    assert key in globals(), f"Unknown config key: {key}"
    try:
        from ast import literal_eval
        attempt = literal_eval(val)
    except (SyntaxError, ValueError):
        attempt = val
    assert type(attempt) == type(globals()[key]), f"{key}: {attempt!r}"
    print(f"Overriding: {key} = {attempt}")
    globals()[key] = attempt
# -----------------------------------------------------------------------------

sys.stdout.reconfigure(line_buffering=True)
torch.manual_seed(1337)
torch.set_num_threads(1)
tokens_per_iter = gradient_accumulation_steps * 1 * batch_size * block_size
print(f"tokens per iteration will be: {tokens_per_iter:,}")
os.makedirs(out_dir, exist_ok=True)

vocab_size = 65
data = torch.randint(vocab_size, (4096,), generator=torch.Generator().manual_seed(0))
data = (data % 13 + torch.arange(4096) % 7)  # some structure a bigram model can learn
train_data, val_data = data[:3600], data[3600:]


def get_batch(split):
    d = train_data if split == "train" else val_data
    ix = torch.randint(len(d) - block_size, (batch_size,))
    x = torch.stack([d[i:i + block_size] for i in ix])
    y = torch.stack([d[i + 1:i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


class Bigram(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, 32)
        self.head = nn.Linear(32, vocab_size)

    def forward(self, x, y=None):
        logits = self.head(self.emb(x))
        loss = None if y is None else F.cross_entropy(logits.view(-1, vocab_size), y.view(-1))
        return logits, loss


iter_num = 0
best_val_loss = 1e9
model = Bigram()
if init_from == "scratch":
    print("Initializing a new model from scratch")
elif init_from == "resume":
    print(f"Resuming training from {out_dir}")
    checkpoint = torch.load(os.path.join(out_dir, "ckpt.pt"), map_location=device)
    model.load_state_dict(checkpoint["model"])
    iter_num = checkpoint["iter_num"]
    best_val_loss = checkpoint["best_val_loss"]
model.to(device)
print(f"number of parameters: {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M")
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
if init_from == "resume":
    optimizer.load_state_dict(checkpoint["optimizer"])
    checkpoint = None
raw_model = model
if compile:
    print("compiling the model... (takes a ~minute)")
    model = torch.compile(model)

truth = Truth(out_dir, "nanogpt", total=max_iters, samples_per_step=batch_size * gradient_accumulation_steps,
              tokens_per_step=tokens_per_iter, first_index=0, resumed_from=iter_num, eval_name="val_loss")


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


X, Y = get_batch("train")
t0 = time.time()
local_iter_num = 0
running_mfu = -1.0
while True:
    lr = learning_rate * 0.5 * (1 + math.cos(math.pi * min(iter_num, max_iters) / max_iters))
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr

    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        with truth.shown(eval=float(f"{losses['val']:.4f}")):
            print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses["val"] < best_val_loss or always_save_checkpoint:
            best_val_loss = losses["val"]
            if iter_num > 0:
                checkpoint = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                              "iter_num": iter_num, "best_val_loss": best_val_loss}
                print(f"saving checkpoint to {out_dir}")
                torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
                truth.checkpoint(os.path.join(out_dir, "ckpt.pt"), iter_num)

    for micro_step in range(gradient_accumulation_steps):
        _, loss = model(X, Y)
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch("train")
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    time.sleep(step_delay)

    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0:
        lossf = loss.item() * gradient_accumulation_steps
        if local_iter_num >= 5:
            mfu = 0.01 / max(dt, 1e-6)
            running_mfu = mfu if running_mfu == -1.0 else 0.9 * running_mfu + 0.1 * mfu
        with truth.shown(iter_num, loss=float(f"{lossf:.4f}")):
            print(f"iter {iter_num}: loss {lossf:.4f}, time {dt * 1000:.2f}ms, mfu {running_mfu * 100:.2f}%")
    iter_num += 1
    local_iter_num += 1

    if iter_num > max_iters:
        break
truth.finished()

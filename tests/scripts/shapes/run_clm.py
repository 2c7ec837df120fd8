"""A script shaped like transformers' examples/pytorch/language-modeling/run_clm.py under the
Trainer, printing what they print: the `***** Running training *****` block, a tqdm bar of
optimizer steps on stderr, log dicts (`{'loss': ..., 'grad_norm': ..., 'learning_rate': ...,
'epoch': ...}`) and eval dicts written above the bar, a nested evaluation bar, `checkpoint-N/`
directories, `--resume_from_checkpoint DIR`, the end-of-training summary dict, then
`trainer.log_metrics()`'s train and eval tables. Torch only; writes OUTPUT_DIR/truth.json.

    python run_clm.py --output_dir DIR --per_device_train_batch_size 4 --gradient_accumulation_steps 2
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

import hfprint
from shapetruth import Bar, Truth

p = argparse.ArgumentParser()
p.add_argument("--output_dir", required=True)
p.add_argument("--per_device_train_batch_size", type=int, default=4)
p.add_argument("--per_device_eval_batch_size", type=int, default=8)
p.add_argument("--gradient_accumulation_steps", type=int, default=2)
p.add_argument("--num_train_epochs", type=int, default=3)
p.add_argument("--logging_steps", type=int, default=5)
p.add_argument("--eval_steps", type=int, default=20)
p.add_argument("--save_steps", type=int, default=20)
p.add_argument("--block_size", type=int, default=16)
p.add_argument("--learning_rate", type=float, default=5e-3)
p.add_argument("--resume_from_checkpoint", default=None)
p.add_argument("--step_delay", type=float, default=0.03, help="sleep per optimizer step")
p.add_argument("--use_cpu", action="store_true")
args = p.parse_args()

torch.manual_seed(42)
torch.set_num_threads(1)
vocab, bs, accum, block = 50, args.per_device_train_batch_size, args.gradient_accumulation_steps, args.block_size
g = torch.Generator().manual_seed(0)
stream = (torch.arange(161 * (block + 1)) * 7 % 23 + torch.randint(3, (161 * (block + 1),), generator=g)) % vocab
blocks = stream.view(161, block + 1)
train_set, eval_set = blocks[:160], blocks[144:160]   # 160 training examples, 16 to evaluate
steps_per_epoch = len(train_set) // (bs * accum)
total = steps_per_epoch * args.num_train_epochs

model = nn.Sequential(nn.Embedding(vocab, 32), nn.Linear(32, vocab))
optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
global_step = 0
if args.resume_from_checkpoint:
    state = json.load(open(os.path.join(args.resume_from_checkpoint, "trainer_state.json")))
    saved = torch.load(os.path.join(args.resume_from_checkpoint, "model.pt"))
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    global_step = state["global_step"]
epochs_trained, skip_steps = divmod(global_step, steps_per_epoch)
truth = Truth(args.output_dir, "run_clm", total=total, samples_per_step=bs * accum,
              tokens_per_step=bs * accum * block, first_index=1, resumed_from=global_step,
              eval_name="eval_loss")

hfprint.running_training(examples=len(train_set), epochs=args.num_train_epochs, batch=bs,
                         accumulation=accum, total=total,
                         params=sum(p.numel() for p in model.parameters()),
                         resumed=(global_step, epochs_trained, skip_steps * accum) if global_step else None)


def lm_loss(batch):
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(nested: bool) -> dict:
    start = time.time()
    n = math.ceil(len(eval_set) / args.per_device_eval_batch_size)
    bar = Bar(n, nested=nested, leave=not nested)
    losses = []
    for i in range(n):
        losses.append(lm_loss(eval_set[i * args.per_device_eval_batch_size:(i + 1) * args.per_device_eval_batch_size]).item())
        bar.update()
    bar.close()
    runtime = time.time() - start
    return {"eval_loss": sum(losses) / n, "eval_runtime": round(runtime, 4),
            "eval_samples_per_second": round(len(eval_set) / runtime, 3),
            "eval_steps_per_second": round(n / runtime, 3)}


def save(step: int) -> None:
    path = os.path.join(args.output_dir, f"checkpoint-{step}")
    hfprint.info(f"Saving model checkpoint to {path}", "trainer.py:3984")
    os.makedirs(path, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(path, "model.pt"))
    with open(os.path.join(path, "trainer_state.json"), "w") as f:
        json.dump({"global_step": step, "epoch": step / steps_per_epoch}, f)
    truth.checkpoint(path, step)


start = time.time()
bar = Bar(total)          # the Trainer's ProgressCallback: a bar from 0 that jumps to the resumed step
shown = 0
tr_loss, logged_at, all_loss, trained = 0.0, global_step, 0.0, 0
for epoch in range(epochs_trained, args.num_train_epochs):
    order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(epoch))
    first = skip_steps if epoch == epochs_trained else 0
    for s in range(first, steps_per_epoch):
        step_loss = 0.0
        for m in range(accum):
            idx = order[(s * accum + m) * bs:(s * accum + m + 1) * bs]
            loss = lm_loss(train_set[idx]) / accum
            loss.backward()
            step_loss += loss.item()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        lr = args.learning_rate * (1 - global_step / total)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(args.step_delay)
        global_step += 1
        trained += 1
        tr_loss += step_loss
        all_loss += step_loss
        with truth.shown(global_step):
            bar.update(global_step - shown)
            shown = global_step
        ep = epoch + (s + 1) / steps_per_epoch
        if global_step % args.logging_steps == 0:
            logged = round(tr_loss / (global_step - logged_at), 4)
            with truth.shown(loss=logged):
                bar.write(str({"loss": logged, "grad_norm": grad_norm, "learning_rate": lr, "epoch": ep}))
            tr_loss, logged_at = 0.0, global_step
        if global_step % args.eval_steps == 0:
            metrics = {**evaluate(nested=True), "epoch": ep}
            with truth.shown(eval=metrics["eval_loss"]):
                bar.write(str(metrics))
        if global_step % args.save_steps == 0:
            save(global_step)

runtime = time.time() - start
train_loss = all_loss / max(trained, 1)
summary = {"train_runtime": round(runtime, 4), "train_samples_per_second": round(trained * bs * accum / runtime, 3),
           "train_steps_per_second": round(trained / runtime, 3), "train_loss": train_loss,
           "epoch": float(args.num_train_epochs)}
hfprint.info("\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n", "trainer.py:2616")
bar.write(str(summary))
bar.close()
hfprint.info(f"Saving model checkpoint to {args.output_dir}", "trainer.py:3984")
torch.save(model.state_dict(), os.path.join(args.output_dir, "model.pt"))
hfprint.log_metrics("train", {"epoch": float(args.num_train_epochs), "total_flos": 1234.0 * trained,
                              "train_loss": train_loss, "train_runtime": runtime,
                              "train_samples": len(train_set),
                              "train_samples_per_second": summary["train_samples_per_second"],
                              "train_steps_per_second": summary["train_steps_per_second"]})
print(time.strftime("%m/%d/%Y %H:%M:%S") + " - INFO - __main__ - *** Evaluate ***", file=sys.stderr, flush=True)
metrics = evaluate(nested=False)
with truth.shown(eval=metrics["eval_loss"]):
    hfprint.log_metrics("eval", {"epoch": float(args.num_train_epochs), **metrics, "eval_samples": len(eval_set),
                                 "perplexity": math.exp(metrics["eval_loss"])})
truth.finished()

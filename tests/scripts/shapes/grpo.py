"""A script shaped like TRL's GRPOTrainer (note 003's setup, in miniature): the Trainer's
`***** Running training *****` block and tqdm bar of optimizer steps, and TRL's log dicts
(`reward`, `reward_std`, `rewards/<name>/mean`, `completions/mean_length`, `kl`, `loss`, ...)
each logging step, `checkpoint-N/` directories, `--resume_from_checkpoint DIR`. The policy is a
tiny categorical model sampling completions; GRPO's group-normalised advantages train it towards
its reward. Torch only; writes OUTPUT_DIR/truth.json.

    python grpo.py --output_dir DIR --per_device_train_batch_size 4 --gradient_accumulation_steps 2
"""

import argparse
import json
import os
import time

import torch
import torch.nn as nn

import hfprint
from shapetruth import Bar, Truth

p = argparse.ArgumentParser()
p.add_argument("--output_dir", required=True)
p.add_argument("--per_device_train_batch_size", type=int, default=4)
p.add_argument("--gradient_accumulation_steps", type=int, default=2)
p.add_argument("--num_generations", type=int, default=4)
p.add_argument("--max_steps", type=int, default=60)
p.add_argument("--logging_steps", type=int, default=2)
p.add_argument("--save_steps", type=int, default=20)
p.add_argument("--learning_rate", type=float, default=1e-2)  # reward mid-way at the end, not 1.0
p.add_argument("--resume_from_checkpoint", default=None)
p.add_argument("--step_delay", type=float, default=0.03, help="sleep per optimizer step")
p.add_argument("--use_cpu", action="store_true")
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
VOCAB, EOS, LENGTH, GOOD = 8, 0, 8, 3
bs, accum = args.per_device_train_batch_size, args.gradient_accumulation_steps
policy = nn.Linear(VOCAB, VOCAB)       # next token from the previous one
optimizer = torch.optim.Adam(policy.parameters(), lr=args.learning_rate)
global_step = 0
if args.resume_from_checkpoint:
    state = json.load(open(os.path.join(args.resume_from_checkpoint, "trainer_state.json")))
    saved = torch.load(os.path.join(args.resume_from_checkpoint, "model.pt"))
    policy.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    global_step = state["global_step"]
prompts = 4096                          # a dataset longer than the run: one epoch, max_steps bounds it
truth = Truth(args.output_dir, "grpo", total=args.max_steps, samples_per_step=bs * accum,
              tokens_per_step=None, first_index=1, resumed_from=global_step, main_metric="reward")
hfprint.running_training(examples=prompts, epochs=1, batch=bs, accumulation=accum,
                         total=args.max_steps, params=sum(p.numel() for p in policy.parameters()),
                         resumed=(global_step, 0, global_step * accum) if global_step else None)


def generate(n):
    """n completions: token ids until EOS or LENGTH, and each one's log-probability."""
    token = torch.full((n,), 1)
    logp, alive, lengths, good = torch.zeros(n), torch.ones(n, dtype=torch.bool), torch.zeros(n), torch.zeros(n)
    for _ in range(LENGTH):
        dist = torch.distributions.Categorical(logits=policy(nn.functional.one_hot(token, VOCAB).float()))
        token = dist.sample()
        logp = logp + dist.log_prob(token) * alive
        lengths += alive
        good += (token == GOOD) & alive
        alive = alive & (token != EOS)
    return logp, lengths, good / lengths


bar = Bar(args.max_steps)
start, first_step, losses = time.time(), global_step, []
shown, num_tokens = 0, 0.0
window = []
while global_step < args.max_steps:
    for m in range(accum):
        logp, lengths, reward = generate(bs)
        groups = reward.view(-1, args.num_generations) if bs % args.num_generations == 0 else reward.view(1, -1)
        advantage = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1)
        loss = -(advantage * logp).mean() / accum
        loss.backward()
        num_tokens += float(lengths.sum())
        window.append((loss.item() * accum, reward, lengths, groups.std(1)))
    grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0))
    optimizer.step()
    optimizer.zero_grad()
    time.sleep(args.step_delay)
    global_step += 1
    with truth.shown(global_step):
        bar.update(global_step - shown)
        shown = global_step
    if global_step % args.logging_steps == 0:
        rewards = torch.cat([w[1] for w in window])
        lengths = torch.cat([w[2] for w in window])
        stds = torch.cat([w[3] for w in window])
        logs = {"loss": round(sum(w[0] for w in window) / len(window), 4), "grad_norm": grad_norm,
                "learning_rate": args.learning_rate * (1 - global_step / args.max_steps), "num_tokens": num_tokens,
                "completions/mean_length": lengths.mean().item(), "completions/min_length": lengths.min().item(),
                "completions/max_length": lengths.max().item(),
                "completions/clipped_ratio": (lengths == LENGTH).float().mean().item(),
                "rewards/count_threes/mean": rewards.mean().item(), "rewards/count_threes/std": rewards.std().item(),
                "reward": rewards.mean().item(), "reward_std": rewards.std().item(),
                "frac_reward_zero_std": (stds < 1e-6).float().mean().item(), "kl": 0.0,
                "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "clip_ratio/region_mean": 0.0,
                "epoch": global_step * bs * accum / prompts}
        losses.append(logs["loss"])
        with truth.shown(loss=logs["loss"], metric=logs["reward"]):
            bar.write(str(logs))
        window = []
    if global_step % args.save_steps == 0:
        path = os.path.join(args.output_dir, f"checkpoint-{global_step}")
        hfprint.info(f"Saving model checkpoint to {path}", "trainer.py:3984")
        os.makedirs(path, exist_ok=True)
        torch.save({"model": policy.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(path, "model.pt"))
        with open(os.path.join(path, "trainer_state.json"), "w") as f:
            json.dump({"global_step": global_step}, f)
        truth.checkpoint(path, global_step)
hfprint.info("\n\nTraining completed. Do not forget to share your model on huggingface.co/models =)\n\n", "trainer.py:2616")
runtime, trained = time.time() - start, global_step - first_step
bar.write(str({"train_runtime": round(runtime, 4), "train_samples_per_second": round(trained * bs * accum / runtime, 3),
               "train_steps_per_second": round(trained / runtime, 3),
               "train_loss": sum(losses) / max(len(losses), 1), "epoch": args.max_steps * bs * accum / prompts}))
bar.close()
truth.finished()

"""A Hugging Face Trainer's output whose gradient norm explodes for one logged step, for
tests/test_health_command.py. Stdlib and tqdm only: no model, nothing trained.

It prints what transformers 5.23.0's Trainer prints under its ProgressCallback with
logging_steps=1: a tqdm bar of optimizer steps on stderr (`tqdm(total=max_steps,
dynamic_ncols=True)`, updated at each step's end) and each step's log dict written above it
(`bar.write(str(logs))`, on stdout), its floats formatted as the callback formats them,
f"{v:.4g}", as tests/fixtures/outputs/hf_trainer.txt (a real run) shows:

    {'loss': '2.491', 'grad_norm': '1.003', 'learning_rate': '4.924e-05', 'epoch': '0.01515'}   (step 1)

then the end-of-training summary dict. The loss falls slowly; the norm wanders around 1, except
at --explode-at N, where the norm logged for step N is about 1e3 (the next is normal again).
Exits 0.

    python hf_grad_norm.py --events RUN_DIR/events.jsonl [--explode-at N] [--steps 66] [--sync-every 3]

Paced by cockpit, not by the clock: every --sync-every steps it waits, redrawing its bar as
tqdm redraws it, until the run's events file holds the step event of that step carrying the
loss it logged there. A command's step event is a reporting window of about a second (one
report to the training-health detectors), so each window then holds the same logged steps,
and the last of them closes it, however fast or loaded the machine: the detectors have judged
the same reports at the same steps on every run, and no sleep's length matters.
"""

import argparse
import json
import random
import sys
import time

from tqdm import tqdm

WAIT_S = 120.0   # for cockpit to report a step: only a broken supervisor takes this long
FIRST_WAIT_S = 5.0   # at the first sync point, before any window has closed (see wait_for)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--events", required=True, help="the run's events.jsonl ({run_dir}/events.jsonl)")
    p.add_argument("--explode-at", type=int, default=0, help="the step whose logged norm explodes; 0: none")
    p.add_argument("--steps", type=int, default=66)
    p.add_argument("--sync-every", type=int, default=3)
    args = p.parse_args()
    rng = random.Random(0)
    lr0, total = 5e-5, args.steps
    bar = tqdm(total=total, dynamic_ncols=True)
    events = Events(args.events)
    losses = []
    for step in range(1, total + 1):
        # falling 0.01 a step, noise a tenth of that: each step's loss differs from the last
        loss = 2.5 - 0.01 * step + rng.uniform(-0.001, 0.001)
        norm = 1.0 + rng.gauss(0.0, 0.05)
        if step == args.explode_at:
            norm *= 1e3
        bar.update(1)
        logs = {"loss": loss, "grad_norm": norm, "learning_rate": lr0 * (1 - step / total),
                "epoch": step / total}
        bar.write(str(callback_format(logs)))
        losses.append(loss)
        if step % args.sync_every == 0 or step == total:
            if not events.wait_for(step, float(f"{loss:.4g}"), bar):
                print(f"hf_grad_norm.py: no step event for step {step} in {WAIT_S:.0f} s",
                      file=sys.stderr, flush=True)
                return 3
    bar.write(str(callback_format({"train_runtime": 12.5, "train_samples_per_second": 42.24,
                                   "train_steps_per_second": 5.28,
                                   "train_loss": sum(losses) / len(losses), "epoch": 1.0})))
    bar.close()
    return 0


def callback_format(logs: dict) -> dict:
    """ProgressCallback.on_log's copy of the logs: floats as f"{v:.4g}" strings."""
    return {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in logs.items()}


class Events:
    """The run's events file, read as cockpit appends to it."""

    def __init__(self, path: str):
        self.path, self.offset, self.partial = path, 0, ""
        self.seen: set[tuple[int, float]] = set()   # (step, loss) of its step events

    def wait_for(self, step: int, loss: float, bar) -> bool:
        """Redraw the bar until a step event at `step` has read `loss` (a window closed by the
        bar drawn before that step's log dict does not count); False after WAIT_S."""
        started = time.monotonic()
        while (step, loss) not in self.seen:
            if time.monotonic() > started + WAIT_S:
                return False
            if not self.seen and time.monotonic() > started + FIRST_WAIT_S:
                # No window has closed yet: cockpit's first sighting of the output may be this
                # very step (a loaded machine read steps 0-3 at once), and a window closes only
                # at a step past where it began; the next sync point is past it.
                return True
            time.sleep(0.05)
            bar.refresh()
            self.read()
        return True

    def read(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self.offset)
                text = f.read()
                self.offset = f.tell()
        except OSError:
            return
        *lines, self.partial = (self.partial + text).split("\n")
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("type") == "step" and isinstance(event.get("step"), int):
                self.seen.add((event["step"], event.get("loss")))


if __name__ == "__main__":
    sys.exit(main())

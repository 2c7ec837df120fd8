"""The training loop's stall per checkpoint: written in the loop (synchronous) against a host
copy written by a background thread (engine.train.checkpointer), on a built-in workload.

    python benchmarks/checkpoint_stall.py                    # trm-chat-small on the cpu preset
    python benchmarks/checkpoint_stall.py --checkpoints 8 --every 5
    python benchmarks/checkpoint_stall.py --device cuda      # the cuda preset, eager, batch 16
    python benchmarks/checkpoint_stall.py --set params.seq_len=256

Each mode trains the same run (the same Trainer a run builds, in this process) for
`--checkpoints` checkpoints `--every` steps apart, plus one step, and reads its `checkpoint`
events: save_s is what the loop paid (synchronous: the whole write; background: the finite
check, the copy to the host and any wait for the write before it), write_s the write's own
time. The stall per checkpoint is the median over the checkpoints before the attempt's end
(the end's own, which waits for its write, is shown apart). The model is trm-chat-small's
(~29M parameters, AdamW: a ~330 MB checkpoint); on the CPU its forward is cut down (one cycle,
128-byte windows, batch 2) so that a step takes about a second: less time to hide a write
behind than the full model's step, so no flattery to the background mode.

A background write still shares the machine with training: the steps that overlapped a write
are timed against the others, and their extra time is shown per checkpoint ("hidden cost"), on
a 2-core CPU the writer's pickling, CRC and fsync competing with the step's threads.

Target: the background stall under 20% of the synchronous one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET = 0.20
WORKLOAD = "trm-chat-small"
# The step cut down on a CPU (the checkpoint, the model's parameters, stays the preset's); on a
# GPU the preset's model as it is, eagerly (no compile time in the measurement).
SETTINGS = {
    "cpu": ["params.seq_len=128", "params.H_cycles=1", "params.L_cycles=1", "batch_size=2",
            "accumulation=1"],
    "cuda": ["batch_size=16", "accumulation=1", "compile=false"],
}
COMMON = ["params.corpus_bytes=300000", "params.eval_bytes=2048", "train.checkpoint_every_minutes=0",
          "train.report_every_s=5", "keep_checkpoints=2"]


def measure(background: bool, device: str, every: int, checkpoints: int, extra: list[str]) -> dict:
    from engine import runconfig
    from engine.record import checkpoint
    from engine.record.events import EventWriter
    from engine.record.rundir import RunDir
    from engine.train import checkpointer
    from engine.train.trainer import Trainer

    checkpointer.BACKGROUND = background
    steps = every * checkpoints + 1   # the last: the attempt's end, with a checkpoint of its own
    config = runconfig.resolve(WORKLOAD, device, SETTINGS[device] + COMMON + [
        f"train.max_steps={steps}", f"train.checkpoint_every_steps={every}", *extra])
    run = RunDir.create(config)
    trainer = Trainer(run, EventWriter(run.events_path, attempt=1), device, run.config().device)

    writes: list[tuple[float, float]] = []   # each write's (start, end), whichever thread does it
    real_save = checkpoint.save

    def timed_save(directory, state, keep):
        started = time.monotonic()
        try:
            return real_save(directory, state, keep)
        finally:
            writes.append((started, time.monotonic()))
    checkpoint.save = timed_save

    step_times: list[tuple[float, float]] = []
    train_step = trainer.train_step

    def timed_step():
        started = time.monotonic()
        train_step()
        if trainer.device.type == "cuda":
            import torch
            torch.cuda.synchronize()   # the step's own time, not the queue's
        step_times.append((started, time.monotonic()))
    trainer.train_step = timed_step
    try:
        started = time.monotonic()
        outcome = trainer.fit()
        fit_s = time.monotonic() - started
    finally:
        checkpoint.save = real_save
    events = [e for e in run.events() if e["type"] == "checkpoint"]
    assert outcome == "finished" and [e["step"] for e in events] == \
        [every * (i + 1) for i in range(checkpoints)] + [steps], (outcome, events)
    mid = events[:-1]
    overlapped, hidden = 0, []
    for w0, w1 in writes[:len(mid)]:
        # The steps that overlapped this write, against the clean steps nearest it (the load of
        # a shared machine moves): their extra time is what the write cost training.
        during = [b - a for a, b in step_times if a < w1 and b > w0]
        near = sorted((i for i, (a, b) in enumerate(step_times[1:], 1)
                       if not any(a < x1 and b > x0 for x0, x1 in writes)),
                      key=lambda i: min(abs(step_times[i][0] - w1), abs(step_times[i][1] - w0)))[:6]
        if during and near:
            local = statistics.median(step_times[i][1] - step_times[i][0] for i in near)
            hidden.append(sum(during) - len(during) * local)
            overlapped += len(during)
    clean = [b - a for a, b in step_times[1:] if not any(a < w1 and b > w0 for w0, w1 in writes)]
    return {
        "stall": statistics.median(e["save_s"] for e in mid),
        "stalls": [e["save_s"] for e in mid],
        "wait": statistics.median(e.get("wait_s", 0.0) for e in mid),
        "write": statistics.median(e["write_s"] for e in mid),
        "end": events[-1]["save_s"],
        "size_mb": (run.checkpoints / Path(events[-1]["path"]).name).stat().st_size / 2**20,
        "step": statistics.median(clean) if clean else None,
        "hidden": statistics.median(hidden) if hidden else 0.0,
        "overlapped": overlapped, "fit_s": fit_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=sorted(SETTINGS), default="cpu",
                        help="the device preset (default cpu)")
    parser.add_argument("--checkpoints", type=int, default=5,
                        help="checkpoints measured per mode (default 5)")
    parser.add_argument("--every", type=int, default=10, help="steps between checkpoints (default 10)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="another override, as `cockpit run --set` takes it")
    args = parser.parse_args()
    for name in ("RUNS", "CONFIG", "CACHE"):   # nothing of the user's read or written
        os.environ[f"COCKPIT_{name}_DIR"] = tempfile.mkdtemp(prefix=f"cockpit-ckpt-{name.lower()}-")
    os.environ["COCKPIT_ALERTS"] = "off"

    print(f"{WORKLOAD} on {args.device}: {args.checkpoints} checkpoints every {args.every} steps, "
          f"overrides {' '.join(SETTINGS[args.device] + args.set)}", flush=True)
    results = {}
    for mode, background in (("synchronous", False), ("background", True)):
        r = results[mode] = measure(background, args.device, args.every, args.checkpoints, args.set)
        print(f"{mode}: stall {r['stall']:.3f} s median per checkpoint "
              f"({', '.join(f'{s:.3f}' for s in r['stalls'])}), of which waiting {r['wait']:.3f} s; "
              f"write {r['write']:.3f} s; at the attempt's end {r['end']:.3f} s; "
              f"{r['size_mb']:.0f} MB a checkpoint; a step {r['step'] or 0:.3f} s; "
              f"{r['overlapped']} steps overlapped a write, hidden cost {r['hidden']:+.3f} s per "
              f"checkpoint (median); fit {r['fit_s']:.1f} s", flush=True)
    sync, back = results["synchronous"]["stall"], results["background"]["stall"]
    ratio = back / sync if sync > 0 else float("inf")
    print(f"stall per checkpoint: synchronous {sync:.3f} s, background {back:.3f} s, "
          f"ratio {ratio:.3f} (target < {TARGET:.2f}: {'met' if ratio < TARGET else 'MISSED'})")
    hidden = results["background"]["hidden"]
    print(f"background with its hidden cost (steps slowed by the write): {back + max(hidden, 0):.3f} s "
          f"per checkpoint, ratio {(back + max(hidden, 0)) / sync if sync > 0 else float('inf'):.3f}")


if __name__ == "__main__":
    main()

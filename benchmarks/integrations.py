"""What the Hugging Face callback costs a training run: the HF example's steps/s with and without
cockpit.integrations.transformers.CockpitCallback, target >= 0.99x.

Both runs are set up as under cockpit (COCKPIT_EVENTS names an events file, so the callback is
active and writes), alternating with and without it, `--repeats` times each; the figure is the
Trainer's own `train_steps_per_second` (its training loop only, no start-up), median per side.
Then the callback alone: its hooks called as the Trainer calls them each step, timed in this
process, as microseconds per step and as a share of a step of the measured run.

    python benchmarks/integrations.py                    # CPU, 300 steps x 3 repeats
    python benchmarks/integrations.py --threads 1        # steadier on a busy machine
    python benchmarks/integrations.py --device cuda      # bf16 on the GPU
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "hf" / "train_lm.py"


def run_example(steps: int, batch: int, device: str, callback: bool, workdir: Path,
                threads: int | None) -> float:
    """The Trainer's train_steps_per_second for one run of the example."""
    out = workdir / ("with" if callback else "without")
    argv = [sys.executable, str(EXAMPLE), "--output_dir", str(out), "--max_steps", str(steps),
            "--per_device_train_batch_size", str(batch), "--logging_steps", "10",
            "--save_strategy", "no", "--disable_tqdm", "True", "--learning_rate", "1e-3",
            "--dataloader_num_workers", "0"]
    argv += ["--use_cpu"] if device == "cpu" else ["--bf16"]
    if not callback:
        argv.append("--no_callback")
    events = workdir / "events.jsonl"
    env = {**os.environ, "COCKPIT_EVENTS": str(events), "COCKPIT_ATTEMPT": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"the example failed:\n{done.stderr[-3000:]}")
    for line in done.stdout.splitlines():
        if line.startswith("{") and "train_steps_per_second" in line:
            return float(ast.literal_eval(line)["train_steps_per_second"])
    sys.exit("the example printed no train_steps_per_second")


def callback_cost_us(calls: int = 20_000) -> float:
    """Microseconds the callback adds to one step: on_step_end every step, and on_log with a
    loss every 10th (logging_steps 10), writing to a real events file."""
    from types import SimpleNamespace

    from cockpit import report

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["COCKPIT_EVENTS"] = str(Path(tmp) / "events.jsonl")
        report._reset()
        from cockpit.integrations.transformers import CockpitCallback

        callback = CockpitCallback()
        args = SimpleNamespace(train_batch_size=8, gradient_accumulation_steps=1, world_size=1,
                               auto_find_batch_size=False, output_dir=tmp)
        state = SimpleNamespace(global_step=0, max_steps=calls, epoch=0.0, train_batch_size=8,
                                is_world_process_zero=True)
        logs = {"loss": 2.5, "grad_norm": 1.2, "learning_rate": 1e-3, "epoch": 0.1}
        start = time.perf_counter()
        for step in range(1, calls + 1):
            state.global_step, state.epoch = step, step / 1000
            callback.on_step_end(args, state, None)
            if step % 10 == 0:
                callback.on_log(args, state, None, logs=logs)
        elapsed = time.perf_counter() - start
        del os.environ["COCKPIT_EVENTS"]
        report._reset()
    return elapsed / calls * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for the runs (1 steadies a CPU figure on a busy machine)")
    args = p.parse_args()

    rates: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for callback in ((True, False) if i % 2 == 0 else (False, True)):
                rate = run_example(args.steps, args.batch, args.device, callback, Path(tmp),
                                   args.threads)
                rates[callback].append(rate)
                print(f"  run {i + 1} {'with' if callback else 'without'} the callback: "
                      f"{rate:.2f} steps/s", flush=True)
    with_cb, without = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"HF example on {args.device}, {args.steps} steps at batch {args.batch}, median of "
          f"{args.repeats}: with the callback {with_cb:.2f} steps/s, without {without:.2f} "
          f"-> {with_cb / without:.3f}x (target >= 0.99x)")
    spread = (max(rates[False]) - min(rates[False])) / without
    print(f"  run-to-run spread without the callback: {spread:.1%} of the median")
    cost = callback_cost_us()
    step_us = 1e6 / without
    print(f"the callback alone: {cost:.1f} us per step = {cost / step_us:.3%} of this run's "
          f"{step_us / 1000:.1f} ms step -> {1 / (1 + cost / step_us):.4f}x")


if __name__ == "__main__":
    main()

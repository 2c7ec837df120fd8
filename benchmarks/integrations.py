"""What the Hugging Face callback costs a training run: the HF example's steps/s with and without
cockpit.integrations.transformers.CockpitCallback, target >= 0.99x.

The example's model and data, trained in this process as under cockpit (COCKPIT_EVENTS names
an events file, so the callback is active and writes), in rounds of two runs, one with the
callback and one without, the order alternating (ABBA) so drift hits both sides alike; the figure
is the median of the rounds' ratios of the Trainer's own steps/s (its training loop only).
Then the callback alone: its hooks called as the Trainer calls them each step, timed, as
microseconds per step and as a share of a step of the measured run.

    python benchmarks/integrations.py                    # CPU, 200 steps x 8 rounds
    python benchmarks/integrations.py --threads 1        # steadier on a busy machine
    python benchmarks/integrations.py --device cuda      # bf16 on the GPU
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def example():
    spec = importlib.util.spec_from_file_location("train_lm", ROOT / "examples" / "hf" / "train_lm.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def rounds(steps: int, batch: int, device: str, count: int, workdir: Path) -> list[tuple[float, float]]:
    """(with, without) steps/s for each round."""
    from transformers import PrinterCallback, Trainer, TrainingArguments
    from transformers.utils import logging

    from cockpit import report
    from cockpit.integrations.transformers import CockpitCallback

    logging.set_verbosity_error()
    os.environ["COCKPIT_EVENTS"] = str(workdir / "events.jsonl")
    report._reset()
    lm = example()
    script = lm.ScriptArguments()
    data = Path(script.text_file).read_bytes()
    train = lm.Blocks(data, script.block_size)
    model = lm.build_model(script)
    args = TrainingArguments(output_dir=str(workdir / "out"), max_steps=steps,
                             per_device_train_batch_size=batch, logging_steps=10,
                             save_strategy="no", disable_tqdm=True, report_to="none",
                             learning_rate=1e-3, use_cpu=device == "cpu", bf16=device == "cuda",
                             dataloader_num_workers=0)

    def rate(callback: bool) -> float:
        trainer = Trainer(model=model, args=args, train_dataset=train,
                          callbacks=[CockpitCallback()] if callback else [])
        # without its bar the Trainer prints every log dict: both sides alike, but they
        # bury the rounds' lines
        trainer.remove_callback(PrinterCallback)
        start = time.perf_counter()
        trainer.train()
        return steps / (time.perf_counter() - start)

    rate(True)  # warm-up: allocator, kernels, the first-run costs of both sides
    out = []
    for i in range(count):
        pair = {}
        for callback in ((True, False) if i % 2 == 0 else (False, True)):
            pair[callback] = rate(callback)
        out.append((pair[True], pair[False]))
        print(f"  round {i + 1}: with {pair[True]:.2f} steps/s, without {pair[False]:.2f} "
              f"-> {pair[True] / pair[False]:.3f}", flush=True)
    del os.environ["COCKPIT_EVENTS"]
    report._reset()
    return out


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
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--threads", type=int, default=None, help="torch threads (1 steadies a CPU "
                                                               "figure on a busy machine)")
    args = p.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        pairs = rounds(args.steps, args.batch, args.device, args.rounds, Path(tmp))
    ratio = statistics.median(w / wo for w, wo in pairs)
    with_cb = statistics.median(w for w, _ in pairs)
    without = statistics.median(wo for _, wo in pairs)
    print(f"HF example on {args.device}, {args.steps} steps at batch {args.batch}, {args.rounds} "
          f"rounds: median with the callback {with_cb:.2f} steps/s, without {without:.2f}; "
          f"median ratio {ratio:.3f}x (target >= 0.99x)")
    cost = callback_cost_us()
    step_us = 1e6 / without
    print(f"the callback alone: {cost:.1f} us per step = {cost / step_us:.3%} of this run's "
          f"{step_us / 1000:.1f} ms step -> {1 / (1 + cost / step_us):.4f}x")


if __name__ == "__main__":
    main()

"""What does cockpit's training loop cost over a bare PyTorch loop?

Like with like: the same workload, model, batches, optimizer (the one cockpit builds for the
device: fused AdamW on CUDA), gradient clipping, precision and torch.compile setting (the
device preset's, on both sides, unless --compile says otherwise) are trained by a bare loop and
by the engine's Trainer, alternating which goes first, after one untimed warm-up of each. Both
time the same window: the optimizer steps after the first --warmup-steps (compiling, the
allocator) up to the last, with a device sync at each end; the Trainer's reports, events and
scheduled checkpoints fall inside it, its final eval and checkpoint after it. Prints each
round's samples/s and the median of the rounds' ratios. Target: cockpit >= 0.99x bare.

    python benchmarks/overhead.py                      # CPU, the defaults below
    python benchmarks/overhead.py --device cuda --steps 2000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine import runconfig, workloads  # noqa: E402
from engine.monitor import device as devices  # noqa: E402
from engine.train import optim  # noqa: E402
from engine.train.data import SampleOrder  # noqa: E402
from engine.record.events import EventWriter  # noqa: E402
from engine.record.rundir import RunDir  # noqa: E402
from engine.train.trainer import Trainer  # noqa: E402


def config_for(args) -> runconfig.RunConfig:
    # A small data set seen for several epochs: the same steps without holding them all.
    groups_per_epoch = math.gcd(args.steps, 64)
    samples = groups_per_epoch * args.batch_size * args.accumulation
    return runconfig.resolve("matmul", args.device, [
        f"params.n={args.n}", f"params.products={args.products}", f"params.samples={samples}",
        "params.eval_samples=256", f"train.epochs={args.steps // groups_per_epoch}",
        "train.checkpoint_every_minutes=0",
        f"batch_size={args.batch_size}", f"accumulation={args.accumulation}",
        *([] if args.precision == "preset" else [f"precision={args.precision}"]),
        *([] if args.compile == "preset" else [f"compile={str(args.compile == 'on').lower()}"]),
    ])


def bare(config: runconfig.RunConfig, warmup_steps: int) -> float:
    """The loop a user would write by hand; returns samples/s over the timed steps."""
    train, preset = config.workload.train, config.device
    resolved = devices.resolve(preset)
    torch.manual_seed(train.seed)
    workload = workloads.build("matmul", config.workload.params, train.seed)
    model = workload.build_model(grad_checkpointing=False).to(resolved.device)
    forward = torch.compile(model) if preset.compile else model
    optimizer = optim.build(model, train, resolved.device)
    order = SampleOrder(workload.num_samples, train.seed)
    group = preset.effective_batch
    steps = round(train.epochs * workload.num_samples) // group

    seen, started = 0, None
    for step in range(steps):
        if step == warmup_steps:
            devices.synchronize(resolved.device)
            started = time.perf_counter()
        for start in range(0, group, preset.batch_size):
            batch = workload.batch(order.indices(seen + start, preset.batch_size), resolved.device)
            with resolved.autocast():
                loss = workload.loss(forward, batch)
            (loss * (preset.batch_size / group)).backward()
        if train.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), train.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seen += group
    devices.synchronize(resolved.device)
    return (steps - warmup_steps) * group / (time.perf_counter() - started)


def engine(config: runconfig.RunConfig, root: Path, warmup_steps: int) -> float:
    """The same training through cockpit's Trainer; returns samples/s over the same steps."""
    run = RunDir.create(config, root)
    with EventWriter(run.events_path, attempt=1) as events:
        trainer = Trainer(run, events, config.device_preset, config.device)
        marks = {}
        train_step = trainer.train_step

        def timed_step() -> None:
            train_step()
            if trainer.step in (warmup_steps, trainer.total_steps):
                devices.synchronize(trainer.device)
                marks[trainer.step] = time.perf_counter()

        trainer.train_step = timed_step
        trainer.fit()  # its final eval and checkpoint come after the last mark
        timed = trainer.total_steps - warmup_steps
        return timed * trainer.global_batch / (marks[trainer.total_steps] - marks[warmup_steps])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="device preset (cpu, cuda, auto)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per timed run")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--products", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--precision", default="preset", help="fp32, bf16, fp16, or the preset's (default)")
    parser.add_argument("--compile", choices=("preset", "on", "off"), default="preset",
                        help="torch.compile on both sides: as the device preset says (default), or forced")
    parser.add_argument("--warmup-steps", type=int, default=20,
                        help="optimizer steps before the timed window (compiling, the allocator)")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["COCKPIT_CONFIG_DIR"] = os.path.join(tmp, "config")
        root = Path(tmp) / "runs"
        config = config_for(args)
        resolved = devices.resolve(config.device)
        name = torch.cuda.get_device_name(0) if resolved.device.type == "cuda" else \
            f"{os.cpu_count()} CPU threads, torch uses {torch.get_num_threads()}"
        if not 0 <= args.warmup_steps < args.steps:
            parser.error(f"--warmup-steps {args.warmup_steps}: expected 0 to --steps - 1 ({args.steps - 1})")
        print(f"device {resolved.device} {resolved.precision} ({name}); torch {torch.__version__}")
        print(f"matmul n={args.n} products={args.products}, batch {args.batch_size} x "
              f"{args.accumulation}, {'compiled' if config.device.compile else 'eager'} on both sides, "
              f"steps {args.warmup_steps + 1}-{args.steps} of each run timed, {args.rounds} rounds")
        warm = args.warmup_steps
        bare(config, warm), engine(config, root, warm)  # warm-up: allocator, thread pools, kernels
        rows = []
        print(f"{'round':>5} {'bare samples/s':>15} {'cockpit samples/s':>18} {'ratio':>7}")
        for i in range(args.rounds):
            # Alternate which goes first, so drift (clocks, other tenants) cancels out.
            if i % 2:
                c = engine(config, root, warm)
                b = bare(config, warm)
            else:
                b = bare(config, warm)
                c = engine(config, root, warm)
            rows.append((b, c))
            print(f"{i + 1:>5} {b:>15,.0f} {c:>18,.0f} {c / b:>7.3f}", flush=True)
    bare_med = statistics.median(b for b, _ in rows)
    cockpit_med = statistics.median(c for _, c in rows)
    # Each round's two runs sit side by side in time: the median of their ratios is the
    # figure least disturbed by drift between rounds.
    ratio = statistics.median(c / b for b, c in rows)
    print(f"median: bare {bare_med:,.0f} samples/s, cockpit {cockpit_med:,.0f} samples/s; "
          f"median ratio {ratio:.3f} (target >= 0.99: {'met' if ratio >= 0.99 else 'NOT met'})")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": str(resolved.device), "device_name": name, "precision": resolved.precision,
            "compile": config.device.compile,
            "torch": torch.__version__, "args": vars(args), "rounds": rows,
            "bare_median": bare_med, "cockpit_median": cockpit_med, "median_ratio": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

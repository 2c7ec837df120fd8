"""What does cockpit's training loop cost over a bare PyTorch loop?

The same workload, model, batches, optimizer and precision are trained by a bare loop and by
the engine's Trainer (events, reporting windows, final eval and checkpoint included),
alternating which goes first, after one untimed warm-up of each. Prints each round's
samples/s and the median of the rounds' ratios. Target: cockpit >= 0.99x bare.

    python benchmarks/overhead.py                      # CPU, the defaults below
    python benchmarks/overhead.py --device cuda --steps 2000
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
from engine.train import device as devices
from engine.train.data import SampleOrder  # noqa: E402
from engine.run.events import EventWriter  # noqa: E402
from engine.run.rundir import RunDir  # noqa: E402
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
        f"precision={args.precision}",
    ])


def bare(config: runconfig.RunConfig) -> float:
    """The loop a user would write by hand; returns samples/s."""
    train, preset = config.workload.train, config.device
    resolved = devices.resolve(preset)
    torch.manual_seed(train.seed)
    workload = workloads.build("matmul", config.workload.params, train.seed)
    model = workload.build_model(grad_checkpointing=False).to(resolved.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    order = SampleOrder(workload.num_samples, train.seed)
    group = preset.effective_batch
    steps = round(train.epochs * workload.num_samples) // group

    devices.synchronize(resolved.device)
    started = time.perf_counter()
    seen = 0
    for _ in range(steps):
        for start in range(0, group, preset.batch_size):
            batch = workload.batch(order.indices(seen + start, preset.batch_size), resolved.device)
            with resolved.autocast():
                loss = workload.loss(model, batch)
            (loss * (preset.batch_size / group)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seen += group
    devices.synchronize(resolved.device)
    return seen / (time.perf_counter() - started)


def engine(config: runconfig.RunConfig, root: Path) -> float:
    """The same training through cockpit's Trainer; returns samples/s of the whole fit()."""
    run = RunDir.create(config, root)
    with EventWriter(run.events_path, attempt=1) as events:
        trainer = Trainer(run, events, config.device_preset, config.device)
        devices.synchronize(trainer.device)
        started = time.perf_counter()
        trainer.fit()  # ends with a report (a sync), the final eval and a checkpoint
        devices.synchronize(trainer.device)
        return trainer.samples_seen / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="device preset (cpu, cuda, auto)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per timed run")
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--products", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["COCKPIT_CONFIG_DIR"] = os.path.join(tmp, "config")
        root = Path(tmp) / "runs"
        config = config_for(args)
        resolved = devices.resolve(config.device)
        name = torch.cuda.get_device_name(0) if resolved.device.type == "cuda" else \
            f"{os.cpu_count()} CPU threads, torch uses {torch.get_num_threads()}"
        print(f"device {resolved.device} {resolved.precision} ({name}); torch {torch.__version__}")
        print(f"matmul n={args.n} products={args.products}, batch {args.batch_size} x "
              f"{args.accumulation}, {args.steps} optimizer steps per run, {args.rounds} rounds")
        bare(config), engine(config, root)  # warm-up: allocator, thread pools, kernels
        rows = []
        print(f"{'round':>5} {'bare samples/s':>15} {'cockpit samples/s':>18} {'ratio':>7}")
        for i in range(args.rounds):
            # Alternate which goes first, so drift (clocks, other tenants) cancels out.
            if i % 2:
                c = engine(config, root)
                b = bare(config)
            else:
                b = bare(config)
                c = engine(config, root)
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
            "torch": torch.__version__, "args": vars(args), "rounds": rows,
            "bare_median": bare_med, "cockpit_median": cockpit_med, "median_ratio": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What does measuring the gradient norm every step cost the built-in trainer?

The step event's grad_norm (issue 38) is the total L2 norm of each step's gradient before
clipping. With train.grad_clip set, clip_grad_norm_ computes it anyway: it costs nothing. Without
clipping it is one foreach norm over the gradients per step (torch.nn.utils.get_total_norm),
kept on the device and read at the report's one sync. This times the same Trainer run with the
instrument on and off (Trainer.grad_norms), alternating which goes first, after one untimed
warm-up of each; each run times its optimizer steps after --warmup-steps with a device sync at
each end (reports and events inside the window, the final eval and checkpoint after it). Prints
each round's seconds per step, the median extra cost per step and the median ratio.

    python benchmarks/instruments.py                           # CPU, matmul, no clipping
    python benchmarks/instruments.py --device cuda --steps 400 --rounds 5
    python benchmarks/instruments.py --device cuda --workload trm-chat-small \\
        --set params.data_path= --set batch_size=8 --set accumulation=1 --steps 60 --warmup-steps 20
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

from engine import runconfig  # noqa: E402
from engine.monitor import device as devices  # noqa: E402
from engine.record.events import EventWriter  # noqa: E402
from engine.record.rundir import RunDir  # noqa: E402
from engine.train.trainer import Trainer  # noqa: E402


def config_for(args) -> runconfig.RunConfig:
    overrides = [f"train.grad_clip={args.grad_clip}", "train.checkpoint_every_minutes=0",
                 "train.eval_every_steps=0", *args.set]
    if args.workload == "matmul":
        # A small data set seen for several epochs: the same steps without holding them all.
        groups_per_epoch = math.gcd(args.steps, 64)
        samples = groups_per_epoch * args.batch_size * args.accumulation
        overrides = [f"params.n={args.n}", f"params.products={args.products}",
                     f"params.samples={samples}", "params.eval_samples=256",
                     f"train.epochs={args.steps // groups_per_epoch}",
                     f"batch_size={args.batch_size}", f"accumulation={args.accumulation}", *overrides]
    return runconfig.resolve(args.workload, args.device, overrides)


def timed(config: runconfig.RunConfig, root: Path, steps: int, warmup_steps: int,
          grad_norms: bool) -> tuple[float, list[dict]]:
    """Seconds per optimizer step over steps warmup_steps+1 .. steps, and the step events."""
    run = RunDir.create(config, root)
    with EventWriter(run.events_path, attempt=1) as events:
        trainer = Trainer(run, events, config.device_preset, config.device)
        trainer.grad_norms = grad_norms
        trainer.total_steps = min(trainer.total_steps, steps)
        marks = {}
        train_step = trainer.train_step

        def marked_step() -> None:
            train_step()
            if trainer.step in (warmup_steps, trainer.total_steps):
                devices.synchronize(trainer.device)
                marks[trainer.step] = time.perf_counter()

        trainer.train_step = marked_step
        trainer.fit()
        per_step = (marks[trainer.total_steps] - marks[warmup_steps]) / (trainer.total_steps - warmup_steps)
    return per_step, [e for e in run.events() if e["type"] == "step"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="device preset (cpu, cuda, auto)")
    parser.add_argument("--workload", default="matmul", help="workload preset (default matmul)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per timed run")
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--n", type=int, default=256, help="matmul's matrix size")
    parser.add_argument("--products", type=int, default=16, help="matmul's products per sample")
    parser.add_argument("--batch-size", type=int, default=64, help="matmul's")
    parser.add_argument("--accumulation", type=int, default=2, help="matmul's")
    parser.add_argument("--grad-clip", type=float, default=0.0,
                        help="train.grad_clip on both sides (default 0: the norm is the instrument's own)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="another override, as cockpit's --set")
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args()
    if not 0 <= args.warmup_steps < args.steps:
        parser.error(f"--warmup-steps {args.warmup_steps}: expected 0 to --steps - 1")

    with tempfile.TemporaryDirectory(prefix="instr-") as tmp:
        os.environ["COCKPIT_CONFIG_DIR"] = os.path.join(tmp, "config")
        root = Path(tmp) / "runs"
        config = config_for(args)
        resolved = devices.resolve(config.device)
        name = torch.cuda.get_device_name(0) if resolved.device.type == "cuda" else \
            f"{os.cpu_count()} CPU threads, torch uses {torch.get_num_threads()}"
        print(f"device {resolved.device} {resolved.precision} ({name}); torch {torch.__version__}")
        print(f"{args.workload}, batch {config.device.batch_size} x {config.device.accumulation}, "
              f"grad_clip {args.grad_clip or 'off'}, "
              f"{'compiled' if config.device.compile else 'eager'}, "
              f"steps {args.warmup_steps + 1}-{args.steps} of each run timed, {args.rounds} rounds")
        warm = args.warmup_steps
        timed(config, root, args.steps, warm, False)
        _, events = timed(config, root, args.steps, warm, True)
        norms = [e["grad_norm"] for e in events if "grad_norm" in e]
        print(f"the instrument's step events: {len(events)}, grad_norm from {min(norms):.4g} "
              f"to {max(norms):.4g}" if norms else "no grad_norm in the step events")
        rows = []
        print(f"{'round':>5} {'off ms/step':>12} {'on ms/step':>11} {'extra us/step':>14} {'ratio':>7}")
        for i in range(args.rounds):
            # Alternate which goes first, so drift (clocks, other tenants) cancels out.
            if i % 2:
                on, _ = timed(config, root, args.steps, warm, True)
                off, _ = timed(config, root, args.steps, warm, False)
            else:
                off, _ = timed(config, root, args.steps, warm, False)
                on, _ = timed(config, root, args.steps, warm, True)
            rows.append((off, on))
            print(f"{i + 1:>5} {off * 1e3:>12.3f} {on * 1e3:>11.3f} {(on - off) * 1e6:>14.1f} "
                  f"{on / off:>7.4f}", flush=True)
    extra = statistics.median(on - off for off, on in rows)
    ratio = statistics.median(on / off for off, on in rows)
    print(f"median: off {statistics.median(o for o, _ in rows) * 1e3:.3f} ms/step, "
          f"on {statistics.median(o for _, o in rows) * 1e3:.3f} ms/step; the norm costs "
          f"{extra * 1e6:.1f} us/step, ratio on/off {ratio:.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "device": str(resolved.device), "device_name": name, "precision": resolved.precision,
            "torch": torch.__version__, "args": vars(args), "rounds_s_per_step": rows,
            "median_extra_s_per_step": extra, "median_ratio": ratio}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

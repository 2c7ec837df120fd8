"""How far a device's numbers are from the CPU's in fp32, per workload and precision: the
figures behind engine/train/parity.py's TOLERANCES, and the check's own verification.

    python benchmarks/parity.py                       # CUDA if there is one, else the CPU
    python benchmarks/parity.py --device cpu --precisions fp32,bf16 --workloads trm-tiny

For each built-in workload preset (small overrides keep the CPU side quick) and precision it
prints the loss's relative error, the worst gradient's and the worst update's (with the
parameter's name), the verdict, and the margin: tolerance / error (above 1 passes). Then the
same with the wrong-grad fault injected, which must be caught. Exit 1 if a clean check fails
or an injected one passes.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Small but real shapes: every workload's own model and batch, in seconds on the CPU.
WORKLOADS = {
    "matmul": ["params.n=256", "params.products=8", "params.samples=512"],
    "trm-tiny": ["params.corpus_bytes=200000"],
    "trm-chat-small": ["params.corpus_bytes=200000"],
    "twotower-small": [],
    "clip-tiny": [],
    "lora-grpo-wordle": ["params.corpus_bytes=200000", "params.hidden_size=256"],
}


def measure(workload: str, overrides: list[str], device: str, precision: str, perturb: bool):
    from engine import runconfig
    from engine.record.events import EventWriter
    from engine.record.rundir import RunDir
    from engine.train import parity
    from engine.train.trainer import Trainer

    config = runconfig.resolve(workload, "cpu", overrides + [f"device={device}", f"precision={precision}",
                                                             "batch_size=8", "accumulation=1"])
    run = RunDir.create(config)
    trainer = Trainer(run, EventWriter(run.events_path, attempt=1), "bench", run.config().device)
    return parity.check(trainer, perturb=perturb)


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args()
    os.environ.setdefault("COCKPIT_RUNS_DIR", tempfile.mkdtemp(prefix="cockpit-parity-"))
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    print(f"parity against the CPU in fp32 on {args.device} ({name}), torch {torch.__version__}")
    print(f"{'workload':16} {'prec':5} {'loss err':>9} {'grad err':>9} {'update err':>10} "
          f"{'margin':>7}  verdict   worst gradient")
    bad = 0
    for workload in args.workloads.split(","):
        for precision in args.precisions.split(","):
            for perturb in (False, True):
                r = measure(workload, WORKLOADS[workload], args.device, precision, perturb)
                t = r.tolerance
                margin = min(t.loss / max(r.loss_rel, 1e-30), t.grad / max(r.grad.rel, 1e-30),
                             t.update / max(r.update.rel, 1e-30))
                label = precision + ("+wg" if perturb else "")
                print(f"{workload:16} {label:7} {r.loss_rel:9.2e} {r.grad.rel:9.2e} {r.update.rel:10.2e} "
                      f"{min(margin, 9999):7.1f}  {r.verdict:9} {r.grad.name} ({r.seconds:.1f} s)",
                      flush=True)
                bad += r.ok == perturb
    print("all as expected" if not bad else f"{bad} unexpected verdict(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

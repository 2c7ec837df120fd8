"""Model FLOP utilisation of a workload through a device preset, and where the GPU's time goes.

    python benchmarks/mfu.py                                   # trm-chat-small, cuda preset
    python benchmarks/mfu.py --set compile=false --steps 6        # eager, against the cuda preset's compile
    python benchmarks/mfu.py -w clip-tiny -d cuda --set batch_size=256 --no-profile

It builds the same Trainer a run builds (the preset's batch, accumulation, precision, compile,
the workload's optimizer), times its first step (compiling, when it compiles), then `--steps`
optimizer steps between device syncs: samples/s, TFLOP/s and MFU against the datasheet peak
(engine/train/peaks.py), as the run's step events would report them. Then one more step under
torch.profiler: the GPU's kernel time by kind (matrix multiplies, attention, fused or
element-wise kernels, copies and casts, the optimizer, reductions), how much of the step the GPU
sat idle (launch gaps and syncs), and the slowest kernels by name: what is left on the table.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Kernel kinds by fragments of their names (cuBLAS/cuBLASLt, CUTLASS, flash/cuDNN attention,
# Inductor's Triton kernels, ATen's element-wise kernels); the first that matches wins.
KINDS = (
    ("fused (triton)", ("triton",)),  # Inductor's kernels, whatever they fuse
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn_generated_fort_native_sdpa")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("matmul", ("gemm", "xmma", "cutlass", "nvjet", "sm90_", "sm80_", "cublas", "matmul")),
    ("copy/cast", ("copy", "memcpy", "memset", "cast", "fill")),
    ("reduction", ("reduce", "norm", "softmax", "cross_entropy", "nll", "log_softmax")),
    ("element-wise", ("elementwise", "vectorized", "unrolled", "kernel")),
)


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, fragments in KINDS:
        if any(f in low for f in fragments):
            return kind
    return "other"


def build_trainer(workload: str, preset: str, overrides: list[str]):
    from engine import runconfig
    from engine.record.events import EventWriter
    from engine.record.rundir import RunDir
    from engine.train.trainer import Trainer

    config = runconfig.resolve(workload, preset, overrides + ["train.max_steps=100000"])
    run = RunDir.create(config)
    return Trainer(run, EventWriter(run.events_path, attempt=1), preset, run.config().device)


def profile_step(trainer) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from engine.monitor import device as devices

    devices.synchronize(trainer.device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        trainer.train_step()
        devices.synchronize(trainer.device)
        wall_us = (time.perf_counter() - start) * 1e6
    by_kind: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total
        by_kind[kind_of(event.name)] += us
        by_name[event.name] += us
    busy = sum(by_kind.values())
    print(f"\none step under the profiler: {wall_us / 1e3:.1f} ms wall, GPU kernels {busy / 1e3:.1f} ms, "
          f"idle {max(0.0, 1 - busy / wall_us):.1%} of the step")
    for kind, us in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:15} {us / 1e3:9.1f} ms  {us / busy:6.1%}")
    print("slowest kernels:")
    for name, us in sorted(by_name.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {us / 1e3:9.1f} ms  {us / busy:6.1%}  [{kind_of(name)}] {name[:110]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-w", "--workload", default="trm-chat-small")
    parser.add_argument("-d", "--device", default="cuda", help="device preset (default: cuda)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=4, help="timed optimizer steps (default 4)")
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("COCKPIT_RUNS_DIR", tempfile.mkdtemp(prefix="cockpit-mfu-"))
    import torch

    from engine.monitor import device as devices
    from engine.train import optim

    trainer = build_trainer(args.workload, args.device, args.set)
    p = trainer.preset
    flops = trainer.workload.flops_per_sample
    print(f"{args.workload} on {trainer.device} ({torch.cuda.get_device_name(trainer.device) if trainer.device.type == 'cuda' else 'CPU'}), "
          f"torch {torch.__version__}: batch {p.batch_size} x {p.accumulation}, {trainer.resolved.precision}, "
          f"compile {p.compile}, {optim.describe(trainer.optimizer, trainer.scheduler, trainer.train, trainer.workload)}")
    start = time.perf_counter()
    trainer.train_step()
    devices.synchronize(trainer.device)
    first = time.perf_counter() - start
    trainer.train_step()  # a second warm step: allocator, autotuned kernels
    devices.synchronize(trainer.device)
    start = time.perf_counter()
    for _ in range(args.steps):
        trainer.train_step()
    devices.synchronize(trainer.device)
    elapsed = time.perf_counter() - start
    samples_per_s = args.steps * trainer.global_batch / elapsed
    line = f"first step {first:.1f} s; {samples_per_s:.1f} samples/s over {args.steps} steps"
    if flops:
        tflops = samples_per_s * flops / 1e12
        line += f", {tflops:.0f} TFLOP/s"
        if trainer.peak is not None:
            line += f", MFU {tflops / trainer.peak[0]:.3f} (of {trainer.peak[0]} {trainer.resolved.precision} dense)"
    print(line)
    if trainer.device.type == "cuda":
        print(f"peak memory {torch.cuda.max_memory_allocated(trainer.device) / 2**30:.1f} GiB")
    if not args.no_profile:
        profile_step(trainer)
    return 0


if __name__ == "__main__":
    sys.exit(main())

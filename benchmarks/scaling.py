"""Throughput of one process against N processes under torchrun, through the real CLI.

    python benchmarks/scaling.py --workload trm-chat-small --device cuda --nproc 2 --steps 60
    python benchmarks/scaling.py ... --kill-rank      # also: kill rank 1 mid-run, fall back to 1

Each run is `cockpit --no-ui --json` with the same per-process micro-batch (so N processes
train a global batch N times larger, as DDP users scale); the figure is the median of the
step events' global samples/s after the first `--warmup` windows. Prints both figures and
the ratio (target on 2 GPUs: >= 1.8x).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cockpit(*args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cockpit", "--no-ui", "--json", *args],
                            stdout=subprocess.PIPE, text=True, env=env)


def measure(args, nproc: int, env: dict) -> tuple[float, list[float], dict]:
    sets = [f"train.max_steps={args.steps}", f"batch_size={args.batch_size}", "accumulation=1",
            f"nproc_per_node={nproc}", "train.report_every_s=1", "train.checkpoint_every_minutes=0",
            *args.set]
    proc = cockpit("--workload", args.workload, "--device", args.device,
                   *[a for s in sets for a in ("--set", s)], env=env)
    events = [json.loads(line) for line in proc.stdout]
    proc.wait()
    rates = [e["samples_per_s"] for e in events if e["type"] == "step"][args.warmup:-1]
    ready = next(e for e in events if e["type"] == "trainer_ready")
    if proc.returncode != 0 or not rates:
        sys.exit(f"{nproc}-process run failed (exit {proc.returncode})")
    return statistics.median(rates), rates, ready


def kill_rank(args, env: dict, config: Path) -> None:
    """Two processes, rank 1 SIGKILLed after a checkpoint: the attempt is classified and
    the run falls back to one process, resuming from the checkpoint."""
    presets = config / "presets" / "devices"
    presets.mkdir(parents=True, exist_ok=True)
    (presets / "pair.toml").write_text(
        f'device = "{args.device}"\nbatch_size = {args.batch_size}\naccumulation = 1\n'
        f'nproc_per_node = {args.nproc}\nfallback = ["single"]\nrules = {{ killed = "next" }}\n')
    (presets / "single.toml").write_text(
        f'device = "{args.device}"\nbatch_size = {args.batch_size}\naccumulation = {args.nproc}\n')
    proc = subprocess.Popen([sys.executable, "-m", "cockpit", "--no-ui", "--workload", args.workload,
                             "--device", "pair", "--set", f"train.max_steps={args.steps}",
                             "--set", "train.checkpoint_every_steps=10", *[a for s in args.set for a in ("--set", s)]],
                            stdout=subprocess.PIPE, text=True, env=env)
    runs = Path(env["COCKPIT_RUNS_DIR"])
    killed = False
    for line in proc.stdout:
        print("   ", line.rstrip())
        if not killed and line.startswith("step ") and int(line.split()[1].split("/")[0]) >= 20:
            events_path = max(runs.glob("*/events.jsonl"), key=os.path.getmtime)
            beats = [json.loads(x) for x in events_path.read_text().splitlines() if '"heartbeat"' in x]
            if beats:
                os.kill(beats[-1]["pid"], signal.SIGKILL)
                print(f"    >>> killed rank {beats[-1]['rank']} (pid {beats[-1]['pid']})")
                killed = True
    print(f"kill-rank run exit code {proc.wait()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="trm-chat-small")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16, help="per process")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=2, help="reporting windows to skip")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--kill-rank", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "COCKPIT_RUNS_DIR": f"{tmp}/runs", "COCKPIT_CONFIG_DIR": f"{tmp}/config"}
        one, rates1, ready1 = measure(args, 1, env)
        many, rates_n, ready_n = measure(args, args.nproc, env)
        print(f"workload {args.workload} on {args.device}, micro-batch {args.batch_size} per process, "
              f"{ready1['parameters']:,} parameters, {ready1['precision']}")
        print(f"1 process:  {one:,.1f} samples/s (median of {len(rates1)} windows, "
              f"{min(rates1):,.1f}-{max(rates1):,.1f})")
        print(f"{args.nproc} processes: {many:,.1f} samples/s global (median of {len(rates_n)} windows, "
              f"{min(rates_n):,.1f}-{max(rates_n):,.1f}), world size {ready_n['world_size']}")
        print(f"scaling: {many / one:.2f}x")
        if args.kill_rank:
            started = time.monotonic()
            kill_rank(args, env, Path(tmp) / "config")
            print(f"kill-rank run took {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()

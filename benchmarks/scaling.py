"""Throughput of one process against N processes under torchrun, through the real CLI.

    python benchmarks/scaling.py --workload trm-chat-small --device cuda --nproc 2 --steps 60
    python benchmarks/scaling.py ... --kill-rank      # also: kill rank 1 at a third of the run,
                                                      # fall back to 1 process

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
    """Two processes, rank 1 SIGKILLed at step --kill-at, well before the end and after a
    checkpoint: the attempt is classified and the run falls back to one process, resuming from
    the checkpoint. The events file is watched directly (the headless log prints a step line
    only every so often), and a kill that cannot happen before the end is said, not skipped."""
    presets = config / "presets" / "devices"
    presets.mkdir(parents=True, exist_ok=True)
    (presets / "pair.toml").write_text(
        f'device = "{args.device}"\nbatch_size = {args.batch_size}\naccumulation = 1\n'
        f'nproc_per_node = {args.nproc}\nfallback = ["single"]\nrules = {{ killed = "next" }}\n')
    (presets / "single.toml").write_text(
        f'device = "{args.device}"\nbatch_size = {args.batch_size}\naccumulation = {args.nproc}\n')
    kill_at = args.kill_at or args.steps // 3
    every = max(1, kill_at // 2)  # a checkpoint before the kill, so that the resume has one
    runs = Path(env["COCKPIT_RUNS_DIR"])
    before = set(runs.glob("*")) if runs.exists() else set()
    log = open(Path(env["COCKPIT_RUNS_DIR"]).parent / "kill-rank.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "cockpit", "--no-ui", "--workload", args.workload,
                             "--device", "pair", "--set", f"train.max_steps={args.steps}",
                             "--set", f"train.checkpoint_every_steps={every}", "--set", "train.report_every_s=0.05",
                             *[a for s in args.set for a in ("--set", s)]],
                            stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    killed, offset, events = None, 0, []
    while proc.poll() is None and killed is None:
        new = [r for r in runs.glob("*") if r not in before] if runs.exists() else []
        if new and (path := new[0] / "events.jsonl").exists():
            with open(path) as f:
                f.seek(offset)
                chunk = f.read()
            complete = chunk[:chunk.rfind("\n") + 1]
            offset += len(complete.encode())
            events += [json.loads(x) for x in complete.splitlines() if x.strip()]
            steps = [e["step"] for e in events if e["type"] == "step" and e.get("attempt") == 1]
            checkpointed = any(e["type"] == "checkpoint" for e in events)
            beats = [e for e in events if e["type"] == "heartbeat" and e.get("rank") == 1]
            if steps and steps[-1] >= kill_at and checkpointed and beats:
                try:
                    os.kill(beats[-1]["pid"], signal.SIGKILL)
                    killed = (steps[-1], beats[-1]["pid"])
                except ProcessLookupError:
                    sys.exit(f"rank 1 (pid {beats[-1]['pid']}) was gone before the kill at step {steps[-1]}")
        time.sleep(0.02)
    code = proc.wait()
    log.seek(0)
    for line in log:
        print("   ", line.rstrip())
    if killed is None:
        sys.exit(f"the run ended (exit {code}) before step {kill_at}: no rank was killed; "
                 "give more --steps or a smaller --kill-at")
    print(f"    >>> killed rank 1 (pid {killed[1]}) at step {killed[0]} of {args.steps}")
    events = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    for e in events:
        if e["type"] == "crash":
            print(f"    attempt {e['attempt']}: {e['kind']}: {e.get('sentence')}")
        elif e["type"] == "fallback":
            print(f"    fallback to {e['to']}, resuming at step {(e.get('resume') or {}).get('step')}")
        elif e["type"] == "run_finished":
            print(f"    run {e['status']} at step {e['summary'].get('final_step')}, "
                  f"{e['summary'].get('steps_lost')} steps lost")
    print(f"kill-rank run exit code {code}")


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
    parser.add_argument("--kill-at", type=int, default=0, help="the step at which rank 1 is killed "
                                                                "(default: a third of --steps)")
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

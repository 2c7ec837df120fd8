"""Goodput under crashes: the same run with the checkpoint interval fixed and with 'auto'.

A built-in run (matmul on the CPU, sized to take about `--minutes` of training) with a native
crash about every two minutes: the crash times are drawn (seeded) from an exponential with that
mean, each a timed fault (`native-crash@Ns`) that fires once, the next in the next attempt, and
each attempt retries on the same preset. Run twice: with the workload preset's fixed interval
(a checkpoint every minute) and with `checkpoint_every_steps = "auto"` (engine.record.interval:
Young/Daly from the measured save time and the crash rate). Prints each run's goodput and its
buckets (engine.record.goodput), and the checkpoint interval 'auto' chose.

    python benchmarks/goodput.py                   # 10 minutes each, seed 0 (about 25 minutes)
    python benchmarks/goodput.py --minutes 4 --seed 1
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.record import stats  # noqa: E402
from engine.record.goodput import BUCKETS  # noqa: E402
from engine.record.rundir import list_runs  # noqa: E402

SETTINGS = ["params.n=256", "params.products=8", "params.samples=2048", "params.eval_samples=256",
            "batch_size=32", "accumulation=2", "threads=2", "train.epochs=100000",
            "train.eval_every_steps=0", "rules={native-crash='retry'}", "max_attempts=100"]
MEAN_BETWEEN_CRASHES_S = 120.0


def cockpit(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COCKPIT_ALERTS": "off"}
    return subprocess.run([sys.executable, "-m", "cockpit", *args], capture_output=True, text=True,
                          env=env, timeout=6 * 3600)


def sets(values: list[str]) -> list[str]:
    return sum((["--set", v] for v in values), [])


def steps_per_s() -> float:
    """The run's step rate here once it is under way: the median window of a short run of it
    with nothing injected (its first windows, warming up, would undercount a long run)."""
    done = cockpit("--no-ui", "-w", "matmul", "-d", "cpu", *sets(SETTINGS + ["train.max_steps=3000"]))
    if done.returncode != 0:
        raise SystemExit(f"calibration run failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    run = list_runs()[0]
    rates = sorted(e["steps_per_s"] for e in run.events()
                   if e.get("type") == "step" and e.get("steps_per_s") and not e.get("partial"))
    return rates[len(rates) // 2] if rates else 1.0


def crash_times(minutes: float, seed: int) -> list[int]:
    """Seconds into each attempt at which it crashes: enough draws to cover the run twice over."""
    rng = random.Random(seed)
    draws, total = [], 0.0
    while total < 2 * minutes * 60:
        draw = max(10.0, rng.expovariate(1 / MEAN_BETWEEN_CRASHES_S))
        draws.append(draw)
        total += draw
    # distinct specs (a fault fires once per run): each attempt fires the earliest not yet
    # fired, so the attempts crash at these times in this order
    out: list[int] = []
    for d in sorted(draws):
        out.append(max(int(d), out[-1] + 1) if out else int(d))
    return out


def one(label: str, interval: list[str], max_steps: int, crashes: list[int]) -> dict:
    inject = "inject=[" + ", ".join(f"'native-crash@{s}s'" for s in crashes) + "]"
    started = time.monotonic()
    done = cockpit("--no-ui", "-w", "matmul", "-d", "cpu",
                   *sets(SETTINGS + interval + [f"train.max_steps={max_steps}", inject]))
    run = list_runs()[0]
    events = run.events()
    fold = stats.fold(events)
    g = fold.goodput()
    chosen = [e for e in events if e.get("type") == "checkpoint_interval"]
    return {"label": label, "status": done.returncode, "wall": time.monotonic() - started, "goodput": g,
            "crashes": sum(1 for e in events if e.get("type") == "crash"),
            "checkpoints": fold.checkpoints, "lost_steps": fold.steps_lost,
            "chosen": chosen[-1].get("reason") if chosen else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="training minutes of each run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cockpit-goodput-") as home:
        for var, sub in (("COCKPIT_RUNS_DIR", "runs"), ("COCKPIT_CONFIG_DIR", "config"),
                         ("COCKPIT_CACHE_DIR", "cache")):
            os.environ[var] = str(Path(home) / sub)
        rate = steps_per_s()
        max_steps = int(rate * args.minutes * 60)
        crashes = crash_times(args.minutes, args.seed)
        print(f"matmul on cpu: {rate:.1f} steps/s here, {max_steps:,} steps (about {args.minutes:g} "
              f"minutes of training); crashes at {', '.join(f'{c} s' for c in crashes[:8])}"
              f"{', ...' if len(crashes) > 8 else ''} into successive attempts", flush=True)
        rows = [one("fixed (every minute)", [], max_steps, crashes),
                one("auto", ["train.checkpoint_every_steps=auto"], max_steps, crashes)]
    print(f"\n{'bucket':<18}" + "".join(f"{r['label']:>24}" for r in rows))
    print(f"{'goodput':<18}" + "".join(f"{r['goodput'].fraction:>24.1%}" for r in rows))
    print(f"{'wall':<18}" + "".join(f"{r['goodput'].wall_s:>22.0f} s" for r in rows))
    print(f"{'training kept':<18}" + "".join(f"{r['goodput'].productive_s:>22.0f} s" for r in rows))
    for name in BUCKETS:
        values = [r["goodput"].buckets[name] for r in rows]
        if any(values):
            print(f"{name:<18}" + "".join(f"{v:>22.1f} s" for v in values))
    for key in ("crashes", "checkpoints", "lost_steps"):
        print(f"{key.replace('_', ' '):<18}" + "".join(f"{r[key]:>24}" for r in rows))
    for r in rows:
        if r["chosen"]:
            print(f"\n{r['label']}: {r['chosen']}")
        if r["status"] not in (0,):
            print(f"{r['label']}: cockpit exited {r['status']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

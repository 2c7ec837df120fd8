"""Threads that fit the machine: a CPU run beside busy processes, adaptive against fixed counts.

Issue 40: on the 2-core machine, matmul with 2 threads beside two busy processes trained at 178
samples/s, with 1 thread at 735; oversubscribed intra-op threads collapse. The trainer now
lowers its threads while other processes take the cores (engine.train.threads). This starts
--hogs busy processes (`while True: pass`), then trains matmul headless (`cockpit --no-ui`)
with the shipped `cpu` preset as it is (adaptive, threads up to torch's default), and with
adapt_threads off at threads=1 and threads=2, for the same --steps each (or --max-s, when it
is stopped: the collapse can make 2 threads take minutes), --rounds times, the order turned
around each round. Prints each run's samples/s (the run's own average over its
training time, as `runs show` says it), its thread changes, and the ratio of the adaptive run
to the best fixed count, per round and as the median. Target: 0.9 or more.

    python benchmarks/threads.py                     # 2 hogs, 40 steps, 1 round
    python benchmarks/threads.py --rounds 3 --steps 60
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from engine.record.rundir import RunDir, summarize  # noqa: E402

HOG = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\nwhile True: pass\n"
# name -> the --set overrides over the shipped cpu preset
RUNS = {"adaptive": [], "fixed 1": ["threads=1", "adapt_threads=false"],
        "fixed 2": ["threads=2", "adapt_threads=false"]}


def train(runs_dir: Path, steps: int, max_s: float, overrides: list[str]) -> tuple[float, int, list[dict]]:
    """One headless run of `steps`, stopped (Ctrl-C: it checkpoints and ends) if it lasts past
    `max_s`: its average samples/s over its training time, its steps and its threads events."""
    before = set(runs_dir.iterdir()) if runs_dir.exists() else set()
    sets = [f"train.max_steps={steps}", "train.checkpoint_every_minutes=0", *overrides]
    run = subprocess.Popen([sys.executable, "-m", "cockpit", "--no-ui", "-w", "matmul", "-d", "cpu",
                            "--runs-dir", str(runs_dir), *[w for s in sets for w in ("--set", s)]],
                           stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        run.wait(timeout=max_s)
    except subprocess.TimeoutExpired:
        pass
    finally:   # past max_s, or this script interrupted: the run stops as a user's would
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            run.wait()
    (path,) = set(runs_dir.iterdir()) - before
    summary = summarize(RunDir(path))
    if summary.samples_per_s is None:
        raise SystemExit(f"{path}: {summary.status}, no average samples/s")
    changes = [e for e in RunDir(path).events() if e.get("type") == "threads"]
    return summary.samples_per_s, summary.step, changes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hogs", type=int, default=2, help="busy processes beside the run")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps of 8 x 64 samples per run")
    parser.add_argument("--max-s", type=float, default=90.0,
                        help="stop a run that lasts longer (2 threads beside the hogs can take minutes)")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    print(f"{psutil.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} before the hogs; "
          f"{args.hogs} hogs, matmul, the shipped cpu preset, {args.steps} steps a run")
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    ratios = []
    try:
        with tempfile.TemporaryDirectory(prefix="cockpit-threads-") as tmp:
            for r in range(args.rounds):
                order = list(RUNS) if r % 2 == 0 else list(reversed(RUNS))
                rates = {}
                for name in order:
                    rates[name], steps, changes = train(Path(tmp), args.steps, args.max_s, RUNS[name])
                    moved = ", ".join(f"{c['was']}->{c['threads']} at step {c['step']}" for c in changes)
                    print(f"round {r + 1}  {name:<9} {rates[name]:8.1f} samples/s over {steps:>3} steps"
                          + (f"   threads {moved}" if moved else ""), flush=True)
                best = max(("fixed 1", "fixed 2"), key=lambda n: rates[n])
                ratios.append(rates["adaptive"] / rates[best])
                print(f"round {r + 1}  adaptive / best fixed ({best}): {ratios[-1]:.3f}", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
    print(json.dumps({"ratio_median": round(statistics.median(ratios), 3),
                      "ratios": [round(x, 3) for x in ratios], "target": 0.9}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

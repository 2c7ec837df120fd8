"""Does the probe's recommendation hold for real runs? Probe, then train with each candidate.

    python benchmarks/probe_vs_run.py --workload trm-tiny                  # every local device
    python benchmarks/probe_vs_run.py --workload trm-tiny --run-seconds 40 --budget 60
    python benchmarks/probe_vs_run.py --workload trm-tiny --devices cuda --no-compile --budget 30

1. `cockpit probe --json` (fresh, default budget: the probe a user gets);
2. for every candidate that trained, a real run (`cockpit --no-ui --json`, the candidate's
   device and threads) stopped after --run-seconds; its figure is the median of its step
   events' samples/s after the first window;
3. prints both figures per candidate, their ratio, whether the run's figure lies in the probe's
   90% confidence interval, and whether the two rankings agree.
Runs and the probe cache go to a temporary directory.
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
import threading
import time

from cockpit.commands.probe import table
from engine.probe.speed import ProbeResult, interval_text


def cockpit(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cockpit", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def full_run(workload: str, base: str, candidate: dict, seconds: float, sets: list[str],
             env: dict) -> tuple[float | None, int]:
    """A real run on the candidate's device and threads, stopped gracefully `seconds` after
    its trainer is ready."""
    device = candidate["device"].split(":")[0]
    overrides = [f"device={device}", "train.epochs=1000", "train.report_every_s=1",
                 "train.checkpoint_every_minutes=0", *sets]
    if device == "cpu" and candidate.get("threads"):
        overrides.append(f"threads={candidate['threads']}")
    proc = cockpit(["--no-ui", "--json", "-w", workload, "-d", base,
                    *[a for s in overrides for a in ("--set", s)]], env)
    events: list[dict] = []
    reader = threading.Thread(target=lambda: events.extend(json.loads(line) for line in proc.stdout))
    reader.start()
    started = None
    while proc.poll() is None:
        if started is None and any(e["type"] == "trainer_ready" for e in list(events)):
            started = time.monotonic()
        if started is not None and time.monotonic() - started > seconds:
            proc.send_signal(signal.SIGINT)  # graceful: finish the step, checkpoint, exit
            started = float("inf")
        time.sleep(0.2)
    reader.join()
    rates = [e["samples_per_s"] for e in events if e["type"] == "step"][1:-1]
    return (statistics.median(rates) if rates else None), len(rates)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="trm-tiny")
    parser.add_argument("--base", default="auto", help="device preset the probe varies (default auto)")
    parser.add_argument("--budget", type=float, default=None, help="probe budget (default: the probe's)")
    parser.add_argument("--run-seconds", type=float, default=30.0)
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--devices", help="the probe's --devices (default: every local device)")
    parser.add_argument("--no-compile", action="store_true", help="the probe's --no-compile")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "COCKPIT_RUNS_DIR": f"{tmp}/runs", "COCKPIT_CACHE_DIR": f"{tmp}/cache"}
        probe_args = ["probe", "--json", "--fresh", "-w", args.workload, "-d", args.base,
                      *[a for s in args.set for a in ("--set", s)]]
        if args.budget:
            probe_args += ["--budget", str(args.budget)]
        if args.devices:
            probe_args += ["--devices", args.devices]
        if args.no_compile:
            probe_args.append("--no-compile")
        started = time.monotonic()
        proc = cockpit(probe_args, env)
        out, err = proc.communicate()
        probe_s = time.monotonic() - started
        if proc.returncode not in (0, 1):
            sys.exit(f"probe failed (exit {proc.returncode}):\n{err}")
        result = json.loads(out)
        print(f"probe: {probe_s:.1f} s wall, {len(result['candidates'])} candidates")
        print(table(ProbeResult.from_dict(result)))
        print(result["sentence"])
        rows = []
        for c in result["candidates"]:
            if c["status"] not in ("ok", "rough"):
                rows.append((c, None, 0))
                continue
            rate, windows = full_run(args.workload, args.base, c, args.run_seconds, args.set, env)
            rows.append((c, rate, windows))

    print(f"\n{'candidate':<18} {'probe samples/s':>16} {'90% interval':>18} {'timed':>6} "
          f"{'run samples/s':>14} {'run/probe':>9} {'in it':>5}  windows")
    for c, rate, windows in rows:
        probe_rate = c["samples_per_s"]
        ratio = f"{rate / probe_rate:.2f}" if rate and probe_rate else "-"
        low, high = c.get("spread") or (None, None)
        inside = "-" if rate is None or low is None else \
            ("yes" if low <= rate and (high is None or rate <= high) else "no")
        print(f"{c['label']:<18} {probe_rate or 0:>16,.1f} {interval_text(c.get('spread')):>18} "
              f"{c.get('micro_batches') or c.get('windows') or 0:>6} {rate or 0:>14,.1f} {ratio:>9} "
              f"{inside:>5}  {windows}"
              + ("" if c["status"] == "ok" else f"  ({c['status']}: {c['note'] or c.get('crash')})"))
    measured = [(c["label"], rate) for c, rate, _ in rows if rate]
    by_run = [label for label, _ in sorted(measured, key=lambda x: -x[1])]
    by_probe = [label for label, _ in measured]
    print(f"\nrecommended {result['recommended']!r}; fastest in full runs {by_run[0] if by_run else None!r}; "
          f"rankings {'agree' if by_run == by_probe else 'differ'}: probe {by_probe} / runs {by_run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

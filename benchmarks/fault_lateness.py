"""How late an injected fault lands in a command: the step (and time) it was meant for against
the step the script was really on when the fault hit it.

A command's step faults are delivered by the supervisor, which reads the step from the
command's output once a poll (Supervisor.poll_s, 0.1 s) and only as fast as the script writes
it (a tqdm bar redraws at most every 0.1 s): the script runs on meanwhile. A script that
reports through cockpit.report fires its own faults at report.step, and a timed fault
(KIND@SECONDSs) needs no step at all. Each round runs a real `cockpit run --inject
native-crash@N` on a script that writes the step under way to a file before each step (so the
step it died in is known exactly) and the time step N began, for:

    tqdm      a tqdm bar over the loop (what most scripts show; examples/command/train.py)
    print     a `step N/M loss=X` line per step, flushed
    report    cockpit.report.step every step: the script aborts itself at its step
    timed     native-crash@2s on the print loop: how late past its time the supervisor fires

at step delays from a fast loop (1 ms) to a slow one (0.5 s). It prints, per case, the median
over the rounds of how many steps late the fault landed and how many seconds after step N
began (after the fault's time, for `timed`), with the range.

    python benchmarks/fault_lateness.py              # 3 rounds
    python benchmarks/fault_lateness.py --rounds 5 --delays 0.001 0.01 0.1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent("""\
    import argparse, os, time
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int)
    p.add_argument("--step-delay", type=float)
    p.add_argument("--style")
    p.add_argument("--at", type=int)      # the fault's step: when it began is written down
    p.add_argument("--state")
    args = p.parse_args()
    if args.style == "report":
        from cockpit import report
    fd = os.open(args.state, os.O_WRONLY | os.O_CREAT, 0o644)
    steps = range(1, args.steps + 1)
    if args.style == "tqdm":
        from tqdm import tqdm
        steps = tqdm(steps)
    began = None
    for step in steps:
        if step == args.at:
            began = time.time()
        # the step under way, and when step N began: read back after the fault killed us
        os.pwrite(fd, f"{step:>12d} {began or 0:>20.6f}".encode(), 0)
        if args.style == "report":
            report.step(step, total=args.steps, loss=1 / step)  # fires its fault at its step
        time.sleep(args.step_delay)
        if args.style in ("print", "timed"):
            print(f"step {step}/{args.steps} loss={1 / step:.4f}", flush=True)
""")


def one(style: str, delay: float, work: Path, env: dict[str, str]) -> tuple[int | None, float] | None:
    """(steps late, seconds late) of one run, or None when the fault did not land."""
    at = max(3, round(2.0 / delay))  # about 2 s in: past start-up
    fault = "native-crash@2s" if style == "timed" else f"native-crash@{at}"
    state = work / f"state-{style}-{delay}"
    state.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "cockpit", "run", "-d", "cpu", "--json", "--inject", fault,
         "--set", "rules={native-crash='stop'}", "--", sys.executable, str(work / "loop.py"),
         "--steps", str(at * 100), "--step-delay", str(delay), "--style", style, "--at", str(at),
         "--state", str(state)], capture_output=True, text=True, env=env, timeout=600)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    fired = [e for e in events if e["type"] == "fault_injected"]
    if not fired or not state.exists():
        return None
    step, began = state.read_text().split()
    if style == "timed":  # no step was asked for: only how long past its time it came
        return None, round(fired[0]["at_s"] - 2.0, 3) + 0.0
    # events carry milliseconds: a fault fired in step N may read a hair before it began
    return int(step) - at, max(0.0, fired[0]["t"] - float(began))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delays", type=float, nargs="+", default=[0.001, 0.01, 0.1, 0.5])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "loop.py").write_text(SCRIPT)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COCKPIT_RUNS_DIR": str(work / "runs"),
               "COCKPIT_CONFIG_DIR": str(work / "config"), "COCKPIT_ALERTS": "off"}
        print(f"{'case':<8} {'step delay':>10}  {'steps late (median, range)':>28}  "
              f"{'seconds late (median, range)':>30}")
        for style in ("tqdm", "print", "report", "timed"):
            for delay in args.delays:
                got = [r for r in (one(style, delay, work, env) for _ in range(args.rounds)) if r]
                if not got:
                    print(f"{style:<8} {delay:>9g}s  {'did not fire':>28}")
                    continue
                steps, secs = [g[0] for g in got if g[0] is not None], [g[1] for g in got]
                late = f"{statistics.median(steps):g} ({min(steps)}-{max(steps)})" if steps else "-"
                print(f"{style:<8} {delay:>9g}s  {late:>28}  {statistics.median(secs):>12.3f} "
                      f"({min(secs):.3f}-{max(secs):.3f})"
                      + ("" if len(got) == args.rounds else f"  [{len(got)}/{args.rounds} fired]"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

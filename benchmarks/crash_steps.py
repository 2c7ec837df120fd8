"""Steps at death: what cockpit tells of a crash against where training really was.

Each draw crashes a real run at a random step and lets it resume. The truth comes from the
run itself, not from cockpit's count:

    trainer   the built-in trainer (matmul, default half-second reports) with
              `--inject native-crash@K`: the fault fires as step K begins, so K-1 were done
    command   a script of its own that prints every step it trains, reports every 10th
              (cockpit.report.step), says each one reached (cockpit.report.reached) and
              aborts itself at step K of its first attempt; it checkpoints every 20

For each: the step the crash sentence names, the last step reported before it (what cockpit
could know without the published step), and the steps lost as run_finished counts them
against the steps trained again (reached less the step the next attempt resumed from).

    python benchmarks/crash_steps.py                # 6 trainer draws, 4 command draws, seed 0
    python benchmarks/crash_steps.py --trainer 10 --command 10 --seed 3

Target: the sentence names the step reached, and steps lost equal the steps trained again, in
every draw.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.record.rundir import RunDir, list_runs  # noqa: E402

TRAINER = ["params.n=96", "params.products=8", "params.samples=6400", "params.eval_samples=256",
           "batch_size=16", "accumulation=2", "threads=1", "train.epochs=1",
           "train.checkpoint_every_steps=25", "train.checkpoint_every_minutes=0"]
TRAINER_STEPS = 200

SCRIPT = """\
    import json, os, sys, time
    from cockpit import report
    out, crash_at, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    os.makedirs(out, exist_ok=True)
    start = json.load(open(resume[-1]))["step"] if resume else 0
    for step in range(start + 1, 121):
        time.sleep(0.003)
        report.reached(step, samples=step * 4)
        print(f"trained step {step}", flush=True)
        if step == crash_at and not resume:
            os.abort()
        if step % 10 == 0:
            report.step(step, total=120, loss=1 / step, samples=step * 4)
        if step % 20 == 0:
            path = os.path.join(out, f"ckpt-{step}.json")
            json.dump({"step": step}, open(path, "w"))
            report.checkpoint(path, step, samples=step * 4)
"""


def cockpit(*args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "cockpit", *args], capture_output=True, text=True,
                          env=env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"cockpit {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")


def newest_run() -> RunDir:
    return max(list_runs(), key=lambda r: r.path.stat().st_mtime)


def told(run: RunDir) -> dict:
    events = run.events()
    crash = next(e for e in events if e["type"] == "crash")
    at = events.index(crash)
    reports = [e["step"] for e in events[:at] if e["type"] in ("step", "progress") and e["attempt"] == 1]
    finished = next(e for e in events if e["type"] == "run_finished")
    said = re.search(r"after step (\d+)", crash["sentence"])
    return {"sentence": int(said.group(1)) if said else None,
            "reported": max(reports, default=None), "lost": finished["summary"]["steps_lost"],
            "status": finished["status"]}


def trainer_draw(at: int) -> dict:
    cockpit("--no-ui", "-w", "matmul", "-d", "cpu", "--inject", f"native-crash@{at}",
            *sum((["--set", s] for s in TRAINER), []))
    run = newest_run()
    ready = [e for e in run.events() if e["type"] == "trainer_ready"]
    resumed = (ready[1].get("resumed_from") or {}).get("step", 0) if len(ready) > 1 else None
    reached = at - 1
    return {"kind": "trainer", "at": at, "reached": reached, **told(run),
            "again": reached - resumed if resumed is not None else None}


def command_draw(at: int, script: Path) -> dict:
    cockpit("run", "-d", "cpu", "--set", "command.resume=['{checkpoint}']",
            "--", sys.executable, str(script), "{run_dir}/out", str(at))
    run = newest_run()
    trained = [int(s) for s in re.findall(r"^trained step (\d+)$", run.attempt_log(1).read_text(), re.M)]
    started = next(e for e in run.events() if e["type"] == "attempt_started" and e["attempt"] == 2)
    resumed = (started.get("resume") or {}).get("step", 0)
    reached = max(trained)
    return {"kind": "command", "at": at, "reached": reached, **told(run), "again": reached - resumed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trainer", type=int, default=6, help="trainer draws")
    parser.add_argument("--command", type=int, default=4, help="command draws")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="cockpit-crash-steps-") as home:
        home = Path(home)
        for var, sub in (("COCKPIT_RUNS_DIR", "runs"), ("COCKPIT_CONFIG_DIR", "config"),
                         ("COCKPIT_CACHE_DIR", "cache")):
            os.environ[var] = str(home / sub)
        os.environ["COCKPIT_ALERTS"] = "off"
        script = home / "script.py"
        script.write_text(textwrap.dedent(SCRIPT))
        print(f"{'kind':<8} {'fault':>5} {'reached':>7} {'told':>5} {'last report':>11} "
              f"{'lost (told)':>11} {'trained again':>13}  ok")
        rows = []
        for kind, n in (("trainer", args.trainer), ("command", args.command)):
            for _ in range(n):
                if kind == "trainer":
                    row = trainer_draw(rng.randint(30, TRAINER_STEPS - 20))
                else:
                    row = command_draw(rng.randint(21, 100), script)
                row["ok"] = row["sentence"] == row["reached"] and row["lost"] == row["again"] \
                    and row["status"] == "finished"
                rows.append(row)
                print(f"{row['kind']:<8} {row['at']:>5} {row['reached']:>7} {row['sentence']!s:>5} "
                      f"{row['reported']!s:>11} {row['lost']:>11} {row['again']!s:>13}  "
                      f"{'yes' if row['ok'] else 'NO'}", flush=True)
        exact = sum(r["ok"] for r in rows)
        print(f"\nexact in {exact}/{len(rows)} draws; steps lost told {sum(r['lost'] for r in rows)}, "
              f"trained again {sum(r['again'] or 0 for r in rows)}; the last reports alone were "
              f"{sum(r['reached'] - (r['reported'] or 0) for r in rows)} steps behind in all")
        return 0 if exact == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())

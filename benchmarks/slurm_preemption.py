"""A warned SLURM job, measured: the warning signal -> checkpoint written -> requeued -> its next
start -> training again, and the steps lost, on a real one-node cluster (tools/slurm_cluster.py).

    python benchmarks/slurm_preemption.py                 # starts a cluster, stops it after
    COCKPIT_SLURM_CONF=DIR/slurm.conf python benchmarks/slurm_preemption.py   # one that runs

A matmul run is submitted with `cockpit submit`; once it trains, `scancel -b -s USR1 JOB` sends
the warning exactly as `--signal=B:USR1@120` does before a time limit. The times are read from
the run's own events (each has its wall-clock time), not from this script's clock. Prints
figures; asserts nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.record.rundir import RunDir, summarize  # noqa: E402  (the checkout's engine)

RUN = ["params.n=64", "params.samples=4096", "train.epochs=20", "train.checkpoint_every_steps=50",
       "batch_size=16", "accumulation=2", "threads=1"]


def main() -> int:
    script = [sys.executable, str(ROOT / "tools" / "slurm_cluster.py")]
    conf = os.environ.get("COCKPIT_SLURM_CONF")
    started = None
    if not conf:
        done = subprocess.run([*script, "start"], capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr.strip(), file=sys.stderr)
            return done.returncode
        conf = next(line.split("=", 1)[1] for line in done.stdout.splitlines()
                    if line.startswith("export SLURM_CONF="))
        started = Path(conf).parent
    runs = Path(tempfile.mkdtemp(prefix="cockpit-slurm-bench-"))
    job = None
    env = {**os.environ, "SLURM_CONF": conf, "COCKPIT_RUNS_DIR": str(runs), "COCKPIT_ALERTS": "off",
           "PYTHONPATH": str(ROOT)}
    try:
        sets = [a for s in RUN for a in ("--set", s)]
        done = subprocess.run([sys.executable, "-m", "cockpit", "submit", "-w", "matmul", "-d", "cpu", *sets],
                              capture_output=True, text=True, env=env, check=True)
        run = RunDir(runs / done.stdout.strip())
        job = json.loads((run.path / "slurm.json").read_text())["job_id"]
        events = lambda kind: [e for e in run.events() if e["type"] == kind]   # noqa: E731
        while len(events("step")) < 3:
            time.sleep(0.2)
        subprocess.run(["scancel", "-b", "-s", "USR1", job], env=env, check=True)
        while summarize(run).status != "finished":
            time.sleep(0.5)
        stop = events("stop_requested")[0]
        saved = next(e for e in events("checkpoint") if e["t"] >= stop["t"])
        preempted = next(e for e in events("run_finished") if e["status"] == "preempted")
        again = events("slurm_job")[1]
        ready = next(e for e in events("trainer_ready") if e["attempt"] == 2)
        first = next(e for e in events("step") if e["attempt"] == 2)
        s = summarize(run)
        print(f"job {job}: the warning (SIGUSR1) at step {events('attempt_ended')[0]['last_step']}")
        print(f"  warning -> checkpoint written     {saved['t'] - stop['t']:6.2f} s (step {saved['step']})")
        print(f"  checkpoint -> job requeued         {preempted['t'] - saved['t']:6.2f} s (the supervisor's exit)")
        print(f"  requeued -> started again          {again['t'] - preempted['t']:6.2f} s (SLURM's BeginTime and scheduling)")
        print(f"  started again -> trainer ready     {ready['t'] - again['t']:6.2f} s (resumed from step {ready['resumed_from']['step']})")
        print(f"  trainer ready -> first step        {first['t'] - ready['t']:6.2f} s")
        print(f"  warning -> training again          {first['t'] - stop['t']:6.2f} s")
        print(f"  steps lost: {s.steps_lost or 0}; finished at step {s.step}/{s.total_steps}, "
              f"{again['restarts']} requeue")
    finally:
        if job is not None:   # whatever happened, nothing left in the queue
            subprocess.run(["scancel", job], env=env, capture_output=True)
        if started is not None:
            subprocess.run([*script, "stop", "--dir", str(started)], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Several machines, measured on loopback: real torchrun agents (127.0.0.2 and .3, gloo on the
CPU), each under a node supervisor started by the real CLI, in one c10d rendezvous.

    python benchmarks/nodes.py            # nodes, then the SLURM preemption (its own script)
    python benchmarks/nodes.py --no-slurm

1. the rate: the same matmul run on one machine, then on two (one process each, one thread);
   on this 2-core machine the two share the cores, so the ratio says what the rendezvous and
   the all-reduce cost more than what a second host would give.
2. a machine lost: `--inject node-lost@N` on b kills its agent and workers at step N. From the
   run's own events (each has its wall-clock time, not this script's clock): the loss -> a's
   attempt judged node-lost (detected) -> a training alone again (its first step at world 1),
   the steps lost; then b back -> the run at two machines again (its first step at world 2).
3. SLURM: benchmarks/slurm_preemption.py (warning -> checkpoint -> requeued -> training again).

Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.record.rundir import RunDir, summarize  # noqa: E402  (the checkout's engine)

RUN = ["params.n=64", "params.samples=2048", "batch_size=16", "accumulation=1", "threads=1",
       "train.checkpoint_every_steps=20", "train.report_every_s=0.25"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def cockpit(runs: Path, *args: str, address: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "COCKPIT_RUNS_DIR": str(runs), "COCKPIT_ALERTS": "off", "PYTHONPATH": str(ROOT),
           **({"PET_LOCAL_ADDR": address} if address else {})}
    return subprocess.Popen([sys.executable, "-m", "cockpit", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def sets(items: list[str]) -> list[str]:
    return [a for s in items for a in ("--set", s)]


def machines(runs: Path, run_id: str, extra: list[str], b_args: list[str] = ()) -> list[subprocess.Popen]:
    port = free_port()
    common = ["--no-ui", "-w", "matmul", "-d", "cpu", "--run-id", run_id,
              *sets(RUN + extra + [f"rdzv_endpoint=127.0.0.1:{port}"])]
    a = cockpit(runs, *common, "--node", "a", address="127.0.0.2")
    while not listening(port) and a.poll() is None:
        time.sleep(0.1)   # a's agent hosts the store: b is the one lost
    return [a, cockpit(runs, *common, "--node", "b", *b_args, address="127.0.0.3")]


def of(run: RunDir, kind: str) -> list[dict]:
    return [e for e in run.events() if e["type"] == kind]


def rate() -> None:
    runs = Path(tempfile.mkdtemp(prefix="cockpit-nodes-bench-"))
    one = cockpit(runs, "--no-ui", "-w", "matmul", "-d", "cpu", *sets(RUN + ["train.epochs=20"]))
    one.wait()
    (single,) = [r for r in runs.iterdir()]
    alone = summarize(RunDir(single)).samples_per_s or 0.0
    two = machines(runs, "two", ["nnodes=2", "train.epochs=20"])
    for p in two:
        p.wait()
    pair = summarize(RunDir(runs / "two" / "nodes" / "a")).samples_per_s or 0.0
    print(f"rate      one machine {alone:,.0f} samples/s; two loopback machines {pair:,.0f} samples/s "
          f"(x{pair / alone:.2f}; both on this machine's {os.cpu_count()} cores)")


def lost() -> None:
    runs = Path(tempfile.mkdtemp(prefix="cockpit-nodes-bench-"))
    procs = machines(runs, "lost", ["nnodes=1:2", "train.epochs=400"], ["--inject", "node-lost@40"])
    a, b = (RunDir(runs / "lost" / "nodes" / n) for n in "ab")
    try:
        while not [e for e in of(a, "nodes_changed") if e["attempt"] >= 2 and e["nodes"] == 2]:
            if any(p.poll() is not None for p in procs):
                print("lost      a machine ended before the run grew back; see", runs)
                return
            time.sleep(0.5)
        grew = [e for e in of(a, "nodes_changed") if e["attempt"] >= 2 and e["nodes"] == 2][0]
        while not [e for e in of(a, "step") if e["t"] > grew["t"]]:
            time.sleep(0.2)
    finally:
        stop = subprocess.run([sys.executable, "-m", "cockpit", "runs", "stop", "lost"], capture_output=True,
                              env={**os.environ, "COCKPIT_RUNS_DIR": str(runs), "PYTHONPATH": str(ROOT)})
        for p in procs:
            p.wait(300)
    fired = of(b, "fault_injected")[0]
    crash = of(a, "crash")[0]
    shrank = [e for e in of(a, "nodes_changed") if e["nodes"] == 1][0]
    alone = next(e for e in of(a, "step") if e["t"] > shrank["t"])
    back = next(e for e in of(a, "step") if e["t"] > grew["t"])
    print(f"lost      a's verdict: {crash['kind']}: {crash['sentence']}")
    print(f"lost      b's agent killed at step {fired['step']} -> a judged node-lost in "
          f"{crash['t'] - fired['t']:.1f} s -> training alone again {alone['t'] - crash['t']:.1f} s later "
          f"(from step {shrank['resumed_step']}, {shrank['steps_lost']} steps lost)")
    print(f"back      b rejoined -> training at two machines again {back['t'] - shrank['t']:.1f} s after "
          f"a re-formed alone ({grew['steps_lost']} steps lost: the restart checkpointed first)"
          + ("" if stop.returncode == 0 else "  [runs stop said: " + stop.stdout.decode().strip() + "]"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-slurm", action="store_true")
    args = parser.parse_args()
    rate()
    lost()
    if not args.no_slurm:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import slurm_preemption

        return slurm_preemption.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())

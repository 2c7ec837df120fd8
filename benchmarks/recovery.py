"""Recovery: how long from a trainer's death to the next attempt's first step.

A small built-in run (matmul on a CPU preset, a checkpoint every few steps) dies several times,
by injected native crashes (`native-crash@5s`: the trainer aborts 5 s into its attempt) and by
SIGKILL from outside (a thread kills the trainer a random moment 4 to 4.5 s past its first step),
and is resumed by the real supervisor each time; once the last death's attempt has trained a
step, the run is stopped. Each attempt lives a few seconds, as a real one would before it dies: a
spare started when it began training has had the time to import torch. From the events, per
death:

    detect   the death (the fault_injected event's t, or the kill's time) -> the supervisor's
             crash event
    decide   crash -> attempt_started of the next attempt
    launch   attempt_started -> trainer_ready (interpreter, imports, the model, the resume)
    first    trainer_ready -> the first step event
    total    death -> the next attempt's first step event

and their medians, for each variant the supervisor can be switched into: the exit wait
(`wake_on_exit`: the loop wakes when the attempt dies, rather than at its next poll) and the
spare process (`spare`, or COCKPIT_SPARE=0: the next attempt pre-started, torch imported). A
supervisor without a switch (an older checkout) runs its one way, shown as `as is`.

    python benchmarks/recovery.py                  # every variant, 3 crashes + 3 kills each
    python benchmarks/recovery.py --crashes 4 --kills 0 --variants both,none
    python benchmarks/recovery.py --kind oom --crashes 4 --kills 0 --variants both   # exceptions

Target (issue 27, item 4), built-in CPU workloads on a 2-core VM: death -> first step, median
<= 1.5 s.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHECKPOINT_EVERY = 50
# open-ended (the run is stopped after the last recovery); a step is a few milliseconds
SETTINGS = ["params.n=128", "params.products=2", "params.samples=4096", "params.eval_samples=64",
            "batch_size=8", "accumulation=2", "threads=1", "train.epochs=1000",
            f"train.checkpoint_every_steps={CHECKPOINT_EVERY}", "train.report_every_s=0.02",
            "train.keep_checkpoints=2", "train.eval_every_steps=0"]
CRASH_AFTER_S = 5.0    # an injected crash: this long after its attempt started (its launch)
KILL_AFTER_S = 4.0     # a kill: this long after its attempt's first step, plus up to 0.5 s
# (name, supervisor keywords): what each variant switches
VARIANTS = {"both": {"wake_on_exit": True, "spare": True},
            "wait": {"wake_on_exit": True, "spare": False},
            "spare": {"wake_on_exit": False, "spare": True},
            "none": {"wake_on_exit": False, "spare": False}}
PHASES = ("detect", "decide", "launch", "first", "total")


class Killer(threading.Thread):
    """SIGKILLs the trainer of attempts `first`, `first + 1`... `after` s past each one's first
    step, plus a random moment up to 0.5 s (the supervisor's poll is not in step with it);
    records each kill's time.time() by attempt."""

    def __init__(self, events_path: Path, first: int, kills: int, after: float, rng: random.Random):
        super().__init__(daemon=True)
        self.path, self.first, self.kills, self.after, self.rng = events_path, first, kills, after, rng
        self.killed: dict[int, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        offset, pids, due = 0, {}, {}
        while not self.done.is_set() and len(self.killed) < self.kills:
            try:
                with open(self.path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                chunk = b""
            complete = chunk[:chunk.rfind(b"\n") + 1]
            offset += len(complete)
            for line in complete.splitlines():
                e = json.loads(line)
                attempt = e.get("attempt")
                if e["type"] == "trainer_ready":
                    pids[attempt] = e["pid"]
                elif e["type"] == "step" and attempt in pids and attempt >= self.first:
                    due.setdefault(attempt, time.monotonic() + self.after + self.rng.uniform(0, 0.5))
            for attempt, when in list(due.items()):
                if attempt not in self.killed and time.monotonic() >= when:
                    self.killed[attempt] = time.time()
                    try:
                        os.kill(pids[attempt], signal.SIGKILL)
                    except ProcessLookupError:
                        self.killed.pop(attempt)
                    due.pop(attempt)
            time.sleep(0.01)


def one_run(variant: dict, crashes: int, kills: int, rng: random.Random, kind: str = "native-crash") -> list[dict]:
    from engine import runconfig
    from engine.record.rundir import RunDir
    from engine.run.supervisor import Supervisor

    # the crashes first, one an attempt (each fault fires once a run: distinct times), then kills
    faults = [f"{kind}@{CRASH_AFTER_S + 0.1 * i:g}s" for i in range(crashes)]
    run = RunDir.create(runconfig.resolve("matmul", "recovery", SETTINGS + [f"inject={faults!r}"]))
    accepted = inspect.signature(Supervisor).parameters
    keywords = {k: v for k, v in variant.items() if k in accepted}
    supervisor = Supervisor(run, poll_s=0.1, **keywords)
    last = crashes + kills + 1

    def stop_after_last_recovery(events: list[dict]) -> None:
        if not supervisor.stop_requests and any(e["type"] == "step" and e.get("attempt") == last
                                                for e in events):
            supervisor.request_stop()   # once: a graceful stop

    supervisor.on_events = stop_after_last_recovery
    killer = Killer(run.events_path, crashes + 1, kills, KILL_AFTER_S, rng)
    killer.start()
    try:
        status = supervisor.supervise()
    finally:
        killer.done.set()
        killer.join()
    if status != "stopped":
        raise SystemExit(f"recovery: the run ended {status}, not stopped after its last recovery "
                         f"({run.path})")
    return deaths(run.events(), killer.killed, getattr(supervisor, "spare_pids", []))


def deaths(events: list[dict], killed: dict[int, float], spares: list[int]) -> list[dict]:
    """One row per attempt that died: its phases in seconds."""
    def first(kind: str, attempt: int) -> dict | None:
        return next((e for e in events if e["type"] == kind and e.get("attempt") == attempt), None)

    rows = []
    for crash in (e for e in events if e["type"] == "crash"):
        n = crash["attempt"]
        fault = first("fault_injected", n)
        died = fault["t"] if fault else killed.get(n)
        started, ready, step = first("attempt_started", n + 1), first("trainer_ready", n + 1), \
            first("step", n + 1)
        if died is None or not (started and ready and step):
            continue
        rows.append({"how": "crash" if fault else "kill", "kind": crash["kind"],
                     "spare": ready.get("pid") in spares,
                     "detect": crash["t"] - died, "decide": started["t"] - crash["t"],
                     "launch": ready["t"] - started["t"], "first": step["t"] - ready["t"],
                     "total": step["t"] - died})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crashes", type=int, default=3, help="injected native crashes per run")
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs from outside per run")
    parser.add_argument("--variants", default="both,wait,spare,none",
                        help="comma-separated: " + ", ".join(VARIANTS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kind", default="native-crash", choices=["native-crash", "oom", "user-code"],
                        help="what the injected crashes are: an abort, or an exception the trainer "
                             "raises (its end goes through the trainer's own exit)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="cockpit-recovery-") as home:
        home_path = Path(home)
        os.environ.update(COCKPIT_RUNS_DIR=str(home_path / "runs"), COCKPIT_ALERTS="off",
                          COCKPIT_CONFIG_DIR=str(home_path / "config"),
                          COCKPIT_CACHE_DIR=str(home_path / "cache"))
        presets = home_path / "config" / "presets" / "devices"
        presets.mkdir(parents=True)
        (presets / "recovery.toml").write_text(
            f'device = "cpu"\nmax_attempts = {args.crashes + args.kills + 2}\n'
            f'rules = {{ {args.kind} = "retry", killed = "retry" }}\n')
        from engine.run.supervisor import Supervisor

        accepted = inspect.signature(Supervisor).parameters
        names = [v.strip() for v in args.variants.split(",") if v.strip()]
        if not any(k in accepted for k in ("wake_on_exit", "spare")):
            names = ["as is"]   # a supervisor without the switches
        medians = {}
        print(f"{'variant':<8} {'#':>2} {'how':<6} {'spare':<5} " + " ".join(f"{p:>7}" for p in PHASES))
        for name in names:
            rows = one_run(VARIANTS.get(name, {}), args.crashes, args.kills, rng, args.kind)
            for i, row in enumerate(rows, 1):
                print(f"{name:<8} {i:>2} {row['how']:<6} {'yes' if row['spare'] else 'no':<5} "
                      + " ".join(f"{row[p]:>7.3f}" for p in PHASES), flush=True)
            medians[name] = {p: statistics.median(r[p] for r in rows) for p in PHASES} if rows else {}
            if medians[name]:
                print(f"{name:<8} {'median':<15} " + " ".join(f"{medians[name][p]:>7.3f}" for p in PHASES),
                      flush=True)
        print("\nmedians (s), death -> next attempt's first step; target <= 1.5 s")
        print(f"{'variant':<8} " + " ".join(f"{p:>7}" for p in PHASES) + "  vs none")
        base = medians.get("none", {}).get("total")
        for name, m in medians.items():
            if m:
                ratio = f"  {m['total'] / base:.2f}x" if base else ""
                print(f"{name:<8} " + " ".join(f"{m[p]:>7.3f}" for p in PHASES) + ratio)
        best = min((m["total"] for m in medians.values() if m), default=None)
        return 0 if best is not None and best <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Chaos: kill the trainer or the supervisor at random points of real runs, then recover.

Each draw starts a real run detached (`cockpit --no-ui --detach`, the matmul workload on a CPU
preset with a one-step ladder), waits for a random step past the first checkpoint, and sends a
random signal -- SIGKILL, SIGSEGV or SIGABRT -- to the trainer or to the supervisor. A dead
trainer is the supervisor's to detect, classify and resume from; a dead supervisor is the
lifeline's to notice (the trainer checkpoints and exits, the run reads `interrupted`), and the
run is then continued with `cockpit runs resume`. Every draw is checked:

    detected     the death was seen (a crash event, or the lifeline's supervisor_lost)
    classified   the crash kind (native-crash for SIGSEGV/SIGABRT, killed for SIGKILL) or
                 `interrupted` for a supervisor
    resumed at   the step the next attempt started from, and the newest checkpoint announced
                 before it; resuming later than that is right (a trainer killed between writing
                 a checkpoint and announcing it resumes from the file), earlier is a failure
    finished     the run ended `finished`
    events       every line of events.jsonl parses (a torn line is a failure)
    checkpoints  every checkpoint left loads, checksums verified (engine.record.checkpoint)

    python benchmarks/chaos.py                 # 12 draws, seed 0
    python benchmarks/chaos.py --draws 30 --seed 7

Target: every draw recovered, nothing corrupt.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.record import stats  # noqa: E402
from engine.record.identity import ProcessId  # noqa: E402
from engine.record.rundir import RunDir, summarize  # noqa: E402

SIGNALS = (signal.SIGKILL, signal.SIGSEGV, signal.SIGABRT)
TARGETS = ("trainer", "supervisor")
EXPECTED = {"SIGKILL": "killed", "SIGSEGV": "native-crash", "SIGABRT": "native-crash"}
TOTAL_STEPS = 120
CHECKPOINT_EVERY = 10
DEADLINE_S = 300.0
SETTINGS = ["params.n=96", "params.products=8", "params.samples=3840", "params.eval_samples=256",
            "batch_size=16", "accumulation=2", "threads=1", "train.epochs=1",
            f"train.checkpoint_every_steps={CHECKPOINT_EVERY}", "train.report_every_s=0.05",
            "train.keep_checkpoints=3"]


def cockpit(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "cockpit", *args], capture_output=True,
                            text=True, env=env, timeout=DEADLINE_S)
    if check and result.returncode not in (0, 1):
        raise SystemExit(f"cockpit {' '.join(args)} exited {result.returncode}: {result.stderr}")
    return result


def events_of(run: RunDir) -> tuple[list[dict], bool]:
    """The events, and whether every line parsed."""
    events, intact = [], True
    for line in run.events_path.read_bytes().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            intact = False
    return events, intact


def wait(predicate, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.02)
    raise SystemExit(f"chaos: no {what} within {DEADLINE_S:.0f} s")


def draw_once(rng: random.Random, runs: Path) -> dict:
    target, sig = rng.choice(TARGETS), rng.choice(SIGNALS)
    at = rng.randint(CHECKPOINT_EVERY + 1, TOTAL_STEPS - 10)
    started = cockpit("--no-ui", "--detach", "-w", "matmul", "-d", "chaos", *sum((["--set", s] for s in SETTINGS), []))
    run = RunDir(runs / started.stdout.strip())

    def reached():
        steps = [e for e in events_of(run)[0] if e.get("type") == "step" and e["step"] >= at]
        return steps[-1] if steps else None

    wait(reached, f"step {at}")
    events, _ = events_of(run)
    process = [e for e in events if e["type"] == "attempt_process"][-1]
    victim = ProcessId(process["pid"], process["start"]) if target == "trainer" else \
        ProcessId.parse(run.pid_path.read_text())
    before = {e["path"]: e for e in events if e["type"] == "checkpoint"}
    killed_at = max(e["step"] for e in events if e["type"] == "step")
    if victim is None or not victim.alive():
        return {"target": target, "signal": sig.name, "at": killed_at, "skipped": "ended first"}
    os.kill(victim.pid, sig)

    def ended():
        status = summarize(run).status
        return status if status in ("finished", "failed", "stopped", "interrupted") else None

    status = wait(ended, "end of the run")
    if status == "interrupted":
        cockpit("runs", "resume", run.id)
        status = summarize(run).status
    events, intact = events_of(run)
    crash = next((e for e in events if e["type"] in ("crash", "supervisor_lost")), None)
    kind = (crash or {}).get("kind") or ("interrupted" if crash else None)
    ready = [e for e in events if e["type"] == "trainer_ready"]
    resumed = ready[1]["resumed_from"] if len(ready) > 1 else None
    # The newest checkpoint on record when the next attempt started: those written before the
    # kill, and those the trainer wrote on its way out.
    second = next((i for i, e in enumerate(events) if e["type"] == "attempt_started" and e["attempt"] == 2), None)
    written = [e for e in events[:second] if e["type"] == "checkpoint"] if second else list(before.values())
    newest = max((e["step"] for e in written), default=None)
    expected = EXPECTED[sig.name] if target == "trainer" else "interrupted"
    goodput = stats.fold(events).goodput()
    return {
        "target": target, "signal": sig.name, "at": killed_at,
        "detected": crash is not None, "classified": kind, "expected": expected,
        "resumed_at": resumed["step"] if resumed else None,
        "newest": newest,
        "finished": status == "finished", "events_ok": intact,
        "checkpoints_ok": checkpoints_load(run),
        "goodput": goodput.fraction, "recovery_s": goodput.buckets["recovery"],
        "gaps_s": goodput.gaps_s,
    }


def checkpoints_load(run: RunDir) -> bool:
    """Every checkpoint left loads, checksums verified (engine.record.checkpoint.load)."""
    from engine.record import checkpoint

    for path in run.checkpoints.glob("*.pt"):
        try:
            checkpoint.load(path)
        except checkpoint.Unreadable:
            return False
    return True


def recovered(row: dict) -> bool:
    return bool(row.get("detected") and row["classified"] == row["expected"] and row["finished"]
                and row["resumed_at"] is not None and row["resumed_at"] >= (row["newest"] or 0)
                and row["events_ok"] and row["checkpoints_ok"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draws", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="cockpit-chaos-") as home:
        home = Path(home)
        os.environ["COCKPIT_RUNS_DIR"] = str(home / "runs")
        os.environ["COCKPIT_CONFIG_DIR"] = str(home / "config")
        os.environ["COCKPIT_CACHE_DIR"] = str(home / "cache")
        presets = home / "config" / "presets" / "devices"
        presets.mkdir(parents=True)
        (presets / "chaos.toml").write_text('device = "cpu"\nfallback = ["chaos-2"]\nmax_attempts = 5\n')
        (presets / "chaos-2.toml").write_text('device = "cpu"\n')
        print(f"{'#':>2} {'target':<10} {'signal':<7} {'step':>4}  {'detected':<8} {'classified':<12} "
              f"{'resumed at':<16} {'finished':<8} {'events':<6} {'ckpts':<5} ok   goodput  recovery")
        rows = []
        for i in range(1, args.draws + 1):
            row = draw_once(rng, home / "runs")
            rows.append(row)
            if "skipped" in row:
                print(f"{i:>2} {row['target']:<10} {row['signal']:<7} {row['at']:>4}  skipped: {row['skipped']}")
                continue
            resumed = f"{row['resumed_at']} (newest {row['newest']})"
            print(f"{i:>2} {row['target']:<10} {row['signal']:<7} {row['at']:>4}  "
                  f"{_yes(row['detected']):<8} {row['classified'] or '-':<12} {resumed:<16} "
                  f"{_yes(row['finished']):<8} {_yes(row['events_ok']):<6} {_yes(row['checkpoints_ok']):<5} "
                  f"{_yes(recovered(row)):<4} {_percent(row['goodput']):>7} {row['recovery_s']:>7.2f} s", flush=True)
        drawn = [r for r in rows if "skipped" not in r]
        good = sum(recovered(r) for r in drawn)
        corrupt = sum(not (r["events_ok"] and r["checkpoints_ok"]) for r in drawn)
        trainer = sorted(r["recovery_s"] for r in drawn if r["target"] == "trainer")
        if trainer:   # a supervisor's death waits for `runs resume`: that gap is not counted
            print(f"\nrecovery (a trainer's death to the next attempt's launch): median "
                  f"{trainer[len(trainer) // 2]:.2f} s over {len(trainer)} trainer kills; goodput "
                  f"median {_percent(sorted(r['goodput'] or 0 for r in drawn)[len(drawn) // 2])}")
        print(f"\nrecovered {good}/{len(drawn)} draws "
              f"({sum(r['target'] == 'trainer' for r in drawn)} trainer kills, "
              f"{sum(r['target'] == 'supervisor' for r in drawn)} supervisor kills); "
              f"corrupt runs: {corrupt}; skipped: {len(rows) - len(drawn)}")
        return 0 if good == len(drawn) and not corrupt else 1


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _yes(flag: bool) -> str:
    return "yes" if flag else "NO"


if __name__ == "__main__":
    sys.exit(main())

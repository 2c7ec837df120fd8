"""Seconds to the first step, and back after a crash (issue 40), as a user meets them: each
scenario is `cockpit --no-ui ...` started as a process, timed from its spawn, read from its run's
events.

    launch -> first step   the spawn to the end of attempt 1's first optimizer step (the step
                           event's first_step_at), and where the time went: cockpit's own start
                           (spawn -> run_started), the supervisor's checks (-> attempt_started),
                           the trainer's phases (trainer_ready's startup: launch, device, data,
                           model, resume, setup), the parity check, the first step (its compile)
    crash -> next step     a native crash (--inject native-crash@N) to the end of attempt 2's
                           first step: the crash event's t (its exit seen) to its first_step_at,
                           with attempt 2's phases (a spare's: `ahead` says what it had done)

Scenarios (--only, comma-separated):

    matmul          matmul on DEVICE, eager: launch -> first step, then a crash -> next step
    compiled        trm-chat-small on the `cuda` preset (compile): the first compiled step, cold
                    (an empty compile cache) and warm (a second run), then a crash -> next step
    nanogpt         tests/scripts/shapes/nanogpt.py (nanoGPT's train.py in miniature: a bigram
                    model, not GPT-2), compiled (--compile=True), under `cockpit run`: a crash ->
                    the next attempt's first step line (its output is all cockpit reads), without
                    a spare and with one

    python benchmarks/startup.py --device cpu --only matmul        # here
    python benchmarks/startup.py --device cuda --out $OUT/startup.json    # on the device tool

Targets (issue 40, on an H100/H200): matmul launch -> first step <= 2.5 s; trm-chat-small's
first compiled step <= 25 s; a crash on it compiled -> next step <= 3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# A crash well into each run, once the spare for the next attempt is ready (it starts when the
# attempt trains: torch's imports, CUDA's context, the data, a compiled model's compile); the
# runs are stopped once the attempt after it has trained a step.
MATMUL = ["params.samples=65536", "train.epochs=1000", "train.checkpoint_every_steps=20",
          "train.eval_every_steps=0"]
MATMUL_CRASH = "native-crash@60s"
# trm-chat-small as the shipped cuda preset trains it: a checkpoint every 20 steps
TRM = ["train.checkpoint_every_steps=20", "train.eval_every_steps=0", "params.corpus_bytes=1000000",
       "batch_size=32", "accumulation=1"]
TRM_CRASH = "native-crash@45s"
# nanoGPT in miniature, compiled, under `cockpit run`: its first compile done and its spare ready
NANOGPT_CRASH = "native-crash@45s"


def cockpit(home: Path, *args: str, until_step_of: int = 1,
            env: dict[str, str] | None = None) -> tuple[float, list[dict], str]:
    """One `cockpit --no-ui` run: its spawn's time.time(), its events and its output. It is
    stopped (SIGINT, as Ctrl-C) once attempt `until_step_of` has said its first step."""
    runs = home / "runs"
    before = set(runs.iterdir()) if runs.is_dir() else set()
    child = {**os.environ, "COCKPIT_RUNS_DIR": str(runs), "COCKPIT_CONFIG_DIR": str(home / "config"),
             "COCKPIT_CACHE_DIR": str(home / "cache"), "COCKPIT_ALERTS": "off", **(env or {})}
    spawned = time.time()
    with open(home / "output.txt", "w+") as output:
        process = subprocess.Popen([sys.executable, "-m", "cockpit", "--no-ui", *args], cwd=ROOT, env=child,
                                   stdout=output, stderr=subprocess.STDOUT,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 900
        while process.poll() is None and time.monotonic() < deadline:
            made = set(runs.iterdir()) - before if runs.is_dir() else set()
            if made and first_step(read_events(next(iter(made))), until_step_of) is not None:
                process.send_signal(signal.SIGINT)
                break
            time.sleep(0.5)
        process.wait(timeout=300)
        output.seek(0)
        said = output.read()[-3000:]
    made = set(runs.iterdir()) - before if runs.is_dir() else set()
    if not made:
        raise SystemExit(f"cockpit made no run: {said}")
    (run,) = made
    return spawned, read_events(run), said


def read_events(run: Path) -> list[dict]:
    lines = (run / "events.jsonl").read_text().splitlines() if (run / "events.jsonl").exists() else []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:   # the line being written
            pass
    return events


def first(events: list[dict], kind: str, attempt: int | None = None, **match) -> dict | None:
    return next((e for e in events if e["type"] == kind and (attempt is None or e.get("attempt") == attempt)
                 and all(e.get(k) == v for k, v in match.items())), None)


def first_step(events: list[dict], attempt: int) -> dict | None:
    """The attempt's first step event: the trainer's says when the step ended (first_step_at);
    a command's is its output's first step, read."""
    command = any(e["type"] == "attempt_started" and "command" in e for e in events)
    return next((e for e in events if e["type"] == "step" and e.get("attempt") == attempt
                 and (command or e.get("first_step_at") is not None)), None)


def launch_to_first_step(spawned: float, events: list[dict], output: str) -> dict:
    """Attempt 1: spawn -> its first step, by part."""
    started, launched = first(events, "run_started"), first(events, "attempt_started", 1)
    ready, step = first(events, "trainer_ready", 1), first_step(events, 1)
    if not (started and launched and ready and step):
        return {"error": "no first step: " + output[-600:]}
    parity = first(events, "parity", 1)
    phases = {k: v for k, v in (ready.get("startup") or {}).items() if k not in ("ahead", "ahead_s")}
    parts = {"cockpit": started["t"] - spawned, "checks": launched["t"] - started["t"], **phases,
             "parity": (parity or {}).get("seconds", 0.0)}
    total = step["first_step_at"] - spawned
    parts["first step"] = total - sum(parts.values())   # compiling, when it compiles
    return {"seconds": round(total, 2), "compile_s": step.get("compile_s"),
            "parts": {k: round(v, 2) for k, v in parts.items()},
            "spare's work ahead": (ready.get("startup") or {}).get("ahead_s")}


def crash_to_next_step(events: list[dict]) -> dict:
    """The crash (its exit seen) -> attempt 2's first step, with attempt 2's phases."""
    crash, ready, step = first(events, "crash", 1), first(events, "trainer_ready", 2), first_step(events, 2)
    if not (crash and ready and step):
        return {"error": "no crash and recovery in the events"}
    startup = ready.get("startup") or {}
    return {"seconds": round(step["first_step_at"] - crash["t"], 2), "compile_s": step.get("compile_s"),
            "ahead": startup.get("ahead", []), "spare's work ahead": startup.get("ahead_s"),
            "parts": {k: v for k, v in startup.items() if k not in ("ahead", "ahead_s")}}


def matmul(home: Path, device: str) -> dict:
    spawned, events, out = cockpit(home, "-w", "matmul", "-d", device, *sets(MATMUL),
                                   "--inject", MATMUL_CRASH, until_step_of=2)
    return {"launch -> first step": launch_to_first_step(spawned, events, out),
            "crash -> next step": crash_to_next_step(events)}


def compiled(home: Path, device: str) -> dict:
    result = {}
    for label in ("cold", "warm"):   # the compile cache is the user's (COCKPIT_CACHE_DIR): kept
        crash = ["--inject", TRM_CRASH] if label == "warm" else []
        spawned, events, out = cockpit(home, "-w", "trm-chat-small", "-d", device, *sets(TRM), *crash,
                                       until_step_of=2 if crash else 1)
        result[f"launch -> first step ({label} cache)"] = launch_to_first_step(spawned, events, out)
        if crash:
            result["crash -> next step"] = crash_to_next_step(events)
    return result


def nanogpt(home: Path, device: str) -> dict:
    """A compiled command: its steps are its output's; a crash (timed, once its spare is ready)
    -> the next attempt's first step line, with no spare (COCKPIT_SPARE=0, as before issue 40)
    and with one (its interpreter, torch and the compiler's modules imported ahead)."""
    script = ROOT / "tests" / "scripts" / "shapes" / "nanogpt.py"
    path = os.pathsep.join(p for p in (str(script.parent), os.environ.get("PYTHONPATH")) if p)
    result = {}
    for label, spare in (("no spare", "0"), ("spare", "1")):
        spawned, events, out = cockpit(
            home, "run", "-d", device, "--inject", NANOGPT_CRASH,
            "--set", 'command.resume=["--init_from=resume"]', "--set", "command.checkpoints={run_dir}/out/ckpt.pt",
            "--", sys.executable, str(script), "--out_dir={run_dir}/out", "--max_iters=100000",
            "--compile=True", "--device={device}", "--step_delay=0.01", until_step_of=2,
            env={"PYTHONPATH": path, "COCKPIT_SPARE": spare})
        crash = first(events, "crash", 1)
        step = first_step(events, 2)   # its first said (a sighting of where it resumed, then its output's)
        if not (crash and step):
            result[f"crash -> next step ({label})"] = {"error": out[-600:]}
            continue
        process = first(events, "attempt_process", 2) or {}
        result[f"crash -> next step ({label})"] = {"seconds": round(step["t"] - crash["t"], 2),
                                                   "in a spare": bool(process.get("spare"))}
    return result


def sets(overrides: list[str]) -> list[str]:
    return [a for s in overrides for a in ("--set", s)]


SCENARIOS = {"matmul": matmul, "compiled": compiled, "nanogpt": nanogpt}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="the device preset: cpu or cuda")
    parser.add_argument("--only", default=",".join(SCENARIOS), help="scenarios, comma-separated")
    parser.add_argument("--out", type=Path, help="also write the figures here, as JSON")
    args = parser.parse_args()
    figures: dict = {"device": args.device}
    try:
        import torch
        figures["torch"] = torch.__version__
        if torch.cuda.is_available():
            figures["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    for name in args.only.split(","):
        with tempfile.TemporaryDirectory(prefix="cockpit-startup-") as home:
            started = time.monotonic()
            figures[name] = SCENARIOS[name](Path(home), args.device)
            figures[name]["wall_s"] = round(time.monotonic() - started, 1)
        print(json.dumps({name: figures[name]}, indent=1), flush=True)
        if args.out:
            args.out.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`cockpit --no-ui`: run a workload on a device preset, headless, in the foreground or detached."""

from __future__ import annotations

import argparse
import json
import sys
import time

from cockpit.headless import HeadlessPrinter, duration
from engine import runconfig
from engine.events import EventFollower
from engine.rundir import RunDir, RunSummary, summarize

EXIT_BY_STATUS = {"finished": 0, "stopped": 130}
EXIT_BAD_INPUT = 2


def run(args: argparse.Namespace) -> int:
    # Everything the user gave is checked before anything is written.
    overrides = list(args.set)
    if args.inject:
        overrides.append("device.inject=" + json.dumps(args.inject))
    config = runconfig.resolve(args.workload, args.device, overrides)
    from engine import device

    device.resolve(config.device, where=f"device preset {config.device_preset!r}")
    run_dir = RunDir.create(config)

    from engine import supervisor

    if args.detach:
        supervisor.start_detached(run_dir)
        print(run_dir.id)
        return 0

    printer = HeadlessPrinter(as_json=args.json)
    if not args.json:
        print(f"run dir {run_dir.path}", flush=True)
    status = supervisor.Supervisor(run_dir, on_events=printer).supervise()
    summary = summarize(run_dir)
    if not args.json:
        _print_summary(summary)
    return exit_code(status, summary)


def exit_code(status: str, summary: RunSummary) -> int:
    """0 finished, 130 stopped, 2 when the trainer refused its configuration (a workload the
    CLI cannot check without building it: a custom one lacking a method), else 1."""
    attempts = summary.attempts
    if status == "failed" and attempts and attempts[-1].outcome == "config":
        return EXIT_BAD_INPUT
    return EXIT_BY_STATUS.get(status, 1)


def _print_summary(s: RunSummary) -> None:
    metrics = "  ".join(f"{k} {v:.4g}" for k, v in s.metrics.items() if isinstance(v, (int, float)))
    loss = f"loss {s.loss:.4g}" if s.loss is not None else "no step reported"
    line = (f"{s.status}: step {s.step}/{s.total_steps}, {loss}"
            + (f", {metrics}" if metrics else "") + f", in {duration(s.duration_s)}")
    try:
        print(line, flush=True)
    except OSError:
        pass


def follow(run_dir: RunDir, as_json: bool) -> int:
    """Print a run's events from the start, then live until it ends (`cockpit runs follow`)."""
    printer = HeadlessPrinter(as_json=as_json)
    follower = EventFollower(run_dir.events_path)
    while True:
        events = follower.poll()
        printer(events)
        done = next((e for e in events if e["type"] == "run_finished"), None)
        if done:
            return EXIT_BY_STATUS.get(done["status"], 1)
        if not events and run_dir.supervisor_pid() is None:
            # Nothing running and nothing new: the run is over (or its supervisor was lost).
            status = summarize(run_dir).status
            print(f"run {status}", file=sys.stderr)
            return EXIT_BY_STATUS.get(status, 1)
        time.sleep(0.2)

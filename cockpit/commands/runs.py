"""`cockpit runs list | show RUN | follow RUN | stop RUN | resume RUN`."""

from __future__ import annotations

import argparse
import dataclasses
import json

from cockpit.commands import train
from cockpit.commands.train import follow as follow_run
from cockpit.headless import duration
from engine import command
from engine.errors import ConfigError
from engine.run import lifeline, resume as resumption, supervisor
from engine.numbers import rate
from engine.run.rundir import find_run, list_runs, summarize


def _rate(value: float | None) -> str:
    return f"{rate(value)}/s" if value is not None else "-"


def list_(args: argparse.Namespace) -> int:
    summaries = [summarize(r) for r in list_runs()]
    if args.json:
        print(json.dumps([dataclasses.asdict(s) for s in summaries], indent=2))
        return 0
    if not summaries:
        print("no runs yet; start one with: cockpit --no-ui")
        return 0
    print(f"{'run':<44} {'status':<9} {'step':>13} {'samples':>10} {'time':>7}")
    for s in summaries:
        if s.error:  # listed as broken, with why; the other runs are still listed
            print(f"{s.id:<44} {s.status:<9} {s.error}")
            continue
        progress = f"{s.step}/{s.total_steps or '?'}"
        print(f"{s.id:<44} {s.status:<9} {progress:>13} "
              f"{_rate(s.samples_per_s):>10} {duration(s.duration_s):>7}")
    return 0


def show(args: argparse.Namespace) -> int:
    run = find_run(args.run)
    s = summarize(run)
    if args.json:
        print(json.dumps(dataclasses.asdict(s), indent=2))
        return 0
    if s.error:
        raise ConfigError(f"run {s.id}", None, f"is broken: {s.error}")
    print(f"run       {s.id}\npath      {run.path}\nstatus    {s.status}")
    print(f"workload  {s.workload}\ndevice    {s.device_preset}")
    if s.command:
        print(f"command   {command.display(s.command)}")
    print(f"progress  step {s.step}/{s.total_steps or '?'}, {s.samples_seen:,} samples")
    if s.loss is not None:
        print(f"loss      {s.loss:.4g}")
    print(f"speed     {_rate(s.samples_per_s)} samples, duration {duration(s.duration_s)}")
    for k, v in s.metrics.items():
        print(f"eval      {k} {v:.4g}" if isinstance(v, float) else f"eval      {k} {v}")
    for a in s.attempts:
        ended = f" ({a.exit})" if a.exit else ""
        print(f"attempt {a.attempt}: {a.preset} on {a.device}, {a.outcome}{ended}, last step {a.last_step}")
        if a.crash:
            print(f"          {a.crash}")
    if s.steps_lost:
        print(f"lost      {s.steps_lost} steps to crashes")
    return 0


def follow(args: argparse.Namespace) -> int:
    return follow_run(find_run(args.run), args.json)


def stop(args: argparse.Namespace) -> int:
    run = find_run(args.run)
    if not supervisor.request_stop(run):
        history = resumption.History.of(run.events())
        if history.orphan() is not None:
            # Its supervisor and the lifeline both died: stop the attempt as they would have.
            print(f"run {run.id} has no supervisor; stopping its attempt (pid {history.process['pid']})")
            lifeline.stop_orphan(run.path, history.process)
            print(f"stopped; continue it with: cockpit runs resume {run.id}")
            return 0
        print(f"run {run.id} is not running")
        return 1
    how = ("its command gets SIGINT (Ctrl-C), then SIGTERM and SIGKILL if it does not exit"
           if summarize(run).command else "it checkpoints and exits after the current step")
    print(f"asked run {run.id} to stop; {how}")
    return 0


def resume(args: argparse.Namespace) -> int:
    """Continue a stopped, failed or interrupted run from its newest checkpoint."""
    run = find_run(args.run)
    resumption.check(run)
    config = resumption.plan(run, args.device, args.set)
    resumption.save(run, config, resumption.History.of(run.events()).attempts + 1)
    return train.supervise(run, args)

"""`cockpit runs list`, `show RUN`, `follow RUN`, `stop RUN` and `resume RUN`."""

from __future__ import annotations

import argparse
import os
import dataclasses
import json

from cockpit.commands import train
from cockpit.commands.train import follow as follow_run
from cockpit.present.words import duration
from engine import command, settings
from engine.errors import ConfigError
from engine.run import detached, lifeline, resume as resumption
from engine.numbers import count, rate
from engine.record.rundir import continue_hint, find_run, list_runs, summarize


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
    # samples/s is the run's average over its training time, not its last window's; the ids
    # as wide as the longest (about 40 columns), so a line fits 100 columns
    ids = max(len(s.id) for s in summaries)
    print(f"{'run':<{ids}} {'status':<11} {'step':>13} {'avg samples':>11} {'time':>7} {'steps lost':>10}")
    for s in summaries:
        if s.error:  # listed as broken, with why; the other runs are still listed
            print(f"{s.id:<{ids}} {s.status:<11} {s.error}")
            continue
        progress = f"{s.step}/{s.total_steps or '?'}"
        print(f"{s.id:<{ids}} {s.status:<11} {progress:>13} "
              f"{_rate(s.samples_per_s):>11} {duration(s.duration_s):>7} {s.steps_lost or '-':>10}")
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
    print(f"speed     {speed_text(s)}")
    print(f"time      {time_text(s)}")
    if s.gflop_s is not None:
        print(f"compute   {rate(s.gflop_s)} GFLOP/s on average")
    for k, v in s.metrics.items():
        print(f"eval      {k} {v:.4g}" if isinstance(v, float) else f"eval      {k} {v}")
    for a in s.attempts:
        ended = f" ({a.exit})" if a.exit else ""
        print(f"attempt {a.attempt}: {a.preset} on {a.device}, {a.outcome}{ended}, last step {a.last_step}")
        if a.crash:
            print(f"          {a.crash}")
    if s.steps_lost:
        print(f"lost      {count(s.steps_lost, 'step')} to crashes "
              "(trained again after a fallback, or past the last checkpoint)")
    return 0


def speed_text(s) -> str:
    """'317 samples/s on average (4.95 steps/s); 290 in the last window' (the last
    window only while the run goes on: a finished run's is its final fragment)."""
    if s.samples_per_s is None:
        return "-"
    text = f"{rate(s.samples_per_s)} samples/s on average"
    if s.steps_per_s is not None:
        text += f" ({rate(s.steps_per_s)} steps/s)"
    if s.status == "running" and s.window_samples_per_s is not None:
        text += f"; {rate(s.window_samples_per_s)} in the last window"
    return text


def time_text(s) -> str:
    """'12m40s, 11m02s of it training' (the rest: start-up, evals, mining, checkpoints)."""
    text = duration(s.duration_s)
    if s.train_s:
        text += f", {duration(s.train_s)} of it training"
    return text


def follow(args: argparse.Namespace) -> int:
    return follow_run(find_run(args.run), args.json)


def stop(args: argparse.Namespace) -> int:
    run = find_run(args.run)
    stopping = _stopping(run)
    if not detached.request_stop(run):
        history = resumption.History.of(run.events())
        if history.orphan() is not None:
            lock = run.try_lock()
            if lock is None:
                print(f"run {run.id} lost its supervisor; its lifeline is stopping the attempt "
                      f"(pid {history.process['pid']}) already")
                return 0
            try:  # its supervisor and lifeline both died: stop the attempt as they would have
                print(f"run {run.id} has no supervisor; stopping its attempt (pid {history.process['pid']})")
                lifeline.stop_orphan(run.path, history.process, by="cockpit runs stop")
            finally:
                os.close(lock)
            print(f"stopped; {continue_hint(run)}")
            return 0
        print(f"run {run.id} is not running")
        return 1
    command = summarize(run).command
    if stopping:
        how = ("its command gets the next signal now (SIGTERM, then SIGKILL)" if command else
               "it stops now, without a checkpoint: the steps since its last one are lost")
        print(f"run {run.id} was already stopping (asked {count(stopping, 'time')}); {how}")
        return 0
    how = ("its command gets SIGINT (Ctrl-C), then SIGTERM and SIGKILL if it does not exit"
           if command else "it checkpoints and exits after the current step (asking again "
                           "stops it at once, without a checkpoint)")
    print(f"asked run {run.id} to stop; {how}")
    return 0


def _stopping(run) -> int:
    """How many stop requests the run's current attempt has had already."""
    attempt, asked = None, 0
    for e in run.events():
        if e.get("type") == "attempt_started":
            attempt, asked = e.get("attempt"), 0
        elif e.get("type") == "stop_requested" and e.get("attempt") == attempt:
            asked += 1
    return asked


def resume(args: argparse.Namespace) -> int:
    """Continue a stopped, failed or interrupted run from its newest checkpoint."""
    run = find_run(args.run)
    settings.load()  # a broken settings.toml is bad input, said before anything is written
    resumption.prepare(run, args.device, args.set)
    return train.supervise(run, args)

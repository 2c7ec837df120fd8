"""`cockpit runs list`, `show RUN`, `follow RUN`, `stop RUN` and `resume RUN`."""

from __future__ import annotations

import argparse
import os
import dataclasses
import json
import shlex
import textwrap

from cockpit.commands import train
from cockpit.commands.train import follow as follow_run
from cockpit.present.lines import need_text
from cockpit.present.words import average_rate, badput_parts, checkpoint_step, duration, goodput_line
from engine import command, paths, settings
from engine.errors import ConfigError
from engine.run import detached, lifeline, resume as resumption, slurm
from engine.numbers import count, metric, rate, size
from engine.record import interval, nodes
from engine.record.rundir import RunSummary, continue_hint, find_run, list_runs, summarize
from engine.record.state import RunState


def list_(args: argparse.Namespace) -> int:
    runs = list_runs()
    summaries = [summarize(r) for r in runs]
    # a SLURM job's state, as SLURM says it now (pending, running, requeued, preempted...)
    jobs = {r.id: slurm.state_of(r) for r in runs}
    if args.json:
        print(json.dumps([{**dataclasses.asdict(s), **({"slurm": jobs[s.id]} if jobs[s.id] else {})}
                          for s in summaries], indent=2))
        return 0
    if not summaries:
        print("no runs yet; start one with: cockpit --no-ui")
        return 0
    # the rate is the run's average over its training time, not its last window's: samples/s,
    # or steps/s (' st' after it) where its samples per step are not known; the ids as wide as
    # the longest (about 40 columns), so a line fits 100 columns
    ids = max(len(s.id) for s in summaries)
    print(f"{'run':<{ids}} {'status':<11} {'step':>13} {'avg samples':>11} {'time':>7} {'steps lost':>10}")
    for s in summaries:
        if s.error:  # listed as broken, with why; the other runs are still listed
            print(f"{s.id:<{ids}} {s.status:<11} {s.error}")
            continue
        progress = f"{s.step}/{s.total_steps or '?'}"
        print(f"{s.id:<{ids}} {s.status:<11} {progress:>13} "
              f"{average_rate(s, per='/s'):>11} {duration(s.duration_s):>7} {s.steps_lost or '-':>10}"
              + ("  adopted" if s.adopted is not None else "")
              + (f"  slurm {job['job_id']} {job['state']}" if (job := jobs[s.id]) else ""))
    return 0


def show(args: argparse.Namespace) -> int:
    run = find_run(args.run)
    s = summarize(run)
    job = slurm.state_of(run)
    machines = [nodes.view(n) for n in nodes.nodes_of(run)]
    if args.json:
        print(json.dumps({**dataclasses.asdict(s), **({"slurm": job} if job else {}),
                          **({"nodes": [m.as_dict() for m in machines]} if machines else {})}, indent=2))
        return 0
    if s.error:
        raise ConfigError(f"run {s.id}", None, f"is broken: {s.error}")
    print(f"run       {s.id}\npath      {run.path}\nstatus    {s.status}")
    print(f"workload  {s.workload}\ndevice    {s.device_preset}")
    if s.command:
        print(f"command   {command.display(s.command)}")
    for line in adopted_lines(s):
        print(line)
    if job:
        restarts = f", requeued {count(job['restarts'], 'time')}" if job["restarts"] else ""
        print(f"slurm     job {job['job_id']}: {job['state']}{restarts}")
    print(f"progress  {progress_text(s)}")
    for line in figures_lines(s):
        print(line)
    if s.loss is not None:
        print(f"loss      {metric(s.loss)}")
    if (main := main_metric_text(s)) is not None:
        print(f"main      {main}")
    print(f"speed     {speed_text(s)}")
    print(f"time      {time_text(s)}")
    if s.gflop_s is not None:
        print(f"compute   {rate(s.gflop_s)} GFLOP/s on average")
    for k, v in s.metrics.items():   # its losses first, timings left out (shown_metrics)
        print(f"eval      {k} {metric(v)}")
    if (saved := checkpoints_text(s)) is not None:
        print(f"saved     {saved}")
        if s.command is not None and (advice := interval.command_advice(
                run.events(), paths.runs_dir(), run.id)) is not None and advice.far:
            print(textwrap.fill(advice.text, 80, initial_indent=" " * 10, subsequent_indent=" " * 10))
    for a in s.attempts:
        ended = f" ({a.exit})" if a.exit else ""
        print(f"attempt {a.attempt}: {a.preset} on {a.device}, {a.outcome}{ended}, last step {a.last_step}")
        if a.crash:
            print(f"          {a.crash}")
    for finding in s.health:   # a run going bad and going on, and what was done
        print(textwrap.fill(f"health    {finding['sentence']}", 80, subsequent_indent=" " * 10))
        print(textwrap.fill(f"-> {finding.get('done') or 'warned'}", 80, initial_indent=" " * 10,
                            subsequent_indent=" " * 13))
    for line in threads_lines(s):
        print(line)
    if s.steps_rewound:
        print(f"rewound   {count(s.steps_rewound, 'step')} thrown away by going back (health)")
    if s.steps_lost:
        print(f"lost      {count(s.steps_lost, 'step')} to crashes "
              "(trained again after a fallback, or past the last checkpoint)")
    for line in goodput_lines(s):
        print(line)
    for line in node_lines(machines):
        print(line)
    return 0


THREADS_SHOWN = 4


def threads_lines(s: RunSummary) -> list[str]:
    """'threads   2 -> 1 at step 3 (others needed all 2 cores), 1 -> 2 at step 40 (cores
    free)', wrapped at 80: the trainer fitting torch's threads to the machine; the first
    changes and the last, where there were many."""
    if not s.threads:
        return []
    said = [f"{c['was']} -> {c['threads']} at step {c['step']}"
            + (f" (others needed {need_text(c['others_need'], c['cores'])})"
               if c["reason"] == "contention" else " (cores free)")
            for c in s.threads]
    if len(said) > THREADS_SHOWN:
        said = [*said[:THREADS_SHOWN - 1], f"{len(said) - THREADS_SHOWN} more", said[-1]]
    return textwrap.wrap("threads   " + ", ".join(said), 80, subsequent_indent=" " * 10)


def node_lines(machines: list[nodes.NodeView]) -> list[str]:
    """A run on several machines: each one's status, step, world, rate and memory, and the
    sentence of a machine lost, at 80 columns. Its figures above are rank 0's machine's."""
    if not machines:
        return []
    lines = [f"nodes     {count(len(machines), 'machine')} (figures above: global rank 0's)"]
    names = min(10, max(len(m.name) for m in machines))
    for m in machines:
        # its world (machines x processes) and its first process's global rank (0 checkpoints)
        world = (f"{m.nodes}x{(m.world_size or 0) // max(1, m.nodes or 1)} rank {m.rank}"
                 if m.nodes else "no world yet")
        speed = f"{rate(m.samples_per_s)} samples/s" if m.samples_per_s else "-"
        lines.append(f"  {m.name:<{names}} {m.status:<11} step {m.step:<7} {world:<12} {speed:<17} "
                     f"rss {size(m.rss) if m.rss else '-'}"[:80])
        lines += textwrap.wrap(f"lost: {m.lost}", 80, initial_indent=" " * 13, subsequent_indent=" " * 13) \
            if m.lost else []
    return lines


def adopted_lines(s: RunSummary) -> list[str]:
    """An adopted run's process: 'adopted   pid 4242, progress from train.log (stdout and stderr)'."""
    a = s.adopted
    if a is None:
        return []
    where = f"progress from {a.get('log_source')}" if a.get("logs") else (a.get("no_log") or "no log")
    return textwrap.wrap(f"adopted   pid {a.get('pid')} (cockpit did not start it), in {a.get('cwd')}; "
                         f"{where}", 80, subsequent_indent=" " * 10)


def goodput_lines(s: RunSummary) -> list[str]:
    """'goodput   72% of 1m10s: 50 s training kept' and where the rest went, wrapped at 80."""
    if not s.goodput:
        return []
    line = goodput_line(s.goodput).removeprefix("goodput ")
    lines = [f"goodput   {line}"]
    if (parts := badput_parts(s.goodput)) and s.goodput.get("goodput") is not None:
        lines += textwrap.wrap("the rest: " + ", ".join(parts), 80, initial_indent=" " * 10,
                               subsequent_indent=" " * 10)
    return lines


def progress_text(s: RunSummary) -> str:
    """'step 140/400, 4,480 samples, 2,293,760 tokens': samples only where they are known."""
    text = f"step {s.step}/{s.total_steps or '?'}"
    if s.samples_seen is not None and s.samples_known:
        text += f", {s.samples_seen:,} samples"
    if s.tokens_seen is not None:
        text += f", {s.tokens_seen:,} tokens"
    return text


# Where a command's figure came from (engine.command's units and total_source), in words.
_SOURCES = {"reported": "reported by the script (cockpit.report or its callback)",
            "stated": "the script said so", "preset": "the workload preset's",
            "placeholders": "batch_size x accumulation, the command's {placeholders}",
            "output": "the script's output (its bar, or step N/M)", "argv": "the command's arguments",
            "epochs": "its epochs x the steps in one"}


def figures_lines(s: RunSummary) -> list[str]:
    """A command's figures with where each came from: the total, the samples and tokens a step
    is, and what its steps count; how to give cockpit what it does not know (each hint a line
    of its own under the fact, so that both fit 80 columns). None for the built-in trainer,
    whose figures are its own and exact."""
    if s.command is None:
        return []
    lines = []
    if s.total_steps and s.total_source:
        lines.append(f"total     {s.total_steps:,} steps: {_SOURCES.get(s.total_source, s.total_source)}")
    elif not s.total_steps:
        lines += ["total     not known, so no ETA; give it with",
                  f"{'':10}total_steps = N in the preset or --set command.total_steps=N"]
    units = s.units
    if units is None:   # before the first step, or a run recorded before units were kept
        return lines
    for noun, key in (("samples", "samples_per_step"), ("tokens", "tokens_per_step")):
        per_step, source = units.get(key), units.get(f"{noun}_source") or "?"
        if per_step is not None:
            lines.append(f"{noun:<10}{per_step:,} a step: {_SOURCES.get(source, source)}")
            # `said` is the words the samples came from (engine.command.tracker's Units keeps
            # none for tokens): under the samples line only, never under the tokens'
            if noun == "samples" and source in ("stated", "argv") and units.get("said"):
                lines.append(f"{'':10}\"{units['said']}\"")
        elif noun == "samples":
            lines += ["samples   per step not known, so the speed is in steps/s; give it with",
                      f"{'':10}{key} = N in the preset or --set command.{key}=N"]
    if units.get("counter") == "batches":
        lines += ["counter   batches, not optimizer steps: the accumulation is not known; put",
                  f"{'':10}{{accumulation}} in the command where the script takes its accumulation",
                  f"{'':10}(--set device.accumulation=N fills it)"]
    elif units.get("accumulation"):
        lines.append(f"counter   optimizer steps, of {units['accumulation']} batches each")
    return lines


def checkpoints_text(s: RunSummary) -> str | None:
    """'4 checkpoints, the last at step 60' (or 'after step 56' for a file whose name says no
    step: the step read before it was written)."""
    if not s.checkpoint_writes:
        return None
    last = s.checkpoint_writes[-1]
    where = checkpoint_step(last)
    # a file rewritten faster than it could be seen: more saves than were told
    saved = ("at least " if s.checkpoints_at_least else "") + count(len(s.checkpoint_writes), "checkpoint")
    return saved + (f", the last{where}" if where else "")


def main_metric_text(s: RunSummary) -> str | None:
    """'reward 0.62 at step 140 (by default: a reward)', or the preset's metric not reported."""
    if s.main_metric is None:
        return None
    why = "the preset's main_metric" if s.main_metric_source == "preset" else "by default"
    if s.main_metric_value is None:
        return f"{s.main_metric}: not reported ({why})"
    at = f" at step {s.main_metric_step}" if s.main_metric_step is not None else ""
    return f"{s.main_metric} {metric(s.main_metric_value)}{at} ({why})"


def speed_text(s: RunSummary) -> str:
    """'317 samples/s on average (4.95 steps/s); 290 samples/s in the last window', or '4.95 steps/s on
    average' where the samples per step are not known, with tokens/s where those are (the last
    window only while the run goes on: a finished run's is its final fragment)."""
    if s.samples_per_s is not None:
        text = f"{rate(s.samples_per_s)} samples/s on average"
        if s.steps_per_s is not None:
            text += f" ({rate(s.steps_per_s)} steps/s)"
        now, unit = s.window_samples_per_s, "samples/s"
    elif s.steps_per_s is not None:
        text = f"{rate(s.steps_per_s)} steps/s on average"
        now, unit = s.window_steps_per_s, "steps/s"
    elif s.step and s.command is not None:
        # a command's windows are timed by reading its output; a run whose training fitted in
        # fragments shorter than a reporting window has no rate worth showing
        return "not measured: its training came in fragments under a reporting window"
    else:
        return "-"
    if s.tokens_per_s is not None:
        text += f", {rate(s.tokens_per_s)} tokens/s"
    if s.status == "running" and now is not None:
        text += f"; {rate(now)} {unit} in the last window"
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
    if members := nodes.nodes_of(run):
        return _stop_machines(run, members)
    state = RunState.of(run.events())
    stopping = state.current.stops if state.current is not None else 0   # asked already
    host, job = run.supervisor_elsewhere(), slurm.record_of(run)
    if host is not None and job is None:
        raise ConfigError(f"run {run.id}", None, f"is supervised on {host}, not here: stop it "
                                                 "there (cockpit runs stop)")
    if not detached.request_stop(run):
        history = resumption.History.of_state(state)
        if (orphan := history.orphan()) is not None:
            lock = run.try_lock()
            if lock is None:
                print(f"run {run.id} lost its supervisor; its lifeline is stopping the attempt "
                      f"(pid {orphan.pid}) already")
                return 0
            try:  # its supervisor and lifeline both died: stop the attempt as they would have
                print(f"run {run.id} has no supervisor; stopping its attempt (pid {orphan.pid})")
                lifeline.stop_orphan(run.path, history.process, by="cockpit runs stop")
            finally:
                os.close(lock)
            print(f"stopped; {continue_hint(run)}")
            return 0
        print(f"run {run.id} is not running")
        return 1
    if host is not None and job is not None:   # detached.request_stop cancelled its job
        print(f"cancelled SLURM job {job['job_id']} (on {host}); its attempt checkpoints and "
              f"exits, and {continue_hint(run)}")
        return 0
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


def _stop_machines(run, members) -> int:
    """A run on several machines: the supervisors of those on this one are asked (on a SLURM
    job's nodes, its job is cancelled); the others stop at the same step, through the trainer's
    stop agreement over the process group, after a checkpoint."""
    asked = [m.path.name for m in members if detached.request_stop(m)]
    job = slurm.record_of(run)
    if not asked and job is not None and any(m.supervisor_elsewhere() for m in members):
        slurm.cancel(str(job["job_id"]))   # its node supervisors stop gracefully on its SIGTERM
        print(f"cancelled SLURM job {job['job_id']}; every machine checkpoints and exits, and "
              f"{continue_hint(run)}")
        return 0
    if not asked:
        print(f"run {run.id} is not running here (machines {', '.join(m.path.name for m in members)}: "
              "no live supervisor on this one)")
        return 1
    print(f"asked run {run.id} to stop on {', '.join(asked)}: every machine checkpoints and "
          "exits after the same step")
    return 0


def resume(args: argparse.Namespace) -> int:
    """Continue a stopped, failed or interrupted run from its newest checkpoint."""
    run = find_run(args.run)
    if nodes.nodes_of(run):
        raise ConfigError(f"run {run.id}", None, "runs on several machines, each its own supervisor: "
                                                 "continue it with the same cockpit --no-ui --node NAME "
                                                 f"--run-id {run.id} ... on each machine")
    settings.load()  # a broken settings.toml is bad input, said before anything is written
    resume_args = None
    if args.resume_args is not None:
        try:
            resume_args = shlex.split(args.resume_args)
        except ValueError as e:
            raise ConfigError("--resume-args", args.resume_args, f"cannot be split ({e}); expected "
                                                                 "arguments as a shell writes them") from None
    resumption.prepare(run, args.device, args.set, resume_args)
    return train.supervise(run, args)

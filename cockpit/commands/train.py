"""`cockpit --no-ui` and `cockpit run -- CMD...`: run a workload (or the user's own command) on
a device preset, headless, in the foreground or detached. Both go through `start`."""

from __future__ import annotations

import argparse
import sys

from cockpit.headless import LOG_EVERY_S, HeadlessPrinter
from cockpit.present.words import duration, goodput_text, throughput_parts
from engine.numbers import metric
from engine import command, presets, runconfig, settings
from engine.errors import ConfigError
from engine.monitor import device_rules
from engine.run.alerts import Terminal
from engine.run import detached, follow as run_follow, spare, supervisor
from engine.record import nodes
from engine.record.rundir import RunDir, RunSummary, summarize

# an adopted run (cockpit adopt): "ended" is its process's end with no error in its log (its exit
# status is not ours to read); "released", cockpit stopped following it, as a Ctrl-C
EXIT_BY_STATUS = {"finished": 0, "stopped": 130, "ended": 0, "released": 130, "preempted": 130}
EXIT_BAD_INPUT = 2


def _overrides(args: argparse.Namespace) -> list[str]:
    overrides = list(args.set)
    if args.inject:
        overrides.append(runconfig.inject_override(args.inject))
    return overrides


def run(args: argparse.Namespace) -> int:
    """`cockpit --no-ui`: a workload preset on a device preset."""
    # Everything the user gave is checked before anything is written.
    config = runconfig.resolve(args.workload, args.device, _overrides(args))
    # the first attempt's process, started now: its imports overlap this process's checks
    first = None if args.detach else spare.early(config)
    try:
        return _check_and_start(config, args, first)
    finally:
        if first is not None:
            first.discard()   # unless the first attempt took it: bad input, or a node's run


def _check_and_start(config, args: argparse.Namespace, first: spare.Spare | None) -> int:
    if not config.workload.is_command:  # a command resolves its own device
        device_rules.check(config.device, where=f"device preset {config.device_preset!r}")
    several = config.device.nodes[1] > 1
    if several != bool(args.node):
        raise ConfigError("--node", args.node,
                          f"device preset {config.device_preset!r} has nnodes = {config.device.nnodes!r}: "
                          + ("a run on several machines needs --node NAME --run-id ID on each"
                             if several else "--node names one machine of several; expected nnodes above 1"))
    if args.run_id and not args.node:
        raise ConfigError("--run-id", args.run_id, "names the run that several machines join; "
                                                   "expected it with --node")
    if several:
        if not config.device.rdzv_endpoint:
            raise ConfigError(f"device preset {config.device_preset!r}", "rdzv_endpoint",
                              "missing; a run on several machines meets at 'host:port' (one of "
                              "them, e.g. 'node1:29400'; in a SLURM job cockpit submit fills it in)")
        if not args.run_id:
            raise ConfigError("--run-id", None, "missing; every machine of a run joins it by the "
                                                "same id (e.g. --run-id $SLURM_JOB_ID or a name)")
        settings.load()
        return supervise(nodes.join(config, args.run_id, args.node), args)
    return start(config, args, first)


def run_command(args: argparse.Namespace) -> int:
    """`cockpit run -- CMD...`: the user's own command, exactly like a command preset."""
    argv = list(args.cmd)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        raise ConfigError("command", None, "missing; expected cockpit run [options] -- CMD ARGS... "
                                           "(e.g. cockpit run -- python train.py --bs {batch_size})")
    for arg in argv:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError("command", None, f"argument {arg!r} is not valid UTF-8; expected "
                                               "text (run.toml records the command)") from None
    if args.save and (args.inject or any(not s.startswith("command.") for s in args.set)):
        raise ConfigError("--save", None, "writes the command and its command.* settings only; "
                                          "device settings and --inject belong to a device preset "
                                          "(-d) or to the run, expected them left out")
    name = args.name or command.name_for(argv)
    if not presets.NAME_PATTERN.match(name):
        raise ConfigError("--name", None, f"got {name!r}; expected letters, digits, '.', '_', '-'")
    config = runconfig.resolve_command(argv, name, args.device, _overrides(args))
    if args.save:
        return _save(args.save, config)
    return start(config, args)


def _save(name: str, config) -> int:
    """Write the command as a workload preset (never over an existing one) and say how to run it."""
    presets.check_new_name("workloads", name)
    path = presets.save_user_preset("workloads", name, presets.workload_to_table(config.workload))
    print(f"saved workload preset {name}: {path}")
    print(f"run it: cockpit --no-ui -w {name} -d {config.device_preset}")
    return 0


def start(config, args: argparse.Namespace, first: spare.Spare | None = None) -> int:
    """Make the run directory and supervise the run, in the foreground or detached; `first`:
    the first attempt's process, started already (engine.run.spare.early)."""
    settings.load()  # a broken settings.toml is bad input now, not a warning mid-run
    return supervise(RunDir.create(config), args, first=first)


def supervise(run_dir: RunDir, args: argparse.Namespace, *, launcher=None,
              start_detached=detached.start_detached, first: spare.Spare | None = None) -> int:
    """Supervise a new run, or continue one (`cockpit runs resume`), in the foreground or
    detached. Alerts ring the terminal this was started from (engine.run.alerts): stdout's in
    the foreground, stdout's or stderr's for a detached run (`RUN=$(cockpit ... --detach)`).
    `launcher`, `start_detached`: an adopted process's (engine.run.launchers.adopted) follow it."""
    notify = getattr(args, "notify_command", None)
    if args.detach:
        start_detached(run_dir, terminal=Terminal.of_this_process((1, 2)), notify_command=notify)
        print(run_dir.id, flush=True)
        if sys.stderr.isatty():
            print(f"follow it: cockpit runs follow {run_dir.id}   stop it: cockpit runs stop {run_dir.id}",
                  file=sys.stderr)
        return 0

    printer = HeadlessPrinter(as_json=args.json, log_every_s=getattr(args, "log_every", LOG_EVERY_S),
                              main_metric=run_dir.main_metric())
    if not args.json:
        print(f"run dir {run_dir.path}", flush=True)
    terminal = None if args.json else Terminal.of_this_process((1,))
    try:
        status = supervisor.Supervisor(run_dir, on_events=printer, terminal=terminal, notify_command=notify,
                                       launcher=launcher(run_dir) if launcher else None,
                                       spare=first).supervise()
    finally:
        printer.close()
    summary = summarize(run_dir)
    if not args.json:
        _print_summary(summary)
        _print_where(run_dir, summary)
    return exit_code(status, summary)


def exit_code(status: str, summary: RunSummary) -> int:
    """0 finished, 130 stopped, 2 when the trainer refused its configuration (a workload the
    CLI cannot check without building it: a custom one lacking a method), else 1."""
    attempts = summary.attempts
    if status == "failed" and attempts and attempts[-1].outcome == "config":
        return EXIT_BAD_INPUT
    return EXIT_BY_STATUS.get(status, 1)


def _print_summary(s: RunSummary) -> None:
    """'finished: step 400/400, loss 0.41, reward 0.62, eval_loss 0.5, in 3m10s, 317 samples/s
    on average': steps/s where the samples per step are not known, tokens/s where those are."""
    metrics = "  ".join(f"{k} {metric(v)}" for k, v in s.metrics.items() if isinstance(v, (int, float)))
    loss = f"loss {metric(s.loss)}" if s.loss is not None else "no loss reported"
    main = (f", {s.main_metric} {metric(s.main_metric_value)}"
            if s.main_metric is not None and s.main_metric_value is not None and s.main_metric not in s.metrics
            else "")
    speed = throughput_parts(s.samples_per_s, s.steps_per_s, s.tokens_per_s)
    line = (f"{s.status}: step {s.step}" + (f"/{s.total_steps}" if s.total_steps else "") + f", {loss}"
            + main + (f", {metrics}" if metrics else "") + f", in {duration(s.duration_s)}"
            + (f", {' and '.join(speed)} on average" if speed and s.train_s else ""))
    if s.goodput:
        line += "\n" + goodput_text(s.goodput)
    try:
        print(line, flush=True)
    except OSError:
        pass


def _print_where(run_dir: RunDir, s: RunSummary) -> None:
    """The last lines: where the run is and what to type next."""
    if (whole := nodes.run_of(run_dir)) is not None:   # one machine of several
        lines = [f"run dir {run_dir.path}", f"  cockpit runs show {whole.id}      the run, every machine"]
        if s.status in ("stopped", "failed", "interrupted", "lost"):
            lines.append("  continue it: the same cockpit --node command again, on each machine")
        try:
            print("\n".join(lines), flush=True)
        except OSError:
            pass
        return
    lines = [f"run dir {run_dir.path}", f"  cockpit runs show {run_dir.id}      its summary"]
    if s.adopted is not None and s.status in ("stopped", "failed", "ended", "released", "lost"):
        lines.append(f"  cockpit runs resume {run_dir.id} [--resume-args ARGS]    its command again, "
                     "under cockpit")
    elif s.status in ("stopped", "failed", "interrupted", "lost"):
        lines.append(f"  cockpit runs resume {run_dir.id}    continue it from its newest checkpoint"
                     if s.checkpoints else "  (it saved no checkpoint: there is nothing to resume from)")
    try:
        print("\n".join(lines), flush=True)
    except OSError:
        pass


def follow(run_dir: RunDir, as_json: bool) -> int:
    """Print a run's events from the start, then live until it ends (`cockpit runs follow`;
    engine.run.follow says when, as it does for the TUI)."""
    printer = HeadlessPrinter(as_json=as_json, main_metric=run_dir.main_metric())
    for batch in run_follow.follow(run_dir, poll_s=0.2):
        printer(batch.events)
    summary = _finish_following(run_dir, printer, as_json)
    # the last batch's end says the status; with none (its supervisor was lost), the summary
    end = batch.end
    return EXIT_BY_STATUS.get(end.get("status", "interrupted") if end is not None else summary.status, 1)


def _finish_following(run_dir: RunDir, printer: HeadlessPrinter, as_json: bool) -> RunSummary:
    """The followed run is over: the same last lines as the command that ran it printed."""
    printer.close()
    summary = summarize(run_dir)
    if not as_json:
        _print_summary(summary)
        _print_where(run_dir, summary)
    return summary

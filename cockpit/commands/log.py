"""`cockpit runs log RUN`: an attempt's own output (attempt-N.log), headless -- the log view's
output pane for scripts and SSH sessions without the TUI. The last lines of the newest
attempt's log as a terminal would have left them (tqdm's redraws folded), `--follow` for what
it goes on writing until the run ends, `--traceback` for the crashed attempt's traceback.
The run's events are `cockpit runs follow`."""

from __future__ import annotations

import argparse
import time

from engine.errors import ConfigError
from engine.run import follow as run_follow
from engine.record.attempt_log import LogLines, last_traceback, logged_attempts
from engine.record.rundir import RunDir, find_run, summarize

POLL_S = 0.25
TAIL = 40


def add_parser(runs_sub) -> None:
    q = runs_sub.add_parser("log", help="an attempt's own output: its last lines, followed, or its traceback")
    q.add_argument("run", help="run id, a unique prefix or end of one, a path, or 'last'")
    q.add_argument("--attempt", "-a", type=int, metavar="N", help="this attempt (default: the newest)")
    q.add_argument("--lines", "-n", type=int, default=TAIL, metavar="N",
                   help=f"how many of the last lines to print (default {TAIL}; 0: all of the last 4 MB)")
    q.add_argument("--follow", "-f", action="store_true",
                   help="then print what is appended until the run ends (Ctrl-C leaves the run running)")
    q.add_argument("--traceback", "-t", action="store_true",
                   help="the crashed attempt's output from its last traceback on")
    q.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.lines < 0:
        raise ConfigError("--lines", None, f"got {args.lines}, expected 1 or more (0: all of the last 4 MB)")
    rundir = find_run(args.run)
    logged = logged_attempts(rundir.path)
    if args.traceback:
        return _traceback(rundir, args.attempt, logged)
    attempt = args.attempt if args.attempt is not None else (logged[-1] if logged else None)
    if attempt is None:
        raise ConfigError("run", rundir.id, "has no attempt log yet")
    if attempt not in logged:
        raise ConfigError("--attempt", str(attempt), f"run {rundir.id} has attempts {_listed(logged)}")
    log = LogLines(rundir.attempt_log(attempt))
    lines, _ = log.read()
    for line in lines[-args.lines:] if args.lines > 0 else lines:
        print(line)
    if args.follow:
        _follow(rundir, log, pinned=args.attempt is not None, attempt=attempt)
    return 0


def _follow(rundir: RunDir, log: LogLines, *, pinned: bool, attempt: int) -> None:
    """Print what the attempt appends; unless an attempt was asked for, go on to each newer
    attempt's log as it appears. Ends when nothing is at work on the run (engine.run.follow: its
    supervisor, a lifeline, an attempt running on without them) and all is read."""
    fresh = False   # a log not read yet: its first read is its tail, not a restart
    while True:
        live = run_follow.at_work(rundir)   # before reading: nothing is written after
        lines, reset = log.read()
        if reset and not fresh:
            print(f"--- {log.path.name} started over, or grew by more than 4 MB at once ---")
        fresh = False
        for line in lines:
            print(line, flush=True)
        newer = [n for n in logged_attempts(rundir.path) if n > attempt]
        if newer and not pinned:
            # the rest of this attempt first: it may have written more since the read above
            # and before the next attempt's log appeared
            for line in log.read()[0]:
                print(line, flush=True)
            if log.partial:
                print(log.shown_partial())
            attempt = newer[0]
            log, fresh = LogLines(rundir.attempt_log(attempt)), True
            print(f"--- attempt {attempt}: {log.path.name} ---", flush=True)
            continue
        if not live:
            if log.partial:
                print(log.shown_partial())
            return
        time.sleep(POLL_S)


def _traceback(rundir: RunDir, attempt: int | None, logged: list[int]) -> int:
    attempts = summarize(rundir).attempts
    known = sorted({a.attempt for a in attempts} | set(logged))
    if attempt is not None and attempt not in known:   # bad input, as without --traceback
        raise ConfigError("--attempt", str(attempt), f"run {rundir.id} has attempts {_listed(known)}")
    crashed = [a for a in attempts if a.crash and (attempt is None or a.attempt == attempt)]
    if not crashed:
        print(f"attempt {attempt} of run {rundir.id} did not crash" if attempt is not None
              else f"no attempt of run {rundir.id} crashed")
        return 1
    a = crashed[-1]
    log = LogLines(rundir.attempt_log(a.attempt))
    lines, _ = log.read()
    at = last_traceback(lines)
    print(f"attempt {a.attempt} ({a.preset}) ended {a.outcome}: {a.crash}")
    if at is None:
        print(f"{log.path.name} holds no Python traceback")
        return 1
    print(f"--- {log.path.name}, line {at + 1}" + (" of its last 4 MB" if log.skipped else "") + " ---")
    for line in lines[at:]:
        print(line)
    return 0


def _listed(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers)) or "none"

"""A detached run: its supervisor in a session of its own, so that the run outlives its terminal.

The TUI and `cockpit train --detach` start one (`start_detached`) and follow the run directory;
quitting either, closing the terminal or dropping the SSH connection leaves the run going.
`request_stop` asks a live run's supervisor to stop it gracefully (a SIGTERM, which it turns into
its attempt's stop sequence), from any process that can read the run directory.

    python -m engine.run.detached RUN_DIR [--terminal TTY --terminal-owner 'PID START']
                                          [--notify-command CMD]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from engine.errors import ConfigError
from engine.record.identity import ProcessId
from engine.record.rundir import RunDir
from engine.run import alerts, slurm
from engine.run.crashes import last_line
from engine.run.launch import child_env
from engine.run.launchers import Launcher
from engine.run.supervisor import Supervisor


def start_detached(run: RunDir, timeout_s: float = 60.0, *, terminal: alerts.Terminal | None = None,
                   notify_command: str | None = None, module: str = "engine.run.detached") -> int:
    """Start a supervisor for the run in its own session; returns its pid once it has taken the
    run (its pid file names it), so that whoever follows the run next finds it live. A
    supervisor that cannot take the run (another holds it) is a ConfigError with its word.
    `terminal`: where its alerts ring while that session lives; `notify_command`: settings.toml's,
    replaced. `module`: what supervises it (engine.run.launchers.adopted follows an adopted process),
    run as `python -m MODULE RUN_DIR` with these arguments."""
    extra = (terminal.arguments() if terminal else []) + \
        ([f"--notify-command={notify_command}"] if notify_command is not None else [])  # may start with -
    with open(run.supervisor_log, "ab") as log:
        start = log.tell()
        proc = subprocess.Popen([sys.executable, "-P", "-m", module, str(run.path), *extra],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=child_env({}), start_new_session=True)
    deadline = time.monotonic() + timeout_s   # start-up takes a fraction of a second
    while run.supervisor_pid() != proc.pid and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if proc.poll() is not None and run.supervisor_pid() != proc.pid:
        with open(run.supervisor_log, "rb") as log:
            log.seek(start)
            said = last_line(log.read().decode(errors="replace")) or f"exit {proc.returncode}"
        raise ConfigError("run", run.id, f"its supervisor did not start: {said.removeprefix('cockpit: ')}")
    return proc.pid


def request_stop(run: RunDir) -> bool:
    """Ask a live run's supervisor to stop it gracefully; False if none is running. One on
    another machine (a SLURM job's node, seen from the login node) is stopped through SLURM:
    its job cancelled, which its supervisor stops gracefully (engine.run.slurm)."""
    pid = run.supervisor_pid()
    if pid is None:
        if run.supervisor_elsewhere() is not None and (job := slurm.record_of(run)) is not None:
            slurm.cancel(str(job["job_id"]))
            return True
        return False
    os.kill(pid, signal.SIGTERM)
    return True


def main(argv: list[str] | None = None, *, module: str = "engine.run.detached",
         launcher: Callable[[RunDir], Launcher] | None = None,
         exit_codes: dict[str, int] | None = None) -> int:
    """A supervisor in the background, with `launcher` for every attempt (`module`'s: an adopted
    process's, engine.run.launchers.adopted) or the one that fits each; its status as an exit
    code (0 finished, 130 stopped, else 1)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--terminal", help="the tty to alert (the launching session's)")
    parser.add_argument("--terminal-owner", help="'PID START' of that session's leader")
    parser.add_argument("--notify-command", help="instead of settings.toml's")
    args = parser.parse_args(argv)
    terminal = alerts.Terminal(args.terminal, ProcessId.parse(args.terminal_owner or "")) \
        if args.terminal else None
    try:
        run = RunDir(args.run_dir)
        status = Supervisor(run, terminal=terminal, notify_command=args.notify_command,
                            launcher=launcher(run) if launcher else None).supervise()
    except ConfigError as e:
        print(f"cockpit: {e.line()}", file=sys.stderr)
        return 2
    return (exit_codes or {"finished": 0, "stopped": 130}).get(status, 1)


if __name__ == "__main__":
    sys.exit(main())

"""The supervisor: owns a run's attempts, each a trainer in its own process.

A native crash (SIGABRT from Metal, SIGSEGV) kills only the trainer; the supervisor
records how the attempt ended (exit code or signal, the log's tail) and decides what comes
next. It runs in the foreground under `cockpit --no-ui`, or detached in its own session
(`python -m engine.supervisor RUN_DIR`) so that a run outlives its terminal.

Stopping: SIGINT/SIGTERM to the supervisor (or `request_stop`) forwards one SIGTERM to the
trainer, which finishes its step, checkpoints and exits; a second request forwards a
second SIGTERM, which the trainer obeys at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import engine
from engine.events import EventFollower, EventWriter
from engine.presets import DevicePreset
from engine.rundir import RunDir
from engine.schema import to_table

TAIL_LINES = 40
_PROJECT_ROOT = str(Path(engine.__file__).resolve().parent.parent)


@dataclass(frozen=True)
class AttemptResult:
    attempt: int
    preset: str
    outcome: str            # finished | stopped | config | failed
    exit_code: int | None   # set when the trainer exited
    signal: str | None      # set when a signal killed it (SIGABRT, SIGKILL, ...)
    tail: str               # the end of attempt-N.log


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **extra, "PYTHONUNBUFFERED": "1"}
    # The trainer imports engine from the same place this process did, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PROJECT_ROOT, env.get("PYTHONPATH")) if p)
    return env


def _tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


class Supervisor:
    def __init__(self, run: RunDir, on_events: Callable[[list[dict]], None] | None = None,
                 poll_s: float = 0.1):
        self.run = run
        self.config = run.config()
        self.on_events = on_events
        self.poll_s = poll_s
        self.follower = EventFollower(run.events_path)
        self.events = EventWriter(run.events_path, attempt=0)
        self.stop_requests = 0
        self._proc: subprocess.Popen | None = None
        self._forwarded = 0

    # ------------------------------------------------------------ the run

    def supervise(self) -> str:
        """Run attempts until the run ends; returns its status: finished, stopped or failed."""
        self.run.pid_path.write_text(f"{os.getpid()}\n")
        self._install_signal_handlers()
        try:
            self.events.emit("run_started", run=self.run.id, workload=self.config.workload_preset,
                             device_preset=self.config.device_preset, pid=os.getpid(),
                             overrides=list(self.config.overrides))
            result = self.run_attempt(1, self.config.device_preset, self.config.device)
            status = {"finished": "finished", "stopped": "stopped"}.get(result.outcome, "failed")
            self.events.emit("run_finished", status=status, attempts=result.attempt)
            self._pump()
            return status
        finally:
            self.events.close()
            self.run.pid_path.unlink(missing_ok=True)

    def run_attempt(self, attempt: int, name: str, preset: DevicePreset) -> AttemptResult:
        log_path = self.run.attempt_log(attempt)
        command = [sys.executable, "-m", "engine.trainer", str(self.run.path), "--attempt", str(attempt),
                   "--preset", name, "--device-json", json.dumps(to_table(preset))]
        self.events.emit("attempt_started", attempt=attempt, preset=name, config=to_table(preset),
                         log=log_path.name)
        with open(log_path, "ab") as log:
            # Its own session: a Ctrl-C in the terminal reaches only the supervisor, which
            # forwards exactly one stop request.
            self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, env=_child_env(dict(preset.env)),
                                          start_new_session=True)
        self._forwarded = 0
        while self._proc.poll() is None:
            self._forward_stop()
            self._pump()
            time.sleep(self.poll_s)
        self._pump()
        result = self._result(attempt, name, self._proc.returncode, _tail(log_path))
        self._proc = None
        self.events.emit("attempt_ended", attempt=attempt, preset=name, outcome=result.outcome,
                         exit_code=result.exit_code, signal=result.signal,
                         exit=result.signal or f"exit {result.exit_code}", tail=result.tail)
        self._pump()
        return result

    def _result(self, attempt: int, name: str, code: int, tail: str) -> AttemptResult:
        from engine.trainer import EXIT_CONFIG, EXIT_FINISHED, EXIT_STOPPED

        sig = signal.Signals(-code).name if code < 0 else None
        if code == EXIT_FINISHED:
            outcome = "finished"
        elif code == EXIT_STOPPED or (self._forwarded and (sig or code)):
            outcome = "stopped"
        elif code == EXIT_CONFIG:
            outcome = "config"
        else:
            outcome = "failed"
        return AttemptResult(attempt, name, outcome, None if sig else code, sig, tail)

    # ------------------------------------------------------------ stopping

    def request_stop(self) -> None:
        """Ask the run to stop (thread-safe; signal handlers call this too)."""
        self.stop_requests += 1

    def _forward_stop(self) -> None:
        if self._proc is not None and self._forwarded < min(self.stop_requests, 2):
            self._proc.send_signal(signal.SIGTERM)
            self._forwarded += 1

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # the TUI's worker calls request_stop() instead
        signal.signal(signal.SIGINT, lambda *_: self.request_stop())
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        # A closed terminal or dropped SSH connection must not end the run.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _pump(self) -> None:
        events = self.follower.poll()
        if events and self.on_events:
            self.on_events(events)


# ---------------------------------------------------------------- detached runs


def start_detached(run: RunDir) -> int:
    """Start a supervisor for the run in its own session; returns its pid at once."""
    with open(run.supervisor_log, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "engine.supervisor", str(run.path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=_child_env({}), start_new_session=True)
    run.pid_path.write_text(f"{proc.pid}\n")
    return proc.pid


def request_stop(run: RunDir) -> bool:
    """Ask a live run's supervisor to stop it gracefully; False if none is running."""
    pid = run.supervisor_pid()
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m engine.supervisor RUN_DIR", file=sys.stderr)
        return 2
    status = Supervisor(RunDir(Path(argv[0]))).supervise()
    return {"finished": 0, "stopped": 130}.get(status, 1)


if __name__ == "__main__":
    sys.exit(main())

"""A process cockpit did not start, found by its pid: `cockpit adopt PID [--log FILE]`.

    (engine.run.adoption read what the process is and made a run directory of it, a command
    run's: run.toml, events.jsonl, attempt-1.log, adopted.json)
    the supervisor (engine.run.supervisor) with this launcher, one attempt, until it ends:
        copy what it writes to its log into attempt-1.log, read it for progress as a command's
            output is read (the same parser and tracker: step and eval events)
        sample its memory and CPU over its process tree; its health warns, never falls back
        watch for a hang: a warning, not a kill
        forward a stop the user asks for (`cockpit runs stop`, the TUI's s): SIGINT, then SIGTERM
            and SIGKILL after their grace, as a command gets
    judge its end from its log's tail, and say that its exit status cannot be known

It is not our child: its end is seen by polling its identity (pid and start time; a pidfd or a
kqueue wakes the loop at once where the kernel gives one), and its exit status is its parent's
to read, never ours, so an end with no error in the log is "ended", not "finished". cockpit never
signals it unless the user stops the run; Ctrl-C on a foreground `cockpit adopt` (SIGINT to its
supervisor) stops following it and leaves it running ("released"). It is never relaunched, and
nothing outlives us: there is no lifeline, since the process was running before us and goes on
without us.

Its argv, working directory and environment go into run.toml as an ordinary command's (the
environment as the device preset's `env`, which is why the run directory is made private), so
that once it has ended `cockpit runs resume RUN [--resume-args ARGS]` starts it again under
cockpit as an ordinary command run (engine.run.resume).

    python -m engine.run.launchers.adopted RUN_DIR [--terminal TTY --terminal-owner 'PID START']
                                                   [--notify-command CMD]
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Callable

from engine import command as commands
from engine.command import statements
from engine.errors import ConfigError
from engine.preset_types import DevicePreset
from engine.event_types import WarningFields
from engine.record.events import EventWriter
from engine.record.identity import ProcessId
from engine.record.rundir import RunDir
from engine.run import detached
from engine.run.adoption import RECORD, record_of
from engine.run.crashes import COMMAND, AttemptEnd, Verdict, classify, last_line
from engine.run.kinds import CommandKind
from engine.run.launch import Launch
from engine.run.launchers.base import Launcher
from engine.run.launchers.command import COMMAND_STOP, describe_command
from engine.run.lifeline import Lifeline
from engine.run.process import AttemptProcess, to_own_group
from engine.run.watch import AttemptWatch
from engine.runconfig import RunConfig

ATTEMPT = 1
# Of a log that was written before cockpit came, at most its last this many bytes are read (and
# copied into attempt-1.log): the steps so far, not a week of output.
HISTORY_BYTES = 8 << 20
CHUNK = 1 << 20
UNKNOWN_EXIT = "exit status unknown (not cockpit's child)"
TRACEBACK = "Traceback (most recent call last)"
MODULE = "engine.run.launchers.adopted"   # run as a detached supervisor (python -m)


class AdoptedLauncher(Launcher):
    """The adopted process: found, followed, signalled only when the user stops the run."""

    name = "adopted"
    subject = COMMAND
    relaunches = False      # not ours to start: `cockpit runs resume` starts it again as a command
    rewinds = False         # nor ours to start again from an older checkpoint
    interrupt = "release"   # Ctrl-C on a foreground `cockpit adopt` leaves it running
    found = True
    reads = CommandKind     # its log, as a command's output
    ends = ("stopped", "released", "ended")   # never "finished": its exit status is not ours

    def __init__(self, run: RunDir, config: RunConfig | None = None):
        super().__init__(run, config or run.config())
        record = record_of(run)
        if record is None:
            raise ConfigError("run", run.id, f"has no readable {RECORD}: it is not an adopted run")
        self.record = record
        self.identity = ProcessId(int(record["pid"]), float(record["start"]))
        self._copy = LogCopy(record.get("logs") or [], run.attempt_log(ATTEMPT))
        self._events: EventWriter | None = None   # the run's, once it is followed

    def deliver(self, process: AttemptProcess, sig: signal.Signals) -> None:
        """Its group where it leads one of its own, else the process alone (engine.run.process)."""
        to_own_group(process, sig)

    @classmethod
    def fits(cls, config: RunConfig, preset: DevicePreset) -> bool:
        return False   # never chosen for a preset: `cockpit adopt` names it

    def launch(self, attempt: int, name: str, preset: DevicePreset, resume: dict | None = None) -> Launch:
        spec, record = self.config.workload.params, self.record
        argv = [str(a) for a in record["argv"]]
        known = statements.from_argv(argv)
        return Launch(argv=argv, env=dict(preset.env), cwd=record["cwd"], progress=spec.progress,
                      progress_regex=spec.progress_regex, units=commands.units(spec, preset, known),
                      known=known, total_steps=spec.total_steps, stop_signals=COMMAND_STOP,
                      stop_grace_s=spec.stop_grace_s,
                      # what it runs on is its own affair: the attempt says which process it is
                      device=f"pid {self.identity.pid}")

    def start(self, launch: Launch, log, events: EventWriter) -> AttemptProcess:
        """Found, not started: what it lacks for its progress is said first."""
        self._events, record = events, self.record
        if record.get("no_log"):
            events.emit("warning", attempt=ATTEMPT, kind="adopted-no-log", fallback=False,
                        message=f"no progress: {record['no_log']}", advice=[
                            {"text": f"cockpit adopt {self.identity.pid} --log FILE"}])
        if record.get("undecodable"):
            events.emit("warning", attempt=ATTEMPT, kind="adopted-undecodable", fallback=False,
                        advice=[], message="not UTF-8, so a resume cannot give them back as they "
                        "were: " + ", ".join(record["undecodable"]))
        return AttemptProcess.adopt(self.identity, launch.stop_signals, launch.stop_grace_s, self.deliver)

    def lifeline(self, lock: int) -> Lifeline | None:
        return None   # it was running before us and goes on without us

    def run_fields(self) -> dict:
        return {"adopted": self.record}

    def describe(self, launch: Launch) -> dict:
        return describe_command(launch)

    def collect(self, final: bool = False) -> bool:
        return self._copy.copy(final)

    def hung(self, process: AttemptProcess, preset: DevicePreset, poll_s: float) -> None:
        """Said, never acted on: it is not ours to stop (`cockpit runs stop` is the user's)."""
        if self._events is None or not self._copy.sources:
            return   # no log to read a sign of life from: silence says nothing
        self._events.emit("warning", attempt=ATTEMPT, kind="hang", fallback=False, advice=[
            {"text": f"cockpit runs stop {self.run.id}"}],
            message=f"no output for {preset.hang_timeout_s:.0f} s or more: it may be hung "
                    "(cockpit does not stop a process it did not start)")

    def abandon(self, process: AttemptProcess) -> None:
        """It was running before us and goes on without us, as it would have."""

    def non_finite(self, stop_now: Callable[[], None]) -> None:
        """A NaN loss is recorded, not acted on: it is not ours to stop."""

    def warning(self, warning: WarningFields) -> WarningFields:
        """Its health warns; it never falls back (there is nothing to fall back to)."""
        said = warning.copy()
        said["fallback"] = False
        return said

    def judge(self, watch: AttemptWatch, launch: Launch, code: int | None, tail: str, *,
              released: bool = False, total: int | None = None, stop_requested: bool = False,
              memory_percent: float | None = None, **facts) -> tuple[Verdict, int | None, str | None]:
        return judge(tail, watch, stopped=stop_requested, released=released, pid=self.identity.pid,
                     memory_percent=memory_percent, total=total), None, None

    def exit_text(self, code: int | None, sig: str | None, process: AttemptProcess | None) -> str:
        if process is not None and process.alive():
            return f"still running (pid {process.pid})"
        return UNKNOWN_EXIT


# ---------------------------------------------------------------- its log


class LogCopy:
    """What the process writes to its log files, appended to attempt-1.log as it comes: the run
    directory keeps its own copy (the user may delete or rotate theirs), and the supervisor reads
    it as it reads any attempt's log.

    The first copy takes what the files hold already (their last HISTORY_BYTES, from a line's
    start): someone adopting a run an hour in expects to see where it is, its total and its
    units, which the script printed once at its start. Two files (stdout and stderr apart) are
    copied line by line, so that their lines do not cut into each other."""

    def __init__(self, sources: list[str], dest: Path):
        self.sources = [Path(s) for s in sources]
        self.dest = dest
        self.offsets: list[int | None] = [None] * len(self.sources)
        self.pending = [b""] * len(self.sources)

    def copy(self, final: bool = False) -> bool:
        """Copy what is new; `final`: the process is gone, copy everything left. Returns whether
        anything was."""
        out = bytearray()
        for i, path in enumerate(self.sources):
            data = self._read(i, path, to_end=final)
            if len(self.sources) == 1:
                out += data
                continue
            data = self.pending[i] + data
            cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1 if not final else len(data)
            out += data[:cut]
            self.pending[i] = data[cut:]
        if out:
            with open(self.dest, "ab") as f:
                f.write(out)
        return bool(out)

    def _read(self, i: int, path: Path, to_end: bool) -> bytes:
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                offset = self.offsets[i]
                if offset is None:
                    offset = self._history_start(f, size)
                elif size < offset:
                    offset = 0   # truncated and written again (a `>` redirect reopened)
                f.seek(offset)
                data = f.read() if to_end else f.read(CHUNK)
        except OSError:
            return b""   # deleted or rotated away: nothing more from it
        self.offsets[i] = offset + len(data)
        return data

    @staticmethod
    def _history_start(f, size: int) -> int:
        if size <= HISTORY_BYTES:
            return 0
        f.seek(size - HISTORY_BYTES)
        line = f.readline()   # the rest of a line cut in half
        return size - HISTORY_BYTES + len(line)


# ---------------------------------------------------------------- how it ended


def judge(tail: str, watch: AttemptWatch, *, stopped: bool, released: bool, pid: int,
          memory_percent: float | None, total: int | None) -> Verdict:
    """How it ended, from its log's tail and what was read of it: its exit status is unknown,
    so an error in the log (a traceback, an out-of-memory or backend message) is the only
    evidence of a crash; without one it "ended"."""
    if released:
        return Verdict("released", f"cockpit stopped following it; it runs on as pid {pid}.",
                       {"exit_code": None, "pid": pid})
    if stopped:
        return Verdict("stopped", "It stopped when asked (cockpit sent it SIGINT, then SIGTERM and "
                                  "SIGKILL after their grace where it went on).", {"exit_code": None})
    # An uncaught Python exception exits 1: that lets the traceback rule read the tail; the
    # evidence says the status itself was not seen.
    found = classify(AttemptEnd(exit_code=1 if TRACEBACK in tail else None, signal=None, tail=tail,
                                numerical=watch.numerical, last_step=watch.last_step, subject=COMMAND,
                                memory_percent=memory_percent))
    interrupted = found.kind == "user-code" and "KeyboardInterrupt" in found.sentence
    if found.kind not in ("unknown", "finished") and not interrupted:
        return Verdict(found.kind, f"{found.sentence} (From its log: its {UNKNOWN_EXIT}.)",
                       {**found.evidence, "exit_code": None})
    step = watch.last_step
    where = "" if step is None else f" at step {step}" + (f" of {total}" if total else "")
    why = (" after a KeyboardInterrupt (a Ctrl-C or SIGINT from outside cockpit)" if interrupted
           else "; its log shows no error")
    return Verdict("ended", f"The process ended{where}{why}; its {UNKNOWN_EXIT}.",
                   {"exit_code": None, "last_step": step, "message": last_line(tail) or None})


# ---------------------------------------------------------------- detached


def start_detached(run: RunDir, **kwargs) -> int:
    """Follow the adopted process from a supervisor in a session of its own (engine.run.detached's
    way), so that it outlives the terminal and the TUI."""
    return detached.start_detached(run, module=MODULE, **kwargs)


def main(argv: list[str] | None = None) -> int:
    return detached.main(argv, module=MODULE, launcher=AdoptedLauncher,
                         exit_codes={"ended": 0, "stopped": 130, "released": 130})


if __name__ == "__main__":
    sys.exit(main())

"""A run made of a process cockpit did not start, followed: `cockpit adopt PID [--log FILE]`.

    (engine.run.adoption read what the process is and made a run directory of it, a command
    run's: run.toml, events.jsonl, attempt-1.log)
    until it ends:
        copy what it writes to its log into attempt-1.log, read it for progress as a command's
            output is read (the same parser and tracker: step and eval events)
        sample its memory and CPU over its process tree
        forward a stop the user asks for (`cockpit runs stop`, the TUI's s): SIGINT, then SIGTERM
            and SIGKILL after their grace, as a command gets
    judge its end from its log's tail, and say that its exit status cannot be known

It is not our child: its end is seen by polling its identity (pid and start time; a pidfd or a
kqueue wakes the loop at once where the kernel gives one), and its exit status is its parent's
to read, never ours, so an end with no error in the log is "ended", not "finished". cockpit never
signals it unless the user stops the run; Ctrl-C on a foreground `cockpit adopt` (SIGINT to this
supervisor) stops following it and leaves it running ("released"). Nothing outlives us either:
there is no lifeline, since the process was running before us and goes on without us.

Its argv, working directory and environment go into run.toml as an ordinary command's (the
environment as the device preset's `env`, which is why the run directory is made private), so
that once it has ended `cockpit runs resume RUN [--resume-args ARGS]` starts it again under
cockpit as an ordinary command run (engine.run.resume).

    python -m engine.run.adopted RUN_DIR [--terminal TTY --terminal-owner 'PID START']
                                         [--notify-command CMD]
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from engine import command as commands
from engine.command import statements
from engine.errors import ConfigError
from engine.record import stats
from engine.record.attempt_log import TAIL_LINES, OutputFollower, log_tail
from engine.record.event_types import WarningFields
from engine.record.events import EventFollower, EventWriter
from engine.record.identity import ProcessId
from engine.record.rundir import RunDir
from engine.run import alerts, detached, kinds
from engine.run.adoption import PRESET, RECORD, record_of
from engine.run.crashes import AttemptEnd, Verdict, classify, last_line
from engine.run.health import AttemptHealth
from engine.run.launch import Launch
from engine.run.process import ExitWait
from engine.run.rehearsal import Rehearsal
from engine.run.watch import AttemptWatch
from engine.schema import to_table

ATTEMPT = 1
# Of a log that was written before cockpit came, at most its last this many bytes are read (and
# copied into attempt-1.log): the steps so far, not a week of output.
HISTORY_BYTES = 8 << 20
CHUNK = 1 << 20
UNKNOWN_EXIT = "exit status unknown (not cockpit's child)"
TRACEBACK = "Traceback (most recent call last)"


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


# ---------------------------------------------------------------- the process


class AdoptedProcess:
    """The adopted process, by identity: signalled only when the user stops the run, through the
    stop signals with their grace, as a command is. Where it leads its own process group (a
    shell's job: `python train.py &`) the group gets them, as a Ctrl-C in its terminal would;
    otherwise the process alone (its group is someone else's)."""

    def __init__(self, identity: ProcessId, stop_signals: tuple[signal.Signals, ...], grace_s: float):
        self.identity = identity
        self.pid = identity.pid
        self.stop_signals = stop_signals
        self.grace_s = grace_s
        self.stops_sent = 0
        self.stop_sent_at = 0.0

    def alive(self) -> bool:
        return self.identity.alive()

    def signal(self, sig: signal.Signals) -> None:
        if not self.alive():
            return   # never a stranger that was given its pid
        try:
            if os.getpgid(self.pid) == self.pid and self.pid != os.getpgrp():
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def send_stop(self) -> None:
        self.signal(self.stop_signals[self.stops_sent])
        self.stops_sent += 1
        self.stop_sent_at = time.monotonic()

    def stop_overdue(self) -> bool:
        return 0 < self.stops_sent < len(self.stop_signals) and \
            time.monotonic() - self.stop_sent_at > self.grace_s


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
                                numerical=watch.numerical, last_step=watch.last_step, command=True,
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


STATUS = {"stopped": "stopped", "released": "released", "ended": "ended"}   # else failed


# ---------------------------------------------------------------- the supervisor


class AdoptSupervisor:
    """Follows an adopted process to its end and keeps its run's record; `supervise()` returns
    the run's status: ended, failed, stopped or released."""

    def __init__(self, run: RunDir, on_events: Callable[[list[dict]], None] | None = None,
                 poll_s: float = 0.1, *, terminal: alerts.Terminal | None = None,
                 notify_command: str | None = None):
        self.run = run
        self.config = run.config()
        record = record_of(run)
        if record is None:
            raise ConfigError("run", run.id, f"has no readable {RECORD}: it is not an adopted run")
        self.record = record
        self.identity = ProcessId(int(record["pid"]), float(record["start"]))
        self.on_events = on_events
        self.poll_s = poll_s
        self._alert_to: dict = dict(terminal=terminal, notify_command=notify_command)
        self._alerts: alerts.Alerts | None = None
        self.follower = EventFollower(run.events_path)
        self.events = EventWriter(run.events_path, attempt=0)
        self.stop_requests = 0
        self.released = False
        self._health: AttemptHealth | None = None
        self._watch: AttemptWatch | None = None
        self._memory_percent: float | None = None

    # ------------------------------------------------------------ the run

    def supervise(self) -> str:
        lock = self.run.try_lock()
        if lock is None:
            self.events.close()
            raise ConfigError("run", self.run.id, "is being followed already (its supervisor holds run.lock)")
        self.run.write_supervisor_pid(os.getpid())
        self._install_signal_handlers()
        ended = False
        try:
            self.events.emit("run_started", run=self.run.id, workload=self.config.workload_preset,
                             device_preset=self.config.device_preset, pid=os.getpid(),
                             overrides=list(self.config.overrides), command=True, adopted=self.record)
            self._alerts = alerts.for_run(self.run, self.config, **self._alert_to, say=self._say)
            status = self._follow()
            self.events.emit("run_finished", status=status, attempts=1,
                             summary=stats.fold(self.run.events()).summary())
            self._pump()
            self._alerts.close()
            self._pump()
            ended = True
            return status
        finally:
            if ended:
                self.run.pid_path.unlink(missing_ok=True)
            self.events.close()
            os.close(lock)

    def _say(self, text: str) -> None:
        self.events.emit("warning", kind="alert", message=text, advice=[], fallback=False)

    def _follow(self) -> str:
        spec, preset, record = self.config.workload.params, self.config.device, self.record
        argv = [str(a) for a in record["argv"]]
        known = statements.from_argv(argv)
        launch = Launch(argv=argv, env=dict(preset.env), cwd=record["cwd"], is_command=True,
                        progress=spec.progress, progress_regex=spec.progress_regex,
                        units=commands.units(spec, preset, known), known=known,
                        total_steps=spec.total_steps, group=True,
                        stop_signals=(signal.SIGINT, signal.SIGTERM, signal.SIGKILL),
                        stop_grace_s=spec.stop_grace_s,
                        # what it runs on is its own affair: the attempt says which process it is
                        device=f"pid {self.identity.pid}")
        log_path = self.run.attempt_log(ATTEMPT)
        log_path.touch()
        self.events.emit("attempt_started", attempt=ATTEMPT, preset=PRESET, config=to_table(preset),
                         log=log_path.name, **launch.describe())
        if record.get("no_log"):
            self.events.emit("warning", attempt=ATTEMPT, kind="adopted-no-log", fallback=False,
                             message=f"no progress: {record['no_log']}", advice=[
                                 {"text": f"cockpit adopt {self.identity.pid} --log FILE"}])
        if record.get("undecodable"):
            self.events.emit("warning", attempt=ATTEMPT, kind="adopted-undecodable", fallback=False,
                             advice=[], message="not UTF-8, so a resume cannot give them back as "
                             "they were: " + ", ".join(record["undecodable"]))
        watch = self._watch = AttemptWatch(ATTEMPT)
        kind = kinds.for_run(self.run, self.config, self.events)
        # cockpit never signals it on its own: a NaN loss is recorded, not acted on
        kind.begin(launch, watch, PRESET, preset, Rehearsal(launch, watch, self.events), lambda: None)
        copy = LogCopy(record.get("logs") or [], log_path)
        output = OutputFollower(log_path, kind.parser(launch))
        self._history(copy, output, kind)
        process = AdoptedProcess(self.identity, launch.stop_signals, spec.stop_grace_s)
        self._health = AttemptHealth(process.pid, launch.env, self.config.workload, preset)
        exit_wait = ExitWait(process.pid)   # opened, then checked: the pid is still its own below
        while process.alive() and not self.released:
            self._forward_stop(process)
            self._pump()
            copy.copy()
            kind.progress(output.observe()[1], False)
            kind.look_for_checkpoints()
            self._sample_memory()
            exit_wait.wait(self.poll_s)
        exit_wait.close()
        copy.copy(final=True)
        kind.progress(output.observe(to_end=True)[1], True)
        kind.look_for_checkpoints(final=True)
        self._pump()
        tail = log_tail(log_path, TAIL_LINES)
        tracker = kind.tracker
        verdict = judge(tail, watch, stopped=bool(self.stop_requests), released=self.released,
                        pid=process.pid, memory_percent=self._memory_percent,
                        total=tracker.total_known if tracker is not None else None)
        if verdict.kind not in STATUS:
            self.events.emit("crash", attempt=ATTEMPT, preset=PRESET, kind=verdict.kind,
                             sentence=verdict.sentence, evidence=verdict.evidence, exception=None)
        self.events.emit("attempt_ended", attempt=ATTEMPT, preset=PRESET, outcome=verdict.kind,
                         exit_code=None, signal=None,
                         exit=f"still running (pid {process.pid})" if self.released else UNKNOWN_EXIT,
                         last_step=watch.last_step, samples_seen=watch.last_samples, tail=tail)
        self._pump()
        return STATUS.get(verdict.kind, "failed")

    def _history(self, copy: LogCopy, output: OutputFollower, kind: kinds.TrainerKind) -> None:
        """What its log held before cockpit came, read at once: its facts (total, units), its
        evals and its steps, said as a sighting with no rate. One read is one moment to the
        tracker: an hour's steps in it measure nothing, and its first window opens at the last
        of them, now (engine.command.tracker)."""
        while copy.copy():
            pass
        observations: list = []
        while True:
            wrote, found = output.observe()
            observations += found
            if not wrote:
                break
        kind.progress(observations, False)
        kind.progress([], True)   # the sighting: where it is, before any window
        self._pump()

    # ------------------------------------------------------------ health

    def _sample_memory(self) -> None:
        assert self._health is not None
        if (sample := self._health.sample()) is None:
            return
        self._memory_percent = 100.0 * sample["system_used"] / sample["system_total"]
        if sample["rss"] is None:
            return   # it ended since the last look
        self.events.emit("memory", attempt=ATTEMPT, **sample)
        for warning in self._health.warnings(sample):
            self._warn(warning)

    def _warn(self, warning: WarningFields) -> None:
        """A warning of its health: said, never acted on (no fallback: it is not ours to stop)."""
        fields = warning.copy()
        fields["fallback"] = False
        self.events.emit("warning", attempt=ATTEMPT, **fields)

    # ------------------------------------------------------------ stopping

    def request_stop(self) -> None:
        """The user's stop (`cockpit runs stop`, the TUI's s: SIGTERM to this supervisor)."""
        self.stop_requests += 1

    def release(self) -> None:
        """Stop following it and leave it running (Ctrl-C on a foreground `cockpit adopt`)."""
        self.released = True

    def _forward_stop(self, process: AdoptedProcess) -> None:
        signals = process.stop_signals
        while process.stops_sent < min(self.stop_requests, len(signals)):
            self.events.emit("stop_requested", attempt=ATTEMPT, request=process.stops_sent + 1,
                             signal=signals[process.stops_sent].name)
            process.send_stop()
        if process.stop_overdue():   # its grace is over: the next signal, unasked (as a command's)
            process.send_stop()

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        signal.signal(signal.SIGINT, lambda *_: self.release())
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _pump(self) -> None:
        events = self.follower.poll()
        now = time.monotonic()
        for e in events:
            if e.get("attempt") != ATTEMPT or e["type"] not in ("step", "eval", "numerical"):
                continue
            if self._watch is not None:
                self._watch.see(e, now)   # how far it got: attempt_ended's last step
            if e["type"] == "step" and self._health is not None:
                if (warning := self._health.saw(e)) is not None:
                    self._warn(warning)
        if events and self.on_events:
            self.on_events(events)
        if self._alerts is not None:
            self._alerts.see(events)


# ---------------------------------------------------------------- detached


def start_detached(run: RunDir, **kwargs) -> int:
    """Follow the adopted process from a supervisor in a session of its own (engine.run.detached's
    way), so that it outlives the terminal and the TUI."""
    return detached.start_detached(run, module="engine.run.adopted", **kwargs)


def main(argv: list[str] | None = None) -> int:
    return detached.main(argv, module="engine.run.adopted", supervisor=AdoptSupervisor,
                         exit_codes={"ended": 0, "stopped": 130, "released": 130})


if __name__ == "__main__":
    sys.exit(main())


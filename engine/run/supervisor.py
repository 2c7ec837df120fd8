"""The supervisor: owns a run's attempts, each in its own process.

    until the run ends:
        start the attempt from its launch, and tell the lifeline how to stop it
        until it exits: forward stop requests, read its events and output, sample memory,
            rehearse faults, end it if it hangs
        classify how it ended; fall back to the next rung, resumed from the newest checkpoint,
            or end the run

A native crash (SIGABRT from Metal, SIGSEGV) kills only the attempt; the supervisor records how
it ended (exit code or signal, the log's tail, its events), classifies it (engine.run.crashes)
and applies the device preset's rules (engine.run.fallback). It runs in the foreground under
`cockpit --no-ui`, or detached in its own session (engine.run.detached) so that a run outlives
its terminal.

Both kinds of workload run through the same loop; the rooms beside it say how each differs:
an attempt's launch (engine.run.launch) and process (engine.run.process: its session, signals
and stop escalation), its kind (engine.run.kinds: the trainer or the user's command, how
progress is read, which checkpoints there are, where the next attempt resumes), what is learnt
of it and the hang watch (engine.run.watch), its memory and slowdown (engine.run.health), fault
rehearsal in a command (engine.run.rehearsal), and the lifeline that stops it should the
supervisor die.

Recovery is quick: the loop waits on the attempt's exit (engine.run.process.ExitWait), so it wakes
the moment the attempt dies rather than at its next poll, and while a built-in trainer attempt
trains, a spare process (engine.train.spare: torch imported, the environment the next attempt
would have) waits to become the next one, saving the interpreter's and torch's start. A spare is
never a command's, is discarded when the next attempt's environment differs, and ends with the
run (`spare=False` or COCKPIT_SPARE=0: none).

Stopping: SIGINT/SIGTERM to the supervisor (or `request_stop`) forwards the attempt's first stop
signal (the trainer's SIGTERM: it finishes its step, checkpoints and exits; a command's SIGINT,
as Ctrl-C), a second request the next one. Every event it reads goes to engine.run.alerts too,
so that a detached run alerts with no front end open.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from engine.record import events as event_log, reached, stats
from engine.run import alerts, fallback, kinds, launch as launches
from engine.record.attempt_log import TAIL_LINES, OutputFollower, log_tail
from engine.record.event_types import FallbackFields, RunStartedFields, WarningFields
from engine.record.events import EventFollower, EventWriter
from engine.run.fallback import Decision, Ladder, Rung
from engine.run.health import AttemptHealth
from engine.run.launch import Launch, child_env
from engine.run.lifeline import Lifeline
from engine.run.process import AttemptProcess, Spare
from engine.run.rehearsal import Rehearsal
from engine.run.resume import History
from engine.record.rundir import RunDir
from engine.run.watch import AttemptResult, AttemptWatch, judge
from engine.errors import ConfigError
from engine.schema import to_table


class Supervisor:
    def __init__(self, run: RunDir, on_events: Callable[[list[dict]], None] | None = None,
                 poll_s: float = 0.1, *, terminal: alerts.Terminal | None = None,
                 notify_command: str | None = None, spare: bool | None = None,
                 wake_on_exit: bool = True):
        """`spare`: pre-start the next attempt's process (None: unless COCKPIT_SPARE=0);
        `wake_on_exit`: the loop wakes as the attempt exits (False: at its next poll only)."""
        self.run = run
        # engine.run.alerts: where crashes, fallbacks, the finish... are told (settings.toml)
        self._alert_to: dict[str, Any] = dict(terminal=terminal, notify_command=notify_command)
        self._alerts: alerts.Alerts | None = None
        self.config = run.config()
        self.on_events = on_events
        self.poll_s = poll_s
        self.follower = EventFollower(run.events_path)
        self.events = EventWriter(run.events_path, attempt=0)
        self.stop_requests = 0
        self.kind = kinds.for_run(run, self.config, self.events)   # trainer or command
        self._process: AttemptProcess | None = None   # the attempt's (engine.run.process)
        self._launch: Launch | None = None
        self._watch: AttemptWatch | None = None
        self._slowest_gap = 0.0       # the longest quiet interval seen in a healthy attempt
        self._health: AttemptHealth | None = None   # memory, slowdown (engine.run.health)
        self._memory_percent: float | None = None   # system memory in use at the last sample
        self._output: OutputFollower | None = None   # attempt-N.log as it is written
        self._reached: reached.Reader | None = None   # the step it published (engine.record.reached)
        self._rehearsal: Rehearsal | None = None   # the faults it delivers to a command
        self._lifeline: Lifeline | None = None
        self._first_attempt = 1   # above 1 when this supervisor continues a run
        self._fired: set[str] = set()   # the faults injected in this run, whatever the preset
        self.use_spare = spare if spare is not None else os.environ.get("COCKPIT_SPARE", "1") != "0"
        self.wake_on_exit = wake_on_exit
        self._spare: Spare | None = None   # the next attempt's process, started ahead
        self.spare_pids: list[int] = []    # every spare started (did an attempt run in one?)
        self._no_spare_for: int | None = None   # the next attempt that none can serve (torchrun)

    # ------------------------------------------------------------ the run

    def supervise(self) -> str:
        """Run attempts until the run ends; returns its status: finished, stopped or failed.
        A run that has events already is continued (engine.run.resume), not started over."""
        lock = self.run.try_lock()
        if lock is None:
            self.events.close()
            raise ConfigError("run", self.run.id, "is being supervised already (its supervisor, or "
                                                  "the lifeline stopping its attempt, holds run.lock)")
        self.run.write_supervisor_pid(os.getpid())
        self._install_signal_handlers()
        self._lifeline = lifeline = Lifeline(self.run.path, self.run.supervisor_log, child_env({}), lock)
        ended = False
        try:
            resume = self._begin_run()
            self._alerts = alerts.for_run(self.run, self.config, **self._alert_to, say=self._alert_trouble)
            lifeline.alerts(self._alerts.describe())   # it tells of our death
            status, results = self._attempts(resume)
            self.events.emit("run_finished", status=status, attempts=len(results),
                             summary=run_summary(self.run))
            self._pump()
            self._alerts.close()   # the last alerts' commands, each at most until its timeout
            self._pump()
            ended = True
            return status
        finally:
            # Without the lifeline's `bye` (a supervisor bug escaped), it records the run as
            # interrupted, with the command that continues it.
            self._discard_spare()
            if ended:
                lifeline.close()
                self.run.pid_path.unlink(missing_ok=True)
            self.events.close()
            os.close(lock)  # the lifeline's copy keeps the run locked until it is done

    def _alert_trouble(self, text: str) -> None:
        """A notify command that failed or hung, a settings.toml broken since the run began: said
        as a warning; the run goes on."""
        self.events.emit("warning", kind="alert", message=text, advice=[], fallback=False)

    def _begin_run(self) -> dict | None:
        """run_started, or run_resumed for a run that earlier supervisors worked on; returns
        where a continued run's first attempt resumes."""
        history = History.of(self.run.events())
        fields = RunStartedFields(run=self.run.id, workload=self.config.workload_preset,
                                  device_preset=self.config.device_preset, pid=os.getpid(),
                                  overrides=list(self.config.overrides),
                                  command=self.config.workload.is_command)
        if history.started is None:
            self.events.emit("run_started", **fields)
            return None
        # Past what the earlier supervisors wrote: a torn last line (a writer killed mid-write)
        # is ended first, so this supervisor's events start on a line of their own.
        event_log.end_torn_line(self.run.events_path)
        self.follower.offset = self.run.events_path.stat().st_size
        self._first_attempt = history.attempts + 1
        self._fired = {spec for _, spec in history.fired if spec is not None}
        self.kind.continue_from(history)
        resume = self.kind.resume_point()
        self.events.emit("run_resumed", **fields, next_attempt=self._first_attempt, resume=resume)
        return resume

    def _attempts(self, resume: dict | None) -> tuple[str, list[AttemptResult]]:
        start = Rung(self.config.device_preset, self.config.device)
        ladder = Ladder(start, self.config.ladder)
        current, fired = start, self._fired
        results: list[AttemptResult] = []
        while True:
            attempt = self._first_attempt + len(results)
            # A fault fires once per run, whatever preset the attempt runs (unless it ends in
            # '+': then in every attempt), as a real crash does not follow the run onto a safer
            # setting. --inject sets every preset's faults (engine.runconfig.carry_overrides).
            preset = current.preset
            inject = tuple(f for f in preset.inject if f.strip() not in fired or f.endswith("+"))
            result = self.run_attempt(attempt, current.name, dataclasses.replace(preset, inject=inject),
                                      resume)
            results.append(result)
            fired.update(result.watch.fired)
            verdict = result.verdict
            if not verdict.crashed:
                return {"finished": "finished", "stopped": "stopped"}.get(verdict.kind, "failed"), results
            if self.stop_requests:
                return "stopped", results
            if verdict.kind == "checkpoint" and resume:
                self.kind.unloadable(result.attempt, resume["path"], verdict)
            previous, resume = resume, self.kind.resume_point(result.watch.numerical)
            # len(results): a continued run gets max_attempts of its own, the user asked for more
            decision = fallback.decide(verdict, current, ladder, len(results), start.preset.max_attempts,
                                       precision_used=result.watch.precision,
                                       fixed=self.kind.fixed_settings(),
                                       progressed=fallback.got_further(previous, resume))
            if decision.next is None:
                self.events.emit("run_failed", reason=decision.why, kind=verdict.kind)
                return "failed", results
            self._emit_fallback(result, decision, resume)
            current = decision.next

    def _emit_fallback(self, result: AttemptResult, decision: Decision, resume: dict | None) -> None:
        following = decision.next
        assert following is not None  # _attempts ends the run on a decision with none
        to = following.name + (f" ({fallback.describe_change(decision.changed)})"
                               if decision.action != "next" and decision.changed else "")
        fields: FallbackFields = {"from": result.step.name, "to": to, "to_preset": following.name,
                                  "action": decision.action, "reason": result.verdict.kind,
                                  "why": decision.why, "sentence": result.verdict.sentence,
                                  "changed": decision.changed, "resume": resume,
                                  "next_attempt": result.attempt + 1}
        self.events.emit("fallback", attempt=result.attempt, **fields)
        self._pump()

    def run_attempt(self, attempt: int, name: str, preset, resume: dict | None = None) -> AttemptResult:
        log_path = self.run.attempt_log(attempt)
        launch = self._launch = launches.build(self.run, self.config, attempt, name, preset, resume)
        self.events.emit("attempt_started", attempt=attempt, preset=name, config=to_table(preset),
                         log=log_path.name, **launch.describe())
        self._watch = watch = AttemptWatch(attempt)
        self._begin_attempt(launch, log_path, name, preset)
        rehearsal, lifeline = self._rehearsal, self._lifeline
        assert rehearsal is not None and lifeline is not None  # _begin_attempt's; supervise's
        with open(log_path, "ab") as log:
            # Its own session: a Ctrl-C in the terminal reaches only the supervisor, which
            # forwards exactly one stop request.
            try:
                process = self._process = self._spare_for(launch, log_path) or AttemptProcess.start(launch, log)
            except OSError as e:  # the program went away since the run was checked
                log.write(f"cockpit: cannot start {launch.argv[0]!r}: {e.strerror}\n".encode())
                return self._end_attempt(attempt, name, preset, None, log_path, None, unstarted=e)
        self._tell_lifeline(launch)  # first: from here on, the attempt must not outlive us
        rehearsal.process = process
        self._health = AttemptHealth(process.pid, launch.env, self.config.workload, preset)
        hung_for = None
        try:
            while process.poll() is None:
                self._forward_stop()
                self._pump()
                self._read_output()
                self._read_reached()
                self.kind.look_for_checkpoints()   # after the output: the steps read before it
                self._sample_memory(attempt)
                rehearsal.tick()
                if hung_for is None and (quiet := time.monotonic() - watch.last_progress) > \
                        watch.hang_timeout(preset, self._slowest_gap):
                    hung_for = quiet
                    process.end_hung(min(10.0, preset.hang_timeout_s), self.poll_s)
                if watch.ready and self._spare is None:
                    self._start_spare(attempt + 1, name, preset)
                if self.wake_on_exit:
                    process.wait(self.poll_s)   # at once if it dies
                else:
                    time.sleep(self.poll_s)
        except BaseException:
            # The supervisor itself failed (a bug, or KeyboardInterrupt in a thread's host):
            # the attempt must not train on unsupervised.
            process.kill()
            raise
        code = process.returncode
        self.kind.exited(process)   # a command: what it left behind (its DataLoader workers)
        lifeline.attempt_ended()
        return self._end_attempt(attempt, name, preset, code, log_path, hung_for)

    # ------------------------------------------------------------ the spare

    def _start_spare(self, attempt: int, name: str, preset) -> None:
        """Once the attempt trains (so that the spare's imports do not slow its start), the next
        attempt's process, as it would be launched on this preset (engine.run.launch.spare_for):
        never a command's, nor one of several processes, nor when the run is stopping or system
        memory is short."""
        if not self.use_spare or self.stop_requests or attempt == self._no_spare_for \
                or (self._memory_percent or 0.0) > 90.0:
            return
        how = launches.spare_for(self.run, self.config, attempt, name, preset)
        if how is None:   # a command (never: use_spare goes off), or torchrun (not this attempt)
            self.use_spare = self.use_spare and not self.config.workload.is_command
            self._no_spare_for = attempt
            return
        try:
            with open(self.run.supervisor_log, "ab") as log:   # what it says before it is handed one
                self._spare = Spare(log=log, **how)
            self.spare_pids.append(self._spare.pid or 0)
        except OSError:   # no process to spare (a limit on processes): attempts start as before
            self.use_spare = False

    def _spare_for(self, launch: Launch, log_path: Path) -> AttemptProcess | None:
        """The spare as this attempt's process, if it can run it; else None (it is discarded)."""
        spare, self._spare = self._spare, None
        return AttemptProcess.handed(spare, launch, log_path) if spare is not None else None

    def _discard_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.discard()

    def _tell_lifeline(self, launch: Launch) -> None:
        """The attempt's identity and how it is stopped gracefully, for the lifeline (should this
        supervisor die) and in the events (should the lifeline die too: `runs stop` then)."""
        lifeline, watch, process = self._lifeline, self._watch, self._process
        assert lifeline is not None and watch is not None and process is not None  # just started
        signals, grace = self.kind.stop_plan(launch, self._slowest_gap)
        stop = lifeline.attempt(watch.attempt, process.pid, signals, grace, group=launch.group)
        if stop is not None:
            self.events.emit("attempt_process", attempt=watch.attempt, **stop)

    def _begin_attempt(self, launch: Launch, log_path: Path, name: str, preset) -> None:
        watch = self._watch
        assert watch is not None  # run_attempt's
        self._process = None
        self._rehearsal = Rehearsal(launch, watch, self.events)
        self._output = OutputFollower(log_path, self.kind.parser(launch))
        self._reached = reached.Reader(reached.path_of(self.run.path, watch.attempt))
        self.kind.begin(launch, watch, name, preset, self._rehearsal, self._stop_at_once)
        self._health = None

    def _end_attempt(self, attempt: int, name: str, preset, code: int | None, log_path: Path,
                     hung_for: float | None, unstarted: OSError | None = None) -> AttemptResult:
        watch, launch, rehearsal = self._watch, self._launch, self._rehearsal
        assert watch is not None and launch is not None and rehearsal is not None  # run_attempt's
        self._read_output(final=True)
        self._read_reached()   # the step it died at, not the last one it reported
        self.kind.look_for_checkpoints(final=True)   # one written as it went down
        self._pump()
        tail = log_tail(log_path, lines=TAIL_LINES * (3 if launch.distributed else 1))
        verdict, code, sig = judge(watch, launch, code, tail, hung_for=hung_for, unstarted=unstarted,
                                   stop_requested=bool(self.stop_requests),
                                   memory_percent=self._memory_percent,
                                   injected_crash=rehearsal.abort_escalated)
        rehearsal.unfired(verdict.kind == "finished", self.kind.reported_steps)
        result = AttemptResult(attempt, Rung(name, preset), verdict, code, sig, tail, watch)
        if verdict.crashed:
            self.events.emit("crash", attempt=attempt, preset=name, kind=verdict.kind,
                             sentence=verdict.sentence, evidence=verdict.evidence,
                             exception=watch.exception.get("traceback") if watch.exception else None)
        self.events.emit("attempt_ended", attempt=attempt, preset=name, outcome=verdict.kind,
                         exit_code=result.exit_code, signal=sig,
                         exit=sig or ("not started" if code is None else f"exit {code}"),
                         last_step=watch.last_step, samples_seen=watch.last_samples, tail=tail)
        self._pump()
        return result

    # ------------------------------------------------------------ signs of life

    def _read_output(self, final: bool = False) -> None:
        """New output since the last poll: a sign of life, and progress where the kind reads it
        there (a command). At the end of an attempt (`final`) it reads to the end of the log."""
        output, watch = self._output, self._watch
        assert output is not None and watch is not None  # an attempt's
        wrote, observations = output.observe(to_end=final)
        if wrote and self._running():
            gap = watch.touch(time.monotonic())
            if watch.ready:
                self._slowest_gap = max(self._slowest_gap, gap)
        self.kind.progress(observations, final)

    def _read_reached(self) -> None:
        """The step the attempt published, every step: where it was, exactly, should it die
        between two reports; a step done is a sign of life."""
        reader, watch = self._reached, self._watch
        assert reader is not None and watch is not None  # an attempt's
        watch.reach(reader.read(), time.monotonic())

    # ------------------------------------------------------------ health

    def _sample_memory(self, attempt: int) -> None:
        """A `memory` event about once a second, sampled from outside so that it goes on when
        the attempt is stuck (engine.run.health), and what it warns of."""
        assert self._health is not None  # the attempt's, once it started
        if (sample := self._health.sample()) is None:
            return
        self._memory_percent = 100.0 * sample["system_used"] / sample["system_total"]
        if sample["rss"] is None:
            return  # the attempt exited since poll(): nothing of it left to measure
        self.events.emit("memory", attempt=attempt, **sample)
        for warning in self._health.warnings(sample):
            self._on_warning(warning)

    def _on_warning(self, warning: WarningFields | None) -> None:
        watch, process = self._watch, self._process
        if warning is None or watch is None:   # (an attempt's: it has a watch)
            return
        self.events.emit("warning", attempt=watch.attempt, **warning)
        if warning["fallback"] and watch.slowdown is None and not self.stop_requests:
            # The preset asks to fall back: a graceful stop (checkpoint first), then the
            # rule for 'slowdown' picks the next attempt.
            watch.slowdown = dict(warning)
            if process is not None and process.running and not process.stops_sent:
                self._escalate_stop()

    # ------------------------------------------------------------ stopping

    def request_stop(self) -> None:
        """Ask the run to stop (thread-safe; signal handlers call this too)."""
        self.stop_requests += 1

    def _forward_stop(self) -> None:
        # The trainer: first request, stop after a checkpoint; second, stop now; third, it is
        # wedged and answers no signal it can handle. A command moves on by itself too, after
        # its grace period: SIGINT, SIGTERM, SIGKILL.
        process, watch = self._process, self._watch
        if process is None or not process.running or watch is None:   # (not self._running())
            return
        signals = process.stop_signals
        while process.stops_sent < min(self.stop_requests, len(signals)):
            self.events.emit("stop_requested", attempt=watch.attempt, request=process.stops_sent + 1,
                             signal=signals[process.stops_sent].name)
            self._escalate_stop()
        if process.stop_overdue():
            self._escalate_stop()

    def _escalate_stop(self, skip_graceful: bool = False) -> None:
        rehearsal, process = self._rehearsal, self._process
        assert rehearsal is not None and process is not None  # called while it runs
        rehearsal.release()  # the `slow` fault's pauses end: it must run to obey
        process.send_stop(skip_graceful=skip_graceful)

    def _stop_at_once(self) -> None:
        """Without the graceful stop: a command's loss went non-finite (a script that saves on
        Ctrl-C would save the garbage)."""
        if self._running():
            self._escalate_stop(skip_graceful=True)

    def _running(self) -> bool:
        """The attempt's process is started and not seen to have ended."""
        return self._process is not None and self._process.running

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # the TUI's worker calls request_stop() instead
        signal.signal(signal.SIGINT, lambda *_: self.request_stop())
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        # A closed terminal or dropped SSH connection must not end the run.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _pump(self) -> None:
        events = self.follower.poll()
        now = time.monotonic()
        for e in events:
            if self._watch and e.get("attempt") == self._watch.attempt and e["type"] not in \
                    ("memory", "warning", "attempt_started", "attempt_process", "crash",
                                  "attempt_ended", "stop_requested"):
                was_ready = self._watch.ready
                gap = self._watch.see(e, now)
                if was_ready:  # start-up (a compile's first step too) is not a step interval
                    self._slowest_gap = max(self._slowest_gap, gap)
                if self._health is not None:
                    self._on_warning(self._health.saw(e))
                self.kind.see(e)
            if e["type"] == "checkpoint":
                self.kind.checkpoints[e["path"]] = e
        if events and self.on_events:
            self.on_events(events)
        if self._alerts is not None:
            self._alerts.see(events)


def run_summary(run: RunDir) -> dict:
    """run_finished's summary (attempts, how each ended, where the run finished, the steps lost
    to crashes): the run's one accounting (engine.record.stats) over all its events, those of
    earlier supervisors of a continued run too."""
    return stats.fold(run.events()).summary()

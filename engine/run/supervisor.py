"""The supervisor: owns a run's attempts, each in its own process.

    until the run ends:
        run an attempt on the current rung (engine.run.attempt: start, follow, judge)
        fall back to the next rung, resumed from the newest checkpoint, or end the run

A native crash (SIGABRT from Metal, SIGSEGV) kills only the attempt; the supervisor records how
it ended (exit code or signal, the log's tail, its events), classifies it (engine.run.crashes)
and applies the device preset's rules (engine.run.fallback). It runs in the foreground under
`cockpit --no-ui`, or detached in its own session (engine.run.detached) so that a run outlives
its terminal.

Every way a process starts or is found runs through the same loop: an attempt
(engine.run.attempt) follows one process to its end, asking its launcher (engine.run.launchers:
the built-in trainer, torchrun, the user's command, an adopted process) how it starts, where its
signals go and what its end means, and the run's kind (engine.run.kinds) how its progress and
checkpoints are read; the supervisor keeps what spans attempts: the ladder, the rules, the spare
and the lifeline that stops an attempt should the supervisor die. `cockpit adopt` is this
supervisor with the adopted launcher: one attempt, never relaunched, no lifeline.

Recovery is quick: the loop wakes the moment the attempt dies (engine.run.process.ExitWait), and
while a built-in trainer attempt trains, a spare process (engine.run.spare) waits to become the
next one, its interpreter and torch started (`spare=False` or COCKPIT_SPARE=0: none).

Stopping: SIGINT/SIGTERM to the supervisor (or `request_stop`) forwards the attempt's first stop
signal (the trainer's SIGTERM: it checkpoints and exits; a command's SIGINT), a second request the
next one. Every event it reads goes to engine.run.alerts too: a detached run alerts unwatched.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from typing import Any, Callable

from engine.record import events as event_log, stats
from engine import vocabulary
from engine.run import alerts, fallback, launchers
from engine.event_types import FallbackFields, RunResumedFields, RunStartedFields
from engine.record.events import EventFollower, EventWriter
from engine.run.attempt import Attempt, Context, Pace
from engine.run.fallback import Decision, Ladder, Rung
from engine.run.launchers import Launcher
from engine.run.lifeline import Lifeline
from engine.run.rewind import Outcome, Rewinds
from engine.run.spare import Spare
from engine.run.training_health import TrainingHealth
from engine.run import resume as resumption
from engine.run.resume import History
from engine.record.rundir import RunDir
from engine.run.watch import AttemptResult
from engine.errors import ConfigError


class Supervisor:
    def __init__(self, run: RunDir, on_events: Callable[[list[dict]], None] | None = None,
                 poll_s: float = 0.1, *, terminal: alerts.Terminal | None = None,
                 notify_command: str | None = None, spare: bool | Spare | None = None,
                 wake_on_exit: bool = True, launcher: Launcher | None = None,
                 signals: dict[signal.Signals, Callable[[], None]] | None = None,
                 begun: Callable[[], None] | None = None):
        """`spare`: pre-start the next attempt's process (None: unless COCKPIT_SPARE=0; a Spare:
        yes, and this one, started already, for the first attempt: engine.run.spare.early);
        `wake_on_exit`: the loop wakes as the attempt exits (False: at its next poll only);
        `launcher`: every attempt's (an adopted process's), instead of the one that fits each
        attempt's preset (engine.run.launchers.for_attempt); `signals`: what a signal to this
        process means beyond the defaults (engine.run.slurm's: SLURM's warning, its SIGTERM);
        `begun`: called once this supervisor holds the run and has said it began."""
        self.run = run
        # engine.run.alerts: where crashes, fallbacks, the finish... are told (settings.toml)
        self._alert_to: dict[str, Any] = dict(terminal=terminal, notify_command=notify_command)
        self._alerts: alerts.Alerts | None = None
        self.config = run.config()
        self.on_events = on_events
        self.follower = EventFollower(run.events_path)
        self.events = EventWriter(run.events_path, attempt=0)
        self.stop_requests = 0
        self.health_stopped = False   # a health rule asked the run to stop
        self.released = False         # stopped following, its process left running (adopted)
        self.preempted: str | None = None   # why the run's time here ended (preempt)
        self.delivered = 0            # stop requests whose first signal came from outside (SLURM)
        self._launcher = launcher
        self._signals = dict(signals or {})
        self._begun = begun
        # the first attempt's: what a run of it is read as, its signals' meaning, its lifeline
        self.first = self.launcher_for(self.config.device)
        self.kind = self.first.reads(run, self.config, self.events)   # the trainer's events, a command's output
        self.context = Context(run=run, config=self.config, events=self.events, kind=self.kind,
                                pace=Pace(), stop_requests=lambda: self.stop_requests,
                                preempted=lambda: self.preempted, delivered=lambda: self.delivered,
                                pump=self._pump, poll_s=poll_s, wake_on_exit=wake_on_exit,
                                training=TrainingHealth(self.config.device.health),
                                stop=self._stop_for_health)
        self.rewinds = Rewinds(self.config.device.health)   # health findings gone back from
        self._attempt: Attempt | None = None   # the one running (engine.run.attempt)
        self._lifeline: Lifeline | None = None
        self._first_attempt = 1   # above 1 when this supervisor continues a run
        self._fired: set[str] = set()   # the faults injected in this run, whatever the preset
        self._own_faults: list[vocabulary.Fault] = []   # the attempt's preempt@N not yet fired
        self.use_spare = spare is not False and (spare is not None or os.environ.get("COCKPIT_SPARE", "1") != "0")
        self._spare = spare if isinstance(spare, Spare) else None   # the next attempt's, started ahead
        self.spare_pids = [self._spare.pid or 0] if self._spare else []   # every one started
        self._no_spare_for: int | None = None   # the next attempt that none can serve (torchrun)

    def launcher_for(self, preset) -> Launcher:
        return self._launcher or launchers.for_attempt(self.run, self.config, preset)

    # ------------------------------------------------------------ the run

    def supervise(self) -> str:
        """Run attempts until the run ends; returns its status: finished, stopped or failed (an
        adopted process's: ended, stopped, released or failed). A run that has events already
        is continued (engine.run.resume), not started over."""
        lock = self.run.try_lock()
        if lock is None:
            self.events.close()
            raise ConfigError("run", self.run.id, "is being supervised already (its supervisor, or "
                                                  "the lifeline stopping its attempt, holds run.lock)")
        self.run.write_supervisor_pid(os.getpid())
        first = self.first
        self._install_signal_handlers(first)
        self._lifeline = lifeline = first.lifeline(lock)
        ended = False
        try:
            resume = self._begin_run(first)
            if self._begun is not None:
                self._begun()
            self._alerts = alerts.for_run(self.run, self.config, **self._alert_to, say=self._alert_trouble)
            if lifeline is not None:
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
                if lifeline is not None:
                    lifeline.close()
                self.run.pid_path.unlink(missing_ok=True)
            self.events.close()
            os.close(lock)  # the lifeline's copy keeps the run locked until it is done

    def _alert_trouble(self, text: str) -> None:
        """A notify command that failed or hung, a broken settings.toml: a warning; the run goes on."""
        self.events.emit("warning", kind="alert", message=text, advice=[], fallback=False)

    def _begin_run(self, first: Launcher) -> dict | None:
        """run_started, or run_resumed for a run that earlier supervisors worked on; returns
        where a continued run's first attempt resumes."""
        history = History.of(self.run.events())
        fields = RunStartedFields(run=self.run.id, workload=self.config.workload_preset,
                                  device_preset=self.config.device_preset, pid=os.getpid(),
                                  overrides=list(self.config.overrides),
                                  command=self.config.workload.is_command, **first.run_fields())
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
        # with no checkpoint of cockpit's, an adopted run may still resume through its own words
        own = resumption.own_resume_args(history, self.config) if resume is None else []
        resumed = RunResumedFields(**fields, next_attempt=self._first_attempt, resume=resume)
        if own:
            resumed["resume_args"] = own
        self.events.emit("run_resumed", **resumed)
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
            launcher = self.launcher_for(preset)
            result = self.run_attempt(attempt, current.name, dataclasses.replace(preset, inject=inject),
                                      resume, launcher)
            results.append(result)
            fired.update(result.watch.fired)
            verdict = result.verdict
            if not verdict.crashed or self.stop_requests:
                status = launcher.status(verdict) if not verdict.crashed else "stopped"
                # stopped for a preemption: continued where it checkpointed when it starts again;
                # a health rule's stop holds though the attempt finished before it was read
                status = ("preempted" if self.preempted and status == "stopped" else
                          "stopped" if self.health_stopped and status == "finished" else status)
                return status, results
            if not launcher.relaunches:
                return "failed", results
            if verdict.kind == "health":   # a finding whose rule goes back (engine.run.rewind)
                outcome = self.rewinds.go_back(verdict.evidence["health"], result.watch.last_step, self.kind)
                if outcome.rewind is None:
                    self.events.emit("run_failed", reason=outcome.why, kind=verdict.kind)
                    return "failed", results
                resume = outcome.resume
                self._emit_rewind(result, outcome)
                continue
            if verdict.kind == "checkpoint" and resume:
                self.kind.unloadable(result.attempt, resume["path"], verdict)
            previous, resume = resume, self.rewinds.attach(self.kind.resume_point(result.watch.numerical))
            # len(results): a continued run gets max_attempts of its own, the user asked for
            # more; rewinds are not failures (max_rewinds counts them)
            failed = len(results) - sum(r.verdict.kind == "health" for r in results)
            decision = fallback.decide(verdict, current, ladder, failed, start.preset.max_attempts,
                                       precision_used=result.watch.precision,
                                       fixed=self.kind.fixed_settings(),
                                       progressed=fallback.got_further(previous, resume),
                                       node_losses=sum(r.verdict.kind == "node-lost" for r in results))
            if decision.next is None:
                self.events.emit("run_failed", reason=decision.why, kind=verdict.kind)
                return "failed", results
            self._emit_fallback(result, decision, resume)
            if (back := launcher.away()) is not None and not self._wait_until(back):
                return "stopped", results
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

    def _emit_rewind(self, result: AttemptResult, outcome: Outcome) -> None:
        """A health finding gone back from: a fallback to the same preset, from the checkpoint
        before it, its `rewind` saying what was skipped."""
        assert outcome.rewind is not None   # the run goes on
        fields: FallbackFields = {"from": result.step.name, "to": result.step.name,
                                  "to_preset": result.step.name, "action": outcome.action,
                                  "reason": result.verdict.kind, "why": outcome.why,
                                  "sentence": result.verdict.sentence, "changed": None,
                                  "resume": outcome.resume, "next_attempt": result.attempt + 1,
                                  "rewind": outcome.rewind}
        self.events.emit("fallback", attempt=result.attempt, **fields)
        self._pump()

    def run_attempt(self, number: int, name: str, preset, resume: dict | None = None,
                    launcher: Launcher | None = None) -> AttemptResult:
        attempt = self._attempt = Attempt(number, name, preset, launcher or self.launcher_for(preset),
                                          self.context, resume)
        if self.released:   # Ctrl-C on `cockpit adopt` before there was an attempt to release
            attempt.release()
        # the supervisor's own faults (preempt) this attempt rehearses, each at its step
        self._own_faults = [f for f in map(vocabulary.parse, preset.inject)
                            if f.kind in vocabulary.SUPERVISOR_KINDS and f.step is not None]
        spare, self._spare = self._spare, None
        try:
            return attempt.run(self._lifeline, spare,
                               on_ready=lambda: self._start_spare(number + 1, name, preset, attempt))
        finally:
            if spare is not None:
                spare.discard()   # not handed (it could not run this attempt): used up

    # ------------------------------------------------------------ the spare

    def _start_spare(self, number: int, name: str, preset, attempt: Attempt) -> None:
        """Once the attempt trains (the spare's imports must not slow its start), the next
        attempt's process as its launcher's `spare` says, never when the run is stopping or
        system memory is short."""
        if self._spare is not None or not self.use_spare or self.stop_requests \
                or number == self._no_spare_for or not attempt.room_for_spare:
            return
        how = attempt.launcher.spare(number, name, preset)
        if how is None:   # a command's, torchrun's: none for this attempt
            self._no_spare_for = number
            return
        try:
            with open(self.run.supervisor_log, "ab") as log:   # what it says before it is handed one
                self._spare = Spare(log=log, **how)
            self.spare_pids.append(self._spare.pid or 0)
        except OSError:   # no process to spare (a limit on processes): attempts start as before
            self.use_spare = False

    def _discard_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.discard()

    # ------------------------------------------------------------ stopping

    def request_stop(self) -> None:
        """Ask the run to stop (thread-safe; signal handlers call this too)."""
        self.stop_requests += 1

    def _stop_for_health(self) -> None:
        """A health rule's `stop`: the run ends stopped even where its attempt finished before
        the finding was read (a fast run outpaces the supervisor on a loaded machine)."""
        self.health_stopped = True
        self.request_stop()

    def preempt(self, why: str, delivered: bool = False) -> None:
        """The run's time on this machine is ending (SLURM's warning signal, a preemption's
        SIGTERM, `--inject preempt@N`): its attempt is stopped gracefully, as a first stop
        request is (the trainer checkpoints at once), and the run ends "preempted", to be
        continued from that checkpoint (engine.run.slurm requeues its job). `delivered`: the
        signal reached the attempt itself too (see stop_delivered)."""
        if self.preempted is None:
            self.preempted = why
            self.stop_delivered() if delivered else self.request_stop()

    def stop_delivered(self) -> None:
        """A stop request whose first signal the attempt had from outside: SLURM sends its
        SIGTERM to every process of the job, so forwarding one more would be the trainer's
        second ('stop now, no checkpoint'). The next is sent only if it goes on regardless."""
        self.delivered = self.stop_requests + 1
        self.request_stop()

    def release(self) -> None:
        """Stop following an adopted process and leave it running (Ctrl-C on a foreground
        `cockpit adopt`)."""
        self.released = True
        if self._attempt is not None:
            self._attempt.release()

    def _install_signal_handlers(self, launcher: Launcher) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # the TUI's worker calls request_stop() instead
        interrupt = self.release if launcher.interrupt == "release" else self.request_stop
        handlers: dict[signal.Signals, Callable[[], None]] = {
            signal.SIGINT: interrupt, signal.SIGTERM: self.request_stop, **self._signals}
        for sig, handler in handlers.items():
            signal.signal(sig, _handler(handler))
        # A closed terminal or dropped SSH connection must not end the run.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _pump(self) -> None:
        events = self.follower.poll()
        now = time.monotonic()
        attempt = self._attempt
        for e in events:
            if attempt is not None and e.get("attempt") == attempt.number:
                attempt.see(e, now)
                if e["type"] == "step":
                    self._rehearse(attempt, e["step"])
            if e["type"] == "checkpoint":
                self.kind.checkpoints[e["path"]] = e
        if events and self.on_events:
            self.on_events(events)
        if self._alerts is not None:
            self._alerts.see(events)

    def _rehearse(self, attempt: Attempt, step: int) -> None:
        """The supervisor's own faults, at step N, once a run, whatever launches the attempt:
        `--inject preempt@N`, the warning a cluster sends before a job's time ends;
        `--inject node-lost@N`, this machine of several lost (its agent and workers killed)."""
        for fault in [f for f in self._own_faults if (f.step or 0) <= step]:
            self._own_faults.remove(fault)   # fired: the attempt's watch records it for the run
            self.events.emit("fault_injected", attempt=attempt.number, spec=fault.spec,
                             kind=fault.kind, step=step, by="supervisor")
            if fault.kind == vocabulary.FaultKind.NODE_LOST:
                attempt.lose()
            else:
                self.preempt(f"{fault.spec} (rehearsed)")

    def _wait_until(self, ready: Callable[[], bool], poll_s: float = 0.5) -> bool:
        """Between two attempts, until `ready()` (reading events); False if asked to stop first."""
        while not ready():
            if self.stop_requests:
                return False
            self._pump()
            time.sleep(poll_s)
        return True


def _handler(action: Callable[[], None]) -> Callable[[int, Any], None]:
    """A signal handler that does `action` (the signal's number and frame are not its affair)."""
    return lambda _signum, _frame: action()


def run_summary(run: RunDir) -> dict:
    """run_finished's summary: the run's one accounting (engine.record.stats) over all its
    events, those of earlier supervisors of a continued run too."""
    return stats.fold(run.events()).summary()

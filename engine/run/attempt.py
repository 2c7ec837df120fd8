"""One attempt: its process from start to end, and everything learnt of it on the way.

    start its process (or take the spare, or find the process already running), tell the lifeline
    until it exits: forward stop requests, read its events and output, sample its health,
        rehearse faults, end it if it hangs
    judge how it ended (its launcher's words), and record it: crash, attempt_ended

The supervisor (engine.run.supervisor) keeps the run: the ladder, the rules, the fallback, the
spare, the lifeline; an Attempt keeps what one attempt has (its launch and process, its watch,
health, output, published step and rehearsal) and asks its launcher (engine.run.launchers) and
the run's kind (engine.run.kinds: how its progress and checkpoints are read) whatever differs
between the ways a process starts; it never asks which.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from engine.preset_types import DevicePreset
from engine.record import reached
from engine.record.attempt_log import OutputFollower, log_tail
from engine.event_types import MemoryFields, WarningFields
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.run.fallback import Rung
from engine.run.health import AttemptHealth
from engine.run.kinds import TrainerKind
from engine.run.launch import Launch
from engine.run.launchers import Launcher
from engine.run.lifeline import Lifeline
from engine.run.process import AttemptProcess
from engine.run.spare import Spare
from engine.preset_types import REWINDS
from engine.run.training_health import Finding, TrainingHealth
from engine.run.rehearsal import Rehearsal
from engine.run.watch import AttemptResult, AttemptWatch
from engine.runconfig import RunConfig
from engine.schema import to_table

# A stop signalled to the attempt from outside (SLURM's SIGTERM): how long it has to stop by
# itself before the next stop signal (inside SLURM's KillWait, 30 s by default).
OUTSIDE_GRACE_S = 20.0
# The supervisor's own events about an attempt: not signs of its life.
SUPERVISORS = frozenset({"memory", "warning", "attempt_started", "attempt_process", "crash",
                         "attempt_ended", "stop_requested"})


@dataclass
class Pace:
    """What the run has learnt of its attempts' pace, kept from one attempt to the next."""

    slowest_gap: float = 0.0   # the longest quiet interval seen in a healthy attempt


@dataclass(frozen=True)
class Context:
    """What an attempt has of its run."""

    run: RunDir
    config: RunConfig
    events: EventWriter
    kind: TrainerKind                 # how the run's progress and checkpoints are read
    pace: Pace
    stop_requests: Callable[[], int]  # how many stops the user asked for so far
    pump: Callable[[], None]          # read the run's new events (this attempt's among them)
    preempted: Callable[[], str | None] = lambda: None   # why, where the stops are a preemption
    delivered: Callable[[], int] = lambda: 0   # of the stops, those signalled to it from outside
    poll_s: float = 0.1
    wake_on_exit: bool = True         # the loop wakes as the process exits (else at its poll)
    training: TrainingHealth | None = None   # the run's loss and gradient detectors
    stop: Callable[[], None] = lambda: None  # ask the run to stop (a health rule's 'stop')


class Attempt:
    def __init__(self, number: int, name: str, preset: DevicePreset, launcher: Launcher,
                 context: Context, resume: dict | None = None):
        self.number, self.name, self.preset = number, name, preset
        self.launcher, self.context = launcher, context
        self.events, self.kind = context.events, context.kind
        self.log_path = context.run.attempt_log(number)
        self.launch: Launch = launcher.launch(number, name, preset, resume)
        self.resume = resume   # where the supervisor resumes it: {"step", "path", ...}, or None
        self.watch = AttemptWatch(number)
        self.rehearsal = Rehearsal(self.launch, self.watch, self.events)
        self.process: AttemptProcess | None = None
        self.in_spare = False                         # its process a spare started ahead
        self.health: AttemptHealth | None = None     # memory, slowdown (engine.run.health)
        self.memory_percent: float | None = None      # system memory in use at the last sample
        self.room_for_spare = True                    # ... and whether it leaves room for a spare
        self.hung_for: float | None = None
        self.released = False                         # no longer followed, left running (adopted)
        self._output: OutputFollower | None = None    # attempt-N.log as it is written
        self._reached = reached.Reader(reached.path_of(context.run.path, number))

    # ------------------------------------------------------------ its life

    def run(self, lifeline: Lifeline | None, spare: Spare | None = None,
            on_ready: Callable[[], None] = lambda: None) -> AttemptResult:
        """Start it (in `spare` where it can run), follow it to its end and judge it;
        `on_ready` is called at each poll once it trains, and once more if it crashed."""
        self.events.emit("attempt_started", attempt=self.number, preset=self.name,
                         config=to_table(self.preset), log=self.log_path.name,
                         **self.launcher.describe(self.launch))
        self._output = OutputFollower(self.log_path, self.kind.parser(self.launch))
        self.kind.begin(self.launch, self.watch, self.name, self.preset, self.rehearsal, self._stop_at_once)
        if self.context.training is not None:   # judged against the history up to its resume
            self.context.training.resumed(int((self.resume or {}).get("step") or 0))
        try:
            process = self._start(spare)
        except OSError as e:  # the program went away since the run was checked
            with open(self.log_path, "ab") as log:
                log.write(f"cockpit: cannot start {self.launch.argv[0]!r}: {e.strerror}\n".encode())
            return self._end(None, unstarted=e)
        self._tell_lifeline(lifeline)  # first: from here on, the attempt must not outlive us
        self.rehearsal.process = process
        self.health = AttemptHealth(process.pid, self.launch.env, self.context.config.workload, self.preset)
        if self.launcher.found:
            self._catch_up()
        try:
            self._follow(process, on_ready)
        except BaseException:
            self.launcher.abandon(process)   # the supervisor itself failed (a bug, an interrupt)
            raise
        self.launcher.exited(process)   # what it left behind (a command's DataLoader workers)
        if lifeline is not None:
            lifeline.attempt_ended()
        result = self._end(process.returncode)
        if result.verdict.crashed and self.watch.ready:
            on_ready()   # it trained, then crashed between two polls: the next one's spare all the same
        return result

    def _start(self, spare: Spare | None) -> AttemptProcess:
        """Its own session: a Ctrl-C in the terminal reaches only the supervisor, which forwards
        exactly one stop request."""
        if spare is not None and (process := self.launcher.hand(spare, self.launch, self.log_path)):
            self.process, self.in_spare = process, True
            return process
        with open(self.log_path, "ab") as log:
            self.process = self.launcher.start(self.launch, log, self.events)
        return self.process

    def _follow(self, process: AttemptProcess, on_ready: Callable[[], None]) -> None:
        watch, context = self.watch, self.context
        while process.alive() and not self.released:
            self._forward_stop()
            context.pump()
            self._read_output()
            self._read_reached()
            self.kind.look_for_checkpoints()   # after the output: the steps read before it
            self._sample_health()
            self.rehearsal.tick()
            if self.hung_for is None and (quiet := time.monotonic() - watch.last_progress) > \
                    self.launcher.hang_limit(self.launch, watch.hang_timeout(
                        self.preset, context.pace.slowest_gap), quiet):
                self.hung_for = quiet
                self.launcher.hung(process, self.preset, context.poll_s)
            if watch.ready:
                on_ready()
            if context.wake_on_exit:
                process.wait(context.poll_s)   # at once if it dies
            else:
                time.sleep(context.poll_s)

    def _tell_lifeline(self, lifeline: Lifeline | None) -> None:
        """Its identity and how it is stopped gracefully, for the lifeline (should the supervisor
        die) and in the events (should the lifeline die too: `runs stop` then)."""
        if lifeline is None or self.process is None:
            return
        signals, grace, group = self.launcher.lifeline_plan(self.launch, self.context.pace.slowest_gap)
        stop = lifeline.attempt(self.number, self.process.pid, signals, grace, group=group)
        if stop is not None:
            self.events.emit("attempt_process", attempt=self.number, **stop,
                             **({"spare": True} if self.in_spare else {}))

    def _end(self, code: int | None, unstarted: OSError | None = None) -> AttemptResult:
        self._forward_stop()   # a stop from outside it obeyed before a poll said so
        self._read_output(final=True)
        self._read_reached()   # the step it died at, not the last one it reported
        # what it reported last (a save the HF callback told as it finished) before the files
        # are looked at: a save it reported is not told again from its glob
        self.context.pump()
        self.kind.look_for_checkpoints(final=True)   # one written as it went down
        self.context.pump()   # ... and its event, for where the next attempt resumes
        watch, launcher = self.watch, self.launcher
        tail = log_tail(self.log_path, lines=launcher.tail_lines)
        verdict, code, sig = launcher.judge(watch, self.launch, code, tail, hung_for=self.hung_for,
                                            unstarted=unstarted, released=self.released,
                                            total=self.kind.total_known,
                                            stop_requested=bool(self.context.stop_requests()),
                                            memory_percent=self.memory_percent,
                                            injected_crash=self.rehearsal.abort_escalated)
        self.rehearsal.unfired(verdict.kind == "finished", self.kind.reported_steps)
        result = AttemptResult(self.number, Rung(self.name, self.preset), verdict, code, sig, tail, watch)
        if verdict.crashed:
            self.events.emit("crash", attempt=self.number, preset=self.name, kind=verdict.kind,
                             sentence=verdict.sentence, evidence=verdict.evidence,
                             exception=watch.exception.get("traceback") if watch.exception else None)
        self.events.emit("attempt_ended", attempt=self.number, preset=self.name, outcome=verdict.kind,
                         exit_code=result.exit_code, signal=sig,
                         exit=launcher.exit_text(code, sig, self.process),
                         last_step=watch.last_step, samples_seen=watch.last_samples, tail=tail,
                         **({"sentence": verdict.sentence} if verdict.kind == "config"
                            and verdict.evidence.get("judged_by") else {}))
        self.context.pump()
        return result

    # ------------------------------------------------------------ signs of life

    def _catch_up(self) -> None:
        """What the log of a process found running held before cockpit came, read at once: its
        facts (total, units), its evals and its steps, said as a sighting with no rate. One
        read is one moment to the tracker: an hour's steps in it measure nothing, and its first
        window opens at the last of them, now (engine.command.tracker)."""
        assert self._output is not None  # run() made it
        while self.launcher.collect():
            pass
        observations: list = []
        while True:
            wrote, found = self._output.observe()
            observations += found
            if not wrote:
                break
        self.kind.progress(observations, False)
        self.kind.progress([], True)   # the sighting: where it is, before any window
        self.context.pump()

    def see(self, event: dict, now: float) -> None:
        """One of its events, the supervisor's own aside: a sign of life, how far it got."""
        if event["type"] in SUPERVISORS:
            return
        was_ready = self.watch.ready
        gap = self.watch.see(event, now)
        if was_ready:  # start-up (a compile's first step too) is not a step interval
            self.context.pace.slowest_gap = max(self.context.pace.slowest_gap, gap)
        if self.health is not None:
            self._on_warning(self.health.saw(event))
        self.kind.see(event)
        self.launcher.see(event, self.events.emit)
        if self.context.training is not None:
            for finding in self.context.training.see(event):
                self._on_finding(finding)

    def _on_finding(self, finding: Finding) -> None:
        """A health finding: said, and done: a stop is the run's graceful one; a rewind ends
        this attempt at once (a checkpoint now would keep what went bad) for the supervisor to
        go back (engine.run.rewind), where its launcher can start one again."""
        action = finding.action
        if action in REWINDS and not self.launcher.rewinds:
            action = "warn"
        fields = finding.fields()
        if action != finding.action:
            fields.update(action=action, rule=f"{finding.rule}; {self.launcher.name} attempts are "
                                              f"not rewound ({finding.action}): warned only")
        self.events.emit("health", attempt=self.number, **fields)
        stopping = self.context.stop_requests() or self.watch.health or self.watch.slowdown
        if action == "stop" and not stopping:
            self.context.stop()
        elif action in REWINDS and not stopping:
            # the verdict goes back (engine.run.crashes), read before or after it exited: what
            # a fast attempt trained before its finding was read is thrown away all the same
            self.watch.health = {**fields, "t": time.time()}   # checkpoints after it are suspect
            if self.running and self.process is not None:
                self.process.kill()   # at once: every step it trains now is thrown away

    def lose(self) -> None:
        """`--inject node-lost@N`: its machine lost, at once (engine.run.launchers.node)."""
        if self.running and self.process is not None:
            self.launcher.lose(self.process)

    def _read_output(self, final: bool = False) -> None:
        """New output since the last poll: a sign of life, and progress where the kind reads it
        there (a command). At the end of an attempt (`final`) it reads to the end of the log."""
        assert self._output is not None  # run() made it
        self.launcher.collect(final)
        wrote, observations = self._output.observe(to_end=final)
        if wrote and self.running:
            gap = self.watch.touch(time.monotonic())
            if self.watch.ready:
                self.context.pace.slowest_gap = max(self.context.pace.slowest_gap, gap)
        self.kind.progress(observations, final, written_by=self._output.written_by)

    def _read_reached(self) -> None:
        """The step the attempt published, every step: where it was, exactly, should it die
        between two reports; a step done is a sign of life."""
        self.watch.reach(self._reached.read(), time.monotonic())

    # ------------------------------------------------------------ health

    def _sample_health(self) -> None:
        """A `memory` event about once a second, sampled from outside so that it goes on when
        the attempt is stuck (engine.run.health), and what it warns of."""
        if self.health is None or (sample := self.health.sample()) is None:
            return
        self.memory_percent = 100.0 * sample["system_used"] / sample["system_total"]
        self.room_for_spare = room_for_spare(sample)
        if sample["rss"] is None:
            return  # the attempt exited since it was last seen alive: nothing of it to measure
        self.events.emit("memory", attempt=self.number, **sample)
        for warning in self.health.warnings(sample):
            self._on_warning(warning)

    def _on_warning(self, warning: WarningFields | None) -> None:
        if warning is None:
            return
        warning = self.launcher.warning(warning)
        self.events.emit("warning", attempt=self.number, **warning)
        if warning["fallback"] and self.watch.slowdown is None and not self.context.stop_requests():
            # The preset asks to fall back: a graceful stop (checkpoint first), then the
            # rule for 'slowdown' picks the next attempt.
            self.watch.slowdown = dict(warning)
            if self.running and self.process is not None and not self.process.stops_sent:
                self._escalate_stop()

    # ------------------------------------------------------------ stopping

    def release(self) -> None:
        """Stop following it, leaving it running (an adopted process: Ctrl-C on `cockpit adopt`)."""
        self.released = True

    @property
    def running(self) -> bool:
        """Its process is started and not seen to have ended."""
        return self.process is not None and self.process.running

    def _forward_stop(self) -> None:
        # The trainer: first request, stop after a checkpoint; second, stop now; third, it is
        # wedged and answers no signal it can handle. A command moves on by itself too, after
        # its grace period: SIGINT, SIGTERM, SIGKILL.
        process = self.process
        if process is None:
            return
        signals = process.stop_signals
        while process.stops_sent < min(self.context.stop_requests(), len(signals)):
            # SLURM's SIGTERM reaches every process of the job, the attempt's too: counted as
            # sent, and the next signal only if it goes on past OUTSIDE_GRACE_S; said even if
            # the attempt obeyed it and exited before this poll (called again at its end)
            outside = process.stops_sent < self.context.delivered()
            if not (outside or process.running):
                break   # it ended before it was asked: nothing to send
            why = self.context.preempted() or ("SIGTERM from outside (SLURM)" if outside else None)
            self.events.emit("stop_requested", attempt=self.number, request=process.stops_sent + 1,
                             signal="SIGTERM" if outside else signals[process.stops_sent].name,
                             **({"why": why} if why else {}))
            if outside:
                process.stop_delivered(OUTSIDE_GRACE_S)
            else:
                self._escalate_stop()
        if process.running and process.stop_overdue():
            self._escalate_stop()

    def _escalate_stop(self, skip_graceful: bool = False) -> None:
        assert self.process is not None  # called while it runs
        self.rehearsal.release()  # the `slow` fault's pauses end: it must run to obey
        self.process.send_stop(skip_graceful=skip_graceful)

    def _stop_at_once(self) -> None:
        """Without the graceful stop: a command's loss went non-finite (a script that saves on
        Ctrl-C would save the garbage)."""
        if self.running:
            self.launcher.non_finite(lambda: self._escalate_stop(skip_graceful=True))


def room_for_spare(sample: MemoryFields) -> bool:
    """Whether a memory sample leaves room for a spare beside the attempt: at most 90% of the
    machine's memory in use, and what is free holds another copy of what the attempt holds (a
    spare imports torch and builds the workload's data ahead too)."""
    available = sample["system_total"] - sample["system_used"]
    return sample["system_used"] <= 0.9 * sample["system_total"] and available >= (sample["rss"] or 0)

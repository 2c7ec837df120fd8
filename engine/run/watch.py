"""What the supervisor learns of the running attempt, and the hang watch it keeps from it.

An attempt's events (its own, the trainer's, or made from a command's output) tell how far it
got, on what device and precision, where it resumed and last checkpointed, the faults that fired,
and the exception or non-finite loss it ended with, per rank under torchrun. How it ended is
judged from this (`judge`, by engine.run.crashes' rules) into an AttemptResult.

The hang watch: an attempt that gives no sign of life for max(hang_timeout_s, 10 x the slowest
interval seen) is hung. A sign of life is any event, a step or, inside a long accumulation group,
a heartbeat after a micro-batch, or a command's output: so the gap scales with the time of a
micro-batch, not of a whole optimizer step (note 001's CPU fallback, 8 x 64, is minutes a step).
Until its first step, an attempt is starting up (importing, building data and the model,
compiling, its first accumulation group) and is judged by STARTUP_TIMEOUT_S instead.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field

from engine.run.crashes import AttemptEnd, Subject, Verdict, classify, last_line
from engine.run.fallback import Rung
from engine.run.launch import Launch
from engine.text import strip_ansi

HANG_GAP_FACTOR = 10
# Until the trainer says it is ready (torch imported, data built, model on the device), a
# slow start is not a hang: building a 500k-vector bank takes minutes on a laptop.
STARTUP_TIMEOUT_S = 600.0


@dataclass
class AttemptWatch:
    """What the supervisor learns about the running attempt from its events."""

    attempt: int
    started: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    last_step: int | None = None   # the step it reached: reported, or published (reach)
    last_samples: int | None = None  # ... and the samples seen by then, where published
    precision: str | None = None
    device: str | None = None
    exception: dict | None = None
    numerical: dict | None = None
    fired: list[str] = field(default_factory=list)
    exceptions: dict[int, dict] = field(default_factory=dict)   # by rank
    numericals: dict[int, dict] = field(default_factory=dict)   # by rank
    slowdown: dict | None = None   # the warning for which the supervisor stopped it
    health: dict | None = None     # the health event for which it ended it, to go back (rewind)
    ready: bool = False            # past start-up: a step was seen
    compiles: bool = False         # trainer_ready said it compiles (in its first step)
    total: int | None = None       # the steps it said it trains (trainer_ready, step events)

    @property
    def done(self) -> bool:
        """It reached its last step: what is left is its end (evaluation, the last checkpoint,
        the interpreter's exit), which on a loaded machine can outlast a short hang timeout."""
        return bool(self.total) and self.last_step is not None and self.last_step >= (self.total or 0)

    @property
    def compiling(self) -> bool:
        """A compiling trainer before its first step: a hang now is the compile's."""
        return self.compiles and not self.ready

    def touch(self, now: float) -> float:
        """A sign of life (an event, a command's output); returns the gap since the last one."""
        gap, self.last_progress = now - self.last_progress, now
        return gap

    def reach(self, reached: tuple[int, int | None] | None, now: float) -> bool:
        """The step it published (engine.record.reached): a step done is past start-up and a
        sign of life. Returns whether it moved on."""
        if reached is None or (self.last_step is not None and reached[0] <= self.last_step):
            return False
        (self.last_step, self.last_samples), self.ready = reached, True
        self.touch(now)
        return True

    def see(self, event: dict, now: float) -> float:
        """Record one of this attempt's events; returns the gap since the previous one."""
        gap = self.touch(now)
        kind = event["type"]
        if kind in ("step", "progress") and event.get("step") is not None:
            # the published step may be ahead of the report
            self.last_step, self.ready = max(event["step"], self.last_step or 0), True
            self.total = event.get("total") or self.total
        elif kind == "trainer_ready":
            self.total = event.get("total_steps") or self.total
            # Compiling happens in the first step: until that step, the trainer is starting up.
            self.compiles = bool(event.get("compile"))
            self.precision, self.device = event.get("precision"), event.get("device")
        elif kind == "exception":
            if event.get("traceback"):  # as the crash event keeps it: no terminal escapes
                event = {**event, "traceback": strip_ansi(event["traceback"])}
            self.exceptions.setdefault(event.get("rank", 0), event)
            self.exception = self.exception or event
        elif kind == "numerical":
            self.numericals.setdefault(event.get("rank", 0), event)
            self.numerical = self.numerical or event
        elif kind == "fault_injected":
            self.fired.append(event["spec"])
        return gap

    def hang_timeout(self, preset, slowest_gap: float) -> float:
        """How long it may give no sign of life; `slowest_gap`: the longest quiet interval seen
        in a healthy attempt of the run."""
        floor = preset.hang_timeout_s if self.ready else max(preset.hang_timeout_s, STARTUP_TIMEOUT_S)
        if self.exception or self.numerical or self.done:
            floor = max(floor, 60.0)  # it said why it is ending, or finished; exiting takes a moment
        return max(floor, HANG_GAP_FACTOR * slowest_gap)


@dataclass(frozen=True)
class AttemptResult:
    attempt: int
    step: Rung
    verdict: Verdict
    exit_code: int | None   # set when the trainer exited
    signal: str | None      # set when a signal killed it (SIGABRT, SIGKILL, ...)
    tail: str               # the end of attempt-N.log
    watch: AttemptWatch

    @property
    def outcome(self) -> str:
        return self.verdict.kind


def judge(watch: AttemptWatch, launch: Launch, code: int | None, tail: str, *, subject: Subject,
          hung_for: float | None, unstarted: OSError | None, stop_requested: bool,
          memory_percent: float | None, injected_crash: bool) -> tuple[Verdict, int | None, str | None]:
    """How the attempt ended, from its exit status `code` (None: never started), the log's
    `tail` and what was learnt of it, in its launcher's words (`subject`): the verdict, its exit
    code and the signal that killed it (one of the two is None)."""
    sig = signal.Signals(-code).name if code is not None and code < 0 else None
    if unstarted is not None:
        return Verdict("config", f"{subject.name} could not be started: {unstarted.strerror}.",
                       {"message": last_line(tail)}), code, sig
    return classify(AttemptEnd(
        exit_code=None if sig else code, signal=sig, tail=tail, exception=watch.exception,
        numerical=watch.numerical, last_step=watch.last_step, stop_requested=stop_requested,
        # a compiling trainer that hung before its first step: the compile did not finish
        hung_for_s=None if watch.compiling else hung_for,
        compiling_hung_for_s=hung_for if watch.compiling else None,
        memory_percent=memory_percent, device=watch.device, slowdown=watch.slowdown,
        health=watch.health, subject=subject, resumed_from=(launch.resume or {}).get("path"),
        injected_crash=injected_crash)), None if sig else code, sig

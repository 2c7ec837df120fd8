"""A run's figures over its whole life, from its events: average throughput, time spent
training, duration, steps lost to crashes, the final loss and metrics.

A step event's `samples_per_s` measures one reporting window, and a window can be a fragment
(the trainer reports before each checkpoint and at the end: 0.05 s of steps can read 7,000/s
on a run that averages 300/s). The run's figure is therefore an average: samples (and steps)
trained, over all attempts, divided by the time spent training them -- the sum of the windows'
`window_s`, which leave out evaluation, epoch preparation (mining) and checkpoint pauses.

`RunStats` folds events one at a time, so the UI keeps it current with each batch it reads;
`averages(events)` folds a whole list for `cockpit runs` and the comparison screen.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

# Outcomes after which the next attempt does not repeat the attempt's last steps: its
# trainer checkpointed them on the way out.
_CLEAN_ENDS = ("finished", "stopped")


@dataclass(frozen=True, slots=True)
class Averages:
    samples_per_s: float | None   # samples trained / time spent training, all attempts
    steps_per_s: float | None     # optimizer steps trained / time spent training
    train_s: float                # time inside reporting windows (no eval, mining, checkpoints)
    duration_s: float | None      # first event to last event
    steps_lost: int               # steps trained again (or never kept) because an attempt crashed
    final_loss: float | None      # the last step event's loss
    final_metrics: dict = field(default_factory=dict)  # the last eval event's metrics
    gflop_s: float | None = None  # over the same training time, where the workload counts FLOPs


@dataclass(slots=True)
class _AttemptSpan:
    start_step: int | None = 0    # where it began: 0, the step it resumed from, None: not known yet
    reached: int = 0              # the highest step it reported
    kept: int = 0                 # the newest step it checkpointed
    outcome: str | None = None    # attempt_ended's outcome
    last_samples: float | None = None  # samples_seen at its previous step event
    last_step: int | None = None       # ... and its step (None: where its windows start is not known)


class RunStats:
    """Averages folded one event at a time (`add`), read at any moment (`result`)."""

    __slots__ = ("samples", "steps", "gflop", "gflop_s_time", "train_s", "first_t", "last_t",
                 "final_loss", "final_metrics", "_attempts", "_current")

    def __init__(self) -> None:
        self.samples = 0.0
        self.steps = 0.0
        self.gflop = 0.0             # GFLOP trained, over the windows that say their GFLOP/s
        self.gflop_s_time = 0.0      # ... and those windows' time
        self.train_s = 0.0
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.final_loss: float | None = None
        self.final_metrics: dict = {}
        self._attempts: list[_AttemptSpan] = []
        self._current: _AttemptSpan | None = None

    def add(self, e: dict) -> None:
        t = e.get("t")
        if t is not None:
            if self.first_t is None:
                self.first_t = t
            self.last_t = t
        kind = e.get("type")
        if kind == "step":
            self._step(e)
        elif kind == "attempt_started":
            # A command says where it resumes here; the trainer says so in trainer_ready.
            self._current = _AttemptSpan()
            self._attempts.append(self._current)
            self._resumed(e.get("resume"))
        elif kind == "trainer_ready":
            self._resumed(e.get("resumed_from"))
            if self._current is not None and not e.get("resumed_from"):
                # the trainer's first window starts at step 0, sample 0
                self._current.last_samples, self._current.last_step = 0, 0
        elif kind == "checkpoint" and self._current is not None and e.get("step") is not None:
            self._current.kept = max(self._current.kept, int(e["step"]))
        elif kind == "attempt_ended" and self._current is not None:
            self._current.outcome = e.get("outcome")
            if e.get("last_step") is not None:
                self._current.reached = max(self._current.reached, int(e["last_step"]))
        elif kind == "eval" and e.get("metrics"):
            self.final_metrics = dict(e["metrics"])

    def _resumed(self, resume: dict | None) -> None:
        a = self._current
        if a is None or not resume:
            return
        if resume.get("step") is None:  # a command's checkpoint file of unknown step
            a.start_step = None         # its first step sighting will say
            return
        a.start_step = a.reached = a.kept = a.last_step = int(resume["step"])
        a.last_samples = resume.get("samples_seen")

    def _step(self, e: dict) -> None:
        if e.get("loss") is not None:
            self.final_loss = e["loss"]
        a = self._current
        if a is None:  # a step before any attempt_started: an old or partial file
            a = self._current = _AttemptSpan()
            self._attempts.append(a)
        step = e.get("step")
        if step is not None:
            if a.start_step is None:
                a.start_step = int(step)
            a.reached = max(a.reached, int(step))
        window = e.get("window_s")
        rate = e.get("samples_per_s")
        if window is None or rate is None:  # a command's first sighting: no window measured
            a.last_samples = e.get("samples_seen", a.last_samples)
            a.last_step = step if step is not None else a.last_step
            return
        self.train_s += window
        seen = e.get("samples_seen")
        # The differences of samples seen and steps are exact; the rates times the window (all
        # rounded) stand in where the window's start is not known (a command's first window).
        if seen is not None and a.last_samples is not None and seen >= a.last_samples:
            self.samples += seen - a.last_samples
        else:
            self.samples += rate * window
        if step is not None and a.last_step is not None and step >= a.last_step:
            self.steps += step - a.last_step
        else:
            self.steps += (e.get("steps_per_s") or 0.0) * window
        if e.get("gflop_s") is not None:
            self.gflop += e["gflop_s"] * window
            self.gflop_s_time += window
        if seen is not None:
            a.last_samples = seen
        if step is not None:
            a.last_step = step

    @property
    def steps_lost(self) -> int:
        """Steps an attempt reached that the next one trained again (it resumed from an earlier
        checkpoint), and, for a last attempt that crashed, the steps past its last checkpoint:
        the supervisor's count in run_finished, kept current while the run goes on."""
        lost = 0
        for a, after in zip(self._attempts, self._attempts[1:] + [None]):
            if after is not None:
                lost += max(0, a.reached - (after.start_step or 0))
            elif a.outcome is not None and a.outcome not in _CLEAN_ENDS:
                lost += max(0, a.reached - a.kept)
        return lost

    def result(self) -> Averages:
        train_s = self.train_s
        return Averages(
            samples_per_s=self.samples / train_s if train_s > 0 else None,
            steps_per_s=self.steps / train_s if train_s > 0 else None,
            train_s=train_s,
            duration_s=None if self.first_t is None else self.last_t - self.first_t,
            steps_lost=self.steps_lost,
            final_loss=self.final_loss,
            final_metrics=dict(self.final_metrics),
            gflop_s=self.gflop / self.gflop_s_time if self.gflop_s_time > 0 else None,
        )


def averages(events: Iterable[dict]) -> Averages:
    """The run's averages from its events (engine.record.rundir.RunDir.events())."""
    stats = RunStats()
    for e in events:
        stats.add(e)
    return stats.result()

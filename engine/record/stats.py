"""The run's one accounting: its figures over its whole life, folded from its events -- steps and
samples trained, time spent training, duration, steps lost to crashes, checkpoints, each attempt
and how it ended, the final loss and metrics. run_finished's summary (so the headless last lines
and the alerts), `cockpit runs show/list/compare` and the TUI all read these figures from here.

Throughput. A step event's `samples_per_s` measures one reporting window, and a window can be a
fragment (the trainer reports before each checkpoint and at the end: 0.05 s of steps can read
7,000/s on a run that averages 300/s). The run's figure is therefore an average: samples (and
steps) trained, over all attempts, divided by the time spent training them -- the sum of the
windows' `window_s`, which leave out evaluation, epoch preparation (mining) and checkpoint pauses.
A command's windows are timed by when its output was read; its last, short window (`partial`)
is left out of the average, where that lag can be most of the window.

Steps lost. A step is lost when an attempt trained it and the next attempt had to train it again:
the steps an attempt reached past the point the next attempt resumed from. That point is the
resumed checkpoint's step where the events say it exactly (the trainer's trainer_ready, a
command's checkpoint named or reported with its step); else (a command's one `last.pt`
rewritten, whose checkpoint event holds only the step read by its write, or a command given no
checkpoint, which starts where its own arguments say) the next attempt's first reported step,
which its first window names (`begun_step`, else `from_step`). The attempt that ended the run
by crashing loses the steps past its newest checkpoint; so does one whose successor has not said
yet where it resumed.

Unknown units. A command whose samples per step are not known (engine.command.tracker) has
windows without samples: the samples/s average covers only windows that knew theirs, and is
None where none did (steps/s stands); tokens/s likewise.

`RunStats` folds events one at a time: the run's read model (engine.record.state) folds one with
every event, so the UI, the digest and summarize() read these figures from it; `fold(events)`
folds a whole list (the supervisor's run_finished), `averages(events)` its figures. Pure: no
I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from engine.record.goodput import Goodput, Timeline
from engine.vocabulary import CLEAN


def samples_known(units: dict | None) -> bool:
    """Whether a run's samples per step are known: the trainer's always are (its step events
    carry no units); a command's where something said them (engine.command.tracker's units)."""
    return units is None or units.get("samples_per_step") is not None


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
    tokens_per_s: float | None = None  # over the windows whose tokens per step are known
    units: dict | None = None     # a command's: what a step is, and where that was learnt
    total_source: str | None = None  # a command's: where its total came from

    @property
    def samples_known(self) -> bool:
        return samples_known(self.units)

    @property
    def rate(self) -> tuple[float, str] | None:
        return average_rate(self.samples_per_s, self.steps_per_s, self.samples_known)


def average_rate(samples_per_s: float | None, steps_per_s: float | None,
                 known: bool) -> tuple[float, str] | None:
    """The one figure a run's average throughput is shown as: (samples/s, "samples"), or (steps/s,
    "steps") where its samples per step are not known (never a guessed sample count); None with
    no rate."""
    if samples_per_s is not None:
        return samples_per_s, "samples"
    if steps_per_s is not None and not known:
        return steps_per_s, "steps"
    return None


@dataclass(slots=True)
class AttemptAccount:
    """One attempt, as its events tell it."""

    attempt: int | None = None    # its number (None: step events before any attempt_started)
    preset: str | None = None
    device: str | None = None     # a command's from attempt_started, the trainer's from trainer_ready
    outcome: str | None = None    # attempt_ended's outcome; None while it runs
    last_step: int | None = None  # attempt_ended's last step (the supervisor's count)
    sentence: str | None = None   # its crash's sentence, when it crashed
    start_step: int | None = 0    # where it began: 0, the step it resumed from, None: not known yet
    reached: int = 0              # the highest step it reported
    kept: int = 0                 # the newest step it checkpointed (or resumed from)
    window_samples: float | None = None  # samples_seen at its previous step event
    window_step: int | None = None       # ... and its step (None: where its windows start is not known)

    def summary(self) -> dict:
        """Its entry in run_finished's summary."""
        return {"attempt": self.attempt, "preset": self.preset, "device": self.device,
                "outcome": self.outcome, "last_step": self.last_step, "sentence": self.sentence}


class RunStats:
    """The run's figures folded one event at a time (`add`), read at any moment (`result`,
    `steps_lost`, `summary`)."""

    __slots__ = ("samples", "samples_s", "steps", "tokens", "tokens_s", "gflop", "gflop_s_time",
                 "train_s", "first_t", "last_t", "final_loss", "final_metrics", "checkpoints",
                 "attempts", "units", "total_source", "timeline", "_current")

    def __init__(self) -> None:
        self.samples = 0.0
        self.samples_s = 0.0         # training time of the windows whose samples are known
        self.steps = 0.0
        self.tokens = 0.0
        self.tokens_s = 0.0          # ... and of those whose tokens are
        self.units: dict | None = None
        self.total_source: str | None = None
        self.gflop = 0.0             # GFLOP trained, over the windows that say their GFLOP/s
        self.gflop_s_time = 0.0      # ... and those windows' time
        self.train_s = 0.0
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.final_loss: float | None = None
        self.final_metrics: dict = {}
        self.checkpoints = 0         # checkpoint events: 0, and a resume starts over
        self.attempts: list[AttemptAccount] = []
        self.timeline = Timeline()   # where the time went (engine.record.goodput)
        self._current: AttemptAccount | None = None

    def add(self, e: dict) -> None:
        self.timeline.add(e)
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
            self._current = AttemptAccount(attempt=e.get("attempt"), preset=e.get("preset"),
                                           device=e.get("device"))
            self.attempts.append(self._current)
            self._resumed(e.get("resume"))
            if e.get("command") and not e.get("resume"):
                # A command given no checkpoint starts where its own arguments say (an adopted
                # run resumed with the user's --resume-args): its first window says where.
                self._current.start_step = None
        elif kind == "trainer_ready":
            if self._current is not None:
                self._current.device = e.get("device", self._current.device)
            self._resumed(e.get("resumed_from"))
            if self._current is not None and not e.get("resumed_from"):
                # the trainer's first window starts at step 0, sample 0
                self._current.window_samples, self._current.window_step = 0, 0
        elif kind == "checkpoint":
            self.checkpoints += 1
            a = self._current
            if a is not None:
                # A file of unknown step holds at most the step reached when it was seen.
                step = e.get("step")
                a.kept = max(a.kept, int(step) if step is not None else a.reached)
        elif kind == "crash" and self._current is not None:
            self._current.sentence = e.get("sentence")
        elif kind == "attempt_ended" and self._current is not None:
            a = self._current
            a.outcome, a.last_step = e.get("outcome"), e.get("last_step")
            if a.last_step is not None:
                a.reached = max(a.reached, int(a.last_step))
        elif kind == "eval" and e.get("metrics"):
            self.final_metrics = dict(e["metrics"])

    def _resumed(self, resume: dict | None) -> None:
        a = self._current
        if a is None or not resume:
            return
        if resume.get("step") is None or resume.get("step_source") == "reached":
            # a command's checkpoint file of unknown step, or known only as the step read by
            # its write (a bound): its first step event says where it went on from
            a.start_step = None
            return
        a.start_step = a.reached = a.kept = a.window_step = int(resume["step"])
        a.window_samples = resume.get("samples_seen")

    def _step(self, e: dict) -> None:
        if e.get("loss") is not None:
            self.final_loss = e["loss"]
        if e.get("units") is not None:
            self.units, self.total_source = e["units"], e.get("total_source")
        a = self._current
        if a is None:  # a step before any attempt_started: an old or partial file
            a = self._current = AttemptAccount()
            self.attempts.append(a)
        step = e.get("step")
        window = e.get("window_s")
        rate = e.get("samples_per_s")
        if step is not None:
            if a.start_step is None:
                # Where its first window began: the first step it reported (a command's first
                # sighting opens that window and is no event of its own; the window says it).
                begun = e.get("begun_step", e.get("from_step"))
                if begun is None:  # written before windows said where they began
                    steps_per_s = e.get("steps_per_s")
                    begun = int(step) - (round(steps_per_s * window) if window and steps_per_s else 0)
                a.start_step = a.window_step = max(0, int(begun))
                a.kept = max(a.kept, a.start_step)
            a.reached = max(a.reached, int(step))
        # A command's window is timed by when its output was read, a poll or a busy moment
        # late at either end: over a short last window (a fragment, `partial`) that lag can be
        # most of it, so the average is taken over its full windows. The trainer times its own.
        fragment = e.get("partial") and e.get("units") is not None
        if window is None or e.get("steps_per_s") is None or fragment:  # no window to measure
            a.window_samples = e.get("samples_seen", a.window_samples)
            a.window_step = step if step is not None else a.window_step
            return
        self.train_s += window
        seen = e.get("samples_seen")
        # The differences of samples seen and steps are exact; the rates times the window (all
        # rounded) stand in where the window's start is not known (a command's first window).
        if seen is not None and a.window_samples is not None and seen >= a.window_samples:
            self.samples += seen - a.window_samples
            self.samples_s += window
        elif rate is not None:
            self.samples += rate * window
            self.samples_s += window
        if e.get("tokens_per_s") is not None:
            self.tokens += e["tokens_per_s"] * window
            self.tokens_s += window
        if step is not None and a.window_step is not None and step >= a.window_step:
            self.steps += step - a.window_step
        else:
            self.steps += (e.get("steps_per_s") or 0.0) * window
        if e.get("gflop_s") is not None:
            self.gflop += e["gflop_s"] * window
            self.gflop_s_time += window
        if seen is not None:
            a.window_samples = seen
        if step is not None:
            a.window_step = step

    @property
    def steps_lost(self) -> int:
        """Steps an attempt reached past where the next one resumed (it trained them again),
        and, for an attempt that crashed with no successor that has said where it resumed
        (the last one, or the next before its first step), the steps past its newest
        checkpoint. Not those a health finding went back from: `steps_rewound`."""
        rewound = {a.attempt for a in self.attempts if a.outcome == "health"}
        return sum(n for attempt, n in self.lost_by_attempt().items() if attempt not in rewound)

    @property
    def steps_rewound(self) -> int:
        """Steps trained, then thrown away by a rewind: the loss went bad (engine.run.rewind)."""
        rewound = {a.attempt for a in self.attempts if a.outcome == "health"}
        return sum(n for attempt, n in self.lost_by_attempt().items() if attempt in rewound)

    def lost_by_attempt(self) -> dict[int | None, int]:
        """steps_lost, by the attempt that trained the steps lost."""
        lost: dict[int | None, int] = {}
        for a, after in zip(self.attempts, self.attempts[1:] + [None]):
            if after is not None and after.start_step is not None:
                lost[a.attempt] = lost.get(a.attempt, 0) + max(0, a.reached - after.start_step)
            # a clean end (finished, stopped, config) checkpointed its steps or trained none
            elif a.outcome is not None and a.outcome not in CLEAN:
                lost[a.attempt] = lost.get(a.attempt, 0) + max(0, a.reached - a.kept)
        return lost

    def goodput(self) -> Goodput:
        """Where the run's wall time went (engine.record.goodput)."""
        return self.timeline.result(self.lost_by_attempt())

    def summary(self) -> dict:
        """run_finished's summary: each attempt and how it ended, where the run finished, its
        last step, and the steps lost to crashes."""
        attempts = [a for a in self.attempts if a.attempt is not None]
        last = attempts[-1] if attempts else None
        return {"attempts": [a.summary() for a in attempts], "steps_lost": self.steps_lost,
                "steps_rewound": self.steps_rewound,
                "goodput": self.goodput().as_dict(),
                "finished_on": last.preset if last and last.outcome == "finished" else None,
                "final_step": last.last_step if last else None}

    def result(self) -> Averages:
        train_s = self.train_s
        return Averages(
            samples_per_s=self.samples / self.samples_s if self.samples_s > 0 else None,
            steps_per_s=self.steps / train_s if train_s > 0 else None,
            train_s=train_s,
            duration_s=None if self.first_t is None or self.last_t is None
            else self.last_t - self.first_t,
            steps_lost=self.steps_lost,
            final_loss=self.final_loss,
            final_metrics=dict(self.final_metrics),
            gflop_s=self.gflop / self.gflop_s_time if self.gflop_s_time > 0 else None,
            tokens_per_s=self.tokens / self.tokens_s if self.tokens_s > 0 else None,
            units=self.units, total_source=self.total_source,
        )


def fold(events: Iterable[dict]) -> RunStats:
    """The run's accounting from its events (engine.record.rundir.RunDir.events())."""
    stats = RunStats()
    for e in events:
        stats.add(e)
    return stats


def averages(events: Iterable[dict]) -> Averages:
    """The run's averages from its events."""
    return fold(events).result()

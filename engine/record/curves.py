"""A run's curves from its events: the loss and each eval metric, every point with its step,
samples seen and seconds since the run started, so two runs can be laid over each other by
whichever of the three makes them comparable.

A curve is the path to the run's final model: when an attempt resumes from a checkpoint
behind where the crashed one got (or a command restarts), the steps it trains again replace
the lost ones instead of drawing the line backwards. Their time stays on the clock, so on the
time axis the crash still costs what it cost.

`CurveFold` takes events one at a time (a live run is followed without reading it again);
`curves(events)` folds a whole list. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence, TypeGuard

AXES = ("step", "samples", "seconds")


@dataclass(slots=True)
class Curve:
    """One quantity over a run; the four lists run in parallel. `samples` holds None where the
    run did not say (a command's parsed progress may have steps only)."""

    steps: list[int] = field(default_factory=list)
    samples: list[int | None] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    def add(self, step: int, samples: int | None, seconds: float, value: float) -> None:
        self.steps.append(step)
        self.samples.append(samples)
        self.seconds.append(seconds)
        self.values.append(value)

    def drop_from(self, step: int) -> None:
        """Forget the points at `step` and beyond: a later attempt trains them again."""
        keep = len(self.steps)
        while keep and self.steps[keep - 1] >= step:
            keep -= 1
        for column in (self.steps, self.samples, self.seconds, self.values):
            del column[keep:]

    def points(self, axis: str) -> tuple[list[float], list[float]]:
        """(x, y) with x in `axis` (one of AXES); points whose x is not known are left out."""
        columns: dict[str, Sequence[float | None]] = {"step": self.steps, "samples": self.samples,
                                                      "seconds": self.seconds}
        xs = columns[axis]
        kept = [(x, y) for x, y in zip(xs, self.values) if x is not None]
        return [float(x) for x, _ in kept], [y for _, y in kept]

    def copy(self) -> "Curve":
        return Curve(list(self.steps), list(self.samples), list(self.seconds), list(self.values))

    def __len__(self) -> int:
        return len(self.steps)


@dataclass(slots=True)
class RunCurves:
    loss: Curve = field(default_factory=Curve)
    evals: dict[str, Curve] = field(default_factory=dict)   # metric name -> its curve

    def copy(self) -> "RunCurves":
        """A copy to hand to another thread while the fold goes on adding to this one."""
        return RunCurves(self.loss.copy(), {name: c.copy() for name, c in self.evals.items()})


class CurveFold:
    """RunCurves folded one event at a time (`add`); `curves` is current after each."""

    __slots__ = ("curves", "_start", "_step", "_samples", "_per_step")

    def __init__(self) -> None:
        self.curves = RunCurves()
        self._start: float | None = None   # the first event's time: the clock's zero
        self._step: int | None = None      # the newest step event's step
        self._samples: int | None = None   # and its samples seen
        self._per_step: float | None = None  # samples per step between the last two step events

    def add(self, e: dict) -> None:
        t = e.get("t")
        if self._start is None and isinstance(t, (int, float)):
            self._start = t
        kind = e.get("type")
        if kind == "step" and isinstance(e.get("step"), int):
            self._add_step(e)
        elif kind == "eval" and isinstance(e.get("metrics"), dict):
            self._add_eval(e)

    def _seconds(self, e: dict) -> float:
        t = e.get("t")
        return t - self._start if isinstance(t, (int, float)) and self._start is not None else 0.0

    def _add_step(self, e: dict) -> None:
        step = e["step"]
        if self._step is not None and step <= self._step:
            # Trained again after a resume: what the crashed attempt did from here was lost.
            self.curves.loss.drop_from(step)
            for curve in self.curves.evals.values():
                curve.drop_from(step + 1)
        samples = e.get("samples_seen") if isinstance(e.get("samples_seen"), int) else None
        if samples is not None and self._samples is not None and self._step is not None \
                and step > self._step:
            self._per_step = (samples - self._samples) / (step - self._step)
        self._step, self._samples = step, samples
        loss = e.get("loss")
        if _is_number(loss):
            self.curves.loss.add(step, self._samples, self._seconds(e), float(loss))

    def _add_eval(self, e: dict) -> None:
        step = e.get("step") if isinstance(e.get("step"), int) else self._step
        if step is None:
            return
        samples = self._samples_at(step)
        for name, value in e["metrics"].items():
            if _is_number(value):
                curve = self.curves.evals.setdefault(name, Curve())
                curve.drop_from(step)   # a repeated eval at one step (a resume's) replaces it
                curve.add(step, samples, self._seconds(e), float(value))

    def _samples_at(self, step: int) -> int | None:
        """Samples seen at `step`. The trainer evaluates before it reports the step's window,
        so an eval's step is often a few past the last step event: counted on at the last
        window's samples per step (a batch changes only with a new attempt)."""
        if self._samples is None or self._step is None:
            return None
        if step == self._step:
            return self._samples
        if self._per_step is None:
            return None
        return round(self._samples + (step - self._step) * self._per_step)


def _is_number(value) -> TypeGuard[float]:
    # bool is an int to Python; a metric that is True is not a point on a curve. NaN and inf
    # are left to the plot, which drops them (a diverged run still shows where it went).
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def curves(events: Iterable[dict]) -> RunCurves:
    """The run's curves from its events (engine.record.rundir.RunDir.events())."""
    fold = CurveFold()
    for e in events:
        fold.add(e)
    return fold.curves

"""A command's progress as `step` events: what the built-in trainer reports of itself.

The supervisor feeds this tracker what it learns of a command's progress — observations
parsed from its output (engine.command.progress) and `progress` events the script wrote through
cockpit.report — and emits a `step` event per reporting window with the same fields the
trainer's have: step, total, loss, lr, samples/s and steps/s measured over the window, a
smoothed rate, the best full window so far and the ETA, both from engine.monitor.throughput as
the trainer's are. So throughput, plots, the ETA and the slowdown detector work the same for
both kinds of workload. A script's evals and other pauses cannot be told from slow steps
here; the long horizon spreads them over the rate, which is what they cost the ETA.

Reported values win over parsed ones: once the script has reported a step, parsed steps are
ignored; once it has reported an eval, parsed evals are. Samples are the reported count, else
steps x the samples per step that the command's placeholders imply
(engine.command.samples_per_step).
Pure: no clock, no I/O; the caller passes times (time.time()).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from engine.monitor.throughput import RateMeter

REPORT_EVERY_S = 1.0
STEPLESS_LOSSES = 3  # losses read with no step number before the tracker says it sees no steps
# Five minutes of the script's time: long enough that an eval pause every few minutes is
# averaged in rather than swinging the ETA, short enough to follow a real change of speed.
HORIZON_S = 300.0


@dataclass
class _Window:
    start_t: float
    start_step: int
    start_samples: float


@dataclass
class Tracker:
    samples_per_step: int
    total_steps: int = 0                 # the preset's; 0 = what the output says
    report_every_s: float = REPORT_EVERY_S
    reported_steps: bool = False         # the script reports its steps itself
    reported_evals: bool = False
    step: int | None = None
    total: int | None = None
    samples: float | None = None         # reported samples seen, when the script gives them
    loss: float | None = None
    lr: float | None = None
    epoch: float | None = None
    metrics: dict = field(default_factory=dict)
    source: str = ""
    non_finite: dict | None = None       # the first non-finite loss seen: {"step", "message", "t"}
    _window: _Window | None = None
    _meter: RateMeter | None = None      # the smoothed rate and the best full window
    _last_finite_t: float | None = None  # when a finite loss was last seen
    _windows: int = 0                    # step events made
    _stepless_losses: int = 0            # losses read while no step number has been

    def __post_init__(self) -> None:
        self._meter = RateMeter(full_window_s=self.report_every_s, horizon_s=HORIZON_S)

    # ------------------------------------------------------------ feeding

    def parsed(self, observation, t: float) -> list[tuple[str, dict]]:
        """One engine.command.progress.Observation read from the output."""
        if observation.kind == "eval":
            if self.reported_evals or not observation.metrics:
                return []
            step = observation.step if observation.step is not None else self.step
            return [("eval", {"step": step, "metrics": dict(observation.metrics),
                              "source": observation.source})]
        if self.reported_steps:
            return []
        return self._update(t, observation.step, observation.total, observation.loss,
                            observation.lr, observation.epoch, observation.metrics, None,
                            observation.source)

    def reported(self, event: dict) -> list[tuple[str, dict]]:
        """A `progress` event the script wrote (cockpit.report.step)."""
        self.reported_steps = True
        metrics = dict(event.get("metrics") or {})
        # lr= and epoch= are fields of a step event, as the trainer's are, not metrics
        lr = metrics.pop("lr", None)
        lr = metrics.pop("learning_rate", None) if lr is None else lr
        epoch = metrics.pop("epoch", None)
        return self._update(event["t"], event.get("step"), event.get("total"), event.get("loss"),
                            lr, epoch, metrics, event.get("samples"), "report")

    def saw_reported_eval(self) -> None:
        self.reported_evals = True

    def _update(self, t, step, total, loss, lr, epoch, metrics, samples, source) -> list[tuple[str, dict]]:
        if not all(_plausible(v) for v in (step, total, samples)):
            return []  # `step 1e400`, 400 digits: not a count any script reaches
        if loss is not None:
            self.loss = float(loss)
            if math.isfinite(self.loss):
                self._last_finite_t = t
            elif self.non_finite is None:
                # `t`: the last time the loss was seen finite (a checkpoint written after it
                # may hold the bad weights); the time it was read can be a poll later
                self.non_finite = {"step": step if step is not None else self.step,
                                   "message": f"loss {self.loss} ({source or 'output'})",
                                   "t": self._last_finite_t}
        self.lr = lr if lr is not None else self.lr
        self.epoch = epoch if epoch is not None else self.epoch
        self.metrics.update(metrics or {})
        self.total = total if total else self.total
        if step is not None:  # where the steps come from (a loss-only line does not say)
            self.source = source or self.source
        if samples is not None:
            self.samples = float(samples)
        if step is None:  # values without a step (HF's log dicts) join the current step
            return self._no_step_numbers() if loss is not None and self.step is None else []
        self.step = int(step)
        if self._window is None or self.step < self._window.start_step:
            self._window = _Window(t, self.step, self.samples_seen)  # the first sight, or a restart
            return []
        if t - self._window.start_t < self.report_every_s:
            return []
        return [("step", self._close_window(t))]

    def _no_step_numbers(self) -> list[tuple[str, dict]]:
        """Losses and no step: say so once (a Trainer with disable_tqdm=True prints its log
        dicts and no bar), rather than end with 'step 0' and no word why."""
        self._stepless_losses += 1
        if self._stepless_losses != STEPLESS_LOSSES:
            return []
        return [("warning", {
            "kind": "no-step-numbers", "fallback": False,
            "message": f"the output gave {STEPLESS_LOSSES} losses and no step number: no progress, "
                       "throughput or ETA can be read from it",
            "advice": [{"text": "a Hugging Face Trainer with disable_tqdm=True prints no steps: add "
                                "cockpit.integrations.transformers.CockpitCallback (or leave tqdm on)"},
                       {"text": "or name the step in the workload's progress_regex (?P<step>...), or "
                                "call cockpit.report.step from the script"}]})]

    def flush(self, t: float) -> list[tuple[str, dict]]:
        """The last, partial window (at the end of an attempt); a run too short for a window
        still says where it got to (with no rate: one sighting measures nothing)."""
        w = self._window
        if w is None or self.step is None:
            return []
        if self.step > w.start_step and t > w.start_t:
            return [("step", self._close_window(t))]
        if self._windows and self.step <= w.start_step:
            return []  # its last window already said it
        # Where it got to: a run too short for a window, or steps read past the window that
        # the same last read closed (no time to measure a rate over: a partial window)
        sighting = {"step": self.step, "total": self.total_known,
                    "samples_seen": int(self.samples_seen), "epoch": self.epoch,
                    "loss": self.loss, "lr": self.lr, "samples_per_s": None,
                    "steps_per_s": None, "window_s": None, "eta_s": None, "source": self.source}
        return [("step", {**sighting, "partial": True} if self._windows else sighting)]

    # ------------------------------------------------------------ the step event

    @property
    def samples_seen(self) -> float:
        if self.samples is not None:
            return self.samples
        return (self.step or 0) * self.samples_per_step

    @property
    def total_known(self) -> int | None:
        return self.total_steps or self.total or None

    def _close_window(self, t: float) -> dict:
        w, meter, step = self._window, self._meter, self.step
        assert w is not None and meter is not None and step is not None  # open, at a step
        elapsed = max(t - w.start_t, 1e-9)
        steps_per_s = (step - w.start_step) / elapsed
        samples = max(0.0, self.samples_seen - w.start_samples)
        samples_per_s = samples / elapsed
        meter.add(step - w.start_step, samples, elapsed)
        self._windows += 1
        total = self.total_known
        eta = meter.seconds_for(total - step) if total else None
        smoothed = meter.samples_per_s or 0.0
        best = meter.best_samples_per_s or 0.0
        event: dict[str, Any] = {
            "step": step, "total": total, "samples_seen": int(self.samples_seen),
            "epoch": self.epoch, "loss": self.loss, "lr": self.lr,
            "samples_per_s": round(samples_per_s, 3), "steps_per_s": round(steps_per_s, 4),
            "window_s": round(elapsed, 4), "eta_s": None if eta is None else round(eta, 1),
            "smoothed_samples_per_s": round(smoothed, 3),
            "best_samples_per_s": round(best, 3), "source": self.source}
        if elapsed < self.report_every_s:
            event["partial"] = True  # flush's last window: too short to show as a rate
        if self.metrics:
            event["metrics"] = {k: v for k, v in self.metrics.items() if _finite_number(v)}
        self._window = _Window(t, step, self.samples_seen)
        return event


def _plausible(count) -> bool:
    """A step, total or sample count a script could print (or None)."""
    try:
        return count is None or 0 <= float(count) < 1e15
    except (TypeError, ValueError, OverflowError):
        return False


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

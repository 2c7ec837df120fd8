"""A command's progress as `step` events: what the built-in trainer reports of itself.

The supervisor feeds this tracker what it learns of a command's progress — observations
parsed from its output (engine.command.progress) and `progress` events the script wrote through
cockpit.report — and emits a `step` event per reporting window with the same fields the
trainer's have: step, total, loss, lr, samples/s and steps/s measured over the window, a
smoothed rate, the best full window so far and the ETA, both from engine.monitor.throughput as
the trainer's are. So throughput, plots, the ETA and the slowdown detector work the same for
both kinds of workload. A script's evals and other pauses cannot be told from slow steps
here; the long horizon spreads them over the rate, which is what they cost the ETA.

Windows. A window is at least `report_every_s` long and ends at the first reading after that
whose step is past the window's first: every second of the attempt between its first sight
and its last step read is in exactly one window, whether or not a step landed in that second.
A bar that redraws the same count several times a second (Rich's) ends no window, so a step
of 3 s is one window of 3 s, not one of 1 s and two of none whose time the rate would lose.
The attempt's first window begins at its first sight; its last ends at its last step read
(`flush`).

Units. A step is an optimizer step. What one is in samples (and tokens) comes with where that
was learnt (`Units`), in this order: the samples the script reported (exact); the script's own
statement (HF's `Total train batch size ... = 32`, nanoGPT's `tokens per iteration will be:`);
the workload preset's `samples_per_step`; the argv's {batch_size} and {accumulation}
placeholders; else unknown, and then samples are never guessed: the event's samples fields are
None and its rate is steps/s. A counter of batches (a Lightning epoch bar, `epoch E batch B/N`)
becomes optimizer steps where the accumulation is known, and stays batches (`counter`) where not.

The total: the preset's `total_steps`, else what the output counts to (a bar, `step N/M`), else
what the script stated (`Total optimization steps = N`, `Overriding: max_iters = N`), else its
argv (`--max_steps 300`), each with its source in the event.

The gradient norm: the last one printed (HF's log dicts' `grad_norm`, `gnorm`) or reported
(cockpit.report.step(grad_norm=...)) is the step event's `grad_norm`, as the trainer's is (it
stays among the metrics too); a reading whose loss or norm was NaN or infinite is counted in
the window's `nonfinite`, and a non-finite norm is not shown as the last one. The largest
finite loss and norm read in the window are its `loss_max` and `grad_norm_max`, as the
trainer's largest step's are (absent where the window read none): a window holds every log
line printed in its second, and the training-health detectors judge its largest, so a norm
that exploded for one logged step and came back by the next is not hidden behind the last.

Reported values win over parsed ones: once the script has reported a step, parsed steps are
ignored; once it has reported an eval, parsed evals are.
Pure: no clock, no I/O; the caller passes times (time.time()).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from engine.monitor.throughput import RateMeter

REPORT_EVERY_S = 1.0
# The names a script prints or reports its gradient's total norm under (HF: grad_norm;
# fairseq: gnorm).
GRAD_NORM_NAMES = ("grad_norm", "gnorm", "gradient_norm")
STEPLESS_LOSSES = 3  # losses read with no step number before the tracker says it sees no steps
# Five minutes of the script's time: long enough that an eval pause every few minutes is
# averaged in rather than swinging the ETA, short enough to follow a real change of speed.
HORIZON_S = 300.0
# A step is read when the script prints it, up to a print interval late: the best rate is
# taken over windows holding at least this many steps (engine.monitor.throughput).
BEST_MIN_STEPS = 8

# Where a figure per step came from, most trusted first: what the script reported, what it
# printed, what the user wrote in the preset, what its argv's placeholders imply.
SOURCES = ("reported", "stated", "preset", "placeholders", "argv", "unknown")


def _outranks(source: str, than: str) -> bool:
    return SOURCES.index(source) < SOURCES.index(than)


@dataclass(frozen=True, slots=True)
class Units:
    """What one optimizer step of the script is, and how cockpit knows it."""

    samples_per_step: int | None = None
    samples_source: str = "unknown"
    tokens_per_step: int | None = None
    tokens_source: str = "unknown"
    accumulation: int | None = None      # micro-batches per optimizer step, where known
    accumulation_source: str = "unknown"
    said: str | None = None              # the script's line or argument that said the samples

    def learn(self, what: str, value: int, source: str, said: str | None = None) -> "Units":
        """These units with `what` (samples_per_step, tokens_per_step, accumulation) learnt
        from `source`, unless a more trusted source already said it."""
        if not isinstance(value, int) or value < 1:
            return self
        field_source = {"samples_per_step": "samples_source", "tokens_per_step": "tokens_source",
                        "accumulation": "accumulation_source"}[what]
        if _outranks(getattr(self, field_source), source):
            return self
        changes: dict[str, Any] = {what: value, field_source: source}
        if what == "samples_per_step":
            changes["said"] = said
        return dataclasses.replace(self, **changes)

    def as_event(self, counter: str) -> dict:
        return {"samples_per_step": self.samples_per_step, "samples_source": self.samples_source,
                "tokens_per_step": self.tokens_per_step, "tokens_source": self.tokens_source,
                "counter": counter, "accumulation": self.accumulation, "said": self.said}


@dataclass
class _Window:
    start_t: float
    start_step: int
    start_samples: float | None   # None: not known when the window opened
    begun: int | None = None      # an attempt's first window: the step first seen (below)


@dataclass
class Tracker:
    units: Units = field(default_factory=Units)
    total_steps: int = 0                 # the preset's; 0 = what the output says
    report_every_s: float = REPORT_EVERY_S
    known: dict = field(default_factory=dict)  # the argv's facts (engine.command.statements)
    resumed_from: int | None = None      # the step of the checkpoint this attempt resumed from
    resumed_samples: float | None = None  # ... and the samples seen by then, where known
    step_offset: int = 0                 # added to the steps it prints: it counts from 0 again
    totals_not_epochs: bool = False      # a bar's count ran past its total (below)
    reported_steps: bool = False         # the script reports its steps itself
    reported_evals: bool = False
    step: int | None = None
    total: int | None = None             # the output's own count, in steps
    samples: float | None = None         # reported samples seen, when the script gives them
    loss: float | None = None
    lr: float | None = None
    epoch: float | None = None
    metrics: dict = field(default_factory=dict)
    grad_norm: float | None = None       # the last finite gradient norm read, where any
    source: str = ""
    counter: str = "steps"               # "batches": a batch counter whose accumulation is unknown
    stated_total: int | None = None      # what the script stated its total to be
    epochs_total: int | None = None      # its epochs x the steps in one, where both are known
    epochs: int | None = None            # epochs in the run, where stated
    non_finite: dict | None = None       # the first non-finite loss seen: {"step", "message", "t"}
    step_t: float | None = None          # when the current step was first read
    epoch_base: int | None = None        # how the output numbers its epochs, as its parser settled
    _window: _Window | None = None
    _meter: RateMeter | None = None      # the smoothed rate and the best full window
    _last_finite_t: float | None = None  # when a finite loss was last seen
    _windows: int = 0                    # step events made
    _stepless_losses: int = 0            # losses read while no step number has been
    _nonfinite: int = 0                  # readings since the last window with a NaN/Inf loss or norm
    _loss_max: float | None = None       # the largest finite loss read since the last window
    _norm_max: float | None = None       # ... and gradient norm
    _unsaid: bool = False                # values read since the last step event (a row's loss)

    def __post_init__(self) -> None:
        self._meter = RateMeter(full_window_s=self.report_every_s, horizon_s=HORIZON_S,
                                best_min_steps=BEST_MIN_STEPS)
        for what in ("accumulation", "epochs"):
            if what in self.known:
                self._fact(what, self.known[what][0], "argv", self.known[what][1])

    # ------------------------------------------------------------ feeding

    def parsed(self, observation, t: float) -> list[tuple[str, dict]]:
        """One engine.command.observation.Observation read from the output."""
        if observation.kind == "facts":
            for what, value in observation.facts.items():
                self._fact(what, value, "stated", observation.said)
            return []
        if observation.kind == "eval":
            if self.reported_evals or not observation.metrics:
                return []
            step = observation.step + self.step_offset if observation.step is not None else self.step
            if observation.unit == "batch":
                step = self.step  # a batch count: the optimizer step reached is the tracker's
            return [("eval", {"step": step, "metrics": dict(observation.metrics),
                              "source": observation.source})]
        if self.reported_steps:
            return []
        step, total, epoch = observation.step, observation.total, observation.epoch
        if self.step_offset:  # `12/30` after a resume at step 20 of a script that counts again
            step = None if step is None else step + self.step_offset
            total = None if total is None else total + self.step_offset
        if observation.unit == "batch":
            step, total = self._optimizer_steps(observation), None
            if observation.batches and (observation.batch or 0) > observation.batches:
                epoch = observation.epoch_index  # its count ran past its total (below)
        return self._update(t, step, total, observation.loss, observation.lr, epoch,
                            observation.metrics, None, observation.source)

    def _fact(self, what: str, value, source: str, said: str | None) -> None:
        """A fact the script stated (or its argv says): a unit per step, the total, the epochs."""
        if not isinstance(value, int) or value < 1:
            return
        if what == "total":
            if source == "stated":
                self.stated_total = value
        elif what == "epochs":
            self.epochs = value
        elif what in ("samples_per_step", "tokens_per_step", "accumulation"):
            self.units = self.units.learn(what, value, source, said)

    def _optimizer_steps(self, o) -> int | None:
        """A batch counter as optimizer steps, where the accumulation is known: within each
        epoch a step every `accumulation` batches; at an epoch's end a last, partial group is
        a step of its own under a framework's bar (Lightning's, the Trainer's step there) and
        none under a loop's own lines (`if (b + 1) % accum == 0`). Else the batches
        themselves, said to be batches. The run's total from its epochs goes to epochs_total."""
        a, n, b, e = self.units.accumulation, o.batches, o.batch, o.epoch_index
        if n and b is not None and b > n:
            # The count ran past its total: the bar's total is not the epoch's batches.
            # Lightning's, over a dataset of no length, is max_steps (optimizer steps) while it
            # counts batches, and after a resume it is the steps left.
            self.totals_not_epochs = True
        if self.totals_not_epochs:
            n = None
        self.counter = "steps" if a else "batches"
        a = a or 1
        per_epoch = None
        if n:
            per_epoch = -(-n // a) if o.source in ("tqdm", "rich") else n // a
            epochs = (o.total // o.batches) if o.total and o.batches else self.epochs
            self.epochs_total = epochs * per_epoch if epochs else self.epochs_total
        if b is None or e is None or e > 0 and not per_epoch:
            # no epoch to compose (a regex's count), or epochs of a size not known: the
            # parser's global count of batches
            return None if o.step is None else o.step // a
        in_epoch = per_epoch if per_epoch and n and b >= n else b // a
        return e * (per_epoch or 0) + in_epoch

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
        self._unsaid = self._unsaid or (loss is not None and float(loss) != self.loss) \
            or (lr is not None and lr != self.lr) \
            or any(self.metrics.get(name) != value for name, value in (metrics or {}).items())
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
        norm = next((metrics[n] for n in GRAD_NORM_NAMES if n in (metrics or {})), None)
        if isinstance(norm, (int, float)) and not isinstance(norm, bool):
            self.grad_norm = float(norm) if math.isfinite(norm) else None
            if self.grad_norm is not None:   # the window's largest reading
                self._norm_max = _larger(self._norm_max, self.grad_norm)
        if any(isinstance(v, float) and not math.isfinite(v) for v in (loss, norm)):
            self._nonfinite += 1
        if loss is not None and math.isfinite(read := float(loss)):
            self._loss_max = _larger(self._loss_max, read)
        self.total = total if total else self.total
        if step is not None:  # where the steps come from (a loss-only line does not say)
            self.source = source or self.source
        if samples is not None:
            self.samples = float(samples)
        if step is None:  # values without a step (HF's log dicts) join the current step
            return self._no_step_numbers() if loss is not None and self.step is None else []
        if self.step != int(step):
            self.step_t = t
        self.step = int(step)
        if self._window is None and self.resumed_from and self.step < self.resumed_from:
            # A bar drawn before the resumed steps are skipped (the HF Trainer draws 0/N, then
            # jumps to the step it resumed from): the attempt is at the resumed step.
            self.step = self.resumed_from
            self._window = _Window(t, self.step, self.samples_seen, begun=self.step)
            return []
        if self._window is None or self.step < self._window.start_step:
            # the first sight, or a restart
            self._window = _Window(t, self.step, self.samples_seen, begun=self.step)
            return []
        if self._window.begun is not None and t == self._window.start_t:
            # Read in the same poll as the first sight (a resumed script's burst of lines):
            # trained before that moment, in time no window measured, so its rate counts from
            # the last of them, and the attempt still began at the first (`begun_step`).
            self._window = dataclasses.replace(self._window, start_step=self.step,
                                               start_samples=self.samples_seen)
            return []
        if t - self._window.start_t < self.report_every_s or self.step == self._window.start_step:
            # A window closes at a reading past its step: a bar that redraws the same count
            # several times a second (Rich's) says nothing new, and a window closed on it with
            # no step would leave its seconds out of the rate (3 s steps read as 1 a second).
            return []
        return [("step", self._close_window(t)), *self._no_total()]

    def _no_total(self) -> list[tuple[str, dict]]:
        """No total known by the first window: say once how to give one, rather than show no
        ETA and no word why."""
        if self._windows != 1 or self.total_known is not None:
            return []
        return [("warning", {
            "kind": "no-total", "fallback": False,
            "message": "the script states no total steps (no bar, no `Total optimization steps`, "
                       "no max_iters/max_steps in its argv or output): no ETA",
            "advice": [{"text": "give it: total_steps = N in the workload preset, or "
                                "--set command.total_steps=N"}]})]

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
        # The last window ends when its last step was read: what came after (a final eval, a
        # save, the interpreter's exit) is not training. Steps read at the moment a window
        # closed have no time to measure a rate over: a sighting (below).
        end = self.step_t if self.step_t is not None else t
        if self.step > w.start_step and end > w.start_t:
            return [("step", self._close_window(end))]
        if self._windows and self.step <= w.start_step and not self._unsaid:
            return []  # its last window already said it
        # Where it got to: a run too short for a window, steps read past the window that the
        # same last read closed (no time to measure a rate over: a partial window), or values
        # read at the step the last window ended on (mlx-lm's frame `12/12` came before the row
        # for 12, whose loss is the run's last; the Trainer's last log dict after its bar's 60/60)
        self._unsaid = False
        sighting = {**self._where(), "samples_per_s": None, "steps_per_s": None,
                    "window_s": None, "eta_s": None}
        if self.metrics:
            sighting["metrics"] = {k: v for k, v in self.metrics.items() if _finite_number(v)}
        return [("step", {**sighting, "partial": True} if self._windows else sighting)]

    # ------------------------------------------------------------ the step event

    @property
    def samples_seen(self) -> float | None:
        """Samples trained: the reported count, else those at the resumed checkpoint and the
        steps since times the samples per step, where known; None where not (never guessed)."""
        if self.samples is not None:
            return self.samples
        return self.samples_at(self.step or 0)

    def samples_at(self, step: int) -> float | None:
        """The samples seen at one of this attempt's steps (for its checkpoints): an earlier
        attempt's steps may have been of another batch (a fallback re-templates {batch_size}),
        so they count as the resumed checkpoint says, where it says; else as this attempt's."""
        per_step = self.units.samples_per_step
        if not per_step:
            return None
        base = self.resumed_from or 0
        if self.resumed_samples is not None and step >= base:
            return self.resumed_samples + (step - base) * per_step
        return step * per_step

    @property
    def tokens_seen(self) -> int | None:
        per_step = self.units.tokens_per_step
        return (self.step or 0) * per_step if per_step else None

    @property
    def total_known(self) -> int | None:
        return self._total()[0]

    def _total(self) -> tuple[int | None, str | None]:
        """The run's total steps and where it came from: the preset's, else what the output
        counts to (a bar, `step N/M`), else the least of what the script stated, its argv
        says and its epochs come to (`--max_steps 60` ends a run of 10 epochs early)."""
        if self.total_steps:
            return self.total_steps, "preset"
        if self.total:
            return int(self.total), "output"
        argv = self.known.get("total")
        bounds = [(int(total), source) for total, source in (
            (self.stated_total, "stated"), (argv and argv[0], "argv"),
            (self.epochs_total, "epochs")) if total]
        return min(bounds, key=lambda b: b[0]) if bounds else (None, None)

    def _units(self) -> dict:
        units = self.units
        if self.samples is not None:  # reported: exact, whatever a step's batch was
            per_step = round(self.samples / self.step) if self.step else None
            units = dataclasses.replace(units, samples_per_step=per_step, samples_source="reported",
                                        said=None)
        return units.as_event(self.counter)

    def _where(self) -> dict:
        """The fields saying where the attempt got to, and in what units."""
        total, total_source = self._total()
        seen = self.samples_seen
        where = {"step": self.step, "total": total, "total_source": total_source,
                 "samples_seen": None if seen is None else int(seen), "epoch": self.epoch,
                 "loss": self.loss, "lr": self.lr, "source": self.source, "units": self._units()}
        if (tokens := self.tokens_seen) is not None:
            where["tokens_seen"] = tokens
        if self.grad_norm is not None:
            where["grad_norm"] = self.grad_norm
        if self.epoch_base is not None:  # so that a continued run counts its epochs alike
            where["epoch_base"] = self.epoch_base
        return where

    def _close_window(self, t: float) -> dict:
        w, meter, step = self._window, self._meter, self.step
        assert w is not None and meter is not None and step is not None  # open, at a step
        elapsed = max(t - w.start_t, 1e-9)
        steps = step - w.start_step
        steps_per_s = steps / elapsed
        seen = self.samples_seen
        known = seen is not None and w.start_samples is not None
        samples = max(0.0, seen - w.start_samples) if known else 0.0  # type: ignore[operator]
        meter.add(steps, samples, elapsed)
        self._windows += 1
        total = self.total_known
        eta = meter.seconds_for(total - step) if total else None
        event: dict[str, Any] = {
            **self._where(),
            "from_step": w.start_step,
            "samples_per_s": round(samples / elapsed, 3) if known else None,
            "steps_per_s": round(steps_per_s, 4),
            "window_s": round(elapsed, 4), "eta_s": None if eta is None else round(eta, 1),
            "smoothed_samples_per_s": round(meter.samples_per_s or 0.0, 3) if known else None,
            "best_samples_per_s": round(meter.best_samples_per_s or 0.0, 3) if known else None}
        if w.begun is not None and w.begun < w.start_step:
            event["begun_step"] = w.begun  # where the attempt began; the rate's from_step is later
        if self.units.tokens_per_step:
            event["tokens_per_s"] = round(steps_per_s * self.units.tokens_per_step, 3)
        if elapsed < self.report_every_s:
            event["partial"] = True  # flush's last window: too short to show as a rate
        if self.metrics:
            event["metrics"] = {k: v for k, v in self.metrics.items() if _finite_number(v)}
        if self._nonfinite:
            event["nonfinite"], self._nonfinite = self._nonfinite, 0
        if self._loss_max is not None:   # the window's largest readings (training health's)
            event["loss_max"], self._loss_max = self._loss_max, None
        if self._norm_max is not None:
            event["grad_norm_max"], self._norm_max = self._norm_max, None
        self._window = _Window(t, step, seen)
        self._unsaid = False
        return event


def _plausible(count) -> bool:
    """A step, total or sample count a script could print (or None)."""
    try:
        return count is None or 0 <= float(count) < 1e15
    except (TypeError, ValueError, OverflowError):
        return False


def _larger(largest: float | None, value: float) -> float:
    return value if largest is None else max(largest, value)


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

"""From timed micro-batches to samples/s, and how sure that figure is.

The probe's worker (engine.probe.worker) times the trainer's micro-batches, not whole
optimizer steps: on a slow CPU one step of the `cpu` preset is 8 x 64 = 512 samples, minutes
long, while one micro-batch is seconds. Each `Timing` is a stretch of training between two
device syncs, of one of three kinds:

    micro-batches only     one or more forward and backward passes inside an accumulation group
    an optimizer step      its own work alone (unscale, clip, step, zero_grad): a group's tail
    whole steps            micro-batches and the steps they make up, when steps are short

A step is then `accumulation` x the mean micro-batch + the mean optimizer step, or measured
whole; samples/s is a step's samples over that. Means, not medians: a run's throughput is its
samples over its time, and a stall that hits one micro-batch in ten costs a run just as much.

How sure: a 90% confidence interval of the mean step time (Student's t over the timings, so
two timings give a wide interval and thirty a narrow one), as samples/s. With two timings far
apart the interval's fast end is unbounded: then it has none (`high` None).

Torch-free: the parent process reads the worker's events with it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.9
# Student's t, two-sided 90% (the 95th percentile), by degrees of freedom; beyond the table a
# Cornish-Fisher expansion around the normal's 1.645 is good to the third decimal.
_T95 = {1: 6.314, 2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833,
        10: 1.812}
_Z95 = 1.6449


def t95(df: int) -> float:
    if df in _T95:
        return _T95[df]
    z = _Z95
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Timing:
    seconds: float
    micro_batches: int   # forward and backward passes in it
    steps: int           # optimizer steps completed in it

    @classmethod
    def of(cls, event: dict) -> "Timing":
        return cls(event["seconds"], event["micro_batches"], event["steps"])


@dataclass(frozen=True)
class Estimate:
    samples_per_s: float
    low: float | None            # the 90% confidence interval of samples/s (None: too few timings)
    high: float | None           # None also where the interval has no fast end
    timings: int                 # timings behind it
    micro_batches: int           # micro-batches in them
    micro_batch_s: float | None  # mean seconds of one micro-batch (None: only whole steps timed)
    optimizer_s: float | None    # mean seconds of an optimizer step's own work (None: not timed alone)
    steps: int                   # optimizer steps timed, alone or in whole steps (0: left out)
    variation: float | None      # the timings' standard deviation over their mean

    @property
    def interval(self) -> list[float | None] | None:
        return None if self.low is None else [self.low, self.high]

    @property
    def margin(self) -> float | None:
        """The interval's larger distance from the figure, as a share of it (None: unbounded)."""
        if self.low is None or self.high is None:
            return None
        return max(self.high / self.samples_per_s - 1, 1 - self.low / self.samples_per_s)


def estimate(timings: list[Timing], micro_batch: int, accumulation: int) -> Estimate | None:
    """samples/s of steps of `accumulation` micro-batches of `micro_batch` samples, from the
    timings; None when no timing holds a micro-batch."""
    micro = [t for t in timings if t.micro_batches and not t.steps]
    tails = [t for t in timings if t.steps and not t.micro_batches]
    whole = [t for t in timings if t.steps and t.micro_batches]
    if not micro and not whole:
        return None
    per_micro = sum(t.seconds for t in micro) / sum(t.micro_batches for t in micro) if micro else None
    if tails:
        optimizer = statistics.fmean(t.seconds for t in tails)
    elif per_micro is not None and whole:
        # no step's tail timed alone: what whole steps take beyond their passes
        whole_step = sum(t.seconds for t in whole) / sum(t.steps for t in whole)
        optimizer = max(0.0, whole_step - accumulation * per_micro)
    else:
        optimizer = None
    # One step time per timing: the unit the interval is over.
    steps = [accumulation * t.seconds / t.micro_batches + (optimizer or 0.0) for t in micro]
    steps += [t.seconds / t.steps for t in whole]
    samples = micro_batch * accumulation
    mean = statistics.fmean(steps)
    low = high = variation = None
    if len(steps) >= 2:
        sd = statistics.stdev(steps)
        variation = sd / mean
        half = t95(len(steps) - 1) * sd / math.sqrt(len(steps))
        low = samples / (mean + half)
        high = samples / (mean - half) if mean - half > 0 else None
    return Estimate(samples / mean, low, high, len(steps),
                    sum(t.micro_batches for t in micro + whole), per_micro, optimizer,
                    sum(t.steps for t in tails + whole), variation)


def rates_interval(rates: list[float]) -> tuple[float, float] | None:
    """The 90% confidence interval of the mean of windows' rates (a command's), or None."""
    if len(rates) < 2:
        return None
    mean, sd = statistics.fmean(rates), statistics.stdev(rates)
    half = t95(len(rates) - 1) * sd / math.sqrt(len(rates))
    return max(0.0, mean - half), mean + half

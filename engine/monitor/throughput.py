"""Throughput from reporting windows: a smoothed rate for the ETA and a best that fragments
cannot inflate. Shared by the trainer (engine.train.trainer) and a command's tracker
(engine.command.tracker), so both report the same figures the same way.

Windows differ in length: most are the report interval, but the trainer also reports before
each checkpoint and at the end, and such a fragment can hold one step in 0.05 s (the issue's
6,990/s on a run averaging 317/s), and a few steps per window on a slow model read as rates
a step apart. So:
- the smoothed rate is time-weighted: steps over seconds, with older training time decaying
  over `horizon_s`; a fragment counts for its few milliseconds, not as a whole window;
- the attempt's first window (warm-up: allocation, caches, compilation) counts only until a
  second one comes;
- the best is the best *full* window's (at least `full_window_s` long); until there is one,
  the smoothed rate. Where a window's step count is read late (a command's output, which a
  script may print once a second whatever its step), one step more or less is half a window
  of 2 steps: such windows are pooled until they hold `best_min_steps`, so the best is within
  about one step in that many (mlx-lm at 1.2 steps/s read 1 and 2 steps a window, a best 1.6x
  its true rate).
Pure: no clock, the caller says how long each window was.
"""

from __future__ import annotations

import math

HORIZON_S = 60.0   # the trainer's windows exclude pauses: a minute of training smooths them


class RateMeter:
    __slots__ = ("full_window_s", "horizon_s", "best_min_steps", "_steps", "_samples", "_seconds",
                 "_first", "_best", "_pool", "windows")

    def __init__(self, full_window_s: float, horizon_s: float = HORIZON_S, best_min_steps: float = 1):
        self.full_window_s = full_window_s
        self.horizon_s = horizon_s
        self.best_min_steps = best_min_steps
        self._pool = (0.0, 0.0, 0.0)   # steps, samples, seconds of windows too few steps for a best
        self._steps = self._samples = self._seconds = 0.0   # decayed sums, after the first window
        self._first: tuple[float, float, float] | None = None  # the warm-up window, held aside
        self._best: float | None = None
        self.windows = 0

    def add(self, steps: float, samples: float, seconds: float) -> None:
        """One reporting window: `steps` and `samples` trained in `seconds` of training."""
        if seconds <= 0 or steps <= 0:
            return
        self.windows += 1
        if seconds >= self.full_window_s:
            steps_in, samples_in, seconds_in = (a + b for a, b in zip(self._pool, (steps, samples, seconds)))
            if steps_in >= self.best_min_steps:
                rate = samples_in / seconds_in
                self._best = rate if self._best is None else max(self._best, rate)
                self._pool = (0.0, 0.0, 0.0)
            else:
                self._pool = (steps_in, samples_in, seconds_in)
        if self.windows == 1:
            self._first = (steps, samples, seconds)
            return
        keep = math.exp(-seconds / self.horizon_s)
        self._steps = self._steps * keep + steps
        self._samples = self._samples * keep + samples
        self._seconds = self._seconds * keep + seconds

    def _sums(self) -> tuple[float, float, float]:
        if self._seconds > 0:
            return self._steps, self._samples, self._seconds
        return self._first or (0.0, 0.0, 0.0)

    @property
    def steps_per_s(self) -> float | None:
        steps, _, seconds = self._sums()
        return steps / seconds if seconds > 0 else None

    @property
    def samples_per_s(self) -> float | None:
        _, samples, seconds = self._sums()
        return samples / seconds if seconds > 0 else None

    @property
    def best_samples_per_s(self) -> float | None:
        return self._best if self._best is not None else self.samples_per_s

    def seconds_for(self, steps: float) -> float | None:
        """Training time for `steps` more steps at the smoothed rate."""
        rate = self.steps_per_s
        return max(0.0, steps) / rate if rate else None

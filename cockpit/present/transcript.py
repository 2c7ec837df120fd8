"""A run's events folded into the lines a person reads, in a log file's rhythm: every event worth
a line (eval, checkpoint, crash, fallback, warnings), a progress line at most every
`log_every_s` seconds of the run's own clock (the events' times), the first and last of each
attempt. A five-hour run is a few hundred lines, not tens of thousands.

Live (a terminal), there are no progress lines: `status()` is the line redrawn in place, and an
attempt's end keeps it as a line. While a mining pass or an eval runs (minutes on a big bank, no
step at all) the progress says so instead of only "no step". Before an attempt's first step (a
model loading, a first step compiling for minutes) it says how long it has been waiting:
'attempt 2: no step yet (1m30s)'.

The figures are the run's read model's (engine.record.state: the newest memory sample, the
attempt's step windows, the pass or eval under way, the main metric), folded with each event;
a transcript keeps only what it has shown. The headless printer writes a transcript to its
stream; the TUI's log view shows one.
"""

from __future__ import annotations

from typing import Callable

from cockpit.present.lines import human_line, status_line, step_line
from cockpit.present.words import activity_text, duration
from engine.record.state import MainMetric, RunState

LOG_EVERY_S = 30.0


def _quiet(step: dict, t: float) -> float | None:
    """How long there has been no step as of `t`, when that is unusual for this run (longer than
    10 s and three of its windows)."""
    gap = t - step["t"]
    return gap if gap > max(10.0, 3 * (step.get("window_s") or 0.0)) else None


class Transcript:
    """`see(event)` gives the event's lines. `live`: no progress lines, the status line instead,
    laid out in `width()` columns (asked at each status: a terminal can be resized). Progress
    carries the run's main metric (a reward, a recall) from its steps or evals: the one the
    preset names (`main_metric`, run.toml's), else the first reward-like or recall-like name."""

    def __init__(self, *, live: bool = False, log_every_s: float = LOG_EVERY_S,
                 width: Callable[[], int] = lambda: 80, main_metric: str = ""):
        self.live = live
        self.state = RunState(main_metric=main_metric)   # the run as its events tell it
        self.log_every_s = log_every_s
        self.width = width
        self.step: dict | None = None        # the attempt's newest step event, until its end is shown
        self.started: dict | None = None     # the attempt's attempt_started (its wait for a first step)
        self.logged_t: float | None = None   # the event time of the last progress line written
        self.logged: dict | None = None      # the step it showed

    def see(self, e: dict) -> list[str]:
        kind = e["type"]
        self.state.add(e)
        if kind == "memory":
            return self._progress(e["t"], stalled=True) if not self.live else []
        if kind == "step":
            self.step = e
            return self._progress(e["t"]) if not self.live else []
        if kind in ("heartbeat", "mining_started", "eval_started"):
            return []
        lines = []
        if kind in ("crash", "attempt_started", "attempt_ended", "run_finished"):
            lines += self._end_attempt()
        if kind == "attempt_started":
            self.started = e
        line = human_line(e, self.state.memory)
        return lines + ([line] if line is not None else [])

    def main(self) -> MainMetric | None:
        """The main metric and its newest value, or None where there is none (yet)."""
        return self.state.main

    def _progress(self, t: float, stalled: bool = False) -> list[str]:
        """Not live: the attempt's first step, then one line per log_every_s of event time;
        before the first step, one per log_every_s saying how long the attempt has waited."""
        step = self.step
        if step is None:
            return self._waiting(t) if stalled else []
        if self.logged is not None and self.logged_t is not None and t - self.logged_t < self.log_every_s:
            return []
        line = step_line(step, self.state.memory, self.state.windows, self.main())
        if stalled and self.state.activity is not None:
            line += f"  ({activity_text(self.state.activity, t)})"
        elif stalled and (quiet := _quiet(step, t)) is not None:
            line += f"  (no step for {duration(quiet)}{self._group_text('; ')})"
        self.logged_t, self.logged = t, step
        return [line]

    def _waiting(self, t: float) -> list[str]:
        """Not live, no step yet: a line once the attempt (or its mining pass) has waited
        log_every_s since it began or since the last such line."""
        begun = self.state.activity or self.started
        if begun is None or t - (self.logged_t if self.logged_t is not None else begun["t"]) < self.log_every_s:
            return []
        self.logged_t = t
        return [self._before_first_step(t)]

    def _before_first_step(self, now: float | None) -> str:
        """'mining hard negatives for epoch 0 (40s)', 'attempt 1: no step yet (1m30s)', or ''."""
        if self.state.activity is not None:
            return activity_text(self.state.activity, now)
        if self.started is None or now is None or now - self.started["t"] < 1:
            return ""
        waiting = f"first step, {self._group_text()}" if self.state.group else "no step yet"
        return f"attempt {self.started.get('attempt', '?')}: {waiting} ({duration(now - self.started['t'])})"

    def _group_text(self, before: str = "") -> str:
        """'12/64 micro-batches': how far a long accumulation group is, from its heartbeats."""
        g = self.state.group
        return f"{before}{g['micro_batches']}/{g.get('of', '?')} micro-batches" if g else ""

    def _end_attempt(self) -> list[str]:
        """Where the attempt got to: the live line kept, or its last step written."""
        step = self.step
        line = None if step is None else self.status() if self.live else \
            None if step is self.logged else step_line(step, self.state.memory, self.state.windows, self.main())
        self.step, self.logged_t, self.logged, self.started = None, None, None, None
        return [line] if line else []

    def status(self) -> str:
        """The live line: the step's progress, or before the first step how long it has waited."""
        now = self.state.memory["t"] if self.state.memory is not None else None
        if self.step is None:  # loading, compiling, or a schedule that mines from epoch 0
            return self._before_first_step(now)
        quiet = _quiet(self.step, now) if now is not None else None
        activity = activity_text(self.state.activity, now) if self.state.activity is not None else \
            f"no step for {duration(quiet)}{self._group_text('; ')}" if quiet is not None and self.state.group else None
        return status_line(self.step, self.state.memory, self.state.windows, quiet, self.width(), activity, self.main())

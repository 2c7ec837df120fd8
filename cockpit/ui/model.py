"""What the dashboard shows: a view of the run's read model (engine.record.state).

The model is the run's one fold of its events -- status, step, attempts, rates, averages, main
metric -- and what a screen keeps besides: the plotted series, the log, the crash marks, the
recent warnings. No Textual here: the dashboard, the replay test and benchmarks/ui_events.py
share it. A fold says what changed in the model's own terms (Change); the dashboard decides
what to repaint. Memory
stays bounded however long the run: each plotted series keeps at most MAX_POINTS points
(when full it drops every other one and from then on keeps every second new point, so the
plot still spans the whole run), the log keeps LOG_LINES lines, warnings WARNINGS.
"""

from __future__ import annotations

import math
from collections import deque
from enum import Flag, auto
from typing import Callable, cast

from cockpit.present.lines import human_line as _human_line
from engine.event_types import MemoryFields
from engine.numbers import rate
from engine.record.state import AttemptState, RunState

MAX_POINTS = 256
RECENT_POINTS = 1024   # ~8 minutes of step events at 2 a second
LOG_LINES = 200
WARNINGS = 20


class Change(Flag):
    """What a fold changed, in the model's terms."""

    RUN = auto()        # the run's status, names, start or end, or which attempt runs where
    ATTEMPTS = auto()   # the attempts: one began, learned its device, stepped, crashed, ended, fell back
    PROGRESS = auto()   # step, loss, rates, ETA, eval metrics, a mining pass or an eval under way
    SERIES = auto()     # a plotted series got a point, a crash or a health finding its mark
    MEMORY = auto()     # a memory sample, or the device's memory with a step
    WARNINGS = auto()   # a warning
    LOG = auto()        # log lines


NOTHING = Change(0)


class Series:
    """A decimating (x, y) series of bounded length that always ends at the newest point."""

    __slots__ = ("x", "y", "cap", "stride", "_count", "last", "recent")

    def __init__(self, cap: int = MAX_POINTS):
        self.x: list[float] = []
        self.y: list[float] = []
        self.cap = cap
        self.stride = 1        # keep every stride-th point offered
        self._count = 0
        self.last: tuple[float, float] | None = None
        # The newest points, every one: a plot of the last minutes stays sharp however long
        # the run (the decimated points thin out as it grows).
        self.recent: deque[tuple[float, float]] = deque(maxlen=RECENT_POINTS)

    def add(self, x: float, y: float) -> None:
        self.last = (x, y)
        self.recent.append(self.last)
        self._count += 1
        if self._count % self.stride:
            return
        self.x.append(x)
        self.y.append(y)
        if len(self.x) >= self.cap:
            del self.x[1::2], self.y[1::2]
            self.stride *= 2

    def points(self, since: float | None = None) -> tuple[list[float], list[float]]:
        """The kept points plus the newest one, so the line reaches 'now'; with `since`, those
        at x >= since, every one of the newest RECENT_POINTS among them."""
        if since is not None:
            cut = self.recent[0][0] if self.recent else math.inf
            older = [(x, y) for x, y in zip(self.x, self.y) if since <= x < cut]
            newer = [p for p in self.recent if p[0] >= since]
            return [x for x, _ in older + newer], [y for _, y in older + newer]
        if self.last is not None and (not self.x or self.x[-1] != self.last[0]):
            return self.x + [self.last[0]], self.y + [self.last[1]]
        return self.x, self.y

    def __len__(self) -> int:
        return len(self.x)


# One attempt of the run, as the attempts panel shows it: where it ran, how it ended, what came next.
Attempt = AttemptState


class RunModel(RunState):
    """The run's read model, and what the dashboard keeps besides: its plotted series, log,
    crash marks and recent warnings, and whether the supervisor lives."""

    def __init__(self, run_id: str = "", main_metric: str = ""):
        super().__init__(run_id, main_metric)
        self.live: bool | None = None     # the supervisor's process is alive (None: not known yet)
        self.warnings: deque = deque(maxlen=WARNINGS)
        self.log: deque = deque(maxlen=LOG_LINES)
        self.log_total = 0                # lines ever logged, so a screen can tell which are new
        self.samples_series = Series()
        self.steps_series = Series()
        self.loss_series = Series()
        self.lr_series = Series()
        self.eval_series: dict[str, Series] = {}    # per metric, x as loss_series
        self.marks: list[tuple[float, str]] = []    # crashes, at run time x

    @property
    def memory_sample(self) -> MemoryFields | None:
        """The newest memory sample (RunState.memory: the memory event), read as its fields
        are typed (engine.event_types); a field an older run lacks is still read with .get."""
        return cast("MemoryFields | None", self.memory)

    # The live figures are the last full window's (RunState.now); the avg_ ones the run's, over
    # time spent training (RunState.averages).

    @property
    def samples_per_s(self) -> float | None:
        return self.now.samples_per_s

    @property
    def steps_per_s(self) -> float | None:
        return self.now.steps_per_s

    @property
    def tokens_per_s(self) -> float | None:
        return self.now.tokens_per_s

    @property
    def smoothed_samples_per_s(self) -> float | None:
        return self.now.smoothed_samples_per_s

    @property
    def gflop_s(self) -> float | None:
        return self.now.gflop_s

    @property
    def mfu(self) -> float | None:
        return self.now.mfu

    @property
    def avg_samples_per_s(self) -> float | None:
        """samples trained / time spent training; None where the samples per step are not known."""
        return self.averages.samples_per_s

    @property
    def avg_steps_per_s(self) -> float | None:
        return self.averages.steps_per_s

    @property
    def avg_gflop_s(self) -> float | None:
        """Over the same training time as avg_samples_per_s."""
        return self.averages.gflop_s

    @property
    def mining_active(self) -> bool:
        """A mining pass is under way (mining_started, no mining yet)."""
        return self.activity is not None and self.activity.get("type") == "mining_started"

    @property
    def eval_active(self) -> bool:
        """An eval is under way (eval_started, no eval or step yet)."""
        return self.activity is not None and self.activity.get("type") == "eval_started"

    # ------------------------------------------------------------ folding

    def fold(self, events: list[dict]) -> Change:
        """Fold events in order into the read model; returns what changed on screen."""
        changed = NOTHING
        for e in events:
            self.add(e)
            view = _VIEW.get(e.get("type"))   # type: ignore[arg-type]
            if view is not None:
                changed |= view(self, e)
        return changed

    def elapsed(self, t: float | None) -> float:
        return 0.0 if t is None or self.started_t is None else t - self.started_t

    def _say(self, e: dict, text: str | None) -> None:
        if not text:
            return
        stamp = _clock(self.elapsed(e.get("t")))
        for i, line in enumerate(text.rstrip().splitlines()):
            self.log.append(f"{stamp if i == 0 else ' ' * len(stamp)} {line}")
            self.log_total += 1

    # ------------------------------------------------------------ derived

    def duration_s(self, now: float) -> float | None:
        if self.started_t is None:
            return None
        return (self.ended_t or (now if self.live else self.newest_t) or self.started_t) - self.started_t

    def set_live(self, live: bool) -> bool:
        """The follower's word on the supervisor; a run that stopped writing and has none is lost."""
        if live == self.live:
            return False
        self.live = live
        if not live and self.status in ("created", "running") and self.started_t is not None:
            self.status = "lost"
        return True


def human_line(e: dict) -> str | None:
    """headless's line for the event; an event from an older or newer writer that lacks a
    field it reads gets no line rather than breaking the screen."""
    try:
        return _human_line(e)
    except (KeyError, TypeError, ValueError):
        return None


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:2d}:{s:02d}"


def warning_text(e: dict) -> str:
    advice = e.get("advice") or []
    lines = [f"warning ({e.get('kind', '?')}): {e.get('message', '')}"]
    for a in advice:
        text = a.get("text") if isinstance(a, dict) else str(a)
        sets = a.get("set") if isinstance(a, dict) else None
        lines.append(f"  try: {text}" + (f"  (--set {' '.join(sets)})" if sets else ""))
    return "\n".join(lines)


# ------------------------------------------- what each event adds to the screen, past the read model


def _logged(changes: Change) -> Callable[[RunModel, dict], Change]:
    """An event whose line (headless's) goes to the log."""

    def view(m: RunModel, e: dict) -> Change:
        m._say(e, human_line(e))
        return changes

    return view


def _attempt_started(m: RunModel, e: dict) -> Change:
    if e.get("command_line"):  # a command: no trainer_ready will say where it runs
        m._say(e, human_line(e))
    else:
        m._say(e, f"attempt {e.get('attempt')} starts on preset {e.get('preset')}")
    return Change.RUN | Change.ATTEMPTS | Change.LOG


# ATTEMPTS: the running attempt's last step moves with every step
_STEP_CHANGES = Change.PROGRESS | Change.SERIES | Change.ATTEMPTS
_STEP_CHANGES_DEVICE = _STEP_CHANGES | Change.MEMORY


def _step(m: RunModel, e: dict) -> Change:
    # The hot path of a replay: one series append each.
    t = e.get("t")
    x = t - m.started_t if t is not None and m.started_t is not None else 0.0
    if not e.get("partial"):  # a window cut short by a checkpoint or the end: its rate is noise
        now = m.now
        if now.samples_per_s is not None:
            m.samples_series.add(x, now.samples_per_s)
        if now.steps_per_s is not None:
            m.steps_series.add(x, now.steps_per_s)
    if m.loss is not None and math.isfinite(m.loss):
        m.loss_series.add(x, m.loss)
    if m.lr is not None:
        m.lr_series.add(x, m.lr)
    return _STEP_CHANGES_DEVICE if m.device_memory else _STEP_CHANGES


def _eval(m: RunModel, e: dict) -> Change:
    x = m.elapsed(e.get("t"))
    for name, value in m.metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            m.eval_series.setdefault(name, Series()).add(x, float(value))
    m._say(e, human_line(e))
    return Change.PROGRESS | Change.SERIES | Change.LOG


def _mining(m: RunModel, e: dict) -> Change:
    # No line for mining_started: the mining event that ends the pass says what it did and how long.
    if e.get("mode", "none") == "none":
        return Change.PROGRESS  # an epoch the schedule does not mine
    m._say(e, human_line(e))
    return Change.PROGRESS | Change.LOG


def _checkpoint(m: RunModel, e: dict) -> Change:
    at = f" at step {e['step']}" if e.get("step") is not None else ""
    m._say(e, f"checkpoint{at} ({e.get('path', '')})")
    return Change.LOG


def _warning(m: RunModel, e: dict) -> Change:
    m.warnings.append(e)
    m._say(e, warning_text(e))
    return Change.WARNINGS | Change.LOG


def _crash(m: RunModel, e: dict) -> Change:
    m.marks.append((m.elapsed(e.get("t")), e.get("kind", "crash")))
    m._say(e, human_line(e))
    return Change.ATTEMPTS | Change.SERIES | Change.LOG


def _health(m: RunModel, e: dict) -> Change:
    # (RunState.health keeps the finding: the loss plot's marker and the attempts panel's line)
    m._say(e, human_line(e))
    return Change.ATTEMPTS | Change.SERIES | Change.LOG


def _attempt_ended(m: RunModel, e: dict) -> Change:
    m._say(e, human_line(e) or f"attempt {e.get('attempt')} ended: {e.get('outcome')} ({e.get('exit', '')})")
    return Change.RUN | Change.ATTEMPTS | Change.LOG


def _run_failed(m: RunModel, e: dict) -> Change:
    m._say(e, f"no further attempt: {e.get('why') or e.get('reason')}")
    return Change.ATTEMPTS | Change.LOG


def _just(changes: Change) -> Callable[[RunModel, dict], Change]:
    return lambda m, e: changes


_VIEW: dict[str, Callable[[RunModel, dict], Change]] = {
    "run_started": _logged(Change.RUN | Change.LOG), "run_resumed": _logged(Change.RUN | Change.LOG),
    "supervisor_lost": _logged(Change.LOG), "run_interrupted": _logged(Change.RUN | Change.PROGRESS | Change.LOG),
    "attempt_started": _attempt_started,
    "trainer_ready": _logged(Change.RUN | Change.ATTEMPTS | Change.PROGRESS | Change.LOG),
    "step": _step, "eval_started": _just(Change.PROGRESS), "eval": _eval,
    "mining_started": _just(Change.PROGRESS), "mining": _mining, "checkpoint": _checkpoint,
    "memory": _just(Change.MEMORY), "warning": _warning, "health": _health, "crash": _crash,
    "attempt_ended": _attempt_ended,
    "fallback": _logged(Change.ATTEMPTS | Change.LOG), "run_failed": _run_failed, "nodes_changed": _logged(Change.LOG),
    "threads": _logged(Change.LOG),
    "run_finished": _logged(Change.RUN | Change.PROGRESS | Change.LOG), "fault_injected": _logged(Change.LOG),
}


def rate_text(value: float | None, unit: str) -> str:
    return f"- {unit}" if value is None else f"{rate(value)} {unit}"


__all__ = ["RunModel", "Change", "Attempt", "Series", "rate_text", "warning_text"]

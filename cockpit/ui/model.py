"""What the dashboard shows, folded from a run's events.

No Textual here: the dashboard, the replay test and benchmarks/ui_events.py share it. A fold
says what changed in the model's own terms (Change); the dashboard decides what to repaint. Memory
stays bounded however long the run: each plotted series keeps at most MAX_POINTS points
(when full it drops every other one and from then on keeps every second new point, so the
plot still spans the whole run), the log keeps LOG_LINES lines, warnings WARNINGS.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import Flag, auto

from cockpit.present.lines import human_line as _human_line
from engine.record.metrics import choose_main_metric, shown_metrics
from engine.record.stats import Averages, RunStats, samples_known

MAX_POINTS = 256
RECENT_POINTS = 1024   # ~8 minutes of step events at 2 a second
LOG_LINES = 200
WARNINGS = 20


class Change(Flag):
    """What a fold changed, in the model's terms."""

    RUN = auto()        # the run's status, names, start or end, or which attempt runs where
    ATTEMPTS = auto()   # the attempts: one began, learned its device, stepped, crashed, ended, fell back
    PROGRESS = auto()   # step, loss, rates, ETA, eval metrics, a mining pass or an eval under way
    SERIES = auto()     # a plotted series got a point, or a crash its mark
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


@dataclass
class Attempt:
    """One trainer process of the run: where it ran, how it ended, what came next."""

    attempt: int
    preset: str
    device: str | None = None
    precision: str | None = None
    batch: str = ""                   # "32 x 4"
    outcome: str = "running"
    exit: str = ""
    last_step: int | None = None
    windows: int = 0                  # step windows seen: its ETA settles after a few
    resumed_from: dict | None = None  # {step, samples_seen} when it resumed from a checkpoint
    crash: dict | None = None         # its crash event
    fallback: dict | None = None      # the fallback event that followed it
    failed_why: str | None = None     # run_failed's reason, when no attempt followed


@dataclass
class RunModel:
    run_id: str = ""
    workload: str = "?"
    device_preset: str = "?"
    status: str = "created"           # engine.record.rundir.RunSummary's statuses
    live: bool | None = None          # the supervisor's process is alive (None: not known yet)
    started_t: float | None = None
    ended_t: float | None = None
    newest_t: float | None = None     # the newest event's time: the benchmark's lag reference
    events_seen: int = 0
    step: int = 0
    total: int = 0
    samples_seen: int = 0
    total_samples: int = 0
    epoch: int | None = None
    loss: float | None = None
    # the last full reporting window's (the live figure); samples None where a command's
    # samples per step are not known (units), tokens where its tokens per step are
    samples_per_s: float | None = None
    steps_per_s: float | None = None
    tokens_per_s: float | None = None
    smoothed_samples_per_s: float | None = None  # recent windows, by time (engine.monitor.throughput)
    gflop_s: float | None = None
    units: dict | None = None         # a command's, from its last step (None: the trainer's, exact)
    mfu: float | None = None          # model FLOP utilisation, where the GPU's peak is known
    lr: float | None = None
    eta_s: float | None = None
    device_memory: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)   # the last eval's, as shown (shown_metrics)
    eval_step: int | None = None
    main_metric: str = ""             # the preset's main_metric ('' = the default choice)
    reported: dict = field(default_factory=dict)  # each metric's newest value, from steps and evals
    mining: dict | None = None        # the latest mining event (index, recall vs exact, timings)
    mining_active: bool = False       # a mining pass is under way (mining_started, no mining yet)
    eval_active: bool = False         # an eval is under way (eval_started, no eval or step yet)
    memory: dict | None = None        # the latest memory event
    warnings: deque = field(default_factory=lambda: deque(maxlen=WARNINGS))
    attempts: list[Attempt] = field(default_factory=list)
    log: deque = field(default_factory=lambda: deque(maxlen=LOG_LINES))
    log_total: int = 0                # lines ever logged, so a screen can tell which are new
    samples_series: Series = field(default_factory=Series)
    steps_series: Series = field(default_factory=Series)
    loss_series: Series = field(default_factory=Series)
    lr_series: Series = field(default_factory=Series)
    eval_series: dict[str, Series] = field(default_factory=dict)  # per metric, x as loss_series
    marks: list[tuple[float, str]] = field(default_factory=list)  # crashes, at run time x
    stats: RunStats = field(default_factory=RunStats, repr=False)  # behind the avg_* figures

    @property
    def averages(self) -> Averages:
        """The run's averages so far, over time spent training (engine.record.stats)."""
        return self.stats.result()

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
    def samples_known(self) -> bool:
        return samples_known(self.units)

    @property
    def main(self) -> tuple[str, float | None] | None:
        """(the run's main metric, its newest value): a reward, a recall (choose_main_metric)."""
        name = choose_main_metric(self.reported, self.main_metric)
        return None if name is None else (name, self.reported.get(name))

    @property
    def steps_lost(self) -> int:
        """Steps trained again after crashes: the run's one accounting's (engine.record.stats),
        current with every event folded."""
        return self.stats.steps_lost

    # ------------------------------------------------------------ folding

    def fold(self, events: list[dict]) -> Change:
        """Apply events in order; returns what changed."""
        changed = NOTHING
        for e in events:
            self.events_seen += 1
            t = e.get("t")
            if t is not None:
                self.newest_t = t
            kind = e.get("type")
            if kind != "memory":  # a second's sample, the commonest event: nothing to average
                self.stats.add(e)
            handler = _HANDLERS.get(kind)
            if handler is not None:
                changed |= handler(self, e)
        return changed

    def elapsed(self, t: float | None) -> float:
        return 0.0 if t is None or self.started_t is None else t - self.started_t

    def _current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    def _say(self, e: dict, text: str | None) -> None:
        if not text:
            return
        stamp = _clock(self.elapsed(e.get("t")))
        for i, line in enumerate(text.rstrip().splitlines()):
            self.log.append(f"{stamp if i == 0 else ' ' * len(stamp)} {line}")
            self.log_total += 1

    # ------------------------------------------------------------ derived

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.total) if self.total else 0.0

    @property
    def finished(self) -> bool:
        return self.status in ("finished", "failed", "stopped", "interrupted", "lost", "ended", "released")

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


def bytes_text(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return "-"


def warning_text(e: dict) -> str:
    advice = e.get("advice") or []
    lines = [f"warning ({e.get('kind', '?')}): {e.get('message', '')}"]
    for a in advice:
        text = a.get("text") if isinstance(a, dict) else str(a)
        sets = a.get("set") if isinstance(a, dict) else None
        lines.append(f"  try: {text}" + (f"  (--set {' '.join(sets)})" if sets else ""))
    return "\n".join(lines)


# ---------------------------------------------------------------- one function per event type


def _run_started(m: RunModel, e: dict) -> Change:
    m.run_id = m.run_id or e.get("run", "")   # the directory's name wins: a moved run's id
    m.workload, m.device_preset = e.get("workload", m.workload), e.get("device_preset", m.device_preset)
    m.started_t, m.status = e.get("t"), "running"
    m._say(e, human_line(e))
    return Change.RUN | Change.LOG


def _run_resumed(m: RunModel, e: dict) -> Change:
    m.status, m.ended_t = "running", None
    m._say(e, human_line(e))
    return Change.RUN | Change.LOG


def _supervisor_lost(m: RunModel, e: dict) -> Change:
    m._say(e, human_line(e))
    return Change.LOG


def _run_interrupted(m: RunModel, e: dict) -> Change:
    m.status, m.ended_t = "interrupted", e.get("t")
    m.eta_s = None
    m._say(e, human_line(e))
    return Change.RUN | Change.PROGRESS | Change.LOG


def _attempt_started(m: RunModel, e: dict) -> Change:
    config = e.get("config") or {}
    m.attempts.append(Attempt(attempt=e.get("attempt", len(m.attempts) + 1), preset=e.get("preset", "?"),
                              batch=f"{config.get('batch_size', '?')} x {config.get('accumulation', '?')}"))
    if e.get("command_line"):  # a command: no trainer_ready will say where it runs
        m.attempts[-1].device, m.attempts[-1].precision = e.get("device"), e.get("precision")
        m.attempts[-1].resumed_from = e.get("resume")
        m._say(e, human_line(e))
    else:
        m._say(e, f"attempt {e.get('attempt')} starts on preset {e.get('preset')}")
    return Change.RUN | Change.ATTEMPTS | Change.LOG


def _trainer_ready(m: RunModel, e: dict) -> Change:
    a = m._current()
    if a is not None:
        a.device, a.precision = e.get("device"), e.get("precision")
        a.batch = f"{e.get('batch_size', '?')} x {e.get('accumulation', '?')}"
        a.resumed_from = e.get("resumed_from")
    m.total = e.get("total_steps", m.total)
    m._say(e, human_line(e))
    return Change.RUN | Change.ATTEMPTS | Change.PROGRESS | Change.LOG


# ATTEMPTS: the running attempt's last step moves with every step
_STEP_CHANGES = Change.PROGRESS | Change.SERIES | Change.ATTEMPTS
_STEP_CHANGES_DEVICE = _STEP_CHANGES | Change.MEMORY


def _step(m: RunModel, e: dict) -> Change:
    # The hot path of a replay: plain lookups, one series append each.
    get = e.get
    m.step, m.total = get("step", m.step), get("total") or m.total  # a command may not say
    m.samples_seen, m.total_samples = get("samples_seen", m.samples_seen), get("total_samples", m.total_samples)
    m.epoch, m.loss = get("epoch", m.epoch), get("loss", m.loss)
    m.eta_s = get("eta_s")
    m.lr = get("lr", m.lr)
    m.device_memory = get("device_memory") or {}
    m.mining_active = m.eval_active = False  # training again: any pass or eval is over
    m.units = get("units", m.units)
    if metrics := get("metrics"):
        _report(m, metrics)
    t = get("t")
    x = t - m.started_t if t is not None and m.started_t is not None else 0.0
    partial = get("partial")  # a window cut short by a checkpoint or the end: its rate is noise
    if not partial:
        m.samples_per_s, m.steps_per_s = get("samples_per_s"), get("steps_per_s")
        m.tokens_per_s = get("tokens_per_s")
        m.smoothed_samples_per_s, m.gflop_s = get("smoothed_samples_per_s"), get("gflop_s")
        m.mfu = get("mfu")
    if m.samples_per_s is not None and not partial:
        m.samples_series.add(x, m.samples_per_s)
    if m.steps_per_s is not None and not partial:
        m.steps_series.add(x, m.steps_per_s)
    if m.loss is not None and math.isfinite(m.loss):
        m.loss_series.add(x, m.loss)
    if m.lr is not None:
        m.lr_series.add(x, m.lr)
    if m.attempts:
        m.attempts[-1].last_step = m.step
        m.attempts[-1].windows += 1
    return _STEP_CHANGES_DEVICE if m.device_memory else _STEP_CHANGES


def _eval_started(m: RunModel, e: dict) -> Change:
    m.eval_active = True
    return Change.PROGRESS


def _eval(m: RunModel, e: dict) -> Change:
    m.eval_active = False
    m.metrics, m.eval_step = shown_metrics(e.get("metrics") or {}), e.get("step")
    _report(m, m.metrics)
    x = m.elapsed(e.get("t"))
    for name, value in m.metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            m.eval_series.setdefault(name, Series()).add(x, float(value))
    m._say(e, human_line(e))
    return Change.PROGRESS | Change.SERIES | Change.LOG


def _report(m: RunModel, metrics: dict) -> None:
    for name, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            m.reported[name] = value


def _mining_started(m: RunModel, e: dict) -> Change:
    # No log line: the mining event that ends the pass says what it did, and how long it took.
    m.mining_active = True
    return Change.PROGRESS


def _mining(m: RunModel, e: dict) -> Change:
    m.mining_active = False
    if e.get("mode", "none") == "none":
        return Change.PROGRESS  # an epoch the schedule does not mine
    m.mining = e
    m._say(e, human_line(e))
    return Change.PROGRESS | Change.LOG


def _checkpoint(m: RunModel, e: dict) -> Change:
    at = f" at step {e['step']}" if e.get("step") is not None else ""
    m._say(e, f"checkpoint{at} ({e.get('path', '')})")
    return Change.LOG


def _memory(m: RunModel, e: dict) -> Change:
    m.memory = e
    return Change.MEMORY


def _warning(m: RunModel, e: dict) -> Change:
    m.warnings.append(e)
    m._say(e, warning_text(e))
    return Change.WARNINGS | Change.LOG


def _crash(m: RunModel, e: dict) -> Change:
    m.mining_active = m.eval_active = False
    a = m._current()
    if a is not None:
        a.crash = e
    m.marks.append((m.elapsed(e.get("t")), e.get("kind", "crash")))
    m._say(e, human_line(e))
    return Change.ATTEMPTS | Change.SERIES | Change.LOG


def _attempt_ended(m: RunModel, e: dict) -> Change:
    a = next((a for a in reversed(m.attempts) if a.attempt == e.get("attempt")), None)
    if a is not None:
        a.outcome, a.exit = e.get("outcome", "?"), e.get("exit", "")
        a.last_step = e.get("last_step", a.last_step)
    m.mining_active = m.eval_active = False
    m._say(e, human_line(e) or f"attempt {e.get('attempt')} ended: {e.get('outcome')} ({e.get('exit', '')})")
    return Change.RUN | Change.ATTEMPTS | Change.LOG


def _fallback(m: RunModel, e: dict) -> Change:
    a = next((a for a in reversed(m.attempts) if a.attempt == e.get("attempt")), None)
    if a is not None:
        a.fallback = e
    m._say(e, human_line(e))
    return Change.ATTEMPTS | Change.LOG


def _run_failed(m: RunModel, e: dict) -> Change:
    a = m._current()
    if a is not None:
        a.failed_why = e.get("why") or e.get("reason")
    m._say(e, f"no further attempt: {e.get('why') or e.get('reason')}")
    return Change.ATTEMPTS | Change.LOG


def _run_finished(m: RunModel, e: dict) -> Change:
    m.status, m.ended_t = e.get("status", "?"), e.get("t")
    m.eta_s = None
    m.mining_active = m.eval_active = False
    m._say(e, human_line(e))
    return Change.RUN | Change.PROGRESS | Change.LOG


def _fault_injected(m: RunModel, e: dict) -> Change:
    m._say(e, human_line(e))
    return Change.LOG


_HANDLERS = {
    "run_started": _run_started, "attempt_started": _attempt_started,
    "trainer_ready": _trainer_ready, "step": _step, "eval": _eval, "checkpoint": _checkpoint,
    "memory": _memory, "warning": _warning, "crash": _crash, "attempt_ended": _attempt_ended,
    "fallback": _fallback, "run_failed": _run_failed, "run_finished": _run_finished,
    "fault_injected": _fault_injected, "run_resumed": _run_resumed,
    "mining_started": _mining_started, "mining": _mining, "eval_started": _eval_started,
    "run_interrupted": _run_interrupted, "supervisor_lost": _supervisor_lost,
}


def rate_text(value: float | None, unit: str) -> str:
    if value is None:
        return f"- {unit}"
    return f"{value:,.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"


__all__ = ["RunModel", "Change", "Attempt", "Series", "bytes_text", "rate_text", "warning_text"]

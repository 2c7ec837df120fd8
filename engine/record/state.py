"""A run as its events tell it: the one read model of events.jsonl.

Every reader of a run's events folds them here, one event at a time (`RunState.add`), and reads
typed figures rather than event fields: summarize() and the runs screen's digest (so `cockpit
runs show/list/compare`: engine.record.rundir's RunSummary is this, as a record), the headless
lines (cockpit.present.transcript), the TUI's model (cockpit.ui.model: a view of this one with
its plotted series and its log) and resume's History (engine.run.resume). The run's accounting
-- throughput over time spent training, steps lost, goodput -- is engine.record.stats', folded
here with every event; run_finished's summary is that accounting's.

One definition of each figure:

    step        the newest step event's, raised to where an attempt's end says it got
    total       the trainer's schedule (trainer_ready), else the newest step that says one
    now         the rates of the last full reporting window: a fragment (`partial`, cut short
                by a checkpoint or the end) is left out, its rate is noise
    averages    samples (steps) trained over time spent training, all attempts
                (engine.record.stats); `Averages.rate` is the one figure a column shows
    main        the metric the run is judged by besides its loss (engine.record.metrics), its
                newest value from a step or an eval, and the step it came at
    activity    the mining pass or eval under way (its *_started event), until a step, its
                result, a crash or the attempt's end

A reader that must not read on past a malformed event (summarize(): the run is 'broken') calls
`require(e)` before `add(e)`; the TUI and the headless lines read on. Pure: no I/O, no clock;
it stays small however long the run (the newest of each figure, and a record per attempt,
checkpoint and fallback).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, NamedTuple

from engine.record.goodput import Goodput
from engine.record.metrics import choose_main_metric, shown_metrics
from engine.record.stats import Averages, RunStats, samples_known

# The fields a run's summary cannot do without, by event type: reading a run dir, an event
# lacking one makes the run 'broken' (engine.record.rundir.broken) rather than a wrong summary.
REQUIRED: dict[str, tuple[str, ...]] = {
    "run_started": ("t",), "run_resumed": ("t",), "attempt_started": ("attempt",), "step": ("step",),
    "run_finished": ("status", "t"), "run_interrupted": ("t",)}

# A run's statuses once it has ended (engine.record.rundir.RunSummary's): an adopted run's
# 'ended' and 'released' too, 'lost' (its supervisor died and nothing has said so) and
# 'preempted' (its time on a machine ended: a SLURM job's, requeued to go on from its checkpoint)
ENDED = ("finished", "failed", "stopped", "interrupted", "lost", "ended", "released", "preempted")


def require(e: dict) -> dict:
    """The event, if it has what a summary needs of it; KeyError naming the field it lacks."""
    for key in REQUIRED.get(e["type"], ()):
        if key not in e:
            raise KeyError(key)
    return e


class MainMetric(NamedTuple):
    """The metric a run is judged by besides its loss; value None until it is reported."""

    name: str
    value: float | None
    step: int | None


@dataclass(slots=True)
class Rates:
    """One reporting window's figures: samples/s None where a command's samples per step are
    not known, tokens/s where its tokens per step are not."""

    samples_per_s: float | None = None
    steps_per_s: float | None = None
    tokens_per_s: float | None = None
    smoothed_samples_per_s: float | None = None  # recent windows, by time (engine.monitor.throughput)
    gflop_s: float | None = None
    mfu: float | None = None                     # model FLOP utilisation, where the peak is known


@dataclass(slots=True)
class AttemptState:
    """One attempt of the run: where it ran, how far it got, how it ended, what came next."""

    attempt: int | None
    preset: str = "?"
    device: str | None = None         # a command's from attempt_started, the trainer's from trainer_ready
    precision: str | None = None
    batch: str = ""                   # "32 x 4"
    outcome: str = "running"          # attempt_ended's outcome
    exit: str = ""                    # "exit 3", "SIGABRT"
    last_step: int | None = None      # its newest step, or where its end says it got
    windows: int = 0                  # step windows seen: its ETA settles after a few
    stops: int = 0                    # stop requests it has had (a second one stops it at once)
    resumed_from: dict | None = None  # {step, samples_seen, path} when it resumed from a checkpoint
    started: dict | None = None       # its attempt_started event (its preset's table as it ran)
    crash: dict | None = None         # its crash event
    fallback: dict | None = None      # the fallback event that followed it
    failed_why: str | None = None     # run_failed's reason, when no attempt followed
    refused: str | None = None        # attempt_ended's sentence: a configuration its launcher refused

    @property
    def sentence(self) -> str | None:
        """Its crash in a sentence, when it crashed (or the configuration it refused)."""
        return self.crash.get("sentence") if self.crash is not None else self.refused


class RunState:
    """A run's figures, folded one event at a time (`add`), read at any moment."""

    def __init__(self, run_id: str = "", main_metric: str = ""):
        self.run_id = run_id              # the directory's name wins over run_started's: a moved run
        self.main_metric = main_metric    # the preset's main_metric ('' = the default choice)
        self.workload = "?"
        self.device_preset = "?"
        self.adopted: dict | None = None  # `cockpit adopt`: the process it follows (run_started's)
        self.status = "created"           # engine.record.rundir.RunSummary's statuses
        self.started_t: float | None = None
        self.ended_t: float | None = None
        self.newest_t: float | None = None  # the newest event's time
        self.events_seen = 0
        self.step = 0
        self.total = 0
        self.samples_seen: int | None = 0  # None: a command whose samples per step are not known
        self.total_samples = 0
        self.tokens_seen: int | None = None
        self.epoch: float | None = None
        self.epoch_base: int | None = None  # how a command's printed epochs are numbered (0 or 1)
        self.loss: float | None = None
        self.lr: float | None = None
        self.eta_s: float | None = None
        self.device_memory: dict = {}     # the device's memory, with the newest step
        self.now = Rates()                # the last full window's
        self.windows = 0                  # the current attempt's step windows
        self.metrics: dict = {}           # the last eval's, as shown (shown_metrics)
        self.eval_step: int | None = None
        self.reported: dict[str, tuple[float, int | None]] = {}  # each metric's newest value, its step
        self.activity: dict | None = None  # the mining_started or eval_started under way
        self.mining: dict | None = None   # the newest mining pass that mined
        self.group: dict | None = None    # the attempt's newest heartbeat inside a long accumulation group
        self.memory: dict | None = None   # the newest memory sample
        self.attempts: list[AttemptState] = []
        self.process: dict | None = None  # the newest attempt_process event
        self.fallbacks: list[dict] = []
        self.checkpoints: list[dict] = []  # each checkpoint event
        self.unreadable: set[str] = set()  # checkpoints that did not load
        self.fired: set[tuple[str | None, str | None]] = set()   # (preset, fault spec) injected
        self.health: list[dict] = []   # its health events: loss spikes, explosions, divergence
        self.threads: list[dict] = []  # its threads events: the trainer fitting torch's threads to the cores
        self.stats = RunStats()           # the accounting: averages, steps lost, goodput

    @classmethod
    def of(cls, events: Iterable[dict], *, strict: bool = False, **kwargs) -> "RunState":
        """The state after `events`; `strict`: each event `require`d first."""
        state = cls(**kwargs)
        for e in events:
            state.add(require(e) if strict else e)
        return state

    def add(self, e: dict) -> None:
        self.events_seen += 1
        t = e.get("t")
        if t is not None:
            self.newest_t = t
        self.stats.add(e)
        handler = _FOLD.get(e.get("type"))   # type: ignore[arg-type]
        if handler is not None:
            handler(self, e)

    # ------------------------------------------------------------ read

    @property
    def averages(self) -> Averages:
        """The run's averages so far, over time spent training (engine.record.stats)."""
        return self.stats.result()

    @property
    def steps_lost(self) -> int:
        return self.stats.steps_lost

    def goodput(self) -> Goodput:
        return self.stats.goodput()

    @property
    def units(self) -> dict | None:
        """A command's, from its newest step that says them (None: the trainer's, exact)."""
        return self.stats.units

    @property
    def samples_known(self) -> bool:
        return samples_known(self.units)

    @property
    def current(self) -> AttemptState | None:
        return self.attempts[-1] if self.attempts else None

    def attempt(self, number: int | None) -> AttemptState | None:
        """The attempt of that number, the newest if several; None if there is none."""
        return next((a for a in reversed(self.attempts) if a.attempt == number), None)

    @property
    def main(self) -> MainMetric | None:
        return self.main_of(self.main_metric)

    def main_of(self, named: str) -> MainMetric | None:
        """The run's main metric as the preset names it (`named`, '' for the default choice),
        with its newest value and step; None where it has none."""
        name = choose_main_metric(self.reported, named)
        if name is None:
            return None
        value, step = self.reported.get(name, (None, None))
        return MainMetric(name, value, step)

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.total) if self.total else 0.0

    @property
    def finished(self) -> bool:
        return self.status in ENDED

    @property
    def last_started(self) -> dict | None:
        """The newest attempt_started event: its preset as it ran."""
        return next((a.started for a in reversed(self.attempts) if a.started is not None), None)


# ---------------------------------------------------------------- one function per event type


def _run_started(s: RunState, e: dict) -> None:
    s.run_id = s.run_id or e.get("run", "")
    s.workload, s.device_preset = e.get("workload", s.workload), e.get("device_preset", s.device_preset)
    if s.started_t is None:
        s.started_t = e.get("t")
        adopted = e.get("adopted")
        s.adopted = adopted if isinstance(adopted, dict) else None
    s.status = "running"


def _run_resumed(s: RunState, e: dict) -> None:
    s.status, s.ended_t = "running", None
    if s.started_t is None:
        s.started_t = e.get("t")


def _run_finished(s: RunState, e: dict) -> None:
    s.status, s.ended_t = e.get("status", "?"), e.get("t")
    s.eta_s = s.activity = None


def _run_interrupted(s: RunState, e: dict) -> None:
    s.status, s.ended_t = "interrupted", e.get("t")
    s.eta_s = None


def _attempt_started(s: RunState, e: dict) -> None:
    config = e.get("config") or {}
    s.attempts.append(AttemptState(
        attempt=e.get("attempt", len(s.attempts) + 1), preset=e.get("preset", "?"), device=e.get("device"),
        precision=e.get("precision"), resumed_from=e.get("resume"), started=e,
        batch=f"{config.get('batch_size', '?')} x {config.get('accumulation', '?')}"))
    s.windows, s.group = 0, None


def _attempt_process(s: RunState, e: dict) -> None:
    s.process = e


def _trainer_ready(s: RunState, e: dict) -> None:
    a = s.current
    if a is not None:
        a.device, a.precision = e.get("device", a.device), e.get("precision", a.precision)
        a.batch = f"{e.get('batch_size', '?')} x {e.get('accumulation', '?')}"
        a.resumed_from = e.get("resumed_from")
    # known before the first step, which may be minutes away on a slow device
    s.total = e.get("total_steps") or s.total


def _step(s: RunState, e: dict) -> None:
    # The hot path of a replay: plain lookups.
    get = e.get
    s.step, s.total = get("step", s.step), get("total") or s.total  # a command may not say its total
    s.samples_seen, s.total_samples = get("samples_seen", s.samples_seen), get("total_samples", s.total_samples)
    s.tokens_seen = get("tokens_seen", s.tokens_seen)
    s.epoch, s.loss, s.lr = get("epoch", s.epoch), get("loss", s.loss), get("lr", s.lr)
    if (base := get("epoch_base")) is not None:
        s.epoch_base = base
    s.eta_s = get("eta_s")
    s.device_memory = get("device_memory") or {}
    s.activity = s.group = None   # training again: any pass or eval is over
    if metrics := get("metrics"):
        _report(s, metrics, s.step)
    if not get("partial"):   # a window cut short by a checkpoint or the end: its rate is noise
        now = s.now
        now.samples_per_s, now.steps_per_s, now.tokens_per_s = get("samples_per_s"), get("steps_per_s"), \
            get("tokens_per_s")
        now.smoothed_samples_per_s, now.gflop_s, now.mfu = get("smoothed_samples_per_s"), get("gflop_s"), get("mfu")
    s.windows += 1
    if s.attempts:
        a = s.attempts[-1]
        a.last_step = s.step
        a.windows += 1


def _report(s: RunState, metrics: dict, step: int | None) -> None:
    for name, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            s.reported[name] = (value, step)   # a name keeps its place: where it came first


def _eval_started(s: RunState, e: dict) -> None:
    s.activity = e


def _eval(s: RunState, e: dict) -> None:
    s.activity = None
    metrics = e.get("metrics") or {}
    s.metrics, s.eval_step = shown_metrics(metrics), e.get("step")
    _report(s, metrics, e.get("step"))


def _mining_started(s: RunState, e: dict) -> None:
    s.activity = e


def _mining(s: RunState, e: dict) -> None:
    s.activity = None
    if e.get("mode", "none") != "none":   # else an epoch the schedule does not mine
        s.mining = e


def _heartbeat(s: RunState, e: dict) -> None:
    if e.get("micro_batches") is not None:
        s.group = e


def _memory(s: RunState, e: dict) -> None:
    s.memory = e


def _checkpoint(s: RunState, e: dict) -> None:
    s.checkpoints.append(e)


def _warning(s: RunState, e: dict) -> None:
    if e.get("kind") == "checkpoint-unreadable" and e.get("path"):
        s.unreadable.add(e["path"])


def _health(s: RunState, e: dict) -> None:
    s.health.append(e)


def _threads(s: RunState, e: dict) -> None:
    s.threads.append(e)


def _fault_injected(s: RunState, e: dict) -> None:
    a = s.attempt(e.get("attempt"))
    s.fired.add((a.preset if a is not None else None, e.get("spec")))


def _crash(s: RunState, e: dict) -> None:
    s.activity = None
    if (a := s.current) is not None:
        a.crash = e


def _attempt_ended(s: RunState, e: dict) -> None:
    s.activity = None
    a = s.attempt(e["attempt"]) if "attempt" in e else s.current
    if a is None:
        return
    # a launcher's refusal says its sentence here; the trainer's said its line first (config_error)
    a.outcome, a.exit = e.get("outcome", "?"), e.get("exit", "")
    a.refused = e.get("sentence") or a.refused
    if (last := e.get("last_step")) is not None:   # where it got to, past its last report
        a.last_step = last
        s.step = max(s.step, last)


def _config_error(s: RunState, e: dict) -> None:
    """The trainer's refusal of its configuration, in its own line (which file or --set, which
    key): what a `config` end was, where nothing else says it."""
    if (a := s.attempt(e.get("attempt"))) is not None and e.get("message"):
        a.refused = e["message"]


def _stop_requested(s: RunState, e: dict) -> None:
    if (a := s.attempt(e.get("attempt"))) is not None and a is s.current:
        a.stops += 1


def _fallback(s: RunState, e: dict) -> None:
    s.fallbacks.append(e)
    if (a := s.attempt(e.get("attempt"))) is not None:
        a.fallback = e


def _run_failed(s: RunState, e: dict) -> None:
    if (a := s.current) is not None:
        a.failed_why = e.get("why") or e.get("reason")


_FOLD: dict[str, Callable[[RunState, dict], None]] = {
    "run_started": _run_started, "run_resumed": _run_resumed, "run_finished": _run_finished,
    "run_interrupted": _run_interrupted, "attempt_started": _attempt_started,
    "attempt_process": _attempt_process, "trainer_ready": _trainer_ready, "step": _step,
    "eval_started": _eval_started, "eval": _eval, "mining_started": _mining_started, "mining": _mining,
    "heartbeat": _heartbeat, "memory": _memory, "checkpoint": _checkpoint, "warning": _warning,
    "health": _health, "threads": _threads,
    "fault_injected": _fault_injected, "crash": _crash, "attempt_ended": _attempt_ended,
    "fallback": _fallback, "run_failed": _run_failed, "stop_requested": _stop_requested,
    "config_error": _config_error,
}

__all__ = ["RunState", "AttemptState", "Rates", "MainMetric", "require", "REQUIRED", "ENDED"]

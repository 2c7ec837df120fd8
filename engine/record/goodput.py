"""A run's goodput: the share of its wall time spent training steps it kept, and where the rest
went, folded from the events that already time every moment of it.

    wall       first launch to the end, less the gaps while it was stopped or interrupted (shown,
               not counted; `queued`: of those, the time a preempted run waited to start again,
               a SLURM job back in the queue)
    training   the trainer's reporting windows (which leave out evaluation, epoch preparation and
               checkpoint saves, timed on their own), less what compiling cost, and the steps
               trained since the last report of an attempt that crashed (engine.record.reached)
    goodput    training, less `lost`, over wall

and the badput, by bucket:

    startup          launch (and the supervisor's checks) to the attempt's first training window:
                     process, imports, data, model, parity check; an attempt that never trained.
                     Its parts (`startup_parts`), as the trainer timed them (engine.train.startup):
                     cockpit (the supervisor's checks before a launch), launch, device, data,
                     model, setup, parity, and the rest (a command's whole start is its launch)
    compile          the first step's time beyond a step's, when it compiles (step compile_s)
    checkpoint_save  checkpoint events' save_s
    checkpoint_load  the resumed checkpoint's load_s (trainer_ready)
    eval             eval events' eval_s
    epoch_prep       mining events' mining_s
    lost             steps trained again after a crash (engine.record.stats' count): the time
                     those steps took, the attempt's last steps, from the windows that trained
                     them (a run whose speed changed lost its last steps' time, not its average's)
    rewound          the same for the steps a health finding went back from (engine.run.rewind):
                     trained, then thrown away because the loss went bad
    recovery         a crashed attempt's death to the next attempt's launch: detection, the
                     decision, the fallback
    stalls           a hang's silence until it was killed, and the time a slowdown cost (each
                     window after the warning, at the rate the run had before it)
    preemption       a preempted attempt's exit after the warning (its checkpoint is in
                     checkpoint_save): the cost of its time on the machine ending
    unknown          a command's time between its steps that its output does not explain (its
                     evaluations, its checkpoint saves): cockpit cannot tell them apart
    other            what no event explains: an attempt's exit, the supervisor's last words

A command's compile, checkpoint, eval and epoch buckets are None (not known), not zero: its
windows are timed by its output, and whatever the script does inside a step is in them.

Pure: no I/O, no clock; engine.record.stats folds one of these with everything else.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.vocabulary import CLEAN

BUCKETS = ("startup", "compile", "checkpoint_save", "checkpoint_load", "eval", "epoch_prep",
           "lost", "rewound", "recovery", "stalls", "preemption", "unknown", "other")
# What a command's output cannot tell apart: None, said as 'not known'.
COMMAND_UNKNOWN = ("compile", "checkpoint_save", "checkpoint_load", "eval", "epoch_prep")
_ENDS = ("run_finished", "run_interrupted")
# An attempt's windows kept to time the steps a crash loses (a TUI folds a week-long run's
# events: its memory must stay bounded); past them, the attempt's average step.
WINDOWS_KEPT = 1024   # 17 minutes of 1 s windows


@dataclass(frozen=True, slots=True)
class Goodput:
    wall_s: float                      # first launch to end, less the gaps
    gaps_s: float                      # stopped or interrupted, not counted
    productive_s: float                # training steps that were kept
    buckets: dict[str, float | None]   # badput, seconds; None: not known (a command's)
    queued_s: float = 0.0              # of the gaps, a preempted run's wait to start again
    startup_parts: dict[str, float] = field(default_factory=dict)   # the startup bucket's, seconds

    @property
    def fraction(self) -> float | None:
        return self.productive_s / self.wall_s if self.wall_s > 0 else None

    def as_dict(self) -> dict:
        """`runs show --json`'s goodput, and run_finished's."""
        return {"goodput": None if self.fraction is None else round(self.fraction, 4),
                "wall_s": round(self.wall_s, 3), "gaps_s": round(self.gaps_s, 3),
                "queued_s": round(self.queued_s, 3),
                "productive_s": round(self.productive_s, 3),
                "buckets": {k: None if v is None else round(v, 3) for k, v in self.buckets.items()},
                "startup_parts": {k: round(v, 3) for k, v in self.startup_parts.items()}}


@dataclass(slots=True)
class _Attempt:
    """One attempt's timeline."""

    number: int | None
    started: float
    command: bool
    ended: float | None = None
    outcome: str | None = None
    hang: bool = False
    reached: int | None = None        # attempt_ended's last step
    first_window: float | None = None  # when its first training window began
    last_step_t: float | None = None   # its last step event's time
    last_step: int | None = None
    window_step: int | None = None     # step at its previous window's end (steps per window)
    train_s: float = 0.0
    steps: int = 0                     # steps trained in its windows
    compile_s: float = 0.0
    load_s: float = 0.0
    save_s: float = 0.0
    eval_s: float = 0.0
    prep_s: float = 0.0
    startup: dict[str, float] = field(default_factory=dict)   # its start-up's parts, as timed
    # (steps, seconds training them) of its last WINDOWS_KEPT windows in order: the steps lost
    # are the last ones (older ones, should a loss reach past them, at the average)
    windows: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=WINDOWS_KEPT))
    after_s: float = 0.0               # eval, save and prep after its last step event (the end's)
    slow_s: float = 0.0                # window time a slowdown cost
    slow_rate: float | None = None     # the rate before the slowdown, once warned
    preempted: bool = False            # the last of a run that ended "preempted"

    @property
    def step_s(self) -> float | None:
        return self.train_s / self.steps if self.steps else None

    def last_steps_s(self, steps: int, tail_steps: int, tail_s: float) -> float:
        """The time its last `steps` took: those after its last report (`tail_steps` in `tail_s`),
        then its windows from the newest back, each step at its own window's pace; any before
        its first window (a command's first sighting opens it) at its average."""
        left, spent = steps, 0.0
        for n, seconds in [(tail_steps, tail_s), *reversed(self.windows)]:
            if left <= 0:
                break
            if n > 0:
                taken = min(left, n)
                spent += seconds * taken / n
                left -= taken
        return spent + (left * self.step_s if left > 0 and self.step_s else 0.0)


@dataclass(slots=True)
class Timeline:
    """Folds events one at a time (`add`), as engine.record.stats.RunStats does, which owns one."""

    first_t: float | None = None
    last_t: float | None = None
    gap_from: float | None = None      # an end (stopped, interrupted) not yet resumed
    gap_queued: bool = False           # ... a preempted run's: waiting to be started again
    gaps_s: float = 0.0
    queued_s: float = 0.0
    attempts: list[_Attempt] = field(default_factory=list)
    # the supervisor's time with no attempt running, by what came before it: a start (to the
    # launch: startup), a crash (to the next launch: recovery), a clean end (to the run's end)
    idle_s: dict[str, float] = field(default_factory=lambda: {"startup": 0.0, "recovery": 0.0, "other": 0.0})
    _idle_from: float | None = None
    _idle_kind: str = "startup"

    def add(self, e: dict) -> None:
        t, kind = e.get("t"), e.get("type")
        if t is None or kind is None:
            return
        if self.first_t is None:
            self.first_t = self._idle_from = t
        self.last_t = t
        if kind in ("run_started", "run_resumed"):
            if self.gap_from is not None:
                self.gaps_s += t - self.gap_from
                self.queued_s += t - self.gap_from if self.gap_queued else 0.0
                self.gap_from = None
            self._idle_from, self._idle_kind = t, "startup"
        elif kind in _ENDS or kind == "supervisor_lost":
            self._close_idle(t)
            if kind in _ENDS and e.get("status", "interrupted") != "finished":
                self.gap_from = t   # stopped, failed, interrupted: until a resume, not counted
                self.gap_queued = e.get("status") == "preempted"
                if self.gap_queued and self.attempts:   # its last attempt's exit: the preemption's
                    self.attempts[-1].preempted = True
        elif kind == "attempt_started":
            self._close_idle(t)
            self.attempts.append(_Attempt(number=e.get("attempt"), started=t, command="command" in e))
        elif (a := self._current()) is not None:
            self._attempt_event(a, kind, e, t)

    def _close_idle(self, t: float) -> None:
        if self._idle_from is not None:
            self.idle_s[self._idle_kind] += max(0.0, t - self._idle_from)
        self._idle_from = None

    def _current(self) -> _Attempt | None:
        return self.attempts[-1] if self.attempts and self.attempts[-1].ended is None else None

    def _attempt_event(self, a: _Attempt, kind: str, e: dict, t: float) -> None:
        if kind == "step" and e.get("window_s") is not None and e.get("steps_per_s") is not None:
            window = float(e["window_s"])
            if a.first_window is None:
                a.first_window = t - window
            step = e.get("step")
            begun = e.get("from_step", a.window_step)
            if step is not None and begun is not None:
                steps = max(0, int(step) - int(begun))
            else:
                steps = round((e.get("steps_per_s") or 0.0) * window)
            compile_s = float(e.get("compile_s") or 0.0)
            slow_s = 0.0
            if a.slow_rate and e.get("samples_per_s") and not e.get("partial"):
                slow_s = window * max(0.0, 1.0 - float(e["samples_per_s"]) / a.slow_rate)
            a.steps += steps
            a.train_s += window
            a.compile_s += compile_s
            a.slow_s += slow_s
            # its steps' own time: what compiling and a slowdown cost is in their buckets
            a.windows.append((steps, max(0.0, window - compile_s - slow_s)))
            a.last_step_t, a.last_step, a.window_step, a.after_s = t, step, step, 0.0
        elif kind == "step":   # a step with no window to time (a command's first sighting)
            a.window_step = e.get("step", a.window_step)
        elif kind == "trainer_ready":
            for part, seconds in (e.get("startup") or {}).items():
                if part != "resume" and isinstance(seconds, (int, float)):   # resume: checkpoint_load
                    a.startup[part] = a.startup.get(part, 0.0) + float(seconds)
            a.load_s += float((e.get("resumed_from") or {}).get("load_s") or 0.0)
            a.window_step = (e.get("resumed_from") or {}).get("step", 0)
        elif kind == "checkpoint" and e.get("save_s") is not None and not a.command:
            # a command's save (the HF callback says its time) is inside the windows its output
            # timed: not told apart from them
            a.save_s += float(e["save_s"])
            a.after_s += float(e["save_s"]) if a.last_step_t is not None else 0.0
        elif kind == "parity" and e.get("seconds") is not None and a.first_window is None:
            a.startup["parity"] = a.startup.get("parity", 0.0) + float(e["seconds"])
        elif kind == "eval" and e.get("eval_s") is not None:
            a.eval_s += float(e["eval_s"])
            a.after_s += float(e["eval_s"]) if a.last_step_t is not None else 0.0
        elif kind == "mining" and e.get("mining_s") is not None:
            a.prep_s += float(e["mining_s"])
            a.after_s += float(e["mining_s"]) if a.last_step_t is not None else 0.0
        elif kind == "warning" and e.get("kind") == "slowdown":
            a.slow_rate = a.slow_rate or e.get("best_samples_per_s")
        elif kind == "crash" and e.get("kind") == "hang":
            a.hang = True
        elif kind == "attempt_ended":
            a.ended, a.outcome, a.reached = t, e.get("outcome"), e.get("last_step")
            self._idle_from, self._idle_kind = t, "other" if a.outcome in CLEAN else "recovery"

    def result(self, lost_steps: dict[int | None, int]) -> Goodput:
        """The goodput as of the last event; `lost_steps`: the steps each attempt trained that
        were trained again, by attempt number (engine.record.stats)."""
        if self.first_t is None or self.last_t is None:
            return Goodput(0.0, 0.0, 0.0, {k: 0.0 for k in BUCKETS})
        end = self.gap_from if self.gap_from is not None else self.last_t
        wall = max(0.0, end - self.first_t - self.gaps_s)
        b = {k: 0.0 for k in BUCKETS}
        command = any(a.command for a in self.attempts)
        productive = 0.0
        idle = dict(self.idle_s)
        if self._idle_from is not None and self.gap_from is None:   # still idle, as of now
            idle[self._idle_kind] += max(0.0, self.last_t - self._idle_from)
        for name, spent in idle.items():
            b[name] += spent
        parts = {"cockpit": idle["startup"]}
        for a in self.attempts:
            lost = lost_steps.get(a.number, 0)
            ended = a.ended if a.ended is not None else self.last_t
            if a.first_window is None:   # it never trained: its life went to starting up
                b["stalls" if a.hang else "startup"] += max(0.0, ended - a.started)
                _add_parts(parts, a.startup, 0.0 if a.hang else max(0.0, ended - a.started))
                continue
            b["startup"] += max(0.0, a.first_window - a.started - a.load_s)
            _add_parts(parts, a.startup, max(0.0, a.first_window - a.started - a.load_s))
            b["checkpoint_load"] += a.load_s
            b["compile"] += a.compile_s
            b["checkpoint_save"] += a.save_s
            b["eval"] += a.eval_s
            b["epoch_prep"] += a.prep_s
            b["stalls"] += a.slow_s
            trained = a.train_s - a.compile_s - a.slow_s
            # After its last report: the end's eval and save (counted above), the steps trained
            # since (a crash's, which engine.record.reached counted), and the rest: its exit, or
            # a crash's detection, or a hang's silence.
            tail = max(0.0, ended - (a.last_step_t or ended) - a.after_s)
            unreported = max(0, (a.reached or 0) - (a.last_step or 0))
            tail_trained = min(tail, unreported * a.step_s) if a.step_s else 0.0
            trained += tail_trained
            rest = tail - tail_trained
            if a.hang:
                b["stalls"] += rest
            elif a.preempted:
                b["preemption"] += rest
            elif a.outcome is not None and a.outcome not in CLEAN:
                b["recovery"] += rest
            else:
                b["other"] += rest
            # Between its windows, what no event timed: nothing for the trainer (its windows
            # move past what they leave out), a command's evaluations and saves.
            inside = (a.last_step_t or a.first_window) - a.first_window
            unexplained = max(0.0, inside - a.train_s - (a.save_s + a.eval_s + a.prep_s - a.after_s))
            b["unknown" if a.command else "other"] += unexplained
            lost_s = min(trained, a.last_steps_s(lost, unreported, tail_trained)) if lost else 0.0
            b["rewound" if a.outcome == "health" else "lost"] += lost_s
            productive += trained - lost_s
        buckets: dict[str, float | None] = dict(b)
        if command:
            for k in COMMAND_UNKNOWN:
                buckets[k] = None
        return Goodput(wall, self.gaps_s, productive, buckets, self.queued_s,
                       {k: v for k, v in parts.items() if v > 0})


def _add_parts(parts: dict[str, float], timed: dict[str, float], startup_s: float) -> None:
    """An attempt's start-up (`startup_s`) by the parts it timed, the rest 'other': a command
    times none (its start is the script's own), a trainer that died starting all it got to."""
    known = 0.0
    for part, seconds in timed.items():
        taken = min(seconds, max(0.0, startup_s - known))   # never more than the bucket holds
        parts[part] = parts.get(part, 0.0) + taken
        known += taken
    parts["other"] = parts.get("other", 0.0) + max(0.0, startup_s - known)

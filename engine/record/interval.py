"""The checkpoint interval that loses least: a decision from two measured figures.

Checkpointing every τ seconds of training costs C/τ of the time in saves, and a crash loses on
average τ/2 of training since the last save: with crashes every M seconds on average, the loss
C/τ + τ/(2M) is least at Young's τ = √(2CM); Daly's refinement, √(2CM) − C, counts the save's
own time at risk. Here:

    C  the run's measured save stall (the checkpoint events' save_s; the first save measures it;
       a command's saves: their save_s where it reports them, else what the windows around
       them took beyond their steps, where that stands out from the steps' own variation)
    M  the mean time between crashes: the training time on this device (this run's and the
       earlier runs' summaries') over the crashes seen in it; before any is seen, that time or a
       day, whichever is longer (so a run with no history checkpoints about every minute and a
       half at a 0.05 s save, not never)

bounded to [max(2C, 1 s), 1 hour], and in steps at the attempt's measured time a step.
`choose` is pure; `device_history` reads the newest runs' last line (run_finished's summary).
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path

from engine.numbers import duration
from engine.vocabulary import CLEAN

PRIOR_S = 24 * 3600.0     # one crash a day, assumed before any is seen
MAX_S = 3600.0
HISTORY_RUNS = 50         # the newest runs read for a device's history
_TAIL = 256 * 1024        # run_finished is the last line: read this much of the end


@dataclass(frozen=True, slots=True)
class Interval:
    steps: int               # checkpoint every this many optimizer steps
    seconds: float           # ... this much training time
    cost_s: float            # the save stall it was chosen for
    mtbf_s: float            # the mean time between crashes it was chosen for
    crashes: int             # crashes seen (this run and the device's history)
    observed_s: float        # over this much training time

    @property
    def reason(self) -> str:
        """'every 350 steps (2m27s): a 3.00 s save, one crash in 1h00m (2 seen in 2h00m on cuda)'."""
        seen = (f"{self.crashes} crash{'es' if self.crashes != 1 else ''} seen in "
                f"{duration(self.observed_s)} of training" if self.crashes else
                f"no crash seen in {duration(self.observed_s)} of training, one a day assumed")
        return (f"every {_steps(self.steps)} ({duration(self.seconds)}) loses least for a "
                f"{_cost(self.cost_s)} save and a crash every {duration(self.mtbf_s)} ({seen})")


def young_daly(cost_s: float, mtbf_s: float) -> float:
    """Seconds of training between checkpoints that lose least in expectation."""
    return max(math.sqrt(2.0 * cost_s * mtbf_s) - cost_s, cost_s)


def choose(cost_s: float, step_s: float, crashes: int, observed_s: float,
           floor_s: float = 0.0) -> Interval:
    """The interval for a save of `cost_s`, steps of `step_s`, and `crashes` in `observed_s`
    of training; never under `floor_s` (a background write's time: no two in flight)."""
    mtbf = observed_s / crashes if crashes else max(observed_s, PRIOR_S)
    seconds = max(min(max(young_daly(cost_s, mtbf), 2.0 * cost_s, 1.0), MAX_S), floor_s)
    steps = max(1, round(seconds / step_s)) if step_s > 0 else 1
    return Interval(steps, steps * step_s if step_s > 0 else seconds, cost_s, mtbf, crashes, observed_s)


def device_history(device: str, root: Path, exclude: str | None = None) -> tuple[int, float]:
    """(crashes, seconds of training) on `device` ('cpu', 'cuda', 'mps': its kind) in the newest
    finished runs under `root`, from their run_finished summaries; `exclude`: a run's id."""
    kind = device.partition(":")[0]
    crashes, observed = 0, 0.0
    runs = sorted((p for p in Path(root).iterdir() if p.is_dir() and p.name != exclude),
                  key=lambda p: p.name, reverse=True) if Path(root).is_dir() else []
    for path in runs[:HISTORY_RUNS]:
        summary = _last_summary(path / "events.jsonl")
        if summary is None:
            continue
        attempts = [a for a in summary.get("attempts") or []
                    if str(a.get("device") or "").partition(":")[0] == kind]
        if not attempts:
            continue
        crashes += sum(1 for a in attempts if a.get("outcome") not in CLEAN)
        share = len(attempts) / len(summary["attempts"])
        goodput = summary.get("goodput") or {}
        buckets = goodput.get("buckets") or {}
        # a health finding's rewind is a failure too (its outcome not CLEAN), its steps thrown away
        trained = float(goodput.get("productive_s") or 0.0) + float(buckets.get("lost") or 0.0) \
            + float(buckets.get("rewound") or 0.0)
        observed += share * trained
    return crashes, observed


def _last_summary(events: Path) -> dict | None:
    try:
        with open(events, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - _TAIL))
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if b'"run_finished"' in line:
            try:
                return json.loads(line).get("summary")
            except ValueError:
                return None
    return None


@dataclass(frozen=True, slots=True)
class Advice:
    """A command's own checkpoint interval against the one that loses least."""

    theirs: int              # the script checkpoints every this many steps
    best: Interval

    @property
    def far(self) -> bool:
        """Worth saying: more than twice or under half the interval that loses least."""
        return not 0.5 <= self.theirs / self.best.steps <= 2.0

    @property
    def text(self) -> str:
        """'checkpoints every 2,000 steps; at a crash every 1h00m and a 3.0 s save, about every
        343 steps loses least'."""
        b = self.best
        return (f"checkpoints every {self.theirs:,} steps; at a crash every {duration(b.mtbf_s)} and a "
                f"{_cost(b.cost_s)} save, about every {_steps(b.steps)} loses least")


def command_advice(events: list[dict], root: Path | None = None, run_id: str | None = None) -> Advice | None:
    """For a command's run: its checkpoint interval (the steps between the checkpoints it wrote)
    against the one that loses least. Its save time is the one its checkpoints say (the HF
    callback's save_s), else what the windows around its checkpoints took beyond their steps;
    the crash rate is the device's (this run's and `root`'s runs'). None where its checkpoints,
    steps or saves do not say enough: a save the windows cannot tell from the steps' own
    variation (their median no longer than its steps) is not measured, never a 0 ms save."""
    steps = sorted({int(e["step"]) for e in events if e.get("type") == "checkpoint"
                    and e.get("step") is not None and e.get("step_source", "name") != "reached"})
    gaps = [b - a for a, b in zip(steps, steps[1:]) if b > a]
    windows = [(e["t"] - e["window_s"], e["t"], e["step"] - e["from_step"]) for e in events
               if e.get("type") == "step" and e.get("window_s") and e.get("from_step") is not None
               and e.get("step") is not None and e["step"] > e["from_step"]]
    if not gaps or len(windows) < 3:
        return None
    per_step = sorted((end - start) / n for start, end, n in windows)
    step_s = per_step[len(per_step) // 2]
    saves = sorted(float(e["save_s"]) for e in events if e.get("type") == "checkpoint"
                   and e.get("save_s") is not None)
    if not saves:
        written = sorted(e["t"] for e in events if e.get("type") == "checkpoint")
        saves = sorted((end - start) - n * step_s for start, end, n in windows
                       # a checkpoint seen in (start, end]
                       if bisect.bisect_right(written, start) < bisect.bisect_right(written, end))
    if not saves or saves[len(saves) // 2] <= 0:
        return None
    device = str(next((e["device"] for e in events if e.get("type") == "attempt_started" and e.get("device")), "cpu"))
    crashes, observed = device_history(device, root, exclude=run_id) if root is not None else (0, 0.0)
    fold = [e for e in events if e.get("type") == "attempt_ended"]
    crashes += sum(1 for e in fold if e.get("outcome") not in CLEAN)
    observed += sum(end - start for start, end, _ in windows)
    best = choose(saves[len(saves) // 2], step_s, crashes, observed)
    return Advice(sorted(gaps)[len(gaps) // 2], best)


def _cost(seconds: float) -> str:
    """A save's time: '3.00 s', '0.11 s', '4 ms'."""
    return f"{seconds:.2f} s" if seconds >= 0.1 else f"{seconds * 1000:.0f} ms"


def _steps(n: int) -> str:
    """'1 step', '1,200 steps'."""
    return f"{n:,} step" + ("" if n == 1 else "s")

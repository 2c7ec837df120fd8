"""When the trainer checkpoints.

Every N optimizer steps (at multiples of N) and/or every M minutes of training, as the preset
says; or, with checkpoint_every_steps = 'auto', at the interval that loses least
(engine.record.interval) for the save stalls measured so far, the time a step takes and the
crash rate on this device, never under a write's time (no two in flight), counted from the
last save. Until 'auto' has measured a save, one is made after AUTO_FIRST_S of training (or
checkpoint_every_minutes, if sooner).

The trainer tells it the time (it reads no clock) and each save written; what is saved, and
when a step is on disk already, is the trainer's (engine.train.trainer.save_checkpoint).
"""

from __future__ import annotations

from engine.presets import TrainSettings
from engine.record import interval
from engine.record.rundir import RunDir
from engine.vocabulary import CLEAN

# checkpoint_every_steps = 'auto': the first checkpoint after this much training measures a save
AUTO_FIRST_S = 30.0


class Cadence:
    def __init__(self, train: TrainSettings, crash_history: tuple[int, float] = (0, 0.0)):
        self.train = train
        self.auto = train.checkpoint_every_steps == "auto"
        self.stalls: list[float] = []      # each save's stall in the loop, measured
        self.write_s = 0.0                 # the last write's own time
        self.interval: interval.Interval | None = None   # 'auto': the one chosen at the last save
        self.crash_history = crash_history  # (crashes, seconds trained) on this device

    def every(self) -> tuple[int, float]:
        """(steps, seconds) between checkpoints: the preset's, or with 'auto' the interval chosen
        at the last save; until one is chosen, a save after AUTO_FIRST_S of training (or
        checkpoint_every_minutes, if sooner) measures one."""
        if not self.auto:
            return int(self.train.checkpoint_every_steps), self.train.checkpoint_every_minutes * 60
        if self.interval is None:
            minutes = self.train.checkpoint_every_minutes * 60
            return 0, min(AUTO_FIRST_S, minutes) if minutes else AUTO_FIRST_S
        return self.interval.steps, 0.0

    def due(self, step: int, saved_step: int | None, since_save_s: float) -> bool:
        """Whether to checkpoint at `step`, `since_save_s` of the clock after the last save."""
        every_steps, every_s = self.every()
        # 'auto' counts from the last save (its interval may change); a fixed one at multiples
        since = step - (saved_step or 0) if self.interval is not None else step
        return bool((every_steps and since % every_steps == 0 and since)
                    or (every_s and since_save_s >= every_s))

    def written(self, stall_s: float, write_s: float, step_s: float | None) -> interval.Interval | None:
        """A save complete on disk, its stall and its write measured. With 'auto' and a step's
        time known (`step_s`), the interval chosen anew: returned when it moved by more than a
        tenth, to be said in an event."""
        self.stalls.append(stall_s)
        self.write_s = write_s
        if not self.auto or not step_s:
            return None
        stalls = sorted(self.stalls)
        chosen = interval.choose(stalls[len(stalls) // 2], step_s, *self.crash_history,
                                 floor_s=self.write_s)
        if self.interval is None or abs(chosen.steps - self.interval.steps) > 0.1 * self.interval.steps:
            self.interval = chosen
            return chosen
        return None


def crash_history(run: RunDir, device: str) -> tuple[int, float]:
    """(crashes, seconds trained) on this device: this run's attempts so far and the
    earlier runs' (engine.record.interval.device_history)."""
    from engine.record import stats   # the run's own events, read once at the start

    fold = stats.fold(run.events())
    g = fold.goodput()
    crashes = sum(1 for a in fold.attempts if a.outcome is not None and a.outcome not in CLEAN)
    # a rewind (engine.run.rewind) counts as a crash: its outcome is not CLEAN, its steps rewound
    trained = g.productive_s + (g.buckets.get("lost") or 0.0) + (g.buckets.get("rewound") or 0.0)
    before, seen = interval.device_history(device, run.path.parent, exclude=run.id)
    return crashes + before, trained + seen

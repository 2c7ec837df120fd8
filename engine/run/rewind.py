"""Going back: a health finding answered by resuming from a checkpoint from before it began.

    the attempt is ended at once (engine.run.attempt): a checkpoint now would keep what went bad
    the limit: a run that has rewound max_rewinds times within rewind_window steps stops, saying
        why (a spike that keeps coming back is not one batch's)
    the target: the newest checkpoint at least rewind_steps before the finding began (PaLM went
        back about 100 steps); none that old: the start
    the checkpoints after it set aside (the trainer's renamed *.rewound, a command's passed over),
        so that every later resume, a crash's too, starts from the target or after it
    the next attempt, on the same preset, skips the batches after the target: skip_batches (PaLM
        skipped 200 to 500), and at least as far as the attempt got, so the batches that went bad
        are never trained again; the built-in trainer exactly, by sample position (its checkpoints
        keep what was skipped); a command through {skip_batches} or {data_offset} in its argv,
        and without one it rewinds only, and says so
    lower-lr: the same, and the learning rate halved from there on (the trainer's checkpoints
        keep the factor; a command through {lr_scale})

Rewinds are not failed attempts: max_attempts does not count them, max_rewinds does. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engine.event_types import RewindFields
from engine.preset_types import HealthSettings
from engine.run.kinds import TrainerKind

LOWER_LR = 0.5   # what a lower-lr rewind multiplies the learning rate by


@dataclass(frozen=True)
class Outcome:
    """What a health finding that asked to go back comes to: where the next attempt resumes and
    what it skips (`rewind`), or why the run stops (`stop`)."""

    why: str                            # the panel's line: what was found and done
    resume: dict | None = None          # the next attempt's resume point (with its `rewind`)
    rewind: RewindFields | None = None  # None: the run stops
    action: str = "stop"


@dataclass
class Rewinds:
    """The run's rewinds so far: the limit, and what each later attempt's launch must be told."""

    settings: HealthSettings
    done: list[RewindFields] = field(default_factory=list)

    def go_back(self, finding: dict, reached: int | None, kind: TrainerKind) -> Outcome:
        """Answer `finding` (the health event's fields; its action rewind or lower-lr) for an
        attempt that reached step `reached`: set the checkpoints after the target aside and say
        where the next attempt resumes."""
        s, step, began = self.settings, int(finding["step"]), int(finding.get("began", finding["step"]))
        short = finding.get("short") or finding.get("sentence") or finding["kind"]
        recent = [r for r in self.done if abs(step - r["step"]) < s.rewind_window]
        if len(recent) >= s.max_rewinds:
            return Outcome(f"{short}: the run has rewound {len(recent)} times within "
                           f"{s.rewind_window:,} steps (max_rewinds {s.max_rewinds}); stopped: what "
                           "keeps going bad is not one batch's (a lower learning rate, or the data "
                           f"after step {min(r['began'] for r in recent):,}, may be)")
        bound = max(0, began - 1 - s.rewind_steps)
        target, set_aside = kind.go_back(bound, finding)
        to_step = (target or {}).get("step")
        lost = max(0, (reached or step) - (to_step or 0))
        # past the batches that went bad: at least as far as the attempt got
        skip = max(s.skip_batches, lost) if target is not None else 0
        skips, lowers = kind.rewind_takes()
        lower = finding["action"] == "lower-lr"
        lr_scale = LOWER_LR if lower and lowers else 1.0
        rewind = RewindFields(finding=finding["kind"], step=step, began=began, to_step=to_step,
                              checkpoint=(target or {}).get("path"),
                              skip_batches=skip if skips else 0, skips=skips, lr_scale=lr_scale,
                              set_aside=set_aside, steps_lost=lost)
        self.done.append(rewind)
        if target is None:
            why = f"{short}: rewound to the start (no checkpoint is {s.rewind_steps:,} steps older)"
        elif not skips:
            why = (f"{short}: rewound to {to_step:,}; no batch skipped (its command takes no "
                   "{skip_batches} or {data_offset})")
        else:
            why = f"{short}: rewound to {to_step:,}, skipping {skip:,} batches"
        if lr_scale != 1.0:
            why += f", the learning rate x{lr_scale:g}"
        elif lower:
            why += " (the learning rate as it was: its command takes no {lr_scale})"
        return Outcome(why, self.attach(target), rewind, finding["action"])

    def attach(self, resume: dict | None) -> dict | None:
        """`resume` with what the rewinds ask of an attempt that starts there (`rewind`):
        `skip_batches` and `lr_scale` of the rewinds that went back to this very checkpoint (the
        trainer keeps those of the earlier ones in its checkpoints), `run_skip_batches` and
        `run_lr_scale` of all of them (a command's checkpoint keeps none)."""
        if resume is None or not self.done:
            return resume
        here = [r for r in self.done if r["checkpoint"] is not None and r["checkpoint"] == resume.get("path")]
        return {**resume, "rewind": {
            "skip_batches": sum(r["skip_batches"] for r in here),
            "lr_scale": math.prod(r["lr_scale"] for r in here),
            "run_skip_batches": sum(r["skip_batches"] for r in self.done),
            "run_lr_scale": math.prod(r["lr_scale"] for r in self.done)}}

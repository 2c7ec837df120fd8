"""A run that goes bad and keeps going: loss spikes, gradient-norm explosions, divergence.

A crash ends an attempt; these do not. The supervisor reads them from the step and eval events
every attempt writes (the built-in trainer's, a command's, parsed from its output), whatever
launches it, and says each finding as a `health` event with its evidence: the step, the value,
the window's mean and spread, the rule. What is done is the device preset's [health] table's
(engine.preset_types.HealthSettings): `warn`, `stop` the run gracefully, or `rewind` /
`lower-lr`, which the supervisor does (engine.run.rewind): the attempt ends at once and the next
one resumes from a checkpoint before the finding began.

    loss spike          the window's largest step loss (`loss_max`, else its mean `loss`) more
                        than loss_z standard deviations above the mean of the last `window`
                        reports' and more than loss_ratio times that mean (OLMo-core: z 6 over
                        128 steps; llm-foundry: 2x the mean)
    gradient explosion  the same test on the gradient norm (`grad_norm_max`, else `grad_norm`)
                        with grad_z and grad_ratio (Megatron flags 10x)
    divergence          the eval loss rose diverge_evals evals in a row
    plateau             the eval loss has not beaten its best for plateau_evals evals in a row
                        (a warning only: a finished curve is flat too)

A rise must also be at least MIN_RISE of the largest value the run has seen: a loss that
has converged to a millionth of its start wanders by orders of magnitude in float noise, which is
no spike (a matmul regression's loss, 0.9 at the start, went from 1e-6 to 1e-4 and its gradient
norm from 2e-5 to 4e-4 and 6e-3 on a loaded CI machine). An
incident is said once: the reports after its first that are still out of line are part of it;
they are kept out of the window it is judged against (one spike does not raise the bar for the
next) until SETTLE of them in a row, when the new level is the window's (a shift, not a spike,
as llm-foundry counts 5 steps in a row). The history spans attempts (a fallback is the same
training). Torch-free.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from engine.preset_types import HealthSettings

SETTLE = 5          # reports in a row out of line that make the new level the window's
MIN_RISE = 1e-2     # of the largest value the run has seen: a smaller rise is float noise


@dataclass(frozen=True)
class Finding:
    kind: str          # loss-spike | grad-explosion | divergence | plateau
    step: int          # the report's (its window's last step)
    value: float
    mean: float | None
    std: float | None
    rule: str          # the rule it broke, in words with its numbers
    action: str        # warn | stop | rewind | lower-lr
    began: int = 0     # the first step it may have begun at (its report window's first)
    z: float | None = None

    @property
    def what(self) -> str:
        return WHAT[self.kind]

    def sentence(self) -> str:
        return f"{self.what} at step {self.step:,}: {self.rule}"

    def short(self) -> str:
        """'loss spike at step 1,204 (z 9.1)': the finding in a panel's line."""
        z = "" if self.z is None else " (z inf)" if math.isinf(self.z) else f" (z {self.z:.1f})"
        return f"{self.what} at step {self.step:,}{z}"

    def fields(self) -> dict:
        """The `health` event's fields."""
        return dict(kind=self.kind, step=self.step, began=self.began, value=self.value,
                    mean=self.mean, std=self.std, z=None if self.z is None or math.isinf(self.z)
                    else round(self.z, 2), rule=self.rule, action=self.action,
                    sentence=self.sentence(), short=self.short())


WHAT = {"loss-spike": "loss spike", "grad-explosion": "gradient norm explosion",
        "divergence": "divergence", "plateau": "plateau"}


class TrainingHealth:
    """The run's detectors, fed every step and eval event of its attempts."""

    def __init__(self, settings: HealthSettings):
        self.settings = settings
        # (step, value) of the reports judged against: a resume drops those past its step
        self.losses: deque[tuple[int, float]] = deque(maxlen=settings.window)
        self.norms: deque[tuple[int, float]] = deque(maxlen=settings.window)
        self.evals: list[float] = []
        self.eval_steps: list[int] = []
        self.best_eval: float | None = None
        self.evals_since_best = 0
        self.largest: dict[str, float] = {}     # by series: the largest value seen
        self.incident: dict[str, int] = {}      # by series: reports in a row out of line
        self.last: dict[str, float] = {}        # by series: the last value without a window's largest

    def resumed(self, step: int) -> None:
        """An attempt resumed at `step` (0: from the start): what was reported past it was
        thrown away, so the run's history is as it was there (a loss back at the checkpoint's
        level, eight times the last window's on a fast-falling curve, is no spike)."""
        for history in (self.losses, self.norms):
            kept = [(s, v) for s, v in history if s <= step]
            history.clear()
            history.extend(kept)
        kept_evals = [(s, v) for s, v in zip(self.eval_steps, self.evals) if s <= step]
        self.eval_steps, self.evals = [s for s, _ in kept_evals], [v for _, v in kept_evals]
        self.best_eval = min(self.evals) if self.evals else None
        self.evals_since_best = 0
        self.incident.clear()
        self.last.clear()

    def see(self, event: dict) -> list[Finding]:
        kind = event.get("type")
        if kind == "trainer_ready":   # where this attempt's (or restarted workers') training is
            self.resumed(int((event.get("resumed_from") or {}).get("step") or 0))
            return []
        if kind == "step":
            found = [f for f in (self._spike(event, "loss", self.losses, "loss-spike",
                                             self.settings.loss_z, self.settings.loss_ratio),
                                 self._spike(event, "grad_norm", self.norms, "grad-explosion",
                                             self.settings.grad_z, self.settings.grad_ratio))
                     if f is not None]
            return found
        if kind == "eval":
            return [f for f in (self._diverging(event), self._plateau(event)) if f is not None]
        return []

    def _spike(self, event: dict, field: str, history: deque[tuple[int, float]], kind: str,
               z_limit: float, ratio_limit: float) -> Finding | None:
        value = event.get(f"{field}_max", event.get(field))
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return None   # a non-finite loss is a crash of its own (numerical)
        value = float(value)
        if f"{field}_max" not in event:
            # A command's window that read no new value carries the last one again (HF logs
            # every logging_steps): the same reading, not judged twice.
            if self.last.get(field) == value:
                return None
            self.last[field] = value
        largest = self.largest[field] = max(self.largest.get(field, value), value)
        step = int(event.get("step") or 0)
        if len(history) < self.settings.min_reports:
            history.append((step, value))
            return None
        values = [v for _, v in history]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((x - mean) ** 2 for x in values) / len(values))
        z = (value - mean) / std if std > 0 else math.inf
        if not (z > z_limit and mean > 0 and value > ratio_limit * mean
                and value - mean >= MIN_RISE * largest):
            self.incident[field] = 0
            history.append((step, value))
            return None
        run = self.incident[field] = self.incident.get(field, 0) + 1
        if run > SETTLE:
            history.append((step, value))   # out of line this long: the new level
        if run > 1:
            return None             # the incident its first report said
        began = int(event["from_step"]) + 1 if isinstance(event.get("from_step"), int) else step
        return Finding(kind, step, value, mean, std,
                       f"{field.replace('_', ' ')} {value:.4g} is {_z(z)} and {value / mean:.1f}x "
                       f"the mean {mean:.4g} of the last {len(history)} reports (limits: z "
                       f"{z_limit:g}, {ratio_limit:g}x)", self.settings.action(kind),
                       began=min(began, step), z=z)

    def _diverging(self, event: dict) -> Finding | None:
        value = _eval_loss(event)
        k = self.settings.diverge_evals
        if value is None or not k:
            return None
        self.evals.append(value)
        self.eval_steps.append(int(event.get("step") or 0))
        last = self.evals[-(k + 1):]
        if len(last) == k + 1 and all(b > a for a, b in zip(last, last[1:])):
            step = int(event.get("step") or 0)
            # it began after the eval before the first rise: a rewind goes back before that
            began = self.eval_steps[-(k + 1)] + 1 if len(self.eval_steps) > k else step
            self.evals, self.eval_steps = self.evals[-1:], self.eval_steps[-1:]   # said once
            return Finding("divergence", step, float(value), None, None,
                           f"the eval loss rose {k} evals in a row, "
                           + " -> ".join(f"{x:.4g}" for x in last),
                           self.settings.action("divergence"), began=min(began, step))
        return None

    def _plateau(self, event: dict) -> Finding | None:
        value, k = _eval_loss(event), self.settings.plateau_evals
        if value is None or not k:
            return None
        if self.best_eval is None or value < self.best_eval:
            self.best_eval, self.evals_since_best = value, 0
            return None
        self.evals_since_best += 1
        if self.evals_since_best != k:
            return None   # said once, when it has lasted k evals
        return Finding("plateau", int(event.get("step") or 0), value, None, None,
                       f"the eval loss has not beaten its best {self.best_eval:.4g} for {k} evals",
                       "warn")


def _eval_loss(event: dict) -> float | None:
    """The eval's loss: `eval_loss` (HF), `loss`, else the first metric named *_loss (val_loss,
    trm's held_out_loss); None when it has none (a recall, an r2: higher is better, and noisier)."""
    metrics = event.get("metrics") or {}
    names = ["eval_loss", "loss", *sorted(k for k in metrics if str(k).endswith("_loss"))]
    value = next((metrics[k] for k in names if k in metrics), None)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def _z(z: float) -> str:
    return "z inf (the window was flat)" if math.isinf(z) else f"z {z:.1f}"

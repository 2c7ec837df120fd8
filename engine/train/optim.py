"""The optimizer and the learning-rate schedule a run trains with, from its [train] settings.

- The optimizer: AdamW (betas, eps; the fused kernel on CUDA) or SGD with momentum. Weight
  decay reaches matrices only by default (`weight_decay_params = "matrices"`): parameters of two
  or more dimensions, embeddings excluded, so norms, biases and embedding tables are not pulled
  towards zero (nanoGPT's and most LM recipes' split).
- Or the workload's own: `configure_optimizers(model, train)` returns an optimizer, or an
  (optimizer, scheduler) pair whose scheduler is stepped once per optimizer step.
- The schedule: a factor of each parameter group's peak learning rate, a function of the
  samples seen (warmup, then constant, cosine or linear decay to min_lr over the run). Counted in
  samples, not steps, so an attempt that falls back to another batch size or accumulation keeps
  the same curve, and a resume continues it from the checkpoint's samples seen.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Any

import torch

from engine.errors import ConfigError, ProtocolError
from engine.presets import TrainSettings

_EMBEDDINGS = (torch.nn.Embedding, torch.nn.EmbeddingBag)


@dataclass(frozen=True, slots=True)
class Schedule:
    """The learning rate as a factor of its peak, by samples seen at the end of a step."""

    kind: str               # constant | cosine | linear
    warmup_samples: int     # linear from 0 to the peak over these samples
    total_samples: int      # the decay ends here, at min_ratio
    min_ratio: float        # min_lr / lr

    @classmethod
    def of(cls, train: TrainSettings, samples_per_step: int, total_samples: int) -> "Schedule":
        """train.warmup_steps are steps of `samples_per_step` (the first attempt's global batch)."""
        return cls(kind=train.schedule, warmup_samples=train.warmup_steps * samples_per_step,
                   total_samples=total_samples, min_ratio=train.min_lr / train.lr if train.lr else 0.0)

    def factor(self, samples: int) -> float:
        if samples < self.warmup_samples:
            return max(0, samples) / self.warmup_samples
        if self.kind == "constant":
            return 1.0
        span = self.total_samples - self.warmup_samples
        progress = 1.0 if span <= 0 else min(1.0, (samples - self.warmup_samples) / span)
        left = 0.5 * (1.0 + math.cos(math.pi * progress)) if self.kind == "cosine" else 1.0 - progress
        return self.min_ratio + (1.0 - self.min_ratio) * left

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)


def param_groups(model: torch.nn.Module, weight_decay: float, which: str = "matrices") -> list[dict]:
    """The model's trainable parameters as optimizer groups: with `which` = 'matrices', weight
    decay only for parameters of 2+ dimensions that are not an embedding's (a weight tied to an
    embedding counts as the embedding); 'all': every parameter decays. Empty groups are left out.
    For a workload's configure_optimizers too."""
    embedded = {id(p) for m in model.modules() if isinstance(m, _EMBEDDINGS) for p in m.parameters()}
    decay, keep = [], []
    for p in model.parameters():  # each shared (tied) parameter once
        if not p.requires_grad:
            continue
        if which == "all" or (p.dim() >= 2 and id(p) not in embedded):
            decay.append(p)
        else:
            keep.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build(model: torch.nn.Module, train: TrainSettings, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer [train] describes, over the model's trainable parameters."""
    groups = param_groups(model, train.weight_decay, train.weight_decay_params)
    if not groups:
        raise ConfigError("workload", None, "the model has no trainable parameters (none with "
                                            "requires_grad); expected at least one to train")
    if train.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=train.lr, momentum=train.momentum)
    extra = {}
    if device.type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters and all(
            p.is_cuda and p.is_floating_point() for g in groups for p in g["params"]):
        extra["fused"] = True  # one kernel for the whole update
    return torch.optim.AdamW(groups, lr=train.lr, betas=(train.beta1, train.beta2), eps=train.eps, **extra)


KEPT = ("fused", "foreach", "capturable")  # how this attempt's optimizer runs, not what it learnt


def loadable(optimizer: torch.optim.Optimizer, saved: dict, model: torch.nn.Module) -> dict:
    """A checkpoint's optimizer state made to fit `optimizer` (load_state_dict's argument):

    - this attempt's kernel choice is kept (KEPT): a CUDA attempt's fused AdamW resumed on the
      CPU or MPS after a fallback runs the kernel this attempt chose, not the fused one;
    - a checkpoint written before weight decay split the parameters into groups (one group of
      every trainable parameter, in the model's order) has each parameter's state moved to
      where that parameter is now, so a run from before the split resumes instead of starting
      again. Anything else is given back as it is, for load_state_dict to judge."""
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        return saved
    mine = optimizer.param_groups
    if len(groups) == 1 and len(mine) > 1:
        trainable = [p for p in model.parameters() if p.requires_grad]
        now = [p for g in mine for p in g["params"]]
        if len(groups[0].get("params", ())) == len(trainable) == len(now):
            before = {id(p): i for i, p in enumerate(trainable)}
            state, index, regrouped = saved.get("state", {}), 0, []
            moved = {}
            for group in mine:
                ids = list(range(index, index + len(group["params"])))
                regrouped.append({**groups[0], **{k: v for k, v in group.items() if k != "params"},
                                  "params": ids})
                for i, p in zip(ids, group["params"]):
                    if before[id(p)] in state:
                        moved[i] = state[before[id(p)]]
                index += len(ids)
            saved, groups = {**saved, "state": moved, "param_groups": regrouped}, regrouped
    if len(groups) == len(mine):
        groups = [{**g, **{k: m[k] for k in KEPT if k in m}} for g, m in zip(groups, mine)]
        saved = {**saved, "param_groups": groups}
    return saved


def from_workload(workload: Any, name: str, model: torch.nn.Module,
                  train: TrainSettings) -> tuple[torch.optim.Optimizer, Any] | None:
    """The workload's own (optimizer, scheduler or None) from its configure_optimizers, checked;
    None when it has none."""
    configure = getattr(workload, "configure_optimizers", None)
    if configure is None:
        return None
    got = configure(model, train)
    optimizer, scheduler = got if isinstance(got, tuple) and len(got) == 2 else (got, None)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ProtocolError(name, "configure_optimizers", "configure_optimizers() must return a torch "
                            f"optimizer or (optimizer, scheduler), got {_kind(got)}", configure)
    if scheduler is not None and not all(callable(getattr(scheduler, m, None))
                                         for m in ("step", "state_dict", "load_state_dict")):
        raise ProtocolError(name, "configure_optimizers", "configure_optimizers() returned a scheduler "
                            f"without step(), state_dict() and load_state_dict(), got {_kind(scheduler)}",
                            configure)
    mine = {id(p) for p in model.parameters()}
    strangers = sum(1 for g in optimizer.param_groups for p in g["params"] if id(p) not in mine)
    if strangers:
        raise ProtocolError(name, "configure_optimizers", "configure_optimizers() must return an "
                            f"optimizer over the parameters of the model it is given; {strangers} of "
                            "its parameters are not that model's (build it from model.parameters(), "
                            "not from a model of your own)", configure)
    if scheduler is not None and (train.schedule != "constant" or train.warmup_steps):
        raise ConfigError(f"workload {name!r}", "train.schedule",
                          f"configure_optimizers() returns a scheduler of its own, and [train] sets "
                          f"schedule = {train.schedule!r}, warmup_steps = {train.warmup_steps}; "
                          "expected one of them (schedule = 'constant' and warmup_steps = 0 leave the "
                          "learning rate to the workload's scheduler)")
    return optimizer, scheduler


def describe(optimizer: torch.optim.Optimizer, scheduler: Any, train: TrainSettings, workload: Any) -> str:
    """'AdamW (fused), cosine from 0.0006 to 6e-05 after 100 warmup steps', or the workload's."""
    o, t = optimizer, train
    name = type(o).__name__ + (" (fused)" if o.defaults.get("fused") else "")
    if hasattr(workload, "configure_optimizers"):
        name += " from configure_optimizers"
    if scheduler is not None:
        return f"{name} and its {type(scheduler).__name__}"
    peak = "its lr" if hasattr(workload, "configure_optimizers") else f"{t.lr:g}"
    curve = f"constant at {peak}" if t.schedule == "constant" else \
        f"{t.schedule} from {peak} to {t.min_lr / t.lr if t.lr else 0:g}x" \
        if peak == "its lr" else f"{t.schedule} from {peak} to {t.min_lr:g}"
    warm = f" after {t.warmup_steps} warmup steps" if t.warmup_steps else ""
    return f"{name}, {curve}{warm}"


def _kind(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    return "None" if value is None else f"a {type(value).__name__}"

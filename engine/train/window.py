"""The trainer's reporting window, and the time it leaves out.

A step event reports a window: the steps, samples and training time since the last report,
and the loss of those steps, kept on the device until the report reads it (`read`: the loop's
one host-device sync, engine.train.trainer). Beside the mean loss the same read brings the
window's instruments: the largest step's loss, the gradient's total norm (each step's, before
clipping: its mean and largest) and the steps whose loss or norm was NaN or infinite; each is
kept on the device as it comes and folded there, in batches, so that no step waits for it. Time that is not training moves the window's
start past itself: an eval, an epoch's preparation (mining), a checkpoint's stall, a wait for
a write. Those costs are kept apart for the ETA (`seconds_left`): the evals still to come at
their average so far, the epochs still to prepare at the last one's. The rate is
engine.monitor.throughput's, over training time only.

The window reads no clock: the trainer's is the one it is told (`now`), so that a test that
drives the trainer's clock drives its rates too.
"""

from __future__ import annotations

import math
from typing import Iterable, NamedTuple

import torch

from engine.monitor.throughput import RateMeter


class Figures(NamedTuple):
    """What a report reads of its window, in one transfer from the device."""

    loss: float                  # the mean loss per sample (this rank's samples)
    loss_max: float | None       # the largest step's mean loss; None: no step had samples here
    grad_norm: float | None      # the mean of the steps' finite gradient norms; None: none kept
    grad_norm_max: float | None  # the largest of them
    nonfinite: int               # steps whose loss or gradient norm was NaN or infinite


# The window's running figures, one device vector (one read): the loss summed over samples,
# the largest step loss, the non-finite steps, the finite norms' sum, their largest, their count.
_LOSS_SUM, _LOSS_MAX, _NONFINITE, _NORM_SUM, _NORM_MAX, _NORMS = range(6)
_FOLD_AT = 1024  # micro-batches or steps kept before they are folded into the running figures


def grad_norm(parameters: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """The total L2 norm of the parameters' gradients, as a device tensor (no sync): what
    clip_grad_norm_ returns, without clipping. torch 2.6+ has it as get_total_norm (a foreach
    norm); before, a norm per gradient and the norm of those."""
    grads = [p.grad for p in parameters if p.grad is not None]
    total = getattr(torch.nn.utils, "get_total_norm", None)
    if total is not None:
        return total(grads)
    if not grads:
        return torch.zeros(())
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


class Window:
    # the window's losses, kept on the device until a report sums them: each micro-batch's,
    # its samples and the step it belongs to (counted from the last fold)
    _losses: list[torch.Tensor]
    _loss_counts: list[int]
    _loss_steps: list[int]
    _norms: list[torch.Tensor]  # each step's gradient norm, where the trainer measured it

    def __init__(self, device: torch.device, report_every_s: float, now: float):
        self.device = device
        self.meter = RateMeter(full_window_s=report_every_s)
        self.eval_s, self.evals = 0.0, 0            # time spent evaluating, for the ETA
        self.epoch_cost_s: float | None = None      # the last epoch preparation's (mining)
        self.restart(now)

    def restart(self, now: float) -> None:
        """A fresh window from `now`, after a report."""
        self.start = now
        self._figures = torch.zeros(6, device=self.device)   # kernels, not a copy from the host
        self._figures[_LOSS_MAX] = self._figures[_NORM_MAX] = -math.inf
        self._losses, self._loss_counts, self._loss_steps = [], [], []
        self._norms = []
        self._fold_steps = 0     # steps counted since the last fold
        self.samples = 0         # global samples trained in the window (throughput)
        self._loss_samples = 0   # this rank's samples behind the window's loss
        self.steps = 0

    def resize(self, report_every_s: float, now: float) -> None:
        """Windows of this length from now on, the first one starting `now`."""
        self.meter.full_window_s = report_every_s
        self.restart(now)

    def keep_loss(self, loss: torch.Tensor, n: int) -> None:
        """A micro-batch's loss over its `n` samples. Keeping the device tensor costs no kernel
        launch; they are folded in batches, at a step's end."""
        self._losses.append(loss)
        self._loss_counts.append(n)
        self._loss_steps.append(self._fold_steps)
        self._loss_samples += n

    def count(self, samples: int, norm: torch.Tensor | None = None) -> None:
        """An optimizer step of `samples` global samples, trained; `norm`: its gradient's total
        norm before clipping (a 0-d device tensor, kept as it is: no sync)."""
        self.samples += samples
        self.steps += 1
        self._fold_steps += 1
        if norm is not None:
            self._norms.append(norm.detach())
        if len(self._losses) >= _FOLD_AT or len(self._norms) >= _FOLD_AT:
            self._fold()

    def exclude(self, seconds: float) -> None:
        """Time that was not training (a stall, a wait): out of the window's rate."""
        self.start += seconds

    def evaluated(self, seconds: float) -> None:
        """An eval took this long: out of the window, and counted for the ETA."""
        self.eval_s, self.evals = self.eval_s + seconds, self.evals + 1
        self.exclude(seconds)

    def prepared(self, seconds: float, once_s: float) -> None:
        """An epoch's preparation took this long, of which `once_s` is not expected again (an
        index built once per attempt): out of the window, and the next epochs are expected to
        cost what this one did (a schedule that starts mining at epoch 6 moves the ETA once,
        at epoch 6, not a little at every epoch after)."""
        self.epoch_cost_s = max(0.0, seconds - once_s)
        self.exclude(seconds)

    def read(self) -> Figures:
        """The window's figures: the read is a host-device sync, the report's one."""
        self._fold()
        loss_sum, loss_max, nonfinite, norm_sum, norm_max, norms = self._figures.tolist()
        return Figures(loss=loss_sum / max(1, self._loss_samples),
                       loss_max=loss_max if loss_max > -math.inf else None,
                       grad_norm=norm_sum / norms if norms else None,
                       grad_norm_max=norm_max if norms else None,
                       nonfinite=int(nonfinite))

    def measure(self, now: float) -> float:
        """The window's training time up to `now`, added to the rate meter."""
        elapsed = max(now - self.start, 1e-9)
        self.meter.add(self.steps, self.samples, elapsed)
        return elapsed

    def seconds_left(self, steps: int, evals: int, epochs: int) -> float:
        """Training time for `steps` at the smoothed rate, plus `evals` at their average cost so
        far and `epochs` preparations at the last one's."""
        remaining = self.meter.seconds_for(steps) or 0.0
        if self.evals:
            remaining += evals * self.eval_s / self.evals
        if self.epoch_cost_s:
            remaining += epochs * self.epoch_cost_s
        return remaining

    def _fold(self) -> None:
        """The kept losses and norms into the running figures, on the device: a handful of
        kernels per fold (a report, or every _FOLD_AT micro-batches), none per step."""
        if not self._losses and not self._norms:
            self._fold_steps = 0
            return
        steps = max(self._fold_steps, self._loss_steps[-1] + 1 if self._loss_steps else 0)
        f = self._figures
        zero = torch.zeros((), device=self.device)
        bad = torch.zeros(steps, dtype=torch.bool, device=self.device)  # a step not finite
        loss_sum, loss_max = zero, torch.full((), -math.inf, device=self.device)
        if self._losses:
            m = len(self._losses)
            # the samples and steps of the micro-batches: one transfer to the device
            meta = torch.tensor(self._loss_counts + self._loss_steps, dtype=torch.int64)
            meta = meta.to(self.device, non_blocking=True)
            weights, index = meta[:m].float(), meta[m:]
            losses = torch.stack(self._losses).float()
            loss_sum = (losses * weights).sum()
            step_sum = torch.zeros(steps, device=self.device).index_add_(0, index, losses * weights)
            step_n = torch.zeros(steps, device=self.device).index_add_(0, index, weights)
            step_loss = step_sum / step_n.clamp(min=1)
            bad = ~torch.isfinite(step_loss) & (step_n > 0)
            loss_max = torch.where(bad | (step_n == 0), -math.inf, step_loss).max()
        norm_sum, norms, unaligned = zero, zero, zero
        norm_max = torch.full((), -math.inf, device=self.device)
        if self._norms:
            values = torch.stack(self._norms).float()
            finite = torch.isfinite(values)
            if len(self._norms) == steps:   # a norm for every step: a step is bad once
                bad = bad | ~finite
            else:                           # measured on some steps only: counted apart
                unaligned = (~finite).sum().float()
            norm_sum = torch.where(finite, values, 0.0).sum()
            norm_max = torch.where(finite, values, -math.inf).max()
            norms = finite.sum().float()
        self._figures = torch.stack([
            f[_LOSS_SUM] + loss_sum, torch.maximum(f[_LOSS_MAX], loss_max),
            f[_NONFINITE] + bad.sum().float() + unaligned,
            f[_NORM_SUM] + norm_sum, torch.maximum(f[_NORM_MAX], norm_max), f[_NORMS] + norms])
        self._losses, self._loss_counts, self._loss_steps, self._norms = [], [], [], []
        self._fold_steps = 0

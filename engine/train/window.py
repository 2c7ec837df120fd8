"""The trainer's reporting window, and the time it leaves out.

A step event reports a window: the steps, samples and training time since the last report,
and the loss of those steps, kept on the device until the report reads it (`loss`: the loop's
one host-device sync, engine.train.trainer). Time that is not training moves the window's
start past itself: an eval, an epoch's preparation (mining), a checkpoint's stall, a wait for
a write. Those costs are kept apart for the ETA (`seconds_left`): the evals still to come at
their average so far, the epochs still to prepare at the last one's. The rate is
engine.monitor.throughput's, over training time only.

The window reads no clock: the trainer's is the one it is told (`now`), so that a test that
drives the trainer's clock drives its rates too.
"""

from __future__ import annotations

import torch

from engine.monitor.throughput import RateMeter


class Window:
    # the window's losses, kept on the device until a report sums them
    _losses: list[torch.Tensor]
    _loss_counts: list[int]

    def __init__(self, device: torch.device, report_every_s: float, now: float):
        self.device = device
        self.meter = RateMeter(full_window_s=report_every_s)
        self.eval_s, self.evals = 0.0, 0            # time spent evaluating, for the ETA
        self.epoch_cost_s: float | None = None      # the last epoch preparation's (mining)
        self.restart(now)

    def restart(self, now: float) -> None:
        """A fresh window from `now`, after a report."""
        self.start = now
        self._loss = torch.zeros((), device=self.device)
        self._losses = []
        self._loss_counts = []
        self.samples = 0         # global samples trained in the window (throughput)
        self._loss_samples = 0   # this rank's samples behind the window's loss
        self.steps = 0

    def resize(self, report_every_s: float, now: float) -> None:
        """Windows of this length from now on, the first one starting `now`."""
        self.meter.full_window_s = report_every_s
        self.restart(now)

    def keep_loss(self, loss: torch.Tensor, n: int) -> None:
        """A micro-batch's loss over its `n` samples. Keeping the device tensor costs no kernel
        launch; they are summed in batches."""
        self._losses.append(loss)
        self._loss_counts.append(n)
        self._loss_samples += n
        if len(self._losses) >= 1024:
            self._fold_losses()

    def count(self, samples: int) -> None:
        """An optimizer step of `samples` global samples, trained."""
        self.samples += samples
        self.steps += 1

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

    def loss(self) -> float:
        """The window's mean loss per sample: the read is a host-device sync."""
        self._fold_losses()
        return float(self._loss) / max(1, self._loss_samples)

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

    def _fold_losses(self) -> None:
        if self._losses:
            weights = torch.tensor(self._loss_counts, dtype=torch.float32).to(self.device, non_blocking=True)
            self._loss += (torch.stack(self._losses).float() * weights).sum()
            self._losses, self._loss_counts = [], []

"""cockpit's callback for PyTorch Lightning, imported as `lightning` or as `pytorch_lightning`.

    from cockpit.integrations.lightning import CockpitCallback

    trainer = L.Trainer(accelerator=args.accelerator, precision=args.precision, max_steps=2000,
                        callbacks=[CockpitCallback(), ModelCheckpoint(every_n_train_steps=100)])
    trainer.fit(model, train, val, ckpt_path=args.ckpt_path)

Under cockpit (`cockpit run -- python train.py ...`) it reports:
- steps: the trainer's global step (optimizer steps) of the steps `max_steps` and
  `max_epochs` allow (Lightning's estimated_stepping_batches: the ETA); the samples seen (global step x the batch x
  `accumulate_grad_batches` x the world size); the epoch; the first optimizer's learning
  rate; and at each of its logging steps (`log_every_n_steps`) the loss, what the module
  logged and the gradient's total L2 norm (`grad_norm`: measured in `on_before_optimizer_step`,
  where Lightning hands over the accumulated gradient unscaled and not yet clipped, with
  torch's foreach norm at those steps only, and read with the loss);
- evaluations: the metrics logged during each validation (not the sanity check);
- checkpoints: every checkpoint the trainer writes (ModelCheckpoint's, or your own
  `trainer.save_checkpoint`) but weights-only ones, so a crash or a fallback resumes from it
  with the command's `resume` arguments (`--ckpt_path {checkpoint}` into `fit(ckpt_path=...)`).
The loss is what the module logged as `train_loss`, `loss`, `train/loss` (or `..._step`),
else what `training_step` returned. Outside cockpit it does nothing; nor on any process but
global rank 0, nor in a second copy given to the same trainer; and nothing in it can stop
training (a failure in a hook is one line on stderr and the callback goes quiet).

It subclasses the Callback of the package the script imported (`lightning` when both or
neither are imported yet, and installed); Lightning calls a callback's hooks by name, so either
works with either trainer.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from cockpit import report
from cockpit.integrations._common import (Owners, Throttle, guarded, needs_framework,
                                          samples_seen, scalars)

__all__ = ["CockpitCallback"]


def _callback_base():
    names = ["lightning.pytorch", "pytorch_lightning"]
    if "pytorch_lightning" in sys.modules and "lightning" not in sys.modules:
        names.reverse()
    errors = {}
    for name in names:
        try:
            module = __import__(name, fromlist=["Callback"])
        except ImportError as e:
            errors[name] = e
            continue
        return module.Callback
    raise needs_framework(__name__, "PyTorch Lightning", "lightning", errors)


_LOSS_NAMES = ("train_loss", "loss", "train/loss", "train_loss_step", "loss_step",
               "train/loss_step")
_owners = Owners()


# Whichever package's Callback the script imported: a class known only when this module runs.
_Callback: Any = _callback_base()


class CockpitCallback(_Callback):
    """Reports a Lightning run's steps, validations and checkpoints to cockpit; a no-op outside
    it, on every process but the first, and in a second copy given to the same trainer."""

    def __init__(self):
        self._throttle = Throttle()
        self._reported_step = None
        self._stepped = None          # the global step at the last batch's end
        self._batch = None            # samples in one micro-batch on one process
        self._total = None
        self._norm = None             # the gradient norm of the step about to log (a tensor)
        self._before_validation = {}
        self._eval_names = set()
        self._broken = False          # something went wrong in a hook: quiet from then on
        self._speaks = False          # under cockpit, global rank 0, this trainer's only copy

    # ------------------------------------------------------------ setup, checkpoints

    @guarded
    def setup(self, trainer, pl_module, stage):
        if stage != "fit":
            return
        self._speaks = report.active and trainer.is_global_zero and _owners.claim(trainer, self)
        if not self._speaks or getattr(trainer.save_checkpoint, "_cockpit", False):
            return
        save = trainer.save_checkpoint  # every ModelCheckpoint save goes through it

        def save_checkpoint(filepath, *args, **kwargs):
            save(filepath, *args, **kwargs)
            self._saved(trainer, filepath, *args, **kwargs)

        setattr(save_checkpoint, "_cockpit", True)   # the mark read above: a function's own attribute
        trainer.save_checkpoint = save_checkpoint

    @guarded
    def _saved(self, trainer, filepath, weights_only=None, *args, **kwargs):
        where = os.fspath(filepath)
        if not weights_only and "://" not in where:  # a weights-only one cannot resume
            report.checkpoint(where, trainer.global_step, samples=self._samples(trainer))

    def teardown(self, trainer, pl_module, stage):
        self._release(trainer)

    def on_exception(self, trainer, pl_module, exception):
        self._release(trainer)  # Lightning skips teardown when fit raises

    def _release(self, trainer):
        if getattr(vars(trainer).get("save_checkpoint"), "_cockpit", False):
            del trainer.save_checkpoint
        _owners.release(trainer, self)

    # ------------------------------------------------------------ steps

    @guarded
    def on_train_start(self, trainer, pl_module):
        if not self._speaks:
            return
        # max_steps and max_epochs both bound it: Lightning's own figure is the smaller
        total = trainer.estimated_stepping_batches
        self._total = int(total) if total and math.isfinite(total) else None
        self._stepped = trainer.global_step  # where it starts: 0, or a checkpoint's step

    @guarded
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if not self._speaks or step == self._stepped:
            return  # outside cockpit, or a micro-batch that did not end an optimizer step
        self._stepped = step
        if self._batch is None:
            self._batch = _batch_size(batch)
        report.reached(step, samples=self._samples(trainer))  # every step: a crash is told at it
        if step % max(1, trainer.log_every_n_steps) == 0:
            logged = self._logged(trainer)
            if self._norm is not None and "grad_norm" not in logged:
                logged["grad_norm"] = float(self._norm)
            self._norm = None
            self._step(trainer, batch_idx, loss=self._loss(trainer, outputs), **logged)
            self._throttle.reported()
        elif self._throttle.due(final=self._total is not None and step >= self._total):
            self._step(trainer, batch_idx)

    @guarded
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        # Only before a step that logs: the norm is a device tensor, read with the loss there
        # (a read every step would wait for the device every step).
        if not self._speaks or (trainer.global_step + 1) % max(1, trainer.log_every_n_steps):
            return
        self._norm = _total_norm(pl_module.parameters())

    @guarded
    def on_train_end(self, trainer, pl_module):
        if self._speaks and self._reported_step != trainer.global_step:
            self._step(trainer)  # the last step (EarlyStopping, or one the throttle skipped)

    def _step(self, trainer, batch_idx=None, loss=None, **metrics):
        batches = trainer.num_training_batches
        if batch_idx is not None and isinstance(batches, int) and batches > 0:
            metrics["epoch"] = trainer.current_epoch + (batch_idx + 1) / batches
        if trainer.optimizers and "lr" not in metrics:
            metrics["lr"] = trainer.optimizers[0].param_groups[0]["lr"]  # a float: no sync
        report.step(trainer.global_step, total=self._total, loss=loss,
                    samples=self._samples(trainer), **metrics)
        self._reported_step = trainer.global_step

    def _samples(self, trainer) -> int | None:
        if not self._batch:
            return None
        return samples_seen(trainer.global_step,
                            self._batch * trainer.accumulate_grad_batches * trainer.world_size)

    def _loss(self, trainer, outputs):
        logged = trainer.callback_metrics
        for name in _LOSS_NAMES:
            if name in logged:
                return logged[name]
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None or not hasattr(loss, "item"):
            return None
        # What training_step returned, as Lightning hands it on: divided by the accumulation.
        return loss.item() * trainer.accumulate_grad_batches

    def _logged(self, trainer) -> dict:
        def drop(name):
            return name in _LOSS_NAMES or name in self._eval_names or name in ("step", "epoch")
        return scalars(trainer.callback_metrics, drop=drop)

    # ------------------------------------------------------------ validation

    @guarded
    def on_validation_start(self, trainer, pl_module):
        if self._speaks and not trainer.sanity_checking:
            self._before_validation = scalars(trainer.callback_metrics)

    @guarded
    def on_validation_end(self, trainer, pl_module):
        if not self._speaks or trainer.sanity_checking:
            return
        # What this validation logged: names new or changed since it began, and those an
        # earlier validation logged (an accuracy may come out the same twice)
        before = self._before_validation
        logged = {k: v for k, v in scalars(trainer.callback_metrics).items()
                  if (before.get(k) != v or k in self._eval_names) and k not in ("step", "epoch")}
        if not logged:
            return
        self._eval_names.update(logged)
        if self._reported_step != trainer.global_step:
            self._step(trainer)  # an evaluation is recorded at the last step reported
        report.eval(**logged)


def _total_norm(parameters):
    """The gradients' total L2 norm, a device tensor (torch 2.6+: get_total_norm, a foreach
    norm; before, a norm per gradient and the norm of those)."""
    import torch

    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return None
    total = getattr(torch.nn.utils, "get_total_norm", None)
    if total is not None:
        return total(grads)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


def _batch_size(batch) -> int | None:
    """Samples in a batch: the first dimension of its first tensor (Lightning's own rule)."""
    try:
        from lightning.pytorch.utilities.data import extract_batch_size
    except ImportError:
        try:
            from pytorch_lightning.utilities.data import extract_batch_size
        except ImportError:
            return None
    try:
        return int(extract_batch_size(batch))
    except Exception:  # a batch it cannot read (it raises MisconfigurationException)
        return None

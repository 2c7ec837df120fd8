"""The trainer's checkpoints: when (engine.train.cadence), what its state is, each told once
complete on disk (engine.train.checkpointer writes them off the loop), and where an attempt
resumes (engine.train.restore), with what a rewind to that checkpoint asks: batches skipped in
the data, the learning rate lowered (engine.run.rewind).

A part of engine.train.trainer.Trainer, kept apart so that the loop's file reads as the loop.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from engine.emit import Emit
from engine.monitor import device as devices
from engine.presets import DevicePreset, TrainSettings
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.schema import to_table
from engine.train import checkpointer, optim, restore
from engine.train.cadence import Cadence
from engine.train.distributed import World
from engine.train.failures import NonFiniteLoss, all_finite
from engine.train.window import Window


class Saving:
    """The trainer's checkpointing and resuming (engine.train.trainer.Trainer sets all of these)."""

    run: RunDir
    events: EventWriter
    emit: Emit
    preset: DevicePreset
    train: TrainSettings
    world: World
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    schedule: optim.Schedule
    scaler: torch.amp.GradScaler
    window: Window
    checkpoints: checkpointer.Writer
    cadence: Cadence
    step: int
    samples_seen: int
    skipped_samples: int      # samples the run's rewinds skipped: the data is this much further on
    lr_scale: float           # the learning rate's factor since lower-lr rewinds
    first_global_batch: int
    global_batch: int
    resumed_from: dict | None
    _saved_step: int | None
    _last_checkpoint_t: float

    def report(self) -> None:   # the loop's (a step event for the window so far)
        raise NotImplementedError

    def maybe_checkpoint(self) -> None:
        self._tell_checkpoints(self.checkpoints.poll())   # a background write that has finished
        if self.cadence.due(self.step, self._saved_step, time.monotonic() - self._last_checkpoint_t):
            self.save_checkpoint()

    def save_checkpoint(self) -> None:
        if self.step == self._saved_step:
            return  # this step is on disk already, or being written (the schedule saved the last step)
        # Never save a non-finite state: the window's loss and the weights are checked first
        # (one sync per checkpoint), so a resume always starts from good weights.
        self.report()
        started = time.monotonic()   # the loop's stall: the check, a wait, the copy to the host
        if not all_finite(list(self.model.parameters())):
            raise NonFiniteLoss(self.step, "non-finite weights")
        self._saved_step = self.step
        if not self.world.is_main:
            return  # every rank holds the same weights; rank 0 writes them
        done = self.checkpoints.save({
            "step": self.step,
            "samples_seen": self.samples_seen,
            "skipped_samples": self.skipped_samples,
            "lr_scale": self.lr_scale,
            "first_global_batch": self.first_global_batch,
            "model": self.model.state_dict(),  # the uncompiled module's names
            "optimizer": self.optimizer.state_dict(),
            "scheduler": (self.scheduler.state_dict() if self.scheduler is not None
                          else {"schedule": self.schedule.state_dict()}),
            "scaler": self.scaler.state_dict(),
            "rng": devices.rng_state(),
            "config": {"device": to_table(self.preset), "train": to_table(self.train)},
        }, stall_from=started)
        self._last_checkpoint_t = time.monotonic()
        # Only the stall leaves the window: a background write runs alongside training.
        self.window.exclude(self._last_checkpoint_t - started)
        self._tell_checkpoints(*done)

    def finish_checkpoints(self) -> None:
        """Wait for the checkpoint being written, if any, and tell it: the end of an attempt.
        The wait is in its save_s, and out of the reporting window."""
        started = time.monotonic()
        written = self.checkpoints.wait()
        self.window.exclude(time.monotonic() - started)
        self._tell_checkpoints(written)

    def _tell_checkpoints(self, *written: checkpointer.Written | None) -> None:
        """A `checkpoint` event for each write complete on disk: save_s is what the loop paid
        for it (the copy to the host, and any wait for the write before it: wait_s), write_s
        the write's own time (in the background, alongside training)."""
        for w in written:
            if w is None:
                continue
            self.events.emit("checkpoint", step=w.step, samples_seen=w.samples_seen,
                             path=str(w.path.relative_to(self.run.path)), save_s=round(w.stall_s, 3),
                             write_s=round(w.write_s, 3), wait_s=round(w.wait_s, 3))
            rate = self.window.meter.samples_per_s
            chosen = self.cadence.written(w.stall_s, w.write_s, self.global_batch / rate if rate else None)
            if chosen is not None:   # 'auto' chose anew: said when it moves by more than a tenth
                self.emit("checkpoint_interval", steps=chosen.steps, seconds=round(chosen.seconds, 2),
                          cost_s=round(chosen.cost_s, 4), mtbf_s=round(chosen.mtbf_s, 1),
                          crashes=chosen.crashes, observed_s=round(chosen.observed_s, 1),
                          reason=chosen.reason)

    def _resume(self) -> dict | None:
        """Continue from the newest checkpoint that loads (engine.train.restore): where, and
        from which step and sample; None for a start from the beginning."""
        restored = restore.newest(self.run, model=self.model, optimizer=self.optimizer,
                                  scheduler=self.scheduler, scaler=self.scaler,
                                  first_global_batch=self.first_global_batch, emit=self.emit,
                                  set_aside=self.world.is_main)
        if restored is None:
            return None
        self.step, self.samples_seen = restored.step, restored.samples_seen
        self.skipped_samples, self.lr_scale = restored.skipped_samples, restored.lr_scale
        self.first_global_batch = restored.first_global_batch
        return {"path": restored.path, "step": self.step, "samples_seen": self.samples_seen,
                "load_s": restored.load_s,
                **({"data_position": self.data_position, "lr_scale": self.lr_scale}
                   if self.skipped_samples or self.lr_scale != 1.0 else {})}

    @property
    def data_position(self) -> int:
        """The position in the data order of the next sample: those trained and those skipped."""
        return self.samples_seen + self.skipped_samples

    def _skip(self, batches: int, lr_factor: float) -> None:
        """After a rewind to the checkpoint it resumed from: skip `batches` of this attempt's
        global batch in the data (the batches that went bad among them), and multiply the
        learning rate by `lr_factor` from here on (a workload's own scheduler: its base rates)."""
        self.skipped_samples += batches * self.global_batch
        self.lr_scale *= lr_factor
        if self.scheduler is not None and lr_factor != 1.0:
            self.scheduler.base_lrs = [lr * lr_factor for lr in self.scheduler.base_lrs]
            for group in self.optimizer.param_groups:
                group["lr"] *= lr_factor
        if self.resumed_from is not None:
            self.resumed_from.update(data_position=self.data_position, lr_scale=self.lr_scale,
                                     skipped_batches=batches)

"""Helpers for the tests that drive the built-in trainer in this process."""

from __future__ import annotations

from engine import runconfig
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.train.trainer import Trainer


def trainer_for(run: RunDir, *device_overrides: str, stop_after: int | None = None,
                record: list | None = None, attempt: int = 1) -> Trainer:
    config = run.config()
    _, preset = runconfig.apply_overrides(config.workload, config.device, list(device_overrides))
    trainer = Trainer(run, EventWriter(run.events_path, attempt=attempt), "cpu", preset)
    if stop_after is not None:
        step = trainer.train_step

        def step_then_maybe_stop():
            step()
            if trainer.step == stop_after:
                trainer.stop.requested = True
        trainer.train_step = step_then_maybe_stop
    if record is not None:
        batch = trainer.workload.batch

        def recording_batch(indices, dev):
            record.append(indices.clone())
            return batch(indices, dev)
        trainer.workload.batch = recording_batch
    return trainer

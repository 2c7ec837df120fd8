"""Which worker times a candidate: the probe's trainer (engine.probe.measure.Worker) or the
user's own command (engine.probe.command_worker.CommandWorker, a Worker that spawns the command
and reads its output). The speed probe and the batch finder both start theirs here."""

from __future__ import annotations

from pathlib import Path

from engine.preset_types import DevicePreset
from engine.probe.command_worker import CommandWorker
from engine.probe.measure import Worker
from engine.runconfig import RunConfig


def start_worker(config: RunConfig, preset: DevicePreset, scratch: Path, **kwargs) -> Worker:
    """The probe's worker for this workload: the trainer, or the user's own command."""
    if config.workload.is_command:
        return CommandWorker(config, preset, scratch, **kwargs)
    return Worker(config, preset, scratch, **kwargs)

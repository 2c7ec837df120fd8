"""Every way a training process starts or is found, one launcher each.

    trainer    engine.train.trainer in one process                    (launchers.trainer)
    node       engine.train.trainer on one machine of several            (launchers.node)
    torchrun   engine.train.trainer in several, through torchrun      (launchers.torchrun)
    command    the user's own command, its argv filled in per attempt (launchers.command)
    adopted    a process cockpit did not start, found by its pid      (launchers.adopted)

An attempt's launcher is the first of LAUNCHERS that fits its workload and device preset (a
fallback can move a run from torchrun to one process); `cockpit adopt` gives its supervisor the
adopted launcher itself. A new way of starting is a module here and a line in LAUNCHERS.
"""

from __future__ import annotations

from engine.preset_types import DevicePreset
from engine.record.rundir import RunDir
from engine.run.launchers.base import Launcher
from engine.run.launchers.command import CommandLauncher
from engine.run.launchers.node import NodeLauncher
from engine.run.launchers.torchrun import TorchrunLauncher
from engine.run.launchers.trainer import TrainerLauncher
from engine.runconfig import RunConfig

# In the order they are asked: the first that fits starts the attempt.
LAUNCHERS: tuple[type[Launcher], ...] = (CommandLauncher, NodeLauncher, TorchrunLauncher, TrainerLauncher)


def for_attempt(run: RunDir, config: RunConfig, preset: DevicePreset) -> Launcher:
    """The launcher of an attempt of `config`'s run on `preset`."""
    return next(kind for kind in LAUNCHERS if kind.fits(config, preset))(run, config)


__all__ = ["LAUNCHERS", "Launcher", "for_attempt"]

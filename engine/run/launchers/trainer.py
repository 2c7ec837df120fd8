"""The built-in trainer (a protocol workload's too) in one process.

`python -P -m engine.train.trainer RUN --attempt N ...`, stopped with SIGTERM (it finishes its
step, checkpoints and exits), its exit codes engine.vocabulary's; a spare started ahead can
become it (engine.train.spare). Its torch.compile caches are the user's (engine.run.launch.
compile_caches, unless the user's environment or the preset names them), so neither a retry nor
a new run of the same model compiles from scratch. In several processes it runs under torchrun
(engine.run.launchers.torchrun).
"""

from __future__ import annotations

import json
import sys
import time

from engine.preset_types import DevicePreset
from engine.record.rundir import RunDir
from engine.run.launch import Launch, child_env, compile_caches
from engine.run.launchers.base import Launcher
from engine.runconfig import RunConfig
from engine.schema import to_table
from engine.train.faults import STARTED_ENV
from engine.workloads.builtin import BUILTIN

# What differs between two attempts' environments whatever their presets: not a reason to
# refuse a spare (it is given the attempt's at the hand-over).
SPARE_VARYING = (STARTED_ENV,)


class TrainerLauncher(Launcher):
    """engine.train.trainer in one process."""

    name = "trainer"

    @classmethod
    def fits(cls, config: RunConfig, preset: DevicePreset) -> bool:
        return not config.workload.is_command

    def launch(self, attempt: int, name: str, preset: DevicePreset, resume: dict | None = None) -> Launch:
        return trainer_launch(self.run, attempt, name, preset, rewind=(resume or {}).get("rewind"))

    def spare(self, attempt: int, name: str, preset: DevicePreset) -> dict | None:
        return spare_for(self.config, preset)


def spare_for(config: RunConfig, preset: DevicePreset) -> dict:
    """A spare for an attempt of this run on `preset` (engine.run.spare.Spare's keywords), before
    the run directory need exist (`cockpit --no-ui` starts the first attempt's while it checks
    the device): torch and the workload's modules imported, the device's context created and
    the workload built ahead (engine.train.startup)."""
    workload = config.workload
    warm: tuple[str, ...] = ()
    if (module := BUILTIN.get(workload.workload)) is not None:
        warm = (module, f"{module}.workload")   # its card and (where it has one) its model
    if preset.compile:
        warm += ("torch._inductor.compile_fx",)   # the compiler's own modules, a second or more
    warm = (f"--device={preset.device}", f"--workload={json.dumps(to_table(workload))}",
            # a built-in's compiled model: built and compiled ahead too, where the spare finds
            # room (a user's workload may keep state that the spare's pass through its batch()
            # and loss() would move, a generator of its own: the attempt builds its model)
            *([f"--preset={json.dumps(to_table(preset))}"] if preset.compile and module else []), *warm)
    env = trainer_env(preset, time.time())
    return {"env": env, "cwd": None, "warm": warm, "varying": SPARE_VARYING}


def trainer_launch(run: RunDir, attempt: int, name: str, preset: DevicePreset,
                   started: float | None = None, launcher: list[str] | None = None,
                   rewind: dict | None = None) -> Launch:
    """`python -P -m engine.train.trainer ...`, or behind `launcher` (torchrun's argv);
    `rewind`: what the rewinds to the checkpoint it resumes from ask (engine.run.rewind)."""
    trainer = ["-m", "engine.train.trainer", str(run.path), "--attempt", str(attempt),
               "--preset", name, "--device-json", json.dumps(to_table(preset))]
    if rewind and (rewind.get("skip_batches") or rewind.get("lr_scale", 1.0) != 1.0):
        trainer += ["--skip-batches", str(rewind["skip_batches"]), "--lr-scale", repr(rewind["lr_scale"])]
    started = time.time() if started is None else started
    argv = launcher + trainer if launcher else [sys.executable, "-P", *trainer]
    return Launch(argv=argv, env=trainer_env(preset, started, torchrun=bool(launcher)), started=started)


def trainer_env(preset: DevicePreset, started: float, torchrun: bool = False) -> dict[str, str]:
    """The trainer's environment: the compile caches, the preset's, when it was launched."""
    # torchrun starts its workers itself; PYTHONSAFEPATH is -P for them (the working directory
    # must not shadow engine or the workload).
    return child_env({**compile_caches(preset), **preset.env, **({"PYTHONSAFEPATH": "1"} if torchrun else {}),
                      STARTED_ENV: repr(started)})  # timed faults count from it

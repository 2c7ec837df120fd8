"""The built-in trainer in several processes: torch.distributed's own launcher, torchrun.

A device preset whose nproc_per_node asks for more than one process on this machine runs its
attempt as `python -m torch.distributed.run ... -m engine.train.trainer ...`, supervised like any
attempt; every worker finds its rank in engine.train.distributed. Its stop signals go to its
workers (each in a session of its own), so that every rank checkpoints through the same stop
agreement; how it ended is the first failing rank's end (torchrun's ChildFailedError report),
not torchrun's own exit 1. torchrun never restarts workers itself (`--max-restarts=0`): the
supervisor owns retries, with a changed preset, and identical restarts would hide the crash.
"""

from __future__ import annotations

import signal
import sys


from engine.preset_types import DevicePreset
from engine.record.attempt_log import TAIL_LINES
from engine.run.crashes import Verdict, torchrun_root_cause
from engine.run.launch import Launch
from engine.run.launchers.trainer import TrainerLauncher, trainer_launch
from engine.run.process import AttemptProcess, to_workers
from engine.run.watch import AttemptWatch
from engine.runconfig import RunConfig


class TorchrunLauncher(TrainerLauncher):
    """engine.train.trainer in several processes, through torchrun."""

    name = "torchrun"
    tail_lines = TAIL_LINES * 3   # every rank's last words, and torchrun's report

    def deliver(self, process: AttemptProcess, sig: signal.Signals) -> None:
        """Its workers, so that every rank checkpoints through the same stop agreement."""
        to_workers(process, sig)

    @classmethod
    def fits(cls, config: RunConfig, preset: DevicePreset) -> bool:
        return super().fits(config, preset) and preset.world_size > 1

    def launch(self, attempt: int, name: str, preset: DevicePreset, resume: dict | None = None) -> Launch:
        return trainer_launch(self.run, attempt, name, preset, launcher=torchrun_argv(preset),
                              rewind=(resume or {}).get("rewind"))

    def spare(self, attempt: int, name: str, preset: DevicePreset) -> dict | None:
        return None   # torchrun starts its own workers

    def judge(self, watch: AttemptWatch, launch: Launch, code: int | None, tail: str, *,
              released: bool = False, total: int | None = None,
              **facts) -> tuple[Verdict, int | None, str | None]:
        if code is not None and code > 0 and (cause := torchrun_root_cause(tail)) is not None:
            # How the first failing rank ended, not torchrun's own exit 1; the other ranks'
            # errors are consequences of it.
            rank, code = cause
            watch.exception = watch.exceptions.get(rank)
            watch.numerical = watch.numericals.get(rank)
        return super().judge(watch, launch, code, tail, **facts)


def torchrun_argv(preset: DevicePreset, python: str = sys.executable, *,
                  rendezvous: tuple[str, ...] = ("--standalone",)) -> list[str]:
    """The torchrun command in front of `-m engine.train.trainer ...`: on this machine alone
    (`--standalone`), or with a node's `rendezvous` (engine.run.launchers.node)."""
    return [python, "-m", "torch.distributed.run", f"--nproc-per-node={preset.nproc_per_node}",
            # The supervisor owns retries (with a changed preset); torchrun restarting
            # identical workers would hide the crash from it.
            "--max-restarts=0", *rendezvous]

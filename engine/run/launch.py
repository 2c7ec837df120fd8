"""An attempt's launch: what is started, how its output is read and how it is stopped.

Each attempt is a Launch, built by its launcher (engine.run.launchers: the built-in trainer,
torchrun, the user's command) from the workload preset, the device preset as resolved for that
attempt and the resume point. It is data: the launcher says what it means. Torch-free.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import engine
from engine import paths
from engine.command.progress import OutputParser
from engine.command.tracker import Units
from engine.preset_types import DevicePreset

_PROJECT_ROOT = str(Path(engine.__file__).resolve().parent.parent)

# torch.compile's on-disk caches: Inductor's (FX graphs, AOTAutograd's joint graphs, the C++ and
# Triton kernels) and Triton's own. Inductor's FX graph and AOTAutograd caches are on by default
# in the torch the tests run (2.13: fx_graph_cache and enable_autograd_cache default True), so
# they are not forced: TORCHINDUCTOR_FX_GRAPH_CACHE=1 would override a script's own choice.
COMPILE_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


@dataclass(frozen=True)
class Launch:
    """How one attempt is started, read and stopped."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None
    progress: str = "none"          # "auto": parse the output for progress (commands)
    progress_regex: str = ""
    units: Units = field(default_factory=Units)  # a command's step in samples (engine.command.units)
    known: dict = field(default_factory=dict)     # what its argv says (engine.command.statements)
    total_steps: int = 0            # the preset's, when the output does not say
    resume: dict | None = None      # {"path", "step"}: the checkpoint a command resumes from
    stop_signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGTERM, signal.SIGKILL)
    stop_grace_s: float | None = None   # escalate to the next stop signal after this long
    signal_faults: tuple[str, ...] = ()  # step faults the supervisor delivers (commands)
    timed_faults: tuple[str, ...] = ()   # timed faults the supervisor delivers (commands)
    script_faults: tuple[str, ...] = ()  # faults cockpit.report raises in the script (commands)
    started: float = field(default_factory=time.time)  # the attempt's start, as its env says
    device: str | None = None       # the device the placeholders named (commands)
    precision: str | None = None

    def parser(self, epoch_base: int | None = None) -> OutputParser | None:
        """What reads its output (a command's); `epoch_base`: how the run's earlier attempts
        numbered their epochs (from 0 or 1), which a resumed attempt cannot tell by itself."""
        if self.progress != "auto":
            return None
        return OutputParser(self.progress_regex or None, known=self.known, epoch_base=epoch_base)


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **extra, "PYTHONUNBUFFERED": "1"}
    # The trainer imports engine from the same place this process did, installed or not,
    # and a custom workload's module from the directory this process imported it from (the
    # children run with -P, so their working directory cannot shadow it).
    from engine.workloads import custom

    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_PROJECT_ROOT, *custom.import_roots(), env.get("PYTHONPATH")) if p)
    return env


def compile_caches(preset: DevicePreset) -> dict[str, str]:
    """torch.compile's caches for an attempt, the built-in trainer's or a command's, for those
    the user's environment and the preset leave unset: one pair under the user's cache dir
    (engine.paths.compile_cache_dir) for every run, so an attempt after a crash, and a new run
    of the same model, find the kernels compiled before them.

    One pair for all is what torch does by default too (/tmp/torchinductor_<user> and
    ~/.triton/cache hold every process's of a user). Entries are keyed by what they compile
    (the graph, the compiler's config, torch's version, the device), so runs of other models
    never read each other's; and processes may share them at once: Inductor writes each entry to
    a file named by its pid and thread and renames it into place (write_atomic in
    torch/_inductor/codecache.py), with file locks in the cache's locks/ where processes could
    compile the same thing, and Triton's cache renames a file written under a pid and a random
    id. torch's "Compile Time Caching Configuration" recipe names TORCHINDUCTOR_CACHE_DIR as the
    way to share the cache even across users."""
    root = paths.compile_cache_dir()
    return {var: str(root / sub) for var, sub in COMPILE_CACHES.items()
            if var not in os.environ and var not in preset.env}

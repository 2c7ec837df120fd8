"""An attempt's launch: what the supervisor starts and how it reads it.

One supervisor runs both kinds of workload. Each attempt is a Launch built from the workload
preset, the device preset as resolved for that attempt and the resume point:

- the built-in trainer (`python -m engine.train.trainer`, or torchrun for several processes): it
  writes its own events, finds its own checkpoint and speaks engine.run.crashes' exit codes; its
  torch.compile caches are the run's (compile-cache/ in the run directory, unless the user's
  environment or the preset names them), so a retry does not compile from scratch, and its
  process may be a spare started ahead of it (`spare_for`, engine.train.spare);
- the user's command: its argv templated from the device preset (engine.command), `resume`
  appended with the newest checkpoint it wrote, progress read from its output
  (engine.command.progress) or reported through cockpit.report, its exit codes its own, a stop
  delivered as Ctrl-C would be (SIGINT to its process group, then SIGTERM, then SIGKILL).

Torch-free.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import engine
from engine import command as commands
from engine import vocabulary
from engine.train.faults import STARTED_ENV
from engine.train.distributed import launch_prefix
from engine.presets import DevicePreset
from engine.command import statements
from engine.command.progress import OutputParser
from engine.command.tracker import Units
from engine.record import reached
from engine.record.rundir import RunDir
from engine.runconfig import RunConfig
from engine.schema import to_table
from engine.workloads.builtin import BUILTIN

_PROJECT_ROOT = str(Path(engine.__file__).resolve().parent.parent)


@dataclass(frozen=True)
class Launch:
    """How one attempt is started, read and stopped."""

    argv: list[str]
    env: dict[str, str]
    cwd: str | None = None
    is_command: bool = False        # exit codes are the command's own, not engine.run.crashes'
    distributed: bool = False       # torchrun: stop signals go to its workers
    group: bool = False             # stop signals go to its process group, as Ctrl-C's (commands)
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

    def describe(self) -> dict:
        """For the attempt_started event (a command's, so the user sees exactly what ran)."""
        if not self.is_command:
            return {}
        return {"command": self.argv, "command_line": shlex.join(self.argv), "cwd": self.cwd,
                "resume": self.resume, "device": self.device, "precision": self.precision}


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **extra, "PYTHONUNBUFFERED": "1"}
    # The trainer imports engine from the same place this process did, installed or not,
    # and a custom workload's module from the directory this process imported it from (the
    # children run with -P, so their working directory cannot shadow it).
    from engine.workloads import custom

    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_PROJECT_ROOT, *custom.import_roots(), env.get("PYTHONPATH")) if p)
    return env


def build(run: RunDir, config: RunConfig, attempt: int, name: str, preset: DevicePreset,
          resume: dict | None = None) -> Launch:
    """The launch for this attempt; `resume` ({"path", "step"}) is where a command continues."""
    started = time.time()
    if config.workload.is_command:
        return command_launch(run, config, attempt, preset, resume, started)
    return trainer_launch(run, attempt, name, preset, started)


def trainer_launch(run: RunDir, attempt: int, name: str, preset: DevicePreset,
                   started: float | None = None) -> Launch:
    trainer = ["-m", "engine.train.trainer", str(run.path), "--attempt", str(attempt),
               "--preset", name, "--device-json", json.dumps(to_table(preset))]
    # Several processes: torch.distributed's own launcher, supervised like any attempt.
    launcher = launch_prefix(preset.nproc_per_node, preset.nnodes, preset.rdzv_endpoint,
                             run.id, sys.executable)
    # torchrun starts its workers itself; PYTHONSAFEPATH is -P for them (the working directory
    # must not shadow engine or the workload).
    started = time.time() if started is None else started
    env = child_env({**compile_caches(run, preset), **preset.env,
                     **({"PYTHONSAFEPATH": "1"} if launcher else {}),
                     STARTED_ENV: repr(started)})  # timed faults count from it
    argv = launcher + trainer if launcher else [sys.executable, "-P", *trainer]
    return Launch(argv=argv, env=env, distributed=bool(launcher), started=started)


# torch.compile's on-disk caches (Inductor's FX graphs and kernels, Triton's), per run
COMPILE_CACHES = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def compile_caches(run: RunDir, preset: DevicePreset) -> dict[str, str]:
    """The run's own compile caches, for those the user's environment and the preset leave
    unset: an attempt after a crash finds the kernels its predecessors compiled."""
    root = run.path.resolve() / "compile-cache"
    return {var: str(root / sub) for var, sub in COMPILE_CACHES.items()
            if var not in os.environ and var not in preset.env}


# What differs between two attempts' environments whatever their presets: not a reason to
# refuse a spare (it is given the attempt's at the hand-over).
SPARE_VARYING = (STARTED_ENV,)


def spare_for(run: RunDir, config: RunConfig, attempt: int, name: str,
              preset: DevicePreset) -> dict | None:
    """How to start a spare for attempt `attempt` on this preset (engine.run.process.Spare's
    keywords: its environment, directory and the modules it imports ahead), or None where a
    spare cannot serve: a command (the user's program, never pre-started) or several processes
    (torchrun starts its own)."""
    if config.workload.is_command:
        return None
    launch = trainer_launch(run, attempt, name, preset)
    if launch.distributed:
        return None
    warm: tuple[str, ...] = ()
    if (module := BUILTIN.get(config.workload.workload)) is not None:
        warm = (module, f"{module}.workload")   # its card and (where it has one) its model
    if preset.compile:
        warm += ("torch._inductor.compile_fx",)   # the compiler's own modules, a second or more
    return {"env": launch.env, "cwd": launch.cwd, "warm": warm, "varying": SPARE_VARYING}


def command_launch(run: RunDir, config: RunConfig, attempt: int, preset: DevicePreset,
                   resume: dict | None, started: float | None = None) -> Launch:
    spec = config.workload.params
    started = time.time() if started is None else started
    # Who fires which fault: cockpit.report raises its kinds inside the script (at report.step:
    # a step fault at its step, a timed one at the first call after its time), native-crash at
    # its step too, as a real abort(); the supervisor signals native-crash, hang and slow at the
    # step it reads or reports, and at their time. A timed native-crash is the supervisor's alone:
    # it knows the time, and the script only looks at its next report.
    inject = [vocabulary.parse(s) for s in preset.inject]
    in_script = [f.spec for f in inject if f.kind in vocabulary.IN_SCRIPT_KINDS
                 and not (f.timed and f.kind in vocabulary.SIGNAL_KINDS)]
    checkpoint = Path(resume["path"]) if resume else None
    values = commands.values(preset, run.path, attempt, checkpoint)
    argv = commands.fill(spec.command, values)
    known = statements.from_argv(argv)   # before the resume arguments: they name a file
    if checkpoint is not None and spec.resume:
        total = spec.total_steps or known.get("total", (None,))[0]
        if total is not None:  # what is left to train, for a script that counts from 0 again
            values["steps_left"] = str(max(0, total - ((resume or {}).get("step") or 0)))
        argv += commands.fill(spec.resume, values)
        if spec.resume_restores:  # said with the resume, in its attempt_started event
            resume = {**(resume or {}), "restores": spec.resume_restores}
    # Rich draws its live displays (Lightning's default progress bar where rich is installed)
    # only to a terminal: to a log file it prints the last frame at the end, and a run would
    # look silent, then hung. These two (Rich's own) make it draw frames the parser reads,
    # and a width that keeps a bar and its metrics on one line (80 wraps the loss away).
    env = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "200",
           **os.environ, **preset.env, "PYTHONUNBUFFERED": "1",
           # what cockpit.report reads: where to write, and the faults it raises
           "COCKPIT_EVENTS": str(run.events_path.resolve()), "COCKPIT_ATTEMPT": str(attempt),
           "COCKPIT_RUN_DIR": str(run.path.resolve()), "COCKPIT_DEVICE": values["device"],
           "COCKPIT_INJECT": ",".join(in_script), STARTED_ENV: repr(started),
           # where cockpit.report.reached publishes each step (engine.record.reached)
           reached.ENV: str(reached.path_of(run.path.resolve(), attempt))}
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if preset.threads and var not in preset.env:  # the preset's own env wins
            env[var] = str(preset.threads)
    # cockpit.report.resumed_from(): the samples seen at the checkpoint, where it was reported
    # with them, so a count of samples goes on from there (the batch may have changed)
    for var in ("COCKPIT_RESUME_STEP", "COCKPIT_RESUME_SAMPLES"):
        env.pop(var, None)
    if resume and resume.get("step") is not None and resume.get("samples_seen") is not None:
        env["COCKPIT_RESUME_STEP"] = str(resume["step"])
        env["COCKPIT_RESUME_SAMPLES"] = str(resume["samples_seen"])
    return Launch(
        argv=argv, env=env, cwd=spec.cwd or None, is_command=True, progress=spec.progress,
        progress_regex=spec.progress_regex, units=commands.units(spec, preset, known),
        known=known, total_steps=spec.total_steps, resume=resume,
        group=True, stop_signals=(signal.SIGINT, signal.SIGTERM, signal.SIGKILL),
        stop_grace_s=spec.stop_grace_s,
        signal_faults=tuple(f.spec for f in inject if f.kind in vocabulary.SIGNAL_KINDS and not f.timed),
        timed_faults=tuple(f.spec for f in inject if f.kind in vocabulary.SIGNAL_KINDS and f.timed),
        script_faults=tuple(in_script),
        started=started, device=values["device"], precision=values["precision"])

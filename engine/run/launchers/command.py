"""The user's own command: an unmodified training script, started as the presets fill it in.

Its argv is templated from the device preset (engine.command), `resume` appended with the newest
checkpoint it wrote; its progress is read from its output (engine.command.progress) or reported
through cockpit.report; its exit codes are its own (engine.run.crashes.COMMAND); a stop is
delivered as Ctrl-C would be: SIGINT to its process group, then SIGTERM, then SIGKILL, each after
its grace period. What it leaves behind (its DataLoader workers) is killed once it exits.

A command that is `python [options] script.py ...` or `python [options] -m module ...` gets a
spare, as the built-in trainer does: its own interpreter, with its options, environment and
working directory, started while the attempt before trains and importing torch from where the
script would (engine.handover), where the script imports torch before it runs any code of its
own. The user's program is never started ahead: the spare runs it, as __main__, only when it is
handed the next attempt's argv.
"""

from __future__ import annotations

import ast
import os
import shlex
import signal
import time
from pathlib import Path

from engine import command as commands
from engine import handover, vocabulary
from engine.command import interpreter, statements
from engine.preset_types import DevicePreset
from engine.record import reached
from engine.record.rundir import RunDir
from engine.run.crashes import COMMAND
from engine.run.kinds import CommandKind
from engine.run.launch import Launch, compile_caches
from engine.run.launchers.base import Launcher
from engine.run.process import AttemptProcess, to_group
from engine.runconfig import RunConfig
from engine.train.faults import STARTED_ENV

# What Ctrl-C in a terminal gives it, then what a terminal's closing and kill -9 would
COMMAND_STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
# A spare's program, and what its environment may differ in from the attempt it becomes: read
# by cockpit.report and the script at run time, never by the interpreter or torch as they start
HANDOVER = Path(handover.__file__)
SPARE_VARYING = ("COCKPIT_ATTEMPT", "COCKPIT_INJECT", "COCKPIT_RESUME_STEP", "COCKPIT_RESUME_SAMPLES",
                 STARTED_ENV, reached.ENV)


class CommandLauncher(Launcher):
    """The user's own command, its argv filled in per attempt."""

    name = "command"
    subject = COMMAND
    reads = CommandKind

    def deliver(self, process: AttemptProcess, sig: signal.Signals) -> None:
        """As a terminal's Ctrl-C: its whole process group (the script and its DataLoader workers)."""
        to_group(process, sig)

    @classmethod
    def fits(cls, config: RunConfig, preset: DevicePreset) -> bool:
        return config.workload.is_command

    def launch(self, attempt: int, name: str, preset: DevicePreset, resume: dict | None = None) -> Launch:
        return command_launch(self.run, self.config, attempt, preset, resume)

    def describe(self, launch: Launch) -> dict:
        """So that the user sees exactly what ran."""
        return describe_command(launch)

    def lifeline_plan(self, launch: Launch, slowest_gap: float) -> tuple[tuple[signal.Signals, ...], float, bool]:
        return launch.stop_signals, launch.stop_grace_s or 30.0, True

    def exited(self, process: AttemptProcess) -> None:
        process.kill()  # what it left behind (its DataLoader workers)

    def spare(self, attempt: int, name: str, preset: DevicePreset) -> dict | None:
        """The next attempt's interpreter, started ahead (engine.handover), where the command is
        a Python script or module that imports torch first; what differs from one attempt to
        the next (its number, its resume, when it started) is the hand-over's."""
        launch = self.launch(attempt, name, preset)
        cwd = launch.cwd or os.getcwd()
        parts = interpreter.python_parts(launch.argv, cwd)
        if parts is None:
            return None
        python, rest, path0 = parts
        target = rest[:2] if rest[0] == "-m" else rest[:1]
        modules = ahead(target, cwd)
        if modules is None:
            return None
        return {"argv": [*python, "-c", HANDOVER.read_text(), path0, *modules], "runs": python,
                "target": target, "env": launch.env, "cwd": launch.cwd, "varying": SPARE_VARYING,
                "restore_sigint": True}


# Libraries that import torch as they are imported: a script's first import of one is where
# torch is loaded.
LOADS_TORCH = frozenset({"torch", "torchvision", "torchaudio", "transformers", "lightning",
                         "pytorch_lightning", "accelerate", "trl", "peft", "timm", "deepspeed"})


def ahead(target: list[str], cwd: str) -> list[str] | None:
    """What a command's spare imports ahead: torch, and torch._dynamo, which every optimizer's
    constructor imports (a second more); the compiler's modules too for a script whose text
    asks torch.compile for its model (nanoGPT's `compile = True` does). None where that would
    change what the script does: code of its own runs before torch is loaded (it may set what
    torch reads as it loads, OMP_NUM_THREADS or sys.path), or its source is not found here (a
    module installed elsewhere)."""
    source = _source(target, cwd)
    if source is None or not _loads_torch_first(source):
        return None
    modules = ["torch", "torch._dynamo"]
    if "torch.compile" in source:
        modules.append("torch._inductor.compile_fx")
    return modules


def _source(target: list[str], cwd: str) -> str | None:
    if target[0] == "-m":   # a module of the working directory (sys.path[0] for -m)
        base = Path(cwd, *target[1].split("."))
        paths = [base.with_suffix(".py"), base / "__main__.py"]
    else:
        paths = [Path(cwd, target[0])]
    for path in paths:
        try:
            return path.read_text(errors="replace")
        except OSError:
            continue
    return None


def _loads_torch_first(source: str) -> bool:
    """Whether the script's top level loads torch (LOADS_TORCH) before any statement but
    imports, definitions and its docstring."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False   # its interpreter says what is wrong with it
    for node in tree.body:
        if isinstance(node, ast.Import):
            if any(alias.name.split(".")[0] in LOADS_TORCH for alias in node.names):
                return True
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").split(".")[0] in LOADS_TORCH:
                return True
        elif not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  or isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            return False
    return False


def describe_command(launch: Launch) -> dict:
    """attempt_started's fields for a command: its argv, as one line too, where it ran, what it
    resumed from, and the device and precision its placeholders named."""
    return {"command": launch.argv, "command_line": shlex.join(launch.argv), "cwd": launch.cwd,
            "resume": launch.resume, "device": launch.device, "precision": launch.precision}


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
    values = commands.values(preset, run.path, attempt, checkpoint, (resume or {}).get("rewind"))
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
    # torch.compile's caches, the built-in trainer's (engine.run.launch.compile_caches): a
    # resumed script that compiles finds its kernels compiled.
    env = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "200",
           **compile_caches(preset), **os.environ, **preset.env, "PYTHONUNBUFFERED": "1",
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
        argv=argv, env=env, cwd=spec.cwd or None, progress=spec.progress,
        progress_regex=spec.progress_regex, units=commands.units(spec, preset, known),
        known=known, total_steps=spec.total_steps, resume=resume,
        stop_signals=COMMAND_STOP,
        stop_grace_s=spec.stop_grace_s,
        signal_faults=tuple(f.spec for f in inject if f.kind in vocabulary.SIGNAL_KINDS and not f.timed),
        timed_faults=tuple(f.spec for f in inject if f.kind in vocabulary.SIGNAL_KINDS and f.timed),
        script_faults=tuple(in_script),
        started=started, device=values["device"], precision=values["precision"])

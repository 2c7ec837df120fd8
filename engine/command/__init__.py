"""Command workloads: the user's own, unmodified training command, supervised like any run.

A workload preset names a command instead of a workload:

    command = ["python", "train.py", "--bs", "{batch_size}", "--accum", "{accumulation}",
               "--device", "{device}", "--out", "{run_dir}/out"]
    cwd = "~/src/retriever"               # default: the directory cockpit was started in
    resume = ["--resume", "{checkpoint}"] # appended when an attempt resumes
    checkpoints = "{run_dir}/out/*.pt"    # where the script writes its checkpoints (newest wins)
    progress = "auto"                     # read progress from its output ("none": only cockpit.report)

Each attempt fills the placeholders from the device preset as resolved for that attempt and
from the run (PLACEHOLDERS); a fallback to another preset re-templates the argv, so the next
attempt gets that preset's batch size and device, and `resume` with the newest checkpoint.
The argv is never passed through a shell. Torch-free.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import string
from dataclasses import dataclass
from pathlib import Path
from typing import AbstractSet, Literal, Sequence

from engine.command import statements
from engine.command.progress import compile_regex
from engine.command.tracker import Units
from engine.errors import ConfigError
from engine.monitor import machine
from engine.preset_types import DevicePreset
from engine.schema import FieldError, setting

PLACEHOLDERS = {
    "device": "the device: cpu, cuda or mps ('auto' resolved for this machine)",
    "batch_size": "the micro-batch",
    "accumulation": "micro-batches per optimizer step",
    "effective_batch": "batch_size x accumulation",
    "precision": "fp32, bf16 or fp16 ('auto': bf16 on CUDA, else fp32)",
    "threads": "CPU threads (the preset's, else the physical cores)",
    "run_dir": "the run directory (absolute)",
    "attempt": "the attempt number, from 1",
    "checkpoint": "the newest checkpoint (in `resume` only)",
    "steps_left": "the run's total steps less the checkpoint's (in `resume` only), for a script "
                  "that counts its steps from 0 again when it resumes (mlx-lm's --iters)",
    # After a health finding's rewind (engine.run.rewind): what the script's own checkpoint
    # does not know. 0 and 1 until then.
    "skip_batches": "batches to skip past where its checkpoint says the data is: those the run's "
                    "rewinds skipped ([health] skip_batches), 0 until one does",
    "data_offset": "the same in samples: skip_batches x effective_batch",
    "lr_scale": "the factor its learning rate is to be multiplied by: 0.5 after each lower-lr "
                "rewind, 1 until one",
    # Derived, for the frameworks' own flags (an argument that is one placeholder alone and
    # comes out empty is left out, so `{hf_precision_flag}` adds nothing for fp32):
    "hf_precision_flag": "Hugging Face TrainingArguments' precision flag: --bf16, --fp16, or "
                         "nothing for fp32",
    "hf_device_flag": "--use_cpu on the CPU (the Trainer would otherwise take CUDA or MPS "
                      "itself), else nothing",
    "lightning_precision": "Lightning's precision string: 32-true, bf16-mixed or 16-mixed",
    "mlx_device": "MLX's device: gpu (Metal on a Mac, CUDA elsewhere) for mps or cuda, cpu for "
                  "cpu (python -m cockpit.integrations.mlx --device {mlx_device} ...)",
}
# Lightning takes {device} as its accelerator as it is: "cpu", "cuda" or "mps".
_HF_PRECISION_FLAG = {"fp32": "", "bf16": "--bf16", "fp16": "--fp16"}
_LIGHTNING_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
_PRECISION_PLACEHOLDERS = frozenset({"precision", "hf_precision_flag", "lightning_precision"})
# Only a resume knows its checkpoint; the glob that finds it cannot depend on it either.
_RESUME_ONLY = ("checkpoint", "steps_left")
# What a checkpoint glob may name: it is filled before any attempt's device is known.
_GLOB_PLACEHOLDERS = ("run_dir",)


@dataclass(frozen=True, kw_only=True, slots=True)
class CommandSpec:
    """A workload that is the user's own training command."""

    command: tuple[str, ...] = setting(doc="the program and its arguments, with {placeholders}")
    cwd: str = setting("", "working directory ('~' expanded); '' = where cockpit was started")
    resume: tuple[str, ...] = setting([], "arguments appended when an attempt resumes, e.g. "
                                          "[\"--resume\", \"{checkpoint}\"]")
    checkpoints: str = setting("", "glob of the checkpoints the script writes (newest wins), "
                                   "e.g. \"{run_dir}/out/*.pt\"; relative to cwd")
    progress: Literal["auto", "none"] = setting(
        "auto", "'auto': read tqdm bars, step lines, key=value pairs and HF log dicts from its "
                "output; 'none': only what it reports through cockpit.report")
    progress_regex: str = setting("", "your own regex for progress lines, tried first; named "
                                      "groups step, total, loss, lr, epoch, others are metrics")
    total_steps: int = setting(0, "optimizer steps in the whole run, for the ETA when the script "
                                  "does not say; 0 = from its output or argv", min=0)
    samples_per_step: int = setting(0, "samples in one optimizer step, when neither the script "
                                       "nor {batch_size} x {accumulation} says; 0 = unknown "
                                       "(throughput is then steps/s)", min=0)
    tokens_per_step: int = setting(0, "tokens in one optimizer step (a language model), for "
                                      "tokens/s; 0 = from the script's output, else none", min=0)
    steps_restart: bool = setting(False, "the script counts its steps from 0 again when it "
                                         "resumes (mlx-lm does): cockpit adds the checkpoint's "
                                         "step to the steps it prints")
    steps_are_micro_batches: bool = setting(False, "its step count is its micro-batches (mlx-lm's "
                                                   "iterations): a step is {batch_size} samples, "
                                                   "not batch x accumulation")
    resume_restores: str = setting("", "what a resume restores, said in the log when an attempt "
                                       "resumes (e.g. 'the adapter weights only'); '' = not said")
    main_metric: str = setting("", "the metric to show beside the loss (e.g. 'reward', "
                                   "'recall_10'); '' = a reward, else a recall or accuracy, "
                                   "when the script logs one")
    stop_grace_s: float = setting(30.0, "a stop sends SIGINT, then SIGTERM after this long, "
                                        "then SIGKILL after as long again", above=0.0)

    def __post_init__(self):
        if not self.command:
            raise FieldError("command", "is empty; expected the program and its arguments, "
                                        "e.g. [\"python\", \"train.py\"]")
        for key, args, allowed in (("command", self.command, _not(_RESUME_ONLY)),
                                   ("resume", self.resume, tuple(PLACEHOLDERS)),
                                   ("checkpoints", (self.checkpoints,), _GLOB_PLACEHOLDERS)):
            for arg in args:
                for name in placeholders(arg, key):
                    if name not in allowed:
                        raise FieldError(key, _unknown(name, arg, allowed))
        if "steps_left" in {n for arg in self.resume for n in placeholders(arg, "resume")} \
                and not self.total_steps and "total" not in statements.from_argv(list(self.command)):
            raise FieldError("resume", "{steps_left} needs the run's total steps; expected them "
                                       "in the command (e.g. --iters 600) or as total_steps")
        if "{" in self.command[0]:
            raise FieldError("command", f"the program {self.command[0]!r} has a placeholder; "
                                        "expected a fixed program name or path")
        if self.progress_regex:
            try:
                compile_regex(self.progress_regex)
            except ValueError as e:
                raise FieldError("progress_regex", str(e)) from None


def _not(excluded: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(n for n in PLACEHOLDERS if n not in excluded)


def _unknown(name: str, arg: str, allowed: tuple[str, ...]) -> str:
    if name in PLACEHOLDERS:
        where = "`resume`" if name in _RESUME_ONLY else "`command` and `resume`"
        return f"{{{name}}} in {arg!r} is only known in {where}"
    return (f"unknown placeholder {{{name}}} in {arg!r}; expected one of "
            + ", ".join("{" + n + "}" for n in allowed) + " (write {{ and }} for literal braces)")


def placeholders(arg: str, key: str) -> list[str]:
    """The placeholder names in one argument; FieldError for a malformed one."""
    try:
        parsed = list(string.Formatter().parse(arg))
    except ValueError as e:
        raise FieldError(key, f"{arg!r}: {e} (write {{{{ and }}}} for literal braces)") from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not re.fullmatch(r"[a-z_]+", name) or spec or conversion:
            raise FieldError(key, f"{arg!r}: '{{{name}{'!' + conversion if conversion else ''}"
                                  f"{':' + spec if spec else ''}}}' is not a placeholder; expected "
                                  "a bare name such as {batch_size}")
        names.append(name)
    return names


def display(args) -> str:
    """An argv as a person reads it: quoted only where a word has spaces or quotes
    (shlex.join would quote every {placeholder})."""
    import shlex

    return " ".join(shlex.quote(a) if not a or re.search(r"[\s'\"\\]", a) else a for a in args)


def fill(args: tuple[str, ...] | list[str], values: dict[str, str]) -> list[str]:
    """The arguments with their placeholders replaced (checked when the preset was read). An
    argument that is a placeholder alone and comes out empty is left out: `{hf_precision_flag}`
    is `--bf16` in one attempt and no argument at all in an fp32 one (an empty string would be
    an argument the script's parser refuses)."""
    filled = []
    for arg in args:
        value = arg.format_map(values)
        if value or not _alone(arg):
            filled.append(value)
    return filled


def _alone(arg: str) -> bool:
    return re.fullmatch(r"\{[a-z_]+\}", arg) is not None


# ---------------------------------------------------------------- one attempt's values


def resolve_device(device: str) -> str:
    """'auto' as this machine's best device, read without torch: CUDA where the NVIDIA driver
    lists a GPU, MPS on Apple Silicon, else the CPU (the probe's default list, first)."""
    if device != "auto":
        return device
    return machine.available_devices()[0]


def values(preset: "DevicePreset", run_dir: Path, attempt: int,
           checkpoint: Path | None = None, rewind: dict | None = None) -> dict[str, str]:
    """What the placeholders stand for in this attempt ({steps_left}: the launch's, which knows
    the total); `rewind`: the run's rewinds so far (engine.run.rewind.Rewinds.attach)."""
    import psutil

    device = resolve_device(preset.device)
    precision = preset.precision
    if precision == "auto":
        precision = "bf16" if device == "cuda" else "fp32"
    threads = preset.threads or psutil.cpu_count(logical=False) or os.cpu_count() or 1
    return {"device": device, "batch_size": str(preset.batch_size),
            "accumulation": str(preset.accumulation), "effective_batch": str(preset.effective_batch),
            "precision": precision, "threads": str(threads), "run_dir": str(Path(run_dir).resolve()),
            "attempt": str(attempt), "checkpoint": str(checkpoint) if checkpoint else "",
            "hf_precision_flag": _HF_PRECISION_FLAG[precision],
            "hf_device_flag": "--use_cpu" if device == "cpu" else "",
            "lightning_precision": _LIGHTNING_PRECISION[precision],
            "steps_left": "",
            "skip_batches": str(skip := int((rewind or {}).get("run_skip_batches", 0))),
            "data_offset": str(skip * preset.effective_batch),
            "lr_scale": f"{float((rewind or {}).get('run_lr_scale', 1.0)):g}",
            "mlx_device": "cpu" if device == "cpu" else "gpu"}


def used(spec: CommandSpec) -> frozenset[str]:
    """The placeholders its argv takes: what of a device preset the command can feel."""
    return frozenset(n for arg in spec.command for n in placeholders(arg, "command"))


def used_in_resume(spec: CommandSpec) -> frozenset[str]:
    """The placeholders its resume arguments take."""
    return frozenset(n for arg in spec.resume for n in placeholders(arg, "resume"))


def fixed_settings(spec: CommandSpec) -> frozenset[str]:
    """Device preset settings this command cannot feel: those whose placeholders its argv lacks."""
    takes = used(spec)
    fixed = {"compile"}  # no placeholder carries it: a command compiles as its own code says
    if not {"batch_size", "effective_batch"} & takes:
        fixed.add("batch_size")
    if not _PRECISION_PLACEHOLDERS & takes:
        fixed.add("precision")
    return frozenset(fixed)


def units(spec: CommandSpec, preset: "DevicePreset", known: dict | None = None) -> Units:
    """What one of the script's optimizer steps is before it says anything: the workload
    preset's samples_per_step / tokens_per_step; else the effective batch where the argv takes
    both {batch_size} and {accumulation} (or {effective_batch}), or {batch_size} with a literal
    accumulation argument (`--accumulate_grad_batches 2`); else both as literal arguments
    (`--bs 32 --accum 16`); else unknown. The accumulation is
    the preset's where the argv takes {accumulation}, else its literal argument (`known`,
    engine.command.statements.from_argv). The script's own statements, read from its output,
    outrank all but what the script reports (engine.command.tracker)."""
    known = known or {}
    takes = used(spec)
    found = Units()
    if "accumulation" in takes:
        found = found.learn("accumulation", preset.accumulation, "placeholders", "{accumulation}")
    elif "accumulation" in known:
        found = found.learn("accumulation", known["accumulation"][0], "argv", known["accumulation"][1])
    if spec.samples_per_step:
        found = found.learn("samples_per_step", spec.samples_per_step, "preset",
                            f"samples_per_step = {spec.samples_per_step}")
    elif "batch_size" in takes and spec.steps_are_micro_batches:
        found = found.learn("samples_per_step", preset.batch_size, "placeholders",
                            "{batch_size}: its iterations are micro-batches")
    elif "effective_batch" in takes:
        found = found.learn("samples_per_step", preset.effective_batch, "placeholders",
                            "{effective_batch}")
    elif "batch_size" in takes and found.accumulation:
        found = found.learn("samples_per_step", preset.batch_size * found.accumulation,
                            "placeholders", "{batch_size} x " + (
                                "{accumulation}" if "accumulation" in takes
                                else known["accumulation"][1]))
    elif "batch_size" in known and found.accumulation:
        # both written in its argv (`--bs 32 --accum 16`, an adopted process's): a micro-batch
        # alone is not a step, since a script may accumulate by default
        found = found.learn("samples_per_step", known["batch_size"][0] * found.accumulation, "argv",
                            known["batch_size"][1] + " x " + (
                                "{accumulation}" if "accumulation" in takes
                                else known["accumulation"][1]))
    if spec.tokens_per_step:
        found = found.learn("tokens_per_step", spec.tokens_per_step, "preset")
    return found


def checkpoint_glob(spec: CommandSpec, run_dir: Path) -> str | None:
    if not spec.checkpoints:
        return None
    pattern = os.path.expanduser(spec.checkpoints.format(run_dir=str(Path(run_dir).resolve())))
    return pattern if os.path.isabs(pattern) else os.path.join(spec.cwd or os.getcwd(), pattern)


_STEP_IN_NAME = re.compile(r"(?:step|checkpoint|ckpt|iter)[=_-]?(\d+)|^(\d+)_adapters\b", re.IGNORECASE)


def step_in_name(path: str | Path) -> int | None:
    """The step a checkpoint's name says, in the usual conventions (the HF Trainer's
    checkpoint-500, Lightning's epoch=0-step=100.ckpt, ckpt-000100.pt, iter_2000.pt, mlx-lm's
    0000020_adapters.safetensors); None when the name does not say (model.pt): a guess would
    be worse than nothing."""
    found = _STEP_IN_NAME.findall(Path(path).name)
    return int(found[-1][0] or found[-1][1]) if found else None


def newest_checkpoint(spec: CommandSpec, run_dir: Path, reported: Sequence[str] = (),
                      since: float | None = None, before: float | None = None,
                      exclude: AbstractSet[str] = frozenset()) -> Path | None:
    """The newest file among the glob's matches and the checkpoints the script reported
    (cockpit.report) that still exist, by modification time; only files written from `since`
    (a run's start: a glob outside the run directory may match an older run's files) and
    before `before` (when the loss went bad), both time.time()."""
    found = []
    if (pattern := checkpoint_glob(spec, run_dir)) is not None:
        found += glob.glob(pattern, recursive=True)
    found += [p for p in reported if p]
    stamped = []
    for p in set(found) - set(exclude):
        try:
            if os.path.exists(p):  # a file, or a directory (the HF Trainer's checkpoint-500/)
                mtime = os.stat(p).st_mtime
                if (since is None or mtime >= since - 1) and (before is None or mtime < before):
                    stamped.append((mtime, p))
        except OSError:
            continue  # gone between listing and looking
    return Path(max(stamped)[1]) if stamped else None


# ---------------------------------------------------------------- checks that need this machine


def resolved(spec: CommandSpec) -> CommandSpec:
    """The spec with its working directory made absolute (where cockpit was started when
    the preset gives none), so a detached supervisor and every resume run it in the same place."""
    import dataclasses

    cwd = os.path.abspath(os.path.expanduser(spec.cwd)) if spec.cwd else os.getcwd()
    return dataclasses.replace(spec, cwd=cwd)


def check(spec: CommandSpec, where: str, env: dict[str, str] | None = None) -> None:
    """What only this machine can say: the working directory exists and the program is found
    (a bare name on PATH; a path as it is, a relative one from the working directory)."""
    cwd = spec.cwd or os.getcwd()
    if not os.path.isdir(cwd):
        raise ConfigError(where, "cwd", f"{cwd!r} is not a directory; expected an existing "
                                        "directory to run the command in")
    program = spec.command[0]
    if os.sep in program or (os.altsep and os.altsep in program):
        # A path is run as it is, never looked up on PATH; a relative one from the working directory.
        expanded = os.path.expanduser(program)
        path = os.path.join(cwd, expanded)
        within = "" if os.path.isabs(expanded) else f" in {cwd} (the command's working directory)"
        if not os.path.exists(path):
            raise ConfigError(where, "command", f"{program!r} does not exist{within}; expected an "
                                                "executable file (only a bare name like 'python' "
                                                "is looked up on PATH)")
        if os.path.isdir(path):
            raise ConfigError(where, "command", f"{program!r} is a directory{within}; expected "
                                                "an executable file")
        if not os.access(path, os.X_OK):
            run_it = f"python {program}" if program.endswith(".py") else f"sh {program}"
            raise ConfigError(where, "command", f"{program!r} is not executable; expected an "
                                                f"executable file (chmod +x {program}, or "
                                                f"run it through its interpreter: {run_it})")
        return
    search = (env or {}).get("PATH", os.environ.get("PATH", os.defpath))
    if shutil.which(program, path=search) is None:
        fix = " (./NAME for a file in the working directory)"
        if os.path.isfile(os.path.join(cwd, program)):   # `cockpit run -- train.py`
            fix = f": {program} is in {cwd}, so write " + (
                f"python {program}" if program.endswith(".py") else f"./{program}")
        raise ConfigError(where, "command", f"{program!r} was not found on PATH (a bare name is "
                                            "looked up on PATH only); expected a program on PATH "
                                            "or a path" + fix)


def check_device(name: str, preset: "DevicePreset", where: str) -> None:
    """A device preset that a command cannot use: several processes are the command's own
    business (put torchrun in the command)."""
    if preset.world_size > 1:
        raise ConfigError(where, "nproc_per_node", f"device preset {name!r} asks for "
                          f"{preset.world_size} processes; a command workload runs one command "
                          "(put torchrun in the command itself); expected 1")


def name_for(argv: list[str]) -> str:
    """A workload name for an ad-hoc command: its script's or program's stem ('train')."""
    script = next((a for a in argv[1:] if a.endswith(".py") and not a.startswith("-")), None)
    stem = Path(script or argv[0]).stem
    if script is None and "-m" in argv[1:-1]:
        stem = argv[argv.index("-m") + 1].rsplit(".", 1)[-1]
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-._")
    return cleaned or "command"

"""Workload and device presets: TOML files read into frozen dataclasses.

A device preset says how to run (device, micro-batch, accumulation, precision, ...), a
workload preset says what to train (which workload, its [train] schedule and its [params]).
Shipped presets live in presets/{workloads,devices}/; the user's in the user config dir
shadow shipped ones of the same name. A preset is data: nothing in it is executed.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

from engine import paths
from engine.command import CommandSpec
from engine.errors import ConfigError
from engine.files import atomic_write, dump_toml, read_toml
from engine.schema import FieldError, fields, from_table, setting, to_table, unknown_key
from engine.vocabulary import ACTIONS, CRASH_KINDS, ENV_FIXES, parse as parse_fault
from engine.workloads import BUILTIN, custom, params_class

KINDS = ("workloads", "devices")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

Device = Literal["auto", "cpu", "mps", "cuda"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
CachePolicy = Literal["never", "before-mining", "every-epoch"]
MAX_THREADS = 1024        # more than any machine's cores; torch segfaults at 100000
MAX_SEED = 2**64 - 1      # torch.manual_seed takes 64 bits


@dataclass(frozen=True, kw_only=True, slots=True)
class DevicePreset:
    """How to run: the device and everything that decides memory and speed on it."""

    description: str = setting("", "one line shown in lists")
    device: Device = setting("auto", "auto picks CUDA, then MPS, then CPU", aka=("accelerator",))
    batch_size: int = setting(32, "micro-batch: samples per forward/backward", min=1,
                             aka=("bs", "micro_batch_size", "per_device_train_batch_size",
                                  "train_batch_size", "batch"))
    accumulation: int = setting(1, "micro-batches per optimizer step", min=1,
                               aka=("grad_accum", "grad_accumulation", "gradient_accumulation",
                                    "gradient_accumulation_steps", "accumulate_grad_batches",
                                    "accum", "accum_steps"))
    precision: Precision = setting("auto", "auto: bf16 on CUDA when supported, else fp32",
                                  aka=("dtype", "mixed_precision", "amp", "bf16", "fp16"))
    grad_checkpointing: bool = setting(False, "recompute activations in backward to save memory",
                                      aka=("gradient_checkpointing", "activation_checkpointing"))
    compile: bool = setting(False, "torch.compile the model (refused on MPS)", aka=("torch_compile",))
    parity_check: bool = setting(False, "before training, check the device's loss, gradients and "
                                        "optimizer step against the CPU in fp32 (`cockpit check`); "
                                        "wrong numbers are a crash of kind numerical-parity")
    threads: int = setting(0, "CPU threads for torch; 0 keeps torch's default", min=0,
                          aka=("num_threads", "torch_threads"))
    nproc_per_node: int = setting(1, "processes on this machine; above 1 the attempt runs under "
                                     "torchrun with DDP (one per GPU on CUDA, gloo on CPU)", min=1,
                                 aka=("devices", "gpus", "num_processes", "world_size"))
    nnodes: int = setting(1, "machines in the run (torchrun --nnodes); above 1 needs rdzv_endpoint",
                          min=1)
    rdzv_endpoint: str = setting("", "host:port of the rendezvous for a multi-machine run")
    env: Mapping[str, str] = setting({}, "environment for the trainer process, set before torch loads")
    empty_cache: CachePolicy = setting("never", "when to empty the device cache")
    fallback: tuple[str, ...] = setting([], "device presets to fall back to, in order")
    rules: Mapping[str, str] = setting({}, "crash kind -> action (next, retry, retry-progress, "
                                           "retry-env, fp32, halve-batch, stop); unnamed kinds use "
                                           "the defaults")
    max_attempts: int = setting(5, "attempts a run may make, the first included", min=1,
                                aka=("retries", "max_retries"))
    hang_timeout_s: float = setting(300.0, "no progress for this long (or 10x the slowest "
                                           "interval seen, if longer) is a hang", above=0.0)
    on_slowdown: Literal["warn", "fallback"] = setting(
        "warn", "throughput far below its best under memory pressure: 'warn' (a warning with "
                "advice) or 'fallback' (also checkpoint and resume on the next ladder preset)")
    inject: tuple[str, ...] = setting([], "faults to inject, KIND@STEP or KIND@SECONDSs (e.g. "
                                          "'native-crash@117', 'hang@30s'); each fires once per "
                                          "run, with + in every attempt")

    def __post_init__(self):
        if self.threads > MAX_THREADS:
            raise FieldError("threads", f"got {self.threads}, expected 0 (torch's default) to "
                                        f"{MAX_THREADS}: threads beyond the cores only slow torch "
                                        "down, and at counts like this its thread pool crashes")
        if self.device == "mps" and self.compile:
            raise FieldError("compile", "true is refused on MPS: torch.compile's Metal backend is "
                                        "immature and segfaults; expected false")
        if self.device == "mps" and self.nproc_per_node * self.nnodes > 1:
            raise FieldError("nproc_per_node", f"{self.nproc_per_node} is refused on MPS: torch."
                             "distributed has no MPS backend; expected 1 (or device 'cuda'/'cpu')")
        if self.nnodes > 1 and not re.fullmatch(r"[^\s:]+:\d+", self.rdzv_endpoint):
            raise FieldError("rdzv_endpoint", f"got {self.rdzv_endpoint!r}; nnodes = {self.nnodes} "
                                              "needs the rendezvous as 'host:port'")
        if self.device == "mps" and self.precision == "fp16":
            raise FieldError("precision", "'fp16' needs a GradScaler, which MPS lacks; expected "
                                          "'fp32' or 'bf16'")
        for name in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise FieldError(f"env.{name}", "is not an environment variable name")
        for kind, action in self.rules.items():
            if kind not in CRASH_KINDS:
                raise FieldError(f"rules.{kind}", "is not a crash kind; expected one of "
                                 + ", ".join(CRASH_KINDS))
            if action not in ACTIONS:
                raise FieldError(f"rules.{kind}", f"got {action!r}, expected one of "
                                 + ", ".join(repr(a.value) for a in ACTIONS))
            if kind == "user-code" and action != "stop":
                raise FieldError("rules.user-code", f"got {action!r}, expected 'stop': falling "
                                                    "back does not fix a bug in the workload")
            if action == "retry-env" and kind not in ENV_FIXES:
                raise FieldError(f"rules.{kind}", "'retry-env' has an environment fix only for "
                                 + ", ".join(ENV_FIXES) + "; expected another action")
        if self.on_slowdown == "fallback" and not self.fallback:
            raise FieldError("on_slowdown", "'fallback' needs a fallback ladder (fallback = "
                                            "[...]) to fall back to; expected 'warn'")
        for spec in self.inject:
            try:
                parse_fault(spec)
            except ValueError as e:
                raise FieldError("inject", str(e)) from None

    @property
    def effective_batch(self) -> int:
        """Samples per optimizer step on one process (times the world size under torchrun)."""
        return self.batch_size * self.accumulation

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainSettings:
    """The schedule of a run: how long, how fast it learns, when it reports and saves."""

    epochs: float = setting(1.0, "passes over the workload's training samples", above=0.0,
                            aka=("num_train_epochs", "num_epochs", "max_epochs", "n_epochs"))
    max_steps: int = setting(0, "stop after this many optimizer steps of the first attempt's "
                                "global batch (a budget of samples, kept across fallbacks); "
                                "0 = no limit", min=0,
                            aka=("max_iters", "steps", "num_steps", "training_steps"))
    optimizer: Literal["adamw", "sgd"] = setting("adamw", "adamw (betas, eps; fused on CUDA) or sgd "
                                                          "(with momentum)", aka=("optim",))
    lr: float = setting(1e-3, "peak learning rate: reached after warmup_steps, then kept (schedule "
                              "'constant') or decayed to min_lr", min=0.0,
                      aka=("learning_rate", "max_lr"))
    schedule: Literal["constant", "cosine", "linear"] = setting(
        "constant", "the learning rate after warmup, over the samples of the run: constant, or a "
                    "cosine or linear decay from lr to min_lr",
        aka=("lr_scheduler", "lr_scheduler_type", "scheduler", "lr_schedule"))
    warmup_steps: int = setting(0, "linear warmup from 0 to lr over this many optimizer steps of the "
                                   "first attempt's global batch (samples: kept across fallbacks)", min=0,
                                aka=("warmup", "warmup_iters"))
    min_lr: float = setting(0.0, "where cosine and linear decay end, at the last sample", min=0.0,
                            aka=("min_learning_rate",))
    weight_decay: float = setting(0.0, "weight decay (decoupled in AdamW)", min=0.0, aka=("wd",))
    weight_decay_params: Literal["matrices", "all"] = setting(
        "matrices", "which parameters weight decay reaches: 'matrices' (2-D and up; norms, biases "
                    "and embeddings excluded) or 'all'")
    beta1: float = setting(0.9, "AdamW's beta1: decay of the gradient's running mean", min=0.0,
                           aka=("adam_beta1",))
    beta2: float = setting(0.999, "AdamW's beta2: decay of the squared gradient's running mean "
                                  "(0.95 for LLMs, as nanoGPT)", min=0.0, aka=("adam_beta2",))
    eps: float = setting(1e-8, "AdamW's epsilon", above=0.0, aka=("adam_epsilon", "epsilon"))
    momentum: float = setting(0.9, "SGD's momentum; 0 = plain SGD", min=0.0)
    grad_clip: float = setting(0.0, "clip the gradient norm to this; 0 = off", min=0.0,
                               aka=("max_grad_norm", "gradient_clip_val", "clip_grad_norm"))
    seed: int = setting(0, "seeds the model, the data order and every RNG", min=0, max=MAX_SEED,
                        aka=("random_seed",))
    report_every_s: float = setting(0.5, "seconds per reporting window (one step event each)",
                                    above=0.0)
    eval_every_steps: int = setting(0, "evaluate every N optimizer steps; 0 = at the end only",
                                    min=0, aka=("eval_steps", "eval_interval"))
    checkpoint_every_steps: int | Literal["auto"] = setting(
        0, "checkpoint every N optimizer steps; 0 = off; 'auto': the interval that loses least "
           "for the measured save time and crash rate (Young/Daly)", min=0,
        aka=("save_steps", "checkpoint_interval"))
    checkpoint_every_minutes: float = setting(5.0, "checkpoint every M minutes; 0 = off", min=0.0)
    keep_checkpoints: int = setting(3, "how many recent checkpoints to keep", min=1,
                                    aka=("save_total_limit",))

    def __post_init__(self):
        for name in ("beta1", "beta2", "momentum"):
            if getattr(self, name) >= 1:
                raise FieldError(name, f"got {getattr(self, name)!r}, expected a number from 0 to "
                                       "below 1 (at 1 nothing is ever forgotten)")
        if self.min_lr > self.lr:
            raise FieldError("min_lr", f"got {self.min_lr!r}, above lr {self.lr!r}; expected at most "
                                       "lr (the schedule decays from lr to min_lr)")


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadPreset:
    """What to train: a workload, its schedule and its own parameters; or the user's own
    command (workload COMMAND, params an engine.command.CommandSpec, train unused)."""

    workload: str
    description: str = ""
    train: TrainSettings = dataclasses.field(default_factory=TrainSettings)
    params: Any = None  # the workload's own frozen Params dataclass

    @property
    def is_command(self) -> bool:
        return self.workload == COMMAND


# The workload name of a command preset (`command = [...]` instead of `workload = ...`).
COMMAND = "command"


@dataclass(frozen=True, slots=True)
class PresetRef:
    """Where a preset was found."""

    kind: str
    name: str
    path: Path
    shipped: bool
    shadows_shipped: bool = False


# ---------------------------------------------------------------- locating


def _dirs(kind: str) -> list[tuple[Path, bool]]:
    """Search order, first wins: the user's presets, then the shipped ones."""
    return [(paths.user_presets_dir() / kind, False), (paths.shipped_presets_dir() / kind, True)]


def list_presets(kind: str) -> list[PresetRef]:
    found: dict[str, PresetRef] = {}
    for directory, shipped in _dirs(kind):
        for path in sorted(directory.glob("*.toml")) if directory.is_dir() else []:
            name = path.stem
            if name in found:
                found[name] = dataclasses.replace(found[name], shadows_shipped=True)
            else:
                found[name] = PresetRef(kind, name, path, shipped)
    return sorted(found.values(), key=lambda r: r.name)


def find(kind: str, name: str) -> PresetRef:
    singular = kind.rstrip("s")
    if not NAME_PATTERN.match(name):
        raise ConfigError(f"{singular} preset {name!r}", None,
                          "is not a preset name (letters, digits, '.', '_' and '-')")
    for ref in list_presets(kind):
        if ref.name == name:
            return ref
    names = [r.name for r in list_presets(kind)]
    raise ConfigError(f"{singular} preset {name!r}", None, not_found(misplaced(kind, name))
                      + "available: " + (", ".join(names) or "none"))


def not_found(hint: str) -> str:
    """'not found; HINT; ' ('not found; did you mean 'cpu'? '), for the list that follows."""
    return "not found; " + (hint + (" " if hint.endswith("?") else "; ") if hint else "")


def misplaced(kind: str | None, name: str) -> str:
    """Where a preset not found was saved instead and where it must go, or a close name ('did
    you mean ...?'), or ''. Only NAME.toml in the kind's own folder is read, so a
    file beside it in the presets folder, in the other kind's folder or under another name
    would otherwise be ignored without a word. `kind` None: either kind (`presets show`)."""
    root = paths.user_presets_dir()
    if (stray := root / f"{name}.toml").is_file():
        actual = _kind_of(stray) or kind
        where = f"{root / actual / stray.name}" if actual else f"{root}/devices/ or workloads/"
        return (f"{stray} is in the presets folder itself, where nothing is read: move it to "
                f"{where}" + (f" (it is a {actual[:-1]} preset)"
                              if actual and kind and actual != kind else ""))
    if kind is not None:
        other = "devices" if kind == "workloads" else "workloads"
        for directory, shipped in _dirs(other):
            if (directory / f"{name}.toml").is_file():
                fix = "" if shipped else f"; if it is a {kind[:-1]} preset, move it to " \
                                         f"{root / kind / f'{name}.toml'}"
                return f"{name!r} is a {other[:-1]} preset ({directory / f'{name}.toml'}){fix}"
    kinds = [kind] if kind else list(KINDS)
    for directory in [root / k for k in kinds] + [root]:
        for path in sorted(directory.glob(f"{name}*")) if directory.is_dir() else []:
            if path.is_file() and (path.name == name or path.name.startswith(name + ".")):
                target = f"{directory / name}.toml" if directory != root else \
                    f"{root}/{kind or 'devices or workloads'}/{name}.toml"
                return f"{path} is not read (a preset is a NAME.toml file): rename it to {target}"
    # closer than difflib's usual 0.6: 'gpu' is 0.67 from 'cpu', the one device a GPU user did not mean
    close = difflib.get_close_matches(name, [r.name for k in kinds for r in list_presets(k)],
                                      n=1, cutoff=0.75)
    return f"did you mean {close[0]!r}?" if close else ""


def _kind_of(path: Path) -> str | None:
    """'workloads' or 'devices' by the keys a preset file has; None when it cannot be told."""
    try:
        table = read_toml(path)
    except ConfigError:
        return None
    if any(k in table for k in (*_WORKLOAD_KEYS, *fields(CommandSpec))):
        return "workloads"
    return "devices" if any(k in fields(DevicePreset) for k in table) else None


def strays() -> list[Path]:
    """.toml files in the user's presets folder itself, outside devices/ and workloads/: never
    read, so `presets list` and `presets path` name them."""
    root = paths.user_presets_dir()
    return sorted(p for p in root.glob("*.toml") if p.is_file()) if root.is_dir() else []


# ---------------------------------------------------------------- parsing

# How a key that belongs in another table or kind of preset is pointed there (engine.schema's
# Elsewhere): {key} is the key as it is spelled where it belongs.
_IN_DEVICE = "{key} is a device setting: it belongs in a device preset (devices/), or device.{key} with --set"
_IN_TRAIN = "{key} belongs in a workload preset's [train] table (train.{key} with --set)"
_WORKLOAD_KEYS = ("workload", "train", "params")


def _workload_keys() -> tuple[str, ...]:
    return (*_WORKLOAD_KEYS, *fields(CommandSpec))


def device_from_table(table: dict, where: str) -> DevicePreset:
    return from_table(DevicePreset, table, where=where, elsewhere=(
        (TrainSettings, _IN_TRAIN),
        (_workload_keys(), "{key} is a workload preset's key, and this is a device preset; "
                           "workload presets go in the workloads/ folder")))


def _params_fields(name: object) -> tuple[str, ...]:
    """A built-in workload's [params] keys, for pointing a misplaced one there; a custom
    workload's are not looked up (that would import the user's code to word an error)."""
    return tuple(fields(params_class(name, "workload"))) if name in BUILTIN else ()


def workload_from_table(table: dict, where: str, base: Path | None = None) -> WorkloadPreset:
    """A workload preset's table, checked. `base` is the directory of the file it came from:
    a workload named by a relative file path ('./model.py:factory') is taken from there and kept
    absolute, so the run (and every later attempt, probe and resume) finds it from anywhere."""
    table = dict(table)
    # `command = [...]`, or a command's companions without it ("command: missing" says more
    # than "cwd: unknown key")
    if table.get("workload") == COMMAND or any(k in fields(CommandSpec) for k in table):
        return command_from_table(table, where)
    known = ("workload", "description", "train", "params")
    device_keys = [k for k in table if k in DevicePreset.__dataclass_fields__ and k != "description"]
    if "workload" not in table and device_keys and all(
            k in DevicePreset.__dataclass_fields__ for k in table):
        raise ConfigError(where, None, f"has device settings ({', '.join(device_keys[:3])}) and no "
                                       "workload: it is a device preset, and those go in the "
                                       "devices/ folder; expected workload = ... or command = [...]")
    name = table.get("workload")
    in_params = _params_fields(name)
    for key in table:
        if key not in known:
            raise unknown_key(where, key, known, elsewhere=(
                (TrainSettings, "{key} belongs in this preset's [train] table"),
                (in_params, "{key} belongs in this preset's [params] table"),
                (DevicePreset, _IN_DEVICE)))
    if not isinstance(name, str):
        raise ConfigError(where, "workload", "missing, expected the name of a workload "
                                             "(e.g. 'matmul'), './file.py:factory' or "
                                             "'package.module:factory', or command = [...] for "
                                             "your own training command")
    if custom.is_file(name):
        name = custom.absolute(name, base, where)
    description = table.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(where, "description", "expected a string")
    for section in ("train", "params"):
        if not isinstance(table.get(section, {}), dict):
            raise ConfigError(where, section, "expected a table ([" + section + "])")
    params_cls = params_class(name, where, table.get("params", {}))
    return WorkloadPreset(
        workload=name,
        description=description,
        train=from_table(TrainSettings, table.get("train", {}), where=where, prefix="train.",
                         elsewhere=((params_cls, "{key} belongs in [params], not [train]"),
                                    (DevicePreset, _IN_DEVICE))),
        params=from_table(params_cls, table.get("params", {}), where=where, prefix="params.",
                          elsewhere=((TrainSettings, "{key} belongs in [train], not [params]"),
                                     (DevicePreset, _IN_DEVICE))),
    )


def command_from_table(table: dict, where: str) -> WorkloadPreset:
    """A command preset: `command = [...]` and its companions at the top level."""
    if "workload" in table:
        problem = ("a preset names either a workload or a command; expected one of them" if "command"
                   in table else "'command' is not a workload; expected command = [...] at the top level")
        raise ConfigError(where, "workload", problem)
    for section in ("train", "params"):
        if section in table:
            raise ConfigError(where, section, f"a command's [{section}] is its own script's "
                                              "business; expected no such table beside command")
    description = table.pop("description", "")
    if not isinstance(description, str):
        raise ConfigError(where, "description", "expected a string")
    return WorkloadPreset(workload=COMMAND, description=description,
                          params=from_table(CommandSpec, table, where=where, elsewhere=(
                              (TrainSettings, TRAINER_ONLY), (DevicePreset, _IN_DEVICE))))


# A command trains with its own loop: the trainer's settings are not for it.
TRAINER_ONLY = ("{key} is a setting of cockpit's own trainer ([train]); a command trains with "
                 "its own, so give it in the command's arguments")


def workload_to_table(preset: WorkloadPreset) -> dict:
    if preset.is_command:
        return {"description": preset.description, **to_table(preset.params)}
    return {"workload": preset.workload, "description": preset.description,
            "train": to_table(preset.train), "params": to_table(preset.params)}


def load_device(name: str) -> DevicePreset:
    ref = find("devices", name)
    return device_from_table(read_toml(ref.path), str(ref.path))


def load_workload(name: str) -> WorkloadPreset:
    ref = find("workloads", name)
    return workload_from_table(read_toml(ref.path), str(ref.path), ref.path.parent)


def check(ref: PresetRef, table: dict) -> None:
    """Check a preset's table as loading it would, short of running anything: a custom
    workload's params wait for load time, since checking them imports the user's code."""
    where = str(ref.path)
    if ref.kind == "devices":
        check_ladder(ref.name, device_from_table(table, where), where)
        return
    name = table.get("workload")
    if not isinstance(name, str) or name == COMMAND or name in BUILTIN:
        workload_from_table(table, where, ref.path.parent)
    elif custom.is_file(name):
        custom.absolute(name, ref.path.parent, where)  # the file is there (it is not imported)


def check_ladder(name: str, preset: DevicePreset, where: str, key: str = "fallback",
                 known: dict[str, DevicePreset] | None = None) -> dict[str, DevicePreset]:
    """The fallback ladder's presets, each loaded and checked; no cycles back to the start.
    `where` and `key` name what gave the ladder: the preset file, or --set device.fallback.
    `known` presets (a resumed run's, as it recorded them) are taken as they are, not reloaded
    from a file that may have changed since."""
    known = known or {}
    ladder = {}
    for step in preset.fallback:
        if step == name:
            raise ConfigError(where, key, f"names {name!r} itself; expected other presets")
        if step in ladder:
            raise ConfigError(where, key, f"names {step!r} twice")
        try:
            ladder[step] = known[step] if step in known else load_device(step)
        except ConfigError as e:
            raise ConfigError(where, key, f"{step!r}: {e.line()}") from None
    return ladder


# ---------------------------------------------------------------- writing


def check_new_name(kind: str, name: str, argument: str = "--save") -> None:
    """A name to save a new preset under: never over one of yours, never shadowing a shipped one."""
    if not NAME_PATTERN.match(name):
        raise ConfigError(argument, None, f"got {name!r}; expected letters, digits, '.', '_' and '-'")
    for ref in list_presets(kind):
        if ref.name == name:
            where = "a shipped preset" if ref.shipped else f"your preset at {ref.path}"
            raise ConfigError(argument, None, f"{name!r} is already {where}, and --save never "
                                              "replaces a preset that already exists; expected a new name")


def save_user_preset(kind: str, name: str, table: dict) -> Path:
    """Validate and save a preset to the user's dir. Shipped presets are never written."""
    if kind not in KINDS:
        raise ConfigError("preset kind", None, f"got {kind!r}, expected one of {KINDS}")
    if not NAME_PATTERN.match(name):
        raise ConfigError(f"preset name {name!r}", None, "expected letters, digits, '.', '_', '-'")
    path = paths.user_presets_dir() / kind / f"{name}.toml"
    if kind == "devices":
        table = to_table(device_from_table(table, str(path)))
    else:
        table = workload_to_table(workload_from_table(table, str(path), path.parent))
    atomic_write(path, dump_toml(table))
    return path

"""Custom workloads: your own training code, run and supervised by cockpit.

Name it in a workload preset, instead of a built-in workload:

    workload = "./my_workload.py:make_workload"       # a file: relative to the preset file's
                                                      # directory, or absolute ('~' expanded)
    workload = "my_package.my_module:make_workload"   # module:factory, imported from the Python path
    workload = "sine"                                 # or an entry point in group "cockpit.workloads"

A file needs no PYTHONPATH: cockpit imports it by its path wherever it is started from (the
CLI, the TUI, the probe, `cockpit runs resume`), with its directory on the Python path so that
it can import the modules beside it (a model.py next to it). The run records its absolute path.

An entry point is declared by an installed package, in its pyproject.toml:

    [project.entry-points."cockpit.workloads"]
    sine = "my_package.my_module:make_workload"

examples/sine_workload.py is a complete one to copy; examples/README.md shows how to run it.

The factory
    `make_workload(params, seed)` is called once per attempt, in the trainer process, and
    returns the workload object. `seed` is the preset's train.seed; draw data from it so that
    every attempt of a run sees the same data. Errors it raises are the workload's own: the
    run stops with the traceback (falling back to another device would not fix a bug).

The workload object (the engine's protocol, engine.workloads.Workload)
    num_samples: int
        Training samples per epoch (> 0). Required.
    build_model(*, grad_checkpointing: bool) -> torch.nn.Module
        A fresh model on the CPU; the trainer moves it to the device, resumes its weights
        from a checkpoint and builds the optimizer over its parameters. Honour
        grad_checkpointing (torch.utils.checkpoint) or ignore it. Required.
    batch(indices: torch.Tensor, device: torch.device) -> anything
        The samples at these positions of the data set (a 1-D int64 CPU tensor of values in
        range(num_samples)), on the device. The engine owns the order: it draws a seeded
        permutation per epoch and asks for the next samples, so a run resumed after a
        fallback to another batch size or accumulation continues at exactly the same sample.
        Do not shuffle or keep a cursor of your own. Required.
    loss(model, batch) -> torch.Tensor
        The mean loss over the batch, a scalar (0-dim) floating-point tensor with a gradient,
        on the device. Keep it on the device: the trainer reads it once per reporting window,
        never per step. Anything else (a tuple, a Python number, a per-sample vector, a
        detached tensor) stops the run as the workload's bug, with one sentence naming the
        workload ("loss() must return a scalar tensor, got ..."). Required.
    evaluate(model, device) -> dict[str, float]
        Held-out metrics, called under torch.no_grad() with the model in eval mode every
        train.eval_every_steps and at the end. Optional: without it a run reports no eval.
    flops_per_sample: float | None
        Training FLOPs (forward + backward) per sample, for GFLOP/s. Optional.
    prepare_epoch(model, epoch, device, emit) -> None
        Called under no_grad before the first sample of every epoch an attempt trains
        (work that needs the current model, such as mining hard negatives); `emit(type,
        **fields)` writes an event. Optional.
    configure_optimizers(model, train) -> optimizer | (optimizer, scheduler)
        Your own optimizer over `model.parameters()` (the model on its device; `train` is the
        preset's [train], engine.preset_types.TrainSettings: lr, weight_decay, beta1, ...). Optional:
        without it the trainer builds the one [train] describes (optimizer = "adamw" | "sgd",
        betas, eps, momentum; weight decay on matrices only unless weight_decay_params = "all";
        engine.train.optim.param_groups(model, weight_decay) makes that split for you). [train]'s
        schedule (warmup_steps, then constant, cosine or linear to min_lr, counted in samples
        seen) scales each parameter group's learning rate from the one you gave it. Return a
        scheduler too (torch.optim.lr_scheduler) to set the rate yourself: it is stepped once
        per optimizer step, so its curve counts steps (a fallback to another batch size
        changes it), its state is checkpointed, and [train] must leave schedule = "constant"
        and warmup_steps = 0.

Parameters
    The preset's [params] table goes to the factory. If the factory's module defines `Params`,
    a dataclass whose fields use engine.schema.setting (as engine/workloads/matmul does), the
    table is checked like a built-in workload's (unknown keys, types, bounds, __post_init__
    raising engine.schema.FieldError) and the factory gets a Params instance. Without one,
    the factory gets a plain dict of the table, whose values must be numbers, strings,
    booleans or lists of strings; each key's type is the one the preset gave it, so
    `--set params.KEY=...` must keep that type (a preset's `1` is an integer: write `1.0`
    for a float) and cannot add a key the preset does not list.

Imports
    cockpit imports the module when it checks the preset (`cockpit --no-ui`, `cockpit presets
    show`): keep torch out of its top level, as the built-in workloads do, if you want that
    to stay quick. The trainer process imports the same module from the directory the checking
    process found it in: that directory is put first on the trainer's PYTHONPATH, and the
    trainer's own working directory is not on its path. A file workload is imported from its
    absolute path by every process.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.metadata
import hashlib
import importlib.util
import inspect
import keyword
import math
import os
import re
import site
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from engine.errors import ConfigError, describe
from engine.schema import fields, setting, to_table
from engine.workloads.builtin import BUILTIN

GROUP = "cockpit.workloads"
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
SPEC = re.compile(rf"^{_NAME}(\.{_NAME})*:{_NAME}(\.{_NAME})*$")
REQUIRED = {"build_model": "build_model(*, grad_checkpointing)", "batch": "batch(indices, device)",
            "loss": "loss(model, batch)"}
PROTOCOL = "num_samples, build_model, batch and loss (see engine/workloads/custom.py)"

# module name -> the directory on sys.path it was imported from, for the trainer's PYTHONPATH
_roots: dict[str, str] = {}
# a file workload's absolute path -> (its modification time when imported, the module)
_files: dict[str, tuple[int, ModuleType]] = {}
ATTRIBUTE = re.compile(rf"^{_NAME}(\.{_NAME})*$")


@dataclass(frozen=True)
class Factory:
    """A custom workload's factory, imported and checked."""

    name: str                   # as the preset writes it
    module: ModuleType
    factory: Callable[..., Any]
    params: type | None         # the module's Params dataclass, or None: params are a dict


def entry_point(name: str) -> importlib.metadata.EntryPoint | None:
    found = importlib.metadata.entry_points(group=GROUP, name=name)
    return next(iter(found), None)


def _target(name: str, where: str) -> tuple[str, str]:
    """(module, attribute path) for 'module:factory' or an entry point's name."""
    if ":" not in name:
        ep = entry_point(name)
        if ep is None:
            installed = sorted(ep.name for ep in importlib.metadata.entry_points(group=GROUP))
            raise ConfigError(where, "workload", (
                f"got {name!r}, expected one of " + ", ".join(repr(n) for n in BUILTIN)
                + ", './file.py:factory' or 'package.module:factory' for your own workload, or an "
                + "entry point in group "
                + f"{GROUP!r} (" + (", ".join(repr(n) for n in installed) or "none installed") + ")"))
        name = ep.value
    if not SPEC.match(name):
        raise ConfigError(where, "workload", f"got {name!r}, expected 'package.module:factory' "
                                             "(dotted Python names on both sides of one ':')")
    module, _, attr = name.partition(":")
    return module, attr


def is_file(name: str) -> bool:
    """Whether a workload names a file ('./x.py:factory', '/abs/x.py:f', '~/x.py:f'), not a module."""
    path, colon, _ = name.rpartition(":")
    return bool(colon) and (path.endswith(".py") or "/" in path or os.sep in path or path.startswith("~"))


def absolute(name: str, base: Path | None, where: str) -> str:
    """A file workload with its path made absolute: '~' expanded, a relative path taken from
    `base` (the preset file's directory); the file must exist."""
    path_text, _, attr = name.rpartition(":")
    if not ATTRIBUTE.match(attr):
        raise ConfigError(where, "workload", f"got {name!r}, expected 'path/to/file.py:factory' "
                                             "(a dotted Python name after the last ':')")
    written = Path(path_text).expanduser()
    if not written.is_absolute() and base is None:
        raise ConfigError(where, "workload", f"{name!r} is a relative path, and {where} is not a "
                                             "preset file it could be relative to; expected an "
                                             "absolute path")
    path = Path(os.path.abspath(written if written.is_absolute() or base is None else base / written))
    if not path.is_file():
        hint = "" if written.is_absolute() else f" (relative to {base}, the preset's directory)"
        raise ConfigError(where, "workload", f"{name!r}: no file {path}{hint}; expected a Python "
                                             "file defining the factory")
    return f"{path}:{attr}"


def load(name: str, where: str) -> Factory:
    """Import the factory a preset names; every way this can fail is one ConfigError line."""
    if is_file(name):
        name = absolute(name, None, where)
        path_text, _, attr = name.rpartition(":")
        module = _import_file(name, Path(path_text), where)
        module_name = module.__name__
    else:
        module_name, attr = _target(name, where)
        module = _import(name, module_name, where)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, public, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(where, "workload", f"{name!r}: {module_name} ({_file(module)}) has no "
                                                 f"attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    _check_factory(name, obj, where)
    return Factory(name, module, obj, _declared_params(name, module, where))


def _import(name: str, module_name: str, where: str) -> ModuleType:
    importlib.invalidate_caches()  # a module written since this process started is found too
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise ConfigError(where, "workload", f"{name!r}: no module named {e.name!r} on the Python "
                                                 "path; add its directory to PYTHONPATH or install "
                                                 "its package") from None
        raise ConfigError(where, "workload", f"{name!r}: importing {module_name} failed: {e}") from None
    except SyntaxError as e:
        raise ConfigError(where, "workload", f"{name!r}: syntax error in {e.filename}, line "
                                             f"{e.lineno}: {e.msg}") from None
    except Exception as e:  # whatever the module's top level raised
        raise ConfigError(where, "workload", f"{name!r}: importing {module_name} raised "
                                             f"{type(e).__name__}: {e}") from None
    _remember_root(module_name)
    return module


def _import_file(name: str, path: Path, where: str) -> ModuleType:
    """Import a workload's file by its path (again if it changed since), its directory on the
    Python path for the modules beside it."""
    try:
        mtime = path.stat().st_mtime_ns
    except OSError as e:
        raise ConfigError(where, "workload", f"{name!r}: cannot read {path} ({e.strerror})") from None
    known = _files.get(str(path))
    if known and known[0] == mtime:
        return known[1]
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))  # after everything else: it never shadows a library
    module_name = _module_name(path)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:   # a name Python has no loader for: not a .py file
        raise ConfigError(where, "workload", f"{name!r}: {path} is not a Python source file; "
                                             "expected a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before running it: dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(module_name, None)
        if isinstance(e, SyntaxError):
            raise ConfigError(where, "workload", f"{name!r}: syntax error in {e.filename}, line "
                                                 f"{e.lineno}: {e.msg}") from None
        if isinstance(e, Exception):  # whatever the file's top level raised
            raise ConfigError(where, "workload", f"{name!r}: importing {path} raised "
                                                 f"{type(e).__name__}: {e}") from None
        raise
    _files[str(path)] = (mtime, module)
    return module


def _module_name(path: Path) -> str:
    """The file's own name when that names nothing else (so `import nanogpt_workload` from a
    module beside it finds the same module), else one made unique by the path."""
    stem = path.stem
    if stem.isidentifier() and not keyword.iskeyword(stem):
        loaded = sys.modules.get(stem)
        if loaded is not None:
            if getattr(loaded, "__file__", None) == str(path):
                return stem
        else:
            try:
                found = importlib.util.find_spec(stem)
            except (ImportError, ValueError):
                found = None
            if found is None or found.origin == str(path):
                return stem
    clean = re.sub(r"\W", "_", stem)
    return f"cockpit_workload_{clean}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"


def _check_factory(name: str, obj: Any, where: str) -> None:
    if not callable(obj):
        raise ConfigError(where, "workload", f"{name!r} is a {type(obj).__name__}, expected a "
                                             "factory called as factory(params, seed)")
    try:
        inspect.signature(obj).bind(None, 0)
    except TypeError:
        raise ConfigError(where, "workload", f"{name!r} cannot be called as factory(params, seed); "
                                             f"its signature is {inspect.signature(obj)}") from None
    except ValueError:
        pass  # no signature to read (a builtin): the call itself will tell
    if isinstance(obj, type):  # a class: its methods can be checked before any run
        missing = [sig for method, sig in REQUIRED.items() if not callable(getattr(obj, method, None))]
        if missing:
            raise ConfigError(where, "workload", f"{name!r}: class {obj.__name__} lacks "
                                                 + ", ".join(missing) + f"; a workload needs {PROTOCOL}")


def _declared_params(name: str, module: ModuleType, where: str) -> type | None:
    declared = getattr(module, "Params", None)
    if declared is None:
        return None
    if not (isinstance(declared, type) and dataclasses.is_dataclass(declared)):
        raise ConfigError(where, "workload", f"{name!r}: {module.__name__}.Params is not a dataclass; "
                                             "declare it with @dataclass and engine.schema.setting "
                                             "fields, or remove it to get [params] as a dict")
    try:
        fields(declared)
    except Exception as e:  # an annotation that does not resolve
        raise ConfigError(where, "workload", f"{name!r}: {module.__name__}.Params has an annotation "
                                             f"that cannot be resolved ({type(e).__name__}: {e})") from None
    return declared


def params_class(name: str, where: str, table: dict) -> type:
    """The settings class for the preset's [params]: the module's Params, or one made from the table."""
    return load(name, where).params or free_params_class(table, where)


def free_params_class(table: dict, where: str) -> type:
    """A settings class whose fields are the table's keys, typed by their values.

    It lets the engine check `--set` overrides and write run.toml as for any workload, while
    the factory gets a plain dict."""
    specs = []
    for key, value in table.items():
        if not key.isidentifier() or keyword.iskeyword(key):
            raise ConfigError(where, f"params.{key}", "is not a Python name (letters, digits, '_'), "
                                                      "which a workload without a Params class needs")
        if isinstance(value, (bool, int, float, str)):
            kind: Any = type(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            kind = tuple[str, ...]
        else:
            raise ConfigError(where, f"params.{key}", f"got {describe(value)}, expected a number, a "
                                                      "string, true/false or a list of strings; declare "
                                                      "a Params dataclass for anything else")
        specs.append((key, kind, setting(value, "from the preset (the workload declares no Params)")))
    cls = dataclasses.make_dataclass("Params", specs, frozen=True, kw_only=True, slots=True)
    cls.__module__ = __name__
    return cls


def build(name: str, params: Any, seed: int):
    """Call the factory and check what it returns against the protocol."""
    factory = load(name, "workload")
    workload = factory.factory(params if factory.params else to_table(params), seed)
    return check(name, workload)


def check(name: str, workload: Any):
    """The workload, with its optional parts filled in; a ConfigError naming what it lacks."""
    problems = [sig for method, sig in REQUIRED.items() if not callable(getattr(workload, method, None))]
    n = getattr(workload, "num_samples", None)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        problems.append("num_samples (a positive int" + (f", got {describe(n)})" if n is not None else ")"))
    for method in ("evaluate", "prepare_epoch", "configure_optimizers"):
        if hasattr(workload, method) and not callable(getattr(workload, method)):
            problems.append(f"{method} (not callable)")
    flops = getattr(workload, "flops_per_sample", None)
    if flops is not None and (isinstance(flops, bool) or not isinstance(flops, (int, float))
                              or not math.isfinite(flops) or flops < 0):
        problems.append(f"flops_per_sample (a number >= 0 or None, got {describe(flops)})")
    if problems:
        raise ConfigError(f"workload {name!r}", None, (
            f"the {type(workload).__name__} its factory returned lacks " + ", ".join(problems)
            + f"; a workload needs {PROTOCOL}"))
    if hasattr(workload, "evaluate") and hasattr(workload, "flops_per_sample"):
        return workload
    return _WithDefaults(workload)


def _no_metrics(model, device) -> dict[str, float]:
    return {}


class _WithDefaults:
    """A user's workload that leaves out evaluate or flops_per_sample, completed with the
    protocol's defaults ({} and None) so that the trainer needs no special case."""

    def __init__(self, inner: Any):
        self.__dict__["_inner"] = inner

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._inner, name)
        except AttributeError:
            if name == "evaluate":
                return _no_metrics
            if name == "flops_per_sample":
                return None
            raise

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)


# ---------------------------------------------------------------- where the trainer finds it


def _file(module: ModuleType) -> str:
    return getattr(module, "__file__", None) or "no file"


def _remember_root(module_name: str) -> None:
    """Remember the sys.path directory the module's top-level package came from."""
    top = sys.modules.get(module_name.partition(".")[0])
    spec = getattr(top, "__spec__", None)
    if spec is None:
        return
    if spec.submodule_search_locations:  # a package: its directory's parent
        root = Path(next(iter(spec.submodule_search_locations))).parent
    elif spec.origin and spec.has_location:  # a plain module: its directory
        root = Path(spec.origin).parent
    else:
        return
    root = root.resolve()
    installed = {Path(p).resolve() for p in (*site.getsitepackages(), site.getusersitepackages())}
    if root not in installed:  # an installed package is found there by every process anyway
        _roots[module_name] = str(root)


def import_roots() -> list[str]:
    """Directories this process imported custom workloads from, for a child's PYTHONPATH."""
    return list(dict.fromkeys(_roots.values()))

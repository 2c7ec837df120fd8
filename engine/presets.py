"""Workload and device presets: TOML files read into frozen dataclasses (engine.preset_types).

A device preset says how to run (device, micro-batch, accumulation, precision, ...), a
workload preset says what to train (which workload, its [train] schedule and its [params]).
Shipped presets live in presets/{workloads,devices}/; the user's in the user config dir
shadow shipped ones of the same name. A preset is data: nothing in it is executed. The
dataclasses and their own checks live on the ground floor, where the floors below this one name
them; here they are found, read from TOML with errors that name the file and key, and written.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from engine import paths
from engine.command import CommandSpec
from engine.errors import ConfigError
from engine.files import atomic_write, dump_toml, read_toml
# transitional: the importers of these names from engine.presets move to engine.preset_types
from engine.preset_types import COMMAND, DevicePreset, TrainSettings, WorkloadPreset
from engine.schema import fields, from_table, to_table, unknown_key
from engine.workloads import BUILTIN, custom, params_class

KINDS = ("workloads", "devices")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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
    refs = list_presets(kind)
    # checking a preset looks up its ladder (find again): while one is checked, none is
    broken = [] if _CHECKING else [r.name for r in refs if problem(r) is not None]
    names = [r.name for r in refs if r.name not in broken]
    raise ConfigError(f"{singular} preset {name!r}", None, not_found(misplaced(kind, name))
                      + "available: " + (", ".join(names) or "none")
                      + (f"; broken: {', '.join(broken)} (cockpit presets show NAME says why)"
                         if broken else ""))


def problem(ref: PresetRef) -> str | None:
    """Why a preset cannot be used, in the line loading it would give; None for one that can
    (a list of what is available names only those: a broken one would fail the next try)."""
    _CHECKING.append(ref)
    try:
        check(ref, read_toml(ref.path))
    except ConfigError as e:
        return e.line()
    finally:
        _CHECKING.pop()
    return None


_CHECKING: list[PresetRef] = []   # the presets `problem` is checking now (see find)


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

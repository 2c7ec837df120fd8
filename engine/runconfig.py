"""A run's resolved configuration: workload preset + device preset + `--set` overrides.

Precedence: dataclass defaults < preset file < `--set` overrides. The device settings set
with `--set` hold for every preset of the fallback ladder too (`carry_overrides`). The resolved
result, with the device presets of the fallback ladder, is written to the run directory as
run.toml, so a run never depends on preset files that may change after it started.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from engine import command, presets, vocabulary, workloads
from engine.command import interpreter, programs
from engine.errors import ConfigError
from engine.preset_types import DevicePreset, TrainSettings, WorkloadPreset
from engine.schema import assign, fields, from_table, lookup, nearest, parse_value, table_class, \
    to_table, unknown_key
from engine.schema import names as key_names


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    workload_preset: str
    device_preset: str
    workload: WorkloadPreset
    device: DevicePreset
    ladder: dict[str, DevicePreset]
    overrides: tuple[str, ...] = ()

    def to_table(self) -> dict:
        return {
            "workload_preset": self.workload_preset,
            "device_preset": self.device_preset,
            "overrides": list(self.overrides),
            "workload": presets.workload_to_table(self.workload),
            "device": to_table(self.device),
            "ladder": {name: to_table(p) for name, p in self.ladder.items()},
        }

    @classmethod
    def from_table(cls, table: dict, where: str) -> "RunConfig":
        try:
            return cls(
                workload_preset=table["workload_preset"],
                device_preset=table["device_preset"],
                overrides=tuple(table.get("overrides", ())),
                workload=presets.workload_from_table(table["workload"], where + " [workload]"),
                device=presets.device_from_table(table["device"], where + " [device]"),
                ladder={name: presets.device_from_table(t, f"{where} [ladder.{name}]")
                        for name, t in table.get("ladder", {}).items()},
            )
        except KeyError as e:
            raise ConfigError(where, e.args[0], "missing from run.toml") from None


def _sections(workload: WorkloadPreset, device: DevicePreset) -> dict[str, tuple[type, object]]:
    """The sections `--set` can name, each with its class and current value. A command's own
    settings (cwd, resume, ...) are the `command` section; it has no [train] or [params]."""
    if workload.is_command:
        return {"device": (DevicePreset, device), "command": (type(workload.params), workload.params)}
    return {"device": (DevicePreset, device), "train": (TrainSettings, workload.train),
            "params": (type(workload.params), workload.params)}


def _split_key(key: str, classes: dict[str, type]) -> tuple[str, str]:
    """'device.batch_size', or a bare 'batch_size' or 'slurm.partition' (a key of a nested
    table) when exactly one section has it."""
    head, dot, name = key.partition(".")
    if dot and head in classes:
        return head, name
    owners = [s for s, cls in classes.items()
              if head in fields(cls) and (not dot or table_class(fields(cls)[head][1]))]
    if dot and not owners:  # 'training.lr': the key itself may still be a known one
        trainer = {} if "train" in classes else key_names(TrainSettings)
        meant = nearest(key, [_known(classes), trainer], n=1)
        hint = "" if not meant else f"; did you mean '{meant[0][1]}'?" if meant[0][0] == 0 \
            else "; " + presets.TRAINER_ONLY.format(key=meant[0][1])
        raise ConfigError("--set", key, f"unknown section {head!r}; expected one of "
                          + ", ".join(classes) + hint)
    if len(owners) == 1:
        return owners[0], key
    if len(owners) > 1:
        raise ConfigError("--set", key, "is ambiguous; write " + " or ".join(f"{s}.{key}" for s in owners))
    raise _unknown(key, classes)


def _known(classes: dict[str, type], first: str | None = None) -> dict[str, tuple[str, ...]]:
    """Every key --set can name, dotted ('train.lr'), with its other names; `first` section's first."""
    order = sorted(classes, key=lambda s: s != first)
    return {k: aka for s in order for k, aka in key_names(classes[s], f"{s}.").items()}


def _unknown(key: str, classes: dict[str, type], section: str | None = None) -> ConfigError:
    """A --set key no section has: the nearest of all of them ('device.lr': did you mean
    'train.lr'?), or for a command, word that cockpit's trainer settings are not its own."""
    elsewhere = () if "train" in classes else ((TrainSettings, presets.TRAINER_ONLY),)
    return unknown_key("--set", key, _known(classes, section), elsewhere=elsewhere)


def apply_overrides(workload: WorkloadPreset, device: DevicePreset,
                    overrides: list[str]) -> tuple[WorkloadPreset, DevicePreset]:
    """Apply `key=value` overrides through the same validation as preset files."""
    sections = _sections(workload, device)
    classes = {name: cls for name, (cls, _) in sections.items()}
    tables = {name: to_table(value) for name, (_, value) in sections.items()}
    for item in overrides:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError("--set", item, "expected key=value (e.g. batch_size=16)")
        section, name = _split_key(key, classes)
        spec = lookup(classes[section], name)   # 'slurm.partition': a nested table's key
        if spec is None:
            raise _unknown(key, classes, section)
        assign(tables[section], name, parse_value(text.strip(), spec[1]))
    built = {name: from_table(classes[name], table, where="--set", prefix=f"{name}.")
             for name, table in tables.items()}
    if workload.is_command:
        return dataclasses.replace(workload, params=built["command"]), built["device"]
    return dataclasses.replace(workload, train=built["train"], params=built["params"]), built["device"]


# Device settings that say which preset a rung is, not how it runs: a --set of one of these is
# the starting preset's alone. Faults (--inject) are the run's: carried like the rest, each
# fires once per run whatever preset an attempt runs, KIND@STEP+ in every attempt.
_NOT_CARRIED = ("description", "device", "fallback")


def carry_overrides(workload: WorkloadPreset, ladder: dict[str, DevicePreset],
                    overrides: list[str]) -> dict[str, DevicePreset]:
    """The ladder's presets with the user's `--set` device settings applied: what the user set
    holds for the whole run, unless a fallback rule changes it (the fallback event shows it).
    on_slowdown = 'fallback' reaches only a preset with a ladder of its own to fall back on."""
    carried = {}
    for name, rung in ladder.items():
        classes = {section: cls for section, (cls, _) in _sections(workload, rung).items()}
        items = []
        for item in overrides:
            section, key = _split_key(item.partition("=")[0].strip(), classes)
            if section == "device" and key not in _NOT_CARRIED and not (
                    key == "on_slowdown" and not rung.fallback):
                items.append(item)
        try:
            carried[name] = apply_overrides(workload, rung, items)[1] if items else rung
        except ConfigError as e:
            raise ConfigError(e.where, e.key, f"{e.problem} (holds for the whole run, and the "
                                              f"fallback preset {name!r} refuses it)") from None
    return carried


def check_command(workload: WorkloadPreset, where: str,
                  devices: dict[str, DevicePreset]) -> WorkloadPreset:
    """A command workload, checked against this machine (its working directory and program
    exist; every preset of the ladder can run it), with its working directory made absolute."""
    spec = command.resolved(workload.params)
    command.check(spec, where)
    for name, device in devices.items():
        command.check_device(name, device, f"device preset {name!r}")
    return dataclasses.replace(workload, params=spec)


def _step_set_by(device: DevicePreset, start: DevicePreset, start_where: str,
                 given: WorkloadPreset, workload: WorkloadPreset) -> tuple[str, str]:
    """(where, key) to blame for an optimizer step larger than the data set: the --set that
    made the step larger or the data set smaller, else the device preset's file. `given` and
    `workload` are the workload before and after --set."""
    for key in ("batch_size", "accumulation", "nproc_per_node", "nnodes"):
        if getattr(device, key) != getattr(start, key):
            return "--set", f"device.{key}"
    params, before = workload.params, given.params
    size = workloads.most_samples(workload.workload, params)
    shrunk = [f"params.{f.name}" for f in dataclasses.fields(params)   # each --set param on its own
              if getattr(params, f.name) != getattr(before, f.name) and size != workloads.most_samples(
                  workload.workload, dataclasses.replace(params, **{f.name: getattr(before, f.name)}))]
    if shrunk:
        return "--set", " and ".join(shrunk)
    return start_where, "batch_size"


def resolve(workload_name: str, device_name: str, overrides: list[str] | None = None) -> RunConfig:
    """Load both presets, apply overrides, load the ladder: everything checked up front."""
    ref = presets.find("workloads", workload_name)
    return _resolve(presets.load_workload(workload_name), workload_name, str(ref.path),
                    device_name, overrides)


def resolve_command(argv: list[str], name: str, device_name: str,
                    overrides: list[str] | None = None) -> RunConfig:
    """An ad-hoc command (`cockpit run -- CMD...`) as a run, checked like a command preset."""
    # 'run', the subcommand, not 'cockpit run': every error line already begins 'cockpit: '
    # a known program's conventions (mlx-lm's checkpoints and resume), which --set may override
    workload = presets.workload_from_table({"command": list(argv), **programs.conventions(list(argv))}, "run")
    return _resolve(workload, name, "run", device_name, overrides)


def _resolve(workload: WorkloadPreset, workload_name: str, where: str, device_name: str,
             overrides: list[str] | None) -> RunConfig:
    device_ref = presets.find("devices", device_name)
    config = configure(workload, workload_name, where, device_name, presets.load_device(device_name),
                       str(device_ref.path), list(overrides or []))
    check_faults(config, str(device_ref.path))
    return config


def configure(workload: WorkloadPreset, workload_name: str, where: str, device_name: str,
              start: DevicePreset, start_where: str, overrides: list[str],
              known: dict[str, DevicePreset] | None = None) -> RunConfig:
    """A run's configuration from its workload, its starting device preset as loaded (from
    `start_where`) and the `--set` overrides: the ladder loaded and checked, the user's device
    settings carried down it, a command checked against this machine, the first step against
    the data set. A new run and a resumed one (engine.run.resume, with the presets it recorded
    as `known`) are configured alike."""
    given = workload
    workload, device = apply_overrides(workload, start, overrides)
    # A ladder given with --set is the argument's to fix, not the preset file's.
    ladder = presets.check_ladder(device_name, device, *(
        (start_where, "fallback") if device.fallback == start.fallback
        else ("--set", "device.fallback")), known=known)
    ladder = carry_overrides(workload, ladder, overrides)
    if workload.is_command:
        workload = check_command(workload, where, {device_name: device, **ladder})
        for spec, names in _faults_of({device_name: device, **ladder}).items():
            for kind, what in (("wrong-grad", "perturbs the gradients of"), ("compile-error", "fails the compile of"),
                               ("diverge", "raises the learning rate of")):
                if spec.startswith(kind + "@"):
                    raise ConfigError(*fault_from(spec, names, device_name, start_where, overrides),
                                      f"{kind} {what} cockpit's own trainer; a command's training "
                                      "loop is its own, expected another fault kind")
    else:  # the first attempt's step vs the data set; the trainer checks every attempt's
        size = workloads.most_samples(workload.workload, workload.params)
        step = device.effective_batch * device.world_size
        if size is not None and step > size[0]:
            (samples, exact), (where, key) = size, _step_set_by(device, start, start_where, given, workload)
            if key.startswith("params."):
                raise ConfigError(where, key, f"makes a data set of {'' if exact else 'at most '}"
                                  f"{samples} samples, fewer than one optimizer step of device "
                                  f"preset {device_name!r} ({workloads.step_size(device)}); expected "
                                  f"at least {step} samples (or a smaller batch_size or accumulation)")
            workloads.check_batch(device, samples, where, key, exact=exact)
    return RunConfig(workload_preset=workload_name, device_preset=device_name,
                     workload=workload, device=device, ladder=ladder, overrides=tuple(overrides))


# ---------------------------------------------------------------- faults (--inject)


def inject_override(specs: list[str]) -> str:
    """`--inject` as the override it is (device.inject, carried down the ladder), each spec
    checked first so that a bad one names --inject, not the --set it becomes."""
    for spec in specs:
        try:
            vocabulary.parse(spec)
        except ValueError as e:
            raise ConfigError("--inject", None, str(e)) from None
    return "device.inject=" + json.dumps(list(specs))


def _faults_of(devices: dict[str, DevicePreset]) -> dict[str, list[str]]:
    """Each fault spec, with the presets that carry it."""
    found: dict[str, list[str]] = {}
    for name, preset in devices.items():
        for spec in preset.inject:
            found.setdefault(spec.strip(), []).append(name)
    return found


def fault_from(spec: str, names: list[str], start: str, start_where: str,
                overrides: list[str] | tuple[str, ...]) -> tuple[str, str]:
    """(where, key) of a fault: --inject (which becomes device.inject) or --set inject when the
    run's faults were given on the command line (they then replace every preset's; the last one
    given is what holds), else the preset file that has it."""
    for item in reversed(overrides):
        key = item.partition("=")[0].strip()
        if key == "device.inject":
            return "--inject", spec
        if key == "inject":
            return "--set", f"inject: {spec}"
    return (start_where if names[0] == start else f"device preset {names[0]!r}"), f"inject: {spec}"


def check_faults(config: RunConfig, start_where: str) -> None:
    """A new run's step faults that cannot fire, refused before it starts (one line): a step past
    the last the run can reach (the built-in trainer's total on the smallest batch of the ladder,
    a command's total_steps when it gives one), and, in a command, a fault that cockpit.report
    must raise inside the script when the command's Python cannot import cockpit.report. What
    only the running command can show (output with no step numbers, a script that never calls
    report.step) the supervisor says as it happens."""
    devices = {config.device_preset: config.device, **config.ladder}
    asked: dict[str, tuple[str, bool] | None] = {}   # the command's Python, by preset env
    for spec, names in _faults_of(devices).items():
        fault = vocabulary.parse(spec)
        blame = fault_from(spec, names, config.device_preset, start_where, config.overrides)
        if fault.kind in vocabulary.SUPERVISOR_KINDS and fault.timed:
            raise ConfigError(*blame, f"{fault.kind} fires at a step the supervisor sees; "
                                      f"expected {fault.kind}@STEP")
        if fault.kind == vocabulary.FaultKind.NODE_LOST and \
                any(devices[n].nodes[1] < 2 for n in names):
            raise ConfigError(*blame, "node-lost loses one machine of several; expected a device "
                                      "preset with nnodes above 1 (a run on one machine has no "
                                      "node to lose)")
        last = None if fault.timed else last_step(config, [devices[n] for n in names])
        if last is not None and fault.step is not None and fault.step > last[0]:
            raise ConfigError(*blame, past_last_step(fault, *last))
        if config.workload.is_command and fault.kind in vocabulary.REPORTED_KINDS:
            command_ = config.workload.params
            env = {**os.environ, **devices[names[0]].env}
            key = json.dumps(dict(devices[names[0]].env), sort_keys=True)
            if key not in asked:
                asked[key] = interpreter.reporter(list(command_.command), command_.cwd or os.getcwd(), env)
            python = asked[key]
            if python is not None and not python[1]:
                raise ConfigError(*blame, f"{fault.kind} is raised inside the script by "
                                          f"cockpit.report.step, and {python[0]} cannot import "
                                          "cockpit.report; expected cockpit installed for that "
                                          "interpreter, or native-crash, hang or slow (the "
                                          "supervisor delivers those from outside)")


def past_last_step(fault, last: int, why: str) -> str:
    """What is wrong with a step fault that no attempt can reach: said here before the run, or by
    the trainer's first attempt where only it knows the run's length (engine.train.trainer)."""
    return (f"step {fault.step} is past the run's last step, {last} ({why}); expected a step "
            f"from 0 to {last}, or a time ('{fault.kind}@30s')")


def last_step(config: RunConfig, devices: list[DevicePreset],
              samples: int | None = None) -> tuple[int, str] | None:
    """The last optimizer step any of these presets can reach in this run, and why; None when
    it is not known (a command without total_steps, a workload that does not say its size
    without building its data). `samples`: the data set's size where the caller built it (the
    trainer, for trm)."""
    workload = config.workload
    if workload.is_command:
        total = workload.params.total_steps
        return (total, "command.total_steps") if total else None
    samples = samples or workloads.num_samples(workload.workload, workload.params)
    if samples is None:
        return None
    total = max(1, round(workload.train.epochs * samples))
    first = config.device.effective_batch * config.device.world_size
    if workload.train.max_steps:
        total = min(total, workload.train.max_steps * first)
    # A later attempt counts on from its checkpoint in steps of its own batch: the smallest
    # batch of the presets that carry the fault takes the most steps.
    batch = min(d.effective_batch * d.world_size for d in devices)
    return math.ceil(total / batch), f"{total} samples in steps of {batch}"

"""What the probe measures: one device preset per candidate, with a label a user reads.

`--devices cpu,mps` compares devices on equal terms: one base preset (micro-batch,
accumulation, precision ...) with only the device changed. `--presets a,b` compares whole
presets as they are. On the CPU the thread count matters as much as the device (torch's
default is every logical core, which is not always the fastest), so a CPU candidate is
tried with 1 thread, the physical cores and the logical cores (a command gets them through
OMP_NUM_THREADS and its {threads}).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import cast

import psutil

from engine import command, presets, runconfig
from engine.errors import ConfigError
from engine.numbers import count
from engine.preset_types import Device, DevicePreset, WorkloadPreset
from engine.monitor.machine import available_devices

DEVICES = ("cuda", "mps", "cpu")


@dataclass(frozen=True)
class Candidate:
    label: str            # "cpu (2 threads)", "mps", "mps-safe"
    preset_name: str      # the device preset it came from
    preset: DevicePreset  # what the worker runs, overrides applied
    twin: bool = False    # its preset with compile the other way round (a CUDA twin)


def thread_counts() -> list[int]:
    """1, the physical cores and the logical cores, without repeats."""
    logical = psutil.cpu_count(logical=True) or 1
    physical = psutil.cpu_count(logical=False) or logical
    return sorted({1, physical, logical})


def parse_list(text: str | None, argument: str) -> list[str]:
    if text is None:
        return []
    items = [t.strip() for t in text.split(",")]
    if not all(items) or len(set(items)) != len(items):
        raise ConfigError(argument, None, f"got {text!r}; expected a comma-separated list of "
                                          "distinct names (e.g. cpu,mps)")
    return items


def build(workload: WorkloadPreset, *, devices: list[str], preset_names: list[str], base: str,
          overrides: list[str], threads: bool = True, compile: bool = True) -> list[Candidate]:
    """The candidates, each preset validated as a run would validate it. A CUDA candidate has a
    twin beside it with compile the other way round (`compile`): compiled if its preset runs
    eagerly, eager if it compiles. On a GPU, torch.compile is the biggest speed lever there is
    (2.2x for trm-chat-small on the H100), and only measuring both says whether it pays for
    its compile time on this workload. Never on MPS (refused there) nor for a command (its
    model is its own)."""
    if devices and preset_names:
        raise ConfigError("--devices", None, "and --presets both given; expected one of them")
    for name in devices:
        if name not in DEVICES:
            raise ConfigError("--devices", None, f"{name!r} is not a device; expected one of "
                              + ", ".join(DEVICES))
    if preset_names:
        found = [(name, name, _resolve(workload, name, overrides)) for name in preset_names]
    else:
        preset = _resolve(workload, base, overrides)
        # the base's compile holds on CUDA only: the cuda preset's compile = true is no reason
        # to compile on the CPU, and MPS refuses it
        # cast: each is one of DEVICES (--devices is checked above, the machine's are)
        found = [(d, base, dataclasses.replace(preset, device=cast(Device, d),
                                               compile=preset.compile and d == "cuda"))
                 for d in devices or available_devices()]
    out = []
    for label, name, preset in found:
        if preset.world_size > 1:
            raise ConfigError(f"device preset {name!r}", "nproc_per_node",
                              f"{preset.world_size} processes; the probe "
                              "measures one process, expected 1 (probe per GPU, then scale)")
        # A fault that fires in every attempt fires in the probe too (tests, rehearsals).
        preset = dataclasses.replace(preset, fallback=(), on_slowdown="warn")
        if workload.is_command:  # its compile is its own code's: nothing to time apart
            preset = dataclasses.replace(preset, compile=False)
        if preset.device == "cpu" and threads and not _threads_fixed(workload, preset):
            counts = thread_counts() if not preset.threads else sorted({preset.threads, *thread_counts()})
            out += [Candidate(f"{label} ({count(t, 'thread')})", name,
                              dataclasses.replace(preset, threads=t)) for t in counts]
        else:
            out.append(Candidate(label, name, preset))
        if compile and preset.device == "cuda" and not workload.is_command:
            out.append(Candidate(f"{label} {'eager' if preset.compile else 'compiled'}", name,
                                 dataclasses.replace(preset, compile=not preset.compile), twin=True))
    return out


def _threads_fixed(workload: WorkloadPreset, preset: DevicePreset) -> bool:
    """A command whose preset sets OMP_NUM_THREADS itself and whose arguments take no
    {threads}: the thread count cannot reach it, so one candidate is enough."""
    if not workload.is_command or "OMP_NUM_THREADS" not in preset.env:
        return False
    return "threads" not in command.used(workload.params)


def _resolve(workload: WorkloadPreset, device_name: str, overrides: list[str]) -> DevicePreset:
    device = presets.load_device(device_name)
    # Only the device section of --set applies to each candidate's preset; params and train
    # were applied to the workload already (the same split a run makes).
    _, device = runconfig.apply_overrides(workload, device, overrides)
    return device

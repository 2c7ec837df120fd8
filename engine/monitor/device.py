"""Device and precision, resolved once per attempt, with the reason recorded.

Only documented torch.cuda / torch.mps calls are used; version-dependent ones are guarded
with hasattr (see PLATFORM_FACTS.md).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from engine.errors import ConfigError
from engine.monitor.device_rules import settle
from engine.preset_types import DevicePreset

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Resolved:
    device: torch.device
    precision: str          # fp32 | bf16 | fp16
    reason: str             # why this device and precision, in words

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return None if self.precision == "fp32" else DTYPES[self.precision]

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def resolve(preset: DevicePreset, where: str = "device preset") -> Resolved:
    """Pick the device (auto: CUDA > MPS > CPU) and the precision, or raise ConfigError."""
    if preset.device == "auto":
        if torch.cuda.is_available():
            kind, why = "cuda", f"auto: CUDA is available ({torch.cuda.get_device_name(0)})"
        elif mps_available():
            kind, why = "mps", "auto: no CUDA; MPS is available"
        else:
            kind, why = "cpu", "auto: neither CUDA nor MPS is available"
    else:
        kind, why = preset.device, f"preset asks for {preset.device}"
        if kind == "cuda" and not torch.cuda.is_available():
            raise ConfigError(where, "device", "'cuda' is not available on this machine "
                              "(torch.cuda.is_available() is false); expected 'auto' or 'cpu'")
        if kind == "mps" and not mps_available():
            raise ConfigError(where, "device", "'mps' is not available on this machine "
                              "(torch.backends.mps.is_available() is false); expected 'auto' or 'cpu'")
    if kind == "cuda" and 1 < preset.nproc_per_node > torch.cuda.device_count():
        raise ConfigError(where, "nproc_per_node", f"{preset.nproc_per_node} processes but this "
                          f"machine has {torch.cuda.device_count()} CUDA devices; expected at most that")
    precision, why = settle(preset, kind, why, where, bf16_supported=torch.cuda.is_bf16_supported)
    return Resolved(torch.device(kind), precision, why)


def make_ready(device: torch.device) -> None:
    """CUDA's context created now, by a first allocation (it is lazy: the model's move to the
    device would otherwise pay for it, unseen); nothing to do on other devices."""
    if device.type == "cuda":
        torch.zeros(1, device=device)
        torch.cuda.synchronize(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif device.type == "mps":
        torch.mps.empty_cache()


def memory(device: torch.device) -> dict:
    """Device memory in bytes, as this backend reports it; {} on CPU."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return {"allocated": torch.cuda.memory_allocated(device),
                "reserved": torch.cuda.memory_reserved(device),
                "peak": torch.cuda.max_memory_allocated(device),
                "free": free, "total": total}
    if device.type == "mps":
        out = {"allocated": torch.mps.current_allocated_memory(),
               "driver": torch.mps.driver_allocated_memory()}
        if hasattr(torch.mps, "recommended_max_memory"):
            out["limit"] = torch.mps.recommended_max_memory()
        return out
    return {}


def peak_memory_mb(device: torch.device) -> dict[str, float]:
    """The most memory this process has used so far, in MiB, keyed by what was measured
    (the figures differ in kind, so the key says which one it is)."""
    if device.type == "cuda":
        return {"peak_cuda_allocated_mb": torch.cuda.max_memory_allocated(device) / 2**20}
    if device.type == "mps":
        # Metal keeps no peak: this is what it holds for the process now (cache included).
        return {"mps_driver_allocated_mb": torch.mps.driver_allocated_memory() / 2**20}
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in bytes on macOS and in KiB on Linux.
    return {"peak_rss_mb": peak / 2**20 if sys.platform == "darwin" else peak / 2**10}


def rng_state() -> dict:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if mps_available():
        state["mps"] = torch.mps.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    # A device's RNG state only applies on the same kind of device (a fallback from MPS to CPU
    # continues with the CPU generator, which is all the CPU uses).
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "mps" in state and mps_available():
        torch.mps.set_rng_state(state["mps"])


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)  # seeds CPU, CUDA and MPS generators

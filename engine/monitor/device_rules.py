"""What a device preset may ask of its device, judged before anything is written.

torch is needed only to ask the machine what it has (CUDA, MPS, bf16): a CPU preset is judged
without it, so the supervisor of a CPU run never imports torch -- about 1 s of CPU at every
start and some 200 MB it has no use for (its trainer imports its own).
"""

from __future__ import annotations

from typing import Callable

from engine.errors import ConfigError
from engine.preset_types import DevicePreset


def settle(preset: DevicePreset, kind: str, why: str, where: str,
           bf16_supported: Callable[[], bool]) -> tuple[str, str]:
    """The precision on device `kind` and why, or ConfigError for what `kind` refuses."""
    if kind == "mps" and preset.world_size > 1:
        raise ConfigError(where, "nproc_per_node", f"{preset.nproc_per_node} is refused: auto picked "
                          "MPS, and torch.distributed has no MPS backend; expected 1")
    if kind == "mps" and preset.compile:
        raise ConfigError(where, "compile", "true is refused on MPS: torch.compile's Metal "
                          "backend is immature; expected false")
    precision = preset.precision
    if precision == "auto":
        if kind == "cuda" and bf16_supported():
            precision, why = "bf16", why + "; bf16 because this GPU supports it"
        else:
            precision, why = "fp32", why + f"; fp32, the safe default on {kind}"
    if precision == "fp16" and kind != "cuda":
        raise ConfigError(where, "precision", f"'fp16' needs CUDA's GradScaler; on {kind} "
                          "expected 'fp32' or 'bf16'")
    return precision, why


def check(preset: DevicePreset, where: str = "device preset") -> None:
    """ConfigError if this machine cannot run `preset` (engine.monitor.device.resolve's rules)."""
    if preset.device == "cpu":
        settle(preset, "cpu", "", where, bf16_supported=lambda: False)
        return
    from engine.monitor import device   # torch: only it can say what the machine has

    device.resolve(preset, where)

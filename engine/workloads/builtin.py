"""The built-in workloads: the name a preset writes -> the package of its card (Params,
num_samples, build; no torch). The registry (engine.workloads) and the custom loader, whose
errors list these names, both read it."""

from __future__ import annotations

BUILTIN = {
    "matmul": "engine.workloads.matmul",
    "twotower": "engine.workloads.twotower",
    "clip": "engine.workloads.clip",
    "trm": "engine.workloads.trm",
    "lora": "engine.workloads.lora",
}

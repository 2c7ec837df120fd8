"""Probe results, kept per machine and workload configuration.

A result is valid for the machine it was measured on (CPU model and cores, memory, GPUs,
torch version) and for exactly the workload configuration and candidates it measured: the
key hashes all of them, so changing a workload parameter, a preset or the budget measures
again. Files live in the user cache dir (COCKPIT_CACHE_DIR); deleting them loses only time.
Torch-free: the launch screen reads results without loading torch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from engine import files, paths
from engine.monitor.machine import machine
from engine.preset_types import WorkloadPreset
from engine.schema import to_table


# Bumped when a result's fields change: an older file is then a miss, never a crash.
SCHEMA = 1


def probes_dir() -> Path:
    return paths.cache_dir() / "probes"


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def workload_key(workload: WorkloadPreset) -> str:
    """The workload configuration that decides speed: which workload and its parameters."""
    return _digest({"workload": workload.workload, "params": to_table(workload.params)})


def key(machine_info: dict, workload: WorkloadPreset, candidates, budget_s: float,
        mode: str = "speed") -> str:
    return _digest({"schema": SCHEMA, "mode": mode, "machine": machine_info,
                    "workload": workload_key(workload),
                    "candidates": [[c.label, to_table(c.preset)] for c in candidates],
                    "budget_s": budget_s})


def _read(path: Path) -> dict | None:
    """A stored speed-probe result (its schema field removed), or None for anything else."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.pop("schema", None) != SCHEMA:
        return None
    if not all(k in data for k in ("candidates", "created", "sentence", "workload_preset")):
        return None
    return data


def identify(workload: WorkloadPreset, candidates, budget_s: float) -> dict:
    """What a speed probe's result is filed under: the machine, the key, the workload's key."""
    machine_info = machine()
    return {"machine": machine_info, "key": key(machine_info, workload, candidates, budget_s),
            "workload_key": workload_key(workload)}


def load(result_key: str) -> dict | None:
    return _read(probes_dir() / f"{result_key}.json")


def save(result: dict) -> Path:
    """Write a result; raises OSError when the cache dir is not writable (callers warn)."""
    path = probes_dir() / f"{result['key']}.json"
    files.atomic_write(path, json.dumps({"schema": SCHEMA, **result}, indent=1).encode())
    return path


def latest_by_workload() -> dict[str, dict]:
    """The newest speed probe result of each workload preset, reading every file once."""
    newest: dict[str, dict] = {}
    for path in probes_dir().glob("*.json") if probes_dir().is_dir() else []:
        data = _read(path)
        if data is not None and data["created"] > newest.get(data["workload_preset"], {}).get("created", -1):
            newest[data["workload_preset"]] = data
    return newest


def latest(workload_preset: str | None = None) -> dict | None:
    """The newest speed probe result, for one workload preset or any; None when there is none."""
    newest = latest_by_workload()
    if workload_preset is not None:
        return newest.get(workload_preset)
    return max(newest.values(), key=lambda d: d["created"], default=None)


def age_text(created: float, now: float) -> str:
    seconds = max(0.0, now - created)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return "just now"


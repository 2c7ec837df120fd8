"""Checkpoints: everything an attempt needs to continue where another one stopped.

Model (the uncompiled module's state_dict), optimizer, grad scaler, RNG states, the
position in the data (optimizer steps and samples seen), the config and a schema version.
Written atomically (temp file + rename, fsync'd), so a crash mid-save leaves the previous
checkpoint intact; only the last K are kept.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

SCHEMA = 1
_NAME = re.compile(r"^step-(\d+)\.pt$")


def checkpoint_files(directory: Path) -> list[Path]:
    """Checkpoints in the directory, oldest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest(directory: Path) -> Path | None:
    files = checkpoint_files(directory)
    return files[-1] if files else None


def save(directory: Path, state: dict, keep: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{state['step']:09d}.pt"
    tmp = directory / f".{path.name}.tmp"
    import torch  # lazily: the supervisor lists checkpoints without loading torch

    with open(tmp, "wb") as f:
        torch.save({"schema": SCHEMA, **state}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    for old in checkpoint_files(directory)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def step_of(path: Path) -> int:
    return int(_NAME.match(path.name).group(1))


def load(path: Path) -> dict:
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("schema") != SCHEMA:
        raise ValueError(f"{path}: checkpoint schema {state.get('schema')!r}, expected {SCHEMA}")
    return state

"""Checkpoints: everything an attempt needs to continue where another one stopped.

Model (the uncompiled module's state_dict), optimizer, grad scaler, RNG states, the
position in the data (optimizer steps and samples seen), the config and a schema version.
Written atomically (temp file + rename, fsync'd, the directory too), so a crash mid-save
leaves the previous checkpoint intact; only the last K are kept. A write's temp file
(`.step-N.pt.tmp`) is never listed, so never loaded; older checkpoints are pruned only once the
new one is complete under its name, and a temp file a killed writer left behind is removed by
the next save that completes (a run's checkpoints have one writer at a time: its trainer's rank
0, whose writes engine.train.checkpointer never lets overlap).

Verified when loaded: a torch checkpoint is a zip archive with a CRC-32 per member, so a torn
write (no central directory) and bit rot (a CRC mismatch, which torch.load itself does not
check) are found without torch (`verify`, for the supervisor), and `load` raises `Unreadable`
for anything that cannot be loaded, whatever the reason.
"""

from __future__ import annotations

import os
import re
import time
import zipfile
from pathlib import Path

SCHEMA = 1
_NAME = re.compile(r"^step-(\d+)\.pt$")
_TEMP = re.compile(r"^\.step-\d+\.pt\.tmp$")  # a write in progress, or a killed one's leftover
SET_ASIDE = ".unreadable"  # the suffix an unreadable checkpoint is renamed with
REWOUND = ".rewound"       # ... one after a rewind's target (engine.run.rewind)
# A rewind's target must predate what the supervisor saw go bad, and the checkpoints written in
# the second or so it takes to see it must not prune it: kept this much older than the newest
# too (the oldest until one is), whatever the steps' pace.
ANCHOR_AGE_S = 60.0


class Unreadable(Exception):
    """A checkpoint that cannot be loaded: torn, corrupt, of another schema or another model."""

    def __init__(self, path: Path, problem: str):
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}")


def checkpoint_files(directory: Path) -> list[Path]:
    """Complete checkpoints in the directory, oldest first (a write's temp file is not one)."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest(directory: Path) -> Path | None:
    files = checkpoint_files(directory)
    return files[-1] if files else None


def save(directory: Path, state: dict, keep: int, keep_before: int = 0) -> Path:
    """Write `state` as step-N.pt and prune to the last `keep`; `keep_before` > 0 also keeps the
    newest checkpoint at least that many steps and ANCHOR_AGE_S older than this one (the
    oldest until one is): a rewind's target (engine.run.rewind goes back that far before a
    loss spike), whatever the pruning."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{state['step']:09d}.pt"
    tmp = directory / f".{path.name}.tmp"
    import torch  # lazily: the supervisor lists checkpoints without loading torch

    try:
        with open(tmp, "wb") as f:
            torch.save({"schema": SCHEMA, **state}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
        raise
    _fsync_directory(directory)  # the rename itself survives a power cut
    # Only now, with the new one complete: the previous ones stay the newest until it is.
    files = checkpoint_files(directory)
    anchor = _anchor(files, state["step"] - keep_before) if keep_before else None
    for old in files[:-keep]:
        if old != anchor:
            old.unlink(missing_ok=True)
    for stale in directory.iterdir():   # a killed write's leftover (this one's is renamed)
        if _TEMP.match(stale.name):
            stale.unlink(missing_ok=True)
    return path


def _anchor(files: list[Path], step: int) -> Path | None:
    """The newest of `files` at `step` or before it and ANCHOR_AGE_S old, else the oldest."""
    old = time.time() - ANCHOR_AGE_S
    for path in reversed(files):
        try:
            if step_of(path) <= step and path.stat().st_mtime <= old:
                return path
        except OSError:
            continue
    return files[0] if files else None


def rewind(directory: Path, bound: int) -> tuple[Path | None, list[Path]]:
    """Go back to the newest intact checkpoint at step `bound` or before it (None: none), the
    ones after it set aside, renamed *.rewound (no resume lists them; kept to be looked at):
    (it, their new paths). Torch-free."""
    files = checkpoint_files(directory)
    target = next((p for p in reversed(files) if step_of(p) <= bound and _intact(p)), None)
    after = [p for p in files if target is None or step_of(p) > step_of(target)]
    moved = [p.with_name(p.name + REWOUND) for p in after]
    for old, new in zip(after, moved):
        old.rename(new)
    return target, moved


def _intact(path: Path) -> bool:
    try:
        verify(path)
        return True
    except Unreadable:
        return False


def step_of(path: Path) -> int:
    """The step a checkpoint's file name says (checkpoint_files lists only such names)."""
    named = _NAME.match(path.name)
    if named is None:
        raise ValueError(f"{path.name} is not a checkpoint's name")
    return int(named.group(1))


def verify(path: Path) -> None:
    """Raise Unreadable unless the file is a whole zip archive whose every member matches its
    CRC-32. Torch-free; reads the whole file."""
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile, EOFError, ValueError) as e:
        raise Unreadable(path, f"is not a whole checkpoint: a torn write or a damaged file ({e})") from None
    if bad is not None:
        raise Unreadable(path, f"its {bad} does not match its checksum: the file is corrupt")


def newest_intact(directory: Path) -> Path | None:
    """The newest checkpoint that passes `verify` (torch-free): where the next attempt resumes."""
    for path in reversed(checkpoint_files(directory)):
        try:
            verify(path)
            return path
        except Unreadable:
            continue
    return None


def load(path: Path) -> dict:
    """The checkpoint's state, verified; Unreadable for whatever keeps it from loading."""
    import torch

    verify(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except MemoryError:
        raise
    except Exception as e:
        raise Unreadable(path, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    if not isinstance(state, dict) or state.get("schema") != SCHEMA:
        found = state.get("schema") if isinstance(state, dict) else type(state).__name__
        raise Unreadable(path, f"checkpoint schema {found!r}, expected {SCHEMA}")
    return state


def set_aside(path: Path) -> Path | None:
    """Rename an unreadable checkpoint out of the way (kept as evidence): no longer the newest,
    and never the one the last-K rule keeps in place of a good one. None if it cannot be."""
    aside = path.with_name(path.name + SET_ASIDE)
    try:
        os.replace(path, aside)
    except OSError:
        return None
    return aside


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse a directory fsync
    finally:
        os.close(fd)

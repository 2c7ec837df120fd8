"""An attempt resumes from the run's newest checkpoint that loads.

By samples seen (engine.train.data): a different batch size or accumulation continues at the
same sample, and the first attempt's global batch, kept in every checkpoint, still counts
max_steps and the warmup. A checkpoint that does not load (a torn write, bit rot, another
model's) is reported, set aside (by rank 0) and the one before it tried; if none loads, the
attempt starts from the beginning, with a warning, its state as it was before the first try.
What a checkpoint holds is written by engine.train.trainer.save_checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.emit import Emit
from engine.monitor import device as devices
from engine.record import checkpoint
from engine.record.rundir import RunDir
from engine.train import optim


@dataclass(frozen=True, slots=True)
class Restored:
    path: str                 # the checkpoint's, relative to the run directory
    step: int
    samples_seen: int
    first_global_batch: int   # the first attempt's global batch (max_steps counts its steps)
    load_s: float             # the load's time, from the first one tried
    skipped_samples: int = 0  # samples the run's rewinds skipped before it (engine.run.rewind)
    lr_scale: float = 1.0     # the learning rate's factor its lower-lr rewinds left


def newest(run: RunDir, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
           scaler: torch.amp.GradScaler, first_global_batch: int, emit: Emit,
           set_aside: bool) -> Restored | None:
    """Put the newest checkpoint that loads in place; None when there is none (or none loads).
    set_aside: rename one that does not load (rank 0 does; the other ranks only skip it)."""
    files = checkpoint.checkpoint_files(run.checkpoints)
    if not files:
        return None
    # What a fresh start needs back should a half-restored checkpoint fail (the model is
    # restored last, once everything else has loaded, so it never needs putting back).
    fresh = optimizer.state_dict(), scaler.state_dict(), devices.rng_state(), \
        scheduler.state_dict() if scheduler is not None else None
    started = time.monotonic()
    for path in reversed(files):
        name = str(path.relative_to(run.path))
        try:
            state = checkpoint.load(path)
            step, samples_seen, first = _restore(path, state, model, optimizer,
                                                 scheduler, scaler, first_global_batch)
        except checkpoint.Unreadable as e:
            aside = checkpoint.set_aside(path) if set_aside else None
            emit("warning", kind="checkpoint-unreadable", path=name, error=e.problem,
                 message=f"checkpoint {name} cannot be loaded ({e.problem}); "
                         + (f"set aside as {aside.name}, " if aside else "")
                         + "trying the one before it", advice=[], fallback=False)
            continue
        return Restored(name, step, samples_seen, first, round(time.monotonic() - started, 3),
                        int(state.get("skipped_samples", 0)), float(state.get("lr_scale", 1.0)))
    optimizer.load_state_dict(fresh[0])
    scaler.load_state_dict(fresh[1])
    devices.set_rng_state(fresh[2])
    if fresh[3] is not None:
        scheduler.load_state_dict(fresh[3])
    emit("warning", kind="checkpoint-unreadable", path=None, error="none loads",
         message=f"none of the run's {len(files)} checkpoints loads; training starts from "
                 "the beginning", advice=[], fallback=False)
    return None


def _restore(path: Path, state: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
             scheduler: Any, scaler: torch.amp.GradScaler,
             first_global_batch: int) -> tuple[int, int, int]:
    """Put a loaded checkpoint's state in place: (step, samples seen, the first attempt's global
    batch); Unreadable if it does not fit this run."""
    try:
        mine = model.state_dict()
        theirs = state["model"]
        misfits = [k for k in mine.keys() | theirs.keys()
                   if k not in mine or k not in theirs or mine[k].shape != theirs[k].shape]
        if misfits:
            raise checkpoint.Unreadable(path, "does not fit this run's model ("
                                        + ", ".join(sorted(misfits)[:3]) + ")")
        optimizer.load_state_dict(optim.loadable(optimizer, state["optimizer"], model))
        if scheduler is not None and "scheduler" in state:
            scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])  # a no-op when the scaler is disabled
        devices.set_rng_state(state["rng"])
        step, samples_seen = int(state["step"]), int(state["samples_seen"])
        first = int(state.get("first_global_batch", first_global_batch))
        model.load_state_dict(theirs, strict=True)
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:
        raise checkpoint.Unreadable(path, f"{type(e).__name__}: {e}") from None
    return step, samples_seen, first

"""Text from a finished (or running) run: continue a prompt with its latest checkpoint.

A workload that can write text has `continue_text(model_state, prompt, *, tokens,
temperature, seed, on_text) -> str` (trm and lora do; on_text, when given, gets the text piece
by piece as it is written); it rebuilds its model on the CPU, so sampling never competes with
a run that is still training on the GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine import workloads
from engine.record import checkpoint
from engine.errors import ConfigError
from engine.record.rundir import RunDir


@dataclass(frozen=True)
class Continuation:
    text: str
    checkpoint: Path
    step: int


def continue_prompt(run: RunDir, prompt: str, *, tokens: int = 200, temperature: float = 0.8,
                    seed: int = 0, on_start: Callable[[Path, int], None] | None = None,
                    on_text: Callable[[str], None] | None = None) -> Continuation:
    """on_start(checkpoint, step) once the checkpoint is loaded, then on_text(piece) as the
    text is written: for a caller that shows it as it comes."""
    if tokens < 1:
        raise ConfigError("--tokens", str(tokens), "expected a positive number of bytes")
    if not 0 <= temperature < math.inf:  # also NaN, which no comparison admits
        raise ConfigError("--temperature", str(temperature), "expected a finite number >= 0 "
                                                             "(0 = greedy)")
    config = run.config()
    name = config.workload.workload
    workload = workloads.build(name, config.workload.params, config.workload.train.seed)
    if not hasattr(workload, "continue_text"):
        raise ConfigError(f"run {run.id}", None, f"its workload {name!r} does not write text; "
                                                 "expected a run of a text workload (trm, lora)")
    path = checkpoint.newest_intact(run.checkpoints)
    if path is None:
        raise ConfigError(f"run {run.id}", None, "has no checkpoint yet; expected a run that "
                                                 "has saved one (at the end or on its schedule)")
    try:
        state = checkpoint.load(path)
    except checkpoint.Unreadable as e:
        raise ConfigError(f"run {run.id}", None, f"its newest checkpoint could not be loaded: {e}; "
                                                 "expected a whole checkpoint") from None
    if on_start is not None:
        on_start(path, state["step"])
    text = workload.continue_text(state["model"], prompt, tokens=tokens, temperature=temperature,
                                  seed=seed, on_text=on_text)
    return Continuation(text=text, checkpoint=path, step=state["step"])

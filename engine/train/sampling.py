"""Text from a finished (or running) run: continue a prompt with its latest checkpoint.

A workload that can write text has `continue_text(model_state, prompt, *, tokens,
temperature, seed) -> str` (trm and lora do); it rebuilds its model on the CPU, so sampling
never competes with a run that is still training on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine import workloads
from engine.train import checkpoint
from engine.errors import ConfigError
from engine.run.rundir import RunDir


@dataclass(frozen=True)
class Continuation:
    text: str
    checkpoint: Path
    step: int


def continue_prompt(run: RunDir, prompt: str, *, tokens: int = 200, temperature: float = 0.8,
                    seed: int = 0) -> Continuation:
    if tokens < 1:
        raise ConfigError("--tokens", str(tokens), "expected a positive number of bytes")
    if temperature < 0:
        raise ConfigError("--temperature", str(temperature), "expected a number >= 0 (0 = greedy)")
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
    text = workload.continue_text(state["model"], prompt, tokens=tokens, temperature=temperature,
                                  seed=seed)
    return Continuation(text=text, checkpoint=path, step=state["step"])

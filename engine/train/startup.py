"""An attempt's start-up, timed by phase: trainer_ready's `startup`, and the parts of goodput's
start-up bucket (engine.record.goodput), so that a slow start says which part was slow.

    spare    handed to a spare still at its work ahead (below): the wait for it
    launch   its launch (or that wait's end) to the trainer's set-up: the process, the
             interpreter and the imports (in a spare: the hand-over only)
    device   the device resolved and made ready: CUDA's context created by its first allocation
             (else the model's move to it would pay it, unseen)
    data     the workload built: its data generated, read or tokenized
    model    the model built and moved to the device, wrapped (DDP, torch.compile's wrapper: the
             compile itself happens in the first step, goodput's compile bucket), its optimizer
    resume   the checkpoint found and loaded (goodput's checkpoint_load bucket already)
    setup    the rest of the trainer's set-up: schedule, checkpoint writer, instruments

and, after trainer_ready, `parity` (the parity check, in its own event).

What a spare (engine.train.spare) did ahead is not paid again: it creates the device's context
and builds the workload while the attempt before trains (`ahead`), and, for a compiled model on
CUDA, builds the model and compiles its forward; the trainer takes what is the same one (the
workload's name, parameters and seed; the preset's settings that shape the model). Torch is
imported only where a model is built.
"""

from __future__ import annotations

import json
import time
from typing import Any

from engine.train.faults import attempt_started


class Clock:
    """Laps of the trainer's set-up, each named as it ends; `launch` from the launch's moment."""

    def __init__(self) -> None:
        self.phases: dict[str, float] = {}
        now = time.time()
        if (launched := attempt_started()) is not None:   # the launch's moment, time.time()
            if _ahead_done is not None and _ahead_done > launched:
                # handed to a spare still at its work ahead: the wait for it is its own part
                self.phases["spare"] = round(_ahead_done - launched, 3)
                launched = _ahead_done
            self.phases["launch"] = round(max(0.0, now - launched), 3)
        self._lap = time.monotonic()

    def lap(self, phase: str) -> None:
        """End `phase` now (its seconds added to any earlier lap of the same name)."""
        now = time.monotonic()
        self.phases[phase] = round(self.phases.get(phase, 0.0) + now - self._lap, 3)
        self._lap = now

    def fields(self) -> dict[str, Any]:
        """trainer_ready's `startup`: seconds by phase, what a spare did ahead and how long each
        part of that took it (`ahead_s`: imports, device, data, model), whether the attempt
        waited for it or not."""
        done = {"ahead": sorted(_ahead)} if _ahead else {}
        timed = {"ahead_s": {k: round(v, 3) for k, v in _ahead_s.items()}} if _ahead_s else {}
        return {**self.phases, **done, **timed}


def timed_ahead(part: str, since: float) -> None:
    """The spare spent time.monotonic() - `since` on `part` of its work ahead."""
    _ahead_s[part] = _ahead_s.get(part, 0.0) + time.monotonic() - since


# What the spare did ahead in this process: the phases it saved ('device', 'data') and the
# workload it built, under its key, with torch's random state as the build left it.
_ahead: set[str] = set()
_workload: tuple[str, Any, Any] | None = None
_model: tuple[str, Any, Any, Any] | None = None   # a compiled model: its key, it, its forward, the RNG
_ahead_done: float | None = None   # time.time() when the spare's work ahead ended
_ahead_s: dict[str, float] = {}    # the spare's seconds by part of its work ahead


def workload_key(name: str, params: dict, seed: int) -> str:
    return json.dumps([name, params, seed], sort_keys=True, default=str)


def built_ahead(key: str, workload: Any, rng_after: Any) -> None:
    """The spare built this workload (`key`: workload_key; seeded as the trainer seeds it), for
    the attempt it becomes; `rng_after`: the random state the build left, which the model's
    initialisation draws from next."""
    global _workload
    _workload = (key, workload, rng_after)
    _ahead.add("data")


def model_key(workload: str, preset: Any) -> str:
    """What a model built ahead must match: the workload and the preset's settings that shape
    the model or its compiled graph (its micro-batch: the graph's shapes)."""
    return json.dumps([workload, preset.device, preset.precision, preset.compile, preset.compile_regions,
                       preset.grad_checkpointing, preset.batch_size])


def compile_ahead(workload: Any, key: str, preset: Any, resolved: Any) -> None:
    """The spare's model, built as the trainer builds it and its forward compiled by one
    forward and backward pass on the workload's first micro-batch (CUDA's compile, seconds a
    recovery would wait), then set back: its gradients dropped, its state (buffers a train-mode
    pass may move) as built, torch's random state as the build left it. The attempt loads its
    checkpoint into it, or trains it from there as it would a model it built itself."""
    import torch

    from engine.monitor import device as devices
    from engine.train import compiling

    global _model
    model = workload.build_model(grad_checkpointing=preset.grad_checkpointing).to(resolved.device)
    after = devices.rng_state()
    forward = compiling.compiled_forward(model, workload, preset)
    built = {k: v.detach().clone() for k, v in model.state_dict().items()}
    batch = workload.batch(torch.arange(min(preset.batch_size, workload.num_samples)), resolved.device)
    with resolved.autocast():
        loss = workload.loss(forward, batch)
    loss.backward()
    model.zero_grad(set_to_none=True)
    model.load_state_dict(built)
    del built, batch, loss
    devices.empty_cache(resolved.device)
    devices.set_rng_state(after)
    _model = (model_key(key, preset), model, forward, after)
    _ahead.add("model")


def take_model(key: str, preset: Any) -> tuple[Any, Any, Any] | None:
    """The model compiled ahead, its forward and the random state after its build, if it was
    built for this workload and preset (once)."""
    global _model
    held, _model = _model, None
    if held is not None and held[0] == model_key(key, preset):
        return held[1], held[2], held[3]
    _ahead.discard("model")
    return None


def done_ahead() -> None:
    """The spare's work ahead is over (done or given up): when, for the attempt's `spare` part."""
    global _ahead_done
    _ahead_done = time.time()


def device_ready_ahead() -> None:
    _ahead.add("device")


def take_workload(key: str) -> tuple[Any, Any] | None:
    """The workload built ahead and the random state after it, if it is this one (`key`:
    workload_key; once: its data is the attempt's now)."""
    global _workload
    held, _workload = _workload, None
    if held is not None and held[0] == key:
        return held[1], held[2]
    _ahead.discard("data")
    return None

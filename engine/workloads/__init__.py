"""Workloads: what cockpit trains, behind one small protocol.

A workload package exposes, without importing torch:
    Params                 a frozen settings dataclass (the preset's [params] table)
    build(params, seed)    -> an object with the Workload protocol below

The engine owns the data order: it asks for the samples at given indices, so a run resumed
with another batch size or accumulation continues at exactly the same sample.

A user's own workload is named 'package.module:factory' or by an entry point in group
'cockpit.workloads'; engine/workloads/custom.py loads it and documents the protocol for users.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol

from engine.errors import ConfigError
from engine.preset_types import DevicePreset
from engine.workloads import custom
from engine.workloads.builtin import BUILTIN

if TYPE_CHECKING:
    import torch


class Workload(Protocol):
    """What the trainer needs from a workload."""

    num_samples: int
    """training samples in one epoch; sample indices run over range(num_samples)"""

    flops_per_sample: float | None
    """training FLOPs per sample (forward + backward), for GFLOP/s; None if unknown"""

    def build_model(self, *, grad_checkpointing: bool) -> "torch.nn.Module": ...

    def batch(self, indices: "torch.Tensor", device: "torch.device") -> Any:
        """The training samples at these indices, on the device."""

    def loss(self, model: "torch.nn.Module", batch: Any) -> "torch.Tensor":
        """Mean loss over the batch, a scalar tensor on the device."""

    def evaluate(self, model: "torch.nn.Module", device: "torch.device") -> dict[str, float]:
        """Held-out metrics; may return {} when the workload has none."""

    # Optional:
    #   def prepare_epoch(self, model, epoch: int, device, emit) -> None
    # called (under torch.no_grad, model in eval mode) before the first sample of every
    # epoch an attempt trains, including the epoch it resumes in; work that depends on the
    # current model goes here (the two-tower retriever mines hard negatives). `emit(type,
    # **fields)` writes an event (e.g. "mining"). The device preset's empty_cache policy
    # 'before-mining' empties the device cache just before this call. Its time is counted
    # apart from training throughput.
    #   def repeated_blocks(self, model) -> list[nn.Module]
    # the model's repeated blocks (a transformer's layers): with the preset's compile = true,
    # each is compiled on its own instead of the whole model, and one compiled block serves
    # every block of its class and shapes (engine.train.compiling).
    #   def configure_optimizers(self, model, train) -> optimizer | (optimizer, scheduler)
    # the workload's own optimizer instead of the one [train] describes (engine.train.optim);
    # custom.py's docstring says how it meets [train]'s schedule.


def _module(name: str, where: str):
    if name not in BUILTIN:
        raise ConfigError(where, "workload", f"got {name!r}, expected one of "
                          + ", ".join(repr(n) for n in BUILTIN))
    return importlib.import_module(BUILTIN[name])


def params_class(name: str, where: str, table: dict | None = None) -> type:
    if name not in BUILTIN:  # 'package.module:factory' or an entry point: engine.workloads.custom
        return custom.params_class(name, where, table or {})
    return _module(name, where).Params


def num_samples(name: str, params: Any) -> int | None:
    """A built-in workload's training samples per epoch, when its package can tell without
    building the data (its optional `num_samples(params)`); None when only the trainer knows."""
    if name not in BUILTIN:
        return None
    known = getattr(_module(name, "workload"), "num_samples", None)
    return known(params) if known else None


def most_samples(name: str, params: Any) -> tuple[int, bool] | None:
    """(the most training samples an epoch can have, whether that is exactly its size), known
    without building the data: `num_samples` where the package tells it, else the bound its
    optional `most_samples(params)` gives (trm's text is at most corpus_bytes long, so a batch
    larger than the whole of it is refused before a run directory is made rather than by the
    trainer inside the run); None when nothing is known before the data is built."""
    if (exact := num_samples(name, params)) is not None:
        return exact, True
    bound = getattr(_module(name, "workload"), "most_samples", None) if name in BUILTIN else None
    return (bound(params), False) if bound else None


def step_size(device: "DevicePreset") -> str:
    """A step's samples as the preset makes them: '100000 x accumulation 64 = 6400000', or
    just '99999' where batch_size alone is the step (never a product of one factor, 'x = x')."""
    parts = [str(device.batch_size)]
    if device.accumulation > 1:
        parts.append(f"accumulation {device.accumulation}")
    if device.world_size > 1:
        parts.append(f"{device.world_size} processes")
    step = device.effective_batch * device.world_size
    return " x ".join(parts) + f" = {step}" if len(parts) > 1 else str(step)


def check_batch(device: "DevicePreset", samples: int, where: str, key: str = "batch_size",
                exact: bool = True) -> None:
    """An optimizer step may not take more samples than the data set has: it would be one
    step over all of them (and more), a mistake whatever the device. `where` and `key` name
    what set the step: the preset file's batch_size, or --set's device.batch_size. `exact`
    False: `samples` is only the most the data set can have (most_samples)."""
    if device.effective_batch * device.world_size <= samples:
        return
    has = "has" if exact else "has at most"
    raise ConfigError(where, key, f"{step_size(device)} samples per optimizer step, but the data "
                      f"set {has} {samples}; expected at most {samples} a step (a smaller "
                      "batch_size or accumulation, or more samples)")


def build(name: str, params: Any, seed: int) -> Workload:
    if name not in BUILTIN:
        return custom.build(name, params, seed)
    return _module(name, "workload").build(params, seed)

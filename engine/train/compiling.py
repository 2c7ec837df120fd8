"""torch.compile for the trainer: the whole model, or each of its repeated blocks.

A transformer is one block N times. Compiled whole, Dynamo traces all N and Inductor compiles
the lot. Compiled block by block ("regional compilation"), Dynamo traces one block's forward and,
with torch 2.5's inline_inbuilt_nn_modules (always on in 2.13), takes the block's parameters as
inputs rather than constants: its guards hold for every block of that class and those shapes,
so one compiled graph serves them all and the compile costs one block, not N. What stays
outside the blocks (embeddings, the head, the loss) runs eagerly; benchmarks/compile.py
measures both.

A workload names its repeated blocks with an optional `repeated_blocks(model)` (trm and lora:
the stack's layers; clip: each tower's blocks). Where it does, the preset's `compile = true`
compiles them (unless `compile_regions = false`, or gradient checkpointing is on: see
compiled_forward); where it does not, the whole model as before.

Either way only the trainer's forward is compiled. The model itself runs eagerly when called
directly: the evaluation, the parity check and a short last micro-batch call it so, because
their shapes would compile again and a shape seen to change leaves the graph dynamic (the
trainer's and engine.train.parity's comments say what that cost). The whole model's
OptimizedModule leaves the model as it is; the blocks' compiled calls are turned on only for
the length of the forward (Regional), through the attribute nn.Module.compile() sets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

Mode = Literal["off", "model", "regional"]


class Regional(nn.Module):
    """The model (or DDP around it) with its repeated blocks compiled while it is called
    through this; eager when called any other way."""

    def __init__(self, wrapped: nn.Module, blocks: Sequence[nn.Module]):
        super().__init__()
        self.wrapped = wrapped
        # What nn.Module.compile() would install on each block, made once: Dynamo's cache is
        # the forward's code object's, shared by every block of a class.
        self.regions = [(block, torch.compile(block._call_impl)) for block in blocks]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        for block, compiled in self.regions:
            block._compiled_call_impl = compiled
        try:
            return self.wrapped(*args, **kwargs)
        finally:
            for block, _ in self.regions:
                block._compiled_call_impl = None

    def __getattr__(self, name: str) -> Any:
        # as an OptimizedModule does: what a workload's loss reads of its model is the model's
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "wrapped":   # not set yet: nothing to forward to
                raise
            return getattr(self.wrapped, name)


def repeated_blocks(wrapped: nn.Module, workload: Any) -> list[nn.Module]:
    """The blocks the workload names (of the model inside DDP, whose parameters they are)."""
    name = getattr(workload, "repeated_blocks", None)
    if name is None:
        return []
    model = wrapped.module if isinstance(wrapped, DistributedDataParallel) else wrapped
    return list(name(model))


def compiled_forward(wrapped: nn.Module, workload: Any, preset: Any) -> nn.Module:
    """The trainer's forward: `wrapped` (the model, or DDP around it) as the preset compiles it,
    block by block where the workload names its repeated blocks."""
    if not preset.compile:
        return wrapped
    # Not with gradient checkpointing: its backward runs each block again, outside this
    # forward, eagerly, and the tensors it recomputes are not those the compiled block saved.
    regional = preset.compile_regions and not preset.grad_checkpointing
    blocks = repeated_blocks(wrapped, workload) if regional else []
    if blocks:
        return Regional(wrapped, blocks)
    # compiling a module gives a module (an OptimizedModule) that forwards to it
    return cast(nn.Module, torch.compile(wrapped))


def mode(forward: nn.Module) -> Mode:
    """How a forward from compiled_forward was compiled: trainer_ready's `compiled`."""
    from torch._dynamo.eval_frame import OptimizedModule   # imported by compiling, not before

    if isinstance(forward, Regional):
        return "regional"
    return "model" if isinstance(forward, OptimizedModule) else "off"


def blocks(forward: nn.Module) -> int:
    """How many blocks a regional forward compiles (0 otherwise): trainer_ready's
    `compiled_blocks`."""
    return len(forward.regions) if isinstance(forward, Regional) else 0

"""A complete custom workload for cockpit, to copy: a small MLP learns y = sin(frequency * x).

Run it from the repository root (examples/README.md says what each part does):

    PYTHONPATH=examples COCKPIT_CONFIG_DIR=examples cockpit --no-ui --workload sine --device cpu

The preset examples/presets/workloads/sine.toml names this file's factory as
`workload = "sine_workload:build"`. cockpit calls `build(params, seed)` in the trainer process
and trains what it returns; the methods below are the whole protocol (the full text is in
engine/workloads/custom.py). The engine owns the data order, so `batch` returns the samples
at the indices it is given and never shuffles on its own: that is what lets a run resumed
with another batch size continue at exactly the same sample.

This file imports torch at its top, which is simplest. cockpit imports it whenever it checks
the preset; if that should stay quick, put Params and build() in a torch-free module and the
rest in another that build() imports, as engine/workloads/matmul/ does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from engine.schema import FieldError, setting


@dataclass(frozen=True, kw_only=True, slots=True)
class Params:
    """The preset's [params] table, checked like a built-in workload's (types, bounds, keys)."""

    hidden: int = setting(64, "width of each hidden layer", min=1)
    layers: int = setting(2, "hidden layers", min=1)
    frequency: float = setting(1.0, "the target is sin(frequency * x) for x in [-pi, pi]", above=0.0)
    noise: float = setting(0.05, "standard deviation of the noise on training targets", min=0.0)
    samples: int = setting(4096, "training samples per epoch", min=1)
    eval_samples: int = setting(512, "held-out points for R^2, evenly spaced", min=2)

    def __post_init__(self):
        # Cross-field checks raise FieldError: cockpit reports it as file, key, problem.
        if self.hidden * self.layers > 1_000_000:
            raise FieldError("hidden", "hidden x layers above 1,000,000 is not a small example")


class SineWorkload:
    def __init__(self, params: Params, seed: int):
        self.params = params
        # Everything random comes from the seed: every attempt of a run sees the same data.
        g = torch.Generator().manual_seed(seed)
        self.x = (torch.rand(params.samples, 1, generator=g) * 2 - 1) * math.pi
        self.y = torch.sin(params.frequency * self.x) + params.noise * torch.randn(
            params.samples, 1, generator=g)
        self.x_eval = torch.linspace(-math.pi, math.pi, params.eval_samples).unsqueeze(1)
        self.y_eval = torch.sin(params.frequency * self.x_eval)

        # Required: how many samples one epoch has; indices run over range(num_samples).
        self.num_samples = params.samples
        # Optional: training FLOPs per sample (forward + backward ~ 3x forward), for GFLOP/s.
        h, n = params.hidden, params.layers
        self.flops_per_sample = 3 * 2.0 * (h + (n - 1) * h * h + h)

    def build_model(self, *, grad_checkpointing: bool) -> nn.Module:
        """Required: a fresh model on the CPU. Too small for checkpointing to matter: ignored."""
        h = self.params.hidden
        layers: list[nn.Module] = [nn.Linear(1, h), nn.Tanh()]
        for _ in range(self.params.layers - 1):
            layers += [nn.Linear(h, h), nn.Tanh()]
        layers.append(nn.Linear(h, 1))
        return nn.Sequential(*layers)

    def batch(self, indices: torch.Tensor, device: torch.device):
        """Required: the samples at these indices, on the device."""
        return self.x[indices].to(device), self.y[indices].to(device)

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        """Required: the mean loss over the batch, a scalar left on the device."""
        x, y = batch
        return nn.functional.mse_loss(model(x).float(), y)

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Optional: held-out metrics (called under no_grad, model in eval mode)."""
        pred = model(self.x_eval.to(device)).float().cpu()
        mse = float(nn.functional.mse_loss(pred, self.y_eval))
        return {"r2": 1.0 - mse / float(self.y_eval.var())}


def build(params: Params, seed: int) -> SineWorkload:
    """The factory the preset names: `workload = "sine_workload:build"`."""
    return SineWorkload(params, seed)

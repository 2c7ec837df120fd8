from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from engine.workloads.matmul.params import Params


def _orthogonal(n: int, generator: torch.Generator) -> torch.Tensor:
    # Orthogonal, so a hundred products neither blow up nor vanish.
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=generator))
    return q


class ProductChain(nn.Module):
    """scale -> `products` multiplications by a fixed orthogonal Q -> readout."""

    q: torch.Tensor   # a buffer (register_buffer), as the type checker should see it

    def __init__(self, q: torch.Tensor, products: int, grad_checkpointing: bool):
        super().__init__()
        n = q.shape[0]
        self.register_buffer("q", q)
        self.scale = nn.Parameter(torch.ones(n))
        self.readout = nn.Parameter(torch.zeros(n))
        self.products = products
        self.grad_checkpointing = grad_checkpointing

    def _chain(self, h: torch.Tensor) -> torch.Tensor:
        for _ in range(self.products):
            h = h @ self.q
        return h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * self.scale
        if self.grad_checkpointing and torch.is_grad_enabled():
            h = checkpoint(self._chain, h, use_reentrant=False)
        else:
            h = self._chain(h)
        return h @ self.readout


class MatmulWorkload:
    def __init__(self, params: Params, seed: int):
        self.params = params
        n = params.n
        g = torch.Generator().manual_seed(seed)
        self.q = _orthogonal(n, g)
        # The teacher is linear end to end: y = x @ w with w = s * (Q^P r).
        teacher_scale = 1.0 + 0.5 * torch.randn(n, generator=g)
        readout = torch.randn(n, generator=g) / n**0.5
        for _ in range(params.products):
            readout = self.q @ readout
        self.w = teacher_scale * readout
        self.x = torch.randn(params.samples, n, generator=g)
        self.y = self.x @ self.w
        self.x_eval = torch.randn(params.eval_samples, n, generator=g)
        self.y_eval = self.x_eval @ self.w
        self.y_var = float(self.y.var())
        self._x, self._y, self._data_device = self.x, self.y, torch.device("cpu")
        self.num_samples = params.samples
        # forward: products x (2 N^2) per sample; backward: the same again for the input grads.
        self.flops_per_sample = 4.0 * n * n * params.products

    def build_model(self, *, grad_checkpointing: bool) -> nn.Module:
        return ProductChain(self.q.clone(), self.params.products, grad_checkpointing)

    def batch(self, indices: torch.Tensor, device: torch.device):
        # The data set is small: keep one copy on the device and gather there, so a GPU
        # measures products, not host-side gathers and copies.
        if self._data_device != device:
            self._x, self._y, self._data_device = self.x.to(device), self.y.to(device), device
        indices = indices.to(device, non_blocking=True)
        return self._x[indices], self._y[indices]

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        x, y = batch
        # Normalised so that predicting zero scores 1.0 whatever N is.
        return nn.functional.mse_loss(model(x).float(), y) / self.y_var

    @torch.no_grad()
    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        pred = model(self.x_eval.to(device)).float().cpu()
        mse = float(nn.functional.mse_loss(pred, self.y_eval))
        return {"r2": 1.0 - mse / float(self.y_eval.var())}

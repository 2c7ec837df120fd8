"""matmul: the field notes' microbenchmark as a training run.

Note 004 timed 100 N x N matrix products to ask "CPU or GPU?". Here every training step
pushes a batch through `products` multiplications by a fixed N x N orthogonal matrix, in
the forward and again in the backward pass, and reports GFLOP/s. A tiny learnable part
(a per-feature scale before the products and a readout after them, 2N parameters) learns a
fixed linear teacher, so the loss falls and the run is a real training run.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.schema import setting


@dataclass(frozen=True, kw_only=True, slots=True)
class Params:
    n: int = setting(256, "matrix size N", min=2)
    products: int = setting(16, "N x N products per forward pass", min=1)
    samples: int = setting(8192, "training samples per epoch", min=1)
    eval_samples: int = setting(1024, "held-out samples for R^2", min=1)


def num_samples(params: Params) -> int:
    """Training samples per epoch, known before the data is built (for the batch check)."""
    return params.samples


def build(params: Params, seed: int):
    from engine.workloads.matmul.workload import MatmulWorkload

    return MatmulWorkload(params, seed)

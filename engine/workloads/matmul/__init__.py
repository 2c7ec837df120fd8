"""matmul: the field notes' microbenchmark as a training run.

Note 004 timed 100 N x N matrix products to ask "CPU or GPU?". Here every training step
pushes a batch through `products` multiplications by a fixed N x N orthogonal matrix, in
the forward and again in the backward pass, and reports GFLOP/s. A tiny learnable part
(a per-feature scale before the products and a readout after them, 2N parameters) learns a
fixed linear teacher, so the loss falls and the run is a real training run.
"""

from __future__ import annotations

from engine.workloads.matmul.params import Params


def num_samples(params: Params) -> int:
    """Training samples per epoch, known before the data is built (for the batch check)."""
    return params.samples


def build(params: Params, seed: int):
    # deferred: workload.py imports torch, which the card keeps out of presets and --help
    from engine.workloads.matmul.workload import MatmulWorkload

    return MatmulWorkload(params, seed)

"""matmul's settings, the preset's [params] table. No torch: the card and workload.py
both import it.
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

"""twotower: notes 000/001's two-tower retriever, with faiss hard-negative mining.

The query tower (a GRU or an LSTM; note 000 moved to LSTM for MPS) reads a sequence of L
context vectors and predicts the next item of a bank of M vectors. The item tower is the
notes' own: the identity on L2-normalised bank vectors (their `IdentityDocTower`), so the
bank is fixed, a faiss index over it is built once per attempt, and what mining finds
changes from epoch to epoch because the query tower does. Loss: InfoNCE over the in-batch
positives plus, in mining epochs, K hard negatives per pair mined with faiss (the positive
excluded). Eval: Recall@K over the whole bank for held-out pairs, by exact faiss search.

Data: the user's `pairs_file` (contexts [N,L,D] float32, targets [N] int64 into the bank)
and `bank_file` (vectors [M,D]), or a seeded synthetic corpus with learnable structure:
articles whose chunk vectors drift around a topic centre by a fixed hidden rotation, so the
next chunk is predictable from the previous ones and far from chance.

The mining schedule, e.g. "0-5:none,6-30:faiss@64":
- comma-separated `FIRST-LAST:MODE` ranges (or `EPOCH:MODE` for one epoch);
- epochs count from 0, as the trainer's step and mining events count them, and both ends
  of a range are included: "0-5:none" is the first six epochs;
- ranges start at epoch 0 and follow each other with no gap and no overlap;
- MODE is `none` (in-batch negatives only) or `faiss@K` (plus K mined hard negatives);
- epochs after the last range do not mine. A range may run past the run's last epoch: the
  notes write "0-30:none" for a 30-epoch run (epochs 0-29).

This card and its params.py import neither torch nor faiss: presets validate quickly.
"""

from __future__ import annotations

from engine.workloads.twotower.params import Params


def num_samples(params: Params) -> int | None:
    """Training pairs per epoch when known before the data is built (synthetic data), else None."""
    return params.pairs if params.synthetic else None


def build(params: Params, seed: int):
    # deferred: workload.py imports torch, which the card keeps out of presets and --help
    from engine.workloads.twotower.workload import TwoTowerWorkload

    return TwoTowerWorkload(params, seed)

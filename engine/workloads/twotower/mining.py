"""faiss over the bank: the index choice, thread coordination, search, positive exclusion.

The bank is fixed (the item tower is the identity on normalised vectors), so one index per
process serves every mining epoch; only the queries change. Exact search uses faiss.knn
straight on the bank's memory (BLAS, no copy of the 1.5 GB bank); an approximate index
(IVF or HNSW) holds its own copy, and its recall against exact search is measured on a
sample of the epoch's own queries, because it depends on where the query tower points.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


def import_faiss():
    """faiss, loaded so that it can live beside torch in one process.

    macOS: the torch and faiss-cpu wheels each ship libomp.dylib, and the second copy to
    initialise aborts the process with "OMP: Error #15" (faiss #2555, pytorch #149201).
    KMP_DUPLICATE_LIB_OK=TRUE, set before faiss loads its copy, lets it through; faiss then
    runs on one thread there by default (faiss_threads = 0), so the two runtimes never run
    thread pools side by side, the case the duplicate's crashes were seen in. A user who sets
    the variable either way keeps their value. Linux wheels each bring a libgomp; two
    runtimes coexist there, and the thread counts below keep them from oversubscribing.
    """
    if sys.platform == "darwin":
        os.environ.setdefault("KMP_DUPLICATE_LIB_OK", "TRUE")
    import faiss  # deferred: faiss (and its libomp) loads here, after the line above, when a run mines

    return faiss


def coordinate_threads(faiss, requested: int) -> int:
    """Give faiss as many threads as torch has (torch and faiss take turns, never overlap),
    one on macOS, or what the preset asked for. Returns the count set."""
    import torch  # deferred: only for its thread count; the rest of this module needs numpy alone

    if requested:
        threads = requested
    elif sys.platform == "darwin":
        threads = 1
    else:
        threads = torch.get_num_threads()
    faiss.omp_set_num_threads(threads)
    return threads


@dataclass
class Index:
    """A search over the bank: exact (no index object) or an approximate faiss index."""

    kind: str            # flat | ivf | hnsw
    describe: str        # e.g. "ivf1414,probe16"
    build_s: float
    bank: np.ndarray     # [M, D] float32, normalised (a view of the workload's bank)
    index: Any | None = None   # a faiss index (faiss has no type stubs); None: exact search

    @property
    def exact(self) -> bool:
        return self.index is None

    def search(self, faiss, queries: np.ndarray, k: int) -> np.ndarray:
        """[Q, k] bank rows by descending inner product (-1 where an index found fewer)."""
        if self.index is None:
            return exact_search(faiss, queries, self.bank, k)
        _, rows = self.index.search(queries, k)
        return rows


def exact_search(faiss, queries: np.ndarray, bank: np.ndarray, k: int) -> np.ndarray:
    _, rows = faiss.knn(np.ascontiguousarray(queries, np.float32), bank, k,
                        metric=faiss.METRIC_INNER_PRODUCT)
    return rows


def choose(params, bank_size: int) -> str:
    if params.index != "auto":
        return params.index
    return "flat" if bank_size < params.exact_below else "ivf"


def build_index(faiss, params, bank: np.ndarray, seed: int) -> Index:
    """The mining index for this bank, as the params choose it, timed."""
    m, d = bank.shape
    kind = choose(params, m)
    started = time.perf_counter()
    if kind == "flat":
        return Index("flat", "flat", 0.0, bank)
    if kind == "ivf":
        lists = min(params.lists_for(m), m)
        quantizer = faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, lists, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = seed
        # k-means on a seeded sample: enough points per list for good centroids, far fewer
        # than the whole bank (training on all 500k costs minutes on a laptop's cores).
        take = min(m, lists * params.ivf_train)
        sample = bank if take == m else bank[np.sort(
            np.random.default_rng(seed).choice(m, take, replace=False))]
        index.train(sample)
        index.add(bank)
        index.nprobe = min(params.ivf_probe, lists)
        describe = f"ivf{lists},probe{index.nprobe}"
    elif kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
        index.add(bank)
        index.hnsw.efSearch = params.hnsw_ef
        describe = f"hnsw32,ef{params.hnsw_ef}"
    else:
        raise ValueError(f"unknown index kind {kind!r}")
    return Index(kind, describe, time.perf_counter() - started, bank, index)


def exclude_positive(rows: np.ndarray, targets: np.ndarray, k: int, bank_size: int,
                     rng: np.random.Generator) -> tuple[np.ndarray, int, int]:
    """The first k neighbours of each query that are not its positive (nor -1).

    `rows` holds k+1 neighbours per query, so dropping the positive still leaves k. Where an
    approximate index returned fewer usable rows, the gap is filled with random bank rows
    other than the positive. Returns (negatives [Q, k], queries whose positive was among the
    neighbours, negatives filled at random).
    """
    targets = targets.reshape(-1, 1)
    usable = (rows != targets) & (rows >= 0)
    # A stable sort on "not usable" moves usable rows to the front, in rank order.
    order = np.argsort(~usable, axis=1, kind="stable")[:, :k]
    negatives = np.take_along_axis(rows, order, axis=1)
    ok = np.take_along_axis(usable, order, axis=1)
    filled = int((~ok).sum())
    if filled:
        # Uniform over the bank without the positive: draw from M-1 rows, skip past it.
        draw = rng.integers(0, bank_size - 1, size=negatives.shape)
        draw += draw >= targets
        negatives = np.where(ok, negatives, draw)
    positive_found = int((rows == targets).any(axis=1).sum())
    return negatives.astype(np.int64), positive_found, filled


def recall_against_exact(faiss, index: Index, queries: np.ndarray, found: np.ndarray,
                         sample: int, k: int, rng: np.random.Generator) -> tuple[float | None, int]:
    """Mean share of the exact top-k that the index found, over a sample of the queries
    (1.0 for exact search; None when the sample is 0)."""
    if index.exact:
        return 1.0, 0
    n = min(sample, len(queries))
    if n == 0:
        return None, 0
    pick = np.sort(rng.choice(len(queries), n, replace=False))
    truth = exact_search(faiss, queries[pick], index.bank, k)
    hits = sum(len(np.intersect1d(a[a >= 0], t)) for a, t in zip(found[pick], truth))
    return hits / (n * k), n

"""Hard-negative mining: faiss (as the twotower workload mines) vs exhaustive torch search.

One mining pass: every training pair's query against the whole bank, top K+1 rows (K hard
negatives, plus one so that the positive can be dropped). The bank and the queries are the
twotower workload's synthetic corpus (note 000's 500k x 768 bank, 35,901 pairs); a query is
the corpus's noiseless next-chunk direction, what a trained query tower outputs. The
baseline is the obvious torch code: a matmul against the bank and topk, a block of queries
at a time. faiss builds the index once (the bank is fixed) and searches all queries.
Printed: each time, the ratios (search only, and build + search) and the approximate
index's recall of the exact top K+1. Target: >= 10x faster at >= 0.95 recall.

    python benchmarks/mining.py                                   # full size (minutes)
    python benchmarks/mining.py --bank 50000 --queries 5000      # a quick run
    python benchmarks/mining.py --probe 8 16 32                   # a recall/speed sweep
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from engine.workloads.twotower import Params, data, mining  # noqa: E402


def torch_exhaustive(queries: torch.Tensor, bank: torch.Tensor, k: int, block: int) -> torch.Tensor:
    out = []
    for start in range(0, len(queries), block):
        scores = queries[start:start + block] @ bank.T
        out.append(scores.topk(k, dim=1).indices)
    return torch.cat(out)


class Timer:
    """Wall time, and the process's CPU time: on a shared machine the CPU seconds show how
    much of the wall time was this process's own work."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu

    def __str__(self) -> str:
        return f"{self.wall:.2f} s (CPU {self.cpu:.1f} s)"


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    hits = sum(len(np.intersect1d(a[a >= 0], t)) for a, t in zip(found, truth))
    return hits / truth.size


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def main(argv: list[str] | None = None) -> int:
    defaults = Params()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bank", type=int, default=500_000, help="bank vectors M")
    ap.add_argument("--dim", type=int, default=768, help="vector size D")
    ap.add_argument("--queries", type=int, default=35_901, help="queries per mining pass")
    ap.add_argument("--negatives", type=int, default=64, help="K hard negatives (searches K+1)")
    ap.add_argument("--index", choices=("ivf", "hnsw"), default="ivf")
    ap.add_argument("--lists", type=int, default=0, help="IVF lists; 0 = the workload's default")
    ap.add_argument("--probe", type=int, nargs="+", default=[defaults.ivf_probe],
                    help="IVF nprobe values to time (the index is built once)")
    ap.add_argument("--train-per-list", type=int, default=defaults.ivf_train)
    ap.add_argument("--ef", type=int, nargs="+", default=[defaults.hnsw_ef], help="HNSW efSearch")
    ap.add_argument("--block", type=int, default=256, help="torch: queries per matmul")
    ap.add_argument("--threads", type=int, default=0, help="torch and faiss threads; 0 = torch's")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    faiss = mining.import_faiss()
    threads = mining.coordinate_threads(faiss, args.threads)
    k = args.negatives + 1
    print(f"machine: {platform.machine()} {platform.system()}, {torch.get_num_threads()} torch "
          f"threads, {threads} faiss threads; torch {torch.__version__}, faiss-cpu "
          f"{faiss.__version__}, numpy {np.__version__}; load average {_load()}")

    started = time.perf_counter()
    corpus, oracle = data.synthetic(bank=args.bank, dim=args.dim, context_len=8, article_len=32,
                                    pairs=args.queries, eval_pairs=0, seed=args.seed, oracle=True)
    bank_t = corpus.bank
    bank = bank_t.numpy()
    queries = np.ascontiguousarray(oracle.numpy())
    print(f"corpus: bank {args.bank:,} x {args.dim}, {args.queries:,} queries, top {k} "
          f"(generated in {time.perf_counter() - started:.1f} s)")

    with Timer() as exhaustive:
        truth = torch_exhaustive(oracle, bank_t, k, args.block).numpy()
    exhaustive_s = exhaustive.wall
    print(f"torch exhaustive (matmul + topk, {args.block} queries a block): {exhaustive}",
          flush=True)

    params = Params(bank=max(args.bank, 2), dim=args.dim, index=args.index,
                    ivf_lists=args.lists, ivf_train=args.train_per_list, eval_pairs=1, pairs=1,
                    context_len=1, article_len=2, eval_k=1)
    with Timer() as build:
        index = mining.build_index(faiss, params, bank, args.seed)
    print(f"faiss {index.describe.split(',')[0]} build: {build}", flush=True)

    settings = args.probe if args.index == "ivf" else args.ef
    rows = []
    for value in settings:
        if args.index == "ivf":
            index.index.nprobe = value
            label = f"nprobe {value}"
        else:
            index.index.hnsw.efSearch = value
            label = f"efSearch {value}"
        with Timer() as search:
            found = index.search(faiss, queries, k)
        search_s = search.wall
        r = recall(found, truth)
        rows.append((label, search_s, r))
        print(f"faiss {label}: search {search}, {exhaustive_s / search_s:.1f}x "
              f"(CPU {exhaustive.cpu / search.cpu:.1f}x; with the build "
              f"{exhaustive_s / (search_s + build.wall):.1f}x), recall@{k} vs exact {r:.4f}",
              flush=True)

    print(f"load average at the end {_load()} (other work on the machine slows both sides)")
    met = [(label, s, r) for label, s, r in rows if r >= 0.95 and exhaustive_s / s >= 10]
    print("target >= 10x at >= 0.95 recall (search): "
          + (f"met by {', '.join(label for label, _, _ in met)}" if met else "not met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile paid once: trm's first compiled step, the whole model against its repeated blocks
(engine.train.compiling), with a cold cache and a warm one.

Each measurement is a process of its own (a compile caches in memory too): it builds trm with
small params on the CPU, compiles it as engine.train.compiling does (whole: torch.compile of the
model; regional: each of the stack's blocks), and times its first training step (forward, loss,
backward: the compile happens in it) and its next (the compiled code's own speed). Cold: an empty
TORCHINDUCTOR_CACHE_DIR; warm: a second process given the first's, as an attempt after a crash
or a new run of the same model is (engine.run.launch.compile_caches).

    python benchmarks/compile.py                       # hidden 128, 2 layers, 2 x 2 cycles
    python benchmarks/compile.py --layers 4 --repeats 2

Prints a row per (mode, cache): the first step's seconds (the median of --repeats, each with a
cache of its own), the next step's, and what Dynamo captured (its graphs; regional compiles one
graph per grad mode, shared by every block).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one(mode: str, args: argparse.Namespace) -> dict:
    """In the measuring process: the first and the next step of trm compiled as `mode`."""
    import torch
    from torch._dynamo.utils import counters

    from engine import workloads
    from engine.train import compiling
    from engine.workloads.trm.params import Params

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    params = Params(hidden_size=args.hidden, L_layers=args.layers, num_heads=args.heads,
                    H_cycles=args.h_cycles, L_cycles=args.l_cycles, seq_len=args.seq_len,
                    corpus_bytes=200_000)
    workload = workloads.build("trm", params, 0)
    model = workload.build_model(grad_checkpointing=False)
    names = workload if mode == "regional" else None   # no blocks named: the whole model
    forward = compiling.compiled_forward(model, names, SimpleNamespace(compile=True))
    assert compiling.mode(forward) == mode, compiling.mode(forward)
    batch = workload.batch(torch.arange(args.batch), torch.device("cpu"))
    times = []
    for _ in range(2):
        started = time.perf_counter()
        workload.loss(forward, batch).backward()
        times.append(time.perf_counter() - started)
    return {"first_s": times[0], "next_s": times[1], "graphs": counters["stats"]["unique_graphs"],
            "fx_hits": counters["inductor"]["fxgraph_cache_hit"],
            "fx_misses": counters["inductor"]["fxgraph_cache_miss"],
            "parameters": sum(p.numel() for p in model.parameters())}


def spawn(mode: str, cache: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": cache + "/triton"}
    argv = [sys.executable, __file__, "--one", mode, *sys.argv[1:]]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--h-cycles", type=int, default=2)
    parser.add_argument("--l-cycles", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--one", choices=("model", "regional"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args)))
        return
    import torch

    print(f"trm on the CPU, torch {torch.__version__}: hidden {args.hidden}, {args.layers} layers, "
          f"{args.h_cycles} x {args.l_cycles} cycles, seq {args.seq_len}, batch {args.batch}, "
          f"{args.threads} thread(s), {os.cpu_count()} cores")
    rows = {}
    for mode in ("model", "regional"):
        cold, warm = [], []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="cockpit-compile-") as cache:
                cold.append(spawn(mode, cache, args))
                warm.append(spawn(mode, cache, args))   # a second process, the first's cache
        rows[mode] = {"cold": cold, "warm": warm}
    print(f"{'mode':<10}{'cache':<7}{'first step s':>14}{'next step s':>13}{'graphs':>8}"
          f"{'fx hits':>9}{'fx misses':>11}")
    for mode, by_cache in rows.items():
        for cache, runs in by_cache.items():
            print(f"{mode:<10}{cache:<7}{statistics.median(r['first_s'] for r in runs):>14.2f}"
                  f"{statistics.median(r['next_s'] for r in runs):>13.3f}{runs[0]['graphs']:>8}"
                  f"{runs[0]['fx_hits']:>9}{runs[0]['fx_misses']:>11}")
    first = {m: {c: statistics.median(r["first_s"] for r in runs) for c, runs in b.items()}
             for m, b in rows.items()}
    print(f"regional / whole, cold: {first['regional']['cold'] / first['model']['cold']:.2f}; "
          f"warm / cold: whole {first['model']['warm'] / first['model']['cold']:.2f}, "
          f"regional {first['regional']['warm'] / first['regional']['cold']:.2f}")


if __name__ == "__main__":
    main()

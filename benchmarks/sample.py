"""How much faster is `cockpit sample` with its cache? Target: >= 10x on trm-tiny.

Builds each shipped TRM preset's model (random weights: the time per byte depends on the shape,
not on what the weights learned) and continues --prompt by --tokens bytes two ways in turn, in
the same process:

- before: what `cockpit sample` did before the cache, the whole window through forward() for
  every byte (engine.workloads.trm.decoding.generate(cached=False)), on torch's thread count;
- now: what `cockpit sample` does, the workload's continue_model: one position per byte through
  the unrolled recursion (DecodeCache), on the faster of torch's thread count and one
  (FasterThreads, decided from its first bytes; the count it kept is printed).

The order alternates from round to round, so a machine that other work slows at times slows
both; medians of the rounds are printed, and their ratio. --threads 1,2 adds the cache alone:
both ways at each fixed thread count.

    python benchmarks/sample.py                                   # trm-tiny, 200 bytes, 3 rounds
    python benchmarks/sample.py --preset trm-chat-small --tokens 50
    python benchmarks/sample.py --threads 1,2

The uncached path's time per byte grows with the window (prompt + bytes so far), the cached
path's barely, so the ratio grows with --tokens: compare figures at the same --tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from engine import runconfig  # noqa: E402
from engine.workloads.trm.decoding import generate  # noqa: E402
from engine.workloads.trm.workload import TrmWorkload  # noqa: E402


def seconds_per_byte(model, prompt: str, tokens: int, context: int, cached: bool) -> float:
    start = time.perf_counter()
    out = generate(model, prompt.encode(), tokens=tokens, temperature=0.8, context=context,
                   seed=0, cached=cached)
    assert len(out) == tokens
    return (time.perf_counter() - start) / tokens


def as_sample_does(workload: TrmWorkload, model, prompt: str, tokens: int) -> tuple[float, int]:
    """Seconds per byte of cockpit sample's own path, and the thread count it kept."""
    kept = []
    start = time.perf_counter()
    workload.continue_model(model, prompt, tokens=tokens, temperature=0.8, seed=0,
                            on_text=lambda piece: kept.append(torch.get_num_threads()))
    return (time.perf_counter() - start) / tokens, kept[-1]


def thread_counts(text: str) -> list[int]:
    counts = [int(n) for n in text.split(",")] if text else [torch.get_num_threads()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected counts >= 1 like 1,2")
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", help="trm workload preset (repeatable; "
                                                      "default trm-tiny)")
    ap.add_argument("--tokens", type=int, default=200, help="bytes to write (cockpit sample's "
                                                            "default: 200)")
    ap.add_argument("--prompt", default="def ")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=thread_counts, default=[],
                    help="also time both ways at each of these thread counts (e.g. 1,2)")
    args = ap.parse_args()
    default = torch.get_num_threads()
    print(f"torch {torch.__version__}, {default} threads by default, {args.tokens} bytes after "
          f"{args.prompt!r}, {args.rounds} rounds")
    for name in args.preset or ["trm-tiny"]:
        params = runconfig.resolve(name, "cpu").workload.params
        torch.manual_seed(0)
        workload = TrmWorkload(params, seed=0)
        model = workload.build_model(grad_checkpointing=False).eval()
        size = sum(p.numel() for p in model.parameters())
        label = (f"{name} ({size / 1e6:.1f}M params, {params.forward_dtype}, "
                 f"window {params.seq_len})")
        as_sample_does(workload, model, args.prompt, 2)  # first-call costs
        before, now, kept = [], [], []
        fixed = {(n, cached): [] for n in args.threads for cached in (False, True)}
        for r in range(args.rounds):
            for first in ((True, False) if r % 2 == 0 else (False, True)):
                torch.set_num_threads(default)
                if first:
                    before.append(seconds_per_byte(model, args.prompt, args.tokens,
                                                   params.seq_len, cached=False))
                else:
                    took, threads = as_sample_does(workload, model, args.prompt, args.tokens)
                    now.append(took)
                    kept.append(threads)
            print(f"  {name} round {r + 1}: before {before[-1]:.4f} s/byte, now {now[-1]:.4f} "
                  f"s/byte ({kept[-1]} threads)", flush=True)
            for n in args.threads:
                torch.set_num_threads(n)
                for cached in ((False, True) if r % 2 == 0 else (True, False)):
                    fixed[n, cached].append(seconds_per_byte(model, args.prompt, args.tokens,
                                                             params.seq_len, cached))
                print(f"  {name} round {r + 1}, {n} threads: uncached "
                      f"{fixed[n, False][-1]:.4f} s/byte, cached {fixed[n, True][-1]:.4f} s/byte",
                      flush=True)
        old, new = statistics.median(before), statistics.median(now)
        print(f"{label}: before {old:.4f} s/byte, now {new:.4f} s/byte (medians; kept "
              f"{'/'.join(str(n) for n in kept)} threads), {old / new:.1f}x")
        for n in args.threads:
            old, new = statistics.median(fixed[n, False]), statistics.median(fixed[n, True])
            print(f"{label}, the cache alone on {n} threads: uncached {old:.4f} s/byte, cached "
                  f"{new:.4f} s/byte (medians), {old / new:.1f}x")
        torch.set_num_threads(default)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How much faster is `cockpit sample` with its cache? Target: >= 10x on trm-tiny.

Builds each shipped TRM preset's model (random weights: the time per byte depends on the shape,
not on what the weights learned) and continues --prompt by --tokens bytes, the way `cockpit
sample` does (engine.workloads.trm.model.generate, on the CPU), both ways in turn in the same
process: uncached (the whole window through forward() for every byte, what sample did before)
and cached (one position per byte through the unrolled recursion, DecodeCache). The order
alternates from round to round, so a machine that other work slows at times slows both;
medians of the rounds are printed, and the ratio of the medians.

    python benchmarks/sample.py                                   # trm-tiny, 200 bytes, 3 rounds
    python benchmarks/sample.py --preset trm-chat-small --tokens 20 --rounds 3
    python benchmarks/sample.py --threads 1

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
from engine.workloads.trm.model import Arch, RecursiveLM  # noqa: E402


def seconds_per_byte(model, prompt: bytes, tokens: int, context: int, cached: bool) -> float:
    start = time.perf_counter()
    out = generate(model, prompt, tokens=tokens, temperature=0.8, context=context, seed=0,
                   cached=cached)
    assert len(out) == tokens
    return (time.perf_counter() - start) / tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", action="append", help="trm workload preset (repeatable; "
                                                      "default trm-tiny)")
    ap.add_argument("--tokens", type=int, default=200, help="bytes to write (cockpit sample's "
                                                            "default: 200)")
    ap.add_argument("--prompt", default="def ")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{args.tokens} bytes after {args.prompt!r}, {args.rounds} rounds")
    for name in args.preset or ["trm-tiny"]:
        params = runconfig.resolve(name, "cpu").workload.params
        torch.manual_seed(0)
        model = RecursiveLM(Arch.of(params), positions=params.seq_len).eval()
        size = sum(p.numel() for p in model.parameters())
        prompt = args.prompt.encode()
        seconds_per_byte(model, prompt, 2, params.seq_len, cached=True)  # first-call costs
        times = {False: [], True: []}
        for r in range(args.rounds):
            for cached in ((False, True) if r % 2 == 0 else (True, False)):
                times[cached].append(seconds_per_byte(model, prompt, args.tokens, params.seq_len,
                                                      cached))
            print(f"  {name} round {r + 1}: uncached {times[False][-1]:.4f} s/byte, cached "
                  f"{times[True][-1]:.4f} s/byte", flush=True)
        old, new = statistics.median(times[False]), statistics.median(times[True])
        print(f"{name} ({size / 1e6:.1f}M params, {params.forward_dtype}, window "
              f"{params.seq_len}): uncached {old:.4f} s/byte, cached {new:.4f} s/byte "
              f"(medians), {old / new:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

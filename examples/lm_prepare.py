"""Write a token file for examples/lm_workload.py: train.bin and val.bin, flat uint16 token ids.

    python examples/lm_prepare.py                       # the Python standard library's sources
    python examples/lm_prepare.py input.txt --out DIR   # any text of yours (UTF-8 or not)

The tokens are the text's bytes (a vocabulary of 256), so it needs no tokenizer. The files are
what nanoGPT's data/*/prepare.py scripts write, `np.array(ids, dtype=np.uint16).tofile(path)`:
a file of GPT-2 BPE ids from those scripts trains the same way with params.vocab_size = 50304.
The last --val-fraction of the text is held out as val.bin.
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def stdlib_text(limit: int) -> bytes:
    """Up to `limit` bytes of the standard library's .py files, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        parts.append(data)
        size += len(data)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


def write(text: bytes, out: Path, val_fraction: float) -> tuple[int, int]:
    """train.bin and val.bin in `out`; (train tokens, val tokens)."""
    tokens = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    split = int(len(tokens) * (1 - val_fraction))
    out.mkdir(parents=True, exist_ok=True)
    tokens[:split].tofile(out / "train.bin")
    tokens[split:].tofile(out / "val.bin")
    return split, len(tokens) - split


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("text", nargs="*", type=Path, help="text files (default: the stdlib's sources)")
    parser.add_argument("--out", type=Path, default=HERE / "lm_data", help="where train.bin and val.bin go")
    parser.add_argument("--bytes", type=int, default=4_000_000, help="how much stdlib source to take")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    args = parser.parse_args(argv)
    if not 0 < args.val_fraction < 1:
        print(f"lm_prepare: --val-fraction: got {args.val_fraction}, expected a fraction above 0 "
              "and below 1", file=sys.stderr)
        return 2
    for path in args.text:
        if not path.is_file():
            print(f"lm_prepare: {path}: no such file; expected a text file to take tokens from",
                  file=sys.stderr)
            return 2
    text = b"".join(p.read_bytes() for p in args.text) if args.text else stdlib_text(args.bytes)
    if len(text) < 1024:
        print(f"lm_prepare: only {len(text)} bytes of text; expected at least 1024", file=sys.stderr)
        return 2
    train, val = write(text, args.out, args.val_fraction)
    print(f"wrote {args.out}/train.bin ({train:,} tokens) and val.bin ({val:,} tokens), vocab 256 (bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

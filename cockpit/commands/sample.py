"""`cockpit sample RUN --prompt TEXT [--tokens N] [--temperature T] [--seed S]`.

Prints the continuation alone on stdout (so a script can use it) and which checkpoint wrote
it on stderr. The generation itself is engine.train.sampling's.
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    q = sub.add_parser("sample", help="continue a prompt with a text run's latest checkpoint")
    q.add_argument("run", help="run id, a unique prefix of one, a path, or 'last'")
    q.add_argument("--prompt", required=True, help="the text to continue")
    q.add_argument("--tokens", type=int, default=200, metavar="N", help="bytes to write (default 200)")
    q.add_argument("--temperature", type=float, default=0.8, metavar="T",
                   help="0 = always the likeliest byte; higher = more varied (default 0.8)")
    q.add_argument("--seed", type=int, default=0, help="sampling seed, for repeatable output")
    q.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine.run.rundir import find_run
    from engine.train.sampling import continue_prompt

    found = find_run(args.run)
    out = continue_prompt(found, args.prompt, tokens=args.tokens, temperature=args.temperature,
                          seed=args.seed)
    print(f"run {found.id}, checkpoint {out.checkpoint.name} (step {out.step})", file=sys.stderr)
    print(out.text, flush=True)
    return 0

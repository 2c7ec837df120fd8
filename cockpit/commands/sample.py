"""`cockpit sample RUN --prompt TEXT [--tokens N] [--temperature T] [--seed S]`.

Prints the continuation alone on stdout (so a script can use it), as it is written, and which
checkpoint wrote it on stderr before it. The generation itself is engine.train.sampling's.
"""

from __future__ import annotations

import argparse
import math
import sys

from engine.record.rundir import find_run


def _tokens(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected a positive whole number of "
                                         "bytes (e.g. 200)")
    return value


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected a finite number >= 0 "
                                         "(0 = always the likeliest byte)")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    # torch's generator takes 64 bits, signed or not; past them it raises only once the
    # checkpoint is loaded, with a traceback
    if value is None or not -2**63 <= value < 2**64:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected a whole number of at most "
                                         "64 bits (e.g. 0)")
    return value


def add_parser(sub) -> None:
    q = sub.add_parser("sample", help="continue a prompt with a text run's latest checkpoint")
    q.add_argument("run", help="run id, a unique prefix or end of one, a path, or 'last'")
    q.add_argument("--prompt", required=True, help="the text to continue")
    q.add_argument("--tokens", type=_tokens, default=200, metavar="N",
                   help="bytes to write (default 200)")
    q.add_argument("--temperature", type=_temperature, default=0.8, metavar="T",
                   help="0 = always the likeliest byte; higher = more varied (default 0.8)")
    q.add_argument("--seed", type=_seed, default=0, help="sampling seed, for repeatable output")
    q.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from engine.train.sampling import continue_prompt  # torch loads only when sampling: --help stays quick

    found = find_run(args.run)
    began = False

    def started(checkpoint, step: int) -> None:
        nonlocal began
        print(f"run {found.id}, checkpoint {checkpoint.name} (step {step})", file=sys.stderr,
              flush=True)
        began = True

    def written(piece: str) -> None:
        # As it comes: a larger model writes a few bytes a second on a CPU.
        sys.stdout.write(piece)
        sys.stdout.flush()

    try:
        continue_prompt(found, args.prompt, tokens=args.tokens, temperature=args.temperature,
                        seed=args.seed, on_start=started, on_text=written)
    finally:
        if began:
            print(flush=True)  # the text's line ends, also when Ctrl-C cuts it short
    return 0

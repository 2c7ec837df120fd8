"""A training script with one corrupted batch, for tests/test_rewind.py: a command that checkpoints,
resumes from `--resume FILE` and skips `--skip N` batches of its data (cockpit's {skip_batches}).

    python bad_batch.py --out DIR [--resume FILE] [--skip N] [--bad-index I] [--total T]

Step s trains data index s - 1 + N (its data loader's position after a resume is its step, plus
what it is told to skip); the batch at --bad-index is corrupted: its loss fifty times the
usual. Each step is reported with cockpit.report.step and each tenth step checkpointed to
DIR/ckpt-STEP.json (cockpit.report.checkpoint); every data index trained is appended to
DIR/trained.txt, the script's own truth of what it saw. An attempt that trained the bad batch
does not end by itself at its last step: it waits there (up to 120 s) to be ended, as a long run
would still be training when its supervisor acted. Stdlib only, but for cockpit.report.
"""

import argparse
import json
import math
import os
import time

from cockpit import report


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--resume")
    parser.add_argument("--skip", type=int, default=0)
    parser.add_argument("--bad-index", type=int, default=60)
    parser.add_argument("--total", type=int, default=120)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    step = json.load(open(args.resume))["step"] if args.resume else 0
    print(f"starting at step {step}, data index {step + args.skip} (skip {args.skip})", flush=True)
    trained_bad = False
    with open(os.path.join(args.out, "trained.txt"), "a", buffering=1) as trained:
        while step < args.total:
            step += 1
            index = step - 1 + args.skip
            trained.write(f"{index}\n")
            # a slowly falling loss with a little wobble, and the corrupted batch's
            loss = 1.0 / math.sqrt(step) + 0.01 * math.sin(7.0 * index)
            if index == args.bad_index:
                loss, trained_bad = loss * 50, True
            report.step(step, total=args.total, loss=loss)
            if step % 10 == 0:
                path = os.path.join(args.out, f"ckpt-{step}.json")
                with open(path, "w") as f:
                    json.dump({"step": step}, f)
                report.checkpoint(path, step)
            time.sleep(0.05)   # a second of its output is one report: 20 steps
    if trained_bad:
        time.sleep(120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""train.py's training with cockpit.report: the few lines a script adds to report exactly.

Under cockpit the calls marked "report" write to the run's record; anywhere else they do
nothing, so this runs standalone just like train.py (same arguments):

    python examples/command/train_reported.py --steps 300 --out /tmp/run
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from cockpit import report
# train.py's pieces, unchanged (this file's directory is on sys.path when run as a script)
from train import evaluate, parse_args, save_checkpoint, setup, train_step

REPORT_EVERY = 10  # .item() waits for the device: report at the logging interval, not every step


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    device, (x, y, x_val, y_val), model, optimizer, gen, start = setup(args)

    step, loss = start, None
    try:
        for i in range(start, args.steps):
            loss = train_step(model, optimizer, x, y, args.bs, args.accum, gen, device)
            step = i + 1  # optimizer steps completed
            report.reached(step, samples=step * args.bs * args.accum)  # report: a crash is told at it
            if step % REPORT_EVERY == 0 or step == args.steps:
                # samples: this attempt's batch times the steps, so the rate and the ETA
                # stay right after a resume with another --bs (cockpit measures differences)
                report.step(step, total=args.steps, loss=loss.item(),  # report
                            samples=step * args.bs * args.accum, lr=optimizer.param_groups[0]["lr"])
            if step % args.ckpt_every == 0 or step == args.steps:
                path = save_checkpoint(out, step, model, optimizer, gen)
                report.checkpoint(path, step)  # report: cockpit resumes from the newest
            if args.step_delay:
                time.sleep(args.step_delay)
    except KeyboardInterrupt:
        report.checkpoint(save_checkpoint(out, step, model, optimizer, gen), step)  # report
        return 130
    val_loss = evaluate(model, x_val, y_val, device)
    report.eval(val_loss=val_loss)  # report: held-out metrics at the last step
    print(f"step {step}: val_loss {val_loss:.4f}")
    trained = "" if loss is None else f" loss {loss.item():.4f}"  # None: resumed at the end
    print(f"done: step {step}{trained}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

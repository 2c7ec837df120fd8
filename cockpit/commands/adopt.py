"""`cockpit adopt PID [--log FILE] [--name N]`: make a run of a process cockpit did not start
(engine.run.launchers.adopted), headless in the foreground like `cockpit run`, or detached."""

from __future__ import annotations

import argparse
import sys

from cockpit.commands import train
from engine import command, settings
from engine.run import adoption as adoptions
from engine.run.launchers import adopted

EPILOG = """\
It is followed, never signalled: its memory and CPU are sampled over its process tree, its log
(--log, else the file its stdout or stderr writes to, on Linux) is read for progress as a
command's output is, from the start of the file, so the steps so far show. When it ends the run
says how, from its log: a traceback or an out-of-memory message is a crash; anything else
"ended" (its exit status is its parent's to read, not cockpit's).
`cockpit runs stop RUN` stops it (SIGINT, then SIGTERM and SIGKILL after their grace); Ctrl-C
here only stops following it. Once it has ended, `cockpit runs resume RUN` starts its command
again under cockpit, in its working directory and environment, with --resume-args appended.

examples:
  nohup python train.py > train.log 2>&1 &
  cockpit adopt $!                                  follow it here until it ends
  cockpit adopt $(pgrep -f train.py) --detach       follow it in the background
  cockpit adopt 4242 --log ~/runs/train.log --set command.total_steps=20000
  cockpit runs resume last --resume-args '--resume-from ckpt/last.pt'
"""


def add_parser(sub, add_output_arguments) -> None:
    """`add_output_arguments`: cockpit.cli's, the one definition of how a headless run talks."""
    q = sub.add_parser("adopt", help="make a run of a training process cockpit did not start",
                       description="Follow a running process that cockpit did not start as a run: "
                                   "progress from its log, memory and CPU over its process tree, "
                                   "alerts when it ends; resumable under cockpit once it has ended.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("pid", type=_pid, metavar="PID", help="the process to follow")
    q.add_argument("--log", metavar="FILE", help="the file it writes its output to (default: its "
                                                 "stdout's or stderr's file, where that is one; "
                                                 "needed on macOS)")
    q.add_argument("--name", metavar="N", help="the run's workload name (default: the script's name)")
    q.add_argument("--set", action="append", default=[], metavar="command.KEY=VALUE",
                   help="how to read it: command.total_steps, progress_regex, samples_per_step, "
                        "tokens_per_step, main_metric, stop_grace_s (repeatable)")
    q.add_argument("--json", action="store_true", help="print every event as a JSON line")
    q.add_argument("--detach", action="store_true", help="follow it in the background, print the run id")
    add_output_arguments(q)
    q.set_defaults(handler=adopt)


def _pid(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected a process id (a number)") from None


def adopt(args: argparse.Namespace) -> int:
    settings.load()   # a broken settings.toml is bad input, said before anything is written
    adoption = adoptions.inspect(args.pid, args.log)
    run = adoptions.create(adoption, args.name, args.set)
    if not args.json:
        said = sys.stderr if args.detach else sys.stdout
        print(f"adopted pid {adoption.pid}: {command.display(adoption.argv)}", file=said)
        print(f"  in {adoption.cwd}; its argv, directory and {len(adoption.env)} environment "
              "variables are recorded for a resume", file=said)
        print(f"  progress from {adoption.log_source}" if adoption.logs else f"  {adoption.no_log}",
              file=said)
        if not args.detach:
            print("  Ctrl-C stops following it (it runs on); cockpit runs stop stops it", file=said,
                  flush=True)
    return train.supervise(run, args, launcher=adopted.AdoptedLauncher,
                           start_detached=adopted.start_detached)

"""The `cockpit` command: bare it opens the TUI; `--no-ui` trains headless; subcommands
`presets` and `runs` inspect what there is. Kept light: torch loads only when training."""

from __future__ import annotations

import argparse
import os
import sys

from cockpit.commands import adopt as adopt_cmd, check as check_cmd, compare as compare_cmd, log as log_cmd
from cockpit.commands import presets as presets_cmd, probe as probe_cmd, runs as runs_cmd
from cockpit.commands import sample as sample_cmd, submit as submit_cmd, train
from engine import __version__
from engine.errors import ConfigError
from engine.vocabulary import FAULT_KINDS, REPORTED_KINDS, SIGNAL_KINDS

EXIT_BAD_INPUT = 2

EPILOG = """\
examples:
  cockpit --no-ui                                   default workload on the best local device
  cockpit --no-ui --workload matmul --device cpu --set batch_size=64 --set train.epochs=2
  cockpit --no-ui --detach                          start, print the run id, leave it running
  cockpit --no-ui --device mps --inject native-crash@117   rehearse a crash and its fallback
  cockpit run -d mps -- python train.py --bs {batch_size} --device {device}   your own script
  cockpit --no-ui --notify-command 'curl -s -H "Title: $COCKPIT_ALERT_TITLE" -d "$COCKPIT_ALERT_MESSAGE" ntfy.sh/TOPIC'
                                                    alerts to your phone (the alert as JSON on stdin too)
  cockpit runs follow last                          watch a detached run
  cockpit runs log last --traceback                 the crashed attempt's traceback, whole
  cockpit runs resume last                          continue a stopped, failed or interrupted run
  cockpit adopt 4242 --log train.log                follow a training process cockpit did not start
  cockpit --no-ui -d two-hosts --node a --run-id r1   a machine of a run on several
  cockpit submit -w trm-tiny -d cuda --time 2:00:00 a SLURM job that survives its limit and preemption
  cockpit presets list
  cockpit probe -w trm-tiny                         which device (and CPU thread count) is fastest here
  cockpit probe -w clip-m1 -d mps --find-batch --save mps-clip   largest batch that keeps memory calm
  cockpit check -w trm-tiny -d mps                  does the device compute the right numbers?
  cockpit sample last --prompt "def "               continue a prompt with a trm run's checkpoint

exit codes: 0 finished, 1 failed, 2 bad input, 130 interrupted or stopped
"""


def _seconds(text: str) -> float:
    """--log-every: seconds, a positive finite number."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"got {text!r}, expected seconds > 0 (e.g. 30)")
    return value


def _either(kinds) -> str:
    """'a, b or c': the fault kinds as the help says them (engine.vocabulary holds them)."""
    return ", ".join(kinds[:-1]) + " or " + kinds[-1]


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """How a headless run talks: log lines and alerts (cockpit --no-ui, run, runs resume)."""
    parser.add_argument("--log-every", type=_seconds, default=30.0, metavar="S",
                        help="not on a terminal: a progress line every S seconds of the run, "
                             "plus every event (default: 30)")
    parser.add_argument("--notify-command", metavar="CMD",
                        help="run CMD through the shell with each alert (crash, fallback, finish, "
                             "failure, slowdown, hang, health) as JSON on stdin, instead of settings.toml's "
                             "notify_command; '' for none")


class _Parser(argparse.ArgumentParser):
    """argparse, but bad input is one line and exit 2, like every other bad input here."""

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cockpit", description="A terminal cockpit for PyTorch training.",
                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"cockpit {__version__}")
    parser.add_argument("--no-ui", action="store_true", help="train headless instead of opening the TUI")
    parser.add_argument("--workload", "-w", default="matmul", metavar="W",
                        help="workload preset (default: matmul)")
    parser.add_argument("--device", "-d", default="auto", metavar="D",
                        help="device preset (default: auto: CUDA, then MPS, then CPU)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting: batch_size=16, train.epochs=2, params.n=128 (repeatable)")
    parser.add_argument("--inject", action="append", default=[], metavar="KIND@STEP",
                        help="make the trainer fail for real, to try the fallback rules: "
                             f"{_either(FAULT_KINDS)}, at the start of an optimizer step "
                             "(native-crash@117) or a time after the attempt starts (hang@30s, "
                             "oom@1.5s); once per run, whatever preset, or with + in every attempt "
                             "(oom@120+); repeatable")
    parser.add_argument("--json", action="store_true", help="print every event as a JSON line")
    parser.add_argument("--detach", action="store_true",
                        help="start the run in the background, print its id and return")
    parser.add_argument("--node", metavar="NAME",
                        help="this machine's name in a run on several (a device preset with nnodes "
                             "above 1): run the same command, with the same --run-id, on each")
    parser.add_argument("--run-id", metavar="ID",
                        help="with --node: the run every machine joins (the same on each)")
    add_output_arguments(parser)
    parser.add_argument("--runs-dir", metavar="DIR", help="where runs live (default: COCKPIT_RUNS_DIR "
                                                          "or the user data dir)")
    sub = parser.add_subparsers(dest="command", metavar="{run,adopt,submit,presets,runs,probe,check,sample}", parser_class=_Parser)

    p = sub.add_parser("presets", help="list, show and locate presets")
    psub = p.add_subparsers(dest="action", required=True, parser_class=_Parser)
    q = psub.add_parser("list", help="workload and device presets, shipped and yours")
    q.add_argument("--json", action="store_true")
    q.set_defaults(handler=presets_cmd.list_)
    q = psub.add_parser("show", help="a preset, validated, as TOML")
    q.add_argument("name")
    q.add_argument("--kind", choices=("workloads", "devices"))
    q.set_defaults(handler=presets_cmd.show)
    q = psub.add_parser("path", help="where presets and runs are kept")
    q.set_defaults(handler=presets_cmd.path)

    r = sub.add_parser("runs", help="list, show, follow, log, stop, resume and compare runs")
    rsub = r.add_subparsers(dest="action", required=True, parser_class=_Parser)
    q = rsub.add_parser("list", help="runs, newest first")
    q.add_argument("--json", action="store_true")
    q.set_defaults(handler=runs_cmd.list_)
    for name, handler, text in (("show", runs_cmd.show, "one run's summary"),
                                ("follow", runs_cmd.follow, "print a run's events until it ends"),
                                ("stop", runs_cmd.stop, "stop a running run gracefully")):
        q = rsub.add_parser(name, help=text)
        q.add_argument("run", help="run id, a unique prefix or end of one, a path, or 'last'")
        if name != "stop":
            q.add_argument("--json", action="store_true")
        q.set_defaults(handler=handler)
    q = rsub.add_parser("resume", help="continue a stopped, failed or interrupted run from its "
                                       "newest checkpoint")
    q.add_argument("run", help="run id, a unique prefix or end of one, a path, or 'last'")
    q.add_argument("--device", "-d", metavar="PRESET",
                   help="continue on this device preset (default: the one the last attempt ran on)")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="change a device.*, train.* or command.* setting for the rest of the run")
    q.add_argument("--resume-args", metavar="ARGS",
                   help="an adopted run (cockpit adopt): these arguments (one string, split as a "
                        "shell would) appended to the command it was adopted with, e.g. "
                        "'--resume-from ckpt/last.pt'")
    q.add_argument("--json", action="store_true", help="print every event as a JSON line")
    q.add_argument("--detach", action="store_true", help="continue in the background")
    add_output_arguments(q)
    q.set_defaults(handler=runs_cmd.resume)
    compare_cmd.add_parser(rsub)
    log_cmd.add_parser(rsub)
    _add_run_parser(sub)
    adopt_cmd.add_parser(sub, add_output_arguments)
    submit_cmd.add_parser(sub)
    probe_cmd.add_parser(sub)
    check_cmd.add_parser(sub)
    sample_cmd.add_parser(sub)
    return parser


RUN_EPILOG = """\
placeholders, filled from the device preset for each attempt:
  {device} {batch_size} {accumulation} {effective_batch} {precision} {threads}
  {run_dir} {attempt}; after a health rule's rewind, {skip_batches} {data_offset}
  {lr_scale} (0, 0 and 1 until one); in command.resume also {checkpoint} {steps_left}

examples:
  cockpit run -- python train.py
  cockpit run -d mps -- python train.py --bs {batch_size} --device {device} --out {run_dir}/out
  cockpit run -d mps --set 'command.resume=["--resume", "{checkpoint}"]' \\
      --set 'command.checkpoints={run_dir}/out/*.pt' -- python train.py --out {run_dir}/out
  cockpit run --save retriever -- python train.py --bs {batch_size}   write a workload preset
"""


def _add_run_parser(sub) -> None:
    q = sub.add_parser("run", help="supervise your own training command: cockpit run -- python train.py ...",
                       description="Run your own training command under cockpit's supervisor, headless, "
                                   "exactly like cockpit --no-ui: progress read from its output, crash "
                                   "classification, memory sampling and the device preset's fallback ladder.",
                       epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("--device", "-d", default="auto", metavar="PRESET",
                   help="device preset (default: auto); fills the placeholders and gives the ladder")
    q.add_argument("--name", metavar="N", help="the run's workload name (default: the script's name)")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override device.KEY or command.KEY (cwd, resume, checkpoints, progress, "
                        "progress_regex, total_steps, stop_grace_s); repeatable")
    q.add_argument("--inject", action="append", default=[], metavar="KIND@STEP",
                   help="a real fault at a step the supervisor reads or the script reports "
                        "(native-crash@117), or a time after the attempt starts (hang@30s): "
                        f"{', '.join(SIGNAL_KINDS)} (signals from the supervisor); "
                        f"{', '.join(REPORTED_KINDS)} (raised by cockpit.report.step in the script); "
                        "once per run, or with + in every attempt")
    q.add_argument("--json", action="store_true", help="print every event as a JSON line")
    q.add_argument("--detach", action="store_true", help="start in the background, print the run id")
    add_output_arguments(q)
    q.add_argument("--save", metavar="NAME", help="write the command as workload preset NAME "
                                                  "instead of running it")
    q.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                   help="the command and its arguments, after --")
    q.set_defaults(handler=train.run_command)


def _open_tui() -> int:
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("cockpit: the TUI needs a terminal; use cockpit --no-ui (see cockpit --help)", file=sys.stderr)
        return EXIT_BAD_INPUT
    from cockpit.app import make_app  # Textual loads only when the TUI opens: --help stays quick

    app = make_app()
    app.run()
    # Textual prints an unhandled error's traceback and sets a non-zero return code: a script
    # (or a user's `&&`) must see that the cockpit died, not a clean exit
    return app.return_code or 0


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, where it is caught, not at exit
    except BrokenPipeError:
        # The reader went away (`cockpit presets list | head -1`): end quietly, the way
        # Python's docs say: stdout to devnull so the flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if args.runs_dir:
        os.environ["COCKPIT_RUNS_DIR"] = os.path.abspath(args.runs_dir)  # children see it too
    try:
        if args.command:
            return args.handler(args)
        if args.no_ui:
            return train.run(args)
        return _open_tui()
    except ConfigError as e:
        print(f"cockpit: {e.line()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130

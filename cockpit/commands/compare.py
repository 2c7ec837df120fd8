"""`cockpit runs compare RUN RUN...`: runs side by side, headless -- each run's results (final
loss and metrics, average throughput, duration) and only the settings in which they differ,
the same table as the runs screen's comparison (cockpit.comparison), with the loss at a few
steps all of them reached in place of the plots; `--json --curves` gives the curves whole."""

from __future__ import annotations

import argparse
import json

from cockpit.comparison import as_json, compared, loss_rows, table
from engine.errors import ConfigError
from engine.record.digest import RunDigest
from engine.record.rundir import find_run


def add_parser(runs_sub) -> None:
    q = runs_sub.add_parser("compare", help="runs side by side: results and the settings that differ")
    q.add_argument("runs", nargs="+", metavar="RUN",
                   help="two or more: run ids, unique prefixes of ids, paths, or 'last'")
    q.add_argument("--json", action="store_true", help="each run's results and differing settings as JSON")
    q.add_argument("--curves", action="store_true",
                   help="with --json: each run's loss and eval curves (step, samples, seconds, value)")
    q.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.curves and not args.json:
        raise ConfigError("runs compare", "--curves",
                          "goes with --json (the table shows the loss at a few steps)")
    runs = [find_run(ref) for ref in args.runs]
    if len({r.path for r in runs}) < 2:
        raise ConfigError("runs compare", None, "needs two or more different runs")
    digests = [RunDigest(r, curves=True) for r in runs]
    for d in digests:
        d.refresh()
        if d.summarized.error:
            raise ConfigError(f"run {d.run.id}", None, f"is broken, nothing to compare: {d.summarized.error}")
    shown = [compared(d) for d in digests]
    if args.json:
        print(json.dumps(as_json(shown, with_curves=args.curves), indent=2))
        return 0
    print(render(shown))
    return 0


def render(shown) -> str:
    """The table as text: a column per run, headed A, B, ... with each letter's run id below."""
    rows = table(shown)
    losses = loss_rows(shown)
    if losses:   # the curves in a few numbers, after the final loss and metrics
        at = next(i for i, r in enumerate(rows) if r.name == "final loss") + 1
        rows[at:at] = losses
    headers = [chr(ord("A") + i % 26) for i in range(len(shown))]
    names = max(len(r.name) + (3 if r.heading else 0) for r in rows)
    widths = [max(len(h), *(len(r.cells[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  ".join([" " * names, *(h.ljust(w) for h, w in zip(headers, widths))]).rstrip()]
    for r in rows:
        name = f"-- {r.name}" if r.heading else r.name
        lines.append("  ".join([name.ljust(names), *(c.ljust(w) for c, w in zip(r.cells, widths))]).rstrip())
    return "\n".join(lines)

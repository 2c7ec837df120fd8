"""Comparing runs, for both front ends (the runs screen's `c` and `cockpit runs compare`): each
run's results beside the settings in which the runs differ. No Textual here.
"""

from __future__ import annotations

import bisect
import dataclasses

from cockpit.present.words import average_rate, badput_parts, duration
from engine.errors import ConfigError
from engine.numbers import count, metric, rate
from engine.files import read_toml
from engine.record.curves import RunCurves
from engine.record.digest import RunDigest
from engine.record.metrics import shown_metrics
from engine.record.rundir import RunDir, RunSummary
from engine.record.stats import Averages

# Settings that name or describe rather than decide how the run trains: never a difference
# worth a row (overrides are already in the values they set).
_NOT_SETTINGS = ("description", "overrides")


@dataclasses.dataclass(frozen=True)
class Compared:
    """One run as a comparison shows it."""

    run: RunDir
    summary: RunSummary
    averages: Averages
    curves: RunCurves | None
    settings: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Row:
    name: str
    cells: list[str]         # one per run
    heading: bool = False    # a section's title; its cells are empty


def compared(digest: RunDigest) -> Compared:
    """The digest's run as of its last refresh()."""
    return Compared(run=digest.run, summary=digest.summarized, averages=digest.averages,
                    curves=digest.curves, settings=settings(digest.run))


def devices(s: RunSummary) -> str:
    """The presets the run went through, each with the device it resolved to: auto(cpu)→cpu."""
    parts: list[str] = []
    for a in s.attempts:
        part = a.preset if a.device in ("?", a.preset, None) else f"{a.preset}({a.device})"
        if not parts or parts[-1] != part:
            parts.append(part)
    return "→".join(parts) or s.device_preset


def settings(run: RunDir) -> dict[str, str]:
    """The run's configuration flattened to 'params.n' -> '512': the workload preset's params
    and train settings, the starting device preset's; the fallback ladder left out (its
    presets show in the devices the run went through)."""
    try:
        table = run.config().to_table()   # defaults filled in: an older run.toml compares alike
    except ConfigError:
        try:
            table = read_toml(run.config_path)
        except ConfigError:
            return {}
    table.pop("ladder", None)
    flat: dict[str, str] = {}
    _flatten(table, "", flat)
    return flat


def _flatten(table: dict, prefix: str, into: dict[str, str]) -> None:
    for key, value in table.items():
        if key in _NOT_SETTINGS:
            continue
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key != "env":
            # 'workload.params.n' reads as 'params.n', which is how --set names it.
            _flatten(value, "" if name == "workload" else f"{name}.", into)
        else:
            into[name] = _text(value)


def _text(value) -> str:
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "-"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value) or "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def differing(runs: list[Compared]) -> list[str]:
    """The settings whose values are not the same in every run, in the order they come."""
    keys = list(dict.fromkeys(k for r in runs for k in r.settings))
    return [k for k in keys if len({r.settings.get(k) for r in runs}) > 1]


def metrics(runs: list[Compared]) -> list[str]:
    """Every eval metric any of the runs reported, losses first, timings (eval_runtime, ..._per_second)
    left out (engine.record.metrics.shown_metrics)."""
    names = (m for r in runs for m in (r.curves.evals if r.curves is not None else r.averages.final_metrics))
    return list(shown_metrics(dict.fromkeys(names)))


def table(runs: list[Compared]) -> list[Row]:
    """What matters most first (at 80x24 the screen shows about nine rows before it scrolls):
    how each run ended, its final loss and metrics, speed and time; then only the settings
    that differ; then the rest of the run."""

    def each(f) -> list[str]:
        return [f(r) for r in runs]

    rows = [Row("status", each(lambda r: r.summary.status)),
            Row("final loss", each(lambda r: metric(r.averages.final_loss)))]
    rows += [Row(m, each(lambda r, m=m: metric(r.averages.final_metrics.get(m)))) for m in metrics(runs)]
    # samples/s, or steps/s where a command's samples per step are not known (never a guessed count)
    rows.append(Row("samples/s avg", each(lambda r: average_rate(r.averages, steps="steps/s"))))
    if any(r.averages.tokens_per_s for r in runs):   # only where tokens per step are known
        rows.append(Row("tokens/s avg", each(lambda r: rate(r.averages.tokens_per_s))))
    if any(r.averages.gflop_s for r in runs):   # only workloads that count their FLOPs say it
        rows.append(Row("GFLOP/s avg", each(lambda r: rate(r.averages.gflop_s))))
    rows.append(Row("duration", each(lambda r: duration(r.summary.duration_s))))
    differ = differing(runs)
    if differ:
        rows.append(Row(count(len(differ), "setting") + (" differs" if len(differ) == 1 else " differ"),
                        ["" for _ in runs], heading=True))
        rows += [Row(key, each(lambda r, key=key: r.settings.get(key, "-"))) for key in differ]
    else:
        rows.append(Row("settings", ["all the same" for _ in runs]))
    rows.append(Row("run", ["" for _ in runs], heading=True))
    rows += [
        Row("ran on", each(lambda r: devices(r.summary))),
        Row("steps", each(lambda r: f"{r.summary.step}/{r.summary.total_steps}" if r.summary.step else "no steps")),
        Row("steps lost", each(lambda r: str(r.averages.steps_lost))),
        Row("goodput", each(lambda r: goodput_cell(r.summary.goodput))),
        Row("steps/s avg", each(lambda r: rate(r.averages.steps_per_s))),
        Row("training", each(lambda r: duration(r.averages.train_s) if r.averages.train_s else "-")),
        Row("id", each(lambda r: r.run.id)),
    ]
    return rows


def loss_rows(runs: list[Compared], points: int = 4) -> list[Row]:
    """The loss of each run at a few steps spread over the steps all of them reached: the
    curves in a few numbers, for a terminal that cannot plot them. Steps every run reported
    ('@'), where there are such; else each run's loss interpolated between the windows it
    reported around the step ('~'): a run reports at the end of its windows, and the newest
    window before a step is another step's loss."""
    curves = [r.curves for r in runs if r.curves is not None and r.curves.loss]
    if len(curves) < 2:
        return []
    common = min(c.loss.steps[-1] for c in curves)
    shared = sorted(set.intersection(*(set(c.loss.steps) for c in curves)))
    if len(shared) >= points:
        steps = [shared[round((len(shared) - 1) * (i + 1) / points)] for i in range(points)]
        return [Row(f"loss @ step {s}", [metric(_at(r.curves, s)) for r in runs])
                for s in sorted(set(steps))]
    steps = sorted({max(1, round(common * (i + 1) / points)) for i in range(points)})
    return [Row(f"loss ~ step {s}", [metric(_at(r.curves, s)) for r in runs]) for s in steps]


def _at(curves: RunCurves | None, step: int) -> float | None:
    """The loss at `step`, interpolated between the reported windows around it."""
    if curves is None or not curves.loss.steps:
        return None
    xs, ys = curves.loss.steps, curves.loss.values
    i = bisect.bisect_left(xs, step)
    if i < len(xs) and xs[i] == step:
        return ys[i]
    if i == 0 or i == len(xs):
        return None if i == 0 else ys[-1] if xs[-1] >= step else None
    left, right = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (step - left) / (right - left)


def as_json(runs: list[Compared], with_curves: bool = False) -> list[dict]:
    """Each run's results and the settings that differ, for scripts."""
    differ = differing(runs)
    return [{"id": r.run.id, "status": r.summary.status, "final_loss": r.averages.final_loss,
             "final_metrics": r.averages.final_metrics, "samples_per_s": r.averages.samples_per_s,
             "tokens_per_s": r.averages.tokens_per_s, "units": r.averages.units,
             "total_source": r.averages.total_source,
             "steps_per_s": r.averages.steps_per_s, "gflop_s": r.averages.gflop_s, "duration_s": r.summary.duration_s,
             "train_s": r.averages.train_s, "steps": r.summary.step, "total_steps": r.summary.total_steps,
             "steps_lost": r.averages.steps_lost, "goodput": r.summary.goodput, "ran_on": devices(r.summary),
             "settings": {k: r.settings.get(k) for k in differ},
             **({"curves": _curves_json(r.curves)} if with_curves else {})} for r in runs]


def _curves_json(curves: RunCurves | None) -> dict:
    """Each curve as parallel lists: step, samples (null where not known), seconds since the
    run started, value."""
    if curves is None:
        return {}

    def one(c) -> dict:
        return {"step": c.steps, "samples": c.samples, "seconds": c.seconds, "value": c.values}

    return {"loss": one(curves.loss), "evals": {name: one(c) for name, c in curves.evals.items()}}


def goodput_cell(g: dict | None) -> str:
    """'72% (start-up 14 s)': the run's goodput and where most of the rest went."""
    if not g or g.get("goodput") is None:
        return "-"
    parts = badput_parts(g, detail=False)   # a table's cell: the bucket, not its parts
    return f"{g['goodput']:.0%}" + (f" ({parts[0]})" if parts and not parts[0].startswith("not known") else "")

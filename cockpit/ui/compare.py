"""Comparing runs: their loss and eval curves laid over each other (x in steps, samples or
time), and a table of each run's results beside the settings in which they differ.

Each run is a digest (engine.run.digest) with its curves: read once, and while one of them is
still running, followed every REFRESH_S by reading only what it appended.
"""

from __future__ import annotations

import dataclasses

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from cockpit.headless import duration
from cockpit.ui.runs import STATUS_STYLE, devices
from cockpit.ui.widgets.overlay import OverlayPlot
from engine.errors import ConfigError
from engine.numbers import rate
from engine.presets import read_toml
from engine.run.curves import AXES, Curve, RunCurves
from engine.run.digest import RunDigest
from engine.run.rundir import RunDir, RunSummary
from engine.run.stats import Averages

REFRESH_S = 5.0
# One colour per run; none of them red, the crash colour everywhere else.
COLOURS = ("cyan", "magenta", "yellow", "green", "dodger_blue1", "orange1", "white", "medium_purple1")
AXIS_NAME = {"step": "steps", "samples": "samples", "seconds": "time"}
# Settings that name or describe rather than decide how the run trains: never a difference
# worth a row (overrides are already in the values they set).
_NOT_SETTINGS = ("description", "overrides")


@dataclasses.dataclass(frozen=True)
class Compared:
    """One run as the comparison shows it."""

    run: RunDir
    letter: str
    colour: str
    summary: RunSummary
    averages: Averages
    curves: RunCurves
    settings: dict[str, str]


@dataclasses.dataclass
class ComparisonLoaded(Message):
    runs: list[Compared]


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
    """The settings whose values are not the same in every run, in the first run's order."""
    keys = list(dict.fromkeys(k for r in runs for k in r.settings))
    return [k for k in keys if len({r.settings.get(k) for r in runs}) > 1]


class CompareScreen(Screen):
    BINDINGS = [
        Binding("x", "cycle_axis", "Axis"),        # steps, samples, time
        Binding("m", "cycle_metric", "Metric"),    # which eval metric the second plot shows
        Binding("escape", "app.pop_screen", "Back"),
    ]
    DEFAULT_CSS = """
    CompareScreen { layout: vertical; }
    #compare-legend { height: auto; max-height: 4; padding: 0 1; background: $boost; }
    #compare-plots { height: 1fr; min-height: 8; }
    #compare-table { height: 1fr; min-height: 6; }
    """

    def __init__(self, runs: list[RunDir]):
        super().__init__()
        self.runs = list(runs)
        self.axis = AXES[0]
        self.metric: str | None = None
        self.compared: list[Compared] = []
        self.differences: list[str] = []
        self._digests = [RunDigest(run, curves=True) for run in self.runs]
        self._refresh_timer = None

    def compose(self) -> ComposeResult:
        yield Static("reading runs…", id="compare-legend")
        with Horizontal(id="compare-plots"):
            yield OverlayPlot("loss", id="loss-overlay")
            yield OverlayPlot("eval", id="eval-overlay")
        yield DataTable(id="compare-table", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.load()

    @work(thread=True, exclusive=True, group="compare-load", exit_on_error=False)
    def load(self) -> None:
        compared = []
        for i, digest in enumerate(self._digests):
            digest.refresh()
            compared.append(Compared(run=digest.run, letter=chr(ord("A") + i % 26),
                                     colour=COLOURS[i % len(COLOURS)], summary=digest.summary,
                                     averages=digest.averages, curves=digest.curves,
                                     settings=settings(digest.run)))
        self.post_message(ComparisonLoaded(compared))

    def on_comparison_loaded(self, message: ComparisonLoaded) -> None:
        self.compared = message.runs
        self.differences = differing(self.compared)
        metrics = self._metrics()
        if self.metric not in metrics:
            self.metric = metrics[0] if metrics else None
        self._show_legend()
        self._show_plots()
        self._show_table()
        live = any(c.summary.status == "running" for c in self.compared)
        if live and self._refresh_timer is None:
            self._refresh_timer = self.set_interval(REFRESH_S, self.load)
        elif not live and self._refresh_timer is not None:
            self._refresh_timer.stop()
            self._refresh_timer = None

    def _metrics(self) -> list[str]:
        return list(dict.fromkeys(m for c in self.compared for m in c.curves.evals))

    # ------------------------------------------------------------ painting

    def _show_legend(self) -> None:
        legend = Text()
        for c in self.compared:
            if legend:
                legend.append("  ")
            legend.append(f"━ {c.letter} ", style=f"bold {c.colour}")
            legend.append(c.run.id)
            if not c.curves.loss:
                legend.append(" (no steps)", style="dim")
        self.query_one("#compare-legend", Static).update(legend)

    def _time_unit(self) -> tuple[str, float]:
        """Seconds for a short run, minutes or hours for a long one: 18000 s reads as 5 h."""
        longest = max((c.curves.loss.seconds[-1] for c in self.compared if c.curves.loss), default=0.0)
        return ("h", 3600.0) if longest > 3 * 3600 else ("min", 60.0) if longest > 180 else ("s", 1.0)

    def _line(self, curve: Curve | None, colour: str) -> tuple[list[float], list[float], str]:
        if curve is None:
            return [], [], colour
        xs, ys = curve.points(self.axis)
        if self.axis == "seconds":
            per = self._time_unit()[1]
            xs = [x / per for x in xs]
        return xs, ys, colour

    def _show_plots(self) -> None:
        unit = f" ({self._time_unit()[0]})" if self.axis == "seconds" else ""
        lines = [self._line(c.curves.loss, c.colour) for c in self.compared]
        self.query_one("#loss-overlay", OverlayPlot).show(
            lines, title=f"loss by {AXIS_NAME[self.axis]}{unit}", empty=self._empty("steps"))
        eval_plot = self.query_one("#eval-overlay", OverlayPlot)
        if self.metric is None:
            eval_plot.show([], title="eval", empty="no eval metrics")
            return
        lines = [self._line(c.curves.evals.get(self.metric), c.colour) for c in self.compared]
        more = len(self._metrics()) > 1
        eval_plot.show(lines, title=f"{self.metric} by {AXIS_NAME[self.axis]}{unit}" + (" (m: next)" if more else ""),
                       empty=f"no {self.metric} " + self._empty("evals").removeprefix("no "))

    def _empty(self, what: str) -> str:
        """What an empty plot says: no points at all, or none on the samples axis."""
        if self.axis == "samples":
            return f"no {what} with samples seen (x: time or steps)"
        return f"no {what}"

    def _show_table(self) -> None:
        table = self.query_one("#compare-table", DataTable)
        row = table.cursor_row
        table.clear(columns=True)
        table.add_column("", key="what")
        for c in self.compared:
            table.add_column(Text(f"━ {c.letter}", style=f"bold {c.colour}"), key=c.letter)
        for name, cells in self._rows():
            table.add_row(Text(name, style="bold"), *cells)
        if table.row_count:
            table.move_cursor(row=min(row, table.row_count - 1))

    def _rows(self) -> list[tuple[str, list]]:
        runs = self.compared

        def each(f) -> list:
            return [f(c) for c in runs]

        # What matters most first: at 80x24 the table shows about nine rows before it scrolls.
        rows: list[tuple[str, list]] = [
            ("status", each(lambda c: Text(c.summary.status, style=STATUS_STYLE.get(c.summary.status, "")))),
            ("final loss", each(lambda c: _number(c.averages.final_loss))),
        ]
        for m in self._metrics():
            rows.append((m, each(lambda c, m=m: _number(c.averages.final_metrics.get(m)))))
        rows += [
            ("samples/s avg", each(lambda c: rate(c.averages.samples_per_s) if c.averages.samples_per_s else "-")),
            ("duration", each(lambda c: duration(c.summary.duration_s))),
        ]
        if self.differences:
            rows.append((f"── {len(self.differences)} settings differ", ["" for _ in runs]))
            rows += [(key, each(lambda c, key=key: c.settings.get(key, "-"))) for key in self.differences]
        else:
            rows.append(("settings", ["all the same" for _ in runs]))
        rows.append(("── run", ["" for _ in runs]))
        rows += [
            ("ran on", each(lambda c: devices(c.summary))),
            ("steps", each(lambda c: f"{c.summary.step}/{c.summary.total_steps}" if c.summary.step else "no steps")),
            ("steps lost", each(lambda c: str(c.averages.steps_lost))),
            ("steps/s avg", each(lambda c: rate(c.averages.steps_per_s) if c.averages.steps_per_s else "-")),
            ("training", each(lambda c: duration(c.averages.train_s) if c.averages.train_s else "-")),
            ("id", each(lambda c: c.run.id)),
        ]
        return rows

    # ------------------------------------------------------------ keys

    def action_cycle_axis(self) -> None:
        self.axis = AXES[(AXES.index(self.axis) + 1) % len(AXES)]
        self._show_plots()

    def action_cycle_metric(self) -> None:
        metrics = self._metrics()
        if len(metrics) < 2:
            self.notify("one eval metric only" if metrics else "no eval metrics in these runs")
            return
        self.metric = metrics[(metrics.index(self.metric) + 1) % len(metrics)]
        self._show_plots()


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"

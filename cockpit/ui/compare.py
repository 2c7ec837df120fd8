"""Comparing runs: their loss and eval curves laid over each other (x in steps, samples or
time), and a table of each run's results beside the settings in which they differ
(cockpit.comparison, which `cockpit runs compare` prints too).

Each run is a digest (engine.record.digest) with its curves: read once, and while one of them is
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
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Static

from cockpit.comparison import Compared, compared, metrics, table
from cockpit.present.words import STATUS_STYLE
from cockpit.ui.widgets.overlay import OverlayPlot
from engine.record.curves import AXES, Curve, RunCurves
from engine.record.digest import RunDigest
from engine.record.rundir import RunDir

REFRESH_S = 5.0
# One colour per run; none of them red, the crash colour everywhere else.
COLOURS = ("cyan", "magenta", "yellow", "green", "dodger_blue1", "orange1", "white", "medium_purple1")
AXIS_NAME = {"step": "steps", "samples": "samples", "seconds": "time"}


def letter(i: int) -> str:
    """The i-th run's name on this screen: A, B, C..."""
    return chr(ord("A") + i % 26)


def colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def curves(c: Compared) -> RunCurves:
    """A run's curves: this screen reads its runs with them (RunDigest(curves=True))."""
    assert c.curves is not None
    return c.curves


@dataclasses.dataclass
class ComparisonLoaded(Message):
    runs: list[Compared]


class CompareScreen(Screen):
    BINDINGS = [
        Binding("x", "cycle_axis", "Axis", tooltip="x in steps, samples seen or time since the start"),
        Binding("y", "log_scale", "Log y", tooltip="loss on a logarithmic scale, or back to linear"),
        Binding("e", "cycle_metric", "Eval", tooltip="the next eval metric on the second plot"),
        Binding("escape", "app.pop_screen", "Back"),
    ]
    HELP = """\
The marked runs side by side, each a letter and a colour (the legend names them). Their loss
and an eval metric overlaid, over steps, samples seen or time since each run started (`x`),
the loss on a log scale with `y`, the next eval metric with `e`; a run that never stepped says
so. Below: each run's status, final loss and metrics, average throughput and duration, then
only the settings in which the runs differ (workload params, train settings, device preset),
then how each ran. A live run is followed as it goes. `cockpit runs compare` prints the table.
"""
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
        self.log_loss = False
        self.metric: str | None = None
        self.compared: list[Compared] = []
        self._digests = [RunDigest(run, curves=True) for run in self.runs]
        self._refresh_timer: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Static("reading runs…", id="compare-legend")
        with Horizontal(id="compare-plots"):
            yield OverlayPlot("loss", id="loss-overlay")
            yield OverlayPlot("eval", id="eval-overlay")
        yield DataTable(id="compare-table", cursor_type="row", zebra_stripes=True)
        yield Footer(compact=True)  # every key and "? Help" within 80 columns

    def on_mount(self) -> None:
        self.load()

    def on_screen_suspend(self) -> None:
        # Help or the log view on top: nobody sees the curves, so a live run is not read.
        if self._refresh_timer is not None:
            self._refresh_timer.pause()

    def on_screen_resume(self) -> None:
        if self._refresh_timer is not None:
            self._refresh_timer.resume()

    @work(thread=True, exclusive=True, group="compare-load", exit_on_error=False)
    def load(self) -> None:
        for digest in self._digests:
            digest.refresh()
        # The curves copied: the next refresh adds to the digest's own while the screen draws.
        runs = [compared(d) for d in self._digests]
        self.post_message(ComparisonLoaded([dataclasses.replace(c, curves=curves(c).copy()) for c in runs]))

    def on_comparison_loaded(self, message: ComparisonLoaded) -> None:
        self.compared = message.runs
        names = metrics(self.compared)
        if self.metric not in names:
            self.metric = names[0] if names else None
        self._show_legend()
        self._show_plots()
        self._show_table()
        live = any(c.summary.status == "running" for c in self.compared)
        if live and self._refresh_timer is None:
            self._refresh_timer = self.set_interval(REFRESH_S, self.load)
        elif not live and self._refresh_timer is not None:
            self._refresh_timer.stop()
            self._refresh_timer = None

    # ------------------------------------------------------------ painting

    def _show_legend(self) -> None:
        legend = Text()
        for i, c in enumerate(self.compared):
            if legend:
                legend.append("  ")
            legend.append(f"━ {letter(i)} ", style=f"bold {colour(i)}")
            legend.append(c.run.id)
            if not curves(c).loss:
                legend.append(" (no steps)", style="dim")
        self.query_one("#compare-legend", Static).update(legend)

    def _time_unit(self) -> tuple[str, float]:
        """Seconds for a short run, minutes or hours for a long one: 18000 s reads as 5 h."""
        longest = max((curves(c).loss.seconds[-1] for c in self.compared if curves(c).loss), default=0.0)
        return ("h", 3600.0) if longest > 3 * 3600 else ("min", 60.0) if longest > 180 else ("s", 1.0)

    def _line(self, curve: Curve | None, i: int) -> tuple[list[float], list[float], str]:
        if curve is None:
            return [], [], colour(i)
        xs, ys = curve.points(self.axis)
        if self.axis == "seconds":
            per = self._time_unit()[1]
            xs = [x / per for x in xs]
        return xs, ys, colour(i)

    def _show_plots(self) -> None:
        unit = f" ({self._time_unit()[0]})" if self.axis == "seconds" else ""
        lines = [self._line(curves(c).loss, i) for i, c in enumerate(self.compared)]
        name = "loss (log)" if self.log_loss else "loss"
        self.query_one("#loss-overlay", OverlayPlot).show(
            lines, title=f"{name} by {AXIS_NAME[self.axis]}{unit}", empty=self._empty("steps"),
            log=self.log_loss)
        eval_plot = self.query_one("#eval-overlay", OverlayPlot)
        if self.metric is None:
            eval_plot.show([], title="eval", empty="no eval metrics")
            return
        lines = [self._line(curves(c).evals.get(self.metric), i) for i, c in enumerate(self.compared)]
        more = len(metrics(self.compared)) > 1
        eval_plot.show(lines, title=f"{self.metric} by {AXIS_NAME[self.axis]}{unit}" + (" (e: next)" if more else ""),
                       empty=f"no {self.metric} " + self._empty("evals").removeprefix("no "))

    def _empty(self, what: str) -> str:
        """What an empty plot says: no points at all, or none on the samples axis."""
        if self.axis == "samples":
            return f"no {what} with samples seen (x: time or steps)"
        return f"no {what}"

    def _show_table(self) -> None:
        grid = self.query_one("#compare-table", DataTable)
        row = grid.cursor_row
        rows = table(self.compared)
        names = [f"── {r.name}" if r.heading else r.name for r in rows]
        name_width, widths = self._fit([names] + [[r.cells[i] for r in rows] for i in range(len(self.compared))])
        grid.clear(columns=True)
        grid.add_column("", key="what", width=name_width)
        for i, width in enumerate(widths):
            grid.add_column(Text(f"━ {letter(i)}", style=f"bold {colour(i)}"), key=letter(i), width=width)
        for r, name in zip(rows, names):
            cells = [_clip(c, w) for c, w in zip(r.cells, widths)]
            style = [STATUS_STYLE.get(c, "") if r.name == "status" else "" for c in r.cells]
            grid.add_row(Text(_clip(name, name_width), style="bold"),
                         *(Text(c, style=st) for c, st in zip(cells, style)))
        if grid.row_count:
            grid.move_cursor(row=min(row, grid.row_count - 1))

    def _fit(self, columns: list[list[str]]) -> tuple[int | None, list[int | None]]:
        """Column widths: each its widest cell if they all fit beside the scrollbar; else the
        setting names whole (cut, checkpoint_every_steps and _minutes read alike) and the runs'
        values cut to share the rest (a run id is whole in the legend)."""
        natural = [max(len(c) for c in column) if column else 1 for column in columns]
        natural[1:] = [max(n, 3) for n in natural[1:]]   # the header: '━ A'
        room = self.size.width - 2 - 2 * len(columns)    # the scrollbar; a cell's padding
        if sum(natural) <= room:
            return None, [None] * (len(columns) - 1)
        name_width = min(natural[0], max(16, room // 2))
        share = max(10, (room - name_width) // max(1, len(columns) - 1))
        return name_width, [min(n, share) for n in natural[1:]]

    def on_resize(self) -> None:
        if self.compared:
            self._show_table()

    # ------------------------------------------------------------ keys

    def action_cycle_axis(self) -> None:
        self.axis = AXES[(AXES.index(self.axis) + 1) % len(AXES)]
        self._show_plots()

    def action_log_scale(self) -> None:
        self.log_loss = not self.log_loss
        self._show_plots()

    def action_cycle_metric(self) -> None:
        names = metrics(self.compared)
        if len(names) < 2:
            self.notify("one eval metric only" if names else "no eval metrics in these runs")
            return
        self.metric = names[(names.index(self.metric) + 1) % len(names)] if self.metric in names else names[0]
        self._show_plots()


def _clip(text: str, width: int | None) -> str:
    return text if width is None or len(text) <= width else text[: width - 1] + "…"

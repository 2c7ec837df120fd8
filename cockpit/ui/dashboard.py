"""The run dashboard: progress and ETA, plots of throughput, loss, the eval metrics and the
learning rate, memory and hardware, the crash/fallback panel and a log tail, for a live run
(attached or just started) or a past one (replayed from its events).

Layout by the terminal's size: below SHORT rows the panels keep six lines and the log two, so
the plots get the rest (six data rows at 80x24); below NARROW columns memory and hardware
share one slot (h switches) and two plots share a row; at 200x50 four plots in a row, all
panels side by side and a log that takes what is left. m maximises one plot at a time.

Threading: a worker thread (cockpit.ui.follow) starts the supervisor when asked and follows
events.jsonl; it only post_message's batches. Here each batch is folded into the RunModel at
once (cheap) and the widgets are repainted at most FRAME_S apart, so a flood of events costs
at most ten repaints a second; the plots, the costly part, at most once per PLOT_S.
"""

from __future__ import annotations

import itertools
import math
import textwrap
import time
from collections import deque

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from cockpit.headless import duration, eta_text
from cockpit.ui.alerts import ScreenAlerts
from cockpit.ui.follow import RunEvents, follow
from cockpit.ui.logs import LogScreen
from cockpit.ui.model import RunModel, rate_text
from cockpit.ui.widgets.attempts import AttemptsPanel
from cockpit.ui.widgets.hardware import HardwarePanel
from cockpit.ui.widgets.memory import MemoryPanel
from cockpit.ui.widgets.plots import PlotCard, fit, short_number, title_line
from engine import presets
from engine.errors import ConfigError
from engine.run import supervisor
from engine.run.rundir import RunDir

FRAME_S = 0.1
PLOT_S = 1.0   # the plots are the costly part of a frame (~20 ms each); once a second is plenty
# Drawing a plot costs ~15 us a cell (textual-plot, then Textual's compositor): up to
# PLOT_CELLS_PER_S cells (two plots at 80x24) are drawn every PLOT_S, more every
# PLOT_S x cells / PLOT_CELLS_PER_S, at most every 3 s (plots filling 200x50), so the plots of
# a new run cost ~1-2% of a core at any size; a long run's are drawn less often (PlotCard.stale).
PLOT_CELLS_PER_S = 1000
PLOT_S_MAX_FACTOR = 3.0
SHORT = 32     # rows below which panels and log shrink so the plots keep their height
TALL = 40      # rows from which the plots may take two rows of cards
NARROW = 120   # columns below which memory and hardware share one slot
CARD_COLUMNS = 45   # a plot card narrower than this squeezes its ticks together
BAR_CELLS = 16
STATUS_STYLE = {"running": "bold cyan", "finished": "bold green", "stopped": "bold yellow",
                "failed": "bold red", "lost": "bold red", "interrupted": "yellow", "created": "dim"}
# Crash marks are red (plots.CRASH_STYLE): no series is red or magenta, which reads as red.
# (hex or the basic names: Textual fails to parse Rich's bright_blue or grey35 at every paint,
# at ~2 ms each, before it falls back to Rich's)
RATE_STYLE, LOSS_STYLE, LR_STYLE = "cyan", "green", "#5f87ff"
EVAL_STYLES = ("yellow", "white", "#5fd7ff")
BAR_STYLE, BAR_DONE_STYLE, BAR_EMPTY_STYLE = "#5f87ff", "green", "#4e4e4e"
WINDOWS = ((None, "whole run"), (1800.0, "last 30 min"), (300.0, "last 5 min"), (60.0, "last min"))
CARDS = ("rate", "loss", "eval", "lr")
# What a workload's epoch preparation is, said while it runs (no steps come meanwhile).
PREPARING = {"twotower": "mining hard negatives"}


class DashboardScreen(Screen):
    BINDINGS = [
        Binding("s", "stop", "Stop", tooltip="stop the run: it checkpoints after the current step, then exits"),
        Binding("d", "detach", "Detach", tooltip="back, leaving the run running without the cockpit"),
        Binding("t", "toggle_rate", "Rate", tooltip="plot throughput in samples/s or steps/s"),
        Binding("l", "logs", "Logs", tooltip="the run's events and its attempts' own output, scrolling, searchable"),
        Binding("w", "window", "Window", tooltip="plots over the whole run, the last 30, 5 or 1 minutes"),
        Binding("y", "log_scale", "Log y", tooltip="loss on a logarithmic scale, or back to linear"),
        Binding("m", "maximise", "Max", tooltip="one plot on the whole screen, then the next; back to all"),
        # not in the footer (at 80 columns '? Help' would not fit): the shared panel's own
        # border says 'h hardware' / 'h memory'
        Binding("h", "side_panel", "Memory/hardware", show=False,
                tooltip="memory or hardware in the panel they share below 120 columns"),
        Binding("escape", "back", "Back", show=False, tooltip="back (a maximised plot: back to all plots)"),
    ]
    HELP = """\
Progress and ETA; plots over time since the run started of throughput (`t`: samples/s or
steps/s; its title has the run's average and GFLOP/s), loss (`y`: log scale), the eval
metrics and the learning rate when it changes, crashes as red dashed lines; then
memory (pressure, swap, RSS, device memory), hardware (CPU, GPUs), every attempt with how it
ended, the evidence, the fallback taken and where it resumed, and the log's tail.
`w` plots the last 30, 5 or 1 minutes, `m` maximises one plot (again: the next, esc: all).
`s` stops the run gracefully (checkpoint, then exit); `d` leaves it running without the
cockpit, which attaches to it again later. Neither is offered once the run has ended.
"""
    DEFAULT_CSS = """
    DashboardScreen { layout: vertical; }
    #status { height: 1; padding: 0 1; background: $boost; }
    #progress-text { height: auto; max-height: 2; padding: 0 1; }
    #plots { height: 2fr; min-height: 8; layout: grid; grid-size: 2 1; grid-gutter: 0 1; }
    #panels { height: 10; }
    #log { height: 1fr; min-height: 3; border-top: round $primary 50%; border-title-color: $text;
           padding: 0 1; }
    #panels HardwarePanel { height: 100%; max-height: 100%; width: 1fr; }
    #panels AttemptsPanel { width: 2fr; }
    DashboardScreen.-short #panels { height: 8; }
    DashboardScreen.-short #log { height: 3; }
    DashboardScreen.-narrow #panels HardwarePanel { width: 30; display: none; }
    DashboardScreen.-narrow #panels AttemptsPanel { width: 1fr; }
    DashboardScreen.-narrow.-hardware #panels MemoryPanel { display: none; }
    DashboardScreen.-narrow.-hardware #panels HardwarePanel { display: block; }
    DashboardScreen.-max #panels, DashboardScreen.-max #log { display: none; }
    DashboardScreen.-max #plots { height: 1fr; }
    """

    def __init__(self, run: RunDir, *, start: bool = False):
        super().__init__()
        self.run = run
        self.start = start
        self.model = RunModel(run_id=run.id)
        try:
            table = presets.read_toml(run.config_path)
            self.model.workload = table.get("workload_preset", "?")
            self.model.device_preset = table.get("device_preset", "?")
        except ConfigError:
            pass
        self.show_steps = False
        self.loss_log = False
        self.window = 0                  # index into WINDOWS
        self.maximised: str | None = None  # a card's name (CARDS) while one fills the plots
        self._arranged: tuple | None = None
        self._dirty: set[str] = set()
        self._paint_due: float | None = None
        self._paint_timer = None
        self._unpainted_t: float | None = None   # write time of the oldest event not yet shown
        self._last_paint = 0.0
        self._last_plot = 0.0
        self._plotted = False    # the first data reaches the plots at once, later data once per PLOT_S
        self._force_plot = True  # draw every shown card at the next drawing, stale or not
        self._plot_interval: float | None = None
        self._can_stop: bool | None = None
        self._progress_rows = 0
        self.ended = False
        # what happens from now on alerts (a replayed past does not); the supervisor does the
        # rest -- desktop, notify command -- since it has no terminal of its own here
        self._alerts = ScreenAlerts(self.model.workload)
        # For each frame, how long the oldest event it shows waited since it was written: the
        # benchmark's and the replay test's view of how far behind the screen is.
        self.frame_lags: deque[float] = deque(maxlen=1000)
        self.frames = 0

    def compose(self) -> ComposeResult:
        yield Static(id="status")
        # one widget for the bar and the figures: a step repaints one line, not four widgets
        yield Static(id="progress-text")
        with Grid(id="plots"):
            for name in CARDS:
                yield PlotCard(id=f"{name}-card")
        with Horizontal(id="panels"):
            yield MemoryPanel(id="memory")
            yield HardwarePanel(id="hardware")
            yield AttemptsPanel(id="attempts")
        yield Static(id="log")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#log", Static).border_title = "log"
        self._fit_to_size()
        self._dirty = {"status", "progress", "plots", "plot-data", "memory", "attempts", "log"}
        self._paint()
        self.follow_run()

    def on_resize(self) -> None:
        self._fit_to_size()
        self._progress_rows = 0
        # what fits in a line changed: the texts are laid out again at the next frame
        self._dirty |= {"status", "progress", "plots", "plot-data", "log"}
        self._force_plot = True
        self._schedule_paint()

    def _fit_to_size(self) -> None:
        width, height = self.size
        self.set_class(height < SHORT, "-short")
        narrow = width < NARROW
        if narrow != self.has_class("-narrow"):
            self.set_class(narrow, "-narrow")
            self.refresh_bindings()   # h only means something while the slot is shared
        # keys without padding below NARROW columns: every key and '? Help' fit in 80
        self.query_one(Footer).compact = narrow
        self._label_side_panel()

    def _label_side_panel(self) -> None:
        narrow = self.has_class("-narrow")
        self.query_one(MemoryPanel).border_subtitle = "h hardware" if narrow else ""
        self.query_one(HardwarePanel).border_subtitle = "h memory" if narrow else ""
        self._arrange_plots()

    # ------------------------------------------------------------ the worker

    @work(thread=True, exclusive=True, group="follow", exit_on_error=False)
    def follow_run(self) -> None:
        worker = get_current_worker()
        follow(self.run, self.post_message, lambda: worker.is_cancelled, start=self.start)

    def on_run_events(self, message: RunEvents) -> None:
        message.stop()
        if message.events and self._unpainted_t is None:
            self._unpainted_t = message.events[0].get("t")
        changed = self.model.fold(message.events)
        for alert in self._alerts.see(message.events):
            self._alerts.ring(self.app, alert)
        if self.model.set_live(message.live):
            changed.add("status")
        if message.ended:
            self.ended = True
            changed.add("status")
        if "memory" in changed:
            changed.add("hardware")   # the same memory event carries the CPU and GPU figures
        if "plots" in changed:
            changed.add("plot-data")  # "plots" repaints the titles (cheap), this the lines
        self._dirty |= changed
        self._schedule_paint()

    # ------------------------------------------------------------ painting

    def _schedule_paint(self) -> None:
        """Paint at most every FRAME_S (the plots' lines at most every plot_interval()); a
        paint already due at or before that time covers whatever arrived since."""
        if not self._dirty:
            return
        due = self._last_paint + FRAME_S
        if self._dirty == {"plot-data"} and self._plotted and not self.model.finished:
            due = max(due, self._last_plot + self.plot_interval())
        if self._paint_due is not None and self._paint_due <= due:
            return
        if self._paint_timer is not None:
            self._paint_timer.stop()
        self._paint_due = due
        # (a zero-delay Timer divides by zero inside Textual: never less than a millisecond)
        self._paint_timer = self.set_timer(max(0.001, due - time.monotonic()), self._paint)

    def _paint(self) -> None:
        self._paint_due, self._paint_timer = None, None
        dirty, self._dirty = self._dirty, set()
        self._last_paint = time.monotonic()
        m = self.model
        if "status" in dirty:
            self.query_one("#status", Static).update(self._status_text(), layout=False)
            self._offer_stop()
        if "progress" in dirty or "status" in dirty:
            self._paint_progress()
        if "plot-data" in dirty:
            if (self._last_paint - self._last_plot >= self.plot_interval() or self.model.finished
                    or not self._plotted or self._force_plot):
                self._last_plot = self._last_paint
                self._paint_plots(draw=True)
            else:
                self._dirty.add("plot-data")  # drawn by a later frame, scheduled below
                if "plots" in dirty:
                    self._paint_plots(draw=False)
        elif "plots" in dirty:
            self._paint_plots(draw=False)
        if "memory" in dirty:
            self.query_one(MemoryPanel).show(m)
        if "hardware" in dirty or "memory" in dirty:
            self.query_one(HardwarePanel).show(m)
        if "attempts" in dirty:
            self.query_one(AttemptsPanel).show(m)
        if "log" in dirty:
            self._paint_log()
        self.frames += 1
        if self._unpainted_t is not None:
            oldest, self._unpainted_t = self._unpainted_t, None
            self.call_after_refresh(lambda: self.frame_lags.append(time.time() - oldest))
        self._schedule_paint()

    def _offer_stop(self) -> None:
        """s and d only while the run is running: the footer drops them when it ends."""
        can = self._stoppable()
        if can != self._can_stop:
            self._can_stop = can
            self.refresh_bindings()

    def _stoppable(self) -> bool:
        m = self.model
        return not m.finished and not self.ended and (bool(m.live) or (self.start and m.live is None))

    def _status_text(self) -> Text:
        m = self.model
        parts = [Text(m.status, style=STATUS_STYLE.get(m.status, "bold"))]
        if m.live and not self.start:
            parts[0].append(" (attached)", style="dim")
        parts.append(Text(f"{m.workload} on {m.device_preset}"))
        a = m.attempts[-1] if m.attempts else None
        if a is not None:
            parts.append(Text(f"attempt {a.attempt}: {a.preset}" + (f" on {a.device}" if a.device else "")))
        parts.append(Text(m.run_id, style="dim"))
        return fit(parts, max(20, self.size.width - 2), sep="  ")

    def _paint_progress(self) -> None:
        m = self.model
        text = self.query_one("#progress-text", Static)
        bar = progress_bar(m.fraction, finished=m.status == "finished")
        width = max(20, (text.content_size.width or self.size.width - 2) - bar.cell_len)
        parts = self._progress_parts()
        if m.epoch is not None and fit(parts, width, "  ").cell_len + len(f"  epoch {m.epoch}") <= width:
            parts.insert(1, Text(f"epoch {m.epoch}"))   # a nicety: only where it fits on the line
        body = two_lines(parts, width).split("\n")
        line = bar + body[0]
        if len(body) > 1:
            line += Text("\n" + " " * bar.cell_len) + body[1]
        # A re-layout repaints the whole screen (~40 ms): the line keeps a second row once it
        # needed one (until a resize), rather than toggling as the ETA's digits come and go.
        rows = max(len(body), self._progress_rows)
        if rows > len(body):
            line += Text("\n")
        text.update(line, layout=rows != self._progress_rows)
        self._progress_rows = rows

    def _progress_parts(self) -> list[Text]:
        m = self.model
        parts = [Text(f"step {m.step}/{m.total or '?'}")]
        if m.finished:
            parts.append(Text(f"took {duration(m.duration_s(time.time()))}"))
        elif m.mining_active:
            # no steps while an epoch is prepared: say why, instead of an ETA that means nothing
            parts.append(Text(PREPARING.get(m.workload, "preparing the next epoch") + "…", style="bold yellow"))
            last = (m.mining or {})
            if last.get("recall_vs_exact") is not None:
                parts.append(Text(f"last pass: recall {last['recall_vs_exact']:.3f} vs exact, "
                                  f"{last.get('mining_s', 0):.1f} s", style="dim"))
        elif (eta := eta_text(m.eta_s, m.attempts[-1].windows if m.attempts else None)) is not None:
            parts.append(Text(eta))
        if m.loss is not None:
            parts.append(Text(f"loss {m.loss:.4g}"))
        for k, v in list(m.metrics.items())[:3]:
            parts.append(Text(f"{k} {metric_text(v)}"))
        return parts

    # ------------------------------------------------------------ plots

    def _cards_with_data(self) -> list[str]:
        """The cards worth a place: throughput and loss always (they say why they are empty),
        eval once the run reported it, lr once it changed (a constant lr is a flat line: its
        value goes in the loss card's title instead)."""
        m = self.model
        return ["rate", "loss"] + (["eval"] if m.eval_series else []) + (["lr"] if self._lr_varies() else [])

    def _lr_varies(self) -> bool:
        ys = self.model.lr_series.y
        last = self.model.lr_series.last
        return bool(ys) and last is not None and (max(ys) > min(ys) or last[1] != ys[0])

    def _arrange_plots(self) -> None:
        """Which cards show, in a grid of how many columns and rows."""
        width, height = self.size
        wanted = self._cards_with_data()
        if self.maximised not in wanted:
            self.maximised = None
        key = (tuple(wanted), width, height, self.maximised)
        if key == self._arranged:
            return
        self._arranged = key
        self.set_class(self.maximised is not None, "-max")
        if self.maximised is not None:
            shown, columns, rows = [self.maximised], 1, 1
        else:
            columns = min(len(wanted), max(2, width // CARD_COLUMNS))
            rows = min(1 if height < TALL else 2, math.ceil(len(wanted) / columns))
            shown = wanted[: columns * rows]
        grid = self.query_one("#plots", Grid)
        grid.styles.grid_size_columns, grid.styles.grid_size_rows = columns, rows
        for name in CARDS:
            self.query_one(f"#{name}-card", PlotCard).display = name in shown
        self._force_plot = True   # a card shown anew, or resized, is drawn at the next frame
        self._plot_interval = None  # and their size is measured again once laid out

    def plot_interval(self) -> float:
        """Seconds between drawings of the plots' lines: PLOT_S, longer for plots so big that
        drawing them once a second would cost more than the rest of the screen."""
        if self._plot_interval is None:   # (a DOM query at every event cost 1% of a core)
            cells = sum(c.plot.size.area for c in self.query(PlotCard) if c.display)
            self._plot_interval = PLOT_S * min(PLOT_S_MAX_FACTOR, max(1.0, cells / PLOT_CELLS_PER_S))
        return self._plot_interval

    def _paint_plots(self, draw: bool) -> None:
        """The cards' titles; with `draw` their lines too, for each card whose newest data
        would move its line by a braille column or more (or that the user changed)."""
        m = self.model
        self._arrange_plots()
        seconds, window = WINDOWS[self.window]
        until = m.elapsed(m.ended_t or m.newest_t)
        if seconds is not None:
            since = max(0.0, until - seconds)
        else:
            # every card over the same span, from the first step: an eval plot lines up with
            # the loss under it
            firsts = [s.x[0] for s in (m.samples_series, m.loss_series) if s.x]
            since, window = (min(firsts) if firsts else None), None
        force, self._force_plot = self._force_plot and draw, self._force_plot and not draw
        for name in CARDS:
            card = self.query_one(f"#{name}-card", PlotCard)
            if card.display:
                worth = draw and (force or card.stale(since, until))
                getattr(self, f"_paint_{name}")(card, since, until, window, card.size.width or 40, worth)
        self._plotted = self._plotted or (draw and bool(m.samples_series.last or m.loss_series.last))

    def _empty(self, what: str, series=None, window: str | None = None) -> str:
        m = self.model
        if series is not None and series.last is not None and window is not None:
            return f"no {what} in the {window}"
        if m.finished or self.ended:
            return f"no {what}: the run ended before its first reported step"
        return f"no {what} yet: it comes with the first reported step"

    def _paint_rate(self, card: PlotCard, since, until, window: str | None, width: int,
                    draw: bool) -> None:
        m = self.model
        series, unit = (m.steps_series, "steps/s") if self.show_steps else (m.samples_series, "samples/s")
        now = m.steps_per_s if self.show_steps else m.samples_per_s
        average = m.avg_steps_per_s if self.show_steps else m.avg_samples_per_s
        parts = [Text(rate_text(now, unit), style=f"bold {RATE_STYLE}")]
        if average is not None:
            parts.append(Text(f"average {rate_text(average, '').strip()}"))
        if m.gflop_s:
            parts.append(Text(f"{m.gflop_s:,.1f} GFLOP/s" if m.gflop_s >= 1 else f"{m.gflop_s:.2g} GFLOP/s"))
        card.set_title(title_line(parts, width - 1, window))
        if not draw:
            return
        xs, ys = series.points(since)
        card.show([(xs, ys, RATE_STYLE)], m.marks, empty=self._empty("throughput", series, window), since=since, until=until)

    def _paint_loss(self, card: PlotCard, since, until, window: str | None, width: int,
                    draw: bool) -> None:
        # The value is the progress line's (one loss on screen, not two a frame apart).
        m = self.model
        parts = [Text("loss", style=f"bold {LOSS_STYLE}")]
        if self.loss_log:
            parts.append(Text("log scale"))
        if m.lr is not None and not self._lr_varies():
            parts.append(Text(f"lr {short_number(m.lr)} (constant)", style="dim"))
        card.set_title(title_line(parts, width - 1, window))
        if not draw:
            return
        xs, ys = m.loss_series.points(since)
        card.show([(xs, ys, LOSS_STYLE)], m.marks, empty=self._empty("loss", m.loss_series, window), since=since, until=until,
                  log=self.loss_log)

    def _paint_eval(self, card: PlotCard, since, until, window: str | None, width: int,
                    draw: bool) -> None:
        m = self.model
        names = list(m.eval_series)[: len(EVAL_STYLES)]
        title = Text("eval ", style="bold")
        for i, (name, style) in enumerate(zip(names, EVAL_STYLES)):
            title.append(("  " if i else "") + f"━ {name}", style=style)
        card.set_title(title_line([title], width - 1, window))
        if not draw:
            return
        lines = [(*m.eval_series[name].points(since), style) for name, style in zip(names, EVAL_STYLES)]
        card.show(lines, m.marks, empty=f"no eval in the {window or 'run'}", since=since, until=until)

    def _paint_lr(self, card: PlotCard, since, until, window: str | None, width: int,
                  draw: bool) -> None:
        m = self.model
        parts = [Text(f"lr {short_number(m.lr)}" if m.lr is not None else "lr", style=f"bold {LR_STYLE}")]
        card.set_title(title_line(parts, width - 1, window))
        if not draw:
            return
        xs, ys = m.lr_series.points(since)
        card.show([(xs, ys, LR_STYLE)], m.marks, empty=f"no lr in the {window or 'run'}", since=since, until=until)

    # ------------------------------------------------------------ log

    def _paint_log(self) -> None:
        # The tail that fits, as one update: writing each line to a RichLog cost ~1 ms a line.
        # A long line wraps under its text, past its time stamp; l opens the whole log.
        log = self.query_one("#log", Static)
        if not log.display:
            return
        rows = max(1, log.content_size.height or 2)
        width = max(20, log.content_size.width or 76)
        wrapped: list[str] = []
        for line in itertools.islice(reversed(self.model.log), rows):
            wrapped[:0] = wrap_hanging(line, width)
            if len(wrapped) >= rows:
                break
        log.update(Text("\n".join(wrapped[-rows:]), no_wrap=True), layout=False)

    # ------------------------------------------------------------ actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("stop", "detach"):
            return self._stoppable()        # hidden on a run that has ended: nothing to stop
        if action == "side_panel":
            return self.has_class("-narrow")  # side by side at this width: nothing to switch
        return True

    def action_stop(self) -> None:
        if supervisor.request_stop(self.run):
            self.notify("asked the run to stop: it checkpoints and exits after the current step")
        else:
            self.notify(f"run {self.run.id} is not running", severity="warning")

    def action_detach(self) -> None:
        if self.model.live:
            self.notify(f"run {self.run.id} left running; open it again from runs (o)")
        self.dismiss()

    def action_back(self) -> None:
        if self.maximised is not None:
            self.action_maximise(off=True)
            return
        self.action_detach()

    def action_logs(self) -> None:
        self.app.push_screen(LogScreen(self.run))

    def action_toggle_rate(self) -> None:
        self.show_steps = not self.show_steps
        self._replot()

    def action_log_scale(self) -> None:
        self.loss_log = not self.loss_log
        self.notify(f"loss on a {'logarithmic' if self.loss_log else 'linear'} scale", timeout=2)
        self._replot()

    def action_window(self) -> None:
        self.window = (self.window + 1) % len(WINDOWS)
        self.notify(f"plots: {WINDOWS[self.window][1]}", timeout=2)
        self._replot()

    def action_maximise(self, off: bool = False) -> None:
        """The next plot on its own (rate, loss, eval, lr), then all of them again."""
        wanted = self._cards_with_data()
        if off or self.maximised == wanted[-1]:
            self.maximised = None
        else:
            self.maximised = wanted[wanted.index(self.maximised) + 1] if self.maximised in wanted else wanted[0]
        self._arrange_plots()
        self._dirty.add("log")   # back from a maximised plot: the log is shown again
        self._replot()

    def action_side_panel(self) -> None:
        self.toggle_class("-hardware")
        self._label_side_panel()
        self._dirty |= {"memory", "hardware"}
        self._schedule_paint()

    def _replot(self) -> None:
        self._force_plot = True  # the user asked: now, not at the next plot time
        self._dirty |= {"plots", "plot-data"}
        self._schedule_paint()


def progress_bar(fraction: float, *, cells: int = BAR_CELLS, finished: bool = False) -> Text:
    """'━━━━━━━━╺━━━━━━━  50%  ' as text: the bar and the figures after it are one line."""
    fraction = min(1.0, max(0.0, fraction))
    halves = round(fraction * cells * 2)
    full, half = divmod(halves, 2)
    style = BAR_DONE_STYLE if finished or fraction >= 1 else BAR_STYLE
    bar = Text("━" * full, style=style)
    if half:
        bar.append("╸", style=style)
    rest = cells - full - half
    if rest:
        bar.append("━" * rest, style=BAR_EMPTY_STYLE)
    bar.append(f" {100 * fraction:3.0f}%  ")
    return bar


def metric_text(value) -> str:
    """An eval metric as a number that reads as one: 0.9170, 1.000 ('r2 1' read as a label)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:#.4g}"


def wrap_hanging(line: str, width: int) -> list[str]:
    """A log line (' 0:26 run finished: ...') in rows of `width`, the later ones indented past
    the time stamp."""
    if len(line) <= width:
        return [line]
    stamp = len(line) - len(line.lstrip()) + len(line.lstrip().split(" ", 1)[0]) + 1
    indent = " " * (stamp if stamp < width // 2 else 2)
    return textwrap.wrap(line, width, subsequent_indent=indent) or [line[:width]]


def two_lines(parts: list[Text], width: int, sep: str = "  ") -> Text:
    """The parts on one line if they fit, else broken between parts onto a second (never
    inside one: a metric's name and value stay together); what fits on neither is left out."""
    first = fit(parts, width, sep)
    used = _parts_in(first, parts, sep)
    if used >= len(parts):
        return first
    second = fit(parts[used:], width, sep)
    return Text("\n").join([first, second])


def _parts_in(line: Text, parts: list[Text], sep: str) -> int:
    """How many of `parts` fit() put into `line`."""
    length, count = 0, 0
    for part in parts:
        extra = (len(sep) if count else 0) + part.cell_len
        if length + extra > line.cell_len:
            break
        length += extra
        count += 1
    return count

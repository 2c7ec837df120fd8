"""The run dashboard: progress and ETA, plots of throughput, loss, the eval metrics and the
learning rate, memory and hardware, the crash/fallback panel and a log tail, for a live run
(attached or just started) or a past one (replayed from its events).

Layout by the terminal's size: below SHORT rows the panels keep six lines and the log two, so
the plots get the rest (six data rows at 80x24), but a crash that needs more lines, told
compactly, takes two from the plots; below NARROW columns memory and hardware
share one slot (h switches) and two plots share a row; at 200x50 up to four in a row, all
panels side by side and a log that takes what is left. m maximises one plot at a time.
A run on several machines shows its lead machine's dashboard (cockpit.ui.machines) and the
machines panel above the log: two lines at 80x24, where the log keeps one.

Threading: a worker thread (cockpit.ui.follow) starts the supervisor when asked and follows
events.jsonl; it only post_message's batches. Here each batch is folded into the RunModel at
once (cheap) and the widgets are repainted at most FRAME_S apart, so a flood of events costs
at most ten repaints a second; the plots, the costly part, less often (widgets/plot_grid.py).
"""

from __future__ import annotations

import functools
import itertools
import textwrap
import time
from collections import deque
from dataclasses import dataclass

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from cockpit.present.words import STATUS_STYLE, duration, eta_text
from cockpit.ui.alerts import ScreenAlerts
from cockpit.ui.follow import RunEvents, follow
from cockpit.ui.logs import LogScreen
from cockpit.ui.machines import shown, stop as stop_machines
from cockpit.ui.model import Change, RunModel
from cockpit.ui.widgets.attempts import AttemptsPanel
from cockpit.ui.widgets.hardware import HardwarePanel
from cockpit.ui.widgets.machines import MachinesPanel
from cockpit.ui.widgets.memory import MemoryPanel
from cockpit.ui.widgets.plot_grid import WINDOWS, PlotGrid
from cockpit.ui.widgets.plots import fit
from engine.numbers import metric
from engine.run import detached
from engine.record.rundir import RunDir

FRAME_S = 0.1
SHORT = 32     # rows below which panels and log shrink so the plots keep their height
SHORT_PANEL_LINES = 6   # ... to these lines inside their borders
NARROW = 120   # columns below which memory and hardware share one slot
BAR_CELLS = 16
# (hex or basic names: Textual fails to parse Rich's bright_blue or grey35 at every paint)
BAR_STYLE, BAR_DONE_STYLE, BAR_EMPTY_STYLE = "#5f87ff", "green", "#4e4e4e"
# The screen's regions that show each part of the model: the status line, the progress line,
# the plots' lines and their titles (titles at every frame, lines at their interval), the
# memory and hardware panels (one memory event carries both panels' figures; a warning shows
# in the memory panel), the attempts panel and the log.
REGIONS = {
    Change.RUN: ("status",),
    Change.ATTEMPTS: ("attempts",),
    Change.PROGRESS: ("progress",),
    Change.SERIES: ("plots", "plot-titles"),
    Change.MEMORY: ("memory", "hardware"),
    Change.WARNINGS: ("memory", "hardware"),
    Change.LOG: ("log",),
}


class DashboardScreen(Screen):
    @dataclass
    class Stale(Message):
        """This dashboard's run went on after it stopped following it: show it anew."""

        run: RunDir

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
metrics and the learning rate when it changes, crashes as red dashed lines (↶ where a health
finding went back), health findings as yellow marks on the loss plot (▲ a loss spike, ◆ a
gradient norm explosion, ↗ divergence, ◇ a plateau); then memory (pressure, swap, RSS,
device memory), hardware (CPU, GPUs), every attempt with how it ended, the evidence, the
fallback taken and where it resumed, each health finding and what was done, and the log's tail. A run on
several machines shows the lead machine's (global rank 0's) and a row per machine (▸ this one).
`w` plots the last 30, 5 or 1 minutes, `m` maximises one plot (again: the next, esc: all).
`s` stops the run gracefully (checkpoint, then exit); `d` leaves it running without the
cockpit, which attaches to it again later. Neither is offered once the run has ended.
"""
    DEFAULT_CSS = """
    DashboardScreen { layout: vertical; }
    #status { height: 1; padding: 0 1; background: $boost; }
    #progress-text { height: auto; max-height: 2; padding: 0 1; }
    #plots { height: 2fr; min-height: 8; }
    #panels { height: 10; }
    #log { height: 1fr; min-height: 3; border-top: round $primary 50%; border-title-color: $text;
           padding: 0 1; }
    #panels HardwarePanel { height: 100%; max-height: 100%; width: 1fr; }
    #panels AttemptsPanel { width: 2fr; }
    DashboardScreen.-short #panels { height: 8; }
    DashboardScreen.-short #log { height: 3; }
    DashboardScreen.-short.-tall-attempts #panels { height: 10; }
    DashboardScreen.-short.-tall-attempts #plots { min-height: 6; }
    DashboardScreen.-narrow #panels HardwarePanel { width: 30; display: none; }
    DashboardScreen.-narrow #panels AttemptsPanel { width: 1fr; }
    DashboardScreen.-narrow.-hardware #panels MemoryPanel { display: none; }
    DashboardScreen.-narrow.-hardware #panels HardwarePanel { display: block; }
    DashboardScreen.-max #panels, DashboardScreen.-max #log, DashboardScreen.-max #machines { display: none; }
    DashboardScreen.-short.-machines #plots { min-height: 7; }
    DashboardScreen.-short.-machines.-tall-attempts #plots { min-height: 6; }
    DashboardScreen.-short.-machines #log { height: 2; min-height: 2; }
    DashboardScreen.-max #plots { height: 1fr; }
    /* toasts (a crash, a fallback) at the top right, over the plots: never over the attempts
       panel, which tells the same crash in full, nor the log */
    DashboardScreen ToastRack { dock: top; align: right top; margin-bottom: 0; margin-top: 1; }
    """

    def __init__(self, run: RunDir, *, start: bool = False):
        super().__init__()
        self.run, self.machines = shown(run)   # several machines: the lead's, the run's id in the title
        self.start = start
        self.model = RunModel(run_id=self.machines.run.id if self.machines else run.id,
                              main_metric=self.run.main_metric())
        self.model.workload, self.model.device_preset = self.run.preset_names()
        self._dirty: set[str] = set()
        self._paint_due: float | None = None
        self._paint_timer: Timer | None = None
        self._unpainted_t: float | None = None   # write time of the oldest event not yet shown
        self._last_paint = 0.0
        self._last_plot = 0.0
        self._plotted = False    # the first data reaches the plots at once, later data at their interval
        self._replotting = True  # the user changed the plots: draw them at the next frame
        self._can_stop: bool | None = None
        self._progress_rows = 0
        self.ended = False
        self._ended_at: int | None = None   # the events file's size when the run ended here
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
        yield PlotGrid(id="plots")
        with Horizontal(id="panels"):
            yield MemoryPanel(id="memory")
            yield HardwarePanel(id="hardware")
            yield AttemptsPanel(id="attempts")
        if self.machines is not None:
            yield MachinesPanel(self.machines, self.run.path.name, id="machines")
        yield Static(id="log")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#log", Static).border_title = "log"
        self.set_class(self.machines is not None, "-machines")
        self._fit_to_size()
        self._dirty = {"status", "progress", "plots", "plot-titles", "memory", "attempts", "log"}
        self._paint()
        self.follow_run()

    def on_screen_resume(self) -> None:
        """Back on this dashboard from another screen: a run that went on after it ended here
        (resumed from the runs screen, or by `cockpit runs resume`) is shown as it is now, by a
        fresh dashboard, not as it was when this one stopped following it."""
        if self.ended and self._events_size() > (self._ended_at or 0):
            # the app puts a fresh one in its place (of a run on several machines: its lead's now)
            self.post_message(self.Stale(self.machines.run if self.machines else self.run))

    def _events_size(self) -> int:
        try:
            return self.run.events_path.stat().st_size
        except OSError:
            return 0

    def on_resize(self) -> None:
        self._fit_to_size()
        self._progress_rows = 0
        # what fits in a line changed: the texts are laid out again at the next frame
        self._dirty |= {"status", "progress", "plots", "plot-titles", "log"}
        self._replot()
        self._schedule_paint()

    def _fit_to_size(self) -> None:
        width, height = self.size
        self.set_class(height < SHORT, "-short")
        for panel in self.query(MachinesPanel):
            panel.fit(short=height < SHORT)
        narrow = width < NARROW
        if narrow != self.has_class("-narrow"):
            self.set_class(narrow, "-narrow")
            self.refresh_bindings()   # h only means something while the slot is shared
        # keys without padding below NARROW columns: every key and '? Help' fit in 80
        self.query_one(Footer).compact = narrow
        self._label_side_panel()
        if self.plots.place_cards():
            self.set_class(self.plots.maximised is not None, "-max")

    def _label_side_panel(self) -> None:
        narrow = self.has_class("-narrow")
        self.query_one(MemoryPanel).border_subtitle = "h hardware" if narrow else ""
        self.query_one(HardwarePanel).border_subtitle = "h memory" if narrow else ""

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
        if message.starting and self.model.finished:
            # its supervisor is starting: the run's end so far is not where it stands
            self.model.status, self.model.ended_t = "resuming", None
        for alert in self._alerts.see(message.events):
            self._alerts.ring(self.app, alert)
        if self.model.set_live(message.live):
            changed |= Change.RUN
        if message.ended:
            self.ended = True
            self._ended_at = self._events_size()
            changed |= Change.RUN
        for panel in self.query(MachinesPanel):   # the world changed, or the run ended: now
            panel.read_soon(ended=self.ended,
                            changed=any(e.get("type") == "nodes_changed" for e in message.events))
        self._dirty |= regions(changed)
        self._schedule_paint()

    # ------------------------------------------------------------ painting

    def _schedule_paint(self) -> None:
        """Paint at most every FRAME_S (the plots' lines at most every plot_interval()); a
        paint already due at or before that time covers whatever arrived since."""
        if not self._dirty:
            return
        due = self._last_paint + FRAME_S
        if self._dirty == {"plots"} and self._plotted and not self.model.finished:
            due = max(due, self._last_plot + self.plots.plot_interval())
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
        if "plots" in dirty:
            if (self._last_paint - self._last_plot >= self.plots.plot_interval() or self.model.finished
                    or not self._plotted or self._replotting):
                self._last_plot = self._last_paint
                self._paint_plots(draw=True)
            else:
                self._dirty.add("plots")  # drawn by a later frame, scheduled below
                if "plot-titles" in dirty:
                    self._paint_plots(draw=False)
        elif "plot-titles" in dirty:
            self._paint_plots(draw=False)
        if "memory" in dirty:
            self.query_one(MemoryPanel).show(m)
        if "hardware" in dirty or "memory" in dirty:
            self.query_one(HardwarePanel).show(m)
        if "attempts" in dirty:
            panel = self.query_one(AttemptsPanel)
            panel.show(m)
            # Short of rows (80x24), a crash told compactly that still needs more than the
            # panel's six lines takes two from the plots: the crash, the fallback and the
            # attempt running stay in view together.
            self.set_class(panel.has_class("crashed") and panel.lines > SHORT_PANEL_LINES, "-tall-attempts")
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
        colour = STATUS_STYLE.get(m.status, "")
        parts = [Text(m.status, style=colour if colour.startswith("bold") else f"bold {colour}".rstrip())]
        if m.live and not self.start:
            parts[0].append(" (attached)", style="dim")
        what = Text(f"{m.workload} on {m.device_preset}")
        a = m.attempts[-1] if m.attempts else None
        attempt = Text(f"attempt {a.attempt}: {a.preset}" + (f" on {a.device}" if a.device else "")) \
            if a is not None else None
        run_id = Text(m.run_id, style="dim")
        # The run's id is what a user types (runs show, resume): where the line is short, the
        # attempt goes first (the attempts panel has it), then the workload, never the id.
        width = max(20, self.size.width - 2)
        for shown in ([what, attempt, run_id], [what, run_id], [run_id]):
            line = [parts[0], *(p for p in shown if p is not None)]
            if sum(p.cell_len for p in line) + 2 * (len(line) - 1) <= width:
                return fit(line, width, sep="  ")
        return fit([parts[0], run_id], width, sep="  ")

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
            # no steps while a mining pass runs: say why, instead of an ETA that means nothing
            parts.append(Text("mining hard negatives…", style="bold yellow"))
            last = (m.mining or {})
            if last.get("recall_vs_exact") is not None:
                parts.append(Text(f"last pass: recall {last['recall_vs_exact']:.3f} vs exact, "
                                  f"{last.get('mining_s', 0):.1f} s", style="dim"))
        elif m.eval_active:
            parts.append(Text("evaluating…", style="bold yellow"))
        elif (eta := eta_text(m.eta_s, m.attempts[-1].windows if m.attempts else None)) is not None:
            parts.append(Text(eta))
        if m.loss is not None:
            parts.append(Text(f"loss {metric(m.loss)}"))
        main = m.main
        if main is not None and main[1] is not None:   # a reward, a recall: what the run is judged by
            parts.append(Text(f"{main.name} {metric(main.value)}", style="bold"))
        if (bar := goodput_bar(m.stats.goodput().as_dict())) is not None:
            parts.append(bar)
        # the eval's loss first, timings left out (RunModel.metrics is shown_metrics')
        for k, v in [(k, v) for k, v in m.metrics.items() if main is None or k != main[0]][:3]:
            parts.append(Text(f"{k} {metric(v)}"))
        return parts

    # ------------------------------------------------------------ plots

    @property
    def plots(self) -> PlotGrid:
        return self.query_one(PlotGrid)

    def _paint_plots(self, draw: bool) -> None:
        if self.plots.paint(self.model, ended=self.ended, draw=draw):
            self.set_class(self.plots.maximised is not None, "-max")
        self._replotting = self._replotting and not draw
        self._plotted = self._plotted or (draw and bool(self.model.samples_series.last or self.model.loss_series.last))

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
        if self.machines is not None and (asked := stop_machines(self.machines.run)):
            self.notify(f"asked the run to stop on {', '.join(asked)}: every machine checkpoints and exits "
                        "after the same step")
        elif detached.request_stop(self.run):
            self.notify("asked the run to stop: it checkpoints and exits after the current step")
        else:
            self.notify(f"run {self.run.id} is not running", severity="warning")

    def action_detach(self) -> None:
        if self.model.live:
            self.notify(f"run {self.run.id} left running; open it again from runs (o)")
        self.dismiss()

    def action_back(self) -> None:
        if self.plots.maximised is not None:
            self.action_maximise(off=True)
            return
        self.action_detach()

    def action_logs(self) -> None:
        self.app.push_screen(LogScreen(self.run))

    def action_toggle_rate(self) -> None:
        if not self.model.samples_known:   # nothing to toggle to: say why, rather than nothing
            self.notify("this command's samples per step are not known: throughput is in steps/s "
                        "(cockpit runs show says how to give them)", timeout=4)
            return
        self.plots.show_steps = not self.plots.show_steps
        self._replot()

    def action_log_scale(self) -> None:
        self.plots.loss_log = not self.plots.loss_log
        self.notify(f"loss on a {'logarithmic' if self.plots.loss_log else 'linear'} scale", timeout=2)
        self._replot()

    def action_window(self) -> None:
        self.plots.window = (self.plots.window + 1) % len(WINDOWS)
        self.notify(f"plots: {WINDOWS[self.plots.window][1]}", timeout=2)
        self._replot()

    def action_maximise(self, off: bool = False) -> None:
        """The next plot on its own (rate, loss, eval, lr), then all of them again."""
        self.plots.maximise_next(off)
        self.set_class(self.plots.maximised is not None, "-max")
        self._dirty.add("log")   # back from a maximised plot: the log is shown again
        self._replot()

    def action_side_panel(self) -> None:
        self.toggle_class("-hardware")
        self._label_side_panel()
        self._dirty |= {"memory", "hardware"}
        self._schedule_paint()

    def _replot(self) -> None:
        self._replotting = True  # the user asked: now, not at the next plot time
        self.plots.force()
        self._dirty |= {"plots", "plot-titles"}
        self._schedule_paint()


@functools.cache
def regions(changed: Change) -> frozenset[str]:
    """The regions that show what changed (REGIONS)."""
    return frozenset(region for part, names in REGIONS.items() if part in changed for region in names)


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


def wrap_hanging(line: str, width: int) -> list[str]:
    """A log line (' 0:26 run finished: ...') in rows of `width`, the later ones indented past
    the time stamp."""
    if len(line) <= width:
        return [line]
    stamp = len(line) - len(line.lstrip()) + len(line.lstrip().split(" ", 1)[0]) + 1
    indent = " " * (stamp if stamp < width // 2 else 2)
    return textwrap.wrap(line, width, subsequent_indent=indent) or [line[:width]]


# A goodput bar's cells, by what the time went to: training kept, steps trained again, a
# crash's recovery and stalls, and the rest (start-up, checkpoints, evaluation...).
GOODPUT_CELLS = 10
GOODPUT_STYLES = (("productive", "green"), ("lost", "red"), ("rewound", "red"), ("recovery", "yellow"),
                  ("stalls", "yellow"), ("overhead", "#4e4e4e"))


def goodput_bar(g: dict) -> Text | None:
    """'goodput ━━━━━━━━━━ 72%': the run's wall time in ten cells, coloured by where it went
    (engine.record.goodput); None before anything was timed."""
    if g.get("goodput") is None or not g.get("wall_s"):
        return None
    buckets = g.get("buckets") or {}
    spent = {"productive": g["productive_s"], "lost": buckets.get("lost") or 0.0,
             "rewound": buckets.get("rewound") or 0.0,
             "recovery": buckets.get("recovery") or 0.0, "stalls": buckets.get("stalls") or 0.0}
    spent["overhead"] = max(0.0, g["wall_s"] - sum(spent.values()))
    bar, edge, cells = Text("goodput "), 0.0, 0
    for name, style in GOODPUT_STYLES:
        edge += spent[name] / g["wall_s"] * GOODPUT_CELLS
        n = min(GOODPUT_CELLS, round(edge)) - cells
        if n > 0:
            bar.append("━" * n, style=style)
            cells += n
    bar.append(f" {g['goodput']:.0%}", style="bold")
    return bar


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

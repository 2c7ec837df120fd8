"""The run dashboard: progress and ETA, throughput and loss plots, the eval metric, memory,
the crash/fallback panel and a log tail, for a live run (attached or just started) or a past
one (replayed from its events).

Threading: a worker thread (cockpit.ui.follow) starts the supervisor when asked and follows
events.jsonl; it only post_message's batches. Here each batch is folded into the RunModel at
once (cheap) and the widgets are repainted at most FRAME_S apart, so a flood of events costs
at most ten repaints a second.
"""

from __future__ import annotations

import itertools
import time
from collections import deque

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, ProgressBar, Static
from textual.worker import get_current_worker

from cockpit.headless import duration, eta_text
from cockpit.ui.alerts import ScreenAlerts
from cockpit.ui.follow import RunEvents, follow
from cockpit.ui.logs import LogScreen
from cockpit.ui.model import RunModel, rate_text
from cockpit.ui.widgets.attempts import AttemptsPanel
from cockpit.ui.widgets.memory import MemoryPanel
from cockpit.ui.widgets.plots import SeriesPlot
from engine import presets
from engine.run import supervisor
from engine.errors import ConfigError
from engine.run.rundir import RunDir

FRAME_S = 0.1
PLOT_S = 1.0   # the plots are the costly part of a frame (~20 ms each); once a second is plenty
STATUS_STYLE = {"running": "bold cyan", "finished": "bold green", "stopped": "bold yellow",
                "failed": "bold red", "lost": "bold red", "interrupted": "yellow", "created": "dim"}


class DashboardScreen(Screen):
    BINDINGS = [
        Binding("s", "stop", "Stop run"),
        Binding("d", "detach", "Detach"),
        Binding("t", "toggle_rate", "steps/samples"),
        Binding("l", "logs", "Logs"),
        Binding("escape", "back", "Back"),
    ]
    DEFAULT_CSS = """
    DashboardScreen { layout: vertical; }
    #status { height: 1; padding: 0 1; background: $boost; }
    #progress-row { height: 1; padding: 0 1; }
    #progress-row ProgressBar { width: 22; }
    #progress-row Bar { width: 16; }
    #progress-text { width: 1fr; }
    #plots { height: 1fr; min-height: 7; }
    #panels { height: 9; }
    #log { height: 4; border: round $primary 50%; border-title-color: $text; }
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
        self._dirty: set[str] = set()
        self._paint_due: float | None = None
        self._paint_timer = None
        self._unpainted_t: float | None = None   # write time of the oldest event not yet shown
        self._last_paint = 0.0
        self._last_plot = 0.0
        self._plotted = False    # the first data reaches the plots at once, later data once per PLOT_S
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
        with Horizontal(id="progress-row"):
            yield ProgressBar(total=1, show_eta=False, id="progress")
            yield Static(id="progress-text")
        with Horizontal(id="plots"):
            yield SeriesPlot("samples/s", style="cyan", id="rate-plot")
            yield SeriesPlot("loss", style="magenta", id="loss-plot")
        with Horizontal(id="panels"):
            yield MemoryPanel(id="memory")
            yield AttemptsPanel(id="attempts")
        yield Static(id="log")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#log", Static).border_title = "log"
        self._dirty = {"status", "progress", "plots", "memory", "attempts", "log"}
        self._paint()
        self.follow_run()

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
        self._dirty |= changed
        self._schedule_paint()

    # ------------------------------------------------------------ painting

    def _schedule_paint(self) -> None:
        """Paint at most every FRAME_S (plots at most every PLOT_S); a paint already due at or
        before that time covers whatever arrived since."""
        if not self._dirty:
            return
        due = self._last_paint + FRAME_S
        if self._dirty == {"plots"} and self._plotted and not self.model.finished:
            due = max(due, self._last_plot + PLOT_S)
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
        if "progress" in dirty or "status" in dirty:
            self._paint_progress()
        if "plots" in dirty:
            if self._last_paint - self._last_plot >= PLOT_S or self.model.finished or not self._plotted:
                self._last_plot = self._last_paint
                self._paint_plots()
            else:
                self._dirty.add("plots")  # drawn by a later frame, scheduled below
        if "memory" in dirty:
            self.query_one(MemoryPanel).show(m)
        if "attempts" in dirty:
            self.query_one(AttemptsPanel).show(m)
        if "log" in dirty:
            self._paint_log()
        self.frames += 1
        if self._unpainted_t is not None:
            oldest, self._unpainted_t = self._unpainted_t, None
            self.call_after_refresh(lambda: self.frame_lags.append(time.time() - oldest))
        self._schedule_paint()

    def _status_text(self) -> Text:
        m = self.model
        text = Text()
        text.append(m.status, style=STATUS_STYLE.get(m.status, "bold"))
        if m.live and not self.start:
            text.append(" (attached)", style="dim")
        a = m.attempts[-1] if m.attempts else None
        text.append(f"  {m.workload} on {m.device_preset}")
        if a is not None:
            text.append(f" · attempt {a.attempt}: {a.preset}" + (f" ({a.device})" if a.device else ""))
        text.append(f"  {m.run_id}", style="dim")
        return text

    def _paint_progress(self) -> None:
        m = self.model
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=max(1, m.total), progress=min(m.step, max(1, m.total)))
        parts = [f"step {m.step}/{m.total or '?'}"]
        if m.epoch is not None:
            parts.append(f"epoch {m.epoch}")
        if m.finished:
            parts.append(f"took {duration(m.duration_s(time.time()))}")
        elif (eta := eta_text(m.eta_s, m.attempts[-1].windows if m.attempts else None)) is not None:
            parts.append(eta)
        if m.loss is not None:
            parts.append(f"loss {m.loss:.4g}")
        for k, v in list(m.metrics.items())[:2]:
            parts.append(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}")
        self.query_one("#progress-text", Static).update("  ".join(parts), layout=False)

    def _paint_plots(self) -> None:
        m = self.model
        series, unit = (m.steps_series, "steps/s") if self.show_steps else (m.samples_series, "samples/s")
        now = m.steps_per_s if self.show_steps else m.samples_per_s
        xs, ys = series.points()
        self._plotted = bool(xs)
        self.query_one("#rate-plot", SeriesPlot).show(xs, ys, m.marks, title=rate_text(now, unit))
        xs, ys = m.loss_series.points()
        loss = f"loss {m.loss:.4g}" if m.loss is not None else "loss"
        self.query_one("#loss-plot", SeriesPlot).show(xs, ys, m.marks, title=loss)

    def _paint_log(self) -> None:
        # The tail that fits, as one update: writing each line to a RichLog cost ~1 ms a line.
        log = self.query_one("#log", Static)
        rows = max(1, log.content_size.height or 2)
        width = max(10, log.content_size.width or 76)
        tail = list(itertools.islice(reversed(self.model.log), rows))[::-1]
        log.update(Text("\n".join(line[:width] for line in tail), no_wrap=True), layout=False)

    # ------------------------------------------------------------ actions

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
        self.action_detach()

    def action_logs(self) -> None:
        self.app.push_screen(LogScreen(self.run))

    def action_toggle_rate(self) -> None:
        self.show_steps = not self.show_steps
        self._last_plot = 0.0  # the user asked: now, not at the next plot time
        self._dirty.add("plots")
        self._schedule_paint()

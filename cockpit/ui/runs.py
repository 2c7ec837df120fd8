"""The runs screen: every run with status, workload, device, throughput and duration; open a
past one (replayed from its events) or attach to a live one."""

from __future__ import annotations

import dataclasses
import time

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from cockpit.headless import duration
from engine.run import resume as resumption, supervisor
from engine.errors import ConfigError
from engine.numbers import rate
from engine.run.rundir import RunDir, RunSummary, list_runs, summarize

STATUS_STYLE = {"running": "bold cyan", "finished": "green", "stopped": "yellow",
                "failed": "bold red", "lost": "red", "interrupted": "yellow", "created": "dim", "broken": "bold red"}


def live_runs() -> list[RunDir]:
    """Runs whose supervisor is alive and whose events say running, newest first."""
    live = []
    for run in list_runs():
        if run.supervisor_pid() is None:
            continue
        try:
            if summarize(run).status == "running":
                live.append(run)
        except ConfigError:
            continue
    return live


def when(s: RunSummary) -> str:
    """'11-23 11:04', local time, when the run started (else from its id's timestamp)."""
    if s.started is not None:
        return time.strftime("%m-%d %H:%M", time.localtime(s.started))
    run_id = s.id
    stamp = run_id[:15]
    if len(stamp) == 15 and stamp[8] == "-" and stamp.replace("-", "").isdigit():
        return f"{stamp[4:6]}-{stamp[6:8]} {stamp[9:11]}:{stamp[11:13]}"
    return run_id[:11]


def devices(s: RunSummary) -> str:
    """The presets the run went through, each with the device it resolved to: auto(cpu)→cpu."""
    parts = []
    for a in s.attempts:
        part = a.preset if a.device in ("?", a.preset, None) else f"{a.preset}({a.device})"
        if not parts or parts[-1] != part:
            parts.append(part)
    return "→".join(parts) or s.device_preset


@dataclasses.dataclass
class RunsLoaded(Message):
    rows: list[tuple[RunDir, RunSummary]]


class RunsScreen(Screen):
    BINDINGS = [
        Binding("enter", "open", "Open / attach", priority=True),
        Binding("s", "stop", "Stop run"),
        Binding("r", "resume", "Resume run"),
        Binding("f5", "refresh", "Refresh"),
        Binding("escape", "app.pop_screen", "Back"),
    ]
    DEFAULT_CSS = """
    RunsScreen DataTable { height: 1fr; }
    #run-detail { height: 3; padding: 0 1; background: $boost; }
    """

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[RunDir, RunSummary]] = []

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Static("loading runs…", id="run-detail")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("when", "status", "workload", "device", "samples/s", "time", "att")
        self.load()

    def on_screen_resume(self) -> None:
        self.load()

    @work(thread=True, exclusive=True, group="runs-load", exit_on_error=False)
    def load(self) -> None:
        # Summaries read every events file: off the UI thread, handed over by message.
        rows = []
        for run in list_runs():
            try:
                rows.append((run, summarize(run)))
            except ConfigError:
                continue
        self.post_message(RunsLoaded(rows))

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        table = self.query_one(DataTable)
        keep = table.cursor_row
        table.clear()
        self.rows = message.rows
        for run, s in self.rows:
            speed = rate(s.samples_per_s) if s.samples_per_s is not None else "-"
            table.add_row(when(s), Text(s.status, style=STATUS_STYLE.get(s.status, "")), s.workload,
                          devices(s), Text(speed, justify="right"), Text(duration(s.duration_s), justify="right"),
                          str(len(s.attempts)), key=run.id)
        if self.rows:
            table.move_cursor(row=min(keep, len(self.rows) - 1))
            self._show_detail(table.cursor_row)
        else:
            self.query_one("#run-detail", Static).update("no runs yet: pick presets and press r on the launch screen")

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail(event.cursor_row)

    def _show_detail(self, row: int) -> None:
        if not 0 <= row < len(self.rows):
            return
        run, s = self.rows[row]
        crash = next((a for a in s.attempts if a.crash), None)
        lines = [f"{run.id}  step {s.step}/{s.total_steps}" + (f"  loss {s.loss:.4g}" if s.loss is not None else "")
                 + "".join(f"  {k} {v:.4g}" for k, v in s.metrics.items() if isinstance(v, float))]
        if crash:
            lines.append(f"attempt {crash.attempt}: {crash.crash}")
        if s.error:
            lines.append(s.error)
        lines.append(str(run.path))
        self.query_one("#run-detail", Static).update("\n".join(lines))

    def _selected(self) -> RunDir | None:
        row = self.query_one(DataTable).cursor_row
        return self.rows[row][0] if 0 <= row < len(self.rows) else None

    def action_open(self) -> None:
        run = self._selected()
        if run is not None:
            self.app.open_run(run)

    def action_stop(self) -> None:
        run = self._selected()
        if run is not None and supervisor.request_stop(run):
            self.notify(f"asked {run.id} to stop")
        elif run is not None:
            self.notify(f"{run.id} is not running", severity="warning")

    def action_resume(self) -> None:
        run = self._selected()
        if run is not None:
            self.resume(run)

    @work(thread=True, exclusive=True, group="runs-resume", exit_on_error=False)
    def resume(self, run: RunDir) -> None:
        """Continue the run on the preset its last attempt ran on (what `cockpit runs resume`
        does without -d), then watch it. Checking it may load torch: off the UI thread."""
        try:
            resumption.prepare(run)
        except ConfigError as e:
            self.app.call_from_thread(self.notify, e.line(), severity="warning")
            return
        self.app.call_from_thread(self.app.open_run, run, start=True)

    def action_refresh(self) -> None:
        self.load()

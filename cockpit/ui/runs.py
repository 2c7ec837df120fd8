"""The runs screen: every run with status, workload, device, average throughput, duration and
id; open a past one (replayed from its events) or attach to a live one, read its logs, mark
two or more (space) and compare them (c).

The id column shows each id whole where the width allows; narrower, the end of it that tells
the runs apart (their ids share a date prefix), the whole one in the detail line below. It
refreshes itself every REFRESH_S while shown. Each run is a digest (engine.record.digest): a
finished run's events are read once, a live run's only as they are appended."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Protocol, cast

from rich.cells import cell_len
from rich.measure import Measurement
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from cockpit.comparison import devices
from cockpit.present.words import STATUS_STYLE, average_rate, duration, throughput_parts
from cockpit.ui.compare import CompareScreen
from cockpit.ui import machines
from engine.run import adoption, detached, resume as resumption
from engine.run.launchers import adopted
from engine.errors import ConfigError
from engine.numbers import count, metric, rate
from engine.record.digest import RunDigest, RunDigests
from engine.record.rundir import RunDir, RunSummary, list_runs
from engine.record.stats import Averages

REFRESH_S = 3.0
MARK = "●"


class RunOpener(Protocol):
    """The app as a screen asks it to show a run (cockpit.app.CockpitApp.open_run): named by what
    it does, so that no screen imports the app, which imports the screens."""

    def open_run(self, run: RunDir, *, start: bool = False) -> object: ...


def opener(app: App) -> RunOpener:
    return cast(RunOpener, app)


# Digests of the runs with a live supervisor, kept between calls of live_runs(); those of runs
# on several machines, their machines'.
_live: dict[Path, RunDigest] = {}
_live_several = machines.GatheredRuns()
_live_lock = threading.Lock()


def live_runs() -> list[RunDir]:
    """Runs whose supervisor is alive and whose events say running, newest first. It is asked
    on the UI thread (start-up, the launch screen's return, the palette): after the first look
    at a live run, a call reads only what the run appended since the last (summarizing a
    five-hour run's events from the start takes a second)."""
    with _live_lock:
        runs = list_runs()
        several = {run.path: found for run in runs if (found := _live_several.machines(run)) is not None}
        # here, or a SLURM job's node; a run on several machines: a supervisor of one of them
        alive = [run for run in runs if (several[run.path].supervised() if run.path in several
                                         else run.supervised())]
        for gone in set(_live) - {run.path for run in alive}:
            del _live[gone]
        _live_several.forget({run.path for run in alive})
        live = []
        for run in alive:
            if run.path in several:
                gathered = several[run.path].summary()
                status = gathered[0].status if gathered is not None else "broken"
            else:
                digest = _live.setdefault(run.path, RunDigest(run))
                digest.refresh()
                status = digest.summarized.status
            if status == "running":
                live.append(run)
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


def id_tails(run_id: str) -> list[str]:
    """The ends of a run id at its '-', shortest first ('2bcd', 'auto-2bcd', ...), without
    the whole id: a run's id is its start time, workload, device preset and a random token
    (RunDir.create), so the end tells runs apart where their shared date prefix does not."""
    parts = run_id.split("-")
    return ["-".join(parts[i:]) for i in range(len(parts) - 1, 0, -1)]


def shown_ids(ids: list[str], room: int) -> dict[str, str]:
    """Each id as the id column shows it in `room` cells: whole where it fits, else '…' and the
    longest end of it that fits and no other id ends with (the token alone, without the '…',
    where only that fits); the whole id is in the detail line below the table."""
    shown = {}
    for run_id in ids:
        if cell_len(run_id) <= room:
            shown[run_id] = run_id
            continue
        others = [other for other in ids if other != run_id]
        unique = [t for t in id_tails(run_id) if not any(o == t or o.endswith("-" + t) for o in others)]
        if not unique:
            shown[run_id] = run_id
        elif fitting := [t for t in unique if cell_len(t) + 1 <= room]:
            shown[run_id] = "…" + fitting[-1]
        else:
            shown[run_id] = unique[0]
    return shown


class RunId:
    """The id column's cell: the run's id (str() and comparisons: what the table holds) drawn
    as `shown`, the part of it the column has room for."""

    def __init__(self, run_id: str, shown: str | None = None):
        self.id = run_id
        self.shown = shown or run_id

    def __str__(self) -> str:
        return self.id

    def __rich_console__(self, console, options):
        yield Text(self.shown, no_wrap=True, end="")

    def __rich_measure__(self, console, options) -> Measurement:
        return Measurement(cell_len(self.shown), cell_len(self.shown))


@dataclasses.dataclass
class RunsLoaded(Message):
    rows: list[tuple[RunDir, RunSummary]]
    averages: dict[str, Averages]     # by run id


class RunsScreen(Screen):
    BINDINGS = [
        # Short names: with stop on a live run they still fit one 80-column footer.
        Binding("enter", "open", "Open", priority=True,
                tooltip="a past run replayed from its events; a live one attached"),
        Binding("space", "mark", "Mark", tooltip="mark or unmark the run for a comparison"),
        Binding("c", "compare", "Compare", tooltip="the marked runs' curves overlaid and what differs"),
        Binding("l", "logs", "Logs", tooltip="the run's events and its attempts' output"),
        Binding("s", "stop", "Stop", tooltip="stop the running run: it checkpoints, then exits"),
        Binding("r", "resume", "Resume",
                tooltip="continue a stopped, failed or interrupted run from its newest checkpoint"),
        Binding("a", "adopt", "Adopt", tooltip="follow a training process cockpit did not start, by its PID"),
        # It refreshes itself every REFRESH_S; f5 for the impatient.
        Binding("f5", "refresh", "Refresh", show=False, tooltip="read the runs dir again now"),
        Binding("escape", "app.pop_screen", "Back"),
    ]
    HELP = """\
Every run in the runs dir, newest first: status, workload, the device presets it went through,
its average throughput over its training time, duration, attempts and id; it refreshes itself
every few seconds. `enter` opens one: a past run is replayed from its events, a live one is
attached. Mark two or more with `space` and press `c` to compare them: their loss and eval
curves overlaid, and the settings in which they differ (`cockpit runs compare` headless). `a`
adopts a process cockpit did not start, by its PID (`cockpit adopt PID` headless): a run that
follows it, marked "adopted" in the device column.
"""
    DEFAULT_CSS = """
    RunsScreen DataTable { height: 1fr; }
    #run-detail { height: 3; padding: 0 1; background: $boost; }
    """
    COLUMNS = (MARK, "when", "status", "workload", "device", "samples/s", "time", "att", "id")

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[RunDir, RunSummary]] = []
        self.averages: dict[str, Averages] = {}
        self.marked: set[str] = set()   # run ids, kept across refreshes
        # Kept by the screen while it lives: each refresh reads only what runs appended.
        self._digests = RunDigests()
        self._several = machines.GatheredRuns()   # the runs on several machines: theirs
        self._refresh_timer = None
        self._shown_ids: dict[str, str] = {}   # run id -> what the id column shows of it
        self._overflow = 0   # cells the laid-out table came out wider than _id_room said, at this width
        self._resuming: set[str] = set()       # run ids r is checking before they continue

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Static("loading runs…", id="run-detail")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for name in self.COLUMNS:
            table.add_column(name, key=name)
        self.watch(table, "virtual_size", self._check_overflow, init=False)
        self.load()
        self._refresh_timer = self.set_interval(REFRESH_S, self.load)

    def on_screen_resume(self) -> None:
        self.load()
        if self._refresh_timer is not None:
            self._refresh_timer.resume()

    def on_screen_suspend(self) -> None:
        # Another screen is on top: nobody sees this one, so it reads nothing.
        if self._refresh_timer is not None:
            self._refresh_timer.pause()

    @work(thread=True, exclusive=True, group="runs-load", exit_on_error=False)
    def load(self) -> None:
        # The first look reads every events file: off the UI thread, handed over by message.
        digests = self._digests.refresh()
        rows, averages = [], {}
        for d in digests:
            summary, average = d.summarized, d.averages
            # a run on several machines has no events of its own: its machines' gathered
            if (not d.state.events_seen and (found := self._several.machines(d.run)) is not None
                    and (gathered := found.summary()) is not None):
                summary, average = gathered
            rows.append((RunDir(d.run.path), summary))
            averages[d.run.id] = average
        self._several.forget({d.run.path for d in digests})
        self.post_message(RunsLoaded(rows, averages))

    def _cells(self, run: RunDir, s: RunSummary) -> tuple:
        status = "resuming" if run.id in self._resuming else s.status
        style = STATUS_STYLE.get(status, "")
        return (MARK if run.id in self.marked else "", when(s), Text(status, style=style),
                s.workload, devices(s), Text(average_rate(self.averages.get(run.id)), justify="right"),
                Text(duration(s.duration_s), justify="right"), str(len(s.attempts)),
                RunId(run.id, self._shown_ids.get(run.id)))

    def _id_room(self) -> int | None:
        """Cells the id column has before the table must scroll sideways; None before the table
        is laid out. Measured from the cells, not the table's columns (it sizes them later)."""
        table = self.query_one(DataTable)
        width, height = table.size
        if not width:
            return None
        if len(self.rows) + 1 > height:   # rows and the header: a vertical scrollbar
            width -= table.styles.scrollbar_size_vertical
        pad = 2 * table.cell_padding
        cells = [self._cells(run, s) for run, s in self.rows]
        used = sum(max([cell_len(name), *(cell_len(str(row[i])) for row in cells)]) + pad
                   for i, name in enumerate(self.COLUMNS[:-1]))
        return width - used - pad - self._overflow

    def _fit_ids(self) -> bool:
        """Choose what the id column shows of each id for the table's width; True if it changed."""
        room = self._id_room()
        ids = [run.id for run, _ in self.rows]
        shown = {i: i for i in ids} if room is None else shown_ids(ids, room)
        changed, self._shown_ids = shown != self._shown_ids, shown
        return changed

    def on_resize(self) -> None:
        self._overflow = 0
        self.call_after_refresh(self._refit_ids)

    def _refit_ids(self) -> bool:
        """The id cells redrawn where what they show changed; True if any did."""
        if not self._fit_ids():
            return False
        table = self.query_one(DataTable)
        for run, _ in self.rows:
            if run.id in table.rows:
                table.update_cell(run.id, "id", RunId(run.id, self._shown_ids.get(run.id)),
                                  update_width=True)
        return True

    def _check_overflow(self) -> None:
        """The table as laid out (its widths measured anew: its virtual size changed), against
        the room its ids were fitted to: wider than its room (a cell the table measured
        otherwise than _id_room; CI saw the ids cut by a cell at 80 columns), the ids give up
        the difference. Once they fit, nothing: the table's next change comes back here."""
        table = self.query_one(DataTable)
        room = table.scrollable_content_region.width
        over = table.virtual_size.width - room
        if not room or over <= 0 or self._refit_ids():   # a refit for this width first
            return
        self._overflow += over
        if not self._refit_ids():   # the ids already at their shortest: nothing to give
            self._overflow -= over

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        table = self.query_one(DataTable)
        keep = table.cursor_row
        selected = self._selected()
        same_runs = [r.id for r, _ in message.rows] == [r.id for r, _ in self.rows]
        self.rows, self.averages = message.rows, message.averages
        self.marked &= {r.id for r, _ in self.rows}
        self._show_marks()
        self._fit_ids()
        if same_runs and table.row_count == len(self.rows):
            # Cell by cell: the cursor and the scroll stay where the user left them. Each changed
            # cell sizes its column anew, up or down: a run first read mid-copy or mid-start
            # grows its device and rate cells, and the id column shrinks to make room.
            for run, s in self.rows:
                for name, value in zip(self.COLUMNS, self._cells(run, s)):
                    old = table.get_cell(run.id, name)
                    if str(old) != str(value) or getattr(old, "shown", None) != getattr(value, "shown", None):
                        table.update_cell(run.id, name, value, update_width=True)
        else:
            table.clear()
            for column in table.columns.values():   # sized anew by the rows (clear keeps widths)
                column.content_width = cell_len(str(column.label))
            for run, s in self.rows:
                table.add_row(*self._cells(run, s), key=run.id)
        if self.rows:
            if not same_runs:   # on the run it was on, wherever a new run put it
                ids = [r.id for r, _ in self.rows]
                keep = ids.index(selected.id) if selected is not None and selected.id in ids else keep
                table.move_cursor(row=min(keep, len(self.rows) - 1))
            self._show_detail(table.cursor_row)
        else:
            self.query_one("#run-detail", Static).update("no runs yet: pick presets and press r on the launch screen")
        self.refresh_bindings()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_detail(event.cursor_row)
        self.refresh_bindings()   # Stop is offered on a running run only, Resume on the others

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in ("stop", "resume"):
            row = self.query_one(DataTable).cursor_row if self.is_mounted else -1
            running = 0 <= row < len(self.rows) and self.rows[row][1].status == "running"
            # A finished run is told why it cannot be resumed (r); a running one has nothing to
            # offer but stop, and the footer says so.
            return running if action == "stop" else not running
        return True

    def _show_detail(self, row: int) -> None:
        if not 0 <= row < len(self.rows):
            return
        run, s = self.rows[row]
        crash = next((a for a in s.attempts if a.crash), None)
        a = self.averages.get(run.id)
        main = (f"  {s.main_metric} {metric(s.main_metric_value)}"
                if s.main_metric is not None and s.main_metric_value is not None and s.main_metric not in s.metrics
                else "")
        speed = throughput_parts(a.samples_per_s, a.steps_per_s, a.tokens_per_s) if a is not None and a.train_s else []
        lines = [f"{run.id}  step {s.step}/{s.total_steps}" + (f"  loss {metric(s.loss)}" if s.loss is not None else "")
                 + main + "".join(f"  {k} {metric(v)}" for k, v in s.metrics.items() if isinstance(v, float))
                 + "".join(f"  {part} avg" for part in speed)
                 + (f"  {rate(a.gflop_s)} GFLOP/s" if a is not None and a.gflop_s else "")
                 + (f"  {count(a.steps_lost, 'step')} lost" if a is not None and a.steps_lost else "")]
        if run.id in self._resuming:
            lines.append("resuming: checking it can continue from its newest checkpoint")
        if crash:
            lines.append(f"attempt {crash.attempt}: {crash.crash}")
        if s.error:
            lines.append(s.error)
        lines.append(str(run.path))
        self.query_one("#run-detail", Static).update("\n".join(lines))

    def _selected(self) -> RunDir | None:
        row = self.query_one(DataTable).cursor_row
        return self.rows[row][0] if 0 <= row < len(self.rows) else None

    def action_mark(self) -> None:
        run = self._selected()
        if run is None:
            return
        self.marked ^= {run.id}
        self.query_one(DataTable).update_cell(run.id, MARK, MARK if run.id in self.marked else "")
        self._show_marks()

    def _show_marks(self) -> None:
        """How many are marked, in the header: the next step is c (None: the app's subtitle)."""
        n = len(self.marked)
        self.sub_title = None if not n else f"{n} marked: c compares them" if n > 1 else \
            "1 marked: mark another to compare"

    def action_compare(self) -> None:
        chosen = [run for run, _ in self.rows if run.id in self.marked]
        if len(chosen) < 2:
            self.notify(f"{len(chosen)} run marked: mark two or more with space, then press c to compare them",
                        severity="warning")
            return
        self.app.push_screen(CompareScreen(chosen))

    def action_logs(self) -> None:
        run = self._selected()
        if run is None:
            return
        from cockpit.ui.logs import LogScreen   # here: the runs screen opens without it

        self.app.push_screen(LogScreen(machines.shown(run)[0]))   # a run on several machines: its lead's

    def action_open(self) -> None:
        run = self._selected()
        if run is not None:
            opener(self.app).open_run(run)

    def action_stop(self) -> None:
        run = self._selected()
        if run is not None and machines.several(run):
            if asked := machines.stop(run):
                self.notify(f"asked {run.id} to stop on {', '.join(asked)}: every machine stops after the same step")
            else:
                self.notify(f"{run.id} has no machine running here", severity="warning")
        elif run is not None and detached.request_stop(run):
            self.notify(f"asked {run.id} to stop")
        elif run is not None:
            self.notify(f"{run.id} is not running", severity="warning")

    def action_resume(self) -> None:
        row = self.query_one(DataTable).cursor_row
        if not 0 <= row < len(self.rows) or self.rows[row][0].id in self._resuming:
            return
        run, s = self.rows[row]
        if s.status in resumption.RESUMABLE:   # (a finished one is told why not, at once)
            self._set_resuming(run, True)
        self.resume(run)

    @work(thread=True, exclusive=True, group="runs-resume", exit_on_error=False)
    def resume(self, run: RunDir) -> None:
        """Continue the run on the preset its last attempt ran on (what `cockpit runs resume`
        does without -d), then watch it. Checking it may load torch: off the UI thread, its row
        saying 'resuming' meanwhile."""
        try:
            resumption.prepare(run)
        except BaseException as e:
            self.app.call_from_thread(self._set_resuming, run, False)
            if not isinstance(e, ConfigError):
                raise
            self.app.call_from_thread(self.notify, e.line(), severity="warning")
            return
        self.app.call_from_thread(opener(self.app).open_run, run, start=True)
        self.app.call_from_thread(self._set_resuming, run, False)

    def _set_resuming(self, run: RunDir, resuming: bool) -> None:
        if resuming:
            self._resuming.add(run.id)
        else:
            self._resuming.discard(run.id)
        for row, (r, s) in enumerate(self.rows):
            if r.id == run.id:
                status = self._cells(r, s)[self.COLUMNS.index("status")]
                self.query_one(DataTable).update_cell(run.id, "status", status, update_width=True)
                self._refit_ids()   # a wider status leaves the ids less room
                if row == self.query_one(DataTable).cursor_row:
                    self._show_detail(row)
                    self.refresh_bindings()

    def action_adopt(self) -> None:
        from cockpit.ui.adopt import AdoptScreen   # here: the runs screen opens without it

        def adopt(found: "adoption.Adoption | None") -> None:
            if found is not None:
                self.start_adopted(found)

        self.app.push_screen(AdoptScreen(), adopt)

    @work(thread=True, exclusive=True, group="runs-adopt", exit_on_error=False)
    def start_adopted(self, found: "adoption.Adoption") -> None:
        """Its run directory and the supervisor that follows it, detached (it outlives the
        cockpit, as any run does); then its dashboard, attached."""
        try:
            run = adoption.create(found)
            adopted.start_detached(run)
        except ConfigError as e:
            self.app.call_from_thread(self.notify, e.line(), severity="warning")
            return
        self.app.call_from_thread(opener(self.app).open_run, run)
        self.app.call_from_thread(self.load)

    def action_refresh(self) -> None:
        self.load()

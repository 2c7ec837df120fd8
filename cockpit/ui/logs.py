"""The log view: a run's events as the headless printer words them (cockpit.present), and an
attempt's own output (attempt-N.log: the trainer's or the user's command's stdout and stderr),
switchable, or side by side at WIDE columns; it fills the terminal, scrolls, follows a live run,
jumps to a crash's traceback and searches.

Threading: two worker threads read the files (engine.record.attempt_log.LogLines reads only a log's
tail, then only what was appended; events go through engine.record.events.EventFollower) and only
post_message what they read. Switching attempts restarts the output reader; a generation number
tells its messages from those a cancelled reader may still post.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.events import Click
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Input
from textual.worker import get_current_worker

from cockpit.present.transcript import Transcript
from cockpit.ui.widgets.log_pane import LogPane
from engine.record.attempt_log import LogLines, last_traceback, logged_attempts
from engine.record.events import EventFollower
from engine.record.rundir import RunDir

POLL_S = 0.25      # how often the files are looked at: a log view need not be faster
WIDE = 160         # columns from which events and output are shown side by side
STAMP = len("12:34:56")


@dataclass
class AttemptInfo:
    preset: str = "?"
    outcome: str = "running"
    builtin: bool = False           # cockpit's own trainer ran it, not the user's command
    crash: dict | None = None
    crash_line: int | None = None   # the crash's line in the events pane


class EventLines:
    """Events folded into the events pane's lines (the headless printer's transcript, a log
    file's rhythm: a progress line per LOG_EVERY_S of the run, every crash, fallback, eval and
    warning), each stamped with its local time, and what the attempts did."""

    def __init__(self, main_metric: str = ""):
        self._transcript = Transcript(main_metric=main_metric)
        self.count = 0
        self.attempts: dict[int, AttemptInfo] = {}

    def add(self, events: list[dict]) -> list[str]:
        lines: list[str] = []
        for e in events:
            # one event at a time, to stamp each event's lines with its time
            text = "".join(line + "\n" for line in self._transcript.see(e))
            kind, n = e.get("type"), e.get("attempt")
            if kind == "attempt_started" and n is not None:
                # a command's attempt_started names the command it ran (engine.run.launch)
                self.attempts[n] = AttemptInfo(preset=e.get("preset", "?"), builtin="command" not in e)
            elif kind == "attempt_ended" and n in self.attempts:
                self.attempts[n].outcome = e.get("outcome", "?")
            if not text:
                continue
            stamp = time.strftime("%H:%M:%S", time.localtime(e.get("t", 0)))
            for line in text.rstrip("\n").split("\n"):
                # (a crash's text starts with the attempt's last step line, written on its end)
                if kind == "crash" and n is not None and " crashed: " in line:
                    info = self.attempts.setdefault(n, AttemptInfo(preset=e.get("preset", "?")))
                    info.crash, info.crash_line = e, self.count + len(lines)
                # continuation lines (advice, a traceback's excerpt) are indented, unstamped
                lines.append(f"{' ' * STAMP if line.startswith(' ') else stamp} {line}")
        self.count += len(lines)
        return lines


def event_style(line: str) -> str | None:
    if " crashed: " in line or "no further attempt" in line or "run failed" in line:
        return "bold red"
    if "warning:" in line or "fallback:" in line or ": world " in line:   # a machine of several lost or back
        return "yellow"
    return None


def output_style(line: str) -> str | None:
    return "bold red" if line.startswith("Traceback") or "Error:" in line[:80] else None


def _label(pane: LogPane, title: str, subtitle: str) -> None:
    # only when changed: setting a border title repaints the whole pane, same text or not
    if pane.border_title != title:
        pane.border_title = title
    if pane.border_subtitle != subtitle:
        pane.border_subtitle = subtitle


@dataclass
class EventsRead(Message):
    lines: list[str]
    attempts: dict[int, AttemptInfo] = field(default_factory=dict)


@dataclass
class OutputRead(Message):
    generation: int
    lines: list[str]
    partial: str
    reset: bool
    skipped: int


class LogScreen(Screen):
    AUTO_FOCUS = ""   # keys belong to the screen; the search field takes focus only when opened
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("v", "switch_view", "View", tooltip="events or the attempt's output"),
        Binding("left_square_bracket", "attempt(-1)", "Attempt", key_display="[ ]",
                tooltip="the previous attempt's output (] the next)"),
        Binding("right_square_bracket", "attempt(1)", "Next attempt", show=False,
                tooltip="the next attempt's output"),
        Binding("x", "traceback", "Traceback"),
        Binding("slash", "search", "Search", key_display="/"),
        Binding("n", "find(True)", "Next match", show=False),
        Binding("N", "find(False)", "Previous match", show=False),
        Binding("w", "wrap", "Wrap", show=False),
        Binding("f,end", "follow", "Follow", show=False),  # the pane says "paused · f follows"
        Binding("home", "top", "Top", show=False),
        Binding("up", "scroll('up')", "Scroll up", show=False),
        Binding("down", "scroll('down')", "Scroll down", show=False),
        Binding("pageup", "scroll('page_up')", "Page up", show=False),
        Binding("pagedown", "scroll('page_down')", "Page down", show=False),
        Binding("left", "scroll('left')", "Scroll left", show=False),
        Binding("right", "scroll('right')", "Scroll right", show=False),
    ]
    HELP = """\
A run's log: its **events** as `cockpit --no-ui` prints them (a progress line every 30 s of the
run, every eval, checkpoint, warning, crash and fallback), and an attempt's **output**
(attempt-N.log: the trainer's or your command's stdout and stderr). Below 160 columns one at
a time (`v` switches), side by side from 160 (`v` picks which one the keys move). It follows
the end while lines arrive; scrolling up pauses that, `f` or `end` resumes. `x` opens the
crashed attempt's output at its traceback (or its crash event, when it died without one).
A big log is read from its last 4 MB; the whole is in the run directory.
"""
    DEFAULT_CSS = """
    LogScreen { layout: vertical; }
    LogScreen #panes { height: 1fr; }
    LogScreen #panes LogPane { display: none; width: 1fr; height: 1fr; }
    LogScreen #panes LogPane.current { display: block; }
    LogScreen.wide #panes LogPane { display: block; }
    /* side by side, an attempt with no output leaves the events its room: a strip for its word */
    LogScreen.wide.-no-output #panes #output { width: 34; }
    LogScreen #search { display: none; dock: bottom; margin-bottom: 1; }
    LogScreen #search.open { display: block; }
    """

    def __init__(self, run: RunDir, attempt: int | None = None):
        super().__init__()
        self.run = run
        self.attempt = attempt
        self.pinned = attempt is not None    # chosen by the user: a new attempt does not move it
        self.attempts: dict[int, AttemptInfo] = {}
        self.view = "output" if attempt is not None else "events"
        self.skipped = 0                     # bytes of the shown attempt log before its tail
        self._generation = 0
        self._traceback_pending = False      # jump to the traceback once the output is read
        self._output_read = False            # the shown attempt's log has been read once

    def compose(self) -> ComposeResult:
        with Horizontal(id="panes"):
            # wrapped: at 80 columns most event lines and traceback paths are longer than a row
            yield LogPane(event_style, wrap=True, indent=STAMP + 1, id="events")
            yield LogPane(output_style, wrap=True, indent=4, id="output")
        yield Input(placeholder="search (enter finds, esc closes)", id="search")
        yield Footer(compact=True)  # every key and "? Help" within 80 columns

    def on_mount(self) -> None:
        if self.attempt is None:
            self.attempt = self._newest_log()
        self._show_view()
        self._titles()
        self.read_events()
        self._read_output()

    def on_resize(self) -> None:
        self.set_class(self.size.width >= WIDE, "wide")
        self._titles()

    # ------------------------------------------------------------ reading (worker threads)

    @work(thread=True, exclusive=True, group="log-events", exit_on_error=False)
    def read_events(self) -> None:
        worker = get_current_worker()
        follower, folded = EventFollower(self.run.events_path), EventLines(self.run.main_metric())
        while not worker.is_cancelled:
            events = follower.poll()
            if events:
                lines = folded.add(events)
                attempts = {n: AttemptInfo(**vars(a)) for n, a in folded.attempts.items()}
                self.post_message(EventsRead(lines, attempts))
            time.sleep(POLL_S)

    def _read_output(self) -> None:
        self._generation += 1
        self._output_read = False
        self.query_one("#output", LogPane).replace([])
        if self.attempt is not None:
            self.read_output(self.attempt, self._generation)

    @work(thread=True, exclusive=True, group="log-output", exit_on_error=False)
    def read_output(self, attempt: int, generation: int) -> None:
        worker = get_current_worker()
        log = LogLines(self.run.attempt_log(attempt))
        first, shown_partial = True, None
        while not worker.is_cancelled:
            lines, reset = log.read()
            partial = log.shown_partial()
            if lines or reset or first or partial != shown_partial:
                self.post_message(OutputRead(generation, lines, partial, reset or first, log.skipped))
            first, shown_partial = False, partial
            time.sleep(POLL_S)

    def on_events_read(self, message: EventsRead) -> None:
        message.stop()
        new = [n for n in message.attempts if n not in self.attempts]
        self.attempts = message.attempts
        self.query_one("#events", LogPane).append(message.lines)
        if new and not self.pinned and max(new) != self.attempt:
            self.attempt = max(new)     # following the run: its newest attempt's output
            self._read_output()
        self._titles()

    def on_output_read(self, message: OutputRead) -> None:
        message.stop()
        if message.generation != self._generation:
            return   # from the reader of an attempt no longer shown
        pane = self.query_one("#output", LogPane)
        if message.reset:
            self._output_read = True
            self.skipped = message.skipped
            pane.replace(message.lines, message.partial)
        else:
            pane.append(message.lines, message.partial)
        if self._traceback_pending and message.reset:
            self._traceback_pending = False
            self._show_traceback()
        self._titles()

    # ------------------------------------------------------------ what is shown

    def _newest_log(self) -> int | None:
        logged = logged_attempts(self.run.path)
        return logged[-1] if logged else None

    def _known_attempts(self) -> list[int]:
        return sorted(set(self.attempts) | ({self.attempt} if self.attempt is not None else set()))

    def current_pane(self) -> LogPane:
        return self.query_one(f"#{self.view}", LogPane)

    def _show_view(self) -> None:
        for pane in self.query(LogPane):
            pane.set_class(pane.id == self.view, "current")

    def _titles(self) -> None:
        events = self.query_one("#events", LogPane)
        _label(events, f"events · run {self.run.id}", self._state(events))
        output = self.query_one("#output", LogPane)
        if self.attempt is None:
            title = "output · no attempt yet"
        else:
            info = self.attempts.get(self.attempt)
            about = f" ({info.preset}, {info.outcome})" if info else ""
            title = (f"output · attempt {self.attempt}/{max(self._known_attempts())}{about}"
                     f" · {self.run.attempt_log(self.attempt).name}")
        skipped = f"{self.skipped / 1e6:,.1f} MB before not shown · " if self.skipped else ""
        _label(output, title, skipped + self._state(output))
        said = self._no_output()
        output.say_when_empty(said)
        self.set_class(bool(said), "-no-output")

    def _no_output(self) -> str:
        """Why the output pane is empty ('' while it has lines, or its log is not read yet)."""
        output = self.query_one("#output", LogPane)
        if self.attempt is None:
            return "no attempt yet: an attempt's output (attempt-N.log) is shown here once one starts"
        if output.line_count or not self._output_read:
            return ""
        n, info = self.attempt, self.attempts.get(self.attempt)
        yet = " yet" if info is None or info.outcome == "running" else ""
        if info is not None and info.builtin:
            where = "on the left" if self.has_class("wide") else "v shows them"
            return (f"no output from attempt {n}{yet}: cockpit's own trainer writes its steps, losses "
                    f"and evals as events ({where}), and here only errors and its closing line")
        return f"no output from attempt {n}{yet}: {self.run.attempt_log(n).name} is empty"

    def _state(self, pane: LogPane) -> str:
        searched = ""
        if pane.search_query:
            where = (f"line {pane.match + 1}, match {pane.match_number()} of {pane.match_count()}"
                     if pane.match is not None else "no match")
            searched = f"/{pane.search_query}: {where} · "
        return searched + ("following" if pane.following else "paused · f follows")

    # ------------------------------------------------------------ actions

    def action_back(self) -> None:
        search = self.query_one("#search", Input)
        if search.has_class("open"):
            search.remove_class("open")
            self.set_focus(None)
        else:
            self.dismiss()

    def on_click(self, event: Click) -> None:
        # side by side, a click picks the pane the keys move
        if isinstance(event.widget, LogPane) and event.widget.id not in (None, self.view):
            self.view = event.widget.id
            self._show_view()

    def action_switch_view(self) -> None:
        self.view = "output" if self.view == "events" else "events"
        self._show_view()

    def action_attempt(self, delta: int) -> None:
        known = self._known_attempts()
        if not known:
            self.notify("this run has no attempt yet", severity="warning")
            return
        i = known.index(self.attempt) if self.attempt in known else len(known) - 1
        self._choose_attempt(known[(i + delta) % len(known)])

    def _choose_attempt(self, n: int) -> None:
        self.pinned = True
        self._traceback_pending = False   # x asked for the attempt shown before; this one is chosen
        self.view = "output"
        self._show_view()
        if n != self.attempt:
            self.attempt = n
            self._read_output()
        self._titles()

    def action_traceback(self) -> None:
        """The crashed attempt's output at its traceback: the shown attempt's crash, else the
        run's last one; a crash that left no traceback (a native crash) shows its crash event."""
        crashed = [n for n, info in sorted(self.attempts.items()) if info.crash is not None]
        if not crashed:
            self.notify("no attempt of this run crashed")
            return
        n = self.attempt if self.attempt in crashed else crashed[-1]
        self.pinned, self.view = True, "output"
        self._show_view()
        if n != self.attempt:
            self.attempt = n
            self._read_output()
        if self._output_read:
            self._show_traceback()
        else:
            self._traceback_pending = True   # shown when the reader has read the log
        self._titles()

    def _show_traceback(self) -> None:
        output = self.query_one("#output", LogPane)
        at = last_traceback(output.lines)
        if at is not None:
            output.go_to(at, mark=True)
            self._titles()
            return
        info = self.attempts.get(self.attempt) if self.attempt is not None else None
        if info is None or info.crash is None:
            return   # this attempt did not crash: its output stays as it is
        self.view = "events"
        self._show_view()
        events = self.query_one("#events", LogPane)
        if info.crash_line is not None:
            events.go_to(info.crash_line, mark=True)
        kind = info.crash.get("kind", "crash")
        self.notify(f"attempt {self.attempt} left no Python traceback in its output ({kind}): "
                    "its crash event is shown")
        self._titles()

    def action_search(self) -> None:
        search = self.query_one("#search", Input)
        search.add_class("open")
        search.focus()

    def on_input_submitted(self, message: Input.Submitted) -> None:
        message.stop()
        message.input.remove_class("open")
        self.set_focus(None)
        self._find(message.value.strip(), True)

    def action_find(self, forward: bool) -> None:
        pane = self.current_pane()
        if not pane.search_query:
            self.action_search()
            return
        self._find(pane.search_query, forward, again=True)

    def _find(self, query: str, forward: bool, again: bool = False) -> None:
        """Search the current pane; `again` (n, N): say so where the match did not move on (the
        only one) or went round the end, which the pane alone would not show."""
        pane = self.current_pane()
        before = pane.match if query == pane.search_query else None
        found = pane.search(query, forward)
        if found is None and query:
            self.notify(f"no match for {query!r} in the {self.view}", severity="warning")
        elif found is not None and again:
            count, number = pane.match_count(), pane.match_number()
            if count == 1:
                self.notify(f"{query!r}: the only match in the {self.view} (line {found + 1})", timeout=3)
            elif before is not None and (found <= before if forward else found >= before):
                end = "top" if forward else "bottom"
                self.notify(f"{query!r}: from the {end} again, match {number} of {count} "
                            f"(line {found + 1})", timeout=3)
        self._titles()

    def action_wrap(self) -> None:
        pane = self.current_pane()
        pane.set_wrap(not pane.wrap)

    def action_follow(self) -> None:
        self.current_pane().follow()
        self._titles()

    def action_top(self) -> None:
        pane = self.current_pane()
        pane.unfollow()
        pane.scroll_home(animate=False, immediate=True)
        self._titles()

    def action_scroll(self, how: str) -> None:
        pane = self.current_pane()
        if how in ("up", "page_up"):
            pane.unfollow()
        getattr(pane, f"scroll_{how}")(animate=False)
        self._titles()

"""Adopting a process from the runs screen (a): its PID and, where its output does not go to a
file cockpit can find (always on macOS), its log file; `cockpit adopt` headless. The process is
checked here (engine.run.adoption.inspect, a few small reads) so that a PID that is wrong is said
in the dialog, which stays open to fix it."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Static

from engine.errors import ConfigError
from engine.run import adoption


class AdoptScreen(ModalScreen["adoption.Adoption | None"]):
    BINDINGS = [Binding("escape", "cancel", "Cancel", tooltip="back, nothing adopted")]
    DEFAULT_CSS = """
    AdoptScreen { align: center middle; }
    AdoptScreen > Vertical { width: 72; max-width: 100%; height: auto; border: thick $primary;
                             background: $surface; padding: 0 1; }
    AdoptScreen Input { margin: 0; }
    AdoptScreen #adopt-error { color: $error; height: auto; }
    AdoptScreen Horizontal { height: auto; }
    AdoptScreen Button { margin-right: 1; }
    """

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static("[b]Adopt a process cockpit did not start[/b]: it is followed (progress "
                         "from its log, memory, its end), never signalled unless you stop the run.")
            yield Input(placeholder="PID (pgrep -f train.py)", id="adopt-pid", type="integer")
            yield Input(placeholder="its log file (default: its stdout's file, on Linux)", id="adopt-log")
            yield Static("", id="adopt-error")
            with Horizontal():
                yield Button(Content("Adopt [enter]"), id="adopt", variant="primary")
                yield Button(Content("Cancel [esc]"), id="cancel")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.adopt()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "adopt":
            self.adopt()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

    def adopt(self) -> None:
        text = self.query_one("#adopt-pid", Input).value.strip()
        log = self.query_one("#adopt-log", Input).value.strip() or None
        error = self.query_one("#adopt-error", Static)
        if not text.isdigit():
            error.update(f"PID: got {text!r}; expected a process id (a number)")
            return
        try:
            found = adoption.inspect(int(text), log)
        except ConfigError as e:
            error.update(e.line())
            return
        self.dismiss(found)

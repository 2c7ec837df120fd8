"""Quitting while a run is live: stop it, or leave it running (it outlives the cockpit)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from engine.record.rundir import RunDir


class QuitScreen(ModalScreen[str | None]):
    BINDINGS = [
        Binding("s", "choose('stop')", "Stop it and quit", tooltip="the run checkpoints, then exits"),
        Binding("l", "choose('leave')", "Leave it running", tooltip="quit; the run goes on, cockpit attaches again"),
        Binding("escape", "choose(None)", "Cancel", tooltip="back, nothing changed"),
    ]
    DEFAULT_CSS = """
    QuitScreen { align: center middle; }
    QuitScreen > Vertical { width: 64; max-width: 100%; height: auto; border: thick $warning; background: $surface; padding: 1 2; }
    QuitScreen Horizontal { height: auto; margin-top: 1; }
    QuitScreen Button { margin-right: 1; }
    """

    def __init__(self, runs: list[RunDir]):
        super().__init__()
        self.runs = runs

    def compose(self) -> ComposeResult:
        names = "\n".join(f"  {r.id}" for r in self.runs)
        with Vertical():
            yield Static(f"[b]A run is still going:[/b]\n{names}\n\n"
                         "Stop it (it checkpoints first), or leave it running? A run left "
                         "running goes on without the cockpit; `cockpit` attaches to it again.")
            with Horizontal():
                # Content, not a str: a str label is markup, where "[s]" is strike-through
                # and vanished from the button (the key hints were lost at every size)
                yield Button(Content("Stop it [s]"), id="stop", variant="error")
                yield Button(Content("Leave running [l]"), id="leave", variant="primary")
                yield Button(Content("Cancel [esc]"), id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None if event.button.id == "cancel" else event.button.id)

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)

"""The Textual app: screens are in cockpit/ui/, one per file; this holds them together.

Start-up: if a run is live (its supervisor alive), the cockpit attaches to the newest one —
that is how a run left running, or cut off by an SSH hangup, is picked up again. Quitting
while a run this session watched is still live asks: stop it, or leave it running.
"""

from __future__ import annotations

from typing import Iterable

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from cockpit.ui.dashboard import DashboardScreen
from cockpit.ui.help import HelpScreen
from cockpit.ui.launch import LaunchScreen
from cockpit.ui.quit import QuitScreen
from cockpit.ui.runs import RunsScreen, live_runs
from engine.run import supervisor
from engine.run.rundir import RunDir


class CockpitApp(App):
    TITLE = "cockpit"
    SUB_TITLE = "PyTorch training on the machine you have"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark,f1", "help", "Help", key_display="?"),
        Binding("o", "runs", "Runs", show=False),
    ]

    def __init__(self, *, attach: bool = True):
        super().__init__()
        self.attach_on_start = attach
        self.watched: dict[str, RunDir] = {}   # runs this session started or attached to

    def on_mount(self) -> None:
        self.push_screen(LaunchScreen())
        if self.attach_on_start:
            live = live_runs()
            if live:
                self.open_run(live[0])
                self.notify(f"attached to live run {live[0].id}"
                            + (f" ({len(live) - 1} more live: see runs)" if len(live) > 1 else ""))

    # ------------------------------------------------------------ navigation

    def open_run(self, run: RunDir, *, start: bool = False) -> DashboardScreen:
        """Show a run: start it, attach to it if live, or replay it from its events."""
        screen = DashboardScreen(run, start=start)
        if start or run.supervisor_pid() is not None:
            self.watched[run.id] = run
        self.push_screen(screen)
        return screen

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_runs(self) -> None:
        if not isinstance(self.screen, RunsScreen):
            self.push_screen(RunsScreen())

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Runs", "History of runs: open a past one or attach to a live one",
                            self.action_runs)
        yield SystemCommand("Help", "Keys and screens", self.action_help)
        live = live_runs()
        if live:
            yield SystemCommand("Attach", f"Attach to the live run {live[0].id}",
                                lambda: self.open_run(live[0]))

    # ------------------------------------------------------------ quitting

    def live_watched(self) -> list[RunDir]:
        return [r for r in self.watched.values() if r.supervisor_pid() is not None]

    async def action_quit(self) -> None:
        live = self.live_watched()
        if not live:
            self.exit()
            return

        def decided(choice: str | None) -> None:
            if choice == "stop":
                for run in live:
                    supervisor.request_stop(run)
                self.exit(message=f"asked {len(live)} run(s) to stop; they checkpoint and exit")
            elif choice == "leave":
                self.exit(message="left running: " + ", ".join(r.id for r in live)
                          + " (cockpit attaches again; cockpit runs follow last)")

        self.push_screen(QuitScreen(live), decided)


def make_app(*, attach: bool = True) -> CockpitApp:
    """The one factory for the app, used by `cockpit` and by the tests."""
    return CockpitApp(attach=attach)

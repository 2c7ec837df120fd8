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
from cockpit.ui.help import HelpScreen, KeyCommands, key_commands
from cockpit.ui.launch import LaunchScreen
from cockpit.ui.quit import QuitScreen
from cockpit.ui.runs import RunsScreen, live_runs
from engine.run import detached
from engine.record.rundir import RunDir


class CockpitApp(App):
    TITLE = "cockpit"
    # the palette: the keys of the screen it is opened on and the app's, then Textual's own
    COMMANDS = {KeyCommands} | App.COMMANDS
    SUB_TITLE = "PyTorch training on the machine you have"
    BINDINGS = [
        Binding("q", "quit", "Quit", tooltip="asks what to do with a live run this session watched"),
        Binding("question_mark,f1", "help", "Help", key_display="?", tooltip="the keys of this screen"),
        Binding("o", "runs", "Runs", show=False, tooltip="every run: open a past one, attach to a live one"),
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
        if start or run.supervised():
            self.watched[run.id] = run
        self.push_screen(screen)
        return screen

    def on_dashboard_screen_stale(self, message: DashboardScreen.Stale) -> None:
        """A dashboard shown again after its run went on (resumed since it ended there): a
        fresh one in its place, which reads the run as it is now."""
        screen = DashboardScreen(message.run)
        if message.run.supervised():
            self.watched[message.run.id] = message.run
        self.switch_screen(screen)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.screen))

    def action_runs(self) -> None:
        if not isinstance(self.screen, RunsScreen):
            self.push_screen(RunsScreen())

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's own entries (theme, screenshot...) and attaching to a live run; the keys
        of the screen and the app come from KeyCommands."""
        # Textual's Quit: ours asks about a live run. Textual's Keys: its panel squeezes the
        # screen (at 80x24 the dashboard's panels lose their text) and Esc does not close it;
        # Help (?) lists the keys of the screen, in words.
        titles = {command.title for command in key_commands(screen, self)} | {"Keys"}
        for command in super().get_system_commands(screen):
            if command.title not in titles:
                yield command
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
                    detached.request_stop(run)
                self.exit(message=f"asked {len(live)} run(s) to stop; they checkpoint and exit")
            elif choice == "leave":
                self.exit(message="left running: " + ", ".join(r.id for r in live)
                          + " (cockpit attaches again; cockpit runs follow last)")

        self.push_screen(QuitScreen(live), decided)


def make_app(*, attach: bool = True) -> CockpitApp:
    """The one factory for the app, used by `cockpit` and by the tests."""
    return CockpitApp(attach=attach)

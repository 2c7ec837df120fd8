"""The Textual app. Until the TUI lands this is a welcome screen that points at --no-ui."""

from __future__ import annotations

from textual.app import App, ComposeResult
from textual.widgets import Footer, Header, Static

from engine import presets

WELCOME = """\
[b]cockpit[/b] — a terminal cockpit for PyTorch training

The full-screen cockpit (pick, edit, run, watch, recover) is not built yet.
Everything already works headless:

  cockpit --no-ui                          a short run of the default workload
  cockpit --no-ui --workload W --device D  run a workload on a device preset
  cockpit presets list                     what you can run
  cockpit runs list                        what ran

Workload presets: {workloads}
Device presets:   {devices}
"""


class CockpitApp(App):
    TITLE = "cockpit"
    BINDINGS = [("q", "quit", "Quit")]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(WELCOME.format(
            workloads=", ".join(r.name for r in presets.list_presets("workloads")),
            devices=", ".join(r.name for r in presets.list_presets("devices"))), id="welcome")
        yield Footer()


def make_app() -> CockpitApp:
    """The one factory for the app, used by `cockpit` and by the tests."""
    return CockpitApp()

"""The help screen: what each screen is for and its keys."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# cockpit

**Launch** — pick a workload (what to train) and a device preset (how), add `--set`-style
overrides (`batch_size=16 train.epochs=2`), check the resolved configuration, run.
`r` run · `e` edit the highlighted preset · `p` probe · `o` runs · `a` attach to a live run ·
`tab` next pane

**Editor** — every field of the preset, checked as you type by the same rules as preset
files; changed fields are marked against the shipped preset. `ctrl+s` save to your preset
dir · `ctrl+o` save as a new name · `esc` back. Shipped presets are never written: saving
one puts your copy in your preset dir, where it shadows the shipped one.

**Run** — progress and ETA, throughput (`t`: samples/s or steps/s) and loss over time, the
eval metric, memory (pressure, swap, RSS, device memory), every attempt with how it ended,
the evidence, the fallback taken and where it resumed; the log. `s` stop gracefully
(checkpoint, then exit) · `d` detach: the run goes on without the cockpit · `esc` back.

**Probe** — times real training steps of the workload on every device here (the CPU at 1,
physical and logical threads), each in its own process, within a budget (60 s): samples/s
(median and the middle half of its windows), peak memory, pressure, crashes as results, and
the recommendation in a sentence. `p` measure (asks the budget; enter) · `u` use the best
(sets device and threads as overrides) · `b` find the largest micro-batch that fits the
device preset and keeps memory pressure normal and swap flat (asks an optional memory limit
such as 6G) · `s` save that as a new device preset · `esc` back.

**Runs** — every run with status, workload, device, throughput and duration. `enter` opens
one: a past run is replayed from its events, a live one is attached. `s` stop · `r` resume
a stopped, failed or interrupted run from its newest checkpoint, on the preset its last
attempt ran on · `f5` refresh.

**Anywhere** — `ctrl+p` command palette · `?` this help · `q` quit (asks what to do with a
live run). A run is its own process: closing the terminal or losing SSH leaves it running,
and `cockpit` attaches to it again.

Headless, the same: `cockpit --no-ui`, `cockpit runs list|show|follow|stop|resume`, `cockpit presets`,
`cockpit probe [--find-batch]`.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss(None)", "Close", key_display="esc")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 100; height: 90%; border: thick $primary; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(HELP)

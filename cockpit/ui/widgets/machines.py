"""The machines panel: a run on several machines, a row each -- its name (▸ the machine whose
dashboard this is), status, step, world (machines x processes on each), samples/s and RSS --
and the sentence of a machine lost, shortened to a line.

Where the panel has fewer lines than that (80x24: two), the sentence of a machine lost and not
back takes the place of its row's world, rate and memory (the others' are left to the log and
the attempts panel), and past its lines the machines not shown are counted by status in the
last one. The columns line up; on a narrow panel the rightmost figures go first (memory, then
the rate, then the world). The panel reads the machines itself, every READ_S while its screen
is shown, in a worker thread (cockpit.ui.machines: each machine only what its events grew by).
Hidden for a run of one machine (the dashboard does not compose it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text
from textual import work
from textual.message import Message
from textual.timer import Timer
from textual.widgets import Static

from cockpit.present.words import STATUS_STYLE
from cockpit.ui.machines import Machines
from engine.numbers import rate, size
from engine.record.nodes import NodeView

LOST_STYLE = "yellow"
READ_S = 2.0              # the panel reads the run's machines this often
MACHINE_LINES = (2, 8)    # its lines in a short terminal (the dashboard's -short), and else


def world_text(v: NodeView) -> str:
    """'world 2x4': machines x processes on each, as its newest trainer_ready says."""
    if not v.nodes:
        return "no world yet"
    return f"world {v.nodes}x{(v.world_size or 0) // max(1, v.nodes)}"


def lost_text(v: NodeView) -> str:
    """A machine's node-lost sentence without what its row says already (its own name)."""
    sentence = (v.lost or "").strip().rstrip(".")
    own = f"This machine ({v.name}) was lost"
    return "lost" + sentence[len(own):] if sentence.startswith(own) else sentence


def cut(text: str, width: int) -> str:
    """`text` in `width` cells, '…' where it was cut."""
    if cell_len(text) <= width:
        return text
    out = ""
    for ch in text:
        if cell_len(out + ch) > width - 1:
            break
        out += ch
    return out.rstrip() + "…"


def _columns(v: NodeView, shown: str | None) -> list[tuple[str, str]]:
    """The row's cells and their styles, in order of importance."""
    mark = "▸" if v.name == shown else " "
    return [(f"{mark}{v.name}", "bold"), (v.status, STATUS_STYLE.get(v.status, "")),
            (f"step {v.step:,}", ""), (world_text(v), ""),
            (f"{rate(v.samples_per_s)} samples/s" if v.samples_per_s else "- samples/s", ""),
            (f"rss {size(v.rss)}" if v.rss else "rss -", "")]


def machine_lines(views: list[NodeView], width: int, lines: int, shown: str | None = None) -> Text:
    """The panel's text in `width` cells and at most `lines` lines (see the module)."""
    width, lines = max(10, width), max(1, lines)
    full = len(views) + sum(1 for v in views if v.lost) <= lines
    rows = views if len(views) <= lines else _kept(views, lines - 1, shown)
    cells = [_columns(v, shown) for v in rows]
    # the columns that fit in every row (a lost machine's, told compactly, keeps three)
    keep = 6
    while keep > 3 and _width(cells, keep) > width:
        keep -= 1
    widths = [max(cell_len(c[i][0]) for c in cells) for i in range(keep)]
    out: list[Text] = []
    for v, row in zip(rows, cells):
        line = Text()
        told = not full and _told(v)
        for i, (cell, style) in enumerate(row[:3 if told else keep]):
            line.append(("  " if i else "") + cell.ljust(widths[i]), style=style)
        if told:   # in the place of its world, rate and memory
            line.append("  " + cut(lost_text(v), max(1, width - line.cell_len - 2)), style=LOST_STYLE)
        line.truncate(width)
        line.rstrip()
        out.append(line)
        if full and v.lost:
            out.append(Text("   " + cut(lost_text(v), width - 3), style=LOST_STYLE))
    if len(rows) < len(views):
        named = {v.name for v in rows}
        left = Counter(v.status for v in views if v.name not in named)
        more = f" +{len(views) - len(rows)} more: " + ", ".join(f"{n} {status}" for status, n in left.items())
        out.append(Text(cut(more, width), style="dim"))
    return Text("\n").join(out)


def _told(v: NodeView) -> bool:
    """Told compactly by its sentence, not its figures: a machine lost that has not come back
    (a machine that trains or finished keeps its figures; the log and the attempts panel have
    the sentence)."""
    return bool(v.lost) and v.status not in ("running", "finished")


def _width(cells: list[list[tuple[str, str]]], keep: int) -> int:
    return sum(max(cell_len(c[i][0]) for c in cells) for i in range(keep)) + 2 * (keep - 1)


def _kept(views: list[NodeView], room: int, shown: str | None) -> list[NodeView]:
    """The `room` machines shown when not all fit: the one whose dashboard this is, then those
    lost or not running, then the rest; in their order (by name)."""
    order = sorted(views, key=lambda v: (v.name != shown, not v.lost and v.status == "running"))
    kept = {v.name for v in order[:max(1, room)]}
    return [v for v in views if v.name in kept]


class MachinesPanel(Static):
    """The machines of a run on several, under the panels and above the log: it reads them
    every READ_S while its screen is shown (each machine only what its events grew by: a worker
    thread, cockpit.ui.machines), until the dashboard's run ended and none of them runs."""

    DEFAULT_CSS = """
    MachinesPanel {
        height: auto;
        max-height: 9;
        padding: 0 1;
        border-top: round $primary 50%;
        border-title-color: $text;
    }
    /* two lines at 80x24, framed by the panels above and the log's border below */
    MachinesPanel.-short { border-top: none; }
    """

    @dataclass
    class Read(Message):
        views: list[NodeView]

    def __init__(self, machines: Machines, shown: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.machines = machines
        self.shown = shown       # the machine whose dashboard this is
        self.views: list[NodeView] = []
        self.lines = 0           # lines of the text shown
        self.ended = False       # the dashboard's run ended: no more reads once none runs
        self._timer: Timer | None = None

    def on_mount(self) -> None:
        self.border_title = "machines"
        self.read()
        self._timer = self.set_interval(READ_S, self._tick)

    def _tick(self) -> None:
        if self.screen.is_current:   # another screen on top: nobody sees it
            self.read()

    @work(thread=True, exclusive=True, group="machines", exit_on_error=False)
    def read(self) -> None:
        self.post_message(self.Read(self.machines.views()))

    def read_soon(self, *, ended: bool, changed: bool) -> None:
        """The dashboard's news: its run's world changed, or its run ended; read now."""
        if changed or ended != self.ended:
            self.ended = ended
            self.read()

    def on_machines_panel_read(self, message: Read) -> None:
        message.stop()
        self.views = message.views
        self.show()
        if self.ended and self._timer is not None and not any(v.status == "running" for v in self.views):
            self._timer.stop()   # nothing more will change

    def fit(self, *, short: bool) -> None:
        """Laid out anew (a resize): its lines for the terminal's height, its width."""
        self.set_class(short, "-short")
        self.call_after_refresh(self.show)

    def show(self) -> None:
        """The machines' rows, this dashboard's marked, in the lines the screen gives it."""
        views = self.views
        width = self.content_region.width or max(10, self.screen.size.width - 2)
        lines = MACHINE_LINES[not self.has_class("-short")]
        text = machine_lines(views, width, lines, self.shown) if views else \
            Text("no machine has written yet", style="dim")
        count = len(text.plain.split("\n"))
        # its height follows its lines: a re-layout only when their number changed
        self.update(text, layout=count != self.lines)
        self.lines = count
        running = sum(1 for v in views if v.status == "running")
        self.border_title = f"machines: {running} of {len(views)} running" if running else "machines"

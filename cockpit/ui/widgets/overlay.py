"""Several runs' lines on one pair of axes (textual-plot's PlotWidget), each in its own colour,
or a sentence in the plot's place when no run has a point to draw: empty axes, or a single
point's range of 2e-6 ("10.3339910.333910.334..."), tell nothing.
"""

from __future__ import annotations

import math

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual_plot import HiResMode, PlotWidget

from cockpit.ui.widgets.plots import LogTicks, ShortTicks

Line = tuple[list[float], list[float], str]   # xs, ys, colour


class _Axes(PlotWidget, can_focus=False):
    """Not focusable: the screen's keys stay the screen's (PlotWidget binds the arrows)."""

    def on_mount(self) -> None:
        super().on_mount()
        # Small margins: at 80x24 each plot has about 40x8 cells, axes and ticks included. The
        # x axis's name is in the border title (PlotWidget draws its label on a third margin row).
        self.margin_top, self.margin_bottom, self.margin_left = 0, 1, 7
        self.set_x_formatter(ShortTicks(4))
        self.set_y_formatter(ShortTicks(3))


class OverlayPlot(Vertical):
    DEFAULT_CSS = """
    OverlayPlot {
        border: round $primary 50%;
        border-title-color: $text;
        width: 1fr;
        height: 1fr;
    }
    OverlayPlot > _Axes { height: 1fr; }
    OverlayPlot > .empty { height: 1fr; content-align: center middle; color: $text-muted; }
    """

    def __init__(self, title: str, *, id: str | None = None):
        super().__init__(id=id)
        self.border_title = title
        self.drawn: list[Line] = []   # what the last show() drew, decimated: for tests and the curious

    def compose(self) -> ComposeResult:
        yield _Axes(allow_pan_and_zoom=False)
        yield Static(classes="empty")

    def on_mount(self) -> None:
        self.query_one(Static).display = False

    def show(self, lines: list[Line], *, title: str, empty: str, log: bool = False) -> None:
        """Draw `lines`; if none has a point, say `empty` instead. `log`: y on a log scale
        (a loss of 1e-5 is a flat line on a linear one); values <= 0 are left out there."""
        self.border_title = title
        axes, note = self.query_one(_Axes), self.query_one(Static)
        if log:
            lines = [_log(xs, ys, colour) for xs, ys, colour in lines]
        axes.set_y_formatter(LogTicks(3) if log else ShortTicks(3))
        lines = [_thin(xs, ys, colour, 4 * max(10, axes.size.width)) for xs, ys, colour in lines]
        self.drawn = [line for line in lines if line[0]]
        axes.display, note.display = bool(self.drawn), not self.drawn
        note.update(empty)
        axes.clear()
        if not self.drawn:
            return
        axes.set_xlimits(*_span([x for xs, _, _ in self.drawn for x in xs]))
        axes.set_ylimits(*_span([y for _, ys, _ in self.drawn for y in ys]))
        for xs, ys, colour in self.drawn:
            if len(xs) == 1:   # a line of one point draws nothing: mark it
                axes.scatter(xs, ys, marker="●", marker_style=colour)
            else:
                axes.plot(xs, ys, line_style=colour, hires_mode=HiResMode.BRAILLE)


def _thin(xs: list[float], ys: list[float], colour: str, most: int) -> Line:
    """At most `most` points, first and last kept: two points per braille column is all a
    line can show, and more only costs drawing time."""
    if len(xs) <= most:
        return xs, ys, colour
    step = len(xs) / most
    keep = [int(i * step) for i in range(most)] + [len(xs) - 1]
    return [xs[i] for i in keep], [ys[i] for i in keep], colour


def _log(xs: list[float], ys: list[float], colour: str) -> Line:
    kept = [(x, math.log10(y)) for x, y in zip(xs, ys) if y > 0 and math.isfinite(y)]
    return [x for x, _ in kept], [y for _, y in kept], colour


def _span(values: list[float]) -> tuple[float | None, float | None]:
    """Limits for an axis: automatic, unless every value is the same (one point, a flat
    line), where a range around it keeps the ticks readable."""
    finite = [v for v in values if v == v and abs(v) != float("inf")]
    if not finite or min(finite) != max(finite):
        return None, None
    pad = abs(finite[0]) * 0.1 or 1.0
    return finite[0] - pad, finite[0] + pad

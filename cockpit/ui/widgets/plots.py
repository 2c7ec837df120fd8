"""A time-series plot with real axes (textual-plot's PlotWidget), sized for 80x24.

The x axis is seconds since the run started; crashes and fallbacks are red vertical lines.
Not focusable: the dashboard's keys stay the dashboard's (PlotWidget binds the arrows).
"""

from __future__ import annotations

from textual_plot import HiResMode, NumericAxisFormatter, PlotWidget


class FewTicks(NumericAxisFormatter):
    """Nice ticks, but few enough that their labels never run together in a 40-column plot."""

    def __init__(self, most: int):
        super().__init__()
        self.most = most

    def get_ticks(self, min_: float, max_: float, max_ticks: int = 8) -> list[float]:
        return super().get_ticks(min_, max_, min(max_ticks, self.most))


class SeriesPlot(PlotWidget, can_focus=False):
    DEFAULT_CSS = """
    SeriesPlot {
        border: round $primary 50%;
        border-title-color: $text;
        width: 1fr;
        height: 1fr;
        min-height: 6;
    }
    """

    def __init__(self, title: str, *, style: str = "cyan", id: str | None = None):
        super().__init__(id=id, allow_pan_and_zoom=False)
        self.border_title = title
        self.line_style = style
        self._shown: tuple | None = None

    def on_mount(self) -> None:
        super().on_mount()
        # Small margins: at 80x24 each plot has about 40x8 cells, axes and ticks included.
        self.margin_top, self.margin_bottom, self.margin_left = 0, 2, 7
        self.set_xlabel("s")
        self.set_x_formatter(FewTicks(4))
        self.set_y_formatter(FewTicks(3))

    def show(self, xs: list[float], ys: list[float], marks: list[tuple[float, str]] = (),
             title: str | None = None) -> None:
        """Replace the plotted line (and the crash marks); a no-op if nothing changed."""
        if title is not None:
            self.border_title = title
        key = (len(xs), xs[-1] if xs else None, ys[-1] if ys else None, len(marks), title)
        if key == self._shown:
            return
        self._shown = key
        # Two points per braille column is all a line can show; more only costs drawing time.
        most = max(16, 2 * 2 * (self.size.width or 40))
        if len(xs) > most:
            step = len(xs) / most
            keep = [int(i * step) for i in range(most)] + [len(xs) - 1]
            xs, ys = [xs[i] for i in keep], [ys[i] for i in keep]
        self.clear()
        if xs:
            self.plot(xs, ys, line_style=self.line_style, hires_mode=HiResMode.BRAILLE)
        for x, _ in marks:
            self.add_v_line(x, line_style="red")

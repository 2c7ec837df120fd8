"""Time-series plots with real axes (textual-plot's PlotWidget), as cards: a title line, the
plot, and a sentence in its place while there is nothing to plot.

The x axis is time since the run started (ticks read 30s, 5m, 1h30); crashes are red dashed
vertical lines with a ✗ on top, in a colour no series uses (↶ where the attempt was ended to go
back before a health finding: after it the loss restarts from the checkpoint's, later in time,
so nothing is drawn backwards). Health findings are yellow glyphs on the bottom row of the plot
that shows them, under their time (cockpit.ui.findings: ▲ a loss spike, ◆ a gradient norm
explosion, ↗ divergence). The y axis can be logarithmic
(a loss of 1e-5 is not a flat line then) and the x axis a window of the newest minutes.
Plots are not focusable: the dashboard's keys stay the dashboard's (PlotWidget binds arrows).
"""

from __future__ import annotations

import math
from typing import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.css.query import NoMatches
from textual.widgets import Static
from textual_hires_canvas import Canvas
from textual_plot import HiResMode, NumericAxisFormatter, PlotWidget
from textual_plot.axis_formatter import AxisFormatter

from cockpit.ui import findings as health

CRASH_STYLE = "bold red"
CRASH_CHAR = "┆"                 # dashed: a crash reads as a marker, not as another series
LEFT_MARGIN = 7                  # y tick labels are at most 6 characters (short_number)

Line = tuple[list[float], list[float], str]   # xs, ys, Rich style
Mark = tuple[float, str]                      # x, a crash's or a health finding's kind


def short_number(v: float) -> str:
    """At most 6 characters: 12k, 1.5M, 0.25, 3e-4 -- y tick labels that fit the margin."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e3:
        return f"{v / 1e3:.3g}k"
    if a >= 1e-2:
        text = f"{v:.3g}"
        return text if len(text) <= 6 else f"{v:.2g}"
    mantissa, exponent = f"{v:.1e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def time_text(seconds: float) -> str:
    """An x tick label: 45s, 2m30, 1h05 (wider units as the run grows)."""
    seconds = round(seconds)
    if abs(seconds) < 60:
        return f"{seconds}s"
    m, s = divmod(seconds, 60)
    if m < 60:
        return f"{m}m" if s == 0 else f"{m}m{s:02d}"
    h, m = divmod(m, 60)
    return f"{h}h" if m == 0 else f"{h}h{m:02d}"


def place_labels(ticks: Sequence[tuple[int, str, bool]], width: int) -> list[tuple[int, str]]:
    """Where x tick labels start on a line `width` columns wide, from (the tick's column, its
    label, whether it is the axis' right end). Each is centred under its tick, as textual-plot
    draws it (the right end's ends there), but moved in from an edge rather than cut (a tick
    two columns from the right end read '1m3'), and left out rather than run into the label
    before it: a whole label or none."""
    placed: list[tuple[int, str]] = []
    after = -2                       # the column after the last label placed
    for column, label, at_end in ticks:
        n = len(label)
        if not label or n > width:
            continue
        start = column - n + 1 if at_end else column - n // 2 + (1 if n % 2 == 0 else 0)
        start = max(0, min(start, width - n))
        if start <= after:           # one blank column between two labels
            continue
        placed.append((start, label))
        after = start + n
    return placed


_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


class TimeTicks(AxisFormatter):
    """Ticks at round times (10s, 5m, 1h), few enough that the labels never run together."""

    def __init__(self, most: int = 4):
        self.most = most

    def get_ticks(self, min_: float, max_: float, max_ticks: int = 8) -> list[float]:
        most = max(2, min(max_ticks, self.most))
        span = max(max_ - min_, 1e-9)
        step = next((s for s in _TIME_STEPS if span / s <= most), _TIME_STEPS[-1] * math.ceil(span / (most * 86400)))
        first = math.ceil(min_ / step) * step
        return [float(first + i * step) for i in range(int((max_ - first) // step) + 1)]

    def get_labels_for_ticks(self, ticks: Sequence[float]) -> list[str]:
        return [time_text(t) for t in ticks]


class ShortTicks(NumericAxisFormatter):
    """Nice ticks (1, 2, 5 x 10^n), at most `most`, labelled by short_number."""

    def __init__(self, most: int = 3):
        super().__init__()
        self.most = most

    def get_ticks(self, min_: float, max_: float, max_ticks: int = 8) -> list[float]:
        return super().get_ticks(min_, max_, min(max_ticks, self.most))

    def get_labels_for_ticks(self, ticks: Sequence[float]) -> list[str]:
        return [short_number(t) for t in ticks]


class LogTicks(ShortTicks):
    """The axis holds log10(y): ticks at whole decades when it spans one, labelled as y."""

    def get_ticks(self, min_: float, max_: float, max_ticks: int = 8) -> list[float]:
        if max_ - min_ >= 1:
            lo, hi = math.ceil(min_), math.floor(max_)
            stride = max(1, math.ceil((hi - lo + 1) / self.most))
            return [float(d) for d in range(lo, hi + 1, stride)]
        return super().get_ticks(min_, max_, max_ticks)

    def get_labels_for_ticks(self, ticks: Sequence[float]) -> list[str]:
        return [short_number(10 ** t) for t in ticks]


class SeriesPlot(PlotWidget, can_focus=False):
    DEFAULT_CSS = """
    SeriesPlot { width: 1fr; height: 1fr; }
    """

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id, allow_pan_and_zoom=False)
        self._shown: tuple | None = None
        self.log_scale = False
        self._mark_glyphs: list[str] = []      # the glyph on top of each v-line, in order
        self.findings: list[tuple[float, str]] = []   # drawn: x (inside the x range), glyph

    def on_mount(self) -> None:
        super().on_mount()
        # The card's title line is the plot's title: no margin above, one line of x tick
        # labels below (their unit is in the labels: 30s, 5m), short y labels on the left.
        self.margin_top, self.margin_bottom, self.margin_left = 0, 1, LEFT_MARGIN
        self.set_x_formatter(TimeTicks(4))
        self.set_y_formatter(ShortTicks(3))

    def on_resize(self) -> None:
        self._shown = None  # more or fewer points fit: draw again at the next show()

    def show(self, lines: Sequence[Line], marks: Sequence[Mark] = (), findings: Sequence[Mark] = (), *,
             since: float | None = None, until: float | None = None, log: bool = False) -> None:
        """Replace the plotted lines, crash marks and health findings, x limited to [since,
        until] when given, y logarithmic when `log` (points <= 0 left out); a no-op if nothing
        changed."""
        key = (tuple((len(xs), xs[-1] if xs else None, ys[-1] if ys else None, style) for xs, ys, style in lines),
               len(marks), len(findings), since, until, log)
        if key == self._shown:
            return
        self._shown = key
        if log != self.log_scale:
            self.log_scale = log
            self.set_y_formatter(LogTicks(3) if log else ShortTicks(3))
        self.clear()
        # Two points per braille column is all a line can show; more only costs drawing time.
        most = max(16, 2 * 2 * (self.size.width or 40))
        visible = []
        for xs, ys, style in lines:
            xs, ys = _visible(xs, ys, since, log)
            if len(xs) > most:
                stride = len(xs) / most
                keep = [int(i * stride) for i in range(most)] + [len(xs) - 1]
                xs, ys = [xs[i] for i in keep], [ys[i] for i in keep]
            if xs:
                visible.append((xs, ys, style))
        self._set_limits(visible, since, until)
        for xs, ys, style in visible:
            if len(xs) == 1:   # a line needs two points: the first eval is a dot
                self.scatter(xs, ys, marker="●", marker_style=style)
            else:
                self.plot(xs, ys, line_style=style, hires_mode=HiResMode.BRAILLE)
        self._mark_glyphs = []
        for x, kind in marks:
            if since is None or since <= x <= (until if until is not None else math.inf):
                self.add_v_line(x, line_style=CRASH_STYLE)
                self._mark_glyphs.append(health.REWIND_GLYPH if kind == "health" else "✗")
        self.findings = self._placed(findings, visible, since, until)

    def _placed(self, findings: Sequence[Mark], visible: list[Line], since: float | None,
                until: float | None) -> list[tuple[float, str]]:
        """The findings inside the x range _set_limits gave: [since, until], else what the lines
        and marks span, where one said a moment after the newest point (its report's) goes at
        the right end."""
        if not visible:
            return []
        if since is not None:
            low, high = since, until if until is not None and until > since else since + 1
            return [(x, health.glyph(kind)) for x, kind in findings if low <= x <= high]
        xs = [x for line in visible for x in (line[0][0], line[0][-1])] + [v.x for v in self._v_lines]
        return [(min(x, max(xs)), health.glyph(kind)) for x, kind in findings if x >= min(xs)]

    def _set_limits(self, visible: list[Line], since: float | None, until: float | None) -> None:
        """The window's x limits; around a single x or a flat y, a range of its own: textual-plot
        widens a zero-width range by 1e-6 and its ticks run together (10.3339910.3339...)."""
        xs = [x for line in visible for x in (line[0][0], line[0][-1])]
        ys = [y for line in visible for y in (min(line[1]), max(line[1]))]
        if since is not None:
            self.set_xlimits(since, until if until is not None and until > since else since + 1)
        elif xs and max(xs) - min(xs) < 1e-9:
            self.set_xlimits(xs[0] - 1, xs[0] + 1)
        else:
            self.set_xlimits(None, None)
        if ys and max(ys) - min(ys) <= 1e-9 * max(1.0, abs(ys[0])):
            pad = 0.1 * abs(ys[0]) or 1.0
            self.set_ylimits(ys[0] - pad, ys[0] + pad)
        else:
            self.set_ylimits(None, None)

    def _render_x_ticks(self) -> None:
        # textual-plot draws the tick marks; their labels are written again, placed whole
        # (place_labels): its own cut the one near the right end of the line
        super()._render_x_ticks()
        line = self.query_one("#margin-bottom", Canvas)
        if line._canvas_size is None:
            return
        line.reset()
        ticks: Sequence[float]
        if self._x_ticks is None:
            ticks, labels = self._x_formatter.get_ticks_and_labels(self._x_min, self._x_max)
        else:
            ticks, labels = self._x_ticks, self._x_formatter.get_labels_for_ticks(self._x_ticks)
        shown = []
        for tick, label in zip(ticks, labels):
            if not self._x_min <= tick <= self._x_max:
                continue
            x, _ = self.get_pixel_from_coordinate(tick, 0.0)
            shown.append((x - (tick == self._x_min) + self.margin_left, label, tick == self._x_max))
        style = self.get_component_rich_style("plot--tick")
        for start, label in place_labels(shown, line._canvas_size.width):
            line.write_text(start, 0, f"[{style}]{label}")

    def _render_plot(self) -> None:
        super()._render_plot()
        self._render_findings()

    def _render_findings(self) -> None:
        """Each finding's glyph on the row above the frame's bottom, under its time: clear of
        the crash marks' glyphs at the top, whatever the line's height there."""
        try:
            canvas = self.query_one("#plot", Canvas)
        except NoMatches:   # refreshed before it was composed
            return
        row = self._scale_rectangle.bottom - 1
        if canvas._canvas_size is None or row < 1:
            return
        for x, glyph in self.findings:
            column, _ = self.get_pixel_from_coordinate(x, 0)
            if 0 < column < self._scale_rectangle.right:   # (the frame's columns: its ticks)
                canvas.set_pixel(column, row, glyph, style=health.STYLE)

    def _render_v_line_plot(self, vline) -> None:
        # textual-plot draws a v-line solid, like a series: dashed, with a ✗ (↶) under the frame's top
        canvas = self.query_one("#plot", Canvas)
        x, _ = self.get_pixel_from_coordinate(vline.x, 0)
        if not 0 < x < self._scale_rectangle.right:
            # on the frame's columns, where the y ticks are merged into the box drawing after
            # this: textual-plot refuses a dashed line there (a run that crashed after its one
            # step put the mark at the right edge and took the app down)
            return
        bottom = self._scale_rectangle.bottom
        canvas.draw_line(x, 1, x, bottom - 1, style=vline.line_style, char=CRASH_CHAR)
        if bottom > 1:
            top = next((g for v, g in zip(self._v_lines, self._mark_glyphs) if v is vline), "✗")
            canvas.set_pixel(x, 1, top, style=vline.line_style)


def _visible(xs: list[float], ys: list[float], since: float | None, log: bool) -> tuple[list[float], list[float]]:
    if since is not None:
        start = next((i for i, x in enumerate(xs) if x >= since), len(xs))
        xs, ys = xs[start:], ys[start:]
    if log:
        kept = [(x, math.log10(y)) for x, y in zip(xs, ys) if y > 0]
        xs, ys = [x for x, _ in kept], [y for _, y in kept]
    return xs, ys


class PlotCard(Vertical):
    """A title line over a SeriesPlot, or over a sentence while there is nothing to plot (a run
    that failed before its first step has no axes to draw: textual-plot would label a
    zero-width range with garbage)."""

    DEFAULT_CSS = """
    PlotCard { width: 1fr; height: 1fr; min-height: 6; }
    PlotCard > .card-title { height: 1; width: 1fr; padding: 0 0 0 1; background: $boost; }
    PlotCard > .card-empty { height: 1fr; width: 1fr; content-align: center middle; color: $text-muted; }
    """

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self._title: Text | None = None
        self._empty: str | None = None
        self._drawn_until: float | None = None

    def compose(self) -> ComposeResult:
        yield Static(classes="card-title")
        yield SeriesPlot()
        yield Static(classes="card-empty")

    def on_mount(self) -> None:
        self.query_one(".card-empty").display = False

    @property
    def plot(self) -> SeriesPlot:
        return self.query_one(SeriesPlot)

    @property
    def title_text(self) -> str:
        return self._title.plain if self._title is not None else ""

    @property
    def empty_text(self) -> str | None:
        """The sentence shown instead of the plot, or None while a plot is shown."""
        return self._empty

    def stale(self, since: float | None, until: float | None) -> bool:
        """Whether the time since the last drawing is a braille column (half a cell) of the
        plot or more: less would not move the line, so a five-hour run's plots are drawn every
        few minutes, a new run's at every step."""
        if self._drawn_until is None or since is None or until is None:
            return True
        columns = 2 * max(1, self.plot.size.width - LEFT_MARGIN - 2)
        return (until - self._drawn_until) * columns >= until - since

    def set_title(self, title: Text) -> None:
        if self._title is None or title != self._title:
            self._title = title
            self.query_one(".card-title", Static).update(title, layout=False)

    def show(self, lines: Sequence[Line], marks: Sequence[Mark] = (), findings: Sequence[Mark] = (), *,
             empty: str, since: float | None = None, until: float | None = None, log: bool = False) -> None:
        """Plot the lines with the crash marks and health findings, or say `empty` when none
        has a point (in the window)."""
        self._drawn_until = until
        has_points = any(_visible(xs, ys, since, log)[0] for xs, ys, _ in lines)
        if not has_points:
            if self._empty != empty:
                self._empty = empty
                self.query_one(".card-empty", Static).update(empty)
                self.query_one(".card-empty").display = True
                self.plot.display = False
            return
        if self._empty is not None:
            self._empty = None
            self.query_one(".card-empty").display = False
            self.plot.display = True
        self.plot.show(lines, marks, findings, since=since, until=until, log=log)


def fit(parts: Sequence[Text | str], width: int, sep: str = " · ") -> Text:
    """The parts, in order, for as long as they fit in `width` cells: a title drops its last
    figures on a narrow card rather than being cut mid-word."""
    out = Text()
    for part in parts:
        piece = part if isinstance(part, Text) else Text(part)
        extra = (len(sep) if out else 0) + piece.cell_len
        if out.cell_len + extra > width and out:
            break
        if out:
            out.append(sep, style="dim")
        out.append_text(piece)
    return out


def title_line(parts: Sequence[Text | str], width: int, right: str | None = None) -> Text:
    """fit() the parts, with `right` (a plot's window: 'last 5 min') kept at the right end:
    a state the keys changed is never the part dropped."""
    if not right:
        return fit(parts, width)
    left = fit(parts, max(1, width - len(right) - 2))
    return left + Text(" " * max(2, width - left.cell_len - len(right))) + Text(right, style="bold")

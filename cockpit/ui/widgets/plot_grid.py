"""The dashboard's plots: a grid of cards -- throughput, loss, the eval metrics, lr -- laid out
for the screen's size, one of them maximised on request, over the whole run or a window of
its newest minutes, loss linear or logarithmic; every plot marks the crashes, the loss plot the
training-health findings too (a glyph each, under its time: cockpit.ui.findings).

Drawing is the costly part of the screen (~15 us a plot cell: textual-plot, then Textual's
compositor), so titles follow every step but the lines are drawn at most every
plot_interval() -- PLOT_S for up to PLOT_CELLS_PER_S cells, proportionally less often for
more, at most every 3 s -- and only for cards whose newest data moves the line by a braille
column (PlotCard.stale): a new run's plots cost ~1-2% of a core at any size, a long run's less.
"""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid

from cockpit.ui.model import RunModel, Series, rate_text
from cockpit.ui.widgets.plots import PlotCard, short_number, title_line

PLOT_S = 1.0
PLOT_CELLS_PER_S = 1000      # two plots at 80x24
PLOT_S_MAX_FACTOR = 3.0
TALL = 40           # screen rows from which the cards may take two rows
CARD_COLUMNS = 45   # a card narrower than this squeezes its ticks together
# Crash marks are red (plots.CRASH_STYLE): no series is red or magenta, which reads as red.
# (hex or the basic names: Textual fails to parse Rich's bright_blue or grey35 at every paint,
# at ~2 ms each, before it falls back to Rich's)
RATE_STYLE, LOSS_STYLE, LR_STYLE = "cyan", "green", "#5f87ff"
EVAL_STYLES = ("yellow", "white", "#5fd7ff")
WINDOWS = ((None, "whole run"), (1800.0, "last 30 min"), (300.0, "last 5 min"), (60.0, "last min"))
CARDS = ("rate", "loss", "eval", "lr")


class PlotGrid(Grid):
    DEFAULT_CSS = """
    PlotGrid { grid-size: 2 1; grid-gutter: 0 1; }
    """

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self.model: RunModel | None = None
        self.ended = False              # nothing more will come: empty plots say why
        self.show_steps = False         # throughput in steps/s instead of samples/s
        self.loss_log = False
        self.window = 0                 # index into WINDOWS
        self.maximised: str | None = None   # a card's name (CARDS) while it fills the grid
        self._arranged: tuple | None = None
        self._force = True              # draw every shown card next time, stale or not
        self._interval: float | None = None
        self._findings = 0              # health findings drawn: a new one draws the loss anew

    def compose(self) -> ComposeResult:
        for name in CARDS:
            yield PlotCard(id=f"{name}-card")

    def card(self, name: str) -> PlotCard:
        return self.query_one(f"#{name}-card", PlotCard)

    def force(self) -> None:
        """Draw every shown card at the next draw: the user changed what they show."""
        self._force = True

    # ------------------------------------------------------------ layout

    def wanted(self) -> list[str]:
        """The cards worth a place: throughput and loss always (they say why they are empty),
        eval once the run reported it, lr once it changed (a constant lr is a flat line: its
        value goes in the loss card's title instead)."""
        m = self.model
        if m is None:
            return ["rate", "loss"]
        return ["rate", "loss"] + (["eval"] if m.eval_series else []) + (["lr"] if self._lr_varies() else [])

    def _lr_varies(self) -> bool:
        ys, last = self._shown.lr_series.y, self._shown.lr_series.last
        return bool(ys) and last is not None and (max(ys) > min(ys) or last[1] != ys[0])

    def place_cards(self) -> bool:
        """Which cards show, in how many columns and rows, for the screen's size; True when
        that changed."""
        width, height = self.screen.size
        wanted = self.wanted()
        if self.maximised not in wanted:
            self.maximised = None
        key = (tuple(wanted), width, height, self.maximised)
        if key == self._arranged:
            return False
        self._arranged = key
        if self.maximised is not None:
            shown, columns, rows = [self.maximised], 1, 1
        else:
            columns = min(len(wanted), max(2, width // CARD_COLUMNS))
            rows = min(1 if height < TALL else 2, math.ceil(len(wanted) / columns))
            shown = wanted[: columns * rows]
        self.styles.grid_size_columns, self.styles.grid_size_rows = columns, rows
        for name in CARDS:
            self.card(name).display = name in shown
        self._force = True       # a card shown anew, or resized, is drawn at the next draw
        self._interval = None    # and the cards are measured again once laid out
        return True

    def maximise_next(self, off: bool = False) -> None:
        """The next plot on its own (rate, loss, eval, lr), then all of them again."""
        wanted = self.wanted()
        if off or self.maximised == wanted[-1]:
            self.maximised = None
        else:
            self.maximised = wanted[wanted.index(self.maximised) + 1] if self.maximised in wanted else wanted[0]
        self.place_cards()

    def plot_interval(self) -> float:
        """Seconds between drawings of the lines: PLOT_S, longer for plots so big that
        drawing them once a second would cost more than the rest of the screen."""
        if self._interval is None:   # (a DOM query at every event cost 1% of a core)
            cells = sum(self.card(name).plot.size.area for name in CARDS if self.card(name).display)
            self._interval = PLOT_S * min(PLOT_S_MAX_FACTOR, max(1.0, cells / PLOT_CELLS_PER_S))
        return self._interval

    # ------------------------------------------------------------ painting

    def paint(self, model: RunModel, *, ended: bool, draw: bool) -> bool:
        """The cards' titles; with `draw` their lines too, for each card whose newest data
        would move its line by a braille column or more (or that the user changed). True
        when the arrangement changed (the screen hides its panels for a maximised plot)."""
        self.model, self.ended = model, ended
        m = model
        changed = self.place_cards()
        seconds: float | None
        window: str | None
        seconds, window = WINDOWS[self.window]
        until = m.elapsed(m.ended_t or m.newest_t)
        since: float | None
        if seconds is not None:
            since = max(0.0, until - seconds)
        else:
            # every card over the same span, from the first step: an eval plot lines up with
            # the loss under it
            firsts = [s.x[0] for s in (m.samples_series, m.loss_series) if s.x]
            since, window = (min(firsts) if firsts else None), None
        if len(m.health) != self._findings and draw:
            # (a finding moves no line by a braille column: staleness would not draw it)
            self._findings, self._force = len(m.health), True
        force, self._force = self._force and draw, self._force and not draw
        for name in CARDS:
            card = self.card(name)
            if card.display:
                worth = draw and (force or card.stale(since, until))
                getattr(self, f"_paint_{name}")(card, since, until, window, card.size.width or 40, worth)
        return changed

    def _empty(self, what: str, series: Series | None = None, window: str | None = None) -> str:
        if series is not None and series.last is not None and window is not None:
            return f"no {what} in the {window}"
        if self._shown.finished or self.ended:
            return f"no {what}: the run ended before its first reported step"
        return f"no {what} yet: it comes with the first reported step"

    @property
    def _shown(self) -> RunModel:
        """The model the cards show: paint() sets it before any card asks (wanted() asks
        _lr_varies only with one)."""
        assert self.model is not None
        return self.model

    def _paint_rate(self, card: PlotCard, since, until, window: str | None, width: int, draw: bool) -> None:
        m = self._shown
        # steps/s where a command's samples per step are not known: never a guessed sample count
        steps = self.show_steps or not m.samples_known
        series, unit = (m.steps_series, "steps/s") if steps else (m.samples_series, "samples/s")
        # The figure is the smoothed rate, as the headless line's (a single window jumps 141 ->
        # 2,851 on twotower); the plot keeps the windows. GFLOP/s, MFU and tokens/s scale with it.
        scale = (m.smoothed_samples_per_s / m.samples_per_s
                 if m.smoothed_samples_per_s and m.samples_per_s else 1.0)
        now = (m.steps_per_s if steps else m.samples_per_s)
        now = now * scale if now is not None else None
        averages = m.averages
        average = averages.steps_per_s if steps else averages.samples_per_s
        parts = [Text(rate_text(now, unit), style=f"bold {RATE_STYLE}")]
        if m.tokens_per_s is not None:  # a language model's own unit: before what a narrow title drops
            parts.append(Text(rate_text(m.tokens_per_s * scale, "tokens/s")))
        if average is not None:
            parts.append(Text(f"average {rate_text(average, '').strip()}"))
        if m.gflop_s:
            gflop_s = m.gflop_s * scale
            parts.append(Text(f"{gflop_s:,.1f} GFLOP/s" if gflop_s >= 1 else f"{gflop_s:.2g} GFLOP/s"))
        if m.mfu:
            parts.append(Text(f"MFU {100 * m.mfu * scale:.0f}%"))
        card.set_title(title_line(parts, width - 1, window))
        if draw:
            xs, ys = series.points(since)
            card.show([(xs, ys, RATE_STYLE)], m.marks, empty=self._empty("throughput", series, window),
                      since=since, until=until)

    def _paint_loss(self, card: PlotCard, since, until, window: str | None, width: int, draw: bool) -> None:
        # The value is the progress line's (one loss on screen, not two a frame apart).
        m = self._shown
        parts = [Text("loss", style=f"bold {LOSS_STYLE}")]
        if self.loss_log:
            parts.append(Text("log scale"))
        if m.lr is not None and not self._lr_varies():
            parts.append(Text(f"lr {short_number(m.lr)} (constant)", style="dim"))
        card.set_title(title_line(parts, width - 1, window))
        if draw:
            xs, ys = m.loss_series.points(since)
            # each at the time it was said: a moment after the report that carried it
            findings = [(m.elapsed(e.get("t")), e.get("kind", "?")) for e in m.health]
            card.show([(xs, ys, LOSS_STYLE)], m.marks, findings, empty=self._empty("loss", m.loss_series, window),
                      since=since, until=until, log=self.loss_log)

    def _paint_eval(self, card: PlotCard, since, until, window: str | None, width: int, draw: bool) -> None:
        m = self._shown
        names = list(m.eval_series)[: len(EVAL_STYLES)]
        title = Text("eval ", style="bold")
        for i, (name, style) in enumerate(zip(names, EVAL_STYLES)):
            title.append(("  " if i else "") + f"━ {name}", style=style)
        card.set_title(title_line([title], width - 1, window))
        if draw:
            lines = [(*m.eval_series[name].points(since), style) for name, style in zip(names, EVAL_STYLES)]
            card.show(lines, m.marks, empty=f"no eval in the {window or 'run'}", since=since, until=until)

    def _paint_lr(self, card: PlotCard, since, until, window: str | None, width: int, draw: bool) -> None:
        m = self._shown
        parts = [Text(f"lr {short_number(m.lr)}" if m.lr is not None else "lr", style=f"bold {LR_STYLE}")]
        card.set_title(title_line(parts, width - 1, window))
        if draw:
            xs, ys = m.lr_series.points(since)
            card.show([(xs, ys, LR_STYLE)], m.marks, empty=f"no lr in the {window or 'run'}", since=since, until=until)

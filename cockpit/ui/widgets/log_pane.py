"""A scrolling pane of log lines that only renders what is on screen (Textual's Line API), so a
log of 200,000 lines costs what its visible rows cost; it follows the end until the user scrolls
away, and highlights search matches."""

from __future__ import annotations

import re
from typing import Callable

from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

MAX_LINES = 200_000           # kept in memory; older ones are dropped from the top
MATCH = Style(color="black", bgcolor="yellow")
CURRENT_MATCH = Style(color="black", bgcolor="bright_green", bold=True)
MARKED = Style(reverse=True)     # the line a jump landed on (a traceback, a crash event)


class LogPane(ScrollView, can_focus=False):
    """Lines and an unfinished last line (a progress bar mid-redraw). Keys are the screen's: the
    pane never takes focus, so one set of bindings drives whichever pane is current."""

    DEFAULT_CSS = """
    LogPane { border: round $primary 40%; border-title-color: $text; border-subtitle-color: $text-muted; }
    LogPane.current { border: round $accent; }
    """

    def __init__(self, style_line: Callable[[str], str | None] | None = None, *, id: str | None = None):
        super().__init__(id=id)
        self.lines: list[str] = []
        self.partial = ""
        self.following = True
        self.style_line = style_line       # a line's colour (crash lines red), or None
        self.query = ""
        self._pattern: re.Pattern | None = None
        self.match: int | None = None      # the line of the current match
        self.marked: int | None = None     # the line the last jump landed on
        self._width = 0

    # ------------------------------------------------------------ content

    def replace(self, lines: list[str], partial: str = "") -> None:
        """New content (another attempt's log, or one started over), followed from its end."""
        self.lines, self.partial, self.match, self.marked = [], partial, None, None
        self.following = True
        self._width = 0
        self.append(lines, partial)

    def append(self, lines: list[str], partial: str | None = None) -> None:
        if lines:
            self.lines.extend(lines)
            self._width = max(self._width, max(map(len, lines)))
            if len(self.lines) > MAX_LINES:
                dropped = len(self.lines) - MAX_LINES
                del self.lines[:dropped]
                if self.match is not None:
                    self.match = self.match - dropped if self.match >= dropped else None
                if self.marked is not None:
                    self.marked = self.marked - dropped if self.marked >= dropped else None
                if not self.following:  # keep the same lines in view
                    self.scroll_to(y=max(0, self.scroll_y - dropped), animate=False, immediate=True)
        if partial is not None:
            self.partial = partial
        self.virtual_size = Size(self._width + 1, self.line_count)
        if self.following:
            # after the layout has taken the new size in: until then there may be no scrollbar
            # and so nothing to scroll
            self.call_after_refresh(self._scroll_end)
        self.refresh()

    @property
    def line_count(self) -> int:
        return len(self.lines) + (1 if self.partial else 0)

    def line(self, index: int) -> str:
        return self.lines[index] if index < len(self.lines) else self.partial

    # ------------------------------------------------------------ moving

    def follow(self) -> None:
        self.following = True
        self.scroll_end(animate=False, immediate=True, x_axis=False)

    def _scroll_end(self) -> None:
        if self.following:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def unfollow(self) -> None:
        self.following = False

    def go_to(self, index: int, mark: bool = False) -> None:
        """Line `index` at the top of the view, a little context above it (`mark`: highlighted
        until the next jump); following stops."""
        self.following = False
        self.marked = index if mark else None
        self._scroll_top(max(0, index - 2))
        # and again once laid out: a pane just shown has no size yet to scroll within
        self.call_after_refresh(self._scroll_top, max(0, index - 2))
        self.refresh()

    def _scroll_top(self, y: int) -> None:
        self.scroll_to(y=y, animate=False, immediate=True, force=True)

    def on_resize(self) -> None:
        # a pane shown again (or the terminal resized) had no room to keep its end in view
        if self.following:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def on_mouse_scroll_up(self) -> None:
        self.following = False

    # ------------------------------------------------------------ search

    def search(self, query: str, forward: bool = True) -> int | None:
        """The next (or previous) line holding `query` (case-insensitive), from the current match or
        else the view's top line, wrapping around; it becomes the current match and is shown."""
        if query != self.query:
            self.query, self.match = query, None
            self._pattern = re.compile(re.escape(query), re.IGNORECASE) if query else None
        if self._pattern is None or not self.line_count:
            return None
        n = self.line_count
        here = self.match if self.match is not None else int(self.scroll_y) - (1 if forward else -1)
        step = 1 if forward else -1
        for k in range(1, n + 1):
            i = (here + step * k) % n
            if self._pattern.search(self.line(i)):
                self.match = i
                self.go_to(i)
                return i
        self.match = None
        self.refresh()
        return None

    def match_count(self) -> int:
        if self._pattern is None:
            return 0
        return sum(1 for line in self.lines if self._pattern.search(line)) + \
            (1 if self.partial and self._pattern.search(self.partial) else 0)

    # ------------------------------------------------------------ rendering

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        base = self.rich_style
        if index >= self.line_count:
            return Strip.blank(width, base)
        line = self.line(index)
        text = Text(line, no_wrap=True, style=self.style_line(line) or "" if self.style_line else "")
        if index == self.marked:
            text.stylize(MARKED)
        if self._pattern is not None:
            style = CURRENT_MATCH if index == self.match else MATCH
            for found in self._pattern.finditer(line):
                text.stylize(style, found.start(), found.end())
        strip = Strip(text.render(self.app.console), text.cell_len).apply_style(base)
        return strip.crop_extend(scroll_x, scroll_x + width, base)

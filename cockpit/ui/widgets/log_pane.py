"""A scrolling pane of log lines that only renders what is on screen (Textual's Line API), so a
log of 200,000 lines costs what its visible rows cost; it follows the end until the user scrolls
away, highlights search matches, and wraps long lines (continuations indented) or cuts them.

Positions are lines (`match`, `marked`, `go_to`); rows are what the screen shows. Unwrapped,
a row is a line; wrapped, `_row_line`/`_row_start` say which line and where in it each row
starts, and `_line_row` where each line starts.
"""

from __future__ import annotations

import re
import textwrap
from bisect import bisect_left
from typing import Callable

from rich.style import Style
from rich.text import Text
from textual.cache import LRUCache
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

MAX_LINES = 200_000           # kept in memory; older ones are dropped from the top, in batches
MATCH = Style(color="black", bgcolor="yellow")
CURRENT_MATCH = Style(color="black", bgcolor="bright_green", bold=True)
MARKED = Style(reverse=True)     # the line a jump landed on (a traceback, a crash event)
EMPTY = Style(dim=True)          # what an empty pane says instead


class LogPane(ScrollView, can_focus=False):
    """Lines and an unfinished last line (a progress bar mid-redraw). Keys are the screen's: the
    pane never takes focus, so one set of bindings drives whichever pane is current."""

    DEFAULT_CSS = """
    LogPane { border: round $primary 40%; border-title-color: $text; border-subtitle-color: $text-muted; }
    LogPane.current { border: round $accent; }
    """

    def __init__(self, style_line: Callable[[str], str | None] | None = None, *, wrap: bool = False,
                 indent: int = 2, id: str | None = None):
        super().__init__(id=id)
        self.lines: list[str] = []
        self.partial = ""
        self.following = True
        self.style_line = style_line       # a line's colour (crash lines red), or None
        self.wrap = wrap
        self.indent = indent               # of a wrapped line's continuation rows
        self.search_query = ""             # the search's text (`query` is the DOM's)
        self._pattern: re.Pattern | None = None
        self.match: int | None = None      # the line of the current match
        self._found: list[int] = []        # the lines (of `lines`, not the partial) that match
        self.empty_text = ""               # said, dim, while the pane has no line
        self.marked: int | None = None     # the line the last jump landed on
        self._width = 0                    # of the longest line (unwrapped, the virtual width)
        self._wrap_width = 0               # the width rows were wrapped to
        self._row_line: list[int] = []
        self._row_start: list[int] = []
        self._line_row: list[int] = []
        # drawn rows by (line, start, end): following moves every row up, but not its drawing
        self._drawn: LRUCache[tuple[int, int, int], Strip] = LRUCache(1024)

    # ------------------------------------------------------------ content

    def replace(self, lines: list[str], partial: str = "") -> None:
        """New content (another attempt's log, or one started over), followed from its end."""
        self.lines, self.partial, self.match, self.marked = [], "", None, None
        self._found = []
        self._drawn.clear()
        self.following = True
        self._width = 0
        self._row_line, self._row_start, self._line_row = [], [], []
        self.append(lines, partial)

    def append(self, lines: list[str], partial: str | None = None) -> None:
        old = len(self.lines)
        if lines:
            self.lines.extend(lines)
            self._width = max(self._width, max(map(len, lines)))
            if self._pattern is not None:
                self._found += [old + i for i, line in enumerate(lines) if self._pattern.search(line)]
        if partial is not None:
            self.partial = partial
        if len(self.lines) > MAX_LINES * 11 // 10:
            self._drop(len(self.lines) - MAX_LINES)
        elif self.wrap and self._wrap_width:
            self._rewrap_from(old)
        self._resize()
        if self.following:
            self._scroll_end()
            # and once laid out: a horizontal scrollbar the new lines bring takes a row
            self.call_after_refresh(self._scroll_end)
        self.refresh()

    def _drop(self, dropped: int) -> None:
        top = self.line_at(int(self.scroll_y))
        del self.lines[:dropped]
        self._drawn.clear()
        shift = lambda i: i - dropped if i is not None and i >= dropped else None  # noqa: E731
        self.match, self.marked = shift(self.match), shift(self.marked)
        self._found = [i - dropped for i in self._found if i >= dropped]
        self._rewrap_from(0)
        if not self.following:  # keep the same lines in view
            self._scroll_top(self.row_of(max(0, top - dropped)))

    @property
    def line_count(self) -> int:
        return len(self.lines) + (1 if self.partial else 0)

    def line(self, index: int) -> str:
        return self.lines[index] if index < len(self.lines) else self.partial

    def say_when_empty(self, text: str) -> None:
        """What the pane says (dim, wrapped) while it has no line: why it is empty."""
        if text != self.empty_text:
            self.empty_text = text
            self.refresh()

    # ------------------------------------------------------------ rows

    @property
    def row_count(self) -> int:
        return len(self._row_line) if self._wrapped else self.line_count

    @property
    def _wrapped(self) -> bool:
        return self.wrap and self._wrap_width > 0

    def row_of(self, line: int) -> int:
        if not self._wrapped or not self._line_row:
            return line
        return self._line_row[min(line, len(self._line_row) - 1)]

    def line_at(self, row: int) -> int:
        if not self._wrapped or not self._row_line:
            return row
        return self._row_line[max(0, min(row, len(self._row_line) - 1))]

    def set_wrap(self, wrap: bool) -> None:
        top = self.line_at(int(self.scroll_y))
        self.wrap = wrap
        self._rewrap_from(0)
        self._resize()
        if self.following:
            self.call_after_refresh(self._scroll_end)
        else:
            self.call_after_refresh(self._scroll_top, self.row_of(top))
        self.refresh()

    def _rewrap_from(self, first: int) -> None:
        """Rows for lines `first` on (the old unfinished line's rows are redone: it changed)."""
        self._wrap_width = max(10, self.size.width - self.styles.scrollbar_size_vertical) \
            if self.wrap and self.size.width else 0
        if not self._wrapped:
            return
        first = min(first, len(self._line_row))
        cut = self._line_row[first] if first < len(self._line_row) else len(self._row_line)
        del self._row_line[cut:], self._row_start[cut:], self._line_row[first:]
        width, rest = self._wrap_width, max(1, self._wrap_width - self.indent)
        row_line, row_start, line_row = self._row_line, self._row_start, self._line_row
        for i in range(first, self.line_count):
            line_row.append(len(row_line))
            row_line.append(i)
            row_start.append(0)
            for start in _breaks(self.line(i), width, rest):
                row_line.append(i)
                row_start.append(start)

    def _resize(self) -> None:
        width = self._wrap_width if self._wrapped else self._width + 1
        self.virtual_size = Size(width, self.row_count)

    def on_resize(self) -> None:
        if self.wrap:
            top = self.line_at(int(self.scroll_y))
            self._rewrap_from(0)
            self._resize()
            if not self.following:
                self.call_after_refresh(self._scroll_top, self.row_of(top))
        # a pane shown again (or the terminal resized) had no room to keep its end in view
        if self.following:
            self.call_after_refresh(self._scroll_end)

    # ------------------------------------------------------------ moving

    def follow(self) -> None:
        self.following = True
        self._scroll_end()

    def _scroll_end(self) -> None:
        # forced: the scrollbar a new line calls for may not be laid out yet, and unforced
        # scrolling waits for it
        if self.following:
            self._scroll_top(self.max_scroll_y)

    def unfollow(self) -> None:
        self.following = False

    def go_to(self, index: int, mark: bool = False) -> None:
        """Line `index` at the top of the view, a little context above it (`mark`: highlighted
        until the next jump); following stops."""
        self.following = False
        if self.marked is not None or mark:
            self._drawn.clear()
        self.marked = index if mark else None
        row = max(0, self.row_of(index) - 2)
        self._scroll_top(row)
        # and again once laid out: a pane just shown has no size yet to scroll within
        self.call_after_refresh(self._scroll_top, row)
        self.refresh()

    def _scroll_top(self, y: int) -> None:
        self.scroll_to(y=y, animate=False, immediate=True, force=True)

    def on_mouse_scroll_up(self) -> None:
        self.following = False

    # ------------------------------------------------------------ search

    def search(self, query: str, forward: bool = True) -> int | None:
        """The next (or previous) line holding `query` (case-insensitive), from the current match or
        else the view's top line, wrapping around; it becomes the current match and is shown."""
        self._drawn.clear()   # the matches' colours change
        if query != self.search_query:
            self.search_query, self.match = query, None
            self._pattern = re.compile(re.escape(query), re.IGNORECASE) if query else None
            pattern = self._pattern
            self._found = [i for i, line in enumerate(self.lines) if pattern.search(line)] if pattern else []
        if self._pattern is None or not self.line_count:
            return None
        n = self.line_count
        top = self.line_at(int(self.scroll_y))
        here = self.match if self.match is not None else top - (1 if forward else -1)
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
        """How many lines hold the query (the unfinished last one included)."""
        if self._pattern is None:
            return 0
        return len(self._found) + (1 if self.partial and self._pattern.search(self.partial) else 0)

    def match_number(self) -> int | None:
        """The current match's place among them, from 1 at the top; None without one."""
        if self.match is None:
            return None
        if self.match >= len(self.lines):   # the unfinished last line
            return len(self._found) + 1
        return bisect_left(self._found, self.match) + 1

    # ------------------------------------------------------------ rendering

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row = scroll_y + y
        width = self.size.width
        base = self.rich_style
        if not self.line_count and self.empty_text:
            said = textwrap.wrap(self.empty_text, max(10, width - 1))
            if 0 <= y < len(said):
                text = Text(said[y], style=EMPTY, no_wrap=True)
                return Strip(text.render(self.app.console), text.cell_len).apply_style(base) \
                    .crop_extend(0, width, base)
        if row >= self.row_count:
            return Strip.blank(width, base)
        index, start, end = row, 0, -1
        if self._wrapped:
            index, start = self._row_line[row], self._row_start[row]
            last = row + 1 >= len(self._row_line) or self._row_line[row + 1] != index
            end = -1 if last else self._row_start[row + 1]
            scroll_x = 0
        key = (index, start, end)
        strip = self._drawn.get(key) if index < len(self.lines) else None  # (the partial changes)
        if strip is None:
            text = self._styled(index)
            if self._wrapped:
                text = text[start:] if end < 0 else text[start:end]
                if start:
                    text = Text(" " * self.indent) + text
            strip = Strip(text.render(self.app.console), text.cell_len).apply_style(base)
            self._drawn[key] = strip
        return strip.crop_extend(scroll_x, scroll_x + width, base)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._drawn.clear()   # the theme, or the pane's own colours, changed

    def _styled(self, index: int) -> Text:
        line = self.line(index)
        style = self.style_line(line) if self.style_line else None
        text = Text(line, no_wrap=True, style=style or "")
        if index == self.marked:
            text.stylize(MARKED)
        if self._pattern is not None:
            found_style = CURRENT_MATCH if index == self.match else MATCH
            for found in self._pattern.finditer(line):
                text.stylize(found_style, found.start(), found.end())
        return text


def _breaks(line: str, width: int, rest: int):
    """Where the continuation rows of `line` start, wrapped to `width` (`rest` after the first
    row, which the indent narrows): after a space in the row's second half, else mid-word."""
    start, room = 0, width
    while len(line) - start > room:
        space = line.rfind(" ", start + room // 2, start + room)
        start = space + 1 if space > 0 else start + room
        room = rest
        yield start

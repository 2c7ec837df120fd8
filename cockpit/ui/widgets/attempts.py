"""The crash/fallback panel: every attempt, the device it ran on, the training-health findings
said while it ran (a line each: what was found and what was done, cockpit.ui.findings), how it
ended, the evidence, the action taken and the step it resumed from.

Wrapped lines hang under their own paragraph (a sentence never runs back to column 0 under
the attempt's number), the text wraps before the scrollbar, and when the panel is too short
for everything (80x24) it tells the attempts compactly, a line each, but the newest crash: its
sentence, what the fallback did (retried or fell back, with the settings it changed, where it
resumes) and the attempt running now stay in view together; an attempt ended to go back
before a finding (a rewind) is told by its finding's line, which says where it went. Its title
is the longest of its wordings that fits.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

from rich.console import Console
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from cockpit.present.words import resume_text
from cockpit.ui.findings import finding_line, findings_of, went_back
from cockpit.ui.model import Attempt, RunModel
from engine.run.alert_rules import is_retry
from engine.numbers import count
from engine.text import strip_ansi

OUTCOME_STYLE = {"running": "bold cyan", "finished": "bold green", "stopped": "bold yellow"}
_MEASURE = Console(width=500, color_system=None)  # Text.wrap measures cells through a console
FINDINGS_COMPACT = 3   # an attempt's newest findings told when the panel is short (the log has all)


@dataclass
class Paragraph:
    text: Text
    indent: int = 0
    hang: int = 3      # continuation lines start this much further in than the first
    # a line that says less rather than wraps: its text for the cells it has
    fit: Callable[[int], Text] | None = None


def _value(key: str, value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={v}" for k, v in value.items()) + "}" if value else "none"
    if key == "threads" and value == 0:
        return "auto"   # 0 threads: torch's own choice, all cores
    return str(value)


def _evidence(a: Attempt, crash: dict) -> str:
    """The crash's evidence, less what the header line already says (signal, exit, last step)."""
    ev = crash.get("evidence") or {}
    parts = []
    if ev.get("signal") and ev["signal"] not in (a.exit or ""):
        parts.append(f"signal {ev['signal']}")
    if ev.get("exit_code") is not None and str(ev["exit_code"]) not in (a.exit or ""):
        parts.append(f"exit code {ev['exit_code']}")
    if ev.get("last_step") is not None and ev["last_step"] != a.last_step:
        parts.append(f"last step {ev['last_step']}")
    for key, value in ev.items():
        # (a rewind's `health` is its finding: the finding's own line says it)
        if key not in ("signal", "exit_code", "last_step", "message", "health") and value not in (None, "", [], {}):
            parts.append(f"{key.replace('_', ' ')} {value}")
    return ", ".join(parts)


def finding_paragraphs(a: Attempt, findings: Sequence[dict]) -> list[Paragraph]:
    """A line each, the glyph in the indent (as on the loss plot), the text where a crash's is."""
    return [Paragraph(Text(), 1, fit=functools.partial(finding_line, e, a)) for e in findings]


def attempt_paragraphs(a: Attempt, findings: Sequence[dict] = ()) -> list[Paragraph]:
    header = Text()
    header.append(f"#{a.attempt} ", style="bold")
    header.append(f"{a.preset} on {a.device or '?'} ({a.batch}")
    header.append(f", {a.precision})" if a.precision else ")")
    header.append("  ")
    header.append(a.outcome, style=OUTCOME_STYLE.get(a.outcome, "bold red"))
    if a.exit and a.outcome != "running":
        header.append(f" ({a.exit})", style="dim")
    if a.last_step is not None and a.outcome != "running":
        # (the running attempt's step is the progress line's: here it went stale, or cost a
        # repaint of the panel at every step)
        header.append(f" last step {a.last_step}", style="dim")
    out = [Paragraph(header, 0, 3)]
    if a.resumed_from:
        out.append(Paragraph(Text(f"resumed from {resume_text(a.resumed_from)}", style="dim"), 3, 2))
    out += finding_paragraphs(a, findings)
    if a.crash:
        out.append(Paragraph(Text(a.crash.get("sentence", ""), style="red"), 3, 2))
        if evidence := _evidence(a, a.crash):
            out.append(Paragraph(Text(f"evidence: {evidence}"), 3, 2))
        message = (a.crash.get("evidence") or {}).get("message") or ""
        if a.crash.get("kind") == "user-code" and a.crash.get("exception"):
            message = a.crash["exception"]
        # a run recorded before its evidence was cleaned may carry Rich's colour codes
        for line in strip_ansi(message).rstrip().splitlines()[-4:]:
            out.append(Paragraph(Text(line, style="dim"), 5, 2))
    if a.fallback:
        f = a.fallback
        resume = f.get("resume")
        where = f"resume at {resume_text(resume)}" if resume else "start over (no checkpoint yet)"
        # a rewind's why is its finding's line, above: not said twice
        why = "" if went_back(a, findings) else f"{f.get('why', f.get('action', '?'))}: "
        out.append(Paragraph(Text(f"→ {why}attempt {f.get('next_attempt')} on "
                                  f"{f.get('to_preset', f.get('to'))}, {where}", style="bold yellow"), 3, 2))
        changes = "; ".join(f"{k} {_value(k, x)}→{_value(k, y)}" for k, (x, y) in (f.get("changed") or {}).items())
        if changes:
            out.append(Paragraph(Text(changes, style="dim"), 5, 2))
    if a.failed_why:
        out.append(Paragraph(Text(f"✗ no further attempt: {a.failed_why}", style="bold red"), 3, 2))
    return out


def fallback_words(f: dict) -> str:
    """What a fallback did, in a few words: 'fell back to cpu, resumes at step 40', 'retried on
    mps with batch_size 32→16, resumes at step 40', '... starts over'. A retry names what it
    changed; another preset is named (the attempt's own line says its settings)."""
    to = f.get("to_preset", f.get("to", "?"))
    if is_retry(f):
        changes = ", ".join(f"{k} {_value(k, x)}→{_value(k, y)}" for k, (x, y) in (f.get("changed") or {}).items())
        what = f"retried on {to}" + (f" with {changes}" if changes else "")
    else:
        what = f"fell back to {to}"
    resume = f.get("resume")
    return what + (f" from {resume_text(resume)}" if resume else ", starting over")


def compact_paragraphs(a: Attempt, newest_crash: bool, findings: Sequence[dict] = ()) -> list[Paragraph]:
    """One attempt when the panel is short: a line each, and its newest findings' lines, but
    the newest crash's sentence (with the attempt's name in front of it) and what the fallback
    did; a rewind's finding line says both."""
    shown = finding_paragraphs(a, findings[-FINDINGS_COMPACT:])
    if len(findings) > FINDINGS_COMPACT:
        earlier = len(findings) - FINDINGS_COMPACT
        shown.insert(0, Paragraph(Text(f"{earlier} earlier finding{'s' * (earlier != 1)} in the log (l)",
                                       style="dim"), 3, 2))
    if newest_crash and a.crash and went_back(a, findings) is None:
        sentence = Text(f"#{a.attempt} {a.preset} on {a.device or '?'}: ", style="bold red")
        sentence.append(a.crash.get("sentence", ""), style="red")
        out = [Paragraph(sentence, 0, 3)]
        if a.fallback:
            out.append(Paragraph(Text(f"→ {fallback_words(a.fallback)}", style="bold yellow"), 3, 2))
        if a.failed_why:
            out.append(Paragraph(Text(f"✗ no further attempt: {a.failed_why}", style="bold red"), 3, 2))
        return out + shown
    line = Text()
    line.append(f"#{a.attempt} ", style="bold")
    line.append(f"{a.preset} on {a.device or '?'}")
    if a.outcome == "running" and a.batch:
        line.append(f" ({a.batch}" + (f", {a.precision})" if a.precision else ")"))
    line.append("  ")
    line.append(a.outcome, style=OUTCOME_STYLE.get(a.outcome, "bold red"))
    if a.last_step is not None and a.outcome != "running":
        line.append(f" after step {a.last_step}" if a.crash else f" at step {a.last_step}", style="dim")
    out = [Paragraph(line, 0, 3)] + shown
    if newest_crash and a.failed_why:   # a rewind that could not go back
        out.append(Paragraph(Text(f"✗ no further attempt: {a.failed_why}", style="bold red"), 3, 2))
    return out


def attempts_text(m: RunModel, width: int = 1000) -> Text:
    """The panel's text, wrapped to `width` with hanging indents."""
    return attempts_layout(m, width)[0]


def attempts_layout(m: RunModel, width: int, height: int | None = None) -> tuple[Text, int | None]:
    """The panel's text wrapped to `width` with hanging indents, and the line where the newest
    crashed attempt starts (None without a crash). Taller than `height` with a crash, it is
    told compactly (compact_paragraphs): the newest crash, its fallback and the attempts after
    it fit where the whole account would not."""
    if not m.attempts:
        return Text("no attempt yet", style="dim"), None
    full = _layout(m.attempts, width, lambda a: attempt_paragraphs(a, findings_of(m.health, a)))
    newest = max((i for i, a in enumerate(m.attempts) if a.crash), default=None)
    if height is None or newest is None or full[0].plain.count("\n") + 1 <= height:
        return full
    return _layout(m.attempts, width,
                   lambda a: compact_paragraphs(a, a is m.attempts[newest], findings_of(m.health, a)))


def _layout(attempts: list[Attempt], width: int, paragraphs) -> tuple[Text, int | None]:
    text, line, crash_line = Text(), 0, None
    for a in attempts:
        if a.crash:
            crash_line = line
        for p in paragraphs(a):
            for i, piece in enumerate(_wrap(p, width)):
                if line:
                    text.append("\n")
                text.append(" " * (p.indent + (p.hang if i else 0)))
                text.append_text(piece)
                line += 1
    return text, crash_line


def _wrap(p: Paragraph, width: int) -> list[Text]:
    if p.fit is not None:
        return [p.fit(max(8, width - p.indent))]
    first = max(8, width - p.indent)
    rest = max(8, width - p.indent - p.hang)
    lines = list(p.text.wrap(_MEASURE, first))
    if len(lines) <= 1:
        return lines or [Text()]
    # the first line is as wide as it may be; the rest, narrower, wrap again on their own
    for line in lines:
        line.rstrip()   # (in place) the space a line broke at
    head, tail = lines[0], Text(" ").join(lines[1:])
    rewrapped = list(tail.wrap(_MEASURE, rest))
    for line in rewrapped:
        line.rstrip()
    return [head] + rewrapped


def panel_title(crashed: bool, steps_lost: int, width: int) -> str:
    """The panel's title, the longest of its wordings that fits `width` cells."""
    lost = f"{count(steps_lost, 'step')} trained again" if steps_lost else ""
    names = ["attempts · crashes & fallbacks", "crashes & fallbacks", "attempts"] if crashed else ["attempts"]
    wordings = [" · ".join(w for w in (name, lost) if w) for name in names] + [lost or names[-1]]
    return next((w for w in wordings if len(w) <= width), wordings[-1])


class AttemptsPanel(VerticalScroll, can_focus=True):
    DEFAULT_CSS = """
    AttemptsPanel {
        border: round $primary 50%;
        border-title-color: $text;
        width: 1fr;
        height: 100%;
        scrollbar-size-vertical: 1;
        scrollbar-gutter: stable;
    }
    AttemptsPanel.crashed { border: round $error; }
    AttemptsPanel > Static { width: 1fr; }
    """

    def __init__(self, *, id: str | None = None):
        super().__init__(id=id)
        self._model: RunModel | None = None
        self._shape: tuple | None = None     # what the scroll position was chosen for
        self._lines = 0
        self._text: Text | None = None

    @property
    def lines(self) -> int:
        """The lines of what it shows now (the dashboard gives it more rows when it needs them)."""
        return self._lines

    def compose(self):
        yield Static(id="attempts-text")

    def on_mount(self) -> None:
        self.border_title = "attempts · crashes & fallbacks"

    def on_resize(self) -> None:
        if self._model is not None:
            self._shape = None   # wrapped anew: place the scroll anew too
            self.show(self._model)

    def show(self, m: RunModel) -> None:
        self._model = m
        region = self.scrollable_content_region
        text, crash_line = attempts_layout(m, region.width or 40, region.height or None)
        if text != self._text:
            lines = text.plain.count("\n") + 1
            # a longer text needs a layout pass; a changed word only a repaint
            self.query_one("#attempts-text", Static).update(text, layout=lines != self._lines)
            self._text, self._lines = text, lines
        crashed = any(a.crash for a in m.attempts)
        self.set_class(crashed, "crashed")
        title = panel_title(crashed, m.steps_lost, self.size.width - 4)
        if title != self.border_title:
            self.border_title = title
        # Scroll only when what the panel holds changes (an attempt, a crash, a fallback, an
        # end), not with every step: a user who scrolled keeps their place.
        shape = (tuple((a.attempt, a.outcome, bool(a.crash), bool(a.fallback), bool(a.failed_why)) for a in m.attempts),
                 len(m.health))   # a new finding's line comes into view
        if shape == self._shape:
            return
        self._shape = shape
        if crash_line is not None:
            self.call_after_refresh(self.scroll_to, y=crash_line, animate=False)
        elif m.status == "running":
            self.call_after_refresh(self.scroll_end, animate=False)  # the attempt now running
        else:
            self.call_after_refresh(self.scroll_home, animate=False)

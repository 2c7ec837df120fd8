"""The crash/fallback panel: every attempt, the device it ran on, how it ended, the evidence,
the action taken and the step it resumed from."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from cockpit.headless import resume_text
from cockpit.ui.model import Attempt, RunModel

OUTCOME_STYLE = {"running": "bold cyan", "finished": "bold green", "stopped": "bold yellow"}


def _value(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={v}" for k, v in value.items()) + "}"
    return str(value)


def _evidence(crash: dict) -> str:
    ev = crash.get("evidence") or {}
    parts = []
    if ev.get("signal"):
        parts.append(f"signal {ev['signal']}")
    if ev.get("exit_code") is not None:
        parts.append(f"exit code {ev['exit_code']}")
    if ev.get("last_step") is not None:
        parts.append(f"last step {ev['last_step']}")
    for key, value in ev.items():
        if key not in ("signal", "exit_code", "last_step", "message") and value not in (None, "", [], {}):
            parts.append(f"{key} {value}")
    return ", ".join(parts)


def attempt_text(a: Attempt, text: Text) -> None:
    device = a.device or "?"
    text.append(f"#{a.attempt} ", style="bold")
    text.append(f"{a.preset} on {device} ({a.batch}")
    text.append(f", {a.precision})" if a.precision else ")")
    text.append("  ")
    text.append(a.outcome, style=OUTCOME_STYLE.get(a.outcome, "bold red"))
    if a.exit and a.outcome != "running":
        text.append(f" ({a.exit})", style="dim")
    if a.last_step is not None:
        text.append(f" last step {a.last_step}", style="dim")
    if a.resumed_from:
        text.append(f"\n   resumed from {resume_text(a.resumed_from)}", style="dim")
    if a.crash:
        text.append(f"\n   {a.crash.get('sentence', '')}", style="red")
        evidence = _evidence(a.crash)
        if evidence:
            text.append(f"\n   evidence: {evidence}")
        message = (a.crash.get("evidence") or {}).get("message") or ""
        if a.crash.get("kind") == "user-code" and a.crash.get("exception"):
            message = a.crash["exception"]
        for line in message.rstrip().splitlines()[-4:]:
            text.append(f"\n     {line}", style="dim")
    if a.fallback:
        f = a.fallback
        changes = "; ".join(f"{k} {_value(x)}→{_value(y)}" for k, (x, y) in (f.get("changed") or {}).items())
        resume = f.get("resume")
        where = f"resume at {resume_text(resume)}" if resume else "start over (no checkpoint yet)"
        text.append(f"\n   → {f.get('why', f.get('action', '?'))}: attempt {f.get('next_attempt')} on "
                    f"{f.get('to_preset', f.get('to'))}, {where}", style="bold yellow")
        if changes:
            text.append(f"\n     {changes}", style="dim")
    if a.failed_why:
        text.append(f"\n   ✗ no further attempt: {a.failed_why}", style="bold red")


def attempts_text(m: RunModel) -> Text:
    text = Text()
    if not m.attempts:
        text.append("no attempt yet", style="dim")
    for i, a in enumerate(m.attempts):
        if i:
            text.append("\n")
        attempt_text(a, text)
    return text


class AttemptsPanel(VerticalScroll, can_focus=True):
    DEFAULT_CSS = """
    AttemptsPanel {
        border: round $primary 50%;
        border-title-color: $text;
        width: 1fr;
        height: 100%;
    }
    AttemptsPanel.crashed { border: round $error; }
    AttemptsPanel > Static { width: 1fr; }
    """

    def compose(self):
        yield Static(id="attempts-text")

    def on_mount(self) -> None:
        self.border_title = "attempts · crashes & fallbacks"

    def show(self, m: RunModel) -> None:
        self.query_one("#attempts-text", Static).update(attempts_text(m))
        self.set_class(any(a.crash for a in m.attempts), "crashed")
        if m.status == "running":
            self.scroll_end(animate=False)  # the attempt now running; finished runs open at the top

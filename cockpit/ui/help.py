"""Keys and help for whichever screen is showing, read from the screens themselves.

One mechanism for every screen: a screen's keys are its BINDINGS (description, and the
tooltip for the longer word), what it is for is its HELP (Textual's own attribute, markdown).
The help screen (`?`) and the command palette (KeyCommands, a source of cockpit.app's) both
list them, with the app's global keys, so a new screen's keys appear in both without being
named here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from textual.actions import parse
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.containers import VerticalScroll
from textual.dom import DOMNode
from textual.screen import ModalScreen, Screen
from textual.widgets import Markdown

ANYWHERE = """\
A run is its own process: closing the terminal or losing SSH leaves it running, and `cockpit`
attaches to it again. Headless, the same: `cockpit --no-ui`, `cockpit runs
list|show|follow|stop|resume|compare`, `cockpit presets`, `cockpit probe [--find-batch]`.
"""


@dataclass(frozen=True)
class KeyHelp:
    """One action offered by a screen or the app, with every key bound to it."""

    keys: str          # as the footer shows them: 'esc', '? / f1'
    title: str         # the binding's description: 'Stop run'
    about: str         # its tooltip, else the description
    node: DOMNode      # where the action runs (the screen, or the app for 'app.*')
    action: str        # 'choose("stop")', without the namespace

    def enabled(self) -> bool:
        """The node's own check_action: False (hidden) and None (disabled) are both 'not now'."""
        _, name, params = parse(self.action)
        return bool(self.node.check_action(name, params))


def _own_bindings(node: DOMNode) -> list[Binding]:
    """The BINDINGS the project's classes declare, base classes first; Textual's own (focus
    keys, copy, ctrl+q) are left to the app section's fixed lines."""
    bindings: list[Binding] = []
    for cls in reversed(type(node).__mro__):
        if cls.__module__.startswith("textual.") or "BINDINGS" not in cls.__dict__:
            continue
        bindings += Binding.make_bindings(cls.__dict__["BINDINGS"])
    return bindings


def _target(node: DOMNode, action: str, app: App) -> tuple[DOMNode, str]:
    """Where 'app.runs' runs, and the action without its namespace."""
    namespace, _, _ = parse(action)
    if namespace == "app":
        return app, action[len("app."):]
    if namespace == "screen":
        return (node if isinstance(node, Screen) else app.screen), action[len("screen."):]
    return node, action


def keys_of(node: DOMNode, app: App) -> list[KeyHelp]:
    """Every described action of a screen (or the app), in BINDINGS order, keys merged."""
    merged: dict[tuple[int, str], dict] = {}
    for binding in _own_bindings(node):
        if binding.system or not binding.description:
            continue
        target, action = _target(node, binding.action, app)
        entry = merged.setdefault((id(target), action), {
            "keys": [], "title": binding.description, "about": binding.tooltip or binding.description,
            "node": target, "action": action})
        shown = app.get_key_display(binding)
        if shown in entry["keys"]:  # one key_display for several keys ('?' for f1 too): name each
            shown = app.get_key_display(replace(binding, key_display=None))
        if shown not in entry["keys"]:
            entry["keys"].append(shown)
    return [KeyHelp(keys=" / ".join(e.pop("keys")), **e) for e in merged.values()]


def screen_name(screen: Screen) -> str:
    """'ProbeScreen' -> 'Probe'."""
    name = type(screen).__name__
    return name[: -len("Screen")] if name.endswith("Screen") and name != "Screen" else name


def _row(key: KeyHelp, note: str = "") -> str:
    # A list, not a table: a markdown table takes three rows a key, too many at 80x24.
    about = "" if key.about == key.title else f" — {key.about}"
    return f"- `{key.keys}` **{key.title}**{about}{note}"


def help_markdown(screen: Screen, app: App) -> str:
    """The help of `screen`: what it is for, its keys, then the keys that work everywhere."""
    own = keys_of(screen, app)
    lines = [f"# {screen_name(screen)}", ""]
    # the keys first: they are what ? is pressed for, and at 80x24 a screen's HELP can fill the view
    lines += [_row(k, "" if k.enabled() else " (not now)") for k in own] + [""]
    if help_text := type(screen).HELP:
        lines += [help_text.strip(), ""]
    here = {(id(k.node), k.action) for k in own}
    lines += ["## Anywhere", ""]
    lines += [_row(k) for k in keys_of(app, app) if (id(k.node), k.action) not in here]
    lines += [f"- `{app.COMMAND_PALETTE_DISPLAY or app.COMMAND_PALETTE_BINDING}` **Command palette** — "
              "every action of this screen and the app, by name",
              "- `tab` / `shift+tab` **Next / previous pane**", "", ANYWHERE]
    return "\n".join(lines)


def key_commands(screen: Screen, app: App) -> list[SystemCommand]:
    """The palette's entries for the keys of `screen` and the app, one per action: an action its
    node refuses now (check_action says no) is left out, and a title seen already (the
    screen's Runs and the app's) is not repeated."""
    titles, commands = set(), []
    for key in [*keys_of(screen, app), *keys_of(app, app)]:
        if key.title in titles or not key.enabled():
            continue
        titles.add(key.title)
        commands.append(SystemCommand(key.title, f"{key.about} · {key.keys}",
                                      partial(app.run_action, key.action, key.node)))
    return commands


class KeyCommands(Provider):
    """The palette's source for the keys of the screen it was opened on and the app's.

    Matched on the title and its help both: a footer's short word ('Stop', 'Rate') is found by
    what the user types for it ('stop run', 'throughput'); Textual's system commands match the
    title alone."""

    async def discover(self) -> Hits:
        for command in key_commands(self.screen, self.app):
            yield DiscoveryHit(command.title, command.callback, help=command.help)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for command in key_commands(self.screen, self.app):
            in_title = matcher.match(command.title)
            score = max(in_title, 0.9 * matcher.match(f"{command.title} {command.help}"))
            if score > 0:
                shown = matcher.highlight(command.title) if in_title else command.title
                yield Hit(score, shown, command.callback, text=command.title, help=command.help)


class HelpScreen(ModalScreen[None]):
    """The help of the screen below it (given when opened)."""

    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss(None)", "Close", key_display="esc")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 100; height: 90%; border: thick $primary; background: $surface; }
    """

    def __init__(self, screen: Screen):
        super().__init__()
        self.about = screen

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(help_markdown(self.about, self.app))

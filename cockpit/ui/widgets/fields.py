"""The editor's fields: text and choice fields with their own undo (ctrl+z), and a text field
that selects nothing when Tab moves into it (Textual's default selects all: the next key
replaced a whole description)."""

from __future__ import annotations

from typing import Any

from textual.widgets import Input, Select
from textual.widgets.input import Selection


def _typed(old: str, new: str) -> tuple[str, int] | None:
    """('insert', i) when `new` is `old` with one character put in at i, ('delete', i) when
    it is `old` less the character at i; None for any other change (a paste, a selection
    replaced, a word deleted)."""
    if abs(len(new) - len(old)) != 1:
        return None
    longer, shorter = (new, old) if len(new) > len(old) else (old, new)
    i = next((k for k, (a, b) in enumerate(zip(longer, shorter)) if a != b), len(shorter))
    if longer[:i] + longer[i + 1:] != shorter:
        return None
    return ("insert" if longer is new else "delete", i)


def _changed_end(restored: str, current: str) -> int:
    """Where the cursor goes in `restored` after an undo: the end of the part that differs
    from `current` (the end, for a whole description typed over)."""
    prefix = next((k for k, (a, b) in enumerate(zip(restored, current)) if a != b),
                  min(len(restored), len(current)))
    suffix = 0
    while (suffix < min(len(restored), len(current)) - prefix
           and restored[-1 - suffix] == current[-1 - suffix]):
        suffix += 1
    return len(restored) - suffix


class FieldInput(Input):
    """A text field of the form: focus selects nothing (Textual's default selects all, and
    the next keystroke replaced a whole description), and it keeps its own edits for
    ctrl+z (Textual's Input has no undo). A run of typed characters, or of backspaces, is one
    edit; a paste, a cut or a selection typed over is one each."""

    def __init__(self, value: str, **kwargs: Any):
        super().__init__(value, select_on_focus=False, **kwargs)
        self.edits: list[str] = []             # the value before each edit, oldest first
        self._run: tuple[str, int] | None = None   # the last edit while typing extends it
        self._undoing = False

    def cursor_to_end(self) -> None:
        """The cursor after the last character, nothing selected, in view (Tab into the field;
        a click keeps the position clicked)."""
        self.selection = Selection.cursor(len(self.value))
        self.scroll_to(x=self.max_scroll_x, animate=False, force=True)

    def on_blur(self) -> None:
        self._run = None   # typing after coming back is a new edit

    def watch_value(self, old: str, new: str) -> None:
        if not self.is_mounted or self._undoing or old == new:
            return
        typed = _typed(old, new)
        last = self._run
        if (typed is not None and last is not None and typed[0] == last[0]
                and typed[1] - last[1] in ((1,) if typed[0] == "insert" else (-1, 0))):
            self._run = typed     # the same run of typing: one edit
            return
        self.edits.append(old)
        self._run = typed

    def undo(self) -> bool:
        """The value before the last edit back, the cursor after what came back; False when
        there is no edit to undo."""
        if not self.edits:
            return False
        restored, current = self.edits.pop(), self.value
        self._undoing = True
        try:
            self.value = restored
        finally:
            self._undoing = False
        self.selection = Selection.cursor(_changed_end(restored, current))
        self._run = None
        return True


class FieldSelect(Select):
    """A choice field of the form, with its own edits for ctrl+z."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.edits: list[Any] = []
        self._undoing = False

    def watch_value(self, old: Any, new: Any) -> None:
        if self.is_mounted and not self._undoing and old != new and old is not Select.NULL:
            self.edits.append(old)

    def undo(self) -> bool:
        if not self.edits:
            return False
        self._undoing = True
        try:
            self.value = self.edits.pop()
        finally:
            self._undoing = False
        return True

"""The preset editor: a form for every field, checked as you type by the engine's own rules
(engine.schema / engine.presets: the same checks as a preset file and `--set`), what differs
from the shipped preset of the same name, save and save-as to the user's preset dir. A nested
table's keys (a device preset's [slurm]) are rows of their own, named as `--set` names them:
slurm.partition.

Shipped presets are never written: engine.presets.save_user_preset only writes the user's
dir (atomically), where a preset of a shipped name shadows the shipped one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, get_args, get_origin

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.notifications import Notification, Notify, SeverityLevel
from textual.screen import ModalScreen, Screen
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Button, Footer, Header, Input, Label, Select, Static

from cockpit.ui.widgets.fields import FieldInput, FieldSelect
from engine import files, paths, presets
from engine.errors import ConfigError
from engine.preset_types import DevicePreset, TrainSettings
from engine.schema import assign, expected, fields, leaves, parse_value, to_table, value_at


LABEL_MAX = 36   # columns: the field beside the label keeps 40+ of 80


@dataclass
class FieldSpec:
    key: str            # 'batch_size' / 'slurm.partition' (device) or 'train.epochs' / 'params.n' / 'description'
    annotation: Any
    field: Any          # dataclasses.Field, for its doc and bounds
    value: Any


def _text(value: Any) -> str:
    """A value as the user types it: TOML for lists and tables, bare for strings and numbers."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json.dumps(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def field_specs(kind: str, table: dict) -> list[FieldSpec]:
    """Every editable field of a preset, filled from its (validated) table."""
    if kind == "devices":
        return [FieldSpec(key, ann, f, value_at(table, key)) for key, (f, ann) in leaves(DevicePreset).items()]
    preset = presets.workload_from_table(table, "preset")
    specs = [FieldSpec("description", str, None, preset.description)]
    for section, cls, obj in (("train", TrainSettings, preset.train), ("params", type(preset.params), preset.params)):
        values = to_table(obj)
        specs += [FieldSpec(f"{section}.{name}", ann, f, values[name]) for name, (f, ann) in fields(cls).items()]
    return specs


def full_table(kind: str, raw: dict, where: str, base: Path | None = None) -> dict:
    """A preset file's table with every default filled in (raises ConfigError if invalid);
    `base`, the file's directory, is where a workload's relative file path starts."""
    if kind == "devices":
        return to_table(presets.device_from_table(raw, where))
    return presets.workload_to_table(presets.workload_from_table(raw, where, base))


def flat(kind: str, table: dict) -> dict[str, Any]:
    """Form key -> value: a nested table's keys dotted ('slurm.partition', 'train.epochs')."""
    if kind == "devices":
        return {key: value_at(table, key) for key in leaves(DevicePreset)}
    out = {"description": table.get("description", "")}
    for section in ("train", "params"):
        out.update({f"{section}.{k}": v for k, v in table.get(section, {}).items()})
    return out


class SaveAsScreen(ModalScreen[str | None]):
    """Ask for a preset name; the name is checked by the engine's own rule."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    DEFAULT_CSS = """
    SaveAsScreen { align: center middle; }
    SaveAsScreen > Vertical { width: 60; height: auto; border: thick $primary; background: $surface; padding: 1 2; }
    #saveas-error { color: $error; }
    """

    def __init__(self, kind: str, suggestion: str):
        super().__init__()
        self.kind, self.suggestion = kind, suggestion

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Save {self.kind[:-1]} preset as (in your preset dir):")
            yield Input(self.suggestion, id="saveas-name")
            yield Static("", id="saveas-error")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        name = event.value.strip()
        if not presets.NAME_PATTERN.match(name):
            self.query_one("#saveas-error", Static).update(
                f"{name!r} is not a preset name: letters, digits, '.', '_' and '-'")
            return
        self.dismiss(name)


class UnsavedScreen(ModalScreen[str | None]):
    """Leaving the editor with edits: save them, throw them away, or keep editing."""

    BINDINGS = [
        Binding("s", "choose('save')", "Save and leave"),
        Binding("d", "choose('discard')", "Discard edits"),
        Binding("escape", "choose(None)", "Keep editing"),
    ]
    DEFAULT_CSS = """
    UnsavedScreen { align: center middle; }
    UnsavedScreen > Vertical { width: 64; max-width: 100%; height: auto; border: thick $warning;
                               background: $surface; padding: 1 2; }
    UnsavedScreen Horizontal { height: auto; margin-top: 1; }
    UnsavedScreen Button { margin-right: 1; }
    """

    def __init__(self, preset_name: str):
        super().__init__()
        self.preset_name = preset_name

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Content.from_markup("[b]$name has unsaved edits.[/b] Save them to your preset "
                                             "dir, discard them, or keep editing?", name=self.preset_name))
            with Horizontal():
                # Content labels: in a str label "[s]" would be markup and vanish
                yield Button(Content("Save [s]"), id="save", variant="primary")
                yield Button(Content("Discard [d]"), id="discard", variant="error")
                yield Button(Content("Keep editing [esc]"), id="keep")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None if event.button.id == "keep" else event.button.id)

    def action_choose(self, choice: str | None) -> None:
        self.dismiss(choice)


class EditorScreen(Screen):
    BINDINGS = [
        Binding("ctrl+s", "save", "Save", tooltip="save to your preset dir (a shipped name: your copy shadows it)"),
        Binding("ctrl+o", "save_as", "Save as", tooltip="save under a new name in your preset dir"),
        Binding("ctrl+z", "undo", "Undo", tooltip="undo the last edit of the field you are in"),
        Binding("escape", "back", "Back", tooltip="back to launch; unsaved edits: asks save, discard or keep"),
    ]
    HELP = """\
Every field of the preset, checked as you type by the same rules as preset files; changed
fields are marked (`*`) against the shipped preset. Shipped presets are never written: saving
one puts your copy in your preset dir, where it shadows the shipped one.
"""
    DEFAULT_CSS = """
    #editor-head { height: auto; max-height: 4; padding: 0 1; background: $boost; }
    #form { height: 1fr; }
    .row { height: auto; }
    /* the width is the longest key's (set in compose); a longer key wraps, never cut */
    .row Label { padding-left: 1; }
    .row Label.changed { color: $warning; text-style: bold; }
    .row Input, .row Select { width: 1fr; }
    .note { height: auto; padding-left: 3; color: $text-muted; }
    .note.error { color: $error; text-style: bold; }
    #editor-status { height: 1; padding: 0 1; }
    """

    def __init__(self, kind: str, name: str):
        super().__init__()
        self.kind, self.preset_name = kind, name
        self.ref = presets.find(kind, name)
        raw = files.read_toml(self.ref.path)
        loaded = full_table(kind, raw, str(self.ref.path), self.ref.path.parent)
        # as loaded: a workload file's path made absolute, so the preset saves anywhere
        self.workload = loaded.get("workload") if kind == "workloads" else None
        self.specs = field_specs(kind, loaded)
        self.shipped = self._shipped_values()
        self.errors: dict[str, str] = {}
        self.saved_values: dict[str, Any] | None = None
        self.toast: Notification | None = None   # the last save's (or discard's) toast

    def _shipped_values(self) -> dict[str, Any] | None:
        path = paths.shipped_presets_dir() / self.kind / f"{self.preset_name}.toml"
        if not path.is_file():
            return None
        try:
            return flat(self.kind, full_table(self.kind, files.read_toml(path), str(path), path.parent))
        except ConfigError:
            return None

    # ------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="editor-head")
        with VerticalScroll(id="form"):
            for spec in self.specs:
                with Horizontal(classes="row"):
                    label = Label(spec.key, id=f"label-{self._fid(spec.key)}")
                    label.styles.width = self.label_width
                    yield label
                    yield self._widget(spec)
                yield Static(self._doc(spec), id=f"note-{self._fid(spec.key)}", classes="note")
        yield Static(id="editor-status")
        yield Footer()

    @property
    def label_width(self) -> int:
        """Wide enough for every key and its ' *' (changed) mark: train.checkpoint_every_steps and
        train.checkpoint_every_minutes were both cut to the same 24 characters. A key longer
        than LABEL_MAX wraps instead, so the field beside it keeps room at 80 columns."""
        return min(LABEL_MAX, 1 + max(len(s.key) for s in self.specs) + 2)

    @staticmethod
    def _fid(key: str) -> str:
        return key.replace(".", "__")

    def _widget(self, spec: FieldSpec):
        wid = f"field-{self._fid(spec.key)}"
        if get_origin(spec.annotation) is Literal:
            return FieldSelect([(str(c), c) for c in get_args(spec.annotation)], value=spec.value,
                               allow_blank=False, compact=True, id=wid)
        if spec.annotation is bool:
            return FieldSelect([("true", True), ("false", False)], value=spec.value, allow_blank=False,
                               compact=True, id=wid)
        return FieldInput(_text(spec.value), compact=True, id=wid)

    def _doc(self, spec: FieldSpec) -> str:
        doc = spec.field.metadata.get("doc", "") if spec.field is not None else "one line shown in lists"
        return f"{doc} ({expected(spec.annotation, spec.field)})" if spec.field is not None else doc

    def on_mount(self) -> None:
        self.saved_values = self.values_or_none()
        self.validate()

    # ------------------------------------------------------------ values and validation

    def _raw(self, spec: FieldSpec) -> Any:
        widget = self.query_one(f"#field-{self._fid(spec.key)}")
        if isinstance(widget, Select):
            return widget.value
        assert isinstance(widget, Input)   # _widget's: a FieldSelect or a FieldInput
        return parse_value(widget.value.strip(), spec.annotation)

    def table(self) -> dict:
        table: dict[str, Any] = {} if self.kind == "devices" else \
            {"workload": self.workload, "description": "", "train": {}, "params": {}}
        for spec in self.specs:   # 'train.epochs', 'slurm.partition': into their tables
            assign(table, spec.key, self._raw(spec))
        return table

    def values_or_none(self) -> dict[str, Any] | None:
        try:
            return flat(self.kind, self.table())
        except Exception:
            return None

    def check(self) -> dict[str, str]:
        """Field key -> problem, by the engine's own rules (types, bounds, cross-field rules,
        the fallback ladder's names). The engine reports the first problem; to find the next
        one the offending field is put back to its loaded value and the preset checked again."""
        errors: dict[str, str] = {}
        table = self.table()
        loaded = {s.key: s.value for s in self.specs}
        where = f"{self.kind[:-1]} preset {self.preset_name}"
        for _ in range(len(self.specs) + 1):
            try:
                if self.kind == "devices":
                    presets.check_ladder(self.preset_name, presets.device_from_table(table, where), where)
                else:
                    presets.workload_from_table(table, where)
                return errors
            except ConfigError as e:
                key = self._owner(e.key)
                if key in errors:
                    return errors  # a cross-field rule the loaded value does not settle
                errors[key] = e.problem
                assign(table, key, loaded[key])
        return errors

    def _owner(self, key: str | None) -> str:
        """The form field a ConfigError's key belongs to ('rules.oom' -> 'rules')."""
        keys = [s.key for s in self.specs]
        if key in keys:
            return key
        for k in keys:
            if key and key.startswith(k + "."):
                return k
        return "description" if self.kind == "workloads" else keys[0]

    def validate(self) -> None:
        self.errors = self.check()
        current = self.values_or_none() or {}
        shipped = self.shipped if self.shipped is not None else {}   # read where `differs` only
        changed = []
        for spec in self.specs:
            ident = self._fid(spec.key)
            note = self.query_one(f"#note-{ident}", Static)
            label = self.query_one(f"#label-{ident}", Label)
            problem = self.errors.get(spec.key)
            differs = self.shipped is not None and spec.key in current and \
                _norm(current.get(spec.key)) != _norm(self.shipped.get(spec.key))
            label.set_class(differs, "changed")
            label.update(spec.key + (" *" if differs else ""))
            if differs:
                changed.append(f"{spec.key} {_text(shipped.get(spec.key))} → {_text(current.get(spec.key))}")
            if problem:
                note.update(Text(f"✗ {problem}"))
            else:
                doc = self._doc(spec)
                note.update(f"shipped: {_text(shipped.get(spec.key))} · {doc}" if differs else doc)
            note.set_class(bool(problem), "error")
        self._head(changed)

    def _head(self, changed: list[str]) -> None:
        where = "shipped" if self.ref.shipped else ("yours, shadows the shipped one" if self.ref.shadows_shipped
                                                     else "yours")
        head = Text()
        head.append(f"{self.kind[:-1]} preset {self.preset_name}", style="bold")
        head.append(f" ({where}) {self.ref.path}", style="dim")
        if self.shipped is None:
            head.append("\nno shipped preset of this name to compare with")
        elif changed:
            head.append("\ndiffers from shipped: " + "; ".join(changed), style="yellow")
        else:
            head.append("\nsame as the shipped preset")
        self.query_one("#editor-head", Static).update(head)
        status = self.query_one("#editor-status", Static)
        if self.errors:
            key, problem = next(iter(self.errors.items()))
            status.update(Text(f"{len(self.errors)} problem(s): {key}: {problem}", style="bold red"))
        else:
            status.update(Text("valid · ctrl+s saves to " + str(paths.user_presets_dir() / self.kind), style="green"))

    def on_input_changed(self, event: Input.Changed) -> None:
        if self.is_mounted:
            self.validate()

    def on_select_changed(self, event: Select.Changed) -> None:
        if self.is_mounted:
            self.validate()

    def focus_next(self, selector: Any = "*") -> Widget | None:
        return self._into(super().focus_next(selector))

    def focus_previous(self, selector: Any = "*") -> Widget | None:
        return self._into(super().focus_previous(selector))

    @staticmethod
    def _into(widget: Widget | None) -> Widget | None:
        """Tab (or shift+tab) into a text field: the cursor at its end, nothing selected."""
        if isinstance(widget, FieldInput):
            widget.cursor_to_end()
        return widget

    def action_undo(self) -> None:
        """The focused field's last edit undone (each field keeps its own)."""
        field = self.focused
        while field is not None and not isinstance(field, (FieldInput, FieldSelect)):
            field = field.parent if isinstance(field.parent, Widget) else None
        if field is None:
            self.notify("nothing to undo: ctrl+z undoes the field you are in", severity="warning")
        elif not field.undo():
            self.notify("nothing to undo in this field", severity="warning")

    # ------------------------------------------------------------ saving

    def _toast(self, message: str, severity: SeverityLevel = "information") -> None:
        """A save's (or a discard's) toast, in place of the previous one still showing: a
        'not saved' from the last try stayed up beside the 'saved' of the next."""
        if self.toast is not None:
            self.app._unnotify(self.toast)   # Textual's own way to drop one toast (a click)
        self.toast = Notification(message, severity=severity, timeout=self.app.NOTIFICATION_TIMEOUT,
                                  markup=False)
        self.app.post_message(Notify(self.toast))

    def _save(self, name: str) -> bool:
        self.validate()
        if self.errors:
            key, problem = next(iter(self.errors.items()))
            self._toast(f"not saved: {key}: {problem}", severity="error")
            return False
        try:
            path = presets.save_user_preset(self.kind, name, self.table())
        except ConfigError as e:
            self._toast(f"not saved: {e.line()}", severity="error")
            return False
        shadows = (paths.shipped_presets_dir() / self.kind / f"{name}.toml").is_file()
        self._toast(f"saved {path}" + (" (shadows the shipped preset)" if shadows else ""))
        self.preset_name = name
        self.ref = presets.find(self.kind, name)
        self.shipped = self._shipped_values()
        self.saved_values = self.values_or_none()
        self.validate()
        return True

    @property
    def unsaved(self) -> bool:
        """Edits since loading or the last save (a field that does not parse counts)."""
        return self.values_or_none() != self.saved_values

    def action_save(self) -> None:
        self._save(self.preset_name)

    def action_save_as(self) -> None:
        def chosen(name: str | None) -> None:
            if name:
                self._save(name)

        self.app.push_screen(SaveAsScreen(self.kind, f"{self.preset_name}-mine" if self.ref.shipped else self.preset_name), chosen)

    def action_back(self) -> None:
        if not self.unsaved:
            self.dismiss()
            return

        def decided(choice: str | None) -> None:
            if choice == "save" and self._save(self.preset_name):
                self.dismiss()
            elif choice == "discard":
                self._toast("edits discarded", severity="warning")
                self.dismiss()
            # None (keep editing), or a save refused: the form stays, its problems shown

        self.app.push_screen(UnsavedScreen(self.preset_name), decided)


def _norm(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value

"""The launch screen: workload and device presets side by side (shipped and yours), overrides,
the resolved configuration (or the error that stops it), the last probe result; run, edit,
probe, runs, attach."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, OptionList, Static
from textual.widgets.option_list import Option

from cockpit.ui.editor import EditorScreen
from cockpit.ui.probe import probe_line
from cockpit.ui.probe_screen import ProbeScreen
from cockpit.ui.runs import live_runs, opener
from engine import command, presets, runconfig, vocabulary
from engine.errors import ConfigError
from engine.numbers import count
from engine.probe import cache
from engine.record.rundir import RunDir
from engine.schema import parse_value
from engine.runconfig import RunConfig


def _where(ref: presets.PresetRef) -> str:
    if ref.shipped:
        return "shipped"
    return "yours*" if ref.shadows_shipped else "yours"


def _summary(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={v}" for k, v in value.items()) + "}"
    return str(value)


def config_text(config: RunConfig) -> Text:
    """The resolved configuration, one line per section."""
    w, d = config.workload, config.device
    table = config.to_table()
    text = Text()
    text.append(f"{config.workload_preset}", style="bold")
    text.append(f" ({w.workload}) on ")
    text.append(f"{config.device_preset}", style="bold")
    if config.overrides:
        text.append("  with " + " ".join(config.overrides), style="yellow")
    if w.description:
        text.append(f"\n{w.description}", style="dim")
    if w.is_command:
        spec = w.params
        text.append("\ncommand " + command.display(spec.command), style="bold")
        filled = {**command.values(d, Path("."), 1), "run_dir": "<run dir>"}
        text.append("\nruns as " + command.display(command.fill(spec.command, filled)))
        text.append(f"\ncwd     {spec.cwd}")
        if spec.resume or spec.checkpoints:
            text.append(f"\nresume  {command.display(spec.resume) or '-'} from "
                        f"{spec.checkpoints or 'reported checkpoints'}")
        text.append(f"\nprogress {spec.progress}" + (f", regex {spec.progress_regex}" if spec.progress_regex else ""))
    else:
        _workload_lines(text, table)
    _device_lines(text, config)
    return text


def _workload_lines(text: Text, table: dict) -> None:
    text.append("\ntrain   " + "  ".join(f"{k} {_summary(v)}" for k, v in table["workload"]["train"].items()
                                         if k in ("epochs", "max_steps", "lr", "seed", "eval_every_steps",
                                                  "checkpoint_every_steps", "checkpoint_every_minutes")))
    text.append("\nparams  " + "  ".join(f"{k} {_summary(v)}" for k, v in table["workload"]["params"].items()))


def _device_lines(text: Text, config: RunConfig) -> None:
    d = config.device
    text.append(f"\ndevice  {d.device}, batch {d.batch_size} x {d.accumulation} (effective "
                f"{d.effective_batch}), {d.precision}"
                + (", grad checkpointing" if d.grad_checkpointing else "")
                + (", compile" if d.compile else "")
                + (f", {count(d.threads, 'thread')}" if d.threads else "")
                + (f", env {_summary(dict(d.env))}" if d.env else ""))
    ladder = " → ".join([config.device_preset, *config.ladder]) if config.ladder else "none"
    text.append(f"\nladder  {ladder}")
    if d.inject:
        text.append(f"\ninject  {', '.join(d.inject)}", style="bold red")


class PresetList(OptionList):
    DEFAULT_CSS = """
    PresetList { width: 1fr; height: 100%; border: round $primary 50%; border-title-color: $text; }
    PresetList:focus { border: round $primary; }
    """

    def __init__(self, kind: str, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind
        self.border_title = kind[:-1] + " presets"

    def load(self, keep: str | None = None) -> None:
        keep = keep or self.selected_name
        refs = presets.list_presets(self.kind)
        self.clear_options()
        for ref in refs:
            self.add_option(Option(Text.assemble((f"{ref.name:<18}", "bold"), (_where(ref), "dim")), id=ref.name))
        names = [r.name for r in refs]
        self.highlighted = names.index(keep) if keep in names else (0 if names else None)

    @property
    def selected_name(self) -> str | None:
        if self.highlighted is None or self.option_count == 0:
            return None
        return self.get_option_at_index(self.highlighted).id


class LaunchScreen(Screen):
    BINDINGS = [
        Binding("r", "run", "Run", tooltip="start the resolved configuration (enter in overrides too)"),
        Binding("e", "edit", "Edit preset", tooltip="edit the preset highlighted in the focused list (else the device preset)"),
        Binding("p", "probe", "Probe", tooltip="which device trains this workload fastest here; batch finder"),
        Binding("o", "app.runs", "Runs", tooltip="every run: open a past one, attach to a live one"),
        Binding("a", "attach", "Attach", tooltip="watch the newest live run"),
    ]
    HELP = """\
Pick a workload (what to train) and a device preset (how), add `--set`-style overrides
(`batch_size=16 train.epochs=2`), check the resolved configuration, run. `tab` moves between
the lists and the overrides field; `enter` takes a list's choice and goes on to the next, and
runs from the overrides field (enter, enter, enter: the highlighted workload on the highlighted
device preset). A fault to rehearse: `inject=native-crash@40`, `--inject
native-crash@40` or `native-crash@40` alone (several: `inject=oom@10,native-crash@40`); it is
used by one run and leaves the field when the run starts.
"""
    DEFAULT_CSS = """
    #lists { height: 10; }
    #overrides-row { height: 1; margin: 0 1; }
    #overrides-label { width: 11; }
    #overrides { width: 1fr; }
    #resolved { height: 1fr; border: round $primary 50%; border-title-color: $text; padding: 0 1; }
    #resolved.error { border: round $error; }
    /* wrapped, not cut: at 80 columns a probe sentence takes two lines */
    #probe { height: auto; max-height: 3; padding: 0 1; background: $boost; }
    #live { height: 1; padding: 0 1; background: $boost; color: $warning; text-style: bold; display: none; }
    """

    def __init__(self, workload: str = "matmul", device: str = "auto"):
        super().__init__()
        self.initial = (workload, device)
        self.config: RunConfig | None = None
        self.probes: dict[str, dict] = {}   # newest probe result per workload preset
        self.live: list[RunDir] = []
        self.probe_options: dict = {}  # ProbeScreen keywords (budget_s, max_batch, trial_s)

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="lists"):
            yield PresetList("workloads", id="workloads")
            yield PresetList("devices", id="devices")
        with Horizontal(id="overrides-row"):
            yield Static("overrides", id="overrides-label")
            yield Input(placeholder="key=value ... e.g. batch_size=16 inject=native-crash@40; enter runs",
                        id="overrides", compact=True)
        with VerticalScroll(id="resolved"):
            yield Static(id="resolved-text")
        yield Static(id="live")
        yield Static(id="probe")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#resolved").border_title = "resolved configuration"
        self.query_one("#workloads", PresetList).load(self.initial[0])
        self.query_one("#devices", PresetList).load(self.initial[1])
        self.query_one("#workloads").focus()
        self.refresh_info()

    def on_screen_resume(self) -> None:
        # Back from the editor (a preset may be new) or a run (one may now be live).
        for lst in self.query(PresetList):
            lst.load()
        self.refresh_info()

    def refresh_info(self) -> None:
        # Read from disk here (mount, back from another screen), not on every cursor move:
        # the probe results of every workload and the live runs (each run's events).
        self.probes = cache.latest_by_workload()
        self.live = live_runs()
        self.resolve()
        self.show_probe_line()

    def show_probe_line(self) -> None:
        workload = self.query_one("#workloads", PresetList).selected_name
        result = self.probes.get(workload) if workload is not None else None
        self.query_one("#probe", Static).update(probe_line(result, self.config))
        # A line of its own: after the probe sentence it was cut off at 80 columns.
        live = self.query_one("#live", Static)
        live.display = bool(self.live)
        if self.live:
            n = len(self.live)
            live.update(f"{count(n, 'live run')} ({self.live[0].id}): a attaches, o lists runs")

    # ------------------------------------------------------------ the resolved configuration

    @property
    def overrides(self) -> list[str]:
        return override_words(self.query_one("#overrides", Input).value)

    def resolve(self) -> RunConfig | None:
        workload = self.query_one("#workloads", PresetList).selected_name
        device = self.query_one("#devices", PresetList).selected_name
        box, out = self.query_one("#resolved"), self.query_one("#resolved-text", Static)
        self.config = None
        if workload is None or device is None:
            out.update("no presets found")
            return None
        try:
            self.config = runconfig.resolve(workload, device, self.overrides)
        except ConfigError as e:
            box.add_class("error")
            out.update(Text(e.line(), style="bold red"))
            return None
        box.remove_class("error")
        out.update(config_text(self.config))
        return self.config

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self.resolve()
        self.show_probe_line()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        """Enter on a list takes its choice and goes on, as a form does: the workload to the
        device presets, the device preset to the overrides, where enter runs."""
        event.stop()
        following = "#devices" if event.option_list.id == "workloads" else "#overrides"
        self.query_one(following).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.resolve()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_run()

    # ------------------------------------------------------------ actions

    def action_run(self) -> None:
        config = self.resolve()
        if config is None:
            self.notify("fix the configuration first (see the red line)", severity="error")
            return
        try:
            run = RunDir.create(config)
        except ConfigError as e:
            self.notify(e.line(), severity="error")
            return
        if isinstance(self.focused, Input):
            # Back from the run, focus would return to the overrides field, and the next
            # key pressed there (o for runs, say) would be typed into it.
            self.query_one("#workloads", PresetList).focus()
        # A fault is rehearsed once: left in the field, the next run would inject it again.
        field = self.query_one("#overrides", Input)
        field.value = " ".join(without_faults(field.value))
        opener(self.app).open_run(run, start=True)

    def action_edit(self) -> None:
        focused = self.focused
        lst = focused if isinstance(focused, PresetList) else self.query_one("#devices", PresetList)
        name = lst.selected_name
        if name is not None:
            self.app.push_screen(EditorScreen(lst.kind, name))

    def action_probe(self) -> None:
        config = self.resolve()
        if config is None:
            self.notify("fix the configuration first (see the red line)", severity="error")
            return

        def use(words: list[str] | None) -> None:
            # The probe's answer becomes overrides of the selected preset (device, threads).
            if words:
                keys = {w.partition("=")[0] for w in words}
                field = self.query_one("#overrides", Input)
                # what the user typed stays as typed, quotes and all: only the keys replaced go
                kept = [w for w in raw_words(field.value) if _key(w) not in keys]
                field.value = " ".join(kept + words)
            self.refresh_info()

        self.app.push_screen(ProbeScreen(config, **self.probe_options), use)

    def action_attach(self) -> None:
        live = live_runs()
        if not live:
            self.notify("no live run to attach to", severity="warning")
            return
        opener(self.app).open_run(live[0])


# ---------------------------------------------------------------- the overrides field

# A word of the field as typed: quoted parts kept whole, quotes and all.
_RAW_WORD = re.compile(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""")


def raw_words(text: str) -> list[str]:
    """The field's words as the user typed them (quotes kept), for rewriting it."""
    return _RAW_WORD.findall(text)


def _key(word: str) -> str:
    return word.partition("=")[0].strip("'\"")


def override_words(text: str) -> list[str]:
    """The field's words as `--set` overrides, typed as a person types them: `key=value`
    words, `--set key=value`, and a fault as `inject=KIND@STEP`, `--inject KIND@STEP` or
    `KIND@STEP` alone (several are one inject)."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ConfigError("overrides", None, f"cannot be split into key=value words ({e})") from None
    out: list[str] = []
    faults: list[str] = []
    it = iter(words)
    for word in it:
        if word in ("--set", "-s", "--inject"):
            value = next(it, "")
            (faults if word == "--inject" else out).append(value)
        elif word.startswith(("--set=", "--inject=")):
            flag, _, value = word.partition("=")
            (faults if flag == "--inject" else out).append(value)
        elif "=" not in word and _is_fault(word):
            faults.append(word)
        else:
            out.append(word)
    typed = [w for w in out if _key(w) in ("inject", "device.inject")]
    if faults and typed:  # one inject of them all, not the last one's alone
        for word in typed:
            out.remove(word)
            faults[:0] = parse_value(word.partition("=")[2], tuple[str, ...])
    if faults:
        out.append("inject=" + ",".join(faults))
    return out


def without_faults(text: str) -> list[str]:
    """The field's words as typed, less the faults: those a run has rehearsed."""
    kept, words = [], raw_words(text)
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        bare = word.strip("'\"")
        if bare == "--inject":
            skip = True
        elif _key(word) in ("inject", "device.inject", "--inject") or "=" not in bare and _is_fault(bare):
            continue
        else:
            kept.append(word)
    return kept


def _is_fault(word: str) -> bool:
    try:
        vocabulary.parse(word)
    except ValueError:
        return False
    return True

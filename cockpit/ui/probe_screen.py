"""The probe screen: which device trains the launch screen's workload fastest here, and the
largest micro-batch that fits the selected device preset.

The probe and the batch finder (engine.probe) run in a worker thread that only
post_message's their progress; each candidate and each trial still runs in its own process.
Leaving the screen cancels the work in flight (its worker process is ended).
"""

from __future__ import annotations

import dataclasses
import threading
import time

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, ProgressBar, Static

from cockpit.ui.probe import batch_note
from engine import presets
from engine.errors import ConfigError
from engine.numbers import rate
from engine.probe import FINDER_BUDGET_S, MAX_BATCH, PROBE_BUDGET_S, TRIAL_S, cache, check_budget
from engine.probe import candidates as cands
from engine.probe.batch import BatchResult, Trial, find_batch, parse_size_mb, preset_table
from engine.probe.speed import CandidateResult, ProbeResult, interval_text, probe
from engine.runconfig import RunConfig

CANDIDATE_STYLE = {"ok": "green", "rough": "yellow", "too-slow": "yellow", "crashed": "bold red", "wrong": "bold red",
                   "unavailable": "dim", "waiting": "dim", "warming up": "cyan", "measuring": "bold cyan"}
# The result column's word for each state, none longer than 'too-slow': at 80 columns the
# column is 8 wide ('measuring' showed as 'measuri'). The sentence under the table says the
# rest ('mps crashed (oom)', 'cuda is unavailable').
STATUS_WORD = {"waiting": "waiting", "warming up": "warm-up", "measuring": "timing", "ok": "ok",
               "rough": "rough", "wrong": "wrong", "too-slow": "too-slow", "crashed": "crashed",
               "unavailable": "n/a"}
STATUS_WIDTH = max(len(word) for word in STATUS_WORD.values())
PRESSURE_STYLE: dict[str | None, str] = {"normal": "green", "warn": "bold yellow", "critical": "bold red"}


@dataclasses.dataclass
class ProbeProgress(Message):
    update: dict


@dataclasses.dataclass
class ProbeFinished(Message):
    result: ProbeResult | BatchResult | None
    error: str | None = None


def _right(text: str) -> Text:
    return Text(text, justify="right")


def status_cell(status: str) -> Text:
    """A candidate's state as its result cell: a word that fits the column."""
    return Text(STATUS_WORD.get(status, status), style=CANDIDATE_STYLE.get(status, ""))


class ProbeScreen(Screen):
    # Short descriptions, so the footer keeps '? Help' at 80 columns; the tooltips say the
    # rest, in the help screen (?) and the command palette.
    BINDINGS = [
        Binding("p", "probe", "Probe", tooltip="time training on every device here (asks the budget)"),
        Binding("b", "find_batch", "Batch", tooltip="find the largest micro-batch that fits the device preset"),
        Binding("s", "save", "Save", tooltip="save the batch found as a new device preset"),
        Binding("u", "use", "Use best", tooltip="back to launch with the fastest device as overrides"),
        Binding("escape", "back", "Back", tooltip="back to launch (a question open: drop it)"),
    ]
    HELP = """\
Times real training of the workload on every device here (the CPU at 1, physical and
logical threads), each in its own process, within a budget: samples/s from its timed
micro-batches and its 90% confidence interval ("90% CI"), peak memory, pressure, crashes as
results, and the recommendation in a sentence. A cached result measured at another batch
than the preset's says so.
The batch finder (`b`) finds the largest micro-batch that fits the device preset and keeps
memory pressure normal and swap flat (asks an optional memory limit such as 6G).
"""
    DEFAULT_CSS = """
    #what { height: 1; padding: 0 1; background: $boost; }
    #candidates { height: 8; }
    #trials { height: 1fr; display: none; }
    #progress-row { height: 1; margin: 0 1; }
    #progress { display: none; }
    #status { width: 1fr; padding: 0 1; }
    #sentence { height: auto; max-height: 7; padding: 0 1; border-top: solid $primary 50%; }
    #ask-row { height: 1; margin: 0 1; display: none; }
    #ask-label { width: auto; padding: 0 1 0 0; }
    """

    def __init__(self, config: RunConfig, *, budget_s: float = PROBE_BUDGET_S,
                 max_batch: int = MAX_BATCH, trial_s: float = TRIAL_S,
                 finder_budget_s: float = FINDER_BUDGET_S):
        super().__init__()
        self.config = config
        self.budget_s, self.max_batch, self.trial_s = budget_s, max_batch, trial_s
        self.finder_budget_s = finder_budget_s
        self.result: ProbeResult | None = None
        self.batch_result: BatchResult | None = None   # (`batch` is Textual's)
        self.memory_limit_mb: float | None = None
        self.cancel = threading.Event()
        self.busy = False
        self.asking: str | None = None      # what the ask row's answer is for

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="what")
        yield DataTable(id="candidates", cursor_type="row", zebra_stripes=True)
        yield DataTable(id="trials", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="progress-row"):
            yield ProgressBar(id="progress", show_eta=False, show_percentage=False)
            yield Static(id="status")
        yield Static(id="sentence")
        # One question at a time, answered with enter: the probe's budget, the finder's
        # memory limit, the name of a preset to save (the CLI's flags, here).
        with Horizontal(id="ask-row"):
            yield Static(id="ask-label")
            yield Input(id="ask", compact=True)
        yield Footer()

    def _show_what(self) -> None:
        c = self.config
        self.query_one("#what", Static).update(
            f"probe {c.workload_preset} ({c.workload.workload}) · base {c.device_preset} "
            f"{c.device.batch_size} x {c.device.accumulation} · budget {self.budget_s:.0f} s")

    def on_mount(self) -> None:
        c = self.config
        self._show_what()
        table = self.query_one("#candidates", DataTable)
        # No device column: at 80 columns every cell counts, and the label names the device.
        for label, key in (("candidate", "label"), ("batch", "batch"),
                           ("samples/s", "rate"), ("90% CI", "spread"), ("peak", "peak"),
                           ("pressure", "pressure")):
            table.add_column(label, key=key)
        table.add_column("result", key="status", width=STATUS_WIDTH)  # as wide as its longest word
        trials = self.query_one("#trials", DataTable)
        for label, key in (("batch", "batch"), ("fits", "fits"), ("samples/s", "rate"),
                           ("footprint", "peak"), ("pressure", "pressure"), ("why", "why")):
            trials.add_column(label, key=key)
        self.set_interval(0.5, self._tick, name="probe-clock")
        stored = cache.latest(c.workload_preset)
        try:
            if stored is not None:
                self.show_result(ProbeResult.from_dict(stored), cached=True)
        except (TypeError, KeyError, ValueError):  # one this version cannot read
            stored = None
        if stored is None:
            self._status("no probe of this workload yet: p measures")

    def on_unmount(self) -> None:
        self.cancel.set()

    def _status(self, text: str) -> None:
        self.query_one("#status", Static).update(text)

    # ------------------------------------------------------------ the probe

    def _ask(self, purpose: str, label: str, value: str = "", placeholder: str = "") -> None:
        self.asking = purpose
        self.query_one("#ask-label", Static).update(label)
        answer = self.query_one("#ask", Input)
        answer.value, answer.placeholder = value, placeholder
        self.query_one("#ask-row").display = True
        answer.focus()

    def _done_asking(self) -> None:
        self.asking = None
        self.query_one("#ask-row").display = False

    def _idle(self) -> bool:
        if self.busy:
            self.notify("already measuring", severity="warning")
        return not self.busy

    def action_probe(self) -> None:
        if self._idle():
            self._ask("probe", "budget in seconds (enter starts):", f"{self.budget_s:g}")

    def _begin(self, table_id: str, total: float | None, status: str) -> None:
        """Busy: an empty table of this work's rows (the other one hidden), the bar, a status."""
        self.busy = True
        for name in ("candidates", "trials"):
            table = self.query_one(f"#{name}", DataTable)
            table.display = name == table_id
            if table.display:
                table.clear()
        self.query_one("#sentence", Static).update("")
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=total, progress=0)  # no total: a search with no known end
        bar.display = True
        self._status(status)
        self.started = time.time()

    def start_probe(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self._show_what()
        self._begin("candidates", self.budget_s, "finding the candidates…")
        self.run_probe()

    def _tick(self) -> None:
        bar = self.query_one("#progress", ProgressBar)
        if self.busy and bar.total is not None:
            bar.update(progress=min(self.budget_s, time.time() - self.started))

    @work(thread=True, exclusive=True, group="probe", exit_on_error=False)
    def run_probe(self) -> None:
        try:
            found = cands.build(self.config.workload, devices=[], preset_names=[],
                                base=self.config.device_preset, overrides=list(self.config.overrides))
            self.post_message(ProbeProgress({"type": "candidates", "candidates": found}))
            result = probe(self.config, found, self.budget_s, cancel=self.cancel,
                           on_progress=self._progress)
            if self.cancel.is_set():
                return
            try:  # cached before it is shown: the launch screen reads it from there
                cache.save(result.to_dict())
            except OSError as e:
                self.post_message(ProbeProgress({"type": "warning", "text": f"the result is not cached: "
                                                 f"{cache.probes_dir()} is not writable ({e.strerror})"}))
            self.post_message(ProbeFinished(result))
        except ConfigError as e:
            self.post_message(ProbeFinished(None, e.line()))
        except Exception as e:  # never leave the screen busy: say what went wrong
            self.post_message(ProbeFinished(None, f"the probe failed: {type(e).__name__}: {e}"))

    def _progress(self, update: dict) -> None:
        """The probe's or the finder's word, from its thread, to this screen's."""
        self.post_message(ProbeProgress(update))

    def on_probe_progress(self, message: ProbeProgress) -> None:
        update = message.update
        kind = update["type"]
        table = self.query_one("#candidates", DataTable)
        if kind == "candidates":
            for c in update["candidates"]:
                p = c.preset
                table.add_row(c.label, f"{p.batch_size} x {p.accumulation}", _right("-"), "", "",
                              "", status_cell("waiting"), key=c.label)
        elif kind == "importing":
            self._status(f"starting {update['total']} workers…")
        elif kind == "candidate":
            self._status(f"[{update['index'] + 1}/{update['total']}] {update['label']}: "
                         f"up to {max(0.0, update['until'] - time.time()):.0f} s")
            table.update_cell(update["label"], "status", status_cell("measuring"))
        elif kind == "events":
            for e in update["events"]:
                if e["type"] == "trainer_ready":
                    table.update_cell(update["label"], "status", status_cell("warming up"))
                elif e["type"] in ("step", "probe_timing") and e.get("samples_per_s"):
                    table.update_cell(update["label"], "rate", _right(rate(e["samples_per_s"])), update_width=True)
                    table.update_cell(update["label"], "status", status_cell("measuring"))
        elif kind == "result":
            self._fill_row(update["result"])
        elif kind == "warning":
            self.notify(update["text"], severity="warning")
        elif kind == "trial":
            self._status(f"trying micro-batch {update['batch']}…")
        elif kind == "trial_done":
            self._trial_row(update["trial"])

    def _fill_row(self, r: CandidateResult) -> None:
        table = self.query_one("#candidates", DataTable)
        pressure = r.memory.get("pressure")
        cells = {"label": r.label, "batch": r.batch_text,
                 "rate": _right("-" if r.samples_per_s is None else rate(r.samples_per_s)),
                 "spread": interval_text(r.spread),
                 "peak": _right("-" if r.peak_mb[0] is None else f"{r.peak_mb[0]:,.0f} MB"),
                 "pressure": Text(pressure or "n/a", style=PRESSURE_STYLE.get(pressure, "dim")),
                 "status": status_cell(r.status)}
        if r.label in table.rows:
            # a row first shown waiting: its columns widen to the figures now in it
            for key, value in cells.items():
                table.update_cell(r.label, key, value, update_width=True)
        else:
            table.add_row(*cells.values(), key=r.label)

    def show_result(self, result: ProbeResult, cached: bool = False) -> None:
        self.result = result
        table = self.query_one("#candidates", DataTable)
        table.clear()
        for r in result.candidates:  # ranked, fastest first
            self._fill_row(r)
        sentence = Text(result.sentence, style="bold")
        stale = result.workload_key and result.workload_key != cache.workload_key(self.config.workload)
        if (note := batch_note(result.to_dict(), self.config)) is not None:
            # samples/s and memory move with the batch: this result may not hold for the preset
            sentence.append(f"\n{note} — press p to measure again", style="bold yellow")
        if cached:
            m = result.machine or {}
            on = f" on {m.get('host', '?')} ({', '.join(m.get('gpus') or [m.get('cpu') or '?'])})" if m else ""
            sentence.append(f"\nmeasured {cache.age_text(result.created, time.time())}{on}"
                            + (" with other params" if stale else "") + "; p measures again", style="dim")
        if result.recommended:
            sentence.append("  · u uses " + result.recommended, style="dim")
        self.query_one("#sentence", Static).update(sentence)
        self._status(f"{'cached' if cached else 'done'}: {len(result.candidates)} candidates in "
                     f"{result.seconds:.0f} s")

    def on_probe_finished(self, message: ProbeFinished) -> None:
        self.busy = False
        self.query_one("#progress", ProgressBar).display = False
        if message.error:
            self.query_one("#sentence", Static).update(Text(message.error, style="bold red"))
            self._status("stopped")
        elif isinstance(message.result, ProbeResult):
            self.show_result(message.result)
        elif isinstance(message.result, BatchResult):
            self.show_batch(message.result)

    # ------------------------------------------------------------ the batch finder

    def action_find_batch(self) -> None:
        if self._idle():
            self._ask("batch", "memory limit (enter starts):", "", "none, or a size such as 6G")

    def start_finder(self, memory_limit_mb: float | None) -> None:
        self.memory_limit_mb = memory_limit_mb
        self._begin("trials", None, f"finding the largest micro-batch on {self.config.device_preset}…")
        self.run_finder()

    @work(thread=True, exclusive=True, group="probe", exit_on_error=False)
    def run_finder(self) -> None:
        try:
            result = find_batch(self.config, self.config.device_preset, self.config.device,
                                max_batch=self.max_batch, trial_s=self.trial_s,
                                memory_limit_mb=self.memory_limit_mb,
                                budget_s=self.finder_budget_s, cancel=self.cancel,
                                on_progress=self._progress)
        except ConfigError as e:  # a command that takes no {batch_size}, say
            self.post_message(ProbeFinished(None, e.line()))
            return
        except Exception as e:  # never leave the screen busy: say what went wrong
            self.post_message(ProbeFinished(None, f"the batch finder failed: {type(e).__name__}: {e}"))
            return
        if not self.cancel.is_set():
            self.post_message(ProbeFinished(result))

    def _trial_row(self, t: Trial) -> None:
        self.query_one("#trials", DataTable).add_row(
            _right(str(t.batch)), Text("yes" if t.fits else "no", style="green" if t.fits else "bold red"),
            _right("-" if t.samples_per_s is None else rate(t.samples_per_s)),
            _right("-" if t.footprint_mb is None else f"{t.footprint_mb:,.0f} MB"),
            Text(t.pressure or "n/a", style=PRESSURE_STYLE.get(t.pressure, "dim")),
            "" if t.fits else t.why)

    def show_batch(self, result: BatchResult) -> None:
        self.batch_result = result
        self.query_one("#trials", DataTable).clear()
        for t in result.trials:
            self._trial_row(t)
        text = Text(result.sentence, style="bold")
        if result.found is not None:
            text.append(f"  · s saves {result.micro_batch} x {result.accumulation} as a preset", style="dim")
        self.query_one("#sentence", Static).update(text)
        self._status(f"done: {len(result.trials)} trials in {result.seconds:.0f} s")

    # ------------------------------------------------------------ using the answers

    def action_save(self) -> None:
        if self.batch_result is None or self.batch_result.found is None:
            self.notify("find a batch first (b)", severity="warning")
            return
        self._ask("save", "save the preset as:",
                  f"{self.config.device_preset}-{self.config.workload_preset}-b{self.batch_result.micro_batch}")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """The answer to the ask row's question; a bad one is said and the row stays."""
        text = event.value.strip()
        try:
            if self.asking == "probe":
                try:
                    budget = float(text)
                except ValueError:
                    raise ConfigError("budget", None, f"got {text!r}; expected seconds") from None
                check_budget(budget)
                self._done_asking()
                self.start_probe(budget)
            elif self.asking == "batch":
                limit = parse_size_mb(text, "memory limit") if text else None
                self._done_asking()
                self.start_finder(limit)
            elif self.asking == "save":
                assert self.batch_result is not None   # action_save asks only once one is found
                presets.check_new_name("devices", text)
                path = presets.save_user_preset("devices", text, preset_table(self.config, self.batch_result))
                self._done_asking()
                self.notify(f"saved {path}")
        except ConfigError as e:
            self.notify(e.line(), severity="error")
        except OSError as e:
            self.notify(f"cannot write the preset: {e}", severity="error")

    def action_use(self) -> None:
        """Back to the launch screen with the recommended candidate's settings as overrides."""
        if self.result is None or not self.result.recommended:
            self.notify("nothing to use: probe first (p)", severity="warning")
            return
        best = next(c for c in self.result.candidates if c.label == self.result.recommended)
        words = [f"device={best.device_kind}"]
        if best.device_kind == "cpu" and best.threads:
            words.append(f"threads={best.threads}")
        if best.device_kind == "cuda":  # measured compiled or eager: run it as measured
            words.append(f"compile={str(best.compiled).lower()}")
        self.dismiss(words)

    def action_back(self) -> None:
        if self.asking:  # escape answers "never mind" to a question first
            self._done_asking()
            return
        self.dismiss(None)

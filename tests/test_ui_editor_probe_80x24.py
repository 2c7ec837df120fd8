"""What the user saw at 80x24 (issue "The crash moment, told exactly", item 5), driven by Pilot:
the preset editor's Tab selected a field's whole text, ctrl+z did not undo, and a 'not saved'
toast stayed up beside the next 'saved'; the probe table cut 'measuring' to 'measuri'; a plot's
time tick read '1m3'."""

from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace

from textual.app import App
from textual.containers import Horizontal
from textual.widgets import DataTable
from textual.widgets.input import Selection

from cockpit.app import make_app
from cockpit.ui.editor import EditorScreen
from cockpit.ui.widgets.fields import FieldInput
from cockpit.ui.probe_screen import STATUS_WIDTH, STATUS_WORD, ProbeProgress, ProbeScreen
from cockpit.ui.widgets.plots import PlotCard, TimeTicks, place_labels
from conftest import FIXTURES
from engine.probe.speed import ProbeResult
from ui_support import run, wait_for

SIZE = (80, 24)


def screen_lines(app) -> list[str]:
    """The screen as the terminal shows it, a string a row."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def whole(word: str, line: str) -> bool:
    return re.search(rf"(?<!\S){re.escape(word)}(?!\S)", line) is not None


def toasts(app) -> list[tuple[str, str]]:
    return [(n.severity, n.message) for n in app._notifications]


async def open_editor(app, pilot, kind: str, name: str) -> EditorScreen:
    await pilot.pause()
    app.push_screen(EditorScreen(kind, name))
    await wait_for(pilot, lambda: isinstance(app.screen, EditorScreen) and app.screen.is_mounted,
                   what="the editor")
    await pilot.pause()
    return app.screen


def field(screen, key: str):
    return screen.query_one(f"#field-{key.replace('.', '__')}")


# ---------------------------------------------------------------- the preset editor


def test_tab_into_a_field_puts_the_cursor_at_its_end_and_selects_nothing(home):
    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_editor(app, pilot, "workloads", "matmul")
            description = field(screen, "description")
            before = description.value
            assert len(before) > 40                       # longer than the field shows
            field(screen, "train.epochs").focus()
            await pilot.pause()
            await pilot.press("shift+tab")                # back into the description
            await wait_for(pilot, lambda: screen.focused is description, what="focus on description")
            assert description.selection == Selection.cursor(len(before))
            await pilot.press("x")                        # one keystroke adds, never replaces
            await wait_for(pilot, lambda: description.value == before + "x", what="x typed at the end")
            # the cursor's end of the text is in view, not the start of it
            row = next(line for line in screen_lines(app) if line.startswith(" description "))
            assert row.rstrip().endswith("GFLOP/s)x")

            await pilot.press("tab")                      # forward into the next field
            await wait_for(pilot, lambda: screen.focused is field(screen, "train.epochs"), what="tab")
            epochs = screen.focused
            assert isinstance(epochs, FieldInput) and epochs.selection == Selection.cursor(len(epochs.value))
            typed = epochs.value + "5"
            await pilot.press("5")
            await wait_for(pilot, lambda: epochs.value == typed, what="5 typed at the end")

    run(drive())


def test_ctrl_z_undoes_the_last_edit_of_the_focused_field(home):
    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=SIZE) as pilot:
            screen = await open_editor(app, pilot, "workloads", "matmul")
            # the footer composes its keys after a refresh (call_after_refresh), not with the screen
            await wait_for(pilot, lambda: any(whole("^z", line) and "Undo" in line for line in screen_lines(app)[-2:]),
                           what="^z Undo in the footer")
            description = field(screen, "description")
            before = description.value
            description.focus()
            await pilot.pause()
            # the whole description typed over (selected, one keystroke): ctrl+z brings it back
            description.selection = Selection(0, len(before))
            await pilot.press("n")
            await wait_for(pilot, lambda: description.value == "n", what="the description replaced")
            await pilot.press("e", "w")
            await wait_for(pilot, lambda: description.value == "new", what="typing")
            await pilot.press("ctrl+z")                   # the run of typing: one edit
            await wait_for(pilot, lambda: description.value == "n", what="the typing undone")
            await pilot.press("ctrl+z")
            await wait_for(pilot, lambda: description.value == before, what="the description back")
            assert description.selection == Selection.cursor(len(before))
            assert "differs from shipped" not in str(screen.query_one("#editor-head").render())

            # backspaces are one edit too; each field keeps its own
            epochs = field(screen, "train.epochs")
            epochs.focus()
            await pilot.pause()
            was = epochs.value
            await pilot.press("end", "backspace", "backspace", "7")
            await wait_for(pilot, lambda: epochs.value == was[:-2] + "7", what="epochs edited")
            await pilot.press("ctrl+z")
            await wait_for(pilot, lambda: epochs.value == was[:-2], what="the 7 undone")
            await pilot.press("ctrl+z")
            await wait_for(pilot, lambda: epochs.value == was, what="the backspaces undone")
            assert description.value == before

            # a choice field: the choice before comes back
            optimizer = field(screen, "train.optimizer")
            optimizer.value = "sgd"
            optimizer.focus()
            await wait_for(pilot, lambda: "train.optimizer *" in str(screen.query_one("#label-train__optimizer").render()),
                           what="the change marked")
            await pilot.press("ctrl+z")
            await wait_for(pilot, lambda: optimizer.value == "adamw", what="the choice undone")
            await wait_for(pilot, lambda: not screen.unsaved, what="nothing left to save")

            # nothing left to undo: said, once, and nothing changes
            await pilot.press("ctrl+z")
            await wait_for(pilot, lambda: toasts(app), what="a toast")
            assert toasts(app) == [("warning", "nothing to undo in this field")]
            assert optimizer.value == "adamw"

    run(drive())


def test_each_save_gives_one_toast_the_last_replacing_the_one_before(home):
    async def drive():
        app = make_app(attach=False)
        app.NOTIFICATION_TIMEOUT = 600     # no toast leaves on its own during the test
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            screen = await open_editor(app, pilot, "devices", "cpu")
            batch = field(screen, "batch_size")
            batch.focus()
            batch.value = "0"
            await wait_for(pilot, lambda: "batch_size" in screen.errors, what="the bad value found")
            await pilot.press("ctrl+s")
            await wait_for(pilot, lambda: toasts(app), what="the refusal's toast")
            assert toasts(app) == [("error", "not saved: batch_size: got 0, expected a positive integer up to 2147483647")]
            batch.value = "16"
            await wait_for(pilot, lambda: not screen.errors, what="the fix")
            await pilot.press("ctrl+s")
            saved = home / "config" / "presets" / "devices" / "cpu.toml"
            await wait_for(pilot, lambda: saved.is_file() and any("saved" in m for _, m in toasts(app)),
                           what="the save's toast")
            await pilot.pause()
            assert toasts(app) == [("information", f"saved {saved} (shadows the shipped preset)")]
            # on the screen too: one toast, the save's
            await wait_for(pilot, lambda: len(app.screen.query("Toast")) == 1, what="one toast shown")
            shown = "\n".join(screen_lines(app))
            assert "not saved" not in shown and "saved" in shown

    run(drive())


# ---------------------------------------------------------------- the probe table


def _probe_results() -> list:
    """The recorded H100 probe's candidates and three more: every final state the table shows."""
    data = json.loads((FIXTURES / "probes" / "h100-trm-tiny.json").read_text())
    data.pop("schema")                 # as engine.probe.cache reads it
    recorded = ProbeResult.from_dict(data)
    cuda = recorded.candidates[0]
    more = [dataclasses.replace(cuda, label="cuda compiled", status="crashed", samples_per_s=None, spread=None,
                                crash={"kind": "numerical-parity", "sentence": "", "evidence": {}}),
            dataclasses.replace(cuda, label="mps", status="unavailable", samples_per_s=None, spread=None,
                                peak={}, memory={}),
            dataclasses.replace(cuda, label="cpu (2 threads)", status="wrong")]
    return recorded.candidates + more


def test_probe_table_shows_every_status_word_whole_at_80_columns(home):
    results = _probe_results()
    assert {r.status for r in results} == {"ok", "rough", "too-slow", "crashed", "unavailable", "wrong"}

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            app.push_screen(ProbeScreen(app.screen.resolve()))
            await wait_for(pilot, lambda: isinstance(app.screen, ProbeScreen), what="the probe screen")
            probe = app.screen
            await wait_for(pilot, lambda: len(probe.query_one("#candidates", DataTable).columns) == 7,
                           what="the table")
            table = probe.query_one("#candidates", DataTable)

            async def shows(expected: dict[str, str], what: str) -> None:
                """Each row's status is `expected` and every cell of it is on the screen whole."""
                await wait_for(pilot, lambda: {str(r.key.value): str(table.get_cell(r.key, "status"))
                                               for r in table.ordered_rows} == expected, what=what)
                await pilot.pause()
                assert table.virtual_size.width <= table.scrollable_content_region.width, what
                lines = screen_lines(app)
                for i, row in enumerate(table.ordered_rows):
                    line = lines[table.region.y + 1 + i]          # under the header
                    for cell in table.get_row(row.key):
                        text = str(cell)
                        assert not text or whole(text, line), f"{what}: {text!r} is not whole in {line!r}"

            candidates = [SimpleNamespace(label=r.label, preset=SimpleNamespace(batch_size=32, accumulation=4))
                          for r in results]
            probe.post_message(ProbeProgress({"type": "candidates", "candidates": candidates}))
            states = {r.label: "waiting" for r in results}
            await shows(states, "waiting")
            for i, r in enumerate(results):
                probe.post_message(ProbeProgress({"type": "candidate", "index": i, "total": len(results),
                                                  "label": r.label, "until": 0.0}))
                states[r.label] = STATUS_WORD["measuring"]
                await shows(states, "measuring")
                probe.post_message(ProbeProgress({"type": "events", "label": r.label,
                                                  "events": [{"type": "trainer_ready"}]}))
                states[r.label] = STATUS_WORD["warming up"]
                await shows(states, "warming up")
                probe.post_message(ProbeProgress({"type": "events", "label": r.label,
                                                  "events": [{"type": "step", "samples_per_s": 1646.9}]}))
                states[r.label] = STATUS_WORD["measuring"]
                await shows(states, "measuring, a figure in")
                probe.post_message(ProbeProgress({"type": "result", "result": r}))
                states[r.label] = STATUS_WORD[r.status]
                await shows(states, f"{r.label} {r.status}")

    run(drive())
    assert max(len(word) for word in STATUS_WORD.values()) == STATUS_WIDTH <= len("too-slow")


# ---------------------------------------------------------------- time tick labels


def test_labels_are_moved_in_or_left_out_never_cut():
    # a 4-character label whose tick is 2 columns from the end: moved in, whole
    assert place_labels([(7, "0s", False), (36, "1m30", False)], 39) == [(7, "0s"), (35, "1m30")]
    assert place_labels([(36, "1m30", False)], 38) == [(34, "1m30")]
    # the right end's label ends at its tick; one that would run into the label before is left out
    assert place_labels([(30, "1m", False), (38, "1m30", True)], 39) == [(30, "1m"), (35, "1m30")]
    assert place_labels([(33, "1m", False), (36, "1m30", False)], 38) == [(33, "1m")]
    assert place_labels([(1, "10m", False)], 39) == [(0, "10m")]


def test_time_tick_labels_are_whole_on_plots_at_80x24():
    """Two plots side by side at 80x24, as on the dashboard, over runs of every length around
    a tick near the right edge (1m30 of 92 s read '1m3')."""
    class Two(App):
        def compose(self):
            with Horizontal():
                yield PlotCard(id="rate-card")
                yield PlotCard(id="loss-card")

    async def drive():
        app = Two()
        async with app.run_test(size=SIZE) as pilot:
            cards = list(app.query(PlotCard))
            await pilot.pause()
            for end in [*range(86, 100), 150, 5400, 5520]:
                xs = [end * i / 200 for i in range(201)]
                for card in cards:
                    card.show([(xs, [1.0 + (i % 7) for i in range(201)], "cyan")], empty="nothing")
                await pilot.pause()
                await pilot.pause()
                lines = screen_lines(app)
                for card in cards:
                    plot = card.plot
                    margin = plot.query_one("#margin-bottom").region
                    text = lines[margin.y][margin.x:margin.right]
                    ticks = TimeTicks(4).get_ticks(plot._x_min, plot._x_max)
                    labels = set(TimeTicks(4).get_labels_for_ticks(ticks))
                    shown = text.split()
                    assert shown and set(shown) <= labels, (end, text, labels)
                    assert len(shown) >= min(3, len(ticks)), (end, text)

    run(drive())

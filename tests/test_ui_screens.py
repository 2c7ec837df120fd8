"""The screens around the dashboard, driven by Pilot at 80x24 (as over SSH) and 200x50: what
used to be cut off is whole on screen, the editor asks before throwing edits away, a cached
probe of another batch says so, focus after launching, and the help screen and command
palette built from each screen's own BINDINGS."""

from __future__ import annotations

import json
import shutil
import tomllib

import pytest
from textual.binding import Binding
from textual.command import CommandList, CommandPalette
from textual.screen import Screen
from textual.widgets import Input, Markdown, Static

from cockpit.app import make_app
from cockpit.ui.compare import CompareScreen
from cockpit.ui.editor import EditorScreen, UnsavedScreen
from cockpit.ui.help import HelpScreen, key_commands
from cockpit.ui.launch import LaunchScreen
from cockpit.ui.logs import LogScreen
from cockpit.ui.probe_screen import ProbeScreen
from cockpit.ui.quit import QuitScreen
from cockpit.ui.runs import RunsScreen
from conftest import FIXTURES
from engine.record.rundir import RunDir
from ui_support import copy_run, fake_live, run, wait_for


def _palette_highlights(app, title: str) -> bool:
    """The command palette shows its list with `title` highlighted, so enter runs it: the palette
    searches in a worker and shows what it found in batches, so typing is not enough."""
    palette = app.screen
    if not isinstance(palette, CommandPalette):
        return False
    commands = palette.query_one(CommandList)
    option = commands.highlighted_option
    return commands.has_class("--visible") and option is not None and str(option.hit.text) == title


SIZES = [(80, 24), (200, 50)]


def screen_lines(app) -> list[str]:
    """The text on the terminal, row by row, as the user sees it (cut text is not there)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def on_screen(app, text: str) -> bool:
    return any(text in line for line in screen_lines(app))


def _pick(lst, name: str) -> None:
    lst.highlighted = [o.id for o in lst._options].index(name)


def _runs_opened(app) -> list:
    """The runs the app is asked to open, each shown as a blank screen: no training here."""
    opened = []

    def open_run(run_dir, start=False):
        opened.append(run_dir)
        app.push_screen(Screen())

    app.open_run = open_run
    return opened


def _cached_probe(home) -> dict:
    recorded = FIXTURES / "probes" / "h100-trm-tiny.json"   # measured at batch 32 x 4
    (home / "cache" / "probes").mkdir(parents=True)
    shutil.copy(recorded, home / "cache" / "probes" / recorded.name)
    return json.loads(recorded.read_text())


# ------------------------------------------------------------ item 9: whole at 80x24


@pytest.mark.parametrize("size", SIZES)
def test_launch_screen_live_run_hint_and_footer_are_whole(home, size):
    path = copy_run(home, "finished")
    fake_live(path)   # this test's own pid: alive

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.screen.live, what="the live run")
            # the footer composes its keys after a refresh (call_after_refresh), not with the screen
            await wait_for(pilot, lambda: on_screen(app, "? Help") and on_screen(app, "^p palette"),
                           what="the footer's keys")
            assert on_screen(app, f"1 live run ({path.name}): a attaches, o lists runs")

    run(drive())


@pytest.mark.parametrize("size", SIZES)
def test_quit_dialog_shows_its_key_hints(home, size):
    path = copy_run(home, "finished")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            app.push_screen(QuitScreen([RunDir(path)]))
            await pilot.pause()
            for hint in ("Stop it [s]", "Leave running [l]", "Cancel [esc]"):
                assert on_screen(app, hint), hint

    run(drive())


@pytest.mark.parametrize("size", SIZES)
def test_probe_screen_footer_keeps_help(home, size):
    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            app.push_screen(ProbeScreen(app.screen.resolve()))
            # the footer composes its keys after a refresh (call_after_refresh), not with the screen
            await wait_for(pilot, lambda: on_screen(app, "esc Back"), what="the footer's keys")
            assert on_screen(app, "? Help") and on_screen(app, "^p palette")

    run(drive())


# ------------------------------------------------------------ item 11: a cached probe of another batch


@pytest.mark.parametrize("size", SIZES)
def test_cached_probe_of_another_batch_says_so(home, size):
    result = _cached_probe(home)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            launch = app.screen
            _pick(launch.query_one("#workloads"), "trm-tiny")
            await pilot.pause()
            assert "(at batch" not in str(launch.query_one("#probe", Static).render())  # 32 x 4 both
            launch.query_one("#overrides", Input).value = "batch_size=16"
            await pilot.pause()
            launch.show_probe_line()
            await pilot.pause()
            assert "at batch 32, the preset has 16" in str(launch.query_one("#probe", Static).render())
            launch.query_one("#workloads").focus()
            await pilot.press("p")
            await wait_for(pilot, lambda: isinstance(app.screen, ProbeScreen), what="probe screen")
            await pilot.pause()
            assert "cached" in str(app.screen.query_one("#status", Static).render())
            assert on_screen(app, "measured at batch 32; the preset now has 16 — press p to measure again")
            assert result["sentence"][:30] in str(app.screen.query_one("#sentence", Static).render())

    run(drive())


def test_cached_probe_at_the_presets_batch_has_no_note(home):
    _cached_probe(home)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            _pick(app.screen.query_one("#workloads"), "trm-tiny")
            await pilot.pause()
            await pilot.press("p")
            await wait_for(pilot, lambda: isinstance(app.screen, ProbeScreen), what="probe screen")
            await pilot.pause()
            assert "measured at batch" not in str(app.screen.query_one("#sentence", Static).render())

    run(drive())


# ------------------------------------------------------------ item 12: focus after launching


def test_enter_in_overrides_launches_and_focus_does_not_return_to_the_field(home):
    async def drive():
        app = make_app(attach=False)
        opened = []

        def open_run(run_dir, start=False):   # a stand-in for the dashboard: no training here
            opened.append((run_dir.id, start))
            app.push_screen(Screen())

        app.open_run = open_run
        async with app.run_test(size=(80, 24)) as pilot:
            launch = app.screen
            field = launch.query_one("#overrides", Input)
            field.focus()
            await pilot.press(*"train.epochs=1")
            await pilot.press("enter")
            await wait_for(pilot, lambda: opened, what="the run to start")
            assert opened[0][1] is True
            app.pop_screen()   # back from the run
            await pilot.pause()
            assert app.screen is launch and not isinstance(app.focused, Input)
            await pilot.press("o")
            await wait_for(pilot, lambda: isinstance(app.screen, RunsScreen), what="the runs screen")
            assert field.value == "train.epochs=1"   # 'o' was a key, not a letter typed

    run(drive())


def test_enter_on_the_lists_goes_on_to_the_next_and_then_runs(home):
    """Enter, enter, enter: the workload, the device preset, the overrides field, where enter runs."""
    async def drive():
        app = make_app(attach=False)
        opened = _runs_opened(app)
        async with app.run_test(size=(80, 24)) as pilot:
            launch = app.screen
            workloads, devices = launch.query_one("#workloads"), launch.query_one("#devices")
            _pick(workloads, "matmul")
            _pick(devices, "cpu")
            workloads.focus()
            await pilot.press("enter")
            assert app.focused is devices and not opened
            await pilot.press("enter")
            assert app.focused is launch.query_one("#overrides", Input) and not opened
            await pilot.press("enter")
            await wait_for(pilot, lambda: opened, what="the run to start")
            config = opened[0].config()
            assert (config.workload_preset, config.device_preset) == ("matmul", "cpu")

    run(drive())


# ------------------------------------------------------------ item 8: the editor


async def _editor(pilot, app, kind: str, name: str) -> EditorScreen:
    app.push_screen(EditorScreen(kind, name))
    await pilot.pause()
    return app.screen


@pytest.mark.parametrize("size", SIZES)
def test_editor_shows_whole_keys(home, size):
    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            editor = await _editor(pilot, app, "workloads", "matmul")
            for key in ("train.checkpoint_every_steps", "train.checkpoint_every_minutes"):
                label = editor.query_one(f"#label-{key.replace('.', '__')}")
                # scrolled after the next refresh (call_after_refresh), not at once
                editor.query_one("#form").scroll_to_widget(label, animate=False)
                await wait_for(pilot, lambda: on_screen(app, key + " "), what=f"{key} in view")
            # a changed field's ' *' mark fits beside the longest key too
            field = editor.query_one("#field-train__checkpoint_every_minutes", Input)
            field.value = "7"
            await pilot.pause()
            assert on_screen(app, "train.checkpoint_every_minutes *")

    run(drive())


def test_editor_escape_with_edits_asks_keep_discard_or_save(home):
    saved = home / "config" / "presets" / "devices" / "cpu.toml"

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            editor = await _editor(pilot, app, "devices", "cpu")
            await pilot.press("escape")        # nothing edited: straight back
            await pilot.pause()
            assert isinstance(app.screen, LaunchScreen)

            editor = await _editor(pilot, app, "devices", "cpu")
            editor.query_one("#field-batch_size", Input).value = "12"
            await pilot.pause()
            await pilot.press("escape")
            await pilot.pause()
            assert isinstance(app.screen, UnsavedScreen)
            for hint in ("Save [s]", "Discard [d]", "Keep editing [esc]"):
                assert on_screen(app, hint), hint
            await pilot.press("escape")        # keep editing: the edit is still there
            await pilot.pause()
            assert app.screen is editor and editor.query_one("#field-batch_size", Input).value == "12"

            await pilot.press("escape", "d")   # discard
            await pilot.pause()
            assert isinstance(app.screen, LaunchScreen) and not saved.exists()

            editor = await _editor(pilot, app, "devices", "cpu")
            editor.query_one("#field-batch_size", Input).value = "0"   # invalid: save refused
            await pilot.pause()
            await pilot.press("escape", "s")
            await pilot.pause()
            assert app.screen is editor and not saved.exists()
            editor.query_one("#field-batch_size", Input).value = "12"
            await pilot.pause()
            await pilot.press("escape", "s")   # save, then leave
            await pilot.pause()
            assert isinstance(app.screen, LaunchScreen)
            assert tomllib.loads(saved.read_text())["batch_size"] == 12

    run(drive())


# ------------------------------------------------------------ help and the palette, from BINDINGS


class GaugeScreen(Screen):
    """A screen the help and the palette have never heard of."""

    BINDINGS = [
        Binding("g", "gauge", "Gauge it", tooltip="read the gauge"),
        Binding("x", "explode", "Explode"),
        Binding("escape", "app.pop_screen", "Back"),
    ]
    HELP = "Reads the **gauge**."

    def __init__(self):
        super().__init__()
        self.gauged = 0

    def action_gauge(self) -> None:
        self.gauged += 1

    def check_action(self, action: str, parameters) -> bool | None:
        return action != "explode"   # not offered now


def _help_source(app) -> str:
    assert isinstance(app.screen, HelpScreen)
    return app.screen.query_one(Markdown).source


def test_help_lists_the_keys_of_the_screen_it_was_opened_on(home):
    # what help says does not depend on the terminal's size: the smallest one, where it must fit
    size = SIZES[0]
    finished = RunDir(copy_run(home, "finished"))
    crashed = RunDir(copy_run(home, "crash-fallback"))

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            screens = {"launch": lambda: None,
                       "probe": lambda: app.push_screen(ProbeScreen(app.screen.resolve())),
                       "editor": lambda: app.push_screen(EditorScreen("devices", "cpu")),
                       "runs": lambda: app.push_screen(RunsScreen()),
                       "dashboard": lambda: app.open_run(finished),
                       "logs": lambda: app.push_screen(LogScreen(finished)),
                       "compare": lambda: app.push_screen(CompareScreen([finished, crashed])),
                       "gauge": lambda: app.push_screen(GaugeScreen())}
            for name, open_screen in screens.items():
                open_screen()
                await pilot.pause()
                screen = app.screen
                await pilot.press("question_mark")
                await pilot.pause()
                source = _help_source(app)
                for binding in Binding.make_bindings(type(screen).BINDINGS):
                    assert f"**{binding.description}**" in source, (name, binding.description)
                assert "**Quit**" in source and "**Command palette**" in source
                await pilot.press("escape")
                await pilot.pause()
                assert app.screen is screen
                if name != "launch":
                    app.pop_screen()
                    await pilot.pause()

            app.push_screen(GaugeScreen())
            await pilot.pause()
            await pilot.press("f1")
            await pilot.pause()
            source = _help_source(app)
            assert source.startswith("# Gauge") and "Reads the **gauge**." in source
            assert "- `g` **Gauge it** — read the gauge" in source
            assert "**Explode** (not now)" in source
            assert on_screen(app, "Gauge it — read the gauge")
            assert "- `? / f1` **Help**" in source   # f1 named: '?' is typed into a field with focus

    run(drive())


def test_palette_offers_the_screens_actions_and_runs_them(home):
    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            titles = [c.title for c in key_commands(app.screen, app)]
            for title in ("Run", "Edit preset", "Probe", "Runs", "Attach", "Help", "Quit"):
                assert title in titles, title
            assert titles.count("Runs") == 1   # the launch screen's o and the app's are one
            system = [c.title for c in app.get_system_commands(app.screen)]
            assert "Quit" not in system and "Theme" in system   # Textual's Quit: ours asks first
            assert "Keys" not in system   # its panel squeezed 80x24; Help says the keys

            probe = ProbeScreen(app.screen.resolve())
            app.push_screen(probe)
            await pilot.pause()
            titles = [c.title for c in key_commands(probe, app)]
            for title in ("Probe", "Batch", "Save", "Use best", "Back", "Help"):
                assert title in titles, title
            app.pop_screen()
            await pilot.pause()

            # Chosen in the palette by name, as a user would: the editor opens.
            await pilot.press("ctrl+p")
            await pilot.pause()
            await pilot.press(*"edit preset")
            await wait_for(pilot, lambda: _palette_highlights(app, "Edit preset"),
                           what="the palette's search to offer Edit preset")
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, EditorScreen), what="the editor")

            gauge = GaugeScreen()
            app.push_screen(gauge)
            await pilot.pause()
            commands = {c.title: c for c in key_commands(gauge, app)}
            assert "Gauge it" in commands and "Explode" not in commands   # check_action said no
            assert commands["Gauge it"].help == "read the gauge · g"
            # found by what it does, not only by its footer word
            await pilot.press("ctrl+p")
            await pilot.pause()
            await pilot.press(*"read the gau")
            await wait_for(pilot, lambda: _palette_highlights(app, "Gauge it"),
                           what="the palette's search to offer Gauge it")
            await pilot.press("enter")
            await wait_for(pilot, lambda: gauge.gauged == 1, what="the gauge action")

    run(drive())


# ------------------------------------------------------------ overrides as a person types them


@pytest.mark.parametrize("typed", ["inject=native-crash@40", "--inject native-crash@40",
                                   "native-crash@40", "inject=[native-crash@40]",
                                   "inject='[\"native-crash@40\"]'"])
def test_a_fault_typed_as_a_person_types_it_is_rehearsed_once(home, typed):
    """Each way of typing a fault reaches the run; the run takes it, and the field keeps the
    rest of what was typed (train.epochs=1) but not the fault, which would fire again."""
    async def drive():
        app = make_app(attach=False)
        opened = _runs_opened(app)
        async with app.run_test(size=(80, 24)) as pilot:
            launch = app.screen
            _pick(launch.query_one("#workloads"), "matmul")
            field = launch.query_one("#overrides", Input)
            field.value = f"train.epochs=1 {typed}"
            await pilot.pause()
            assert launch.resolve() is not None, str(launch.query_one("#resolved-text", Static).render())
            launch.query_one("#workloads").focus()
            await pilot.press("r")
            await wait_for(pilot, lambda: opened, what="the run to start")
            config = tomllib.loads(opened[0].config_path.read_text())
            assert config["device"]["inject"] == ["native-crash@40"]
            assert field.value == "train.epochs=1"

    run(drive())


def test_using_the_probes_answer_keeps_what_was_typed_as_typed():
    from cockpit.ui.launch import _key, raw_words

    typed = "inject='[\"x@1500\"]' batch_size=8 threads=4"
    kept = [w for w in raw_words(typed) if _key(w) not in {"device", "threads"}]
    assert " ".join(kept) == "inject='[\"x@1500\"]' batch_size=8"

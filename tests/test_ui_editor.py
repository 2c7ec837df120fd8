"""The preset editor, driven by Pilot: inline errors by the engine's rules, save and save-as
to the user's preset dir as TOML, shipped presets never written."""

from __future__ import annotations

import tomllib

from cockpit.app import make_app
from cockpit.ui.editor import EditorScreen
from engine import paths
from ui_support import run


async def _open_editor(pilot, app, kind: str, name: str) -> EditorScreen:
    lists = {"workloads": "#workloads", "devices": "#devices"}
    lst = app.screen.query_one(lists[kind])
    lst.focus()
    lst.highlighted = [o.id for o in lst._options].index(name)
    await pilot.press("e")
    await pilot.pause()
    assert isinstance(app.screen, EditorScreen)
    return app.screen


async def _type(pilot, screen, key: str, text: str) -> None:
    field = screen.query_one(f"#field-{key.replace('.', '__')}")
    field.focus()
    field.value = ""
    await pilot.press(*text)
    await pilot.pause()


def _note(screen, key: str) -> str:
    return str(screen.query_one(f"#note-{key.replace('.', '__')}").render())


def test_bad_value_shows_the_engines_error_and_is_not_saved(home):
    shipped = paths.shipped_presets_dir() / "devices" / "cpu.toml"
    before = shipped.read_bytes()

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await _open_editor(pilot, app, "devices", "cpu")
            await _type(pilot, screen, "batch_size", "0")
            assert "got 0, expected a positive integer" in _note(screen, "batch_size")
            await _type(pilot, screen, "hang_timeout_s", "soon")
            assert "expected a number > 0" in _note(screen, "hang_timeout_s")
            assert set(screen.errors) == {"batch_size", "hang_timeout_s"}
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert not (home / "config" / "presets" / "devices" / "cpu.toml").exists()

    run(drive())
    assert shipped.read_bytes() == before


def test_cross_field_rule_lands_on_its_field(home):
    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await _open_editor(pilot, app, "devices", "mps")
            screen.query_one("#field-compile").value = True
            await pilot.pause()
            assert "refused on MPS" in _note(screen, "compile")
            screen.query_one("#field-fallback").value = '["mps-safe", "nope"]'
            await pilot.pause()
            assert "'nope'" in _note(screen, "fallback")

    run(drive())


def test_save_writes_toml_to_the_user_dir_and_shows_the_difference(home):
    shipped = paths.shipped_presets_dir() / "devices" / "cpu.toml"
    before = shipped.read_bytes()

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await _open_editor(pilot, app, "devices", "cpu")
            await _type(pilot, screen, "batch_size", "16")
            assert not screen.errors
            head = str(screen.query_one("#editor-head").render())
            assert "differs from shipped: batch_size 8 → 16" in head
            await pilot.press("ctrl+s")
            await pilot.pause()
            saved = home / "config" / "presets" / "devices" / "cpu.toml"
            table = tomllib.loads(saved.read_text())
            assert table["batch_size"] == 16 and table["accumulation"] == 64
            # Save as: a new name next to it.
            await pilot.press("ctrl+o")
            await pilot.pause()
            app.screen.query_one("#saveas-name").value = "cpu-16"
            await pilot.press("enter")
            await pilot.pause()
            other = home / "config" / "presets" / "devices" / "cpu-16.toml"
            assert tomllib.loads(other.read_text())["batch_size"] == 16
            await pilot.press("escape")
            await pilot.pause()
            # Back on the launch screen the new preset is listed as the user's.
            devices = app.screen.query_one("#devices")
            assert "cpu-16" in [o.id for o in devices._options]

    run(drive())
    assert shipped.read_bytes() == before


def test_workload_editor_checks_train_and_params(home):
    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await _open_editor(pilot, app, "workloads", "matmul")
            await _type(pilot, screen, "train.epochs", "-1")
            await _type(pilot, screen, "params.n", "1")
            assert "expected a number > 0" in _note(screen, "train.epochs")
            assert "expected an integer >= 2" in _note(screen, "params.n")
            await _type(pilot, screen, "train.epochs", "3")
            await _type(pilot, screen, "params.n", "64")
            assert not screen.errors
            await pilot.press("ctrl+s")
            await pilot.pause()
            table = tomllib.loads((home / "config" / "presets" / "workloads" / "matmul.toml").read_text())
            assert table["workload"] == "matmul" and table["train"]["epochs"] == 3 and table["params"]["n"] == 64

    run(drive())

"""The app as a whole, driven headless by Pilot at 80x24: the launch screen, help, the command
palette, attaching to a live run at start-up, and what quitting does to a live run."""

from __future__ import annotations

import subprocess
import sys

from textual.widgets import Markdown

from cockpit.app import make_app
from cockpit.ui.dashboard import DashboardScreen
from cockpit.ui.help import HelpScreen, key_commands
from cockpit.ui.launch import LaunchScreen
from cockpit.ui.quit import QuitScreen
from cockpit.ui.runs import RunsScreen
from conftest import user_preset
from engine.record.rundir import list_runs
from ui_support import copy_run, fake_live, run, wait_for


def _text(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


def test_launch_lists_presets_resolves_and_refuses_a_bad_override(home):
    user_preset(home, "devices", "cpu", 'device = "cpu"\nbatch_size = 4\n')
    user_preset(home, "devices", "mine", 'device = "cpu"\nbatch_size = 2\n')

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = app.screen
            assert isinstance(screen, LaunchScreen)
            devices = {str(o.id): str(o.prompt) for o in screen.query_one("#devices")._options}
            assert "shipped" in devices["mps-safe"] and "yours*" in devices["cpu"] and "yours" in devices["mine"]
            assert "matmul" in [o.id for o in screen.query_one("#workloads")._options]
            assert "no probe yet" in _text(screen, "#probe")
            screen.query_one("#devices").focus()
            screen.query_one("#devices").highlighted = [o.id for o in screen.query_one("#devices")._options].index("cpu")
            await pilot.pause()
            assert "batch 4 x 1" in _text(screen, "#resolved-text")  # the user's cpu shadows the shipped one
            screen.query_one("#overrides").value = "batch_size=0"
            await pilot.pause()
            assert "--set: device.batch_size: got 0, expected a positive integer" in _text(screen, "#resolved-text")
            await pilot.press("r")
            await pilot.pause()
            assert isinstance(app.screen, LaunchScreen) and not list_runs()
            await pilot.press("q")
        return app.return_code

    assert run(drive()) in (0, None)


def test_help_screen_and_command_palette(home):
    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            source = app.screen.query_one(Markdown).source
            assert source.startswith("# Launch") and "**Command palette**" in source
            await pilot.press("escape")
            titles = [c.title for c in key_commands(app.screen, app)]
            assert {"Runs", "Help", "Run", "Probe", "Edit preset", "Quit"} <= set(titles)
            await pilot.press("o")
            await pilot.pause()
            assert isinstance(app.screen, RunsScreen)

    run(drive())


def test_runs_screen_lists_history_and_opens_a_past_run(home):
    copy_run(home, "finished", "20261123-000001-finished")
    copy_run(home, "crash-fallback", "20261123-000002-crash")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("o")
            screen = app.screen
            await wait_for(pilot, lambda: len(screen.rows) == 2, what="the runs to load")
            table = screen.query_one("#runs")
            first = [str(c) for c in table.get_row_at(0)]
            assert first[2] == "finished" and first[4] == "auto(cpu)→cpu" and first[7] == "2"  # after the mark column
            assert "SIGABRT" in _text(screen, "#run-detail")
            await pilot.press("enter")
            await pilot.pause()
            dash = app.screen
            assert isinstance(dash, DashboardScreen) and dash.run.id == "20261123-000002-crash"
            await wait_for(pilot, lambda: dash.ended, what="the replay")

    run(drive())


def test_start_attaches_to_a_live_run_and_quit_can_leave_it_running(home):
    path = copy_run(home, "finished")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake_live(path, proc.pid)

        async def drive():
            app = make_app()
            async with app.run_test(size=(80, 24)) as pilot:
                await pilot.pause()
                dash = app.screen
                assert isinstance(dash, DashboardScreen)            # attached at start-up
                await wait_for(pilot, lambda: "attached" in _text(dash, "#status"), what="the live run")
                await pilot.press("q")
                await pilot.pause()
                assert isinstance(app.screen, QuitScreen)
                await pilot.press("escape")                          # cancel: still here
                await pilot.pause()
                assert isinstance(app.screen, DashboardScreen)
                await pilot.press("q")
                await pilot.pause()
                await pilot.press("l")                               # leave it running
                await pilot.pause()
            return app.return_code

        assert run(drive()) in (0, None)
        assert proc.poll() is None                                   # the run was not touched
    finally:
        proc.kill()


def test_quit_can_stop_the_live_run(home):
    path = copy_run(home, "finished")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake_live(path, proc.pid)

        async def drive():
            app = make_app()
            async with app.run_test(size=(80, 24)) as pilot:
                await pilot.pause()
                await pilot.press("q")
                await pilot.pause()
                await pilot.press("s")
                await pilot.pause()

        run(drive())
        assert proc.wait(timeout=10) == -15                          # a graceful stop request
    finally:
        proc.kill()


def test_r_on_the_runs_screen_resumes_a_stopped_run_and_refuses_a_finished_one(home):
    copy_run(home, "finished", "20261123-000002-finished")
    stopped = copy_run(home, "finished", "20261123-000001-stopped")
    lines = (stopped / "events.jsonl").read_text().splitlines(keepends=True)
    cut = max(i for i, line in enumerate(lines) if '"type":"checkpoint"' in line and '"attempt":1' in line)
    end = '{"v":1,"t":1795400000.0,"type":"run_finished","attempt":0,"status":"stopped","attempts":1}\n'
    (stopped / "events.jsonl").write_text("".join(lines[:cut + 1]) + end)

    async def drive():
        app = make_app(attach=False)
        opened = []
        app.open_run = lambda run, start=False: opened.append((run.id, start))
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("o")
            screen = app.screen
            await wait_for(pilot, lambda: len(screen.rows) == 2, what="the runs to load")
            await pilot.press("r")   # the finished run, first row
            await wait_for(pilot, lambda: app._notifications, what="a notification")
            assert "nothing to resume" in list(app._notifications)[-1].message and not opened
            await pilot.press("down", "r")
            await wait_for(pilot, lambda: opened, what="the resumed run to open")
            assert opened == [("20261123-000001-stopped", True)]

    run(drive())

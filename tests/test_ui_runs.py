"""The runs screen, driven by Pilot at 80x24 and 200x50 over the recorded fixture runs: the run
id and the run's average throughput in the table, a refresh by itself, Stop offered only on a
running run, marks, and the keys that open the logs and the comparison."""

from __future__ import annotations

import subprocess
import sys

import pytest
from textual.widgets._footer import FooterKey

from cockpit.app import make_app
from cockpit.ui import runs as runs_screen
from cockpit.ui.logs import LogScreen
from cockpit.ui.runs import MARK, RunsScreen, live_runs
from engine.numbers import rate
from engine.record.rundir import RunDir
from engine.record.stats import averages
from ui_support import copy_run, fake_live, open_runs, run, wait_for

SIZES = [(80, 24), (200, 50)]


def _row(screen: RunsScreen, run_id: str) -> dict[str, str]:
    table = screen.query_one("#runs")
    return {name: str(cell) for name, cell in zip(screen.COLUMNS, table.get_row(run_id))}


def _footer_actions(screen) -> list[str]:
    return [k.action for k in screen.query(FooterKey)]


@pytest.mark.parametrize("size", SIZES)
def test_the_table_shows_the_run_id_and_its_average_throughput(home, size):
    path = copy_run(home, "finished", "20261123-000001-finished")
    average = averages(RunDir(path).events()).samples_per_s
    last_window = RunDir(path).events()
    last_window = [e for e in last_window if e["type"] == "step"][-1]["samples_per_s"]
    assert rate(average) != rate(last_window)   # the fixture tells the two apart

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            screen = await open_runs(app, pilot, 1)
            row = _row(screen, "20261123-000001-finished")
            assert row["id"] == "20261123-000001-finished"
            assert row["samples/s"] == rate(average)
            assert f"{rate(average)} samples/s avg" in str(screen.query_one("#run-detail").render())

    run(drive())


def test_the_screen_refreshes_by_itself(home, monkeypatch):
    monkeypatch.setattr(runs_screen, "REFRESH_S", 0.2)
    copy_run(home, "finished", "20261123-000001-finished")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_runs(app, pilot, 1)
            digest = screen._digests.refresh()[0]
            copy_run(home, "crash-fallback", "20261123-000002-crash")
            await wait_for(pilot, lambda: len(screen.rows) == 2, what="the new run to appear")
            # the cursor stays on the run it was on, now the second row
            assert screen._selected().id == "20261123-000001-finished"
            # the finished run was not read again: the same digest, nothing new in it
            assert screen._digests.refresh()[1] is digest and not digest.refresh()

    run(drive())


@pytest.mark.parametrize("size", SIZES)
def test_stop_is_offered_on_a_running_run_only(home, size):
    copy_run(home, "finished", "20261123-000001-finished")
    live = copy_run(home, "finished", "20261123-000002-live")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake_live(live, proc.pid)

        async def drive():
            app = make_app(attach=False)
            async with app.run_test(size=size) as pilot:
                screen = await open_runs(app, pilot, 2)
                assert _row(screen, "20261123-000002-live")["status"] == "running"
                # the footer composes its keys after a refresh (call_after_refresh), not with the rows
                await wait_for(pilot, lambda: "stop" in _footer_actions(screen),
                               what="the footer to offer Stop on the live run")
                assert "resume" not in _footer_actions(screen)   # the live run, first row
                await pilot.press("down")
                await wait_for(pilot, lambda: "stop" not in _footer_actions(screen),
                               what="the footer to drop Stop on the finished run")
                assert "resume" in _footer_actions(screen)
                await pilot.press("s")                                  # not offered: nothing happens
                await pilot.pause()
                assert not app._notifications and proc.poll() is None

        run(drive())
    finally:
        proc.kill()


def test_space_marks_and_unmarks_runs(home):
    copy_run(home, "finished", "20261123-000001-finished")
    copy_run(home, "crash-fallback", "20261123-000002-crash")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_runs(app, pilot, 2)
            await pilot.press("space")
            assert screen.sub_title == "1 marked: mark another to compare"
            await pilot.press("down", "space")
            assert screen.marked == {"20261123-000001-finished", "20261123-000002-crash"}
            assert screen.sub_title == "2 marked: c compares them"
            assert _row(screen, "20261123-000002-crash")[MARK] == MARK
            await pilot.press("space")
            assert screen.marked == {"20261123-000002-crash"}
            assert _row(screen, "20261123-000001-finished")[MARK] == ""
            before = screen.rows                                # each RunsLoaded hands over a new list
            screen.load()                                       # a refresh keeps the marks
            await wait_for(pilot, lambda: screen.rows is not before, what="the refresh to arrive")
            assert screen.marked == {"20261123-000002-crash"}
            assert _row(screen, "20261123-000002-crash")[MARK] == MARK
            assert _row(screen, "20261123-000001-finished")[MARK] == ""

    run(drive())


@pytest.mark.parametrize("size", SIZES)
def test_l_opens_the_log_view_of_the_highlighted_run(home, size):
    copy_run(home, "finished", "20261123-000001-finished")
    copy_run(home, "crash-fallback", "20261123-000002-crash")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            runs = await open_runs(app, pilot, 2)
            await pilot.press("down", "l")
            await wait_for(pilot, lambda: isinstance(app.screen, LogScreen), what="the log view")
            assert app.screen.run.id == "20261123-000001-finished"
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is runs, what="back on the runs screen")

    run(drive())


def test_live_runs_reads_a_live_run_once_then_only_what_it_appends(home):
    copy_run(home, "finished", "20261123-000001-finished")
    live = copy_run(home, "finished", "20261123-000002-live")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake_live(live, proc.pid)
        assert [r.id for r in live_runs()] == ["20261123-000002-live"]
        digest = runs_screen._live[live]
        offset = digest._follower.offset
        assert [r.id for r in live_runs()] == ["20261123-000002-live"]
        assert runs_screen._live[live] is digest and digest._follower.offset == offset
        with open(live / "events.jsonl", "a") as f:
            f.write('{"v":1,"t":1795432700.0,"type":"run_finished","attempt":0,"status":"stopped"}\n')
        assert live_runs() == [] and digest.summary.status == "stopped"
        proc.kill()
        proc.wait()
        assert live_runs() == [] and live not in runs_screen._live   # its supervisor is gone
    finally:
        proc.kill()

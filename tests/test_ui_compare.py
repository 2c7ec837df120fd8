"""Comparing runs, driven by Pilot at 80x24 and 200x50 from the runs screen: two marked fixture
runs and c give their curves overlaid and a table of what differs; x cycles the x axis; fewer
than two marked runs get a sentence; runs of different workloads, runs without steps and a
live run that goes on."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from cockpit.app import make_app
from cockpit.ui import compare as compare_screen
from cockpit.ui.compare import CompareScreen, colour
from cockpit.ui.runs import RunsScreen
from engine import files
from engine.runconfig import resolve
from ui_support import RUNS, copy_run, fake_live, run, wait_for

SIZES = [(80, 24), (200, 50)]
FINISHED, CRASH = "20261123-000001-finished", "20261123-000002-crash"


def _table(screen: CompareScreen) -> dict[str, list[str]]:
    """The comparison table as {row name: [one cell per run]}."""
    table = screen.query_one("#compare-table")
    rows = {}
    for i in range(table.row_count):
        name, *cells = (str(c) for c in table.get_row_at(i))
        rows[name] = cells
    return rows


async def _compare(app, pilot, marks: list[str]) -> CompareScreen:
    """Open the runs screen, mark the rows named by `marks` (in table order), press c."""
    await pilot.press("o")
    runs = app.screen
    await wait_for(pilot, lambda: len(runs.rows) == len(marks), what="the runs to load")
    for i, mark in enumerate(marks):
        if mark:
            await pilot.press("space")
        if i < len(marks) - 1:
            await pilot.press("down")
    await pilot.press("c")
    await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.compared,
                   what="the comparison to load")
    return app.screen


@pytest.mark.parametrize("size", SIZES)
def test_two_marked_runs_are_compared_curves_and_what_differs(home, size):
    copy_run(home, "finished", FINISHED)
    copy_run(home, "crash-fallback", CRASH)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            screen = await _compare(app, pilot, ["x", "x"])
            assert [c.run.id for c in screen.compared] == [CRASH, FINISHED]
            legend = str(screen.query_one("#compare-legend").render())
            assert f"A {CRASH}" in legend and f"B {FINISHED}" in legend
            rows = _table(screen)
            # at 80 columns values are cut to fit beside the names; the legend has the ids whole
            for cell, run_id in zip(rows["id"], [CRASH, FINISHED]):
                assert cell == run_id or (size == (80, 24) and run_id.startswith(cell.removesuffix("…")))
            assert "train.checkpoint_every_steps" in rows   # a setting's name is never cut
            assert rows["status"] == ["finished", "finished"]
            assert rows["final loss"] == ["0.09574", "0.009409"]
            assert rows["r2"] == ["0.917", "0.9904"]
            assert rows["ran on"] == ["auto(cpu)→cpu", "cpu"]
            assert rows["GFLOP/s avg"] == ["0.00572", "8.24"]   # matmul counts its FLOPs
            assert rows["steps lost"] == ["0", "0"]
            # only the settings that differ, each with both values
            assert rows["train.lr"] == ["0.05", "0.02"] and rows["params.n"] == ["32", "512"]
            assert rows["device.inject"] == ["native-crash@12", "-"]
            assert "device.accumulation" not in rows and "train.seed" not in rows
            assert any(name.endswith("settings differ") for name in rows)
            # one line per run on each plot, in the run's own colour
            loss = screen.query_one("#loss-overlay")
            assert [line_colour for _, _, line_colour in loss.drawn] == [colour(0), colour(1)]
            assert colour(0) != colour(1) and "red" not in colour(0) + colour(1)
            assert screen.query_one("#eval-overlay").border_title == "r2 by steps"
            await pilot.press("escape")
            assert isinstance(app.screen, RunsScreen)

    run(drive())


@pytest.mark.parametrize("size", SIZES)
def test_x_cycles_steps_samples_and_time(home, size):
    copy_run(home, "finished", FINISHED)
    copy_run(home, "crash-fallback", CRASH)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            screen = await _compare(app, pilot, ["x", "x"])
            loss = screen.query_one("#loss-overlay")

            def last_x(run_index: int) -> float:
                return loss.drawn[run_index][0][-1]

            assert loss.border_title == "loss by steps" and last_x(1) == 256
            await pilot.press("x")
            assert loss.border_title == "loss by samples" and last_x(1) == 16384
            await pilot.press("x")
            assert loss.border_title == "loss by time (s)" and 60 < last_x(1) < 70
            assert screen.query_one("#eval-overlay").border_title == "r2 by time (s)"
            await pilot.press("x")
            assert loss.border_title == "loss by steps" and last_x(0) == 12

    run(drive())


@pytest.mark.parametrize("size", SIZES)
def test_fewer_than_two_marked_runs_get_a_sentence(home, size):
    copy_run(home, "finished", FINISHED)
    copy_run(home, "crash-fallback", CRASH)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            await pilot.press("o")
            runs = app.screen
            await wait_for(pilot, lambda: len(runs.rows) == 2, what="the runs to load")
            await pilot.press("c")                       # nothing marked
            await wait_for(pilot, lambda: app._notifications, what="a notification")
            assert "mark two or more with space" in list(app._notifications)[-1].message
            await pilot.press("space", "c")              # one marked
            await pilot.pause()
            assert "1 run marked" in list(app._notifications)[-1].message
            assert app.screen is runs

    run(drive())


def test_runs_of_different_workloads_and_runs_without_steps(home):
    copy_run(home, "finished", FINISHED)
    # a trm-tiny run that failed before its first step: its own workload's settings, no curves
    other = copy_run(home, "finished", "20261123-000002-trm")
    files.atomic_write(other / "run.toml", files.dump_toml(resolve("trm-tiny", "cpu").to_table()))
    lines = (other / "events.jsonl").read_text().splitlines(keepends=True)
    first_step = next(i for i, line in enumerate(lines) if '"type":"step"' in line)
    end = '{"v":1,"t":1795432621.0,"type":"run_finished","attempt":0,"status":"failed","attempts":1}\n'
    (other / "events.jsonl").write_text("".join(lines[:first_step]) + end)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await _compare(app, pilot, ["x", "x"])
            rows = _table(screen)
            assert rows["workload_preset"] == ["trm-tiny", "matmul"]
            assert rows["params.hidden_size"][1] == "-" and rows["params.n"] == ["-", "512"]
            assert rows["steps"] == ["no steps", "256/256"] and rows["final loss"][0] == "-"
            assert "(no steps)" in str(screen.query_one("#compare-legend").render())
            loss = screen.query_one("#loss-overlay")
            assert len(loss.drawn) == 1                  # the run with steps has its line

    run(drive())


def test_no_run_with_steps_says_so_instead_of_drawing_axes(home):
    for name in ("20261123-000001-a", "20261123-000002-b"):
        path = copy_run(home, "finished", name)
        lines = (path / "events.jsonl").read_text().splitlines(keepends=True)
        (path / "events.jsonl").write_text("".join(l for l in lines if '"type":"step"' not in l
                                                   and '"type":"eval"' not in l))

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await _compare(app, pilot, ["x", "x"])
            for plot_id, sentence in (("#loss-overlay", "no steps"), ("#eval-overlay", "no eval metrics")):
                plot = screen.query_one(plot_id)
                note = plot.query_one(".empty")
                assert not plot.drawn and note.display and str(note.render()) == sentence
                assert not plot.children[0].display         # no axes at all

    run(drive())


def test_a_live_run_goes_on_in_the_comparison(home, monkeypatch):
    monkeypatch.setattr(compare_screen, "REFRESH_S", 0.2)
    copy_run(home, "finished", FINISHED)
    live = copy_run(home, "finished", "20261123-000002-live")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake_live(live, proc.pid)

        async def drive():
            app = make_app(attach=False)
            async with app.run_test(size=(80, 24)) as pilot:
                screen = await _compare(app, pilot, ["x", "x"])
                before = len(screen.compared[0].curves.loss)
                assert _table(screen)["status"][0] == "running" and before < 130
                rest = (RUNS / "finished" / "events.jsonl").read_text().splitlines(keepends=True)
                with open(live / "events.jsonl", "a") as f:   # the run goes on...
                    f.write("".join(rest[len((live / "events.jsonl").read_text().splitlines()):]))
                os.remove(live / "supervisor.pid")           # ...and finishes
                await wait_for(pilot, lambda: _table(screen)["status"][0] == "finished",
                               what="the comparison to follow the run")
                assert len(screen.compared[0].curves.loss) == 130
                assert screen._refresh_timer is None         # nothing live: no more reading

        run(drive())
    finally:
        proc.kill()


def test_y_puts_loss_on_a_log_scale_and_e_picks_the_eval_metric(home):
    copy_run(home, "finished", FINISHED)
    other = copy_run(home, "crash-fallback", CRASH)
    with open(other / "events.jsonl", "a") as f:   # a second metric, in one run only
        f.write('{"v":1,"t":1795432298.4,"type":"eval","attempt":2,"step":12,"metrics":{"r2":0.92,"mse":0.04}}\n')

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await _compare(app, pilot, ["x", "x"])
            loss = screen.query_one("#loss-overlay")
            linear = loss.drawn[1][1][-1]
            await pilot.press("y")
            assert loss.border_title == "loss (log) by steps"
            assert loss.drawn[1][1][-1] == pytest.approx(math.log10(linear))
            await pilot.press("y")
            assert loss.border_title == "loss by steps" and loss.drawn[1][1][-1] == linear
            evals = screen.query_one("#eval-overlay")
            assert evals.border_title == "r2 by steps (e: next)"
            await pilot.press("e")
            assert evals.border_title == "mse by steps (e: next)"
            assert len(evals.drawn) == 1 and evals.drawn[0][2] == colour(0)   # the run that has it
            assert _table(screen)["mse"] == ["0.04", "-"]
            await pilot.press("e")
            assert evals.border_title.startswith("r2 by steps")

    run(drive())

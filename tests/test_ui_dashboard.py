"""The run dashboard: a real tiny training run started from the launch screen, through an
injected native crash and the fallback to the end; replay of recorded runs; stop; a flood of
events that the screen keeps up with in bounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

from cockpit.app import make_app
from cockpit.ui.dashboard import DashboardScreen
from cockpit.ui.model import LOG_LINES, MAX_POINTS
from conftest import TINY
from engine.run.events import read_events
from engine.run.rundir import RunDir, list_runs
from ui_support import copy_run, run, wait_for


def _text(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


def test_real_run_through_the_ui_crashes_falls_back_and_finishes(home):
    overrides = TINY + ["train.checkpoint_every_steps=2", "device.inject=['native-crash@4']",
                        "device.rules={native-crash='next'}"]  # not the default retry-progress

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            app.screen.query_one("#overrides").value = " ".join(f'"{o}"' for o in overrides)
            await pilot.pause()
            assert "inject  native-crash@4" in _text(app.screen, "#resolved-text")
            await pilot.press("r")
            await pilot.pause()
            dash = app.screen
            assert isinstance(dash, DashboardScreen) and dash.start
            await wait_for(pilot, lambda: dash.model.finished, timeout=120, what="the run to end")
            await pilot.pause(0.3)
            m = dash.model
            assert m.status == "finished", "\n".join(m.log)
            assert [a.outcome for a in m.attempts] == ["native-crash", "finished"]
            assert m.attempts[0].crash["evidence"]["signal"] == "SIGABRT"
            assert m.attempts[1].resumed_from["step"] == 2     # the checkpoint before the crash
            assert m.metrics["r2"] > 0.5                       # it trained to the end
            panel = dash.query_one("#attempts-text").render()
            text = str(panel)
            assert "native-crash" in text and "SIGABRT" in text and "attempt 2 on cpu" in text
            assert "resume at step 2" in text
            assert dash.query_one("#attempts").has_class("crashed")
            assert "took" in _text(dash, "#progress-text")
            await pilot.press("escape")
            assert not isinstance(app.screen, DashboardScreen)

    run(drive())
    (only,) = list_runs()
    assert [e["type"] for e in read_events(only.events_path)][-1] == "run_finished"


def test_replayed_run_shows_crash_panel_plots_and_log(home):
    path = copy_run(home, "crash-fallback")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = app.open_run(RunDir(path))
            await wait_for(pilot, lambda: dash.ended, what="the replay")
            await pilot.pause(0.3)
            assert not dash.start and dash.model.live is False
            assert "finished" in _text(dash, "#status")
            assert "SIGABRT" in _text(dash, "#attempts-text")
            rate = dash.query_one("#rate-plot")
            assert rate._datasets and len(rate._v_lines) == 1  # the crash is marked on the plot
            assert "samples/s" in rate.border_title
            await pilot.press("t")
            await pilot.pause(0.2)
            assert "steps/s" in rate.border_title
            assert any("fallback: attempt 2 on cpu" in line for line in dash.model.log)
            assert "run finished" in _text(dash, "#log")      # the log's tail is on screen

    run(drive())


def test_stop_asks_the_supervisor_to_stop(home):
    path = copy_run(home, "finished")
    # A stand-in supervisor: stop is a SIGTERM to the pid in supervisor.pid.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lines = (path / "events.jsonl").read_text().splitlines(keepends=True)
        (path / "events.jsonl").write_text("".join(lines[:40]))
        RunDir(path).write_supervisor_pid(proc.pid)

        async def drive():
            app = make_app(attach=False)
            async with app.run_test(size=(80, 24)) as pilot:
                dash = app.open_run(RunDir(path))
                await wait_for(pilot, lambda: "running" in _text(dash, "#status"), what="the live run")
                await pilot.press("s")
                assert proc.wait(timeout=10) == -15

        run(drive())
    finally:
        proc.kill()


def test_a_flood_of_events_is_kept_up_with_in_bounded_memory(home):
    """Replay a recorded run's events, appended as fast as they can be written (thousands a
    second): every event reaches the model, the screen repaints at most ~10 times a second,
    and the plotted series and the log stay bounded."""
    path = copy_run(home, "finished")
    events = read_events(path / "events.jsonl")
    body = [e for e in events if e["type"] in ("step", "memory", "eval", "checkpoint")]
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events[:3]))
    RunDir(path).write_supervisor_pid(__import__('os').getpid())
    rounds, written = 60, [0]

    def writer():
        with open(path / "events.jsonl", "a") as f:
            for k in range(rounds):
                for e in body:
                    f.write(json.dumps({**e, "t": time.time()}) + "\n")
                f.flush()
                written[0] += len(body)
                time.sleep(0.02)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = app.open_run(RunDir(path))
            await wait_for(pilot, lambda: dash.model.events_seen >= 3, what="the start")
            started = time.monotonic()
            t = threading.Thread(target=writer)
            t.start()
            await wait_for(pilot, lambda: not t.is_alive(), timeout=60, what="the writer")
            total = 3 + rounds * len(body)
            await wait_for(pilot, lambda: dash.model.events_seen == total, what="the screen to catch up")
            elapsed = time.monotonic() - started
            assert dash.frames <= 10 * elapsed + 5, (dash.frames, elapsed)
            assert len(dash.model.samples_series) < MAX_POINTS and len(dash.model.log) <= LOG_LINES

    run(drive())  # the rates themselves are measured by benchmarks/ui_events.py

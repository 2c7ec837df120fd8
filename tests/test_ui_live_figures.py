"""An attached live run's figures on the dashboard keep up with its events: the attempts
panel's "last step" (issue 16 item 6: it said 790 while progress said 1712) and the run's
average throughput, which a final fragment window cannot move."""

from __future__ import annotations

import json

import pytest

from textual.widgets import Static

from cockpit.app import make_app
from cockpit.ui.widgets.attempts import AttemptsPanel
from engine.record.events import read_events
from engine.record.rundir import RunDir
from ui_support import copy_run, fake_live, run, wait_for


def panel_text(dash) -> str:
    """What the attempts panel shows (its text widget's render), wrapped lines joined."""
    return " ".join(str(dash.query_one(AttemptsPanel).query_one("#attempts-text", Static).render()).split())


def running_step_shown(dash) -> int | None:
    """The "last step" the panel gives the running attempt, or None if it gives none."""
    words = panel_text(dash).split("running", 1)[-1].split()
    return int(words[2]) if words[:2] == ["last", "step"] else None


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
def test_the_attempts_panel_never_shows_a_stale_last_step_on_an_attached_run(home, size):
    """The running attempt's last step is current in the model; the panel shows it current or
    leaves it to the progress line, never the step it had when the panel was first drawn."""
    path = copy_run(home, "finished")
    fake_live(path)   # cut mid-run, with a live supervisor pid: the dashboard attaches
    events = read_events(path / "events.jsonl")
    last = [e for e in events if e["type"] == "step"][-1]

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            dash = app.open_run(RunDir(path))
            await wait_for(pilot, lambda: dash.model.live and dash.model.step == last["step"],
                           what="the attached run")
            await wait_for(pilot, lambda: "running" in panel_text(dash), what="the panel")
            assert running_step_shown(dash) in (None, last["step"])
            # The run goes on: steps appended as the trainer would write them.
            with open(path / "events.jsonl", "a") as f:
                for i in range(1, 4):
                    f.write(json.dumps({**last, "t": last["t"] + i, "step": last["step"] + 10 * i,
                                        "samples_seen": last["samples_seen"] + 640 * i}) + "\n")
            newest = last["step"] + 30
            await wait_for(pilot, lambda: dash.model.step == newest, what="the new steps")
            assert dash.model.attempts[-1].last_step == newest
            await wait_for(pilot, lambda: running_step_shown(dash) in (None, newest),
                           what="the panel to follow")

    run(drive())


def test_a_final_fragment_does_not_move_the_live_figure_or_the_average(home):
    path = copy_run(home, "finished")
    events = read_events(path / "events.jsonl")
    steps = [e for e in events if e["type"] == "step"]
    # The recorded run's last window, made the 0.1 s fragment at 6,990/s.
    fragment = {**steps[-1], "window_s": 0.1, "samples_per_s": 6990.0, "partial": True}
    events[events.index(steps[-1])] = fragment
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = app.open_run(RunDir(path))
            await wait_for(pilot, lambda: dash.ended, what="the replay")
            m = dash.model
            assert m.samples_per_s == steps[-2]["samples_per_s"]   # the last full window's
            assert m.avg_samples_per_s < 2 * max(e["samples_per_s"] for e in steps[:-1])
            assert max(m.samples_series.points()[1]) < 6990

    run(drive())

"""Training-health findings in the TUI: the recorded clean run with a gradient norm explosion
warned at step 61, a loss spike at step 121 answered by a rewind to the checkpoint at step 100
(the attempt ended, the next resuming there, skipping 300 batches) and divergence warned at the
eval of step 192. The attempts panel says each finding in a line -- what was found and what was
done -- that fits 80x24; the loss plot marks each under its time and the rewind with ↶ on top of
its dashed line, the loss after it going on in time, never back."""

from __future__ import annotations

import json

import pytest

from cockpit.app import make_app
from cockpit.ui.findings import GLYPHS, REWIND_GLYPH, finding_line
from cockpit.ui.model import RunModel
from cockpit.ui.widgets.attempts import AttemptsPanel, attempts_layout
from cockpit.ui.widgets.plots import PlotCard
from engine.record.events import read_events
from engine.record.rundir import RunDir
from test_ui_dashboard import _painted, screen_lines
from ui_support import RUNS, run, wait_for

EXPLOSION, SPIKE, DIVERGED, TO_STEP, SKIPPED = 61, 121, 192, 100, 300
WHY = f"loss spike at step {SPIKE} (z 9.1): rewound to {TO_STEP}, skipping {SKIPPED} batches"


def _finding(kind: str, step: int, t: float, action: str, short: str, **evidence) -> dict:
    """A health event as engine.run.training_health's Finding.fields() says it (its rule's
    numbers left out: no line shown here reads them)."""
    return {"v": 1, "t": t, "type": "health", "attempt": 1, "kind": kind, "step": step, "began": step,
            "value": None, "mean": None, "std": None, "z": None, "rule": "(the rule)", "action": action,
            "sentence": f"{short.split(' (')[0]}: (the rule)", "short": short, **evidence}


def health_run(home) -> RunDir:
    """The recorded clean run, as a supervisor with a [health] table of warn, rewind and warn
    would have written it."""
    events = read_events(RUNS / "finished" / "events.jsonl")
    at = {e["step"]: i for i, e in enumerate(events) if e["type"] == "step"}
    spike = dict(events[at[SPIKE]])
    spike["loss"] *= 50   # the report that carries the spike
    t = spike["t"]
    explosion = _finding("grad-explosion", EXPLOSION, events[at[EXPLOSION]]["t"] + 0.01, "warn",
                         f"gradient norm explosion at step {EXPLOSION} (z 8.2)", value=41.0, mean=5.0, std=4.4, z=8.18)
    found = _finding("loss-spike", SPIKE, t + 0.01, "rewind", f"loss spike at step {SPIKE} (z 9.1)",
                     value=spike["loss"], mean=0.02, std=0.09, z=9.1)
    resume = {"step": TO_STEP, "samples_seen": TO_STEP * 32, "path": f"checkpoints/step-{TO_STEP:09d}.pt"}
    rewind = {"finding": "loss-spike", "step": SPIKE, "began": SPIKE, "to_step": TO_STEP,
              "checkpoint": resume["path"], "skip_batches": SKIPPED, "skips": True, "lr_scale": 1.0,
              "set_aside": [], "steps_lost": SPIKE - TO_STEP}
    first = next(e for e in events if e["type"] == "attempt_started")
    ready = next(e for e in events if e["type"] == "trainer_ready")
    ended = {"v": 1, "type": "attempt_ended", "attempt": 1, "preset": first["preset"], "outcome": "health",
             "exit_code": None, "signal": "SIGKILL", "exit": "SIGKILL", "last_step": SPIKE, "tail": ""}
    went_bad = [
        found,
        {"v": 1, "t": t + 0.4, "type": "crash", "attempt": 1, "preset": first["preset"], "kind": "health",
         "sentence": f"The run went bad: {found['sentence']}.", "exception": None,
         "evidence": {"signal": "SIGKILL", "last_step": SPIKE, "health": found}},
        {**ended, "t": t + 0.5},
        {"v": 1, "t": t + 0.6, "type": "fallback", "attempt": 1, "from": first["preset"], "to": first["preset"],
         "to_preset": first["preset"], "action": "rewind", "reason": "health", "why": WHY,
         "sentence": found["sentence"], "changed": {}, "resume": {**resume, "rewind": {"skip_batches": SKIPPED}},
         "next_attempt": 2, "rewind": rewind},
        {**first, "t": t + 0.7, "attempt": 2, "resume": resume},
        {**ready, "t": t + 1.5, "attempt": 2, "resumed_from": resume}]
    # the second attempt trains on from the checkpoint, later in time: the recorded run from
    # step 101, moved past the rewind
    shift = t + 2.0 - events[at[TO_STEP + 1]]["t"]
    later = [{**e, "t": e["t"] + shift, **({"attempt": 2} if e.get("attempt") == 1 else {})}
             for e in events[at[TO_STEP + 1]:]]
    evaluated = next(i for i, e in enumerate(later) if e["type"] == "eval" and e["step"] == DIVERGED)
    diverged = {**_finding("divergence", DIVERGED, later[evaluated]["t"] + 0.01, "warn",
                           f"divergence at step {DIVERGED}", value=0.05), "attempt": 2}
    written = (events[:at[EXPLOSION] + 1] + [explosion] + events[at[EXPLOSION] + 1:at[SPIKE]] + [spike] + went_bad
               + later[:evaluated + 1] + [diverged] + later[evaluated + 1:])
    path = home / "runs" / "20261123-000000-health"
    path.mkdir(parents=True)
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in written))
    return RunDir(path)


async def _opened(pilot, app, run_dir: RunDir):
    dash = app.open_run(run_dir)
    await wait_for(pilot, lambda: dash.ended and _painted(dash), what="the replay painted")
    await pilot.pause()   # and laid out
    return dash


def _rows(app, widget) -> list[str]:
    r = widget.region
    return [line[r.x:r.right] for line in screen_lines(app)[r.y:r.bottom]]


# ------------------------------------------------------------ the attempts panel


@pytest.mark.health_findings   # its runs are meant to go bad
@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
def test_each_finding_is_a_line_saying_what_was_done(home, size):
    run_dir = health_run(home)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            dash = await _opened(pilot, app, run_dir)
            panel = dash.query_one(AttemptsPanel)
            lines = {
                "explosion": f"{GLYPHS['grad-explosion']} gradient norm explosion at step {EXPLOSION}",
                "spike": f"{GLYPHS['loss-spike']} loss spike at step {SPIKE}",
                "divergence": f"{GLYPHS['divergence']} divergence at step {DIVERGED}: warned"}
            # the panel scrolls to its newest crash: the findings before it are above, a scroll away
            text = str(panel.query_one("#attempts-text").render())
            for line in lines.values():
                assert line in text, (line, text)
            rows = text.splitlines()
            width = panel.scrollable_content_region.width
            assert all(len(row) <= width for row in rows), rows   # a line each, none wrapped or cut off
            said = {name: next(row for row in rows if line in row) for name, line in lines.items()}
            assert said["explosion"].endswith(": warned")
            assert f"rewound to {TO_STEP}" in said["spike"]
            if width >= len(WHY) + 3:
                assert said["spike"].strip() == f"{GLYPHS['loss-spike']} {WHY}"
            # the rewind is the finding's line: not a retry besides, nor the finding's fields as evidence
            assert "retried" not in text and "health {" not in text
            if size == (80, 24):   # told compactly: the line stands for the crash's sentence too
                assert "The run went bad" not in text
            # what the user sees, scrolled as the panel left it: the rewind and the attempt after it
            await wait_for(pilot, lambda: any(lines["spike"] in row for row in _rows(app, panel))
                           and any("#2 " in row for row in _rows(app, panel)),
                           what="the rewind and the attempt after it in view")

    run(drive())


def test_a_finding_line_says_less_rather_than_wrap():
    m = RunModel()
    m.fold(read_events(RUNS / "finished" / "events.jsonl")[:3])
    (attempt,) = m.attempts
    finding = {"kind": "grad-explosion", "step": 12_345, "value": 41.0, "mean": 5.0, "std": 4.4,
               "action": "warn", "attempt": attempt.attempt}
    widths = [80, 50, 44, 40, 20]
    said = [finding_line(finding, attempt, width).plain for width in widths]
    assert said[0] == "◆ gradient norm explosion at step 12,345 (z 8.2): warned"
    assert all(len(line) <= width for line, width in zip(said, widths)), said
    assert all("12,345" in line for line in said[:-1])     # the step kept as long as any words fit
    assert said[-1].endswith("…")
    # a lower-lr rewind: said before the supervisor has gone back, then where it went
    spike = {**finding, "kind": "loss-spike", "step": 1_204, "action": "lower-lr"}
    assert finding_line(spike, attempt, 80).plain.endswith(": rewinding, lowering the lr")
    attempt.fallback = {"type": "fallback", "reason": "health", "action": "lower-lr", "resume": {"step": 1_100},
                        "rewind": {"finding": "loss-spike", "step": 1_204, "to_step": 1_100, "skip_batches": 300,
                                   "lr_scale": 0.5}}
    assert finding_line(spike, attempt, 100).plain == \
        "▲ loss spike at step 1,204 (z 8.2): rewound to 1,100, skipping 300 batches, lr x0.5"
    # as wide as a panel at 80x24: the step it went back to whole, whatever else goes
    assert finding_line(spike, attempt, 46).plain == "▲ loss spike at step 1,204: rewound to 1,100"


# ------------------------------------------------------------ the loss plot


@pytest.mark.health_findings   # its runs are meant to go bad
def test_the_loss_plot_marks_each_finding_at_its_step_and_the_rewind(home):
    run_dir = health_run(home)
    events = read_events(run_dir.events_path)
    started = events[0]["t"]

    def step_x(step: int, attempt: int, kind: str = "step") -> float:
        """The time of the report (or eval) of `step` in `attempt`, as the plot's x."""
        return next(e["t"] for e in events if e["type"] == kind and e["step"] == step
                    and e["attempt"] == attempt) - started

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _opened(pilot, app, run_dir)
            loss = dash.query_one("#loss-card", PlotCard)
            plot = loss.plot
            canvas = plot.query_one("#plot")
            rows = _rows(app, canvas)
            expected = {GLYPHS["grad-explosion"]: step_x(EXPLOSION, 1), GLYPHS["loss-spike"]: step_x(SPIKE, 1),
                        GLYPHS["divergence"]: step_x(DIVERGED, 2, "eval")}
            bottom = rows[-2]   # the row above the frame's bottom
            for glyph, x in expected.items():
                column, _ = plot.get_pixel_from_coordinate(x, 0)
                found = [i for i, ch in enumerate(bottom) if ch == glyph]
                # at the column of the report that carried it (said a moment later: a column on at most)
                assert found and min(abs(i - column) for i in found) <= 1, (glyph, column, found, bottom)
            # the rewind: the crash's dashed line with ↶ on top, between the spike and the resumed loss
            top = rows[1]
            (rewound,) = [i for i, ch in enumerate(top) if ch == REWIND_GLYPH]
            assert step_x(SPIKE, 1) <= plot.get_coordinate_from_pixel(rewound, 1)[0] + 1
            assert "┆" in "".join(row[rewound] for row in rows[2:-1])
            # the loss after the rewind goes on in time from step 100's: no line drawn back
            (line,) = plot._datasets
            assert list(line.x) == sorted(line.x)
            assert loss.plot.findings and all(g != "✗" for _, g in loss.plot.findings)

    run(drive())


@pytest.mark.health_findings   # its runs are meant to go bad
def test_the_full_account_says_a_rewind_once(home):
    """Tall enough for everything: the finding's line says the rewind; the crash's sentence and
    where the next attempt resumes follow it, the why not repeated, the evidence without the
    finding's fields."""
    run_dir = health_run(home)
    m = RunModel()
    m.fold(read_events(run_dir.events_path))
    text = attempts_layout(m, 120, height=None)[0].plain
    assert text.count(WHY) == 1
    assert f"→ attempt 2 on {m.attempts[1].preset}, resume at step {TO_STEP}" in text
    assert "The run went bad: loss spike" in text
    assert "'kind'" not in text and "health {" not in text

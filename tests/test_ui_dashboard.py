"""The run dashboard: a real tiny training run started from the launch screen, through an
injected native crash and the fallback to the end; replay of recorded runs; stop; a flood of
events that the screen keeps up with in bounded memory; the layout at 80x24, 100x30 and
200x50; the plots' keys; what a finished run no longer offers."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time

import pytest

from cockpit.app import make_app
from cockpit.ui.dashboard import DashboardScreen
from engine.numbers import metric
from cockpit.ui.model import LOG_LINES, MAX_POINTS, rate_text
from cockpit.ui.widgets.attempts import AttemptsPanel
from cockpit.ui.widgets.plots import CRASH_STYLE, LogTicks, PlotCard
from textual.widgets._toast import Toast
from conftest import TINY
from engine.record import stats
from engine.record.events import read_events
from engine.record.rundir import RunDir, list_runs
from ui_support import copy_run, fake_live, run, wait_for

SIZES = [(80, 24), (100, 30), (200, 50)]


def _text(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


def screen_lines(app) -> list[str]:
    """The terminal's rows as the user sees them (text cut off is not there)."""
    return [strip.text for strip in app.screen._compositor.render_strips()]


def on_screen(app, text: str) -> bool:
    return any(text in line for line in screen_lines(app))


def _events(path) -> list[dict]:
    return read_events(path / "events.jsonl")


def _write(path, events: list[dict]) -> None:
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def _painted(dash: DashboardScreen) -> bool:
    """Everything the dashboard has read is drawn: it paints on a timer, a frame (FRAME_S)
    after the events arrive, the plots at their own interval; no frame is due now."""
    return not dash._dirty and dash._paint_due is None


async def _open(pilot, app, path, *, live: bool = False) -> DashboardScreen:
    dash = app.open_run(RunDir(path))
    if live:
        await wait_for(pilot, lambda: dash.model.live and dash.model.step > 0, what="the live run")
    else:
        await wait_for(pilot, lambda: dash.ended, what="the replay")
    await wait_for(pilot, lambda: _painted(dash), what="the dashboard to paint what it read")
    await pilot.pause()   # and lay it out
    return dash


def _assert_whole(dash: DashboardScreen) -> None:
    """Every part of the screen inside it, none over another."""
    screen = dash.region
    parts = [w for w in dash.children if w.display]
    for w in parts:
        assert screen.contains_region(w.region), (w, w.region, screen)
        assert w.region.height > 0, w
    for i, a in enumerate(parts):
        for b in parts[i + 1:]:
            assert not a.region.overlaps(b.region), (a, b)
    cards = [c for c in dash.query(PlotCard) if c.display]
    plots = dash.query_one("#plots").region
    for i, a in enumerate(cards):
        assert plots.contains_region(a.region), a
        for b in cards[i + 1:]:
            assert not a.region.overlaps(b.region), (a, b)


def _data_rows(card: PlotCard) -> int:
    """Rows of a card's plot between the top and bottom of its frame."""
    return card.plot.query_one("#plot").size.height - 2


# ------------------------------------------------------------ a real run


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
            # the panels are painted by the frame after the end (a timer), "took" with them
            await wait_for(pilot, lambda: "took" in _text(dash, "#progress-text"), what="the end painted")
            m = dash.model
            assert m.status == "finished", "\n".join(m.log)
            assert [a.outcome for a in m.attempts] == ["native-crash", "finished"]
            assert m.attempts[0].crash["evidence"]["signal"] == "SIGABRT"
            assert m.attempts[1].resumed_from["step"] == 2     # the checkpoint before the crash
            assert m.metrics["r2"] > 0.5                       # it trained to the end
            text = " ".join(_text(dash, "#attempts-text").split())   # as read, across wrapped lines
            # told compactly at 80x24: the crash's sentence, what the fallback did, the attempt after
            assert "#1 auto on cpu: The trainer died from SIGABRT after step 3 " in text
            assert "→ fell back to cpu from step 2" in text and "#2 cpu on cpu finished" in text
            assert dash.query_one("#attempts").has_class("crashed")
            assert "took" in _text(dash, "#progress-text")
            await pilot.press("escape")
            assert not isinstance(app.screen, DashboardScreen)

    run(drive())
    (only,) = list_runs()
    assert [e["type"] for e in read_events(only.events_path)][-1] == "run_finished"


# ------------------------------------------------------------ replay


def test_replayed_run_shows_crash_panel_plots_and_log(home):
    path = copy_run(home, "crash-fallback")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _open(pilot, app, path)
            assert not dash.start and dash.model.live is False
            assert "finished" in _text(dash, "#status")
            assert "SIGABRT" in _text(dash, "#attempts-text")
            rate = dash.query_one("#rate-card", PlotCard)
            assert rate.plot._datasets and len(rate.plot._v_lines) == 1  # the crash is marked
            assert "samples/s" in rate.title_text
            await pilot.press("t")
            # replotted at the next frame (a timer), not in the key's handler
            await wait_for(pilot, lambda: "steps/s" in rate.title_text, what="the rate in steps/s")
            assert any("fallback: attempt 2 on cpu" in line for line in dash.model.log)
            assert "run finished" in _text(dash, "#log")      # the log's tail is on screen

    run(drive())


# ------------------------------------------------------------ layout


@pytest.mark.parametrize("size", SIZES)
def test_whole_at_every_size(home, size):
    """Nothing cut or overlapping at 80x24, 100x30 and 200x50; the finished line's metric,
    the footer's help and palette keys on screen; the plots more than two data rows."""
    path = copy_run(home, "finished")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            dash = await _open(pilot, app, path)
            _assert_whole(dash)
            r2 = metric(dash.model.metrics["r2"])
            assert on_screen(app, f"r2 {r2}") and on_screen(app, "took")
            # the footer composes its keys after a refresh (call_after_refresh), not with the screen
            keys = ("? Help", "^p palette", "Logs", "Window")
            await wait_for(pilot, lambda: all(on_screen(app, key) for key in keys), what="the footer's keys")
            for name in ("rate", "loss"):
                assert _data_rows(dash.query_one(f"#{name}-card", PlotCard)) >= 5, size
            lines = screen_lines(app)
            assert all(len(line) <= size[0] for line in lines)
            if size == (200, 50):
                # the space is used: every plot in a row, and a log of many lines
                shown = [c.id for c in dash.query(PlotCard) if c.display]
                assert shown == ["rate-card", "loss-card", "eval-card"]   # lr is constant: no plot
                assert _data_rows(dash.query_one("#rate-card", PlotCard)) >= 15
                assert dash.query_one("#log").content_size.height >= 8
                assert dash.query_one("#hardware").display and dash.query_one("#memory").display
            else:
                assert dash.query_one("#log").content_size.height >= 2

    run(drive())


@pytest.mark.parametrize("size", SIZES)
def test_live_run_whole_with_stop_and_detach_offered(home, size):
    path = copy_run(home, "finished")
    fake_live(path)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            dash = await _open(pilot, app, path, live=True)
            _assert_whole(dash)
            for key in ("s Stop", "d Detach", "? Help", "^p palette"):
                # the footer takes the live run's bindings at its next refresh (later when loaded)
                await wait_for(pilot, lambda: on_screen(app, key) or on_screen(app, key.replace(" ", "  ")),
                               what=f"{key!r} in the footer")

    run(drive())


def test_a_resize_lays_the_screen_out_again(home):
    path = copy_run(home, "crash-fallback")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _open(pilot, app, path)
            assert [c.id for c in dash.query(PlotCard) if c.display] == ["rate-card", "loss-card"]
            await pilot.resize_terminal(200, 50)
            await wait_for(pilot, lambda: dash.query_one("#eval-card").display, what="the eval card")
            # the attempts panel wraps again once laid out at its new width (its own resize): the
            # crash sentence on one line; the rest is repainted at the dashboard's next frame (a timer)
            sentence = "The trainer died from SIGABRT after step 10 without a Python traceback"
            await wait_for(pilot, lambda: on_screen(app, sentence), what="the crash sentence on one line")
            await wait_for(pilot, lambda: _painted(dash), what="the frame after the resize")
            await pilot.pause()   # and laid out
            _assert_whole(dash)
            assert dash.query_one("#hardware").display and _data_rows(dash.query_one("#rate-card", PlotCard)) >= 15
            await pilot.resize_terminal(80, 24)
            await wait_for(pilot, lambda: not dash.query_one("#eval-card").display, what="two cards")
            # the compact footer composes its keys after a refresh (call_after_refresh)
            await wait_for(pilot, lambda: on_screen(app, "? Help"), what="the footer's keys at 80 columns")
            await wait_for(pilot, lambda: _painted(dash), what="the frame after the resize")
            await pilot.pause()   # and laid out
            _assert_whole(dash)

    run(drive())


def test_finished_run_does_not_offer_stop_or_detach(home):
    path = copy_run(home, "finished")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _open(pilot, app, path)
            assert dash.check_action("stop", ()) is False and dash.check_action("detach", ()) is False
            assert not on_screen(app, "Stop") and not on_screen(app, "Detach")
            await pilot.press("s")           # not bound now: nothing happens, nothing is said
            await pilot.pause(0.1)
            assert isinstance(app.screen, DashboardScreen) and not app._notifications
            await pilot.press("escape")      # back still works
            assert not isinstance(app.screen, DashboardScreen)

    run(drive())


def test_memory_and_hardware_share_a_slot_when_narrow(home):
    path = copy_run(home, "finished")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _open(pilot, app, path)
            assert dash.query_one("#memory").display and not dash.query_one("#hardware").display
            assert on_screen(app, "h hardware")
            await pilot.press("h")
            await pilot.pause(0.1)
            assert dash.query_one("#hardware").display and not dash.query_one("#memory").display
            assert on_screen(app, "h memory") and on_screen(app, "CPU")
            _assert_whole(dash)

    run(drive())


# ------------------------------------------------------------ issue 16 item 5: attempts panel


def _rows_of(app, widget) -> list[str]:
    """The widget's rows as drawn on the terminal, its border included."""
    return [line[widget.region.x:widget.region.right]
            for line in screen_lines(app)[widget.region.y:widget.region.bottom]]


def _panel_shows(app, panel: AttemptsPanel, *texts: str) -> bool:
    """Each of `texts` on the panel's rows as drawn: once it is laid out at its height and has
    scrolled where its content wants (after a refresh, call_after_refresh)."""
    visible = "\n".join(_rows_of(app, panel))
    return all(text in visible for text in texts)


def _live_after_fallback(home):
    """The crash-fallback run cut after attempt 2's first step, with a live supervisor."""
    path = copy_run(home, "crash-fallback")
    events = _events(path)
    second = next(i for i, e in enumerate(events) if e["type"] == "step" and e["attempt"] == 2)
    _write(path, events[: second + 1])
    RunDir(path).write_supervisor_pid(os.getpid())
    return path


def test_after_a_fallback_the_crash_stays_in_view_at_80x24(home):
    path = _live_after_fallback(home)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _open(pilot, app, path, live=True)
            panel = dash.query_one(AttemptsPanel)
            await wait_for(pilot, lambda: _panel_shows(app, panel, "#1 auto on cpu: The trainer died from SIGABRT",
                                                       "aborts are.", "→ fell back to cpu from step 10",
                                                       "#2 cpu on cpu", "running"),
                           what="the crash, the fallback and the attempt running in the panel")
            rows = _rows_of(app, panel)
            visible = "\n".join(rows)
            # in view together: the crash's sentence, what the fallback did, the attempt running
            assert "#1 auto on cpu: The trainer died from SIGABRT" in visible
            assert "aborts are." in visible                     # to its end
            assert "→ fell back to cpu from step 10" in visible
            assert "#2 cpu on cpu" in visible and "running" in visible
            assert "…" not in rows[0] and "attempts" in rows[0]   # the title fits
            # wrapped lines hang under their paragraph: only an attempt's header starts at
            # the panel's first column
            inner = [r[1:-1] for r in rows[1:-1] if r[1:-1].strip()]
            assert all(r.startswith("#") or r.startswith(" ") for r in inner), inner
            # the text wraps before the scrollbar's column
            width = panel.scrollable_content_region.width
            text = _text(dash, "#attempts-text")
            assert all(len(line) <= width for line in text.splitlines())
            assert panel.scrollable_content_region.right <= panel.region.right - 2

    run(drive())


def test_a_retry_says_what_it_changed_and_the_title_fits_at_80x24(home):
    """A retry on the same preset (a halved batch) after a crash that cost steps: the panel says
    it retried, with the batch it changed, and its title keeps the steps lost in 80 columns."""
    path = _live_after_fallback(home)
    events = _events(path)
    for e in events:
        if e["type"] == "fallback":
            e.update(to="auto", to_preset="auto", action="halve-batch", changed={"batch_size": [32, 16]})
        elif e["type"] == "attempt_started" and e["attempt"] == 2:
            e["preset"] = "auto"
        elif e["type"] == "attempt_ended" and e["attempt"] == 1:
            e["last_step"] = 245   # 235 steps past the checkpoint it resumed from
    _write(path, events)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _open(pilot, app, path, live=True)
            panel = dash.query_one(AttemptsPanel)
            await wait_for(pilot, lambda: _panel_shows(app, panel, "235 steps trained again",
                                                       "→ retried on auto with batch_size 32→16",
                                                       "#2 auto on cpu", "running"),
                           what="the retry and the attempt running in the panel")
            rows = _rows_of(app, panel)
            visible = "\n".join(rows)
            assert "235 steps trained again" in rows[0] and "…" not in rows[0]
            assert "→ retried on auto with batch_size 32→16" in visible
            assert "#2 auto on cpu" in visible and "running" in visible

    run(drive())


# ------------------------------------------------------------ item 7: no step, no axes


def test_a_run_that_failed_before_any_step_says_so_instead_of_axes(home):
    path = copy_run(home, "crash-fallback")
    events = _events(path)
    first = events[: next(i for i, e in enumerate(events) if e["type"] == "trainer_ready")]
    t = first[-1]["t"] + 10.3339
    crash = next(e for e in events if e["type"] == "crash")
    _write(path, first + [
        {**crash, "t": t},
        {"v": 1, "t": t, "type": "attempt_ended", "attempt": 1, "outcome": "native-crash", "exit": "SIGABRT"},
        {"v": 1, "t": t, "type": "run_failed", "attempt": 0, "why": "no fallback left"},
        {"v": 1, "t": t, "type": "run_finished", "attempt": 0, "status": "failed"},
    ])

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _open(pilot, app, path)
            for name in ("rate", "loss"):
                card = dash.query_one(f"#{name}-card", PlotCard)
                assert card.empty_text and "ended before its first reported step" in card.empty_text
                assert not card.plot.display
            await wait_for(pilot, lambda: on_screen(app, "no further attempt"), what="the panel")
            screen = "\n".join(screen_lines(app))
            assert "ended before its" in screen and "10.33" not in screen

    run(drive())


# ------------------------------------------------------------ item 13 and the plots' keys


def test_crash_marks_loss_value_and_log_scale(home):
    path = copy_run(home, "crash-fallback")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _open(pilot, app, path)
            loss = dash.query_one("#loss-card", PlotCard)
            (line,) = loss.plot._datasets
            (mark,) = loss.plot._v_lines
            assert mark.line_style == CRASH_STYLE and line.line_style != CRASH_STYLE
            assert "red" not in line.line_style and "magenta" not in line.line_style
            # one loss value on screen: the progress line's, not a second one in the title
            assert f"loss {dash.model.loss:.4g}" in _text(dash, "#progress-text")
            assert f"{dash.model.loss:.4g}" not in loss.title_text
            linear = list(line.y)
            # each y replots at the next frame (a timer), the title and the lines together
            await pilot.press("y")
            await wait_for(pilot, lambda: "log scale" in loss.title_text, what="the loss on a log scale")
            (line,) = loss.plot._datasets
            assert isinstance(loss.plot._y_formatter, LogTicks)
            assert list(line.y) == pytest.approx([math.log10(y) for y in linear])
            await pilot.press("y")
            await wait_for(pilot, lambda: list(loss.plot._datasets[0].y) == pytest.approx(linear),
                           what="the loss on a linear scale again")

    run(drive())


def test_window_key_plots_the_last_minutes(home):
    """w cycles whole run -> last 30, 5, 1 minutes; a window shows only its points, all of them."""
    path = copy_run(home, "finished")
    events = _events(path)
    # stretch the recorded run to 40 minutes, so the windows cut it
    t0 = events[0]["t"]
    for e in events:
        e["t"] = t0 + (e["t"] - t0) * 35
    _write(path, events)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(100, 30)) as pilot:
            dash = await _open(pilot, app, path)
            rate = dash.query_one("#rate-card", PlotCard)
            whole = len(rate.plot._datasets[0].x)
            end = dash.model.elapsed(dash.model.newest_t)
            for label, seconds in (("last 30 min", 1800), ("last 5 min", 300), ("last min", 60)):
                await pilot.press("w")
                # replotted at the next frame (a timer), the titles and the lines together
                await wait_for(pilot, lambda: label in rate.title_text
                               and label in dash.query_one("#loss-card", PlotCard).title_text, what=label)
                expected = dash.model.samples_series.points(end - seconds)[0]
                if not expected:   # the run's last minute had no step
                    assert rate.empty_text == f"no throughput in the {label}"
                    continue
                xs = list(rate.plot._datasets[0].x)
                assert min(xs) >= end - seconds - 1e-6 and len(xs) == len(expected) < whole
            await pilot.press("w")
            await wait_for(pilot, lambda: "min" not in rate.title_text and len(rate.plot._datasets[0].x) == whole,
                           what="the whole run again")

    run(drive())


def test_maximise_cycles_through_the_plots_and_escape_brings_all_back(home):
    path = copy_run(home, "finished")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _open(pilot, app, path)
            small = _data_rows(dash.query_one("#rate-card", PlotCard))
            seen = []
            for _ in range(3):
                await pilot.press("m")
                card = dash.plots.card(dash.plots.maximised)
                # drawn at the next frame (a timer), laid out at the screen's height after that
                await wait_for(pilot, lambda: card.plot._datasets and _data_rows(card) > 2 * small,
                               what=f"{card.id} maximised and drawn")
                shown = [c for c in dash.query(PlotCard) if c.display]
                assert len(shown) == 1 and not dash.query_one("#panels").display
                seen.append(shown[0].id)
                assert _data_rows(shown[0]) > 2 * small   # the screen's height, not a strip
                assert shown[0].plot._datasets            # drawn, though hidden before
                _assert_whole(dash)
            assert seen == ["rate-card", "loss-card", "eval-card"]
            assert "r2" in dash.query_one("#eval-card", PlotCard).title_text
            # a constant lr is no plot, but its value is in the loss card's title
            assert "lr 0.02 (constant)" in dash.query_one("#loss-card", PlotCard).title_text
            await pilot.press("escape")
            await pilot.pause(0.2)
            assert isinstance(app.screen, DashboardScreen)     # esc leaves the plot, not the run
            assert dash.query_one("#panels").display and dash.plots.maximised is None
            _assert_whole(dash)

    run(drive())


def test_a_changing_lr_gets_a_plot(home):
    path = copy_run(home, "finished")
    events = _events(path)
    for e in events:
        if e["type"] == "step":   # a warm-up over the first 100 steps
            e["lr"] = 0.02 * min(1.0, e["step"] / 100)
    _write(path, events)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(200, 50)) as pilot:
            dash = await _open(pilot, app, path)
            shown = [c.id for c in dash.query(PlotCard) if c.display]
            assert shown == ["rate-card", "loss-card", "eval-card", "lr-card"]
            lr = dash.query_one("#lr-card", PlotCard)
            assert "lr 0.02" in lr.title_text and max(lr.plot._datasets[0].y) == pytest.approx(0.02)
            assert "constant" not in dash.query_one("#loss-card", PlotCard).title_text
            _assert_whole(dash)

    run(drive())


# ------------------------------------------------------------ item 14: figures and words


def test_throughput_average_gflops_and_steps_lost(home):
    path = copy_run(home, "crash-fallback")
    events = _events(path)
    # attempt 1 trained to step 12 before it crashed; attempt 2 resumed from step 10
    crash = next(i for i, e in enumerate(events) if e["type"] == "crash")
    step10 = next(e for e in events if e["type"] == "step" and e["step"] == 10)
    extra = [{**step10, "step": s, "t": step10["t"] + 0.01 * s, "gflop_s": 2.5} for s in (11, 12)]
    _write(path, events[:crash] + extra + events[crash:])

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(200, 50)) as pilot:
            dash = await _open(pilot, app, path)
            m = dash.model
            assert m.steps_lost == 2
            assert "2 steps trained again" in dash.query_one(AttemptsPanel).border_title
            assert on_screen(app, "2 steps trained again")
            title = dash.query_one("#rate-card", PlotCard).title_text
            assert f"average {m.avg_samples_per_s:,.0f}" in title
            if m.gflop_s:
                assert "GFLOP/s" in title

    run(drive())


def test_noise_is_said_in_words(home):
    path = copy_run(home, "finished")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(200, 50)) as pilot:
            await _open(pilot, app, path)
            screen = "\n".join(screen_lines(app))
            assert "psi" not in screen and "no stalls" in screen
            assert "(CPU: RSS)" not in screen        # a CPU run has no device memory line
            assert "threads  " not in screen

    run(drive())
    # one format for a metric everywhere (engine.numbers.metric): the compare table's and the lines'
    assert metric(1.0) == "1" and metric(0.91696) == "0.917" and metric(12345.6) == "12,346"


def test_mining_is_said_while_it_runs(home):
    path = copy_run(home, "finished")
    fake_live(path)
    events = _events(path)
    events[0]["workload"] = "twotower"
    t = events[-1]["t"]
    events += [
        {"v": 1, "t": t + 0.1, "type": "mining", "attempt": 1, "epoch": 1, "mode": "faiss@8", "index": "IVF64,Flat",
         "exact": False, "recall_vs_exact": 0.93, "queries": 4096, "mining_s": 12.3},
        {"v": 1, "t": t + 0.2, "type": "mining_started", "attempt": 1, "epoch": 2, "negatives": 8},
    ]
    _write(path, events)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _open(pilot, app, path, live=True)
            await wait_for(pilot, lambda: dash.model.mining_active, what="the mining event")
            # said by the frame after the event (a timer)
            await wait_for(pilot, lambda: "mining hard negatives" in _text(dash, "#progress-text"),
                           what="the mining said")
            progress = _text(dash, "#progress-text")
            assert "mining hard negatives" in progress and "recall 0.930 vs exact" in progress
            assert "ETA" not in progress
            _assert_whole(dash)

    run(drive())


def test_an_eval_under_way_is_said_and_mfu_shown(home):
    path = copy_run(home, "finished")
    fake_live(path)
    events = _events(path)
    last_step = next(e for e in reversed(events) if e["type"] == "step")
    # the title's figures are the smoothed rate's, as the headless line's: a quarter of the window's
    last_step.update(mfu=0.41, gflop_s=812.0, smoothed_samples_per_s=last_step["samples_per_s"] / 4)
    events.append({"v": 1, "t": events[-1]["t"] + 0.1, "type": "eval_started", "attempt": 1, "step": last_step["step"]})
    _write(path, events)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(200, 50)) as pilot:
            dash = await _open(pilot, app, path, live=True)
            await wait_for(pilot, lambda: dash.model.eval_active, what="the eval_started event")
            # said by the frame after the event (a timer), the plots' titles with it
            await wait_for(pilot, lambda: "evaluating" in _text(dash, "#progress-text"), what="the eval said")
            progress = _text(dash, "#progress-text")
            assert "evaluating" in progress and "ETA" not in progress
            title = dash.query_one("#rate-card", PlotCard).title_text
            assert "203.0 GFLOP/s" in title and "MFU 10%" in title
            assert title.startswith(f"{rate_text(last_step['samples_per_s'] / 4, 'samples/s')} ·")

    run(drive())


# ------------------------------------------------------------ stop, and a flood


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
    RunDir(path).write_supervisor_pid(os.getpid())
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


def test_a_crash_toast_never_covers_the_attempts_panel_or_the_log(home):
    path = _live_after_fallback(home)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            dash = await _open(pilot, app, path, live=True)
            app.notify("The trainer died from SIGABRT after step 10 without a Python traceback.",
                       title="cockpit@host: matmul fell back", severity="warning", timeout=30)
            await wait_for(pilot, lambda: list(dash.query(Toast)), what="the toast")
            await pilot.pause(0.1)
            (toast,) = dash.query(Toast)
            for covered in (dash.query_one(AttemptsPanel), dash.query_one("#log")):
                assert not toast.region.overlaps(covered.region), (toast.region, covered)

    run(drive())


def test_a_dashboard_shown_again_after_its_run_went_on_shows_it_as_it_is_now(home):
    """s, o, r, Esc: the dashboard left behind when the run stopped is not shown stale once the
    run was resumed and finished."""
    path = copy_run(home, "finished")
    events = _events(path)
    middle = [i for i, e in enumerate(events) if e["type"] == "step"][10]
    stopped = {**events[-1], "status": "stopped", "summary": {**events[-1]["summary"], "finished_on": None}}
    _write(path, events[: middle + 1] + [stopped])

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _open(pilot, app, path)
            assert dash.model.status == "stopped"
            await pilot.press("o")
            await wait_for(pilot, lambda: not isinstance(app.screen, DashboardScreen), what="the runs screen")
            _write(path, events[: middle + 1] + [stopped] + events[middle + 1:])   # resumed, finished
            await pilot.press("escape")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen)
                           and app.screen.model.status == "finished", what="the run as it is now")
            assert app.screen is not dash
            # the fresh dashboard paints what it read at its next frame (a timer)
            await wait_for(pilot, lambda: on_screen(app, "finished") and not on_screen(app, "stopped"),
                           what="the run shown finished")

    run(drive())


def test_a_resumed_run_shows_where_it_stands_while_its_supervisor_starts(home, monkeypatch):
    """Not 'created, step 0/?' for the second its supervisor takes to start: the run's step and
    attempts at once, as 'resuming'."""
    path = copy_run(home, "finished")
    events = _events(path)
    middle = [i for i, e in enumerate(events) if e["type"] == "step"][10]
    stopped = {**events[-1], "status": "stopped"}
    _write(path, events[: middle + 1] + [stopped])
    starting = threading.Event()
    monkeypatch.setattr("cockpit.ui.follow.detached.start_detached", lambda run: starting.wait(60))

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = app.open_run(RunDir(path), start=True)
            try:
                await wait_for(pilot, lambda: dash.model.step == events[middle]["step"], what="the run as it stands")
                assert dash.model.status == "resuming"
                # painted at the frame after the events (a timer)
                step = f"step {events[middle]['step']}/"
                await wait_for(pilot, lambda: on_screen(app, "resuming") and on_screen(app, step),
                               what="the run shown resuming at its step")
                assert not on_screen(app, "created")
            finally:
                starting.set()

    run(drive())


def test_a_crash_too_long_for_six_lines_takes_two_from_the_plots_at_80x24(home):
    """A crash in a first attempt that checkpointed nothing, retried with a smaller batch: told
    compactly, longer than the panel's six lines. The panel grows, the plots give way, all
    stays whole."""
    path = _live_after_fallback(home)
    events = _events(path)
    long = ("The trainer died from SIGABRT after step 199 without a Python traceback: a native "
            "crash in torch or a native library it loaded.")
    for e in events:
        if e["type"] in ("crash", "fallback"):
            e["sentence"] = long
        if e["type"] == "fallback":   # a retry that halved the batch, from the start
            e.update(resume=None, to="auto", to_preset="auto", changed={"batch_size": [32, 16]})
        elif e["type"] == "attempt_started" and e["attempt"] == 2:
            e["preset"] = "auto"
    _write(path, events)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _open(pilot, app, path, live=True)
            panel = dash.query_one(AttemptsPanel)
            # the panel given two more rows is laid out again, then scrolls (call_after_refresh)
            await wait_for(pilot, lambda: _panel_shows(app, panel, "loaded.",
                                                       "→ retried on auto with batch_size 32→16,",
                                                       "#2 auto on cpu", "running"),
                           what="the long crash, the retry and the attempt running in the grown panel")
            visible = "\n".join(_rows_of(app, panel))
            assert "loaded." in visible and "→ retried on auto with batch_size 32→16," in visible
            assert "#2 auto on cpu" in visible and "running" in visible
            assert dash.has_class("-tall-attempts")
            _assert_whole(dash)

    run(drive())


def test_the_progress_line_has_the_runs_goodput_as_a_bar(home):
    path = copy_run(home, "finished")
    expected = stats.fold(_events(path)).goodput().fraction

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await _open(pilot, app, path)
            assert on_screen(app, f"goodput ━━━━━━━━━━ {expected:.0%}")

    run(drive())

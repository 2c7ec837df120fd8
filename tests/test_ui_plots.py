"""The dashboard's plot pieces without a run: tick labels that fit, time ticks, the log scale,
a window of the newest points at full resolution, when a plot is worth drawing again, titles
that drop figures rather than cut them, and the panels' wrapping."""

from __future__ import annotations

import math

from rich.text import Text
from textual.app import App

from cockpit.ui.dashboard import two_lines, wrap_hanging
from cockpit.ui.model import RECENT_POINTS, RunModel, Series
from cockpit.ui.widgets.attempts import attempts_layout
from cockpit.ui.widgets.memory import memory_text
from cockpit.ui.widgets.plots import LogTicks, PlotCard, TimeTicks, fit, short_number, time_text, title_line
from conftest import FIXTURES
from engine.record.events import read_events
from ui_support import run


def test_tick_labels_fit_the_margin():
    for v in (0, 0.02, 0.25, 1, 7.5, 350, 5000, 12_000, 1.5e6, 3e-4, 1.25e-5, -0.5, 999_999):
        assert len(short_number(v)) <= 6, (v, short_number(v))
    assert short_number(5000) == "5k" and short_number(3e-4) == "3e-4" and short_number(0.25) == "0.25"


def test_time_ticks_are_round_and_few():
    ticks = TimeTicks(4).get_ticks(0, 5 * 3600)
    assert ticks == [0, 7200, 14400]   # every two hours: four ticks at most
    assert TimeTicks(4).get_labels_for_ticks([45, 150, 3600, 5400]) == ["45s", "2m30", "1h", "1h30"]
    assert time_text(600) == "10m"
    small = TimeTicks(4).get_ticks(10.2, 27.9)
    assert all(t == int(t) for t in small) and 2 <= len(small) <= 5


def test_log_ticks_label_decades_as_values():
    ticks = LogTicks(3).get_ticks(-5.2, -0.1)           # 6e-6 .. 0.8
    assert all(t == int(t) for t in ticks) and len(ticks) <= 4
    labels = LogTicks(3).get_labels_for_ticks([-5.0, -1.0, 0.0])
    assert labels == ["1e-5", "0.1", "1"]


def test_a_window_keeps_every_recent_point_after_decimation():
    s = Series(cap=64)
    n = 10_000
    for i in range(n):
        s.add(float(i), float(i % 7))
    assert len(s.x) < 64                                   # the whole run: decimated
    xs, ys = s.points(n - 300.0)                           # the last 300: every one
    assert xs == [float(i) for i in range(n - 300, n)] and ys == [float(i % 7) for i in range(n - 300, n)]
    older = s.points(n - RECENT_POINTS - 500.0)[0]         # reaching past them: decimated, then all
    assert older[-RECENT_POINTS:] == [float(i) for i in range(n - RECENT_POINTS, n)]
    assert all(a < b for a, b in zip(older, older[1:])) and older[0] >= n - RECENT_POINTS - 500


def test_titles_drop_figures_instead_of_cutting_them():
    parts = [Text("359 samples/s"), Text("average 320"), Text("8.3 GFLOP/s")]
    assert fit(parts, 80).plain == "359 samples/s · average 320 · 8.3 GFLOP/s"
    assert fit(parts, 30).plain == "359 samples/s · average 320"
    line = title_line(parts, 40, "last 5 min")
    assert line.plain.endswith("last 5 min") and line.cell_len <= 40 and "average 320" in line.plain
    two = two_lines([Text("step 12/12"), Text("took 27s"), Text("loss 0.09574"), Text("r2 0.9170")], 30)
    assert two.plain.split("\n") == ["step 12/12  took 27s", "loss 0.09574  r2 0.9170"]


def test_log_lines_wrap_past_their_stamp():
    rows = wrap_hanging("  0:26 run finished: 2 attempts (auto: native-crash after step 10; cpu: finished)", 40)
    assert len(rows) == 3 and all(len(r) <= 40 for r in rows)
    assert all(r.startswith("       ") and r.strip() for r in rows[1:])   # under the text, not the stamp


def test_attempts_wrap_with_hanging_indents_and_find_the_crash():
    m = RunModel()
    m.fold(read_events(FIXTURES / "runs" / "crash-fallback" / "events.jsonl"))
    text, crash_line = attempts_layout(m, 40)
    lines = text.plain.split("\n")
    assert crash_line == 0 and lines[0].startswith("#1 auto on cpu")
    assert all(len(line) <= 40 for line in lines)
    assert all(line.startswith(("#", "   ")) for line in lines)          # nothing else at column 0
    second = next(i for i, line in enumerate(lines) if line.startswith("#2"))
    assert "finished" in lines[second]
    assert "evidence: signal" not in text.plain   # the header already says SIGABRT and step 10


def test_memory_says_stalls_and_swap_in_words():
    m = RunModel()
    m.fold(read_events(FIXTURES / "runs" / "finished" / "events.jsonl"))
    text = memory_text(m, 28).plain
    assert "no stalls" in text and "psi" not in text and "swap     0 B/s in, 0 B/s out" in text
    assert "device" not in text                   # a CPU run: RSS is its memory
    m.memory = {**m.memory, "swap_in_per_s": 12.3e6, "swap_out_per_s": 1e6,
                "pressure": {"level": "warn", "raw": {"some_avg10": 12.0, "full_avg10": 3.0}}}
    text = memory_text(m, 28).plain
    assert "12% stalled" in text and "swap in  12.3 MB/s" in text and "swap out 1.0 MB/s" in text


def alone(widget) -> App:
    """An app of one widget, to drive it in a Pilot test."""
    class One(App):
        def compose(self):
            yield widget

    return One()


def test_a_plot_is_drawn_again_once_new_data_moves_it_a_column():
    async def drive():
        app = alone(PlotCard(id="card"))
        async with app.run_test(size=(60, 12)) as pilot:
            card = app.query_one(PlotCard)
            await pilot.pause()
            assert card.stale(0.0, 100.0)                      # never drawn
            xs = [float(i) for i in range(101)]
            card.show([(xs, [math.sin(x) for x in xs], "cyan")], empty="nothing", since=0.0, until=100.0)
            columns = 2 * (card.plot.size.width - 7 - 2)
            assert not card.stale(0.0, 100.0 + 0.5 * 100 / columns)   # half a column later
            assert card.stale(0.0, 100.0 + 1.5 * 100 / columns)
            card.show([([], [], "cyan")], empty="nothing to plot yet")
            await pilot.pause()
            assert card.empty_text == "nothing to plot yet" and not card.plot.display

    run(drive())


def test_a_crash_mark_on_the_frame_is_left_out_not_the_app_taken_down():
    """A run that crashed after its only step: one point (x limits around it) and the crash
    mark at the right edge, where textual-plot merges the y ticks into the frame and refused
    the dashed line (ValueError, the whole TUI gone)."""
    import asyncio

    from cockpit.ui.widgets.plots import SeriesPlot

    async def scenario():
        app = alone(SeriesPlot(id="p"))
        async with app.run_test(size=(40, 12)) as pilot:
            plot = app.query_one(SeriesPlot)
            for mark in (8.066, 8.31, 6.31, 7.9):   # inside, on both edges, inside
                plot._shown = None
                plot.show([([7.3119998], [1.0], "#00aaff")], [(mark, "crash")])
                await pilot.pause()
            return app.return_code

    assert asyncio.run(scenario()) in (None, 0)

"""The log view (cockpit.ui.logs) on recorded runs: a crash's traceback one key away, search,
following a log as it grows, switching between events and an attempt's output, attempts chosen
by key, and big logs read from their tail; and the reader under it (engine.record.attempt_log)."""

from __future__ import annotations

import json

from cockpit.app import make_app
from cockpit.ui.dashboard import DashboardScreen
from cockpit.ui.help import help_markdown
from cockpit.ui.logs import WIDE, LogScreen
from cockpit.ui.widgets.log_pane import LogPane
from engine.record.attempt_log import LogLines, display_line, last_traceback
from engine.record.rundir import RunDir
from ui_support import copy_run, run, wait_for

SMALL, LARGE = (80, 24), (200, 50)

TRACEBACK = """\
Traceback (most recent call last):
  File "train.py", line 41, in <module>
    main()
  File "train.py", line 30, in main
    loss = model(batch)
RuntimeError: MPS backend out of memory (MPS allocated: 17.1 GB)
"""


def _with_traceback(path, chatter: int = 300) -> None:
    """Attempt 1 of the crash-fallback run, as if its output had been a command's: progress
    lines, then the traceback it died with."""
    lines = "".join(f"epoch 0 batch {i} loss {1 / (i + 1):.4f}\n" for i in range(chatter))
    (path / "attempt-1.log").write_text(lines + TRACEBACK)


def shown(pane: LogPane) -> list[str]:
    """The pane's rows as drawn on the screen."""
    return [pane.render_line(y).text for y in range(pane.size.height)]


def last_row(pane: LogPane) -> str:
    """The pane's last row with text on it."""
    return [row for row in shown(pane) if row.strip()][-1]


def panes(screen: LogScreen) -> tuple[LogPane, LogPane]:
    return screen.query_one("#events", LogPane), screen.query_one("#output", LogPane)


async def open_logs(pilot, path, attempt=None) -> LogScreen:
    screen = LogScreen(RunDir(path), attempt)
    pilot.app.push_screen(screen)
    await wait_for(pilot, lambda: any("run finished" in line for line in panes(screen)[0].lines),
                   what="the events to be read")
    return screen


def test_every_key_is_in_the_screens_help(home):
    assert all(b.description for b in LogScreen.BINDINGS)
    path = copy_run(home, "finished")

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = await open_logs(pilot, path)
            text = help_markdown(screen, pilot.app)
            for key, title in (("esc", "Back"), ("v", "View"), ("[ ]", "Attempt"), ("x", "Traceback"),
                               ("/", "Search"), ("n", "Next match"), ("f / end", "Follow"), ("w", "Wrap")):
                assert f"`{key}` **{title}**" in text
    run(drive())


# ------------------------------------------------------------ the crash's traceback


def test_x_jumps_to_the_crashed_attempts_traceback(home):
    path = copy_run(home, "crash-fallback")
    _with_traceback(path)
    for size in (SMALL, LARGE):
        async def drive():
            async with make_app(attach=False).run_test(size=size) as pilot:
                screen = await open_logs(pilot, path)
                events, output = panes(screen)
                assert screen.attempt == 2       # the newest attempt's output to start with
                await pilot.press("x")
                await wait_for(pilot, lambda: output.marked is not None, what="the jump")
                await pilot.pause()
                assert screen.view == "output" and screen.attempt == 1
                assert output.lines[output.marked] == "Traceback (most recent call last):"
                rows = shown(output)
                assert any(r.startswith("Traceback (most recent call last):") for r in rows)
                assert any(r.startswith("RuntimeError: MPS backend out of memory") for r in rows)
                assert not output.following          # it stays on the traceback
                assert output.display and "(auto, native-crash)" in output.border_title
                if size == SMALL:
                    assert not events.display        # one pane at a time below WIDE columns
        run(drive())


def test_x_pressed_before_the_output_is_read_still_lands_on_the_traceback(home):
    path = copy_run(home, "crash-fallback")
    _with_traceback(path)

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = LogScreen(RunDir(path), attempt=1)
            pilot.app.push_screen(screen)
            await pilot.pause()
            _, output = panes(screen)
            # the crash must be known (from the events) for x to act; the output may not be read
            await wait_for(pilot, lambda: 1 in screen.attempts and screen.attempts[1].crash,
                           what="the crash event")
            screen._read_output()       # read again: x comes before the reader has posted
            await pilot.press("x")
            await wait_for(pilot, lambda: output.marked is not None, what="the traceback")
            assert output.lines[output.marked].startswith("Traceback")
            assert screen.view == "output"
    run(drive())


def test_an_attempt_chosen_before_the_traceback_was_found_is_left_as_it_is(home):
    """x, then ] before the crashed attempt's log was read: ] wins; the next attempt (which did
    not crash) is shown, not searched for a traceback or its crash event."""
    path = copy_run(home, "crash-fallback")
    _with_traceback(path)

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = LogScreen(RunDir(path), attempt=1)
            pilot.app.push_screen(screen)
            await pilot.pause()
            events, output = panes(screen)
            await wait_for(pilot, lambda: 2 in screen.attempts and screen.attempts[1].crash,
                           what="both attempts' events")
            assert screen.attempts[2].crash is None
            screen.read_output = lambda attempt, generation: None   # attempt 1's log: never read
            screen._read_output()
            await pilot.press("x")
            assert screen._traceback_pending            # x waits for the log to be read
            del screen.read_output                      # attempt 2's is read as ever
            await pilot.press("]")
            assert screen.attempt == 2 and not screen._traceback_pending
            await wait_for(pilot, lambda: screen._output_read, what="attempt 2's output")
            await pilot.pause()
            assert screen.view == "output" and screen.attempt == 2
            assert output.marked is None and events.marked is None
            assert not any("no Python traceback" in n.message for n in pilot.app._notifications)
    run(drive())


def test_x_shows_the_crash_event_when_the_crash_left_no_traceback(home):
    path = copy_run(home, "crash-fallback")   # a native crash: SIGABRT, attempt-1.log empty

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = await open_logs(pilot, path)
            events, _ = panes(screen)
            await pilot.press("x")
            await wait_for(pilot, lambda: events.marked is not None, what="the crash event")
            await pilot.pause()
            assert screen.view == "events" and events.display
            assert "crashed: native-crash" in events.lines[events.marked]
            assert any("crashed: native-crash" in r for r in shown(events))
            assert any("no Python traceback" in n.message for n in pilot.app._notifications)
    run(drive())


def test_x_says_so_when_nothing_crashed(home):
    path = copy_run(home, "finished")

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = await open_logs(pilot, path)
            await pilot.press("x")
            await pilot.pause()
            assert screen.view == "events"
            assert any("no attempt of this run crashed" in n.message for n in pilot.app._notifications)
    run(drive())


# ------------------------------------------------------------ search


def test_search_finds_moves_and_highlights(home):
    path = copy_run(home, "crash-fallback")
    _with_traceback(path)
    for size in (SMALL, LARGE):
        async def drive():
            async with make_app(attach=False).run_test(size=size) as pilot:
                screen = await open_logs(pilot, path, attempt=1)
                _, output = panes(screen)
                await wait_for(pilot, lambda: len(output.lines) > 300, what="attempt 1's output")
                await pilot.press("home", "slash")
                assert pilot.app.focused is screen.query_one("#search")
                await pilot.press(*"BATCH 25", "enter")   # case does not matter
                await pilot.pause()
                assert pilot.app.focused is None         # keys go back to the view
                assert output.match == 25
                assert any(r.startswith("epoch 0 batch 25 ") for r in shown(output))
                await pilot.press("n")
                assert output.match == 250
                await pilot.press("n", "n")
                assert output.match == 252
                await pilot.press("N")
                assert output.match == 251
                rows = [output.render_line(y) for y in range(output.size.height)]
                marked = [s for s in rows if any(seg.style and seg.style.bgcolor
                                                 and seg.text == "batch 25" for seg in s)]
                assert marked, "matches are highlighted"
                assert "/BATCH 25: line 252" in output.border_subtitle
                await pilot.press("slash", *"no such text", "enter")
                await pilot.pause()
                assert output.match is None
                assert any("no match" in n.message for n in pilot.app._notifications)
        run(drive())


def test_escape_closes_the_search_before_leaving(home):
    path = copy_run(home, "finished")

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = await open_logs(pilot, path)
            await pilot.press("slash")
            await pilot.press("escape")
            assert pilot.app.screen is screen and not screen.query_one("#search").display
            await pilot.press("escape")
            assert pilot.app.screen is not screen
    run(drive())


# ------------------------------------------------------------ following


def _append(path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


def test_following_shows_appended_lines_until_the_user_scrolls_up(home):
    path = copy_run(home, "crash-fallback")

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = await open_logs(pilot, path, attempt=2)
            _, output = panes(screen)
            log = path / "attempt-2.log"
            _append(log, "".join(f"step {i}\n" for i in range(100)))
            await wait_for(pilot, lambda: "step 99" in last_row(output), what="the appended lines")
            assert output.following and "following" in output.border_subtitle
            await pilot.press("pageup")
            assert not output.following and "paused" in output.border_subtitle
            top = output.scroll_y
            _append(log, "".join(f"more {i}\n" for i in range(50)))
            await wait_for(pilot, lambda: output.lines[-1] == "more 49", what="more lines")
            await pilot.pause()
            assert output.scroll_y == top            # reading back there is not disturbed
            await pilot.press("f")
            await pilot.pause()
            assert output.following and "more 49" in last_row(output)
            # an unfinished line (a bar redrawn with \r) is shown as it stands
            _append(log, " 10%|#   |\r 40%|####|")
            await wait_for(pilot, lambda: output.partial == " 40%|####|", what="the bar")
            await pilot.pause()
            assert " 40%|####|" in last_row(output)
    run(drive())


def test_a_new_attempt_is_followed_unless_one_was_chosen(home):
    path = copy_run(home, "crash-fallback")
    events = path / "events.jsonl"

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = await open_logs(pilot, path)
            _, output = panes(screen)
            assert screen.attempt == 2
            (path / "attempt-3.log").write_text("attempt 3 says hello\n")
            _append(events, json.dumps({"v": 1, "t": 1795432400.0, "type": "attempt_started",
                                        "attempt": 3, "preset": "cpu", "device": "cpu"}) + "\n")
            await wait_for(pilot, lambda: screen.attempt == 3, what="the new attempt")
            await wait_for(pilot, lambda: output.lines == ["attempt 3 says hello"], what="its output")
            await pilot.press("left_square_bracket", "left_square_bracket")
            await wait_for(pilot, lambda: screen.attempt == 1, what="attempt 1, chosen")
            _append(events, json.dumps({"v": 1, "t": 1795432500.0, "type": "attempt_started",
                                        "attempt": 4, "preset": "cpu", "device": "cpu"}) + "\n")
            await wait_for(pilot, lambda: 4 in screen.attempts, what="attempt 4's event")
            await pilot.pause()
            assert screen.attempt == 1                 # the user's choice stands
    run(drive())


# ------------------------------------------------------------ events and output


def test_switching_shows_the_commands_output(home):
    path = copy_run(home, "crash-fallback")
    # a command's output, as a terminal would have shown it: tqdm redraws in place with \r and
    # colours its text
    (path / "attempt-2.log").write_bytes(
        b"loading data\n\x1b[32mtraining\x1b[0m\n"
        b"  0%|          | 0/12\r 50%|#####     | 6/12\r100%|##########| 12/12\n"
        b"saved model.pt\n")

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = await open_logs(pilot, path)
            events, output = panes(screen)
            assert screen.view == "events" and events.display and not output.display
            await pilot.press("v")
            await pilot.pause()
            assert screen.view == "output" and output.display and not events.display
            await wait_for(pilot, lambda: output.lines[-1:] == ["saved model.pt"], what="the output")
            rows = shown(output)
            assert [r.rstrip() for r in rows[:4]] == \
                ["loading data", "training", "100%|##########| 12/12", "saved model.pt"]
            assert "attempt 2/2 (cpu, finished)" in output.border_title
            await pilot.press("left_square_bracket")
            await wait_for(pilot, lambda: screen.attempt == 1, what="attempt 1")
            assert "attempt 1/2 (auto, native-crash)" in output.border_title
            await pilot.press("right_square_bracket")
            await wait_for(pilot, lambda: output.lines[-1:] == ["saved model.pt"], what="attempt 2 again")
            await pilot.press("v")
            assert screen.view == "events" and events.display and not output.display
    run(drive())


def test_events_and_output_side_by_side_when_wide(home):
    path = copy_run(home, "crash-fallback")

    async def drive():
        async with make_app(attach=False).run_test(size=LARGE) as pilot:
            screen = await open_logs(pilot, path)
            events, output = panes(screen)
            await wait_for(pilot, lambda: output.lines, what="the output")
            await pilot.pause()
            assert LARGE[0] >= WIDE and screen.has_class("wide")
            assert events.display and output.display
            assert events.region.x < output.region.x and events.region.y == output.region.y
            assert events.region.height > 40               # it fills the terminal
            assert any("run finished" in r for r in shown(events))
            assert any("attempt 2: finished at step 12/12" in r for r in shown(output))
            assert events.has_class("current")
            await pilot.press("v")                         # v picks which pane the keys move
            assert output.has_class("current") and not events.has_class("current")
            await pilot.click("#events")                   # and so does a click
            assert events.has_class("current") and screen.view == "events"
    run(drive())


def test_a_big_log_is_read_from_its_tail(home):
    path = copy_run(home, "finished")
    line = "x" * 99 + "\n"
    (path / "attempt-1.log").write_text(line * 200_000 + "the last line\n")   # 20 MB

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = await open_logs(pilot, path, attempt=1)
            _, output = panes(screen)
            await wait_for(pilot, lambda: output.lines[-1:] == ["the last line"], what="the tail")
            await pilot.pause()
            assert len(output.lines) < 50_000           # 4 MiB of it, not 20 MB
            assert output.lines[0] == "x" * 99           # from a whole line
            assert "MB before not shown" in output.border_subtitle
            assert "the last line" in last_row(output)
    run(drive())


def test_l_opens_the_log_view_from_the_dashboard(home):
    path = copy_run(home, "crash-fallback")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=SMALL) as pilot:
            dash = app.open_run(RunDir(path))
            await wait_for(pilot, lambda: dash.ended, what="the replay")
            await pilot.press("l")
            await pilot.pause()
            assert isinstance(app.screen, LogScreen) and app.screen.run.id == path.name
            await pilot.press("escape")
            assert app.screen is dash and isinstance(app.screen, DashboardScreen)
    run(drive())


# ------------------------------------------------------------ the reader


def test_log_lines_reads_the_tail_then_only_what_was_appended(tmp_path):
    log = tmp_path / "attempt-1.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(10_000)))
    reader = LogLines(log, tail_bytes=1000)
    lines, reset = reader.read()
    assert reset and lines[-1] == "line 9999" and lines[0].startswith("line ")
    assert 0 < reader.skipped < log.stat().st_size and len(lines) < 150
    assert reader.read() == ([], False)
    with open(log, "ab") as f:
        f.write(b"caf\xc3")                          # a character split between two writes
    assert reader.read() == ([], False) and reader.shown_partial() == "caf"
    with open(log, "ab") as f:
        f.write(b"\xa9\n")
    assert reader.read() == (["café"], False)
    with open(log, "ab") as f:
        f.write(b"y" * 5000 + b"\nend\n")          # more than the tail: read from the new tail
    lines, reset = reader.read()
    assert reset and lines == ["end"]
    log.write_bytes(b"started over\n")              # a log that shrank was started over
    assert reader.read() == (["started over"], True)


def test_display_line_is_what_a_terminal_left():
    assert display_line(" 10%|#\r 20%|##\r 30%|###\r") == " 30%|###"
    assert display_line("\x1b[1;31merror\x1b[0m\tthere") == "error   there"
    assert last_traceback(["a", "Traceback (most recent call last):", "b",
                           "Traceback (most recent call last):", "c"]) == 3
    assert last_traceback(["no traceback"]) is None


def test_long_lines_wrap_indented_and_w_cuts_them(home):
    path = copy_run(home, "crash-fallback")

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = await open_logs(pilot, path)
            events, _ = panes(screen)
            await pilot.pause()
            fallback = next(line for line in events.lines if "fallback: attempt 2" in line)
            assert len(fallback) > 2 * events.size.width
            rows = shown(events)
            first = next(i for i, r in enumerate(rows) if "fallback: attempt 2" in r)
            # the continuation rows start under the text, not under the time stamp
            assert rows[first + 1].startswith(" " * 9) and rows[first + 1][9] != " "
            assert " ".join(r.strip() for r in rows[first:first + 4]).startswith(fallback[:150])
            await pilot.press("w")
            await pilot.pause()
            rows = shown(events)
            first = next(i for i, r in enumerate(rows) if "fallback: attempt 2" in r)
            assert "fallback: attempt 2" not in rows[first + 1] and not rows[first + 1].startswith(" ")
            assert events.virtual_size.width > events.size.width     # cut, scrolled sideways
    run(drive())

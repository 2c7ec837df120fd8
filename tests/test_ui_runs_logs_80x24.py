"""The runs and log screens at 80x24, as over SSH (issue "The crash moment, told exactly", items
4 and 5): the id column tells runs apart, `r` says 'resuming' at once while the run is checked,
an attempt's empty output says why (and gives its room to the events when side by side), and
n/N say where they landed when the pane alone would not show it."""

from __future__ import annotations

import json
import os
import threading

import pytest
from rich.cells import cell_len
from rich.measure import Measurement
from textual.widgets import DataTable

from cockpit.app import make_app
from cockpit.ui.logs import LogScreen
from cockpit.ui.runs import RunId, RunsScreen, shown_ids
from cockpit.ui.widgets.log_pane import LogPane
from engine.errors import ConfigError
from engine.record.rundir import RunDir, find_run
from engine.run import resume
from ui_support import copy_run, open_runs, run, wait_for

SMALL, LARGE = (80, 24), (200, 50)

# as RunDir.create makes them: start time, workload, device preset, a random token
IDS = ["20261124-093000-trm-tiny-auto-a1b2", "20261123-111512-matmul-cpu-9f3e",
       "20261123-111049-matmul-cpu-2bcd"]


def _table_rows(screen: RunsScreen) -> list[str]:
    """The table's rows (not its header) as drawn on the screen."""
    table = screen.query_one("#runs", DataTable)
    return [table.render_line(y).text for y in range(1, 1 + len(screen.rows))]


def _shown_id(row: str) -> str:
    return row.split()[-1]


def _layout(screen: RunsScreen) -> str:
    """What sizes the id column, for a failure: the table's size and scrollable region, its
    columns' widths and the room the screen computed for the ids."""
    table = screen.query_one("#runs", DataTable)
    widths = {str(key.value): column.get_render_width(table) for key, column in table.columns.items()}
    return (f"table size {table.size}, scrollable {table.scrollable_content_region.size}, virtual "
            f"{table.virtual_size}, scrollbars v={table.show_vertical_scrollbar} "
            f"h={table.show_horizontal_scrollbar}, screen {screen.size}; columns {widths} "
            f"(sum {sum(widths.values())}); id room {screen._id_room()}; rows {_table_rows(screen)}")


# ------------------------------------------------------------ the runs screen's id column


def test_the_id_column_tells_runs_apart_at_80_columns(home):
    for run_id in IDS:
        copy_run(home, "finished", run_id)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=SMALL) as pilot:
            screen = await open_runs(app, pilot, len(IDS))
            ordered = [r.id for r, _ in screen.rows]
            # each row shows an end of its own id, the random token at least, none the same
            await wait_for(pilot, lambda: all(
                run_id.endswith(_shown_id(row).removeprefix("…")) and run_id[-4:] in _shown_id(row)
                for run_id, row in zip(ordered, _table_rows(screen))), what="the ids' ends in the id column",
                why=lambda: _layout(screen))
            shown = [_shown_id(row) for row in _table_rows(screen)]
            assert len(set(shown)) == len(IDS), shown
            # the table still holds the whole id, and the detail line says it for the row
            assert [str(c) for c in screen.query_one("#runs", DataTable).get_column("id")] == ordered
            assert ordered[0] in str(screen.query_one("#run-detail").render())
            # where the width allows, the whole id
            await pilot.resize_terminal(*LARGE)
            await wait_for(pilot, lambda: [_shown_id(row) for row in _table_rows(screen)] == ordered,
                           what="the whole ids at 200 columns")
            await pilot.resize_terminal(*SMALL)
            await wait_for(pilot, lambda: [_shown_id(row) for row in _table_rows(screen)] == shown,
                           what="the ends again at 80 columns")
            # a new run whose device column is wider: less room, the tokens alone
            copy_run(home, "crash-fallback", "20261125-080000-matmul-auto-77aa")
            screen.load()
            await wait_for(pilot, lambda: len(screen.rows) == len(IDS) + 1, what="the new run")
            await wait_for(pilot, lambda: [_shown_id(row) for row in _table_rows(screen)]
                           == ["77aa", *(i[-4:] for i in IDS)], what="the tokens in the id column",
                           why=lambda: _layout(screen))

    run(drive())


def _columns_fit_cells(screen: RunsScreen) -> bool:
    """Each column exactly as wide as its widest cell or its label: none cut, none left wide."""
    table = screen.query_one("#runs", DataTable)
    return all(column.content_width == max(cell_len(str(column.label)),
                                           *(Measurement.get(screen.app.console, screen.app.console.options,
                                                             cell).maximum if isinstance(cell, RunId)
                                             else cell_len(str(cell)) for cell in table.get_column(key)))
               for key, column in table.columns.items())


def test_a_run_read_half_written_sizes_its_columns_anew_when_whole(home):
    """A refresh can read a run mid-copy (its run.toml there, no events yet) or mid-run (its time
    growing): the next refresh updates it cell by cell, and each column must fit its cells again,
    the device column grown and the time column shrunk (CI saw the ids pushed off the edge)."""
    for run_id in IDS:
        copy_run(home, "finished", run_id)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=SMALL) as pilot:
            screen = await open_runs(app, pilot, len(IDS))
            new = copy_run(home, "crash-fallback", "20261125-080000-matmul-auto-77aa")
            lines = (new / "events.jsonl").read_text().splitlines(keepends=True)
            second = next(i for i, line in enumerate(lines) if '"type":"step"' in line and '"attempt":2' in line)
            stages = [("mid-copy", "created", []), ("mid-run", "running", lines[:second + 1]),
                      ("finished", "finished", lines)]
            for stage, status, kept in stages:
                (new / "events.jsonl").write_text("".join(kept))
                if stage == "mid-run":
                    RunDir(new).write_supervisor_pid(os.getpid())
                screen.load()
                await wait_for(pilot, lambda: len(screen.rows) == len(IDS) + 1
                               and screen.rows[0][1].status == status, what=f"the run {stage}")
                await wait_for(pilot, lambda: _columns_fit_cells(screen), what=f"columns that fit the run {stage}")
            assert [_shown_id(row) for row in _table_rows(screen)] == ["77aa", *(i[-4:] for i in IDS)], \
                _layout(screen)
            assert "auto(cpu)→cpu" in _table_rows(screen)[0]

    run(drive())


def test_a_table_laid_out_wider_than_its_room_gives_the_difference_to_the_ids(home, monkeypatch):
    """Where the table comes out wider than the room the screen measured for the ids (CI saw it
    a cell wider at 80 columns, the ids cut), the ids give up the difference: here the room is
    said one cell too large, and the tokens must still show whole."""
    for run_id in IDS:
        copy_run(home, "finished", run_id)
    copy_run(home, "crash-fallback", "20261125-080000-matmul-auto-77aa")
    measured = RunsScreen._id_room
    monkeypatch.setattr(RunsScreen, "_id_room", lambda self: None if (room := measured(self)) is None else room + 1)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=SMALL) as pilot:
            screen = await open_runs(app, pilot, len(IDS) + 1)
            await wait_for(pilot, lambda: [_shown_id(row) for row in _table_rows(screen)]
                           == ["77aa", *(i[-4:] for i in IDS)], what="the tokens whole",
                           why=lambda: _layout(screen))
            table = screen.query_one("#runs", DataTable)
            assert table.virtual_size.width <= table.scrollable_content_region.width, _layout(screen)

    run(drive())


def test_shown_ids_keep_what_tells_them_apart():
    ids = ["20261123-111049-matmul-cpu-2bcd", "20261123-111512-matmul-cpu-2bcd",
           "20261124-000001-finished"]
    assert shown_ids(ids, 40) == {i: i for i in ids}
    # the same token twice: the shortest end that only one of them has
    assert shown_ids(ids, 4) == {ids[0]: "111049-matmul-cpu-2bcd", ids[1]: "111512-matmul-cpu-2bcd",
                                 ids[2]: "finished"}
    assert shown_ids(ids, 12)[ids[2]] == "…finished"
    assert shown_ids(IDS, 16) == {IDS[0]: "…tiny-auto-a1b2", IDS[1]: "…matmul-cpu-9f3e",
                                  IDS[2]: "…matmul-cpu-2bcd"}


# ------------------------------------------------------------ r: resuming


def _stopped_run(home) -> tuple:
    """The finished run cut at its middle and stopped there: resumable, at a known step."""
    path = copy_run(home, "finished", "20261123-000001-stopped")
    lines = (path / "events.jsonl").read_text().splitlines(keepends=True)
    steps = [i for i, line in enumerate(lines) if '"type":"step"' in line]
    cut = lines[: steps[len(steps) // 2] + 1]
    last = json.loads(cut[-1])
    cut.append(json.dumps({"v": 1, "t": last["t"] + 1, "type": "run_finished", "attempt": 0,
                           "status": "stopped"}) + "\n")
    (path / "events.jsonl").write_text("".join(cut))
    return path, last["step"]


def test_r_says_resuming_at_once_while_the_run_is_checked(home, monkeypatch):
    path, step = _stopped_run(home)
    checking = threading.Event()    # r pressed: the run is being checked (it may load torch)
    release = threading.Event()
    prepare = resume.prepare

    def slow_prepare(run: RunDir, *args, **kwargs):
        checking.set()
        release.wait(60)
        return prepare(run, *args, **kwargs)

    monkeypatch.setattr(resume, "prepare", slow_prepare)
    try:
        async def drive():
            app = make_app(attach=False)
            opened = []
            app.open_run = lambda run, start=False: opened.append((run.id, start))
            async with app.run_test(size=SMALL) as pilot:
                screen = await open_runs(app, pilot, 1)
                table = screen.query_one("#runs", DataTable)
                assert str(table.get_cell(path.name, "status")) == "stopped"
                await pilot.press("r")
                # at once: its row says resuming, and the detail line the step it is at
                assert str(table.get_cell(path.name, "status")) == "resuming"
                detail = str(screen.query_one("#run-detail").render())
                assert f"step {step}/" in detail and "resuming" in detail
                await wait_for(pilot, checking.is_set, what="the run to be checked")
                await pilot.press("r")                   # once is enough
                release.set()
                await wait_for(pilot, lambda: opened, what="the resumed run to open")
                assert opened == [(path.name, True)]
                await wait_for(pilot, lambda: str(table.get_cell(path.name, "status")) == "stopped",
                               what="the row to say what the run's events say again")

        run(drive())
    finally:
        release.set()


# ------------------------------------------------------------ the log screen: an empty output


def _panes(screen: LogScreen) -> tuple[LogPane, LogPane]:
    return screen.query_one("#events", LogPane), screen.query_one("#output", LogPane)


def _shown(pane: LogPane) -> str:
    return " ".join(pane.render_line(y).text.strip() for y in range(pane.size.height))


async def _open_logs(pilot, path, attempt=None) -> LogScreen:
    screen = LogScreen(RunDir(path), attempt)
    pilot.app.push_screen(screen)
    await wait_for(pilot, lambda: any("run finished" in line for line in _panes(screen)[0].lines)
                   and screen._output_read, what="the events and the output to be read")
    return screen


def test_an_empty_output_says_why_and_leaves_the_events_its_room(home):
    path = copy_run(home, "crash-fallback")   # attempt 1: cockpit's trainer, a native crash, no output

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = await _open_logs(pilot, path, attempt=1)
            _, output = _panes(screen)
            assert not output.lines and screen.view == "output"
            await wait_for(pilot, lambda: "no output from attempt 1" in _shown(output),
                           what="the empty pane's word")
            said = _shown(output)
            assert "cockpit's own trainer" in said and "as events (v shows them)" in said
            await pilot.press("right_square_bracket")          # attempt 2 wrote its closing line
            await wait_for(pilot, lambda: output.lines == ["attempt 2: finished at step 12/12"],
                           what="attempt 2's output")
            assert "no output" not in _shown(output)

            await pilot.resize_terminal(*LARGE)                # side by side
            await wait_for(pilot, lambda: screen.has_class("wide"), what="the wide layout")
            events, output = _panes(screen)
            await pilot.pause()
            assert events.region.width == output.region.width  # output to show: half each
            await pilot.press("left_square_bracket")
            await wait_for(pilot, lambda: screen.attempt == 1 and screen._output_read
                           and events.region.width > 3 * output.region.width,
                           what="the events to take the empty output's room")
            assert "as events (on the left)" in _shown(output)

    run(drive())


def test_a_commands_empty_output_says_its_log_is_empty(home):
    path = copy_run(home, "crash-fallback")
    lines = (path / "events.jsonl").read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):   # attempt 1 as a command's: its attempt_started names it
        e = json.loads(line)
        if e["type"] == "attempt_started" and e["attempt"] == 1:
            lines[i] = json.dumps({**e, "command": ["python", "train.py"]}) + "\n"
    (path / "events.jsonl").write_text("".join(lines))

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = await _open_logs(pilot, path, attempt=1)
            _, output = _panes(screen)
            await wait_for(pilot, lambda: "no output from attempt 1: attempt-1.log is empty"
                           in _shown(output), what="the empty pane's word")
            assert "trainer" not in _shown(output)

    run(drive())


# ------------------------------------------------------------ n and N


def test_n_and_n_say_the_only_match_and_going_round(home):
    path = copy_run(home, "crash-fallback")
    (path / "attempt-1.log").write_text("".join(f"epoch 0 batch {i}\n" for i in range(10)))

    def said(app) -> list[str]:
        return [n.message for n in app._notifications]

    async def drive():
        async with make_app(attach=False).run_test(size=SMALL) as pilot:
            screen = await _open_logs(pilot, path, attempt=1)
            _, output = _panes(screen)
            await wait_for(pilot, lambda: len(output.lines) == 10, what="attempt 1's output")
            await pilot.press("slash", *"batch 3", "enter")
            await wait_for(pilot, lambda: output.match == 3, what="the match")
            assert "/batch 3: line 4, match 1 of 1" in output.border_subtitle
            await pilot.press("n")
            await wait_for(pilot, lambda: any("the only match" in m for m in said(pilot.app)),
                           what="n to say it is the only match")
            assert output.match == 3
            await pilot.press("N")
            await wait_for(pilot, lambda: sum("the only match" in m for m in said(pilot.app)) == 2,
                           what="N to say so too")

            await pilot.press("slash", *"BATCH", "enter")
            await wait_for(pilot, lambda: output.search_query == "BATCH" and output.match is not None,
                           what="the new search")
            assert output.match == 0 and "match 1 of 10" in output.border_subtitle
            await pilot.press("N")                           # before the first: round to the last
            await wait_for(pilot, lambda: any("from the bottom again, match 10 of 10" in m
                                              for m in said(pilot.app)), what="going round the top")
            assert output.match == 9 and "match 10 of 10" in output.border_subtitle
            await pilot.press("n")                           # after the last: round to the first
            await wait_for(pilot, lambda: any("from the top again, match 1 of 10" in m
                                              for m in said(pilot.app)), what="going round the end")
            await pilot.press("slash", *"no such text", "enter")
            await wait_for(pilot, lambda: any("no match for 'no such text'" in m for m in said(pilot.app)),
                           what="no match")

    run(drive())


def test_what_the_id_column_shows_is_what_the_commands_take(home):
    """The end shown at 80 columns finds its run (cockpit runs show 9f3e), as a prefix does."""
    for run_id in IDS:
        copy_run(home, "finished", run_id)
    shown = shown_ids(IDS, 12)
    for run_id in IDS:
        assert find_run(shown[run_id]).id == run_id
        assert find_run(run_id.rsplit("-", 1)[1]).id == run_id   # the token alone
    assert find_run("20261124").id == IDS[0]                       # a prefix still first
    with pytest.raises(ConfigError, match="matches several runs"):
        find_run("20261123")
    with pytest.raises(ConfigError, match="not found"):
        find_run("matmul")   # the middle of an id is neither its start nor its end

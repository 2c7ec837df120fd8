"""A run on several machines in the TUI: its directory made as `cockpit --node NAME --run-id r1`
makes it (engine.record.nodes.join), each machine's events written from a recorded run. The
dashboard opens on the machine whose speaker is global rank 0 (not the first by name here), the
run's id in its title, a row per machine -- a lost one's sentence shortened -- whole at 80x24
and 200x50; `nodes_changed` worded in its log and headless; the runs screen lists the run with
its machines' status, opens it and stops every machine; a run of one machine has no panel."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from cockpit.app import make_app
from cockpit.headless import HeadlessPrinter
from cockpit.present.lines import human_line
from cockpit.ui.dashboard import DashboardScreen
from cockpit.ui.machines import Machines, shown
from cockpit.ui.runs import RunsScreen, live_runs
from cockpit.ui.widgets.machines import MachinesPanel, machine_lines
from engine import runconfig
from engine.record import nodes
from engine.record.nodes import NodeView
from engine.record.rundir import RunDir, summarize
from test_ui_dashboard import _assert_whole, _painted, screen_lines
from ui_support import RUNS, copy_run, open_runs, run, wait_for

SIZES = [(80, 24), (200, 50)]
LOST_AT = 129          # where machine a is lost: the recorded run's middle step
RESUMED = 120          # the checkpoint b resumes from, alone
A_LOST = f"This machine (a) was lost after step {LOST_AT} (its torchrun agent was killed by SIGKILL)."
B_SAW = f"Machine a was lost after step {LOST_AT} (Connection reset by peer)."


def _recorded() -> list[dict]:
    return [json.loads(line) for line in (RUNS / "finished" / "events.jsonl").read_text().splitlines()]


def _ready(e: dict, machines: int, rank: int) -> dict:
    return {**e, "nodes": machines, "node_rank": min(rank, machines - 1), "rank": rank,
            "world_size": machines} if e["type"] == "trainer_ready" else e


def _write(node: RunDir, events: list[dict]) -> None:
    node.events_path.write_text("".join(json.dumps(e) + "\n" for e in events))


def _join(home, run_id: str, machines: str) -> tuple[RunDir, RunDir]:
    """Machines a and b of run `run_id`, as `cockpit --node a|b --run-id RUN_ID` makes them."""
    config = runconfig.resolve("matmul", "cpu", [f"nnodes={machines}", "rdzv_endpoint=127.0.0.1:29400"])
    return nodes.join(config, run_id, "a", home / "runs"), nodes.join(config, run_id, "b", home / "runs")


def several(home, run_id: str = "r1") -> RunDir:
    """A run on machines a and b, one process each, as their node supervisors leave it: a (rank
    1) lost after step LOST_AT, its supervisor gone; b (rank 0: the lead, though not the first)
    says it lost a, trains on alone from step RESUMED (nodes_changed) and finishes."""
    a, b = _join(home, run_id, "1:2")
    events = _recorded()
    cut = next(i for i, e in enumerate(events) if e["type"] == "step" and e["step"] >= LOST_AT)
    t = events[cut]["t"]
    assert events[cut]["step"] == LOST_AT
    lost = {"v": 1, "type": "crash", "attempt": 1, "preset": "cpu", "kind": "node-lost", "exception": None}
    ended = {"v": 1, "type": "attempt_ended", "attempt": 1, "preset": "cpu", "outcome": "node-lost",
             "exit_code": 1, "signal": None, "exit": "exit 1", "last_step": LOST_AT, "tail": ""}
    _write(a, [_ready(e, 2, 1) for e in events[:cut + 1]] + [
        {**lost, "t": t + 0.5, "sentence": A_LOST, "evidence": {"signal": "SIGKILL", "node": "a"}},
        {**ended, "t": t + 0.6, "signal": "SIGKILL", "exit_code": None, "exit": "SIGKILL"}])
    first = next(e for e in events if e["type"] == "attempt_started")
    ready = next(e for e in events if e["type"] == "trainer_ready")
    resume = {"step": RESUMED, "samples_seen": RESUMED * 64, "path": f"checkpoints/step-{RESUMED:09d}.pt"}
    alone = [
        {**lost, "t": t + 1.0, "sentence": B_SAW, "evidence": {"message": "Connection reset by peer", "node": "b"}},
        {**ended, "t": t + 1.1},
        # its rule: re-formed at the smaller size (nnodes '1:2'), from the newest checkpoint
        {"v": 1, "t": t + 1.2, "type": "fallback", "attempt": 1, "from": "cpu", "to": "cpu", "to_preset": "cpu",
         "action": "retry", "reason": "node-lost", "why": "node-lost -> retry (rule)", "sentence": B_SAW,
         "changed": {}, "resume": resume, "next_attempt": 2},
        {**first, "t": t + 2.0, "attempt": 2, "resume": resume},
        {**_ready(ready, 1, 0), "t": t + 3.0, "attempt": 2, "resumed_from": resume},
        {"v": 1, "t": t + 3.0, "type": "nodes_changed", "attempt": 2, "nodes_before": 2, "nodes": 1, "world_size": 1,
         "resumed_step": RESUMED, "steps_lost": LOST_AT - RESUMED}]
    later = [{**e, "attempt": 2 if e.get("attempt") == 1 else e.get("attempt"), "t": e["t"] + 5.0}
             for e in events[cut + 1:]]
    _write(b, [_ready(e, 2, 0) for e in events[:cut + 1]] + alone + later)
    return RunDir(home / "runs" / run_id)


def _panel_rows(app, panel: MachinesPanel) -> list[str]:
    """The panel's rows as drawn on the terminal (its border, where it has one, included)."""
    r = panel.region
    return [line[r.x:r.right] for line in screen_lines(app)[r.y:r.bottom]]


async def _opened(pilot, app, run_dir: RunDir) -> DashboardScreen:
    dash = app.open_run(run_dir)
    await wait_for(pilot, lambda: dash.ended and _painted(dash), what="the replay painted")
    panel = dash.query_one(MachinesPanel)
    await wait_for(pilot, lambda: len(panel.views) == 2 and panel.lines, what="the machines read")
    # and drawn where the panel is laid out (a loaded machine lays out a frame later)
    await wait_for(pilot, lambda: all(any(f"{v.name} " in row for row in _panel_rows(app, panel))
                                      for v in panel.views), what="the machines drawn")
    return dash


# ------------------------------------------------------------ the dashboard


@pytest.mark.parametrize("size", SIZES)
def test_a_run_on_several_machines_opens_on_its_lead_with_a_row_per_machine(home, size):
    whole = several(home)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            dash = await _opened(pilot, app, whole)
            # the lead: b, whose speaker is global rank 0, not a, the first by name
            assert dash.run.path == whole.path / "nodes" / "b"
            assert dash.model.run_id == "r1" and dash.model.status == "finished"
            status = "\n".join(screen_lines(app)[:1])
            assert "r1" in status and "finished" in status
            panel = dash.query_one(MachinesPanel)
            rows = _panel_rows(app, panel)
            text = "\n".join(rows)
            b_row = next(r for r in rows if "▸b" in r)
            a_row = next(r for r in rows if " a " in r and "▸" not in r)
            assert "finished" in b_row and "step 256" in b_row and "world 1x1" in b_row
            assert "samples/s" in b_row and "rss" in b_row
            assert "lost" in a_row and f"step {LOST_AT}" in a_row
            # a's sentence, shortened: its own name not said twice, cut to the width
            assert f"lost after step {LOST_AT} (its torchrun agent" in text
            assert "This machine (a)" not in text
            if size == (80, 24):
                # two lines, a row each: a's sentence in the place of its world, rate and memory;
                # b, finished, keeps its figures (the machine it lost is in the log)
                assert len(rows) == 2 and "…" in a_row and "world" not in a_row
                assert "Machine a was lost" not in text
            else:
                # a border titled, each sentence on a line of its own, whole; b's: the machine it lost
                assert rows[0].lstrip("─").startswith("machines")
                assert A_LOST.removeprefix("This machine (a) was ").rstrip(".") in text
                assert f"Machine a was lost after step {LOST_AT} (Connection reset by peer)" in text
                assert len(rows) == 1 + 2 + 2
            _assert_whole(dash)
            assert all(len(line) <= size[0] for line in screen_lines(app))
            assert dash.query_one("#log").content_size.height >= 1
            # the world's change, in words, in the log
            said = [line for line in dash.model.log if "world 2 -> 1 machines" in line]
            assert said and f"resumed at step {RESUMED}, {LOST_AT - RESUMED} steps lost" in said[0]
            assert "a machine lost" in said[0]

    run(drive())


def test_a_crash_on_the_lead_at_80x24_keeps_every_part_whole(home):
    """A native crash and its fallback on b, the lead, told in the attempts panel's two more
    lines at 80x24 (as on one machine): with the machines' two, the log keeps one, the plots
    the rest, nothing cut off; laid out again after a resize."""
    a, b = _join(home, "r1", "1:2")
    recorded = [json.loads(line) for line in (RUNS / "crash-fallback" / "events.jsonl").read_text().splitlines()]
    # attempt 1 re-formed after a lost machine (as a machine of several does), then the recorded
    # native crash and its fallback as attempts 2 and 3; cut at attempt 3's first step, live
    t = recorded[1]["t"]
    events = [recorded[0], {**recorded[1], "t": t - 3},
              {**next(e for e in recorded if e["type"] == "trainer_ready"), "t": t - 2.5},
              {"v": 1, "t": t - 1, "type": "crash", "attempt": 1, "preset": "auto", "kind": "node-lost",
               "sentence": "Machine a was lost (Connection reset by peer).", "evidence": {"node": "b"}, "exception": None},
              {"v": 1, "t": t - 1, "type": "attempt_ended", "attempt": 1, "preset": "auto", "outcome": "node-lost",
               "exit_code": 1, "signal": None, "exit": "exit 1", "last_step": 0, "tail": ""},
              {"v": 1, "t": t - 1, "type": "fallback", "attempt": 1, "from": "auto", "to": "auto", "to_preset": "auto",
               "action": "retry", "reason": "node-lost", "why": "node-lost -> retry (rule)", "sentence": "",
               "changed": {}, "resume": None, "next_attempt": 2}]
    events += [{**e, "attempt": e["attempt"] + 1 if e.get("attempt") else e.get("attempt"),
                **({"next_attempt": e["next_attempt"] + 1} if "next_attempt" in e else {})} for e in recorded[1:]]
    third = next(i for i, e in enumerate(events) if e["type"] == "step" and e["attempt"] == 3)
    _write(a, [_ready(e, 2, 1) if e["type"] != "crash" or e["kind"] != "node-lost" else
               {**e, "sentence": "This machine (a) was lost (its torchrun agent was killed by SIGKILL)."}
               for e in events[:third + 1]])
    _write(b, [_ready(e, 2, 0) for e in events[:third + 1]])
    b.write_supervisor_pid(os.getpid())

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = app.open_run(RunDir(home / "runs" / "r1"))
            await wait_for(pilot, lambda: dash.model.live and dash.has_class("-tall-attempts") and _painted(dash)
                           and dash.query_one(MachinesPanel).lines == 2,
                           what="the live run painted, the crash in the attempts panel")
            panel = dash.query_one(MachinesPanel)
            await pilot.pause()
            assert dash.run.path == b.path and dash.has_class("-machines")
            _assert_whole(dash)
            assert dash.query_one("#log").content_size.height == 1 and panel.region.height == 2
            assert all(len(line) <= 80 for line in screen_lines(app))
            rows = _panel_rows(app, panel)
            assert rows[0].split()[:2] == ["a", "lost"] and "its torchrun agent was killed" in rows[0]
            assert rows[1].split()[:2] == ["▸b", "running"] and "world 2x1" in rows[1]
            await pilot.resize_terminal(200, 50)
            await wait_for(pilot, lambda: panel.has_class("-short") is False and _painted(dash), what="the resize")
            await pilot.pause()
            _assert_whole(dash)
            assert _panel_rows(app, panel)[0].lstrip("─").startswith("machines: 1 of 2 running")
            await pilot.resize_terminal(80, 24)
            await wait_for(pilot, lambda: panel.has_class("-short") and _painted(dash), what="80x24 again")
            await pilot.pause()
            _assert_whole(dash)
            assert all(len(line) <= 80 for line in screen_lines(app))

    run(drive())


def test_a_run_that_needs_every_machine_fails_and_each_row_says_why(home):
    """nnodes = 2: b stops when a is lost (run_failed); at 80x24 each row tells its machine's
    sentence in the place of its figures."""
    whole = several(home)
    b = RunDir(whole.path / "nodes" / "b")
    events = b.events()
    end = next(i for i, e in enumerate(events) if e["type"] == "attempt_ended")
    t = events[end]["t"]
    _write(b, events[:end + 1] + [
        {"v": 1, "t": t + 0.1, "type": "run_failed", "attempt": 0, "kind": "node-lost",
         "reason": "node-lost -> retry (rule), but nnodes = '2' needs every machine: nnodes = 'MIN:MAX' goes on at fewer"},
        {"v": 1, "t": t + 0.2, "type": "run_finished", "attempt": 0, "status": "failed", "attempts": 1}])

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = await _opened(pilot, app, whole)
            assert dash.model.status == "failed"
            rows = _panel_rows(app, dash.query_one(MachinesPanel))
            assert rows[0].split()[:2] == ["a", "lost"] and f"lost after step {LOST_AT} (its torchrun" in rows[0]
            assert rows[1].split()[:2] == ["▸b", "failed"] and f"Machine a was lost after step {LOST_AT}" in rows[1]
            assert not any("world" in r for r in rows) and all(len(r) <= 80 for r in rows)
            _assert_whole(dash)

    run(drive())


def test_a_run_of_one_machine_has_no_machines_panel(home):
    path = copy_run(home, "finished")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = app.open_run(RunDir(path))
            await wait_for(pilot, lambda: dash.ended and _painted(dash), what="the replay painted")
            await pilot.pause()
            assert dash.machines is None and not dash.query(MachinesPanel)
            assert not dash.has_class("-machines")
            assert dash.run.path == path and dash.model.run_id == path.name
            assert dash.query_one("#log").content_size.height == 2   # the log keeps its two lines
            assert not any("machines" in line for line in screen_lines(app))
            _assert_whole(dash)

    run(drive())


def test_a_machine_asked_for_is_shown_with_its_run(home):
    whole = several(home)
    a = RunDir(whole.path / "nodes" / "a")
    shown_dir, machines = shown(a)
    assert shown_dir.path == a.path and machines is not None and machines.run.path == whole.path
    assert shown(whole)[0].path == whole.path / "nodes" / "b"
    one = RunDir(copy_run(home, "finished"))
    assert shown(one) == (one, None)


def test_the_panel_follows_a_machine_as_it_writes(home, monkeypatch):
    """A live run: machine a writes on; the panel, reading every READ_S, shows its new step and
    reads only what was appended."""
    from cockpit.ui.widgets import machines as panel_module

    monkeypatch.setattr(panel_module, "READ_S", 0.1)
    whole = several(home)
    a, b = (RunDir(whole.path / "nodes" / name) for name in "ab")
    # b, the lead, cut mid-run (after its world changed) with a live supervisor
    events = b.events()
    changed = next(i for i, e in enumerate(events) if e["type"] == "nodes_changed")
    _write(b, events[:changed + 3])
    b.write_supervisor_pid(os.getpid())

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            dash = app.open_run(whole)
            await wait_for(pilot, lambda: len(dash.query_one(MachinesPanel).views) == 2 and dash.model.live,
                           what="the live run")
            panel = dash.query_one(MachinesPanel)
            # a comes back: its supervisor writes a step past where it was lost
            step = next(e for e in a.events() if e["type"] == "step")
            with open(a.events_path, "a") as f:
                f.write(json.dumps({**step, "attempt": 2, "step": 300, "t": step["t"] + 100}) + "\n")
            await wait_for(pilot, lambda: any(v.name == "a" and v.step == 300 for v in panel.views),
                           what="a's new step in the panel")
            await wait_for(pilot, lambda: any("step 300" in r for r in _panel_rows(app, panel)),
                           what="a's new step drawn")
            digest = panel.machines._digests[a.path]
            assert digest._follower.offset == a.events_path.stat().st_size

    run(drive())


# ------------------------------------------------------------ what the panel and the runs screen read


def test_the_machines_read_as_appended_say_what_nodes_view_and_summarize_say(home):
    whole = several(home)
    machines = Machines(whole)
    assert machines.views() == [nodes.view(n) for n in nodes.nodes_of(whole)]
    gathered, averages = machines.summary() or (None, None)
    assert gathered == summarize(whole) and gathered.status == "lost"   # a lost, b finished
    assert averages is not None and averages.samples_per_s


def test_the_runs_screen_lists_it_with_its_machines_status_and_opens_its_lead(home):
    whole = several(home)
    copy_run(home, "finished", "20261123-000001-finished")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_runs(app, pilot, 2)
            assert isinstance(screen, RunsScreen)
            table = screen.query_one("#runs")
            cells = {name: str(c) for name, c in zip(screen.COLUMNS, table.get_row("r1"))}
            assert cells["status"] == "lost" and cells["samples/s"] not in ("", "-")
            ids = [r.id for r, _ in screen.rows]
            await pilot.press(*["down"] * ids.index("r1"), "enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="the dashboard")
            assert app.screen.run.path == whole.path / "nodes" / "b" and app.screen.model.run_id == "r1"

    run(drive())


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_live_run_on_several_machines_is_attached_and_s_stops_every_machine(home):
    """Both machines' supervisors live on this host: the cockpit attaches to the run at start,
    on its lead, and s asks both to stop (each a process here that SIGTERM ends)."""
    whole = several(home)
    procs = {name: _sleeper() for name in "ab"}
    try:
        for name, proc in procs.items():
            node = RunDir(whole.path / "nodes" / name)
            events = node.events()
            _write(node, events[:next(i for i, e in enumerate(events) if e["type"] == "step") + 1])
            node.write_supervisor_pid(proc.pid)
        assert [r.id for r in live_runs()] == ["r1"]

        async def drive():
            app = make_app(attach=True)
            async with app.run_test(size=(80, 24)) as pilot:
                await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="attached")
                dash = app.screen
                assert dash.run.path == whole.path / "nodes" / "b" and dash.model.run_id == "r1"
                await wait_for(pilot, lambda: dash.model.live and dash.check_action("stop", ()),
                               what="stop offered")
                await pilot.press("s")
                for proc in procs.values():
                    assert proc.wait(30) == -15   # SIGTERM: what a supervisor stops on

        run(drive())
    finally:
        for proc in procs.values():
            proc.kill()


def test_the_runs_screen_stops_every_machine_of_a_run(home):
    whole = several(home)
    procs = {name: _sleeper() for name in "ab"}
    try:
        for name, proc in procs.items():
            node = RunDir(whole.path / "nodes" / name)
            events = node.events()
            _write(node, events[:next(i for i, e in enumerate(events) if e["type"] == "step") + 1])
            node.write_supervisor_pid(proc.pid)

        async def drive():
            app = make_app(attach=False)
            async with app.run_test(size=(80, 24)) as pilot:
                screen = await open_runs(app, pilot, 1)
                assert str(screen.query_one("#runs").get_row("r1")[2]) == "running"
                await wait_for(pilot, lambda: screen.check_action("stop", ()), what="stop offered")
                await pilot.press("s")
                for proc in procs.values():
                    assert proc.wait(30) == -15

        run(drive())
    finally:
        for proc in procs.values():
            proc.kill()


# ------------------------------------------------------------ the rows and the words


def _view(name: str, status: str = "running", lost: str | None = None, step: int = 1200) -> NodeView:
    return NodeView(name=name, host=None, status=status, step=step, nodes=4, world_size=32, rank=None,
                    samples_per_s=12345.6, rss=2_300_000_000, last_event=None, lost=lost, attempts=1)


def test_the_rows_fit_their_width_and_lines():
    views = [_view(f"gpu-node-{i:02d}") for i in range(6)]
    views[3] = _view("gpu-node-03", "lost", "This machine (gpu-node-03) was lost after step 1200 (its host is gone).")
    # every row in 8 lines at 120 columns: a's sentence on a line of its own
    text = machine_lines(views, 120, 8, shown="gpu-node-00").plain.split("\n")
    assert len(text) == 7 and text[0].startswith("▸gpu-node-00") and "world 4x8" in text[0]
    assert text[4] == "   lost after step 1200 (its host is gone)"
    # fewer lines than machines: the one shown, then the lost one (its sentence in its row,
    # in the place of its figures), the rest counted
    three = machine_lines(views, 78, 3, shown="gpu-node-00").plain.split("\n")
    assert three[0].startswith("▸gpu-node-00") and "world 4x8" in three[0]
    assert three[1].startswith(" gpu-node-03") and "lost after step 1200 (its host is gone)" in three[1]
    assert "world" not in three[1]
    assert three[2] == " +4 more: 4 running"
    two = machine_lines(views, 78, 2, shown="gpu-node-00").plain.split("\n")
    assert len(two) == 2 and two[0] == three[0] and two[1] == " +5 more: 4 running, 1 lost"
    # narrow: the rightmost figures go first, never past the width
    for width in (40, 50, 60, 78):
        lines = machine_lines(views[:2], width, 8).plain.split("\n")
        assert all(len(line) <= width for line in lines), (width, lines)
    assert "rss" not in machine_lines(views[:2], 50, 8).plain


def test_nodes_changed_in_words_and_printed_headless():
    shrank = {"v": 1, "t": 10.0, "type": "nodes_changed", "attempt": 2, "nodes_before": 2, "nodes": 1,
              "world_size": 4, "resumed_step": 40, "steps_lost": 2}
    grew = {**shrank, "attempt": 3, "nodes_before": 1, "nodes": 3, "world_size": 12, "steps_lost": 0}
    assert human_line(shrank) == ("attempt 2: world 2 -> 1 machines, 4 processes (a machine lost); "
                                  "resumed at step 40, 2 steps lost")
    assert human_line(grew) == ("attempt 3: world 1 -> 3 machines, 12 processes (2 machines back); "
                                "resumed at step 40, no step lost")
    out = io.StringIO()
    printer = HeadlessPrinter(stream=out, live=False)
    printer([shrank])
    assert out.getvalue() == human_line(shrank) + "\n"

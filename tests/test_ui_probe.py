"""The probe screen, driven by Pilot at 80x24: a real probe through the UI (two CPU thread
counts), using its answer, the batch finder with a saved preset, and a cached result."""

from __future__ import annotations

import json
import shutil

from textual.widgets import DataTable

from cockpit.app import make_app
from cockpit.ui.launch import LaunchScreen
from cockpit.ui.probe_screen import ProbeScreen
from conftest import FIXTURES
from engine.probe import cache
from ui_support import run, wait_for

MATMUL = "params.n=64 params.products=8 params.samples=4096 params.eval_samples=64"


def _text(screen, selector: str) -> str:
    return str(screen.query_one(selector).render())


def _cells(table: DataTable, column: str) -> list[str]:
    return [str(table.get_cell(row, column)) for row in table.rows]


def test_probe_through_the_ui_ranks_candidates_and_u_uses_the_best(home):
    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            launch = app.screen
            launch.query_one("#overrides").value = MATMUL
            launch.probe_options = {"budget_s": 26}
            await pilot.pause()
            await pilot.press("p")
            await wait_for(pilot, lambda: isinstance(app.screen, ProbeScreen), what="probe screen")
            probe = app.screen
            assert "no probe of this workload yet" in _text(probe, "#status")
            await pilot.press("p")  # asks for the budget, the launch screen's 26 s filled in
            await pilot.pause()
            assert probe.query_one("#ask").value == "26" and probe.asking == "probe"
            probe.query_one("#ask").value = "2"
            await pilot.press("enter")  # too small: said, and the question stays
            await pilot.pause()
            assert probe.asking == "probe" and not probe.busy
            probe.query_one("#ask").value = "26"
            await pilot.press("enter")
            await wait_for(pilot, lambda: probe.result is not None and not probe.busy, timeout=60,
                           what="the probe to finish")
            table = probe.query_one("#candidates", DataTable)
            assert sorted(_cells(table, "label")) == ["cpu (1 thread)", "cpu (2 threads)"]
            assert _cells(table, "status") == ["ok", "ok"]
            rates = [float(r.replace(",", "")) for r in _cells(table, "rate")]
            assert rates[0] >= rates[1] > 0  # ranked, fastest first
            assert probe.result.recommended == _cells(table, "label")[0]
            assert "for matmul at batch 32 x 4" in _text(probe, "#sentence")
            assert cache.latest("matmul")["recommended"] == probe.result.recommended
            await pilot.press("u")
            await wait_for(pilot, lambda: isinstance(app.screen, LaunchScreen), what="back on launch")
            threads = probe.result.candidates[0].threads
            assert launch.query_one("#overrides").value == MATMUL + f" device=cpu threads={threads}"
            assert f"{threads} thread{'s' * (threads > 1)}" in _text(launch, "#resolved-text")
            assert _text(launch, "#probe").startswith("probe (just now): ")

    run(drive())


def test_batch_finder_in_the_ui_saves_a_new_preset_once(home):
    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            launch = app.screen
            devices = launch.query_one("#devices")
            devices.highlighted = [o.id for o in devices._options].index("cpu")
            launch.query_one("#overrides").value = MATMUL + " threads=1"
            await pilot.pause()
            # a finder budget for a hang only: the search ends once it has found the boundary
            app.push_screen(ProbeScreen(launch.resolve(), max_batch=64, trial_s=0.2, finder_budget_s=300))
            await pilot.pause()
            probe = app.screen
            await pilot.press("b")  # asks for a memory limit; escape takes the question back
            await pilot.pause()
            assert probe.asking == "batch"
            await pilot.press("escape")
            await pilot.pause()
            assert probe.asking is None and app.screen is probe
            await pilot.press("b")
            await pilot.pause()
            probe.query_one("#ask").value = "lots"
            await pilot.press("enter")
            await pilot.pause()
            assert probe.asking == "batch" and not probe.busy
            probe.query_one("#ask").value = ""  # no limit
            await pilot.press("enter")
            await wait_for(pilot, lambda: probe.batch is not None and not probe.busy, timeout=360,
                           what="the batch finder")
            trials = probe.query_one("#trials", DataTable)
            assert _cells(trials, "batch") == ["8", "16", "32", "64"] and set(_cells(trials, "fits")) == {"yes"}
            assert "Micro-batch 64 is the largest" in _text(probe, "#sentence")
            await pilot.press("s")
            await pilot.pause()
            name = probe.query_one("#ask")
            assert name.value == "cpu-matmul-b64" and name.has_focus and probe.asking == "save"
            await pilot.press("enter")
            await pilot.pause()
            saved = home / "config" / "presets" / "devices" / "cpu-matmul-b64.toml"
            text = saved.read_text()
            assert "batch_size = 64" in text and "accumulation = 8" in text and "threads = 1" in text
            await pilot.press("s", "enter")  # the same name again: refused, nothing overwritten
            await pilot.pause()
            assert saved.read_text() == text and probe.query_one("#ask-row").display

    run(drive())


def test_the_probe_screen_shows_a_cached_result_at_once(home):
    recorded = FIXTURES / "probes" / "h100-trm-tiny.json"
    (home / "cache" / "probes").mkdir(parents=True)
    shutil.copy(recorded, home / "cache" / "probes" / recorded.name)
    result = json.loads(recorded.read_text())

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            launch = app.screen
            workloads = launch.query_one("#workloads")
            workloads.highlighted = [o.id for o in workloads._options].index("trm-tiny")
            await pilot.pause()
            assert result["sentence"][:40] in _text(launch, "#probe")
            await pilot.press("p")
            await wait_for(pilot, lambda: isinstance(app.screen, ProbeScreen), what="probe screen")
            table = app.screen.query_one("#candidates", DataTable)
            assert _cells(table, "label") == [c["label"] for c in result["candidates"]]
            assert "cached" in _text(app.screen, "#status") and not app.screen.busy

    run(drive())

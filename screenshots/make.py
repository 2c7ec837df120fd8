"""Regenerate the SVG screenshots of every screen from the recorded runs.

    python screenshots/make.py          # writes screenshots/*.svg (80x24, as over SSH; SIZED
                                        # also at 160x48)

Each screen is driven headless (App.run_test + Pilot) over a scratch copy of
tests/fixtures/runs/ (re-record those with screenshots/record.py). The 'live' run is the
recorded clean run cut at its middle, with a supervisor pid that is alive (this process), so
the dashboard shows it as running. The probe screen shows tests/fixtures/probes/ (a probe
recorded on the H100 machine). tests/test_ui_snapshots.py compares the screens that depend
only on the recorded runs against these files.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures" / "runs"
PROBES = ROOT / "tests" / "fixtures" / "probes"
OUT = ROOT / "screenshots"
SIZE = (80, 24)
FINISHED, CRASHED = "20261123-111646-matmul-cpu-61e9", "20261123-111111-matmul-auto-2bcd"
LIVE, CRASHED_LIVE = "20261123-111800-matmul-cpu-7a3f", "20261123-111500-matmul-auto-c41d"  # cut copies


def prepare(home: Path) -> None:
    """Runs and user config in a scratch home; the environment points cockpit there."""
    os.environ["COCKPIT_RUNS_DIR"] = str(home / "runs")
    os.environ["COCKPIT_CONFIG_DIR"] = str(home / "config")
    os.environ["TZ"] = "UTC"  # the runs screen shows local start times
    time.tzset()
    runs = home / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    # Named as RunDir.create names them (their recorded ids), so the runs screen shows what a
    # user's runs look like: start time, workload, device preset, a random token.
    for name, run_id in (("finished", FINISHED), ("crash-fallback", CRASHED)):
        dest = runs / run_id
        if not dest.exists():
            shutil.copytree(FIXTURES / name, dest)
    live = runs / LIVE
    if not live.exists():
        shutil.copytree(FIXTURES / "finished", live)
        lines = (live / "events.jsonl").read_text().splitlines(keepends=True)
        steps = [i for i, line in enumerate(lines) if '"type":"step"' in line]
        (live / "events.jsonl").write_text("".join(lines[: steps[len(steps) // 2] + 1]))
    # A run just after its crash: the crash-fallback run cut at attempt 2's first step, live.
    crashed = runs / CRASHED_LIVE
    if not crashed.exists():
        shutil.copytree(FIXTURES / "crash-fallback", crashed)
        lines = (crashed / "events.jsonl").read_text().splitlines(keepends=True)
        second = next(i for i, line in enumerate(lines)
                      if '"type":"step"' in line and '"attempt":2' in line)
        (crashed / "events.jsonl").write_text("".join(lines[: second + 1]))
    from engine.record.rundir import RunDir  # after sys.path has the project

    RunDir(live).write_supervisor_pid(os.getpid())
    RunDir(crashed).write_supervisor_pid(os.getpid())
    # The probe screen shows the probe recorded on the H100 machine, as measured five minutes ago.
    os.environ["COCKPIT_CACHE_DIR"] = str(home / "cache")
    probes = home / "cache" / "probes"
    probes.mkdir(parents=True, exist_ok=True)
    for recorded in PROBES.glob("*.json"):
        result = json.loads(recorded.read_text())
        result["created"] = time.time() - 300
        (probes / recorded.name).write_text(json.dumps(result))


async def launch(app, pilot) -> None:
    from engine import presets

    presets.save_user_preset("devices", "cpu-4threads", {
        "description": "my CPU run: 4 threads", "device": "cpu", "batch_size": 16, "accumulation": 8,
        "threads": 4})
    app.screen.on_screen_resume()
    await pilot.pause()


async def editor_error(app, pilot) -> None:
    from cockpit.ui.editor import EditorScreen

    app.push_screen(EditorScreen("devices", "mps"))
    await pilot.pause()
    field = app.screen.query_one("#field-batch_size")
    field.focus()
    field.value = "0"
    await pilot.pause()


async def open_run(app, pilot, name: str) -> None:
    from engine.record.rundir import find_run

    dash = app.open_run(find_run(name))
    while not dash.model.samples_series.points()[0] and not dash.ended:
        await pilot.pause(0.05)
    await pilot.pause(0.5)


async def runs(app, pilot) -> None:
    await pilot.press("o")
    await pilot.pause(0.8)


async def compare(app, pilot) -> None:
    """The crashed run and the finished one, marked on the runs screen and compared."""
    await pilot.press("o")
    runs = app.screen
    while len(runs.rows) < 3:
        await pilot.pause(0.05)
    for run_id in (FINISHED, CRASHED):
        runs.query_one("#runs").move_cursor(row=[r.id for r, _ in runs.rows].index(run_id))
        await pilot.press("space")
    await pilot.press("c")
    while not getattr(app.screen, "compared", None):
        await pilot.pause(0.05)
    await pilot.pause(0.5)


async def log(app, pilot) -> None:
    """The crash-fallback run's log view (l from its dashboard), at its crash event (x)."""
    await open_run(app, pilot, CRASHED)
    await pilot.press("l")
    events = app.screen.query_one("#events")
    while not any("run finished" in line for line in events.lines):
        await pilot.pause(0.05)
    await pilot.press("x")
    while events.marked is None:
        await pilot.pause(0.05)
    await pilot.pause(0.5)


async def probe(app, pilot) -> None:
    workloads = app.screen.query_one("#workloads")
    workloads.highlighted = [o.id for o in workloads._options].index("trm-tiny")
    await pilot.pause()
    await pilot.press("p")
    await pilot.pause(0.5)


SCREENS: dict[str, Callable[..., Awaitable[None]]] = {
    "launch": launch,
    "editor-error": editor_error,
    "live-run": lambda app, pilot: open_run(app, pilot, LIVE),
    "crash-fallback": lambda app, pilot: open_run(app, pilot, CRASHED),
    "crash-live": lambda app, pilot: open_run(app, pilot, CRASHED_LIVE),
    "finished": lambda app, pilot: open_run(app, pilot, FINISHED),
    "runs": runs,
    "compare": compare,
    "log": log,
    "probe": probe,
}
# The same screens at other sizes: what a big terminal gets (name -> screen, size).
SIZED = {"live-run-160x48": ("live-run", (160, 48)), "log-160x48": ("log", (160, 48))}


async def render(name: str) -> str:
    """One screen as SVG text (the environment must already point at a prepared home)."""
    from cockpit.app import make_app

    screen, size = SIZED.get(name, (name, SIZE))
    app = make_app(attach=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await SCREENS[screen](app, pilot)
        # A loaded machine may still be laying out (a footer, a panel's class) when the screen's
        # own wait ends: take the screen once two exports a moment apart agree.
        svg = app.export_screenshot(title=f"cockpit — {name}")
        for _ in range(SETTLE_TRIES):
            await pilot.pause(0.2)
            again = app.export_screenshot(title=f"cockpit — {name}")
            if again == svg:
                break
            svg = again
    return svg


SETTLE_TRIES = 25


def text_of(svg: str) -> str:
    """The characters an exported screen shows, row by row: what a failing comparison prints."""
    rows: dict[int, dict[int, str]] = {}
    for x, y, text in re.findall(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>(.*?)</text>', svg, re.S):
        row = rows.setdefault(round((float(y) - 20) / 24.4), {})
        for i, char in enumerate(html.unescape(text).replace("\xa0", " ")):
            row[round(float(x) / 12.2) + i] = char
    lines = (rows.get(r, {}) for r in range(max(rows, default=-1) + 1))
    return "\n".join("".join(row.get(c, " ") for c in range(max(row, default=-1) + 1)).rstrip() for row in lines)


def main(argv: list[str]) -> int:
    names = argv or [*SCREENS, *SIZED]
    with tempfile.TemporaryDirectory() as scratch:
        prepare(Path(scratch))
        for name in names:
            svg = asyncio.run(render(name))
            (OUT / f"{name}.svg").write_text(svg)
            print(f"wrote {OUT / (name + '.svg')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Helpers for the UI tests: recorded runs in the test's runs dir, and waiting on the app."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

from textual.css.query import NoMatches

from conftest import FIXTURES
from engine.record.rundir import RunDir

RUNS = FIXTURES / "runs"


def copy_run(home: Path, name: str, run_id: str | None = None) -> Path:
    """A recorded run (tests/fixtures/runs/NAME) copied into the test's runs dir."""
    dest = home / "runs" / (run_id or f"20261123-000000-{name}")
    shutil.copytree(RUNS / name, dest)
    return dest


def fake_live(run: Path, pid: int | None = None) -> None:
    """Make a recorded run look live: cut it mid-run and give it a live supervisor pid."""
    lines = (run / "events.jsonl").read_text().splitlines(keepends=True)
    steps = [i for i, line in enumerate(lines) if '"type":"step"' in line]
    (run / "events.jsonl").write_text("".join(lines[: steps[len(steps) // 2] + 1]))
    RunDir(run).write_supervisor_pid(pid or os.getpid())


async def wait_for(pilot, condition, timeout: float = 60.0, what: str = "condition",
                   why=None) -> None:
    """Until `condition()` holds; the timeout is for a hang only (what it waits for takes a
    second or two, four times that on a loaded machine). `why()`, if given, is said with a
    timeout: the state that the condition read, for a failure seen once in CI."""
    deadline = time.monotonic() + timeout
    while not _holds(condition):
        if time.monotonic() > deadline:
            said = f"\n{why()}" if why is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}{said}")
        await pilot.pause(0.05)


def _holds(condition) -> bool:
    try:
        return bool(condition())
    except NoMatches:  # the screen is not composed yet
        return False


def run(coro):
    return asyncio.run(coro)


async def open_runs(app, pilot, count: int):
    """The runs screen (o), once it lists `count` runs."""
    from cockpit.ui.runs import RunsScreen

    await pilot.press("o")
    screen = app.screen
    assert isinstance(screen, RunsScreen)
    await wait_for(pilot, lambda: len(screen.rows) == count, what=f"{count} runs to load")
    return screen

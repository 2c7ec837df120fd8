"""SVG snapshots at 80x24 of the screens that depend only on recorded runs, compared with
the README's screenshots. After an intended change: `python screenshots/make.py`, look at
the SVGs, and keep them."""

from __future__ import annotations

import asyncio
import difflib
import importlib.util
import time

import pytest

from conftest import ROOT

spec = importlib.util.spec_from_file_location("screenshots_make", ROOT / "screenshots" / "make.py")
make = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make)


# Not 'runs' (a live run's duration there is counted to now) nor 'launch' and 'editor-error'
# (they list every shipped preset and field, which other work adds to).
@pytest.mark.parametrize("name", ["crash-fallback", "crash-live", "finished", "live-run", "probe", "compare", "log",
                                  "live-run-160x48", "log-160x48"])
def test_screen_matches_its_screenshot(name, home, monkeypatch, tmp_path):
    monkeypatch.setenv("TZ", "UTC")
    make.prepare(home)
    try:
        svg = asyncio.run(make.render(name))
    finally:
        time.tzset()
    expected = (ROOT / "screenshots" / f"{name}.svg").read_text()
    if svg != expected:
        (tmp_path / f"{name}.svg").write_text(svg)
        shown = "\n".join(difflib.unified_diff(make.text_of(expected).splitlines(), make.text_of(svg).splitlines(),
                                              "screenshot", "this run", lineterm=""))
        pytest.fail(f"screen {name} differs from screenshots/{name}.svg (this run's is in "
                    f"{tmp_path}); if the change is intended, run python screenshots/make.py\n"
                    f"{shown or '(the same characters: only colours or styles differ)'}")

"""The engine and the front ends type-check: mypy over engine/ and cockpit/ as pyproject.toml's
[tool.mypy] says, one run for both, and with it every emit("type", **fields) against its event
type's TypedDict (engine/event_types.py).

mypy keeps its cache in .mypy_cache/: the first run after a fresh clone takes some 15 s (the
engine alone some 13), the next ones about a second.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def mypy(*args: str) -> subprocess.CompletedProcess:
    # MYPYPATH: a file outside engine/ finds it there (an editable install's import hook is
    # not something mypy follows)
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "MYPYPATH": str(ROOT)})


def test_mypy_finds_no_error_in_the_engine_or_the_front_ends():
    done = mypy()   # its files: engine and cockpit
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]


def test_the_emit_overloads_are_generated_from_the_event_types():
    done = subprocess.run([sys.executable, "tools/event_overloads.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_wrong_event_field_is_a_type_error(tmp_path):
    """The check is real: an overload that took any field would let all of these through."""
    scratch = tmp_path / "scratch.py"
    scratch.write_text(textwrap.dedent("""\
        from pathlib import Path

        from engine.emit import Emit
        from engine.record.events import EventWriter

        events = EventWriter(Path("events.jsonl"))
        events.emit("checkpoint", step=3, path="checkpoints/step-3.pt")     # right
        events.emit("checkpoint", step=3, paht="checkpoints/step-3.pt")     # misspelled
        events.emit("checkpoint", step=3)                                   # path missing
        events.emit("checkpoint", step="3", path="checkpoints/step-3.pt")   # a str for an int
        events.emit("chekpoint", step=3, path="checkpoints/step-3.pt")      # no such type
        emit: Emit = events.emit
        emit("warning", kind="slowdown", message="slow", advice=[])        # fallback missing
        """))
    done = mypy("--no-incremental", "--follow-imports=silent", str(scratch))
    wrong = {int(line.split(":")[1]) for line in done.stdout.splitlines() if ": error:" in line}
    assert sorted(wrong) == [8, 9, 10, 11, 13], done.stdout   # each wrong line, the right one not

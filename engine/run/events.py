"""events.jsonl: the run's append-only record, written by the supervisor and the trainer.

Each line is one JSON object with `v` (schema version), `t` (unix time), `type` and
`attempt`. Readers ignore keys they do not know, so new fields never break old readers.
Two processes append to the same file; each event is one write() to an O_APPEND
descriptor, so lines never interleave. A reader stops before a torn last line (a writer
that died mid-write) and picks it up once it is complete.

Types: run_started, attempt_started, step, eval, checkpoint, warning, crash, fallback,
attempt_ended, run_finished (and memory, once the monitor lands).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterator

SCHEMA_VERSION = 1


class EventWriter:
    def __init__(self, path: Path, attempt: int = 0):
        self.path = Path(path)
        self.attempt = attempt
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def emit(self, type: str, attempt: int | None = None, **fields) -> dict:
        event = {"v": SCHEMA_VERSION, "t": round(time.time(), 3), "type": type,
                 "attempt": self.attempt if attempt is None else attempt, **fields}
        os.write(self._fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())
        return event

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class EventFollower:
    """Reads the events appended since the last call; only complete lines are consumed."""

    def __init__(self, path: Path, offset: int = 0):
        self.path = Path(path)
        self.offset = offset

    def poll(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        return list(_parse(data[: end + 1]))


def _parse(data: bytes) -> Iterator[dict]:
    for line in data.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line mangled by a crash mid-write; the rest of the file is still good
        if isinstance(event, dict) and "type" in event:
            yield event


def read_events(path: Path) -> list[dict]:
    """Every complete event in the file (a torn last line is left out)."""
    return EventFollower(path).poll()

"""events.jsonl: the run's append-only record, written by the supervisor and the trainer.

Each line is one JSON object with `v` (schema version), `t` (unix time), `type` and
`attempt`. Readers ignore keys they do not know, so new fields never break old readers.
Two processes append to the same file; each event is one write() to an O_APPEND
descriptor, so lines never interleave. A reader stops before a torn last line (a writer
that died mid-write) and picks it up once it is complete.

Types: run_started (run_resumed when a run is continued), attempt_started, attempt_process,
trainer_ready, parity (the device's check against the CPU, engine.train.parity), step (with
`"partial": true` when a checkpoint or the end cut its window short), eval_started, eval,
mining_started, mining, checkpoint, memory (with the hardware: CPU, other processes, GPUs),
warning, fault_injected, stop_requested, crash, fallback, attempt_ended, run_finished; and
from the lifeline (engine.run.lifeline), supervisor_lost and run_interrupted.
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


def run_end(events: list[dict], end: dict | None = None) -> dict | None:
    """The event that ended the run (run_finished, or the lifeline's run_interrupted) as of
    these events, carrying `end` over from earlier batches: a run_resumed after it means the
    run goes on."""
    for e in events:
        if e["type"] in ("run_finished", "run_interrupted"):
            end = e
        elif e["type"] == "run_resumed":
            end = None
    return end


def end_torn_line(path: Path) -> None:
    """End a torn last line (its writer died mid-write) so the next event starts a line of
    its own instead of joining it and being lost with it."""
    try:
        with open(path, "rb+") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
    except FileNotFoundError:
        pass


def read_events(path: Path) -> list[dict]:
    """Every complete event in the file (a torn last line is left out)."""
    return EventFollower(path).poll()

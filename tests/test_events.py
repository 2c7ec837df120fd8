"""events.jsonl: appends from several writers, a reader that survives a torn last line."""

from __future__ import annotations

import json

from engine.record.events import SCHEMA_VERSION, EventFollower, EventWriter, read_events


def test_events_carry_version_time_type_and_attempt(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventWriter(path, attempt=2) as w:
        w.emit("step", step=1, loss=0.5)
        w.emit("attempt_ended", attempt=3, outcome="finished")
    events = read_events(path)
    assert [e["type"] for e in events] == ["step", "attempt_ended"]
    assert events[0]["v"] == SCHEMA_VERSION and events[0]["attempt"] == 2 and events[0]["t"] > 0
    assert events[1]["attempt"] == 3


def test_a_torn_last_line_is_skipped_then_read_once_complete(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventWriter(path) as w:
        w.emit("run_started", run="r")
    whole = json.dumps({"v": 1, "t": 1.0, "type": "step", "attempt": 1, "step": 7}) + "\n"
    with open(path, "a") as f:
        f.write(whole[:20])  # a writer died mid-line, or is mid-write
    assert [e["type"] for e in read_events(path)] == ["run_started"]

    follower = EventFollower(path)
    assert [e["type"] for e in follower.poll()] == ["run_started"]
    assert follower.poll() == []
    with open(path, "a") as f:
        f.write(whole[20:])
    assert [e["step"] for e in follower.poll()] == [7]


def test_garbage_in_the_middle_does_not_hide_later_events(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"type": "a"}\nnot json\n{"type": "b"}\n')
    assert [e["type"] for e in read_events(path)] == ["a", "b"]


def test_two_writers_interleave_whole_lines(tmp_path):
    path = tmp_path / "events.jsonl"
    a, b = EventWriter(path, attempt=0), EventWriter(path, attempt=1)
    for i in range(200):
        (a if i % 2 else b).emit("step", step=i, pad="x" * 500)
    a.close(), b.close()
    assert [e["step"] for e in read_events(path)] == list(range(200))


def test_missing_file_reads_as_no_events(tmp_path):
    assert read_events(tmp_path / "nope.jsonl") == []

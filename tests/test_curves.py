"""A run's curves (engine.record.curves) and its digest (engine.record.digest): what the runs screen
and the comparison read, from the recorded fixture runs and small hand-written event lists."""

from __future__ import annotations

import dataclasses
import shutil

from engine.record.curves import CurveFold, curves
from engine.record.digest import RunDigest, RunDigests
from engine.record.rundir import RunDir, summarize
from engine.record.stats import averages
from ui_support import RUNS


def _step(t, step, loss, samples=None, attempt=1):
    e = {"t": t, "type": "step", "attempt": attempt, "step": step, "loss": loss}
    if samples is not None:
        e["samples_seen"] = samples
    return e


def test_the_finished_runs_curves_by_step_samples_and_seconds():
    c = curves(RunDir(RUNS / "finished").events())
    assert len(c.loss) == 130 and c.loss.steps[0] == 2 and c.loss.steps[-1] == 256
    xs, _ = c.loss.points("samples")
    assert xs[0] == 128 and xs[-1] == 16384
    seconds, _ = c.loss.points("seconds")
    assert 0 < seconds[0] < seconds[-1]
    r2 = c.evals["r2"]
    assert r2.steps == [64, 128, 192, 256]
    # the trainer evaluates step 64 before it reports step 64: its samples are counted on
    assert r2.samples == [4096, 8192, 12288, 16384]


def test_a_resumed_attempt_replaces_the_steps_it_trains_again():
    events = [{"t": 0.0, "type": "run_started"},
              _step(1.0, 1, 0.9, 8), _step(2.0, 2, 0.8, 16), _step(3.0, 3, 0.7, 24),
              {"t": 3.1, "type": "eval", "step": 3, "metrics": {"acc": 0.5}},
              _step(9.0, 2, 0.75, 16, attempt=2), _step(10.0, 3, 0.65, 24, attempt=2)]
    c = curves(events)
    assert c.loss.steps == [1, 2, 3] and c.loss.values == [0.9, 0.75, 0.65]
    assert c.loss.seconds == [1.0, 9.0, 10.0]    # the time lost to the crash stays on the clock
    assert len(c.evals["acc"]) == 0               # evaluated on the lost step 3


def test_a_copy_does_not_move_with_the_fold():
    fold = CurveFold()
    fold.add(_step(1.0, 1, 0.9, 8))
    fold.add({"t": 1.5, "type": "eval", "step": 1, "metrics": {"acc": 0.5}})
    copy = fold.curves.copy()
    fold.add(_step(2.0, 2, 0.8, 16))
    fold.add(_step(3.0, 1, 0.7, 8, attempt=2))   # a rewind drops points in place
    assert copy.loss.steps == [1] and copy.loss.values == [0.9] and len(copy.evals["acc"]) == 1
    assert fold.curves.loss.values == [0.7]


def test_curves_skip_what_is_not_a_number_and_steps_without_samples():
    events = [_step(1.0, 1, None), _step(2.0, 2, 0.5),
              {"t": 2.5, "type": "eval", "step": 2, "metrics": {"ok": True, "note": "x", "acc": 1}}]
    c = curves(events)
    assert c.loss.steps == [2] and c.loss.points("samples") == ([], [])
    assert list(c.evals) == ["acc"]
    assert curves([]).loss.points("step") == ([], [])


def test_a_digest_matches_a_full_read_and_reads_only_what_was_appended(tmp_path):
    path = tmp_path / "run"
    shutil.copytree(RUNS / "finished", path)
    run = RunDir(path)
    lines = run.events_path.read_text().splitlines(keepends=True)
    run.events_path.write_text("".join(lines[:100]))

    digest = RunDigest(run, curves=True)
    assert digest.refresh()
    half = len(digest.curves.loss)
    assert 0 < half < 130
    assert not digest.refresh()                  # nothing new: nothing read, nothing changed

    with open(run.events_path, "a") as f:
        f.write("".join(lines[100:]))
    assert digest.refresh()
    full = dataclasses.replace(summarize(run), ended=None)
    assert dataclasses.replace(digest.summary, ended=None) == full
    assert digest.averages == averages(run.events())
    assert len(digest.curves.loss) == 130
    assert digest.state.events_seen == len(lines)   # each event read once, none again


def test_a_replaced_events_file_is_read_again(tmp_path):
    path = tmp_path / "run"
    shutil.copytree(RUNS / "finished", path)
    digest = RunDigest(RunDir(path))
    digest.refresh()
    shutil.copy(RUNS / "crash-fallback" / "events.jsonl", path / "events.jsonl")
    digest.refresh()
    assert len(digest.summary.attempts) == 2 and digest.summary.steps_lost == 0


def test_digests_follow_the_runs_dir(tmp_path):
    shutil.copytree(RUNS / "finished", tmp_path / "20261123-000001-a")
    digests = RunDigests(tmp_path)
    assert [d.run.id for d in digests.refresh()] == ["20261123-000001-a"]
    shutil.copytree(RUNS / "crash-fallback", tmp_path / "20261123-000002-b")
    first = digests.refresh()
    assert [d.run.id for d in first] == ["20261123-000002-b", "20261123-000001-a"]
    shutil.rmtree(tmp_path / "20261123-000002-b")
    assert [d.run.id for d in digests.refresh()] == ["20261123-000001-a"]
    assert digests.refresh()[0] is first[1]      # kept between refreshes, not read again


def test_a_digest_summarizes_each_fixture_run_as_a_full_read_does():
    for name in ("finished", "crash-fallback"):
        run = RunDir(RUNS / name)
        digest = RunDigest(run)
        digest.refresh()
        assert digest.summary == summarize(run), name

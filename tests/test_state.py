"""The run's one read model (engine.record.state): each figure has one definition, and every
reader -- the summary behind `cockpit runs`, the runs screen's digest, the TUI's model --
reads the same figures from it."""

from __future__ import annotations

import pytest

from engine.record.events import read_events
from engine.record.state import RunState, require
from ui_support import RUNS


def _run(*events: dict) -> list[dict]:
    return [{"type": "run_started", "t": 0.0, "attempt": 0, "run": "r", "workload": "w", "device_preset": "cpu"},
            {"type": "attempt_started", "t": 0.0, "attempt": 1, "preset": "cpu",
             "config": {"batch_size": 32, "accumulation": 1}},
            *events]


def _step(t: float, n: int, rate: float, **extra) -> dict:
    return {"type": "step", "t": t, "attempt": 1, "step": n, "total": 100, "samples_seen": 10 * n,
            "loss": 1.0 / n, "window_s": 1.0, "samples_per_s": rate, "steps_per_s": rate / 10, **extra}


def test_the_rate_now_is_the_last_full_window_and_the_average_the_run_s():
    s = RunState.of(_run(_step(1.0, 10, 100.0), _step(2.0, 20, 100.0),
                         _step(2.01, 21, 10_000.0, window_s=0.01, partial=True)))
    assert s.now.samples_per_s == 100.0 and s.now.steps_per_s == 10.0   # the fragment is noise
    assert s.step == 21 and s.samples_seen == 210 and s.windows == 3
    assert s.averages.samples_per_s == pytest.approx(210 / 2.01)
    assert s.current.last_step == 21 and s.current.windows == 3


def test_the_step_is_where_an_attempt_s_end_says_it_got():
    s = RunState.of(_run(_step(1.0, 10, 100.0),
                         {"type": "attempt_ended", "t": 3.0, "attempt": 1, "outcome": "native-crash",
                          "exit": "SIGABRT", "last_step": 14}))
    assert s.step == 14 and s.current.last_step == 14 and s.current.outcome == "native-crash"


def test_the_main_metric_is_the_newest_value_and_its_step():
    s = RunState.of(_run(_step(1.0, 10, 100.0, metrics={"reward": 0.5}),
                         {"type": "eval", "t": 2.0, "attempt": 1, "step": 12,
                          "metrics": {"eval_runtime": 3.0, "reward": 0.7, "eval_loss": 0.4}}))
    assert tuple(s.main) == ("reward", 0.7, 12)
    assert s.metrics == {"eval_loss": 0.4, "reward": 0.7}     # shown: the loss first, no timings
    assert tuple(s.main_of("eval_loss")) == ("eval_loss", 0.4, 12)


def test_an_activity_lasts_until_training_goes_on():
    s = RunState.of(_run({"type": "mining_started", "t": 1.0, "attempt": 1, "epoch": 0}))
    assert s.activity["type"] == "mining_started"
    s.add(_step(2.0, 1, 10.0))
    assert s.activity is None


def test_what_a_resume_needs_is_read_from_the_same_fold():
    s = RunState.of(_run({"type": "attempt_process", "t": 0.5, "attempt": 1, "pid": 42, "start": 1.0},
                         {"type": "fault_injected", "t": 1.0, "attempt": 1, "spec": "oom@5", "kind": "oom"},
                         {"type": "checkpoint", "t": 1.5, "attempt": 1, "step": 5, "path": "c/5.pt"},
                         {"type": "warning", "t": 2.0, "attempt": 1, "kind": "checkpoint-unreadable",
                          "path": "c/5.pt", "message": "", "advice": []}))
    assert s.fired == {("cpu", "oom@5")} and s.unreadable == {"c/5.pt"}
    assert s.process["pid"] == 42 and [c["path"] for c in s.checkpoints] == ["c/5.pt"]
    assert s.last_started["preset"] == "cpu" and s.current.batch == "32 x 1"


def test_stop_requests_count_for_the_attempt_they_were_asked_of():
    stop = {"type": "stop_requested", "t": 1.0, "attempt": 1, "signal": "SIGINT", "request": 1}
    s = RunState.of(_run(stop, {**stop, "request": 2}))
    assert s.current.stops == 2
    s.add({"type": "attempt_started", "t": 2.0, "attempt": 2, "preset": "cpu", "config": {}})
    s.add({**stop, "t": 3.0})   # a late word about attempt 1
    assert s.current.stops == 0 and s.attempt(1).stops == 2


def test_a_summary_cannot_do_without_what_it_requires():
    with pytest.raises(KeyError, match="'t'"):
        require({"type": "run_started", "run": "r"})
    with pytest.raises(KeyError, match="'step'"):
        RunState.of([{"type": "step", "t": 1.0}], strict=True)
    RunState.of([{"type": "step", "t": 1.0}])   # the TUI and the headless lines read on


def test_every_reader_reads_the_same_figures(tmp_path):
    from cockpit.ui.model import RunModel
    from engine.record.digest import RunDigest
    from engine.record.rundir import RunDir, summarize
    import shutil

    for name in ("finished", "crash-fallback"):
        shutil.copytree(RUNS / name, tmp_path / name)
        run = RunDir(tmp_path / name)
        events = read_events(run.events_path)
        summary = summarize(run)
        model = RunModel()
        model.fold(events)
        digest = RunDigest(run)
        digest.refresh()
        assert digest.summary == summary
        assert (model.step, model.total, model.loss, model.status) == \
            (summary.step, summary.total_steps, summary.loss, summary.status)
        assert model.samples_per_s == summary.window_samples_per_s
        assert model.avg_samples_per_s == summary.samples_per_s and model.steps_lost == summary.steps_lost
        assert [(a.attempt, a.preset, a.outcome) for a in model.attempts] == \
            [(a.attempt, a.preset, a.outcome) for a in summary.attempts]
        assert model.stats.goodput().as_dict() == summary.goodput

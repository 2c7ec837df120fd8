"""The checkpoint interval that loses least (engine.record.interval): Young/Daly for given save
costs and crash rates, its bounds, and a device's crash history read from earlier runs."""

from __future__ import annotations

import json
import math

import pytest

from conftest import FIXTURES, TINY
from engine import runconfig
from engine.record.events import read_events
from engine.record.rundir import RunDir
from engine.run.supervisor import Supervisor
from engine.record.interval import MAX_S, Advice, PRIOR_S, choose, command_advice, device_history, young_daly


def expected_loss(tau: float, cost: float, mtbf: float) -> float:
    """The share of time lost checkpointing every `tau`: saves, and half an interval a crash."""
    return cost / tau + (tau + cost) / (2 * mtbf)


@pytest.mark.parametrize("cost, mtbf", [(3.0, 3600.0), (0.05, 120.0), (20.0, 86400.0)])
def test_young_daly_loses_least_among_its_neighbours(cost, mtbf):
    tau = young_daly(cost, mtbf)
    assert tau == pytest.approx(math.sqrt(2 * cost * mtbf) - cost)
    for other in (tau / 2, tau * 0.8, tau * 1.25, tau * 2):
        assert expected_loss(tau, cost, mtbf) < expected_loss(other, cost, mtbf)


def test_the_issues_example_one_crash_an_hour_and_a_three_second_save():
    chosen = choose(cost_s=3.0, step_s=0.42, crashes=1, observed_s=3600.0)
    assert chosen.mtbf_s == 3600.0
    assert 300 < chosen.steps < 400                  # about every 350 steps
    assert "every 343 steps" in chosen.reason and "3.00 s save" in chosen.reason
    assert "a 4 ms save" in choose(0.004, 0.01, 1, 60.0).reason


def test_more_crashes_or_cheaper_saves_checkpoint_more_often():
    base = choose(1.0, 0.1, crashes=2, observed_s=7200.0)
    assert choose(1.0, 0.1, crashes=8, observed_s=7200.0).steps < base.steps
    assert choose(0.1, 0.1, crashes=2, observed_s=7200.0).steps < base.steps


def test_bounds_and_a_run_with_no_crash_seen():
    quiet = choose(0.05, 0.1, crashes=0, observed_s=0.0)
    assert quiet.mtbf_s == PRIOR_S and "one a day assumed" in quiet.reason
    assert choose(60.0, 1.0, crashes=0, observed_s=10 * PRIOR_S).seconds == MAX_S
    assert choose(0.001, 0.01, crashes=100, observed_s=1.0).seconds >= 1.0   # never under a second
    assert choose(0.5, 10.0, crashes=100, observed_s=60.0).steps == 1       # at least a step
    assert choose(0.001, 0.01, crashes=100, observed_s=1.0, floor_s=5.0).seconds >= 5.0   # a write's time


def _finished(root, run_id: str, attempts: list[tuple[str, str]], productive: float, lost: float = 0.0):
    run = root / run_id
    run.mkdir(parents=True)
    summary = {"attempts": [{"attempt": i + 1, "device": d, "outcome": o} for i, (d, o) in enumerate(attempts)],
               "goodput": {"productive_s": productive, "buckets": {"lost": lost}}}
    lines = [{"type": "run_started", "t": 0.0}, {"type": "run_finished", "t": 1.0, "summary": summary}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_a_devices_history_counts_its_crashes_and_training_time(tmp_path):
    _finished(tmp_path, "20261120-000000-a", [("cuda:0", "native-crash"), ("cuda:0", "finished")], 900.0, 100.0)
    _finished(tmp_path, "20261121-000000-b", [("cuda:0", "oom"), ("cpu", "finished")], 600.0)
    _finished(tmp_path, "20261122-000000-c", [("cpu", "finished")], 300.0)
    _finished(tmp_path, "20261123-000000-d", [("cuda:0", "config")], 0.0)   # refused: no crash
    (tmp_path / "20261124-000000-e").mkdir()                                  # never ran
    crashes, observed = device_history("cuda", tmp_path)
    assert crashes == 2
    assert observed == pytest.approx(1000.0 + 300.0)   # b: half its attempts on cuda
    assert device_history("cuda:1", tmp_path, exclude="20261120-000000-a") == (1, pytest.approx(300.0))
    assert device_history("mps", tmp_path) == (0, 0.0)


def test_a_commands_interval_far_from_the_one_that_loses_least_gets_advice(tmp_path):
    """Windows of 10 steps a second; a checkpoint every 2,000 steps whose window took 3 s more;
    one crash in the run's 500-odd seconds of training: about every 500 steps loses least."""
    events, t, step = [{"type": "attempt_started", "t": 0.0, "attempt": 1, "device": "cpu"}], 0.0, 0
    while step < 5000:
        slow = step in (1990, 3990)
        t += 4.0 if slow else 1.0
        events.append({"type": "step", "t": t, "attempt": 1, "step": step + 10, "from_step": step,
                       "window_s": 4.0 if slow else 1.0})
        if slow:
            events.append({"type": "checkpoint", "t": t - 0.5, "attempt": 1, "step": step + 10,
                           "step_source": "name"})
        step += 10
    events.append({"type": "attempt_ended", "t": t, "attempt": 1, "outcome": "native-crash"})
    advice = command_advice(events, tmp_path)
    assert advice is not None and advice.far
    assert advice.theirs == 2000
    assert advice.best.cost_s == pytest.approx(3.0) and advice.best.mtbf_s == pytest.approx(t)
    assert 400 < advice.best.steps < 600
    assert advice.text.startswith("checkpoints every 2,000 steps; at a crash every ")
    assert not Advice(advice.best.steps * 3 // 2, advice.best).far   # near it: nothing to say


def hf_callback_run() -> list[dict]:
    """A real run of examples/hf/train_lm.py (transformers 5.23.0, CockpitCallback, a
    checkpoint every 10 steps, a crash at 35) under `cockpit run -d cpu`, recorded before its
    checkpoint events said their save's time: steps of 0.4-2.9 s, saves of a tenth of that."""
    return list(read_events(FIXTURES / "outputs" / "hf_callback_saves.jsonl"))


def test_a_save_the_windows_cannot_tell_from_the_steps_is_not_advised_on(tmp_path):
    """Its saves hide in the steps' own variation: the windows around them took less than their
    steps as often as more. Not 'a 0 ms save, about every 1 step loses least'."""
    events = hf_callback_run()
    assert sum(e["type"] == "checkpoint" for e in events) == 6
    assert command_advice(events, tmp_path) is None


def test_a_commands_saves_are_weighed_at_the_time_they_say(tmp_path):
    """The callback's save_s (how long each save held training up), not the windows'."""
    events = [{**e, "save_s": 0.12} if e["type"] == "checkpoint" else e for e in hf_callback_run()]
    advice = command_advice(events, tmp_path)
    assert advice is not None and advice.theirs == 10
    assert advice.best.cost_s == pytest.approx(0.12)
    assert advice.best.steps > 1 and "a 0.12 s save" in advice.text
    one = Advice(10, choose(0.12, 5.0, 1, 60.0))    # steps of 5 s: the shortest interval is one
    assert one.best.steps == 1 and one.text.endswith("about every 1 step loses least")


def test_auto_chooses_its_interval_from_a_measured_save_and_the_devices_crashes(home):
    """checkpoint_every_steps = 'auto' in a real run: a first save (after checkpoint_every_minutes,
    here a fraction of a second) measures the stall, then the interval is chosen, with the
    crashes an earlier run had on the CPU counted, and said in a checkpoint_interval event."""
    _finished(home / "runs", "20261101-000000-earlier", [("cpu", "native-crash"), ("cpu", "oom"),
                                                         ("cpu", "finished")], 3000.0)
    config = runconfig.resolve("matmul", "cpu", TINY + [
        "train.epochs=40", "train.checkpoint_every_steps=auto", "train.checkpoint_every_minutes=0.002"])
    run = RunDir.create(config)
    assert Supervisor(run, poll_s=0.05).supervise() == "finished"
    events = run.events()
    (chosen, *_) = [e for e in events if e["type"] == "checkpoint_interval"]
    saves = [e for e in events if e["type"] == "checkpoint"]
    assert saves and events.index(saves[0]) < events.index(chosen)   # a save measured first
    assert chosen["crashes"] == 2 and chosen["observed_s"] >= 3000.0
    assert chosen["cost_s"] == pytest.approx(saves[0]["save_s"], abs=1e-3)
    assert chosen["steps"] >= 1 and f"every {chosen['steps']:,} steps" in chosen["reason"]
    assert "2 crashes seen" in chosen["reason"]

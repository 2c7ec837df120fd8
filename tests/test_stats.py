"""A run's figures over its whole life (engine.record.stats) and where they are shown: the
summary behind `cockpit runs list` / `runs show` (and their --json)."""

from __future__ import annotations

import argparse
import json

from cockpit.commands import runs as runs_command
from engine.record.events import read_events
from engine.record.rundir import RunDir, summarize
from engine.record.stats import averages, fold
from ui_support import RUNS, copy_run


def started(t=0.0):
    return [{"type": "run_started", "t": t, "attempt": 0, "run": "r", "workload": "matmul",
             "device_preset": "cpu"}]


def attempt(n, t, resumed=None):
    return [{"type": "attempt_started", "t": t, "attempt": n, "preset": "cpu", "config": {}},
            {"type": "trainer_ready", "t": t, "attempt": n, "total_steps": 100, "resumed_from": resumed}]


def step(t, n, samples, window_s, rate, attempt=1, **extra):
    return {"type": "step", "t": t, "attempt": attempt, "step": n, "total": 100,
            "samples_seen": samples, "loss": 1.0 / n, "window_s": window_s,
            "samples_per_s": rate, "steps_per_s": rate / 64, **extra}


def ended(t, n, outcome, last_step):
    return {"type": "attempt_ended", "t": t, "attempt": n, "outcome": outcome, "last_step": last_step}


# The run: 317 samples/s for 20 windows of 1 s (with an eval pause between), then the
# 0.1 s fragment before the last checkpoint reads 6,990 samples/s.
FRAGMENT_RUN = started() + attempt(1, 0.0) + [
    step(1.0 + i + (5 if i >= 10 else 0), i + 1, 317 * (i + 1), 1.0, 317.0, gflop_s=2.0)
    for i in range(20)] + [
    {"type": "eval", "t": 15.5, "attempt": 1, "step": 10, "metrics": {"r2": 0.5}},
    step(26.1, 21, 317 * 20 + 699, 0.1, 6990.0, gflop_s=44.1),
    {"type": "eval", "t": 26.2, "attempt": 1, "step": 21, "metrics": {"r2": 0.9}},
    ended(27.0, 1, "finished", 21),
    {"type": "run_finished", "t": 27.0, "attempt": 0, "status": "finished"}]


def test_the_run_figure_is_the_average_over_training_time_not_the_last_fragment():
    a = averages(FRAGMENT_RUN)
    assert a.train_s == 20.1                               # the eval pause is not training
    assert abs(a.samples_per_s - (317 * 20 + 699) / 20.1) < 1e-9   # 350/s, not 6,990/s
    assert a.steps_per_s == 21 / 20.1             # steps trained, counted exactly
    assert abs(a.gflop_s - (2.0 * 20 + 4.41) / 20.1) < 1e-9
    assert a.duration_s == 27.0 and a.steps_lost == 0
    assert a.final_loss == 1 / 21 and a.final_metrics == {"r2": 0.9}


def test_recorded_runs_average_what_their_windows_say():
    for name in ("finished", "crash-fallback"):
        events = read_events(RUNS / name / "events.jsonl")
        steps = [e for e in events if e["type"] == "step"]
        a = averages(events)
        assert abs(a.train_s - sum(e["window_s"] for e in steps)) < 1e-9
        # samples trained over all attempts (attempt 2 resumed at sample 1,280)
        trained = steps[-1]["samples_seen"] if name == "finished" else 1280 + (2048 - 1280)
        assert abs(a.samples_per_s * a.train_s - trained) < 1e-6
        assert min(e["samples_per_s"] for e in steps) < a.samples_per_s < max(e["samples_per_s"] for e in steps)


def test_steps_lost_are_those_trained_again_or_past_the_last_checkpoint():
    crashed = started() + attempt(1, 0.0) + [
        step(1.0, 10, 640, 1.0, 640.0), {"type": "checkpoint", "t": 1.0, "attempt": 1, "step": 10},
        step(2.0, 17, 1088, 1.0, 448.0), ended(3.0, 1, "native-crash", 17)]
    assert averages(crashed).steps_lost == 7               # past its checkpoint at step 10
    resumed = crashed + attempt(2, 4.0, resumed={"step": 10, "samples_seen": 640}) + [
        step(5.0, 20, 1280, 1.0, 640.0, attempt=2)]
    a = averages(resumed)
    assert a.steps_lost == 7                               # steps 11-17, trained again
    assert a.samples_per_s * a.train_s == 1088 + (1280 - 640)   # re-trained samples count as trained
    from_scratch = crashed[:3] + [step(2.0, 17, 1088, 1.0, 448.0), ended(3.0, 1, "oom", 17)] + \
        attempt(2, 4.0) + [step(5.0, 3, 192, 1.0, 192.0, attempt=2)]
    assert averages(from_scratch).steps_lost == 17         # no checkpoint: all of it again
    stopped = crashed[:-1] + [ended(3.0, 1, "stopped", 17)]
    assert averages(stopped).steps_lost == 0               # a stop checkpoints on its way out


def test_a_commands_resume_of_unknown_step_is_placed_by_its_first_step():
    # A command resumed from its own checkpoint file says no step; its first sighting does. That
    # sighting is no event: it opens the first window, which ends 1 s later at step 70, 9 steps on.
    events = started() + [
        {"type": "attempt_started", "t": 0.0, "attempt": 1, "preset": "cpu", "config": {}},
        step(1.0, 50, 3200, 1.0, 3200.0), step(2.0, 80, 5120, 1.0, 1920.0),
        ended(3.0, 1, "native-crash", 80),
        {"type": "attempt_started", "t": 4.0, "attempt": 2, "preset": "cpu", "config": {},
         "resume": {"path": "out/last.pt", "step": None}}]
    # Until it says, the crash loses what it trained past its newest checkpoint (none here).
    assert averages(events).steps_lost == 80
    first = step(5.0, 70, 70 * 64, 1.0, 9 * 64.0, attempt=2)   # 9 steps/s over 1 s
    assert averages(events + [first]).steps_lost == 80 - 61
    # An attempt too short for a window says where it got to with no rate: that is its start.
    sighting = {**first, "samples_per_s": None, "steps_per_s": None, "window_s": None}
    assert averages(events + [sighting]).steps_lost == 80 - 70


def test_a_command_given_no_checkpoint_starts_where_its_first_window_says():
    """An adopted run that ended at step 150, resumed with the user's own --resume-args (cockpit
    knows no checkpoint): it went on from step 100, so 50 steps were trained again, not 150."""
    command = {"command": ["python", "train.py"]}
    events = started() + [
        {"type": "attempt_started", "t": 0.0, "attempt": 1, "preset": "adopted", "config": {}, **command},
        step(1.0, 140, None, 1.0, 640.0), step(2.0, 150, None, 1.0, 640.0),
        ended(3.0, 1, "ended", 150),
        {"type": "attempt_started", "t": 4.0, "attempt": 2, "preset": "adopted", "config": {},
         "resume": None, **command},
        step(5.0, 110, None, 1.0, 640.0, attempt=2, from_step=100)]
    assert averages(events).steps_lost == 50
    # its first lines read in one burst: the window's rate counts from the last, it began at 100
    events[-1] = step(5.0, 110, None, 1.0, 640.0, attempt=2, from_step=104, begun_step=100)
    assert averages(events).steps_lost == 50


def test_a_checkpoint_of_unknown_step_keeps_the_steps_reached_when_it_was_seen():
    events = started() + [
        {"type": "attempt_started", "t": 0.0, "attempt": 1, "preset": "cpu", "config": {}},
        step(1.0, 50, 3200, 1.0, 3200.0),
        {"type": "checkpoint", "t": 1.5, "attempt": 1, "path": "out/last.pt", "step": None},
        step(2.0, 80, 5120, 1.0, 1920.0), ended(3.0, 1, "native-crash", 80)]
    assert averages(events).steps_lost == 80 - 50   # at least: the file may hold an earlier step


def test_run_finished_summary_is_the_folds():
    resumed = started() + attempt(1, 0.0) + [
        step(1.0, 10, 640, 1.0, 640.0), {"type": "checkpoint", "t": 1.0, "attempt": 1, "step": 10},
        step(2.0, 17, 1088, 1.0, 448.0),
        {"type": "crash", "t": 3.0, "attempt": 1, "kind": "oom", "sentence": "It ran out of memory."},
        ended(3.0, 1, "oom", 17)] + attempt(2, 4.0, resumed={"step": 10, "samples_seen": 640}) + [
        step(5.0, 20, 1280, 1.0, 640.0, attempt=2), ended(6.0, 2, "finished", 20)]
    s = fold(resumed)
    assert s.checkpoints == 1
    summary = s.summary()
    assert summary.pop("goodput") == s.goodput().as_dict()   # (tests/test_goodput.py: its figures)
    assert summary.pop("steps_rewound") == 0   # no health finding went back
    assert summary == {
        "attempts": [{"attempt": 1, "preset": "cpu", "device": None, "outcome": "oom", "last_step": 17,
                      "sentence": "It ran out of memory."},
                     {"attempt": 2, "preset": "cpu", "device": None, "outcome": "finished",
                      "last_step": 20, "sentence": None}],
        "steps_lost": 7, "finished_on": "cpu", "final_step": 20}


def write_run(home, events: list[dict]) -> RunDir:
    path = copy_run(home, "finished", "20261124-000000-fragment")
    (path / "events.jsonl").write_text("".join(json.dumps({"v": 1, **e}) + "\n" for e in events))
    return RunDir(path)


def test_summary_and_runs_commands_show_the_average(home, capsys):
    run = write_run(home, FRAGMENT_RUN)
    s = summarize(run)
    assert round(s.samples_per_s) == 350 and s.window_samples_per_s == 6990.0
    assert s.train_s == 20.1 and s.duration_s == 27.0 and s.steps_lost == 0

    assert runs_command.list_(argparse.Namespace(json=False)) == 0
    listed = capsys.readouterr().out
    assert "350/s" in listed and "6,990" not in listed and "27s" in listed

    assert runs_command.show(argparse.Namespace(run=run.id, json=False)) == 0
    shown = capsys.readouterr().out
    assert "350 samples/s on average (1.04 steps/s)" in shown
    assert "27s, 20s of it training" in shown and "2.21 GFLOP/s on average" in shown
    assert "6,990" not in shown   # a finished run's last window is only its last fragment

    runs_command.show(argparse.Namespace(run=run.id, json=True))
    fields = json.loads(capsys.readouterr().out)
    assert round(fields["samples_per_s"]) == 350 and fields["window_samples_per_s"] == 6990.0
    assert {"steps_per_s", "train_s", "gflop_s", "steps_lost"} <= set(fields)
    runs_command.list_(argparse.Namespace(json=True))
    assert round(json.loads(capsys.readouterr().out)[0]["samples_per_s"]) == 350


def test_steps_lost_reach_runs_list_and_show(home, capsys):
    copy_run(home, "crash-fallback", "20261124-000000-crashed")
    run = RunDir(home / "runs" / "20261124-000000-crashed")
    events = read_events(run.events_path)
    # attempt 2 resumed at step 5 instead of 10: steps 6-10 were trained again
    for e in events:
        if e["type"] == "trainer_ready" and e.get("resumed_from"):
            e["resumed_from"] = {**e["resumed_from"], "step": 5, "samples_seen": 640}
    run.events_path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert summarize(run).steps_lost == 5
    runs_command.list_(argparse.Namespace(json=False))
    assert capsys.readouterr().out.splitlines()[1].split()[-1] == "5"
    runs_command.show(argparse.Namespace(run=run.id, json=False))
    assert "lost      5 steps to crashes" in capsys.readouterr().out


def test_a_lost_run_lasts_until_its_last_event_not_until_now(home):
    run = write_run(home, FRAGMENT_RUN[:-2])   # no end: its supervisor died without a word
    s = summarize(run)
    assert s.status == "lost" and s.duration_s == 26.2

"""Goodput: where a run's wall time went, from its events (engine.record.goodput), on timelines
whose every second is known, on recorded runs, and on a real run that crashes and resumes; and
where it is shown (runs show and its JSON, the headless last lines, run_finished, compare)."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from conftest import FIXTURES, TINY, child_env, cockpit_cmd, user_preset
from engine import runconfig
from engine.record import stats
from engine.record.events import read_events
from engine.record.goodput import BUCKETS, COMMAND_UNKNOWN
from engine.record.rundir import RunDir, summarize
from engine.run.supervisor import Supervisor


def ev(t: float, type: str, attempt: int = 0, **fields) -> dict:
    return {"v": 1, "t": t, "type": type, "attempt": attempt, **fields}


def step(t: float, attempt: int, step: int, window: float, **fields) -> dict:
    return ev(t, "step", attempt, **{"step": step, "window_s": window, "steps_per_s": 1.0,
                                     "samples_per_s": 8.0, **fields})


def closes(g) -> float:
    """How far the training kept and the buckets are from the wall time, as a share of it."""
    return abs(g.productive_s + sum(v for v in g.buckets.values() if v) - g.wall_s) / g.wall_s


def test_every_second_of_a_crash_and_its_recovery_is_where_it_belongs():
    # attempt 1: launched at 1, ready at 3, trains from 4 (its first window), two steps a
    # second; a 0.5 s checkpoint at step 4, an eval of 0.5 s; reports up to step 8 at 9.0, then
    # trains to step 10 (published) and dies; seen dead at 10.4. The decision and the next
    # launch take to 11; attempt 2 loads the checkpoint of step 4 (0.25 s), is ready at 12.5,
    # trains from 13 and finishes at step 12 at 17, exits at 17.5; the run ends at 17.6.
    events = [
        ev(0.0, "run_started"),
        ev(1.0, "attempt_started", 1),
        ev(3.0, "trainer_ready", 1, resumed_from=None),
        step(5.0, 1, 2, 1.0, compile_s=0.2),                     # window 4 -> 5
        step(6.0, 1, 4, 1.0),
        ev(6.5, "checkpoint", 1, step=4, save_s=0.5),
        step(7.5, 1, 6, 1.0),                                    # window 6.5 -> 7.5
        ev(8.0, "eval", 1, step=6, eval_s=0.5),
        step(9.0, 1, 8, 1.0),                                    # window 8 -> 9
        ev(10.4, "crash", 1, kind="native-crash", sentence="died"),
        ev(10.4, "attempt_ended", 1, outcome="native-crash", last_step=10),
        ev(10.5, "fallback", 1, next_attempt=2),
        ev(11.0, "attempt_started", 2),
        ev(12.5, "trainer_ready", 2, resumed_from={"step": 4, "samples_seen": 32, "load_s": 0.25}),
        step(15.0, 2, 8, 2.0),                                   # window 13 -> 15
        step(17.0, 2, 12, 2.0),
        ev(17.5, "attempt_ended", 2, outcome="finished", last_step=12),
        ev(17.6, "run_finished", status="finished"),
    ]
    g = stats.fold(events).goodput()
    b = g.buckets
    assert g.wall_s == pytest.approx(17.6)
    assert b["startup"] == pytest.approx(1.0 + 3.0 + (2.0 - 0.25))   # to each first window, less the load
    assert b["checkpoint_load"] == pytest.approx(0.25)
    assert b["compile"] == pytest.approx(0.2)
    assert b["checkpoint_save"] == pytest.approx(0.5) and b["eval"] == pytest.approx(0.5)
    # attempt 1 trained 4 windows (4 s, 8 steps: 0.5 s a step) and 2 steps after its last
    # report (1 s of the 1.4 s before it was seen dead); steps 5 to 10 were trained again
    assert b["lost"] == pytest.approx(6 * 0.5)
    assert b["recovery"] == pytest.approx(0.4 + 0.6)   # seen dead after its last step, to the launch
    assert b["other"] == pytest.approx(0.5 + 0.1)       # attempt 2's exit, the run's last word
    assert b["stalls"] == 0 and b["epoch_prep"] == 0 and b["unknown"] == 0
    assert g.productive_s == pytest.approx((4.0 - 0.2 + 1.0 - 3.0) + 4.0)
    assert closes(g) < 1e-9
    assert set(g.buckets) == set(BUCKETS)


def test_steps_trained_again_cost_the_time_those_steps_took():
    # A command that slowed down: steps 0-20 at 0.1 s (two 1 s windows), steps 20-30 at 1 s
    # (two 5 s windows); it checkpointed at 20 and died at 30. The 10 steps it trains again
    # took 10 s, not 10 x its average 12 s / 30 steps = 4 s.
    command = ["python", "train.py"]
    events = [
        ev(0.0, "run_started"),
        ev(0.0, "attempt_started", 1, command=command),
        ev(1.0, "step", 1, step=0),                               # first sighting: no window
        step(2.0, 1, 10, 1.0, from_step=0),
        step(3.0, 1, 20, 1.0, from_step=10),
        ev(3.0, "checkpoint", 1, step=20, path="/out/ckpt-20", step_source="name"),
        step(8.0, 1, 25, 5.0, from_step=20),
        step(13.0, 1, 30, 5.0, from_step=25),
        ev(13.0, "attempt_ended", 1, outcome="native-crash", last_step=30),
        ev(14.0, "attempt_started", 2, command=command,
           resume={"step": 20, "step_source": "name", "path": "/out/ckpt-20"}),
        step(16.0, 2, 30, 1.0, from_step=20),
        ev(16.0, "attempt_ended", 2, outcome="finished", last_step=30),
        ev(16.0, "run_finished", status="finished"),
    ]
    folded = stats.fold(events)
    assert folded.steps_lost == 10
    assert folded.goodput().buckets["lost"] == pytest.approx(10.0)


def test_a_stopped_stretch_is_shown_but_not_counted():
    events = [
        ev(0.0, "run_started"), ev(0.5, "attempt_started", 1), ev(1.0, "trainer_ready", 1),
        step(3.0, 1, 4, 2.0),
        ev(3.5, "checkpoint", 1, step=4, save_s=0.2),
        ev(3.6, "attempt_ended", 1, outcome="stopped", last_step=4),
        ev(3.7, "run_finished", status="stopped"),
        ev(103.7, "run_resumed"),                            # 100 s later
        ev(104.0, "attempt_started", 2),
        ev(105.0, "trainer_ready", 2, resumed_from={"step": 4, "samples_seen": 32, "load_s": 0.1}),
        step(107.0, 2, 8, 2.0),
        ev(107.2, "attempt_ended", 2, outcome="finished", last_step=8),
        ev(107.3, "run_finished", status="finished"),
    ]
    g = stats.fold(events).goodput()
    assert g.gaps_s == pytest.approx(100.0)
    assert g.wall_s == pytest.approx(7.3)
    assert g.productive_s == pytest.approx(4.0) and g.buckets["lost"] == 0
    assert closes(g) < 1e-9


def test_a_hang_is_a_stall_and_a_slowdown_costs_what_it_slowed():
    events = [
        ev(0.0, "run_started"), ev(0.0, "attempt_started", 1), ev(1.0, "trainer_ready", 1),
        step(2.0, 1, 2, 1.0, samples_per_s=100.0),
        ev(2.1, "warning", 1, kind="slowdown", samples_per_s=50.0, best_samples_per_s=100.0),
        step(4.0, 1, 4, 2.0, samples_per_s=50.0),            # half the rate: 1 s of it lost
        ev(14.0, "crash", 1, kind="hang", sentence="no progress"),
        ev(14.0, "attempt_ended", 1, outcome="hang", last_step=4),
        ev(14.5, "run_finished", status="failed"),
    ]
    g = stats.fold(events).goodput()
    assert g.buckets["stalls"] == pytest.approx(1.0 + 10.0)   # the slow window's loss, the silence
    assert closes(g) < 1e-9


def test_a_commands_buckets_it_cannot_know_are_said_to_be_unknown():
    events = [
        ev(0.0, "run_started"),
        ev(0.2, "attempt_started", 1, command=["python", "train.py"]),
        ev(2.0, "step", 1, step=10),                           # first sighting: no window
        step(3.0, 1, 20, 1.0, from_step=10),
        step(6.0, 1, 30, 1.0, from_step=20),                   # its window 5 -> 6: 2 s unexplained
        ev(6.5, "attempt_ended", 1, outcome="finished", last_step=30),
        ev(6.6, "run_finished", status="finished"),
    ]
    g = stats.fold(events).goodput()
    assert all(g.buckets[k] is None for k in COMMAND_UNKNOWN)
    assert g.buckets["unknown"] == pytest.approx(2.0)
    assert g.buckets["startup"] == pytest.approx(0.2 + 1.8)
    assert closes(g) < 1e-9
    shown = g.as_dict()
    assert shown["buckets"]["eval"] is None and json.loads(json.dumps(shown)) == shown


@pytest.mark.parametrize("name", ["finished", "crash-fallback"])
def test_recorded_runs_add_up_to_their_wall_time(name):
    g = stats.fold(read_events(FIXTURES / "runs" / name / "events.jsonl")).goodput()
    assert 0 < g.productive_s < g.wall_s
    assert closes(g) < 0.02
    assert g.buckets["startup"] > 0


def test_a_real_crash_and_resume_counts_its_lost_steps_everywhere(home):
    user_preset(home, "devices", "alone", 'device = "cpu"\nbatch_size = 8\naccumulation = 1\nthreads = 1\n')
    config = runconfig.resolve("matmul", "alone", TINY + [
        "batch_size=8", "accumulation=1", "train.report_every_s=0.05", "train.checkpoint_every_steps=4",
        "train.checkpoint_every_minutes=0", "inject=['native-crash@11']"])
    run = RunDir.create(config)
    assert Supervisor(run, poll_s=0.05).supervise() == "finished"
    events = run.events()
    g = stats.fold(events).goodput()
    assert stats.fold(events).steps_lost == 2        # steps 9 and 10, trained again from step 8
    assert g.buckets["lost"] > 0 and g.buckets["recovery"] > 0 and g.buckets["startup"] > 0
    assert g.buckets["checkpoint_save"] > 0 and g.buckets["checkpoint_load"] > 0
    assert closes(g) < 0.02
    (finished,) = [e for e in events if e["type"] == "run_finished"]
    assert finished["summary"]["goodput"]["buckets"]["lost"] > 0
    shown = subprocess.run(cockpit_cmd("runs", "show", run.id, "--json"), capture_output=True,
                           text=True, env=child_env(), timeout=60)
    figures = json.loads(shown.stdout)["goodput"]
    assert figures["buckets"]["lost"] == pytest.approx(g.buckets["lost"], abs=1e-3)
    assert 0 <= figures["goodput"] < 1   # (a tiny run's steps take microseconds: start-up is most of it)
    text = subprocess.run(cockpit_cmd("runs", "show", run.id), capture_output=True, text=True,
                          env=child_env(), timeout=60).stdout
    assert f"goodput   {figures['goodput']:.0%} of " in text and "the rest: start-up" in text
    assert summarize(run).goodput == figures


def test_the_headless_last_lines_say_the_goodput(home):
    done = subprocess.run(cockpit_cmd("--no-ui", "-w", "matmul", "-d", "cpu", *sum(
        (["--set", s] for s in TINY), [])), capture_output=True, text=True, env=child_env(), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("goodput ")]
    # what the rest was, largest first (the first attempt's start-up is mostly done ahead, by
    # the process the CLI started as it checked the device: engine.run.spare.early)
    assert "training kept; the rest: " in line
    rest = re.sub(r" \([^)]*\)", "", line.split("the rest: ", 1)[1])   # the parts of a bucket aside
    seconds = [float(s) for s in re.findall(r"(\d+\.\d+) s\b", rest)]
    assert "start-up" in rest and seconds and seconds == sorted(seconds, reverse=True), line

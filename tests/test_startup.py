"""An attempt's start-up, timed by phase and cut (issue 40, item 1): trainer_ready says its
phases, goodput's start-up bucket its parts, and the first attempt runs in the process the CLI
started as it checked the device, its data built there ahead, training exactly as a process
started after the checks does."""

from __future__ import annotations

import os
import subprocess

import psutil
import pytest
import torch

from conftest import child_env, cockpit_cmd
from engine.record.goodput import Timeline
from engine.record.rundir import list_runs, summarize
from cockpit.comparison import goodput_cell
from cockpit.present.words import goodput_text

PHASES = {"launch", "device", "data", "model", "resume", "setup"}


def run(home, workload: str, *sets: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, list[dict]]:
    before = {r.id for r in list_runs(home / "runs")}
    done = subprocess.run(cockpit_cmd("--no-ui", "-w", workload, "-d", "cpu", *sum((["--set", s] for s in sets), [])),
                          capture_output=True, text=True, env={**child_env(), **(env or {})}, timeout=300)
    runs = [r for r in list_runs(home / "runs") if r.id not in before]
    return done, runs[0].events() if runs else []


# A protocol workload whose build draws from torch's global generator (its data), as a user's
# may: the model's initialisation draws after it.
GLOBAL_DRAWS = """
import torch
from sine_workload import Params, SineWorkload   # its Params: the [params] table checked

def build(params: Params, seed: int) -> SineWorkload:
    torch.rand(7)   # the global generator, as the trainer seeded it
    return SineWorkload(params, seed)
"""


def test_the_first_attempt_runs_in_the_process_started_during_the_checks_and_trains_the_same(home):
    from conftest import ROOT, user_preset

    (home / "wl").mkdir()
    (home / "wl" / "global_draws.py").write_text(GLOBAL_DRAWS)
    sine = (ROOT / "examples" / "presets" / "workloads" / "sine.toml").read_text()
    user_preset(home, "workloads", "draws", sine.replace("sine_workload:build", "global_draws:build"))
    env = {"PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "examples"), str(home / "wl")))}
    sets = ("params.samples=256", "params.eval_samples=64", "train.epochs=2", "batch_size=32",
            "accumulation=1", "threads=1", "train.report_every_s=0.01")
    done, events = run(home, "draws", *sets, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    (ready,) = [e for e in events if e["type"] == "trainer_ready"]
    startup = ready["startup"]
    assert PHASES <= set(startup) and all(startup[p] >= 0 for p in PHASES)
    assert startup["ahead"] == ["data"]   # the workload built before the run existed
    assert {"imports", "data"} <= set(startup["ahead_s"])   # what that took the spare
    # the same run with no process started ahead trains the same model: its weights drawn from
    # the random state the spare's build left, as here
    plain, plain_events = run(home, "draws", *sets, env={**env, "COCKPIT_SPARE": "0"})
    assert plain.returncode == 0, plain.stdout + plain.stderr
    (plain_ready,) = [e for e in plain_events if e["type"] == "trainer_ready"]
    assert "ahead" not in plain_ready["startup"] and PHASES <= set(plain_ready["startup"])
    # what the two models learned, exactly (a window's loss depends on where the window fell)
    evals = [[e["metrics"] for e in evs if e["type"] == "eval"] for evs in (events, plain_events)]
    assert evals[0] and evals[0] == evals[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the bad input is a CUDA preset on a machine without one")
def test_bad_input_found_while_the_first_attempt_starts_leaves_no_run_and_no_process(home):
    mark = f"startup-test-{os.getpid()}"   # in the environment of whatever the CLI starts
    done = subprocess.run(cockpit_cmd("--no-ui", "-w", "matmul", "-d", "cuda"), capture_output=True,
                          text=True, env={**child_env(), "COCKPIT_TEST_MARK": mark}, timeout=300)
    assert done.returncode == 2 and "device preset 'cuda': device:" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not list_runs(home / "runs")
    assert not [p for p in psutil.process_iter() if _marked(p, mark)]


def _marked(process: psutil.Process, mark: str) -> bool:
    try:
        return process.environ().get("COCKPIT_TEST_MARK") == mark
    except (psutil.Error, OSError):
        return False


def test_goodput_says_the_start_up_by_its_parts():
    t0 = 1000.0
    timeline = Timeline()
    for e in [{"type": "run_started", "t": t0},
              {"type": "attempt_started", "attempt": 1, "t": t0 + 0.5},
              {"type": "trainer_ready", "attempt": 1, "t": t0 + 4.5,
               "startup": {"launch": 2.0, "device": 0.5, "data": 0.4, "model": 1.0, "resume": 0.2,
                           "setup": 0.1, "ahead": []}, "resumed_from": {"step": 10, "load_s": 0.2}},
              {"type": "parity", "attempt": 1, "t": t0 + 5.0, "seconds": 0.5},
              {"type": "step", "attempt": 1, "t": t0 + 7.0, "step": 20, "window_s": 1.5, "steps_per_s": 6.7},
              {"type": "attempt_ended", "attempt": 1, "t": t0 + 7.1, "outcome": "finished", "last_step": 20},
              {"type": "run_finished", "t": t0 + 7.2, "status": "finished"}]:
        timeline.add(e)
    g = timeline.result({})
    # run_started -> the first window: 5.5 s, less the checkpoint's 0.2 s load (its own bucket)
    assert abs(g.buckets["startup"] - 5.3) < 1e-6
    parts = g.startup_parts
    assert abs(parts["cockpit"] - 0.5) < 1e-6 and parts["launch"] == 2.0 and parts["parity"] == 0.5
    assert "resume" not in parts   # checkpoint_load's
    assert abs(sum(parts.values()) - g.buckets["startup"]) < 1e-6   # the rest is 'other'
    text = goodput_text(g.as_dict())
    assert "start-up 5.3 s (launch 2.0 s, model 1.0 s, " in text
    # a table's cell says the bucket alone; a run whose start nothing timed (a command's, a run
    # recorded before) says no parts, not 'other'
    assert goodput_cell(g.as_dict()) == f"{g.fraction:.0%} (start-up 5.3 s)"
    untimed = {**g.as_dict(), "startup_parts": {"cockpit": 0.5, "other": 4.8}}
    assert "start-up 5.3 s," in goodput_text(untimed) and "other" not in goodput_text(untimed)


# A tiny trm, compiled, a checkpoint every step and every step its own report.
TINY_TRM = ["threads=1", "batch_size=4", "accumulation=1", "params.hidden_size=32", "params.num_heads=2",
            "params.L_layers=2", "params.H_cycles=1", "params.L_cycles=1", "params.seq_len=16",
            "params.corpus_bytes=20000", "params.eval_bytes=256", "train.max_steps=8",
            "train.report_every_s=1e-9", "train.checkpoint_every_steps=1", "compile=true"]


def test_a_spare_compiles_the_model_ahead_and_the_attempt_in_it_trains_as_one_that_did_not(home):
    """COCKPIT_SPARE_MODEL=1: what CUDA gets by default (with half its memory free), here on the
    CPU. Each attempt runs in a spare that built and compiled the model before it was handed
    the attempt; the one after a crash loads its checkpoint into that model and goes on as an
    uninterrupted run of processes that built their own does."""
    sets = [a for s in TINY_TRM for a in ("--set", s)]
    done = subprocess.run(cockpit_cmd("--no-ui", "-w", "trm-tiny", "-d", "cpu", *sets, "--inject", "native-crash@5"),
                          capture_output=True, text=True, timeout=600,
                          env={**child_env(), "COCKPIT_SPARE_MODEL": "1", "TORCH_LOGS": "recompiles"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = list_runs(home / "runs")
    events = run.events()
    ready = {e["attempt"]: e for e in events if e["type"] == "trainer_ready"}
    assert set(ready) == {1, 2}
    assert all(r["startup"]["ahead"] == ["data", "model"] and r["compiled"] == "regional" for r in ready.values())
    assert ready[2]["resumed_from"]["step"] == 4
    # the compiled graph was the attempt's as it was: no guard of Dynamo's failed (the thread
    # count the trainer sets, the shapes, the grad mode), nothing compiled again
    for attempt in (1, 2):
        assert "Recompiling" not in run.attempt_log(attempt).read_text()
    plain = subprocess.run(cockpit_cmd("--no-ui", "-w", "trm-tiny", "-d", "cpu", *sets),
                           capture_output=True, text=True, env={**child_env(), "COCKPIT_SPARE": "0"}, timeout=600)
    assert plain.returncode == 0, plain.stdout[-3000:]
    (other,) = [r for r in list_runs(home / "runs") if r.id != run.id]
    resumed = {e["step"]: e["loss"] for e in events if e["type"] == "step" and e["attempt"] == 2}
    uninterrupted = {e["step"]: e["loss"] for e in other.events() if e["type"] == "step"}
    assert sorted(resumed) == [5, 6, 7, 8]
    assert all(abs(v - uninterrupted[s]) <= 1e-4 * abs(uninterrupted[s]) for s, v in resumed.items()), \
        (resumed, uninterrupted)


def test_an_attempt_that_trained_and_crashed_between_two_polls_still_gets_its_spare(home):
    """The next attempt's spare starts once a poll sees this one train; a crash before the next
    poll (a fast run on a loaded machine; here the poll outlasts the attempt) leaves the next
    attempt one all the same, started as the crash is judged."""
    from conftest import TINY
    from engine import runconfig
    from engine.record.rundir import RunDir
    from engine.run.supervisor import Supervisor

    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY + [
        "inject=['native-crash@3']", "train.checkpoint_every_steps=1"]))
    supervisor = Supervisor(run, poll_s=3600)
    assert supervisor.supervise() == "finished"
    events = run.events()
    assert [e["outcome"] for e in events if e["type"] == "attempt_ended"] == ["native-crash", "finished"]
    assert [e["attempt"] for e in events if e["type"] == "attempt_process" and e.get("spare")] == [2]
    # the second attempt ran in that spare (a poll that sees it train may start another)
    second = [e for e in events if e["type"] == "trainer_ready"][1]
    assert second["pid"] == supervisor.spare_pids[0]


def test_a_stop_from_outside_obeyed_before_a_poll_is_said_all_the_same(home):
    """SLURM's SIGTERM reaches the trainer as well as the supervisor; the trainer checkpoints and
    exits before the supervisor's next poll (here the poll outlasts it): the record still says
    the stop was asked, and from outside."""
    import signal
    import threading
    import time

    from conftest import TINY
    from engine import runconfig
    from engine.record.rundir import RunDir
    from engine.run.supervisor import Supervisor

    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY + ["train.epochs=400", "inject=['slow@1']"]))
    supervisor = Supervisor(run, poll_s=3600, spare=False)

    def scancel() -> None:   # what SLURM does: the same SIGTERM to the trainer and the supervisor
        while not (ready := [e for e in run.events() if e["type"] == "trainer_ready"]):
            time.sleep(0.05)
        supervisor.stop_delivered()   # first: the trainer may obey before this thread runs again
        os.kill(ready[0]["pid"], signal.SIGTERM)

    threading.Thread(target=scancel, daemon=True).start()
    assert supervisor.supervise() == "stopped"
    events = run.events()
    assert [e["outcome"] for e in events if e["type"] == "attempt_ended"] == ["stopped"]
    assert [e.get("why") for e in events if e["type"] == "stop_requested"] == ["SIGTERM from outside (SLURM)"]

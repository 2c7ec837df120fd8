"""A run's life past its first supervisor: resume of a stopped, failed or interrupted run, the
lifeline that stops an attempt whose supervisor died, and liveness by process identity."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import TINY, cockpit_cmd, child_env, user_preset
from engine import runconfig
from engine.errors import ConfigError
from engine.run import detached
from engine.record.identity import ProcessId
from engine.run.resume import History
from engine.record.rundir import RunDir, find_run, summarize
from engine.run.supervisor import Supervisor

# 320 steps, a checkpoint every 4.
LONG = TINY + ["train.epochs=40", "train.checkpoint_every_steps=4"]
# ... with a pause per step from step 1 (slow: a few hundredths of a second a step), so that a
# stop asked for at the first checkpoint lands well before the end however late a loaded
# machine delivers it: the 320 steps last seconds, not the second they take at full speed.
# Once a run: a resume trains at full speed.
STOPPABLE = LONG + ["inject=['slow@1']"]
DEADLINE_S = 120  # only a real hang gets near this


def of_type(run: RunDir, kind: str) -> list[dict]:
    return [e for e in run.events() if e["type"] == kind]


def cockpit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(cockpit_cmd(*args), capture_output=True, text=True, env=child_env(),
                          timeout=DEADLINE_S * 2)


def wait_for(predicate, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {DEADLINE_S} s")


def stop_at_first_checkpoint(run: RunDir) -> Supervisor:
    supervisor = Supervisor(run, poll_s=0.05)

    def on_events(events):
        if any(e["type"] == "checkpoint" for e in events):
            supervisor.request_stop()

    supervisor.on_events = on_events
    return supervisor


def resumed_at(run: RunDir, attempt: int) -> dict:
    (ready,) = [e for e in of_type(run, "trainer_ready") if e["attempt"] == attempt]
    return ready["resumed_from"]


def test_a_stopped_run_resumes_at_its_checkpoint_as_the_next_attempt(home):
    run = RunDir.create(runconfig.resolve("matmul", "cpu", STOPPABLE))
    assert stop_at_first_checkpoint(run).supervise() == "stopped"
    newest = of_type(run, "checkpoint")[-1]
    with open(run.events_path, "ab") as f:
        f.write(b'{"v":1,"t":1,"type":"ste')   # a writer killed mid-write: ended, not joined
    result = cockpit("runs", "resume", run.id)
    assert result.returncode == 0, result.stderr
    assert "resumed: attempt 2 on cpu" in result.stdout
    assert [e["attempt"] for e in of_type(run, "attempt_started")] == [1, 2]
    resumed = resumed_at(run, 2)
    assert (resumed["step"], resumed["samples_seen"]) == (newest["step"], newest["samples_seen"])
    (event,) = of_type(run, "run_resumed")
    assert event["next_attempt"] == 2 and event["resume"]["step"] == newest["step"]
    s = summarize(run)
    assert s.status == "finished" and s.step == 320
    result = cockpit("runs", "resume", run.id)
    assert result.returncode == 2 and "finished; there is nothing to resume" in result.stderr


def test_a_preempted_run_checkpoints_where_it_stopped_and_a_resume_loses_no_step(home):
    """`--inject preempt@N`: the warning a cluster sends before a job's time ends, outside SLURM
    too. The attempt stops as a first stop request stops it (a checkpoint at the step it reached),
    the run ends "preempted" (exit 130, resumable), and a resume goes on from that checkpoint."""
    done = cockpit("--no-ui", "-w", "matmul", "-d", "cpu", *[a for s in STOPPABLE for a in ("--set", s)],
                   "--inject", "preempt@6")
    assert done.returncode == 130, done.stderr[-2000:]
    run = find_run("last")
    assert summarize(run).status == "preempted"
    stopped = of_type(run, "attempt_ended")[0]
    assert stopped["outcome"] == "stopped" and stopped["last_step"] >= 6
    assert max(e["step"] for e in of_type(run, "checkpoint")) == stopped["last_step"]
    assert [e["why"] for e in of_type(run, "stop_requested")] == ["preempt@6 (rehearsed)"]
    resumed = cockpit("runs", "resume", "last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    s = summarize(run)
    assert s.status == "finished" and s.step == s.total_steps and not s.steps_lost
    assert of_type(run, "trainer_ready")[1]["resumed_from"]["step"] == stopped["last_step"]
    assert len(of_type(run, "fault_injected")) == 1   # once a run: the resume is not preempted again


def test_a_runs_directory_without_flock_is_said_in_one_line_not_taken_for_a_supervisor(home, monkeypatch):
    """A cluster filesystem mounted without flock (Lustre's noflock: ENOSYS) must not read as
    'being supervised already' forever (a SLURM job would fail at every start)."""
    import errno
    import fcntl

    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY))

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    assert not run.locked()
    with pytest.raises(ConfigError, match="no flock") as refused:
        Supervisor(run, poll_s=0.05).supervise()
    assert "Function not implemented" in refused.value.line() and run.id in refused.value.line()


def test_a_failed_run_resumes_without_firing_its_recorded_fault_again(home):
    run = RunDir.create(runconfig.resolve("matmul", "cpu", LONG + ["inject=['user-code@10']"]))
    assert Supervisor(run, poll_s=0.05).supervise() == "failed"
    result = cockpit("runs", "resume", "last")
    assert result.returncode == 0, result.stderr
    assert len(of_type(run, "fault_injected")) == 1
    assert resumed_at(run, 2)["step"] == 8   # the last checkpoint before the fault at step 10
    assert summarize(run).status == "finished"


def test_resume_on_another_preset_keeps_the_previous_run_toml_and_refuses_bad_changes(home):
    user_preset(home, "devices", "small", 'device = "cpu"\nbatch_size = 4\naccumulation = 8\nthreads = 1\n')
    run = RunDir.create(runconfig.resolve("matmul", "cpu", STOPPABLE))
    assert stop_at_first_checkpoint(run).supervise() == "stopped"
    before, events = run.config_path.read_bytes(), run.events_path.read_bytes()
    for args, named in ((["--set", "params.n=32"], "params.n"), (["-d", "no-such-preset"], "no-such-preset")):
        result = cockpit("runs", "resume", run.id, *args)
        assert result.returncode == 2 and named in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
        assert run.config_path.read_bytes() == before and run.events_path.read_bytes() == events
    result = cockpit("runs", "resume", run.id, "-d", "small", "--set", "train.epochs=2")
    assert result.returncode == 0, result.stderr
    assert (run.path / "run.before-attempt-2.toml").read_bytes() == before
    config = run.config()
    assert (config.device_preset, config.device.batch_size, config.workload.train.epochs) == ("small", 4, 2)
    (ready,) = [e for e in of_type(run, "trainer_ready") if e["attempt"] == 2]
    assert (ready["batch_size"], ready["accumulation"]) == (4, 8)
    assert summarize(run).status == "finished"


def start_detached_and_wait_for_checkpoint(run: RunDir) -> ProcessId:
    detached.start_detached(run)
    wait_for(lambda: of_type(run, "checkpoint"), "checkpoint")
    return ProcessId.parse(run.pid_path.read_text())


def test_a_killed_supervisor_leaves_no_trainer_behind_and_the_run_resumes(home):
    # Slow enough (a pause per step) that the run is mid-training when its supervisor dies.
    run = RunDir.create(runconfig.resolve("matmul", "cpu", LONG + ["inject=['slow@1+']"]))
    supervisor = start_detached_and_wait_for_checkpoint(run)
    os.kill(supervisor.pid, signal.SIGKILL)
    wait_for(lambda: of_type(run, "run_interrupted"), "run_interrupted")
    process = History.of(run.events()).process
    assert not ProcessId(process["pid"], process["start"]).alive()
    events = run.events()
    lost = next(i for i, e in enumerate(events) if e["type"] == "supervisor_lost")
    # The trainer was told, finished its step and checkpointed on the way out.
    assert any(e["type"] == "checkpoint" and e["attempt"] == 1 for e in events[lost:])
    # the lifeline read where it got to: the step of its checkpoint on the way out
    (ended,) = [e for e in events[lost:] if e["type"] == "attempt_ended"]
    assert ended["last_step"] == of_type(run, "checkpoint")[-1]["step"]
    s = summarize(run)
    assert s.status == "interrupted" and s.attempts[-1].outcome == "interrupted"
    assert not run.pid_path.exists()
    newest = of_type(run, "checkpoint")[-1]
    result = cockpit("runs", "resume", run.id, "--set", "train.epochs=4", "--set", "inject=[]")
    assert result.returncode == 0, result.stderr
    assert resumed_at(run, 2)["samples_seen"] == newest["samples_seen"]


COMMAND = textwrap.dedent("""
    import pathlib, sys, time
    out = pathlib.Path(sys.argv[1])
    try:
        for step in range(1, 100000):
            print(f"step {step} loss {1 / step:.4f}", flush=True)
            if step == 3:
                (out / "ckpt-3.txt").write_text("3")
            time.sleep(0.05)
    except KeyboardInterrupt:
        (out / "interrupted").write_text("saved on Ctrl-C")
""")


def test_a_killed_supervisor_stops_the_command_as_ctrl_c_would(home, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(COMMAND)
    run = RunDir.create(runconfig.resolve_command(
        [sys.executable, str(script), str(tmp_path)], "loop", "cpu",
        ["command.checkpoints=" + str(tmp_path / "ckpt-*.txt")]))
    detached.start_detached(run)
    wait_for(lambda: [e for e in of_type(run, "step") if e["step"] >= 5], "step 5")
    os.kill(ProcessId.parse(run.pid_path.read_text()).pid, signal.SIGKILL)
    wait_for(lambda: of_type(run, "run_interrupted"), "run_interrupted")
    assert (tmp_path / "interrupted").read_text() == "saved on Ctrl-C"
    assert summarize(run).status == "interrupted"


def test_a_pid_file_naming_an_unrelated_live_process_is_not_trusted(home):
    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY))
    assert Supervisor(run, poll_s=0.05).supervise() == "finished"
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # A reused pid: an old file with a bare pid, then one whose start time is another's.
        for text in (f"{stranger.pid}\n", f"{stranger.pid} {time.time() - 3600:.3f}\n"):
            run.pid_path.write_text(text)
            assert run.supervisor_pid() is None
            result = cockpit("runs", "stop", run.id)
            assert result.returncode == 1 and "not running" in result.stdout
            assert stranger.poll() is None   # not signalled
        # The pid file is trusted for the process it names.
        run.pid_path.write_text(f"{ProcessId.of(stranger.pid)}\n")
        assert run.supervisor_pid() == stranger.pid
    finally:
        stranger.kill()
        stranger.wait()


def test_runs_stop_stops_an_attempt_whose_supervisor_and_lifeline_both_died(home):
    run = RunDir.create(runconfig.resolve("matmul", "cpu", LONG + ["inject=['slow@1+']"]))
    supervisor = start_detached_and_wait_for_checkpoint(run)
    lifeline = [p for p in __import__("psutil").Process(supervisor.pid).children()
                if "engine.run.lifeline" in " ".join(p.cmdline())]
    for p in lifeline:
        p.kill()
    os.kill(supervisor.pid, signal.SIGKILL)
    wait_for(lambda: summarize(run).status == "lost", "lost status")
    assert History.of(run.events()).orphan() is not None
    result = cockpit("runs", "resume", run.id)
    assert result.returncode == 2 and "still running without a supervisor" in result.stderr
    result = cockpit("runs", "stop", run.id)
    assert result.returncode == 0, result.stdout + result.stderr
    assert History.of(run.events()).orphan() is None
    assert summarize(run).status == "interrupted"
    assert find_run(run.id).id == run.id


CORRUPTING = textwrap.dedent("""
    import argparse, os, pathlib, torch
    parser = argparse.ArgumentParser()
    parser.add_argument("--out"); parser.add_argument("--resume")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    start = torch.load(args.resume)["step"] if args.resume else 0
    print(f"resumed at {start}", flush=True)
    for step in range(start + 1, 9):
        print(f"step {step}/8 loss {1 / step:.4f}", flush=True)
        if step == 2:
            torch.save({"step": step}, out / "ckpt-2.pt")
        if step == 4 and not args.resume:
            (out / "ckpt-4.pt").write_bytes(b"PK\\x03\\x04 torn by a full disk")
            os.abort()
""")


def test_a_command_that_cannot_load_its_newest_checkpoint_resumes_from_the_one_before(home, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(CORRUPTING)
    user_preset(home, "devices", "a", 'device = "cpu"\nfallback = ["b"]\n')
    user_preset(home, "devices", "b", 'device = "cpu"\n')
    run = RunDir.create(runconfig.resolve_command(
        [sys.executable, str(script), "--out", str(tmp_path)], "corrupting", "a",
        ['command.resume=["--resume", "{checkpoint}"]', "command.checkpoints=" + str(tmp_path / "ckpt-*.pt")]))
    assert Supervisor(run, poll_s=0.05).supervise() == "finished"
    crashes = [e["kind"] for e in of_type(run, "crash")]
    assert crashes == ["native-crash", "checkpoint"]
    resumes = [e["resume"]["path"] for e in of_type(run, "attempt_started") if e.get("resume")]
    assert [Path(p).name for p in resumes] == ["ckpt-4.pt", "ckpt-2.pt"]
    assert "resumed at 2" in run.attempt_log(3).read_text()


def test_a_resume_continues_on_the_preset_as_it_ran_after_a_rule_changed_it(home):
    # slow@7: attempt 1 ends at step 6, so attempt 2 (from step 4) pauses at each step from 7 on,
    # and the stop asked for at its first checkpoint lands before its end (STOPPABLE's reason)
    run = RunDir.create(runconfig.resolve("matmul", "cpu", LONG + ["inject=['oom@6', 'slow@7']"]))
    supervisor = Supervisor(run, poll_s=0.05)
    supervisor.on_events = lambda events: any(
        e["type"] == "checkpoint" and e["attempt"] == 2 for e in events) and supervisor.request_stop()
    assert supervisor.supervise() == "stopped"
    result = cockpit("runs", "resume", run.id)
    assert result.returncode == 0, result.stderr
    ready = {e["attempt"]: (e["batch_size"], e["accumulation"]) for e in of_type(run, "trainer_ready")}
    assert ready == {1: (8, 4), 2: (4, 8), 3: (4, 8)}   # halve-batch's change holds


def test_resume_checks_its_changes_as_a_new_run_does_and_writes_nothing_when_refused(home):
    run = RunDir.create(runconfig.resolve("matmul", "cpu", STOPPABLE))
    assert stop_at_first_checkpoint(run).supervise() == "stopped"
    crash_at = of_type(run, "checkpoint")[-1]["step"] + 2   # the stop may land a few steps late
    before, events = run.config_path.read_bytes(), run.events_path.read_bytes()
    for args, named in ((["--set", "batch_size=300", "--set", "accumulation=1"], "batch_size"),
                        (["--set", 'device.fallback=["nowhere"]'], "nowhere")):
        result = cockpit("runs", "resume", run.id, *args)
        assert result.returncode == 2 and named in result.stderr, result.stderr
        assert run.config_path.read_bytes() == before and run.events_path.read_bytes() == events
    assert sorted(p.name for p in run.path.glob("*.toml")) == ["run.toml"]
    # A ladder given on resume is loaded and the user's settings are carried down it.
    user_preset(home, "devices", "b", 'device = "cpu"\nthreads = 1\n')
    result = cockpit("runs", "resume", run.id, "--set", 'device.fallback=["b"]', "--set", "threads=2",
                     "--set", f"inject=['native-crash@{crash_at}']", "--set", "rules={native-crash='next'}")
    assert result.returncode == 0, result.stderr
    (move,) = of_type(run, "fallback")
    assert move["to_preset"] == "b"
    assert [e["config"]["threads"] for e in of_type(run, "attempt_started")][1:] == [2, 2]


def test_a_run_is_never_supervised_twice(home):
    run = RunDir.create(runconfig.resolve("matmul", "cpu", STOPPABLE))
    assert stop_at_first_checkpoint(run).supervise() == "stopped"
    lock = run.try_lock()   # as a live supervisor (or its lifeline) holds it
    try:
        result = cockpit("runs", "resume", run.id)
        assert result.returncode == 2 and "is running" in result.stderr
        with pytest.raises(ConfigError, match="is being supervised already"):
            Supervisor(run).supervise()
    finally:
        os.close(lock)
    assert len(of_type(run, "run_resumed")) == 0


def test_a_command_that_takes_no_checkpoint_starts_over_when_resumed(home, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(COMMAND)
    (tmp_path / "ckpt-9.txt").write_text("9")
    run = RunDir.create(runconfig.resolve_command(
        [sys.executable, str(script), str(tmp_path)], "loop", "cpu",
        ["command.checkpoints=" + str(tmp_path / "ckpt-*.txt")]))
    supervisor = Supervisor(run, poll_s=0.05)
    supervisor.on_events = lambda events: any(
        e["type"] == "step" and e["step"] >= 4 for e in events) and supervisor.request_stop()
    assert supervisor.supervise() == "stopped"
    supervisor = Supervisor(run, poll_s=0.05)
    supervisor.on_events = lambda events: any(
        e["type"] == "step" and e["step"] >= 2 for e in events) and supervisor.request_stop()
    assert supervisor.supervise() == "stopped"
    (resumed,) = of_type(run, "run_resumed")
    assert resumed["resume"] is None   # its checkpoints are never passed to it
    assert all(e.get("resume") is None for e in of_type(run, "attempt_started"))

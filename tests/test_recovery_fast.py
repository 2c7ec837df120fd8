"""Fast recovery (issue 27, item 4): the supervisor wakes as its attempt dies, and the next
attempt runs in a spare process started ahead of it (engine.train.spare) where that is safe.

No timings are asserted (benchmarks/recovery.py measures them): the wait is checked by what it
returns, the spare by which process ran the attempt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from conftest import TINY, user_preset
from engine import runconfig
from engine.record.rundir import RunDir
from engine.run import launchers
from engine.run.launch import Launch
from engine.run.launchers.trainer import SPARE_VARYING, trainer_launch
from engine.run.process import AttemptProcess, ExitWait, spawn
from engine.run.spare import Spare
from engine.run.supervisor import Supervisor
from engine.train.faults import STARTED_ENV

# A checkpoint every step: a resume loses nothing, and where it resumed is exact.
FAST = TINY + ["train.checkpoint_every_steps=1", "train.epochs=2", "params.samples=128"]
# A spare is started once the attempt is seen training (a step published), so the attempt that
# crashes must train long enough for a poll to see it: 30 steps, each with a pause (slow@1,
# once a run), before the crash at step 31.
SPARED = TINY + ["train.checkpoint_every_steps=1", "train.epochs=2", "params.samples=512"]


def of_type(run: RunDir, kind: str) -> list[dict]:
    return [e for e in run.events() if e["type"] == kind]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def child(code: str) -> subprocess.Popen:
    # in a session of its own, SIGINT handled by default, as every process a test starts
    return spawn([sys.executable, "-c", code], restore_sigint=True)


# ---------------------------------------------------------------- the wait


def test_the_wait_wakes_when_the_process_exits():
    process = AttemptProcess(child("import sys; sys.exit(7)"))
    # far longer than any test may take: it returns because the child exited, with its status
    assert process.wait(3600) == 7
    assert process.returncode == 7 and not process.running


def test_the_wait_returns_none_while_the_process_lives_and_its_status_once_it_dies():
    process = AttemptProcess(child("import time; time.sleep(3600)"))
    try:
        assert process.wait(0.01) is None and process.running
        assert ExitWait(process.pid).wakes == (sys.platform.startswith("linux") or sys.platform == "darwin")
    finally:
        process.kill()
    assert process.wait(3600) == -9   # SIGKILL, seen as it happens


def test_without_a_pidfd_or_kqueue_the_wait_sleeps_and_poll_still_tells(monkeypatch):
    monkeypatch.delattr(os, "pidfd_open", raising=False)
    monkeypatch.delattr("select.kqueue", raising=False)
    process = AttemptProcess(child("pass"))
    wait = ExitWait(process.pid)
    assert not wait.wakes and wait.wait(0.01) is False
    while (code := process.wait(0.05)) is None:
        pass
    assert code == 0


# ---------------------------------------------------------------- the spare, end to end


def test_a_crash_resumes_in_the_spare_at_the_same_sample_and_finishes(home):
    # six epochs, 96 steps: the second attempt, which runs in the spare, must train long
    # enough for a poll to see it too (slow from step 32), or no spare is started beside it
    config = runconfig.resolve("matmul", "cpu", SPARED + [
        "train.epochs=6", "inject=['slow@1', 'native-crash@31', 'slow@32']"])
    run = RunDir.create(config)
    supervisor = Supervisor(run, poll_s=0.05, spare=True)
    assert supervisor.supervise() == "finished"
    (crash,) = of_type(run, "crash")
    assert crash["kind"] == "native-crash" and crash["attempt"] == 1
    first, second = of_type(run, "trainer_ready")
    # the second attempt ran in the spare started while the first trained
    assert second["pid"] == supervisor.spare_pids[0] != first["pid"]
    (process,) = [e for e in of_type(run, "attempt_process") if e["attempt"] == 2]
    assert process["pid"] == second["pid"]   # the lifeline was told of it as the attempt
    before = [e for e in of_type(run, "checkpoint") if e["attempt"] == 1]
    assert second["resumed_from"]["samples_seen"] == before[-1]["samples_seen"]
    assert of_type(run, "checkpoint")[-1]["samples_seen"] == 6 * 512
    # its output went to its own log, as an attempt started directly has it
    assert "attempt 2: finished at step" in run.attempt_log(2).read_text()
    # the spare started while the second attempt trained (slowed so a poll sees it) was never
    # used, and is gone too
    assert [e["attempt"] for e in of_type(run, "fault_injected") if e["spec"] == "slow@32"] == [2]
    assert len(supervisor.spare_pids) == 2
    assert all(gone(pid) for pid in supervisor.spare_pids)


def test_a_next_attempt_with_another_environment_does_not_use_the_spare(home, monkeypatch):
    # openmp: the rule retries with KMP_DUPLICATE_LIB_OK=TRUE, an environment the spare was
    # not started with (torch reads it as it loads); unset here, as twotower's mining may have
    # set it in this process
    monkeypatch.delenv("KMP_DUPLICATE_LIB_OK", raising=False)
    user_preset(home, "devices", "first", 'device = "cpu"\nthreads = 1\n')
    run = RunDir.create(runconfig.resolve("matmul", "first", SPARED + ["inject=['slow@1', 'openmp@31']"]))
    supervisor = Supervisor(run, poll_s=0.05, spare=True)
    assert supervisor.supervise() == "finished"
    (move,) = of_type(run, "fallback")
    assert move["action"] == "retry-env"
    ready = of_type(run, "trainer_ready")
    assert len(ready) == 2 and supervisor.spare_pids
    assert ready[1]["pid"] not in supervisor.spare_pids
    assert all(gone(pid) for pid in supervisor.spare_pids)


def test_switched_off_there_is_no_spare(home, monkeypatch):
    monkeypatch.setenv("COCKPIT_SPARE", "0")
    run = RunDir.create(runconfig.resolve("matmul", "cpu", FAST + ["inject=['native-crash@6']"]))
    supervisor = Supervisor(run, poll_s=0.05)
    assert supervisor.supervise() == "finished"
    assert not supervisor.use_spare and supervisor.spare_pids == []
    assert len(of_type(run, "trainer_ready")) == 2


LOOP = textwrap.dedent("""
    import time
    for step in range(1, 41):
        print(f"step {step}/40 loss {1 / step:.4f}", flush=True)
        time.sleep(0.05)
""")


def test_a_command_that_is_not_a_python_script_gets_no_spare(home, tmp_path):
    # a shell may start any program: nothing can be started ahead of it (a Python script's
    # spare: tests/test_command_spare.py)
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    config = runconfig.resolve_command(["/bin/sh", "-c", f"exec {sys.executable} {script}"], "loop", "cpu",
                                       ["inject=['native-crash@4']", "rules={native-crash='retry'}"])
    assert launchers.for_attempt(RunDir.create(config), config, config.device).spare(2, "cpu", config.device) is None
    run = RunDir.create(config)
    supervisor = Supervisor(run, poll_s=0.05, spare=True)
    assert supervisor.supervise() == "finished"
    assert [e["kind"] for e in of_type(run, "crash")] == ["native-crash"]
    assert supervisor.spare_pids == []


# ---------------------------------------------------------------- the spare, alone


def spare_launch(home, **env: str) -> Launch:
    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY))
    config = run.config()
    launch = trainer_launch(run, 2, "cpu", config.device)
    return launch if not env else Launch(argv=launch.argv, env={**launch.env, **env})


def test_a_spare_is_used_only_for_a_launch_it_fits_and_is_ended_otherwise(home, tmp_path):
    launch = spare_launch(home)
    with open(tmp_path / "spare.log", "ab") as log:
        spare = Spare(launch.env, log, varying=SPARE_VARYING)
    pid = spare.pid
    assert pid is not None
    # when the attempt started differs (it always does): still a fit
    assert spare.fits(Launch(argv=launch.argv, env={**launch.env, STARTED_ENV: "1.0"}))
    assert not spare.fits(Launch(argv=launch.argv, env={**launch.env, "OMP_NUM_THREADS": "3"}))
    assert not spare.fits(Launch(argv=[sys.executable, "train.py"], env=launch.env))
    # another environment: not handed, ended at once (killed and reaped)
    assert spare.take(spare_launch(home, OMP_NUM_THREADS="3"), tmp_path / "attempt-2.log") is None
    assert gone(pid) and spare.pid is None
    assert not (tmp_path / "attempt-2.log").exists()


def test_a_spare_whose_pipe_closes_exits_by_itself(home, tmp_path):
    # the supervisor gone (its end of the pipe closed by the kernel): the spare ends as well
    launch = spare_launch(home)
    with open(tmp_path / "spare.log", "ab") as log:
        spare = Spare(launch.env, log, varying=SPARE_VARYING)
    popen = spare.popen
    assert popen is not None and popen.stdin is not None
    popen.stdin.close()
    assert popen.wait(timeout=120) == 0


def test_a_spare_at_its_work_ahead_exits_at_once_when_its_pipe_closes(home, tmp_path):
    """Its work ahead (here a workload whose build never ends) runs beside the wait for an
    attempt: the supervisor gone, the spare does not finish it first."""
    (tmp_path / "never_built.py").write_text("import time\n\ndef build(params, seed):\n    time.sleep(3600)\n")
    launch = spare_launch(home)
    env = {**launch.env, "PYTHONPATH": os.pathsep.join((str(tmp_path), launch.env["PYTHONPATH"]))}
    with open(tmp_path / "spare.log", "ab") as log:
        spare = Spare(env, log, varying=SPARE_VARYING,
                      warm=(f"--workload={json.dumps({'workload': 'never_built:build'})}",))
    popen = spare.popen
    assert popen is not None and popen.stdin is not None
    popen.stdin.close()   # while it imports, or builds for an hour: either way it ends now
    assert popen.wait(timeout=120) == 0


def test_trainer_attempts_and_runs_share_the_users_compile_caches(home, monkeypatch):
    """torch.compile's caches are keyed by what they compile: one pair under the user's cache
    dir serves every attempt of a run and every run, so a new run of the same model is warm."""
    import dataclasses

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    runs = [RunDir.create(runconfig.resolve("matmul", "cpu", TINY)) for _ in range(2)]
    envs = [trainer_launch(run, attempt, "cpu", run.config().device).env
            for run in runs for attempt in (1, 2)]
    cache = home / "cache" / "compile"
    assert {(env["TORCHINDUCTOR_CACHE_DIR"], env["TRITON_CACHE_DIR"]) for env in envs} == \
        {(str(cache / "inductor"), str(cache / "triton"))}
    # the user's own, from the environment or the preset, wins
    monkeypatch.setenv("TRITON_CACHE_DIR", "/elsewhere/triton")
    preset = dataclasses.replace(runs[0].config().device, env={"TORCHINDUCTOR_CACHE_DIR": "/mine"})
    env = trainer_launch(runs[0], 1, "cpu", preset).env
    assert (env["TORCHINDUCTOR_CACHE_DIR"], env["TRITON_CACHE_DIR"]) == ("/mine", "/elsewhere/triton")


def test_the_lifeline_stops_an_attempt_running_in_a_spare(home):
    """The supervisor dies while the attempt that a spare became trains: the lifeline stops it
    as it would any attempt, and the run reads interrupted."""
    import signal
    import time

    from engine.record.identity import ProcessId
    from engine.record.rundir import summarize
    from engine.run import detached
    from engine.run.resume import History

    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY + [
        "train.epochs=40", "train.checkpoint_every_steps=4", "inject=['native-crash@6', 'slow@1+']"]))
    detached.start_detached(run)
    deadline = time.monotonic() + 120
    while not [e for e in of_type(run, "step") if e["attempt"] == 2] and time.monotonic() < deadline:
        time.sleep(0.1)
    ready = [e for e in of_type(run, "trainer_ready") if e["attempt"] == 2]
    assert ready, "no second attempt within 120 s"
    supervisor = ProcessId.parse(run.pid_path.read_text())
    assert supervisor is not None
    spares = [p for p in __import__("psutil").Process(supervisor.pid).children()
              if "engine.train.spare" in " ".join(p.cmdline())]
    # the second attempt is one of the supervisor's spares (started before its attempt_started)
    assert any(p.pid == ready[0]["pid"] for p in spares)
    os.kill(supervisor.pid, signal.SIGKILL)
    while not of_type(run, "run_interrupted") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert of_type(run, "run_interrupted")
    process = History.of(run.events()).process
    assert process["pid"] == ready[0]["pid"]
    assert not ProcessId(process["pid"], process["start"]).alive()
    assert summarize(run).status == "interrupted"
    # the other spare (started while attempt 2 trained) read the end of its pipe and went
    for p in spares:
        if p.pid != ready[0]["pid"]:
            p.wait(timeout=60)


def test_a_spare_is_started_only_where_memory_leaves_room_for_it():
    from engine.run.attempt import room_for_spare

    gb = 2**30
    sample = {"system_total": 16 * gb, "system_used": 8 * gb, "rss": 2 * gb}
    assert room_for_spare(sample)
    assert not room_for_spare({**sample, "system_used": 15 * gb})           # above 90% in use
    assert not room_for_spare({**sample, "rss": 9 * gb})                    # no room for its copy
    assert room_for_spare({**sample, "rss": None})                          # the attempt just ended

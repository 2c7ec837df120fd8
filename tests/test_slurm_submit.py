"""`cockpit submit` against a real one-node SLURM cluster (tools/slurm_cluster.py, the
`slurm_cluster` fixture): a run as a job that is warned, checkpoints, is requeued by SLURM and
finishes, one cockpit run across the requeue; its state as SLURM says it in `cockpit runs`; and
bad input said in one line with nothing left behind. Every wait is on a condition, with a
generous timeout: a requeued job waits its BeginTime (about 12 s here) and a loaded machine's
queue its turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import TINY, child_env, cockpit_cmd, wait_until as waited
from engine import runconfig
from engine.record.rundir import RunDir, find_run
from engine.run import slurm as engine_slurm

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SLURM runs on Linux")
TIMEOUT = 300.0
# 320 steps of the tiny matmul, a checkpoint every 4
RUN = [arg for pair in (("--set", s) for s in TINY + ["train.epochs=40", "train.checkpoint_every_steps=4"])
       for arg in pair]


def cockpit(cluster, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cockpit_cmd(*args), capture_output=True, text=True, timeout=120,
                          env={**child_env(), **cluster.env, **(env or {})})


def shown(cluster, run_id: str) -> dict:
    done = cockpit(cluster, "runs", "show", run_id, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def wait_until(condition, what: str, timeout: float = TIMEOUT):
    """conftest's, looked at twice a second (each look asks SLURM)."""
    return waited(condition, what, timeout, poll_s=0.5)


def slurm(cluster, *argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **cluster.env}).stdout


def of_type(run: RunDir, kind: str) -> list[dict]:
    return [e for e in run.events() if e["type"] == kind]


@pytest.fixture
def jobs(slurm_cluster):
    """The jobs a test submits, cancelled at its end whatever happened (their processes carry
    the test's mark: nothing may be left running)."""
    submitted: list[str] = []
    yield submitted
    for job in submitted:
        slurm(slurm_cluster, "scancel", job)
    wait_until(lambda: not any(job in slurm(slurm_cluster, "squeue", "-h", "-o", "%i").split()
                               for job in submitted), "the test's jobs to leave the queue", 120)


def submit(cluster, jobs: list[str], *args: str) -> tuple[RunDir, str]:
    done = cockpit(cluster, "submit", "-w", "matmul", "-d", "cpu", *RUN, *args)
    assert done.returncode == 0, done.stderr
    run = find_run(done.stdout.strip())
    job = json.loads((run.path / "slurm.json").read_text())["job_id"]
    jobs.append(job)
    assert f"submitted job {job}" in done.stderr
    return run, job


def finished(cluster, run: RunDir) -> dict:
    return wait_until(lambda: (s := shown(cluster, run.id))["status"] in ("finished", "failed")
                      and s["slurm"]["state"] == "completed" and s, "the job to complete")


def assert_resumed_where_it_checkpointed(run: RunDir) -> None:
    """Attempt 1 checkpointed the step it stopped at, and attempt 2 began there: no step lost."""
    ended = {e["attempt"]: e for e in of_type(run, "attempt_ended")}
    assert ended[1]["outcome"] == "stopped" and ended[2]["outcome"] == "finished"
    saved = max(e["step"] for e in of_type(run, "checkpoint") if e["attempt"] == 1)
    assert saved == ended[1]["last_step"]
    resumed = next(e for e in of_type(run, "trainer_ready") if e["attempt"] == 2)["resumed_from"]
    assert resumed["step"] == saved


@linux_only
def test_a_rehearsed_preemption_checkpoints_is_requeued_and_finishes_with_no_step_lost(home, slurm_cluster, jobs):
    run, job = submit(slurm_cluster, jobs, "--inject", "preempt@6", "--inject", "slow@1")   # slow: polls to see step 6 in
    script = (run.path / "slurm" / "job.sh").read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --signal=B:USR1@120" in script
    s = finished(slurm_cluster, run)
    assert s["status"] == "finished" and s["step"] == s["total_steps"] == 320
    assert s["slurm"] == {**s["slurm"], "job_id": job, "restarts": 1}
    assert not s["steps_lost"]
    assert [(e["job_id"], e["restarts"]) for e in of_type(run, "slurm_job")] == [(job, 0), (job, 1)]
    assert [e["why"] for e in of_type(run, "stop_requested")] == ["preempt@6 (rehearsed)"]
    assert [e["status"] for e in of_type(run, "run_finished")] == ["preempted", "finished"]
    assert_resumed_where_it_checkpointed(run)
    # goodput: the wait in SLURM's queue is told apart (not counted), the exit after the warning
    # is its own bucket
    goodput = s["goodput"]
    assert 0 < goodput["queued_s"] <= goodput["gaps_s"] and goodput["buckets"]["preemption"] > 0
    assert "queued after a preemption" in cockpit(slurm_cluster, "runs", "show", run.id).stdout


@linux_only
def test_slurms_own_warning_signal_reaches_the_supervisor_which_checkpoints_and_requeues(home, slurm_cluster, jobs):
    """The warning as SLURM delivers it (`scancel -b -s USR1`, what --signal=B:USR1@120 sends
    before the limit), to the batch shell, which is cockpit's supervisor."""
    run, job = submit(slurm_cluster, jobs, "--inject", "slow@1")   # seconds of training to land in
    wait_until(lambda: of_type(run, "step"), "the first step")
    slurm(slurm_cluster, "scancel", "-b", "-s", "USR1", job)
    # preempted and requeued; its next start is the rehearsal's test above (a dozen seconds of
    # SLURM's BeginTime this one need not wait again)
    s = wait_until(lambda: (s := shown(slurm_cluster, run.id))["status"] == "preempted"
                   and s["slurm"]["restarts"] == 1 and s, "the run preempted and its job requeued")
    assert [e["why"] for e in of_type(run, "stop_requested")] == ["SIGUSR1"]
    stopped = of_type(run, "attempt_ended")[0]
    assert stopped["outcome"] == "stopped"
    assert max(e["step"] for e in of_type(run, "checkpoint")) == stopped["last_step"]
    assert f"slurm {job} " in cockpit(slurm_cluster, "runs", "list").stdout


@linux_only
def test_a_job_cancelled_by_hand_stops_gracefully_and_is_not_requeued(home, slurm_cluster, jobs):
    """`scancel JOB`: SIGTERM to the batch shell, as a preemption's, but the job is ending for
    good: the attempt checkpoints the step it reached, the run is "stopped" (a `cockpit runs
    resume` continues it), and cockpit does not requeue it."""
    run, job = submit(slurm_cluster, jobs, "--inject", "slow@1")
    wait_until(lambda: of_type(run, "step"), "the first step")
    slurm(slurm_cluster, "scancel", job)
    s = wait_until(lambda: (s := shown(slurm_cluster, run.id))["status"] == "stopped"
                   and s["slurm"]["state"] == "cancelled" and s, "the run to stop")
    assert s["slurm"]["restarts"] == 0 and [e["restarts"] for e in of_type(run, "slurm_job")] == [0]
    stopped = of_type(run, "attempt_ended")[0]
    assert stopped["outcome"] == "stopped"
    assert max(e["step"] for e in of_type(run, "checkpoint")) == stopped["last_step"]
    assert [e["why"] for e in of_type(run, "stop_requested")] == ["SIGTERM from outside (SLURM)"]   # not a preemption
    assert not s["goodput"]["buckets"]["preemption"] and not s["goodput"]["queued_s"]


@linux_only
def test_runs_stop_on_the_jobs_own_machine_stops_it_at_once_and_it_is_not_requeued(home, slurm_cluster, jobs):
    """`cockpit runs stop` where the supervisor runs signals it alone (SLURM says the job runs):
    the stop is forwarded to the attempt as any run's, and the job ends, not requeued."""
    run, job = submit(slurm_cluster, jobs, "--inject", "slow@1")
    wait_until(lambda: of_type(run, "step"), "the first step")
    stopped = cockpit(slurm_cluster, "runs", "stop", run.id)
    assert stopped.returncode == 0 and "asked run" in stopped.stdout
    s = wait_until(lambda: (s := shown(slurm_cluster, run.id))["status"] == "stopped"
                   and s["slurm"]["state"] == "completed" and s, "the run to stop and its job to end")
    assert s["slurm"]["restarts"] == 0
    assert [e.get("why") for e in of_type(run, "stop_requested")] == [None]   # forwarded, as any run's
    ended = of_type(run, "attempt_ended")[0]
    assert ended["outcome"] == "stopped"
    assert max(e["step"] for e in of_type(run, "checkpoint")) == ended["last_step"]


@linux_only
def test_from_the_login_node_a_run_on_its_node_is_running_and_runs_stop_cancels_its_job(home, slurm_cluster, jobs):
    """On a cluster the supervisor runs on a compute node and `cockpit runs` on the login node,
    over shared storage: its pid names another machine, which cannot be checked from here. Seen
    so (supervisor.host rewritten, as the login node sees it), the run is running, not
    lost, and `cockpit runs stop` stops it through SLURM (scancel: a graceful stop)."""
    run, job = submit(slurm_cluster, jobs, "--inject", "slow@1")
    wait_until(lambda: of_type(run, "step") and run.pid_path.exists(), "the first step")
    (run.path / "supervisor.host").write_text("compute-node-17\n")
    assert run.supervisor_pid() is None and run.supervisor_elsewhere() == "compute-node-17"
    assert shown(slurm_cluster, run.id)["status"] == "running"
    stopped = cockpit(slurm_cluster, "runs", "stop", run.id)
    assert stopped.returncode == 0 and f"cancelled SLURM job {job} (on compute-node-17)" in stopped.stdout
    wait_until(lambda: (s := shown(slurm_cluster, run.id))["status"] == "stopped"
               and s["slurm"]["state"] == "cancelled", "the run to stop and its job to end")
    assert of_type(run, "attempt_ended")[0]["outcome"] == "stopped"


@linux_only
def test_bad_submissions_are_one_line_exit_2_and_leave_no_run(home, slurm_cluster, tmp_path):
    no_sbatch = cockpit(slurm_cluster, "submit", "-w", "matmul", "-d", "cpu",
                        env={"PATH": str(tmp_path)})
    unknown = cockpit(slurm_cluster, "submit", "-w", "matmul", "-d", "cpu", "--partition", "no-such-partition")
    bad_time = cockpit(slurm_cluster, "submit", "-w", "matmul", "-d", "cpu", "--time", "an hour")
    nodes = cockpit(slurm_cluster, "submit", "-d", "cpu", "--set", "nnodes=2", "--", "python", "train.py")
    for done, words in ((no_sbatch, "sbatch: not found on PATH"),
                        (unknown, "sbatch: refused the job: "),
                        (bad_time, "--time: an hour: expected a SLURM time limit"),
                        (nodes, "a command workload runs one command")):
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and words in done.stderr and "Traceback" not in done.stderr
    assert "partition" in unknown.stderr.lower()
    assert not list((home / "runs").glob("*"))   # nothing written for bad input


@linux_only
def test_a_job_on_two_nodes_runs_a_node_supervisor_each_warned_requeued_and_resumed(home, slurm_cluster, jobs,
                                                                                   monkeypatch):
    """srun starts a node supervisor per node (here two tasks of the one-host cluster, its nodes
    as tasks: sbatch's options over the script's --nodes=2), meeting in torchrun's rendezvous at
    the job's first node; SLURM's warning to every task checkpoints the world at one step, the
    first task requeues the job, and both machines resume there: one run, no step lost."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    overrides = TINY + ["train.epochs=40", "train.checkpoint_every_steps=4", "nnodes=2", "inject=['slow@1']"]
    run = RunDir.create(runconfig.resolve("matmul", "cpu", overrides))
    job = engine_slurm.submit(run, engine_slurm.JobSpec(nodes=2), overrides=("--nodes=1", "--ntasks-per-node=2"))
    jobs.append(job)
    machines = [RunDir(run.path / "nodes" / name) for name in ("localhost-0", "localhost-1")]
    wait_until(lambda: all(m.events_path.exists() and any(e["type"] == "step" and e["step"] >= 2
                                                          for e in m.events()) for m in machines),
               "both machines training")
    assert all(of_type(m, "trainer_ready")[0]["nodes"] == 2 for m in machines)
    slurm(slurm_cluster, "scancel", "-s", "USR1", job)   # what --signal=USR1@S sends every task
    s = finished(slurm_cluster, run)
    assert s["status"] == "finished" and s["slurm"]["restarts"] == 1
    assert {m["name"] for m in s["nodes"]} == {"localhost-0", "localhost-1"}
    (step,) = {of_type(m, "attempt_ended")[0]["last_step"] for m in machines}   # the world's one step
    for m in machines:
        assert [e["outcome"] for e in of_type(m, "attempt_ended")] == ["stopped", "finished"]
        assert next(e for e in of_type(m, "trainer_ready") if e["attempt"] == 2)["resumed_from"]["step"] == step

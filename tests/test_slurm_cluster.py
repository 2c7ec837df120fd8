"""The one-node SLURM cluster of tools/slurm_cluster.py does what cockpit's SLURM work relies on,
against the real daemons: a batch job runs to COMPLETED (scontrol, and the jobcomp file, there
being no sacct), srun starts two tasks of one job, `scancel -b -s USR1` reaches a trap in the
batch shell (the warning signal of a time limit or a preemption, deterministic), and
`scontrol requeue` starts the job again with its id and SLURM_RESTART_COUNT=1.

Every wait is on a condition with a generous deadline; each test cancels its jobs and waits them
out, and the conftest guard checks that no process of theirs is left (they carry its mark: sbatch
exports the submitter's environment)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

WAIT_S = 120  # a job normally starts in under a second, a requeued one in about 12 s
ENDED = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE"}


def slurm(cluster, *args: str) -> str:
    done = subprocess.run(list(args), env={**os.environ, **cluster.env}, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}"
    return done.stdout


def job(cluster, job_id: str) -> dict[str, str]:
    """scontrol's fields of the job (JobState, Restarts, ExitCode, ...)."""
    return dict(re.findall(r"(\w+)=(\S*)", slurm(cluster, "scontrol", "-o", "show", "job", job_id)))


def wait_for(what: str, check, timeout: float = WAIT_S):
    """check()'s first truthy value; a failure naming `what` and the last value past timeout."""
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:.0f} s (last: {last!r})", pytrace=False)
        time.sleep(0.1)


def state_is(cluster, job_id: str, *states: str):
    return lambda: (fields := job(cluster, job_id))["JobState"] in states and fields


@contextmanager
def submitting(cluster):
    """A list to put job ids in; on the way out each is cancelled and waited out."""
    jobs: list[str] = []
    try:
        yield jobs
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], env={**os.environ, **cluster.env},
                           capture_output=True, timeout=60)
            for job_id in jobs:
                wait_for(f"end of job {job_id} after scancel",
                         lambda: job(cluster, job_id)["JobState"] in ENDED, timeout=60)


def sbatch(cluster, jobs: list[str], where: Path, body: str, *options: str) -> str:
    script = where / "job.sh"
    script.write_text("#!/bin/bash\n" + body)
    job_id = slurm(cluster, "sbatch", "--parsable", "-D", str(where), "-o", str(where / "out.%j"),
                   "--time=10", *options, str(script)).strip().split(";")[0]
    jobs.append(job_id)
    return job_id


def output(where: Path, job_id: str) -> str:
    path = where / f"out.{job_id}"
    return path.read_text() if path.exists() else ""


def test_a_batch_job_runs_to_completed(slurm_cluster, tmp_path):
    with submitting(slurm_cluster) as jobs:
        job_id = sbatch(slurm_cluster, jobs, tmp_path, 'echo "hello from $SLURM_JOB_ID on $SLURMD_NODENAME"\n')
        fields = wait_for(f"COMPLETED job {job_id}", state_is(slurm_cluster, job_id, *ENDED))
        assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", fields
        assert output(tmp_path, job_id) == f"hello from {job_id} on localhost\n"
        # without slurmdbd there is no sacct: a finished job is in the jobcomp file
        loc = re.search(r"JobCompLoc\s*=\s*(\S+)", slurm(slurm_cluster, "scontrol", "show", "config"))
        assert loc, "no JobCompLoc in scontrol show config"
        line = wait_for(f"job {job_id} in {loc.group(1)}", lambda: next(
            (line for line in Path(loc.group(1)).read_text().splitlines()
             if line.startswith(f"JobId={job_id} ")), None))
        assert "JobState=COMPLETED" in line and "ExitCode=0:0" in line, line


def test_srun_starts_two_tasks_of_one_job(slurm_cluster, tmp_path):
    with submitting(slurm_cluster) as jobs:
        job_id = sbatch(slurm_cluster, jobs, tmp_path,
                        "srun bash -c 'echo \"task $SLURM_PROCID of $SLURM_NTASKS in job $SLURM_JOB_ID\"'\n",
                        "--ntasks=2")
        fields = wait_for(f"end of job {job_id}", state_is(slurm_cluster, job_id, *ENDED))
        assert fields["JobState"] == "COMPLETED", (fields, output(tmp_path, job_id))
        assert sorted(output(tmp_path, job_id).splitlines()) == [
            f"task 0 of 2 in job {job_id}", f"task 1 of 2 in job {job_id}"]


def test_scancel_usr1_reaches_the_batch_shells_trap(slurm_cluster, tmp_path):
    # a bash trap runs once its foreground command returns: a backgrounded sleep and `wait`
    # let it run at once
    body = ('trap \'echo "USR1 in job $SLURM_JOB_ID"; exit 0\' USR1\n'
            'echo ready\n'
            'while true; do sleep 1 & wait $!; done\n')
    with submitting(slurm_cluster) as jobs:
        job_id = sbatch(slurm_cluster, jobs, tmp_path, body)
        wait_for(f"job {job_id}'s trap set", lambda: "ready" in output(tmp_path, job_id))
        slurm(slurm_cluster, "scancel", "--batch", "--signal=USR1", job_id)
        fields = wait_for(f"end of job {job_id} after USR1", state_is(slurm_cluster, job_id, *ENDED))
        assert output(tmp_path, job_id) == f"ready\nUSR1 in job {job_id}\n"
        assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", fields


def test_requeue_starts_the_job_again_with_its_id_and_restart_count(slurm_cluster, tmp_path):
    # each start appends a line to runs.txt; the first waits to be requeued, the second ends
    runs = tmp_path / "runs.txt"
    body = (f'echo "$SLURM_JOB_ID ${{SLURM_RESTART_COUNT:-0}}" >> {runs}\n'
            'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then\n'
            '  while true; do sleep 1 & wait $!; done\n'
            'fi\n')
    lines = lambda n: runs.exists() and len(text := runs.read_text().splitlines()) >= n and text  # noqa: E731
    with submitting(slurm_cluster) as jobs:
        job_id = sbatch(slurm_cluster, jobs, tmp_path, body, "--requeue")
        wait_for(f"first start of job {job_id}", lambda: lines(1))
        requeued = time.monotonic()
        slurm(slurm_cluster, "scontrol", "requeue", job_id)
        assert wait_for(f"second start of job {job_id} after scontrol requeue", lambda: lines(2)) == [
            f"{job_id} 0", f"{job_id} 1"]
        print(f"requeue -> started again: {time.monotonic() - requeued:.1f} s")
        fields = wait_for(f"end of job {job_id}", state_is(slurm_cluster, job_id, *ENDED))
        assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", fields

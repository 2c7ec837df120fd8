"""A run as a SLURM job: submitted once, one cockpit run across its requeues.

    cockpit submit -w W -d D [--time T --partition P --account A --gpus-per-node N] [-- CMD...]
        the run directory (on storage the compute node shares, as a cluster's home is), then
        RUN/slurm/job.sh, submitted with sbatch --requeue and a warning signal before the limit
    on the node, the batch shell runs `python -m engine.run.slurm RUN_DIR`:
        the supervisor, as `cockpit --no-ui` has it, continuing the run if it has begun
        the warning signal (USR1, `--signal=B:USR1@120`) or SIGTERM (preemption, scancel):
            the attempt is stopped gracefully (the trainer checkpoints at once), the run is
            "preempted", and the job is requeued (scontrol requeue: the same job id, its
            SLURM_RESTART_COUNT one more); the next start resumes from that checkpoint

SLURM's own tools are the boundary: sbatch, scontrol and squeue, as a cluster user types them;
cockpit writes the job script a person can read and resubmit by hand. submitit (which pickles a
Python callable and installs its own USR1 handler) was not used: the supervisor must own the
job's signals, and its job is a command, not a callable. Sources: sbatch(1) --signal and
--requeue; scontrol(1) requeue; slurm.schedmd.com/preempt.html (SIGTERM, then SIGKILL after
KillWait).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ConfigError
from engine.preset_types import SLURM_WARNING_S
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.run.launch import child_env
from engine.run.supervisor import Supervisor

WARNING_S = SLURM_WARNING_S   # the warning signal's lead on the time limit (a device preset's [slurm])
RECORD = "slurm.json"   # the job, beside run.toml: what `cockpit runs` asks SLURM about
JOB_STATES = {"PD": "pending", "R": "running", "CG": "completing", "CD": "completed", "F": "failed",
              "CA": "cancelled", "TO": "timed out", "PR": "preempted", "NF": "node failed",
              "RQ": "requeued", "RH": "requeued", "S": "suspended", "OOM": "out of memory"}


@dataclass(frozen=True)
class JobSpec:
    """What the job asks SLURM for: the device preset's [slurm], `cockpit submit`'s flags over it."""

    time: str = ""                # --time, e.g. 2:00:00 ('' : the partition's default)
    partition: str = ""
    account: str = ""
    gpus_per_node: int = 0
    warning_s: int = WARNING_S    # --signal=B:USR1@warning_s
    nodes: int = 1                # the device preset's nnodes (its MAX): a node supervisor each


def script(run: RunDir, spec: JobSpec) -> str:
    """The batch script: SLURM's directives, then the supervisor, exec'd so that the batch
    shell's signals (the warning, a preemption's SIGTERM) reach it."""
    slurm_dir = run.path.resolve() / "slurm"
    # On several nodes the warning goes to every node supervisor (srun's tasks: no B:), as
    # SLURM's SIGTERM does; on one, to the batch shell, which is the supervisor (exec).
    warning = f"USR1@{spec.warning_s}" if spec.nodes > 1 else f"B:USR1@{spec.warning_s}"
    lines = ["#!/bin/bash", f"#SBATCH --job-name=cockpit-{run.id}"[:200],
             f"#SBATCH --output={slurm_dir}/job-%j.out", "#SBATCH --requeue",
             f"#SBATCH --signal={warning}", f"#SBATCH --nodes={spec.nodes}",
             "#SBATCH --ntasks-per-node=1"]
    lines += [f"#SBATCH --{key}={value}" for key, value in
              (("time", spec.time), ("partition", spec.partition), ("account", spec.account))
              if value]
    if spec.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={spec.gpus_per_node}")
    env = child_env({})
    supervisor = f"{shlex.quote(sys.executable)} -P -m engine.run.slurm {shlex.quote(str(run.path.resolve()))}"
    lines += ["", "# cockpit's supervisor: it continues the run after a requeue",
              f"export PYTHONPATH={shlex.quote(env['PYTHONPATH'])}"]
    if spec.nodes > 1:
        # a node supervisor per node, over its torchrun agent (engine.run.launchers.node); a
        # machine lost is theirs to judge, not a reason for srun to end the others
        lines += ["# one node supervisor per node, meeting in torchrun's rendezvous",
                  f"exec srun --kill-on-bad-exit=0 {supervisor} --node", ""]
    else:
        lines += [f"exec {supervisor}", ""]
    return "\n".join(lines)


def submit(run: RunDir, spec: JobSpec, overrides: tuple[str, ...] = ()) -> str:
    """Write the job script and submit it; returns the job id. ConfigError (one line) when
    sbatch is missing or refuses (an unknown partition, munge down...). `overrides`: sbatch
    options over the script's #SBATCH lines (a cluster on one host: its nodes as tasks)."""
    if any(c.isspace() for c in str(run.path.resolve())):
        raise ConfigError("--runs-dir", str(run.path.parent), "has a space in its path, which a "
                          "job script's #SBATCH lines cannot hold; expected a path without one")
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise ConfigError("sbatch", None, "not found on PATH: cockpit submit needs a SLURM client "
                                          "(run it on the cluster's login node)")
    slurm_dir = run.path / "slurm"
    slurm_dir.mkdir(exist_ok=True)
    job = slurm_dir / "job.sh"
    job.write_text(script(run, spec))
    job.chmod(0o755)
    try:
        done = subprocess.run([sbatch, "--parsable", *overrides, str(job)], capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise ConfigError("sbatch", None, "did not answer in 60 s: is slurmctld reachable from "
                                          "here? (scontrol ping)") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError("sbatch", None, f"refused the job: {said[-1] if said else f'exit {done.returncode}'}")
    job_id = done.stdout.strip().split(";")[0]
    (run.path / RECORD).write_text(json.dumps({"job_id": job_id, "script": str(job),
                                               "submitted": time.time()}) + "\n")
    return job_id


def record_of(run: RunDir) -> dict | None:
    """slurm.json: the run's job, or None for a run that is not a SLURM job."""
    return run.read_record(RECORD)


def state_of(run: RunDir) -> dict | None:
    """A SLURM run's job as SLURM says it now: {"job_id", "state", "restarts", "reason"}; None
    for a run that is not a SLURM job. Restarts are the run's own count where SLURM has
    forgotten the job."""
    job = record_of(run)
    if job is None:
        return None
    found = job_state(str(job.get("job_id")))
    if found["restarts"] is None:   # forgotten by SLURM: the starts the run recorded
        found["restarts"] = max([e.get("restarts", 0) for e in run.events() if e["type"] == "slurm_job"],
                                default=0)
    return {"job_id": str(job.get("job_id")), **found}


def job_state(job_id: str) -> dict:
    """What SLURM says of the job now: {"state", "restarts", "reason"}; state "unknown" once
    SLURM has forgotten it (MinJobAge) or cannot be asked."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return {"state": "unknown", "restarts": None, "reason": "no scontrol on PATH"}
    try:
        done = subprocess.run([scontrol, "-o", "show", "job", job_id], capture_output=True,
                              text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"state": "unknown", "restarts": None, "reason": str(e)}
    fields = dict(item.partition("=")[::2] for item in done.stdout.split() if "=" in item)
    if done.returncode != 0 or "JobState" not in fields:
        return {"state": "unknown", "restarts": None, "reason": (done.stderr or "").strip()}
    state = fields["JobState"].lower().replace("_", " ")
    return {"state": state, "restarts": int(fields.get("Restarts", "0") or 0),
            "reason": fields.get("Reason", "None")}


def cancel(job_id: str) -> None:
    """`scancel JOB`: SIGTERM to the job, which its supervisor stops gracefully, not requeued.
    ConfigError (one line) where SLURM cannot be asked or refuses."""
    scancel = shutil.which("scancel")
    if scancel is None:
        raise ConfigError("scancel", None, "not found on PATH: the run is a SLURM job; expected "
                                           "a SLURM client here (a login node)")
    done = subprocess.run([scancel, job_id], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise ConfigError("scancel", job_id, (done.stderr or done.stdout).strip() or f"exit {done.returncode}")


# ---------------------------------------------------------------- on the node


class JobRun:
    """The supervisor of a run inside its SLURM job. SIGUSR1, the warning before the time limit
    (or `--inject preempt@N`), stops the attempt gracefully and requeues the job. SIGTERM is
    SLURM ending the job: a preemption (SLURM requeues the job itself, where the cluster
    preempts by requeueing) ends the run "preempted"; anything else (`scancel`) "stopped", as
    `cockpit runs stop` would, and the job is not requeued."""

    def __init__(self, run: RunDir):
        self.run = run
        self.job_id = os.environ.get("SLURM_JOB_ID", "")
        self.restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
        self.supervisor = Supervisor(run, signals={signal.SIGUSR1: self.warned,
                                                   signal.SIGTERM: self.terminated},
                                     begun=self._begun)
        self._requeued_by_slurm = False
        self._warned_at = time.time()   # when this supervisor's time here began to end

    def _begun(self) -> None:
        """The job, once this supervisor holds the run (a job started by hand beside a live one
        writes nothing into it)."""
        self.supervisor.events.emit("slurm_job", job_id=self.job_id, restarts=self.restarts,
                                    node=os.environ.get("SLURMD_NODENAME", ""),
                                    nodes=int(os.environ.get("SLURM_JOB_NUM_NODES", "1") or 1))

    def supervise(self) -> str:
        status = self.supervisor.supervise()
        if status == "preempted" and not self._requeued_by_slurm:
            self._requeue()
        return status

    def warned(self) -> None:
        """SLURM's warning (`--signal=B:USR1@S`): the attempt stops gracefully (it checkpoints)
        and the job is requeued once the supervisor is done."""
        if self.supervisor.preempted is None:
            self._warned_at = time.time()
        self.supervisor.preempt("SIGUSR1")

    def terminated(self) -> None:
        """SIGTERM: a preemption, which SLURM requeues itself; the job cancelled; or, while SLURM
        says the job runs, a stop asked of this supervisor alone (`cockpit runs stop` or the TUI
        on this machine). SLURM's own reaches every process of the job, the attempt's too: the
        supervisor does not send another (to the trainer, a second SIGTERM is 'stop now, no
        checkpoint')."""
        state = job_state(self.job_id)
        if state["state"] in ("preempted", "requeued", "pending") or "preempt" in state["reason"].lower():
            if self.supervisor.preempted is None:
                self._warned_at = time.time()
            self._requeued_by_slurm = True
            self.supervisor.preempt(f"SIGTERM ({state['state']})", delivered=True)
        elif state["state"] == "running":
            self.supervisor.request_stop()
        else:
            self.supervisor.stop_delivered()

    def _requeue(self) -> None:
        """The same job again, SLURM_RESTART_COUNT one more; a requeue refused is a warning in
        the run (its next start is then the user's: `cockpit runs resume`). On several nodes,
        the first task's supervisor asks for it, once."""
        if os.environ.get("SLURM_PROCID", "0") != "0":
            return
        self._wait_for_the_other_nodes()
        try:
            done = subprocess.run(["scontrol", "requeue", self.job_id], capture_output=True,
                                  text=True, timeout=60)
            failed = ((done.stderr or done.stdout).strip() or f"exit {done.returncode}") \
                if done.returncode != 0 else None
        except (OSError, subprocess.TimeoutExpired) as e:
            failed = str(e)
        if failed is not None:
            with EventWriter(self.run.events_path, attempt=0) as events:
                events.emit("warning", kind="slurm-requeue", fallback=False, advice=[
                    {"text": f"cockpit runs resume {self.run.id}"}],
                    message=f"scontrol requeue {self.job_id} failed ({failed}): the run will not "
                            "start again by itself")


    def _wait_for_the_other_nodes(self, timeout_s: float = 90.0) -> None:
        """On several nodes, until every other node's supervisor has ended its run here (each
        checkpointing at the world's one step): a requeue ends the job's processes at once, and
        one still stopping would be killed mid-stop. At most `timeout_s` (SLURM's KillWait is
        30 s by default: a node gone quiet is not waited for past it)."""
        from engine.record import nodes

        others = nodes.siblings(self.run)
        deadline = time.monotonic() + timeout_s
        while others and time.monotonic() < deadline:
            others = [n for n in others if not any(
                e.get("type") == "run_finished" and e.get("t", 0) >= self._warned_at - 1
                for e in (n.events() if n.events_path.exists() else ()))]
            if others:
                time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) > 2 or args[1:] not in ([], ["--node"]):
        print("usage: python -m engine.run.slurm RUN_DIR [--node]  (the batch script cockpit "
              "submit wrote)", file=sys.stderr)
        return 2
    try:
        run = RunDir(Path(args[0]))
        status = JobRun(node_of(run) if args[1:] else run).supervise()
    except ConfigError as e:
        print(f"cockpit: {e.line()}", file=sys.stderr)
        return 2
    # a stop the user asked for is not the job failing (SLURM would say FAILED)
    return {"finished": 0, "preempted": 0, "stopped": 0}.get(status, 1)


def node_of(run: RunDir) -> RunDir:
    """This task's node directory of a run on several nodes (engine.record.nodes), named for its
    node (and its task, where a node runs several: a cluster on one host), the rendezvous at
    the job's first node where the device preset names none. Its port follows the job id, so
    that two jobs sharing a node do not meet."""
    from engine.record import nodes

    name = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    if os.environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0] not in ("", "1"):
        name += f"-{os.environ.get('SLURM_LOCALID', '0')}"
    config = run.config()
    if not config.device.rdzv_endpoint:
        first = first_node()
        endpoint = f"{first}:{29400 + int(os.environ.get('SLURM_JOB_ID', '0') or 0) % 1000}"
        config = dataclasses.replace(config, device=dataclasses.replace(config.device, rdzv_endpoint=endpoint))
    return nodes.join(config, run.id, name, root=run.path.parent)


def first_node() -> str:
    """The job's first node, where the rendezvous is (scontrol expands SLURM_JOB_NODELIST)."""
    listed = os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", listed], capture_output=True,
                              text=True, timeout=60)
        hosts = done.stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        hosts = []
    if not hosts:
        raise ConfigError("SLURM_JOB_NODELIST", listed or None, "names no node scontrol can expand; "
                          "expected to run inside the job cockpit submit wrote")
    return "127.0.0.1" if hosts[0] == "localhost" else hosts[0]


if __name__ == "__main__":
    sys.exit(main())

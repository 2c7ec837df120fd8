"""`cockpit submit`: a run as a SLURM job (engine.run.slurm), from a login node.

    cockpit submit -w W -d D [--time 2:00:00 --partition P --account A] [--set K=V] [--inject ...]
    cockpit submit -d cuda [...] -- python train.py --bs {batch_size}

The job's settings are the device preset's [slurm] table (engine.preset_types.SlurmSettings:
time, partition, account, gpus_per_node, warning_s), each flag given overriding its key; the
run's run.toml records them as the job asked for them.

The run directory is made here, under the runs directory the compute nodes share (a cluster's
home or scratch: --runs-dir or COCKPIT_RUNS_DIR); the job's batch script runs cockpit's
supervisor there. It prints the run id and the job id; `cockpit runs show RUN` says the job's
state as SLURM has it.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys

from engine import command, presets, runconfig, settings
from engine.errors import ConfigError
from engine.preset_types import DevicePreset, SlurmSettings
from engine.record.rundir import RunDir
from engine.run import slurm

# each flag (its argparse dest) and the key of the device preset's [slurm] it overrides
FLAGS = {"time": "time", "partition": "partition", "account": "account",
         "gpus_per_node": "gpus_per_node", "warning": "warning_s"}


def add_parser(sub) -> None:
    q = sub.add_parser("submit", help="run a workload, or your command after --, as a SLURM job "
                                      "that survives its time limit and preemption",
                       description="Submit a run as a SLURM batch job: sbatch --requeue with a "
                                   "warning signal before the time limit. On the warning (or a "
                                   "preemption's SIGTERM) the attempt checkpoints and the job is "
                                   "requeued; it continues from that checkpoint, one cockpit run "
                                   "across requeues.")
    q.add_argument("--workload", "-w", default="matmul", metavar="W", help="workload preset (default: matmul)")
    q.add_argument("--device", "-d", default="auto", metavar="D", help="device preset (default: auto)")
    q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting (repeatable)")
    q.add_argument("--inject", action="append", default=[], metavar="KIND@STEP",
                   help="rehearse a fault, as cockpit --no-ui does; preempt@N: SLURM's warning at "
                        "step N (the job checkpoints, is requeued and resumes)")
    q.add_argument("--name", metavar="N", help="a command's run name (default: the script's name)")
    # each default: the device preset's [slurm] key, else its own default
    q.add_argument("--time", metavar="T", help="the job's time limit (sbatch --time: 90, 2:00:00, "
                                               "1-12; default: the device preset's slurm.time)")
    q.add_argument("--partition", "-p", metavar="P",
                   help="sbatch --partition (default: the device preset's slurm.partition)")
    q.add_argument("--account", "-A", metavar="A",
                   help="sbatch --account (default: the device preset's slurm.account)")
    q.add_argument("--gpus-per-node", type=int, metavar="N",
                   help="sbatch --gpus-per-node (default: the device preset's slurm.gpus_per_node; "
                        "'auto' there: nproc_per_node on cuda, else none)")
    q.add_argument("--warning", type=int, metavar="S",
                   help="seconds before the time limit that SLURM warns the job (default: the "
                        f"device preset's slurm.warning_s, else {slurm.WARNING_S})")
    q.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                   help="your command and its arguments, after --")
    q.set_defaults(handler=submit)


def submit(args: argparse.Namespace) -> int:
    settings.load()
    problem = SlurmSettings.time_problem(args.time or "")
    if problem:
        raise ConfigError("--time", args.time, problem)
    if args.warning is not None and args.warning < 1:
        raise ConfigError("--warning", str(args.warning), "expected seconds >= 1")
    if args.gpus_per_node is not None and args.gpus_per_node < 0:
        raise ConfigError("--gpus-per-node", str(args.gpus_per_node), "expected 0 or more")
    overrides = list(args.set) + ([runconfig.inject_override(args.inject)] if args.inject else [])
    argv = args.cmd[1:] if args.cmd[:1] == ["--"] else list(args.cmd)
    if argv:
        name = args.name or command.name_for(argv)
        if not presets.NAME_PATTERN.match(name):
            raise ConfigError("--name", None, f"got {name!r}; expected letters, digits, '.', '_', '-'")
        config = runconfig.resolve_command(argv, name, args.device, overrides)
    else:
        config = runconfig.resolve(args.workload, args.device, overrides)
    # the job's settings, in run.toml as it asks for them: the preset's [slurm], the flags over it
    config = dataclasses.replace(config, device=dataclasses.replace(
        config.device, slurm=job_settings(args, config.device.slurm)))
    spec = job_spec(config.device)
    run = RunDir.create(config)
    try:
        job_id = slurm.submit(run, spec)
    except ConfigError:
        shutil.rmtree(run.path, ignore_errors=True)   # nothing was submitted: no run to list
        raise
    print(run.id, flush=True)
    print(f"submitted job {job_id}; follow it: cockpit runs follow {run.id}   its state: "
          f"cockpit runs show {run.id}", file=sys.stderr)
    return 0


def job_settings(args: argparse.Namespace, preset: SlurmSettings) -> SlurmSettings:
    """The device preset's [slurm] with each flag given in place of its key."""
    given = {key: getattr(args, flag) for flag, key in FLAGS.items() if getattr(args, flag) is not None}
    return dataclasses.replace(preset, **given)


def job_spec(device: DevicePreset) -> slurm.JobSpec:
    """What the job asks SLURM for, from a device preset's [slurm]: gpus_per_node 'auto' is a
    GPU per process on cuda, none elsewhere."""
    job = device.slurm
    gpus = job.gpus_per_node if isinstance(job.gpus_per_node, int) else \
        device.nproc_per_node if device.device == "cuda" else 0
    return slurm.JobSpec(time=job.time, partition=job.partition, account=job.account,
                         gpus_per_node=gpus, warning_s=job.warning_s, nodes=device.nodes[1])

"""A run on several machines: one run directory on shared storage, a node directory per machine.

    <runs>/<run id>/
        run.toml          the run's configuration, as the first machine to arrive wrote it
        checkpoints/      the run's, written by global rank 0 wherever it runs
        nodes/<node>/     a run directory of its own per machine (engine.record.rundir): its
                          supervisor's events, attempts, logs and lock, and its own run.toml (a
                          machine's --inject is its own); checkpoints -> ../../checkpoints

Each machine runs `cockpit --no-ui --node NAME --run-id RUN ...`: a node supervisor over its own
torchrun agent (engine.run.launchers.node), the agents meeting in torchrun's c10d rendezvous.
Why a directory per node and not one events.jsonl: the machines share the run over NFS or
Lustre, where appends from two hosts interleave or tear (O_APPEND is not atomic across NFS
clients) and flock may not reach across hosts. Each supervisor writes only its own directory,
so nothing is written by two machines but the checkpoints, and those by one rank at a time;
every reader (`cockpit runs show`, the TUI) gathers the nodes from the files. Torch-free.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine import files, paths
from engine.errors import ConfigError
from engine.record.rundir import RunDir
from engine.runconfig import RunConfig

if TYPE_CHECKING:
    from engine.record.rundir import RunSummary

NODES = "nodes"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def join(config: RunConfig, run_id: str, node: str, root: Path | None = None) -> RunDir:
    """This machine's node directory of run `run_id`, made where it is new: the run's directory
    too, for the first machine to arrive. A node that comes back (its host restarted, the
    cockpit on it run again) continues its own directory. ConfigError (one line) for a name
    that is no directory's, a run another machine started with another workload or world."""
    for what, value in (("--run-id", run_id), ("--node", node)):
        if not NAME.fullmatch(value):
            raise ConfigError(what, value, "expected letters, digits, '.', '_' or '-' (at most 64, "
                                           "starting with a letter or digit)")
    root = Path(root) if root else paths.runs_dir()
    run = RunDir(root / run_id)
    try:
        (run.path / NODES).mkdir(parents=True, exist_ok=True)
        run.checkpoints.mkdir(exist_ok=True)
    except OSError as e:
        raise ConfigError(f"runs directory {root}", None,
                          f"is not writable ({e.strerror}); set --runs-dir or COCKPIT_RUNS_DIR") from None
    table = files.dump_toml(config.to_table())
    if not _write_new(run.config_path, table):
        _check_same_run(run, config)
    here = RunDir(run.path / NODES / node)
    here.path.mkdir(exist_ok=True)
    files.atomic_write(here.config_path, table)
    link = here.checkpoints
    if not link.is_symlink() and not link.exists():
        link.symlink_to(Path("..") / ".." / run.checkpoints.name)
    return here


def _write_new(path: Path, data: bytes) -> bool:
    """Write `path` unless it exists, atomically (the file appears whole or not at all) and
    without a race between two machines arriving at once: a hard link fails where it is."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    temporary.write_bytes(data)
    try:
        os.link(temporary, path)
        return True
    except FileExistsError:
        return False
    finally:
        temporary.unlink(missing_ok=True)


def _check_same_run(run: RunDir, config: RunConfig) -> None:
    """The machines of one run train one workload on one world: a machine started with another
    is a mistake to say before its agent joins the others' rendezvous."""
    first = run.config()
    for what, mine, theirs in (("workload", config.workload_preset, first.workload_preset),
                               ("nnodes", config.device.nnodes, first.device.nnodes),
                               ("nproc_per_node", config.device.nproc_per_node, first.device.nproc_per_node),
                               ("rdzv_endpoint", config.device.rdzv_endpoint, first.device.rdzv_endpoint)):
        if mine != theirs and theirs != "":   # '': a SLURM job's, filled in on its nodes
            raise ConfigError("--run-id", run.id, f"is a run whose {what} is {theirs!r} (its run.toml), "
                                                  f"this machine's is {mine!r}; expected the same on "
                                                  "every machine of a run")


def run_of(node: RunDir) -> RunDir | None:
    """The run a node directory belongs to; None for a run of one machine."""
    parent = node.path.parent
    return RunDir(parent.parent) if parent.name == NODES and (parent.parent / "run.toml").exists() else None


def nodes_of(run: RunDir) -> list[RunDir]:
    """A run's node directories, by name; [] for a run of one machine."""
    where = run.path / NODES
    if not where.is_dir():
        return []
    return sorted((RunDir(p) for p in where.iterdir() if (p / "run.toml").exists()), key=lambda r: r.id)


def siblings(node: RunDir) -> list[RunDir]:
    """The run's other machines."""
    run = run_of(node)
    return [n for n in nodes_of(run) if n.path.name != node.path.name] if run is not None else []


def lost_itself(event: dict, name: str) -> bool:
    """The event is machine `name`'s supervisor saying that its own machine was lost."""
    return (event.get("type") == "crash" and event.get("kind") == "node-lost"
            and (event.get("evidence") or {}).get("machine") == name)


@dataclass
class NodeView:
    """One machine of a run, as its directory says: what `cockpit runs show` lists per node."""

    name: str
    host: str | None            # the machine its supervisor runs on
    status: str                 # its supervisor's run status (running, finished, failed...)
    step: int
    nodes: int | None           # machines in the world it trains in now (its last trainer_ready)
    world_size: int | None
    rank: int | None            # its speaker's global rank: 0 writes the run's checkpoints
    samples_per_s: float | None
    rss: int | None             # the newest memory sample of its processes, bytes
    last_event: float | None    # unix time
    lost: str | None            # the newest node-lost crash's sentence, on this machine
    attempts: int

    def as_dict(self) -> dict:
        return dict(vars(self))


def view(node: RunDir) -> NodeView:
    """One node's figures from its own events (one read)."""
    from engine.record.rundir import summarize

    summary = summarize(node)
    nodes = world = rank = rss = None
    lost = None
    for e in node.events():
        kind = e.get("type")
        if kind == "trainer_ready":
            nodes, world, rank = e.get("nodes"), e.get("world_size"), e.get("rank")
        elif kind == "memory":
            rss = e.get("rss") if e.get("rss") is not None else rss
        elif kind == "crash" and e.get("kind") == "node-lost":
            lost = e.get("sentence")
    host = None
    try:
        host = (node.path / "supervisor.host").read_text().strip() or None
    except OSError:
        pass
    return NodeView(name=node.path.name, host=host, status=summary.status, step=summary.step,
                    nodes=nodes, world_size=world, rank=rank,
                    samples_per_s=summary.window_samples_per_s or summary.samples_per_s,
                    rss=rss, last_event=summary.last_event, lost=lost, attempts=len(summary.attempts))


def gathered(run: RunDir, members: list[RunDir]) -> "RunSummary":
    """A run on several machines as one: the figures of the machine whose speaker is global rank
    0 (it writes the checkpoints and evals), the status of them all -- running while any machine
    trains, else the worst of their ends."""
    from engine.record.rundir import summarize

    views = [(m, summarize(m)) for m in members]
    lead = next((s for m, s in views if _rank_of(m) == 0), views[0][1])
    statuses = {s.status for _, s in views}
    status = next((st for st in ("running", "lost", "failed", "interrupted", "stopped", "preempted")
                   if st in statuses), lead.status)
    return dataclasses.replace(lead, id=run.id, status=status)


def _rank_of(node: RunDir) -> int | None:
    rank = None
    for e in node.events():
        if e.get("type") == "trainer_ready":
            rank = e.get("rank")
    return rank

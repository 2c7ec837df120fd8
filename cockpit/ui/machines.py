"""A run on several machines as the TUI reads it: which machine's dashboard to show, each
machine's figures for the machines panel, and the run's status for the runs screen.

The layout is engine.record.nodes's: RUNS/<run>/nodes/<node>/ is a run directory per machine,
and the run's own directory has no events.jsonl. A dashboard follows the lead machine's (the
one whose newest trainer_ready has global rank 0: it writes the run's checkpoints and evals;
else the first by name) and shows the others in its machines panel; the runs screen lists the
run with its machines' status gathered (engine.record.nodes.gathered's rule).

nodes.view() reads a machine's whole events file; a dashboard refreshing every few seconds on a
five-hour run cannot, so each machine here is a digest (engine.record.digest): one stat for a
machine whose events did not grow, its new lines only for one whose did. No Textual here.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

from engine.record import nodes
from engine.record.digest import RunDigest
from engine.record.nodes import NodeView
from engine.record.rundir import RunDir, RunSummary
from engine.record.stats import Averages
from engine.run import detached

# nodes.gathered's rule: running while any machine trains, else the worst of their ends
GATHERED_STATUS = ("running", "lost", "failed", "interrupted", "stopped", "preempted")


def several(run: RunDir) -> bool:
    """`run` is the top directory of a run on several machines (summarize()'s test)."""
    return not run.events_path.exists() and bool(nodes.nodes_of(run))


class MachineDigest(RunDigest):
    """One machine of the run: its summary (RunDigest's) and what nodes.view() reads besides --
    the world of its newest trainer_ready, its newest memory sample, its newest node-lost --
    folded as its events are appended."""

    def _start_over(self) -> None:
        super()._start_over()
        self.nodes: int | None = None
        self.world_size: int | None = None
        self.rank: int | None = None
        self.rss: int | None = None
        self.lost: str | None = None

    def _add(self, e: dict) -> None:
        super()._add(e)
        kind = e.get("type")
        if kind == "trainer_ready":
            self.nodes, self.world_size, self.rank = e.get("nodes"), e.get("world_size"), e.get("rank")
        elif kind == "memory" and e.get("rss") is not None:
            self.rss = e["rss"]
        elif kind == "crash" and e.get("kind") == "node-lost":
            self.lost = e.get("sentence")

    def view(self) -> NodeView:
        """nodes.view(node)'s figures, as of the last refresh()."""
        s = self.summarized
        try:
            host = (self.run.path / "supervisor.host").read_text().strip() or None
        except (OSError, UnicodeDecodeError):
            host = None
        return NodeView(name=self.run.path.name, host=host, status=s.status, step=s.step,
                        nodes=self.nodes, world_size=self.world_size, rank=self.rank,
                        samples_per_s=s.window_samples_per_s or s.samples_per_s, rss=self.rss,
                        last_event=s.last_event, lost=self.lost, attempts=len(s.attempts))


class Machines:
    """The machines of one run on several (its top directory), kept between looks; a machine
    that joins later is read from its first look. Thread-safe: a worker thread refreshes it."""

    def __init__(self, run: RunDir):
        self.run = run
        self._digests: dict[Path, MachineDigest] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, run: RunDir) -> "Machines | None":
        """For the top directory of a run on several machines; None for a run of one."""
        return cls(run) if several(run) else None

    def refresh(self) -> list[MachineDigest]:
        """Each machine's digest, by name, with what was appended since the last look read."""
        with self._lock:
            members = nodes.nodes_of(self.run)
            self._digests = {m.path: self._digests.get(m.path) or MachineDigest(m) for m in members}
            digests = [self._digests[m.path] for m in members]
            for d in digests:
                d.refresh()
            return digests

    def views(self) -> list[NodeView]:
        return [d.view() for d in self.refresh()]

    def summary(self) -> tuple[RunSummary, Averages] | None:
        """The run as one (nodes.gathered: the lead's figures -- the machine whose speaker is
        global rank 0, else the first -- under the run's id, the status of them all) and the
        lead's averages; None once it has no machine (its directory removed meanwhile)."""
        digests = self.refresh()
        if not digests:
            return None
        lead = next((d for d in digests if d.rank == 0), digests[0])
        statuses = {d.summarized.status for d in digests}
        status = next((st for st in GATHERED_STATUS if st in statuses), lead.summarized.status)
        return dataclasses.replace(lead.summarized, id=self.run.id, status=status), lead.averages

    def supervised(self) -> bool:
        """A supervisor works on one of its machines (here, or on another host)."""
        return any(member.supervised() for member in nodes.nodes_of(self.run))


def shown(run: RunDir) -> tuple[RunDir, Machines | None]:
    """The directory a dashboard of `run` follows, and the machines of its run (None for a run
    of one machine): the lead machine's for a run's top directory, a machine's own where one is
    asked for."""
    whole = nodes.run_of(run)
    if whole is not None:
        return run, Machines(whole)
    members = nodes.nodes_of(run) if not run.events_path.exists() else []
    if not members:
        return run, None
    return next((m for m in members if _newest_rank(m) == 0), members[0]), Machines(run)


def _newest_rank(node: RunDir) -> int | None:
    """The global rank its newest trainer_ready names. Asked as a dashboard opens, on the UI
    thread: only the lines that mention trainer_ready are parsed (a five-hour run's events are
    read in milliseconds, not folded in seconds)."""
    rank = None
    try:
        with open(node.events_path, "rb") as f:
            for line in f:
                if b"trainer_ready" not in line:
                    continue
                try:
                    e = json.loads(line)
                except ValueError:   # a line being written, or torn
                    continue
                if isinstance(e, dict) and e.get("type") == "trainer_ready":
                    rank = e.get("rank")
    except OSError:
        pass
    return rank


class GatheredRuns:
    """A screen's runs on several machines, each one's Machines kept between its refreshes."""

    def __init__(self) -> None:
        self._runs: dict[Path, Machines] = {}
        self._lock = threading.Lock()

    def machines(self, run: RunDir) -> Machines | None:
        """The run's machines where it runs on several (a run whose events the digest found none
        of: a directory listing, else nothing)."""
        with self._lock:
            found = self._runs.get(run.path)
            if found is None and (found := Machines.of(run)) is not None:
                self._runs[run.path] = found
            return found

    def forget(self, keep: set[Path]) -> None:
        with self._lock:
            for gone in set(self._runs) - keep:
                del self._runs[gone]


def stop(run: RunDir) -> list[str]:
    """Ask the supervisors of the run's machines to stop (those on this host; a SLURM job's
    through its job): the names of those asked. The others stop at the same step, through the
    trainer's stop agreement (what `cockpit runs stop` does)."""
    return [member.path.name for member in nodes.nodes_of(run) if detached.request_stop(member)]

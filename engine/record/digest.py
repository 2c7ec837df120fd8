"""A run's summary, averages and (if asked) curves, kept current by reading only what was
appended to its events since the last look.

Summarizing a five-hour run reads about 50,000 events (20 MB, a second of CPU here); a screen
that lists runs and refreshes every few seconds cannot do that each time. A digest reads the
file once, then each `refresh()` costs a stat for a run that did not change, and the new lines
only for one that did. It keeps what summarize() needs of the events -- all but the memory
samples, and of each stretch of step events only the newest (the summary keeps the last
step's figures; its whole-run figures come from the digest's own fold of every event) -- so
it stays small however long the run.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

from engine.record.curves import CurveFold, RunCurves
from engine.record.events import EventFollower
from engine.record.rundir import UNREADABLE, RunDir, RunSummary, broken, list_runs, summarize
from engine.record.stats import Averages, RunStats


class _SoFar(RunDir):
    """The run dir as summarize() sees it: its events are the digest's, not a fresh read.
    Private to the digest: anything else handed a RunDir gets a plain one."""

    def __init__(self, path: Path, kept: list[dict]):
        super().__init__(path)
        self._kept = kept

    def events(self) -> list[dict]:
        return self._kept


class RunDigest:
    def __init__(self, run: RunDir, *, curves: bool = False):
        self.run = run
        self.summary: RunSummary | None = None
        self._want_curves = curves
        self._start_over()

    def _start_over(self) -> None:
        self._follower = EventFollower(self.run.events_path)
        self._kept: list[dict] = []
        self._stats = RunStats()
        self._curves = CurveFold() if self._want_curves else None
        self._seen: tuple | None = None   # (events size, run.toml mtime) at the last look

    @property
    def averages(self) -> Averages:
        return self._stats.result()

    @property
    def curves(self) -> RunCurves | None:
        return self._curves.curves if self._curves is not None else None

    def refresh(self) -> bool:
        """Read what was appended; True if the summary may have changed. A running run is
        summarized again each time: its supervisor can die without writing a line."""
        seen = (_size(self.run.events_path), _mtime(self.run.config_path))
        if seen[0] < self._follower.offset:   # the file was replaced, not appended to
            self._start_over()
        changed = seen != self._seen or self.summary is None
        try:
            if changed:
                for e in self._follower.poll():
                    self._add(e)
                self._seen = seen
            if changed or self.summary is None or self.summary.status == "running":
                self.summary = self._summarize()
                return True
        except UNREADABLE as e:
            # Broken, as summarize() would say, so the runs beside it are still listed. What was
            # folded so far is dropped: the next change to the run reads it again from the start.
            self._start_over()
            self._seen = seen
            self.summary = broken(self.run, e)
            return True
        return False

    def _summarize(self) -> RunSummary:
        """summarize() over the kept events; the whole-run figures it shares with the averages
        (throughput, time training, steps lost) and the goodput from the digest's own fold, which saw every
        step, and the newest event's time from every event, memory samples too."""
        summary = summarize(_SoFar(self.run.path, self._kept))
        if summary.status == "broken":
            return summary
        whole = self._stats.result()
        names = {f.name for f in dataclasses.fields(summary)}
        for f in dataclasses.fields(whole):
            if f.name in names:
                setattr(summary, f.name, getattr(whole, f.name))
        if "last_event" in names:
            summary.last_event = self._stats.last_t
        summary.goodput = self._stats.goodput().as_dict()   # the kept events time too little
        return summary

    def _add(self, e: dict) -> None:
        self._stats.add(e)
        if self._curves is not None:
            self._curves.add(e)
        kind = e.get("type")
        if kind == "memory":
            return
        last = self._kept[-1] if self._kept else None
        if kind == "step" and last is not None and last.get("type") == "step":
            self._kept[-1] = e   # only the newest step of a stretch counts for the summary
        else:
            self._kept.append(e)


class RunDigests:
    """Digests of every run in a runs dir, newest first, for a screen that refreshes: a run
    that disappeared is forgotten. Thread-safe, so a worker thread can refresh it."""

    def __init__(self, root: Path | None = None):
        self.root = root
        self._digests: dict[Path, RunDigest] = {}
        self._lock = threading.Lock()

    def refresh(self) -> list[RunDigest]:
        with self._lock:
            runs = list_runs(self.root)
            self._digests = {r.path: self._digests.get(r.path) or RunDigest(r) for r in runs}
            digests = [self._digests[r.path] for r in runs]
            for d in digests:
                d.refresh()
            return digests


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _mtime(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None

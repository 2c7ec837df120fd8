"""A run's summary, averages and (if asked) curves, kept current by reading only what was
appended to its events since the last look.

Summarizing a five-hour run reads about 50,000 events (20 MB, a second of CPU here); a screen
that lists runs and refreshes every few seconds cannot do that each time. A digest reads the
file once, then each `refresh()` costs a stat for a run that did not change, and the new lines
only for one that did. It folds them into the run's read model (engine.record.state), which
summarize() folds too, so its summary is summarize()'s; it stays small however long the run.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from engine.record.curves import CurveFold, RunCurves
from engine.record.events import EventFollower, file_size
from engine.record.rundir import UNREADABLE, RunDir, RunSummary, broken, list_runs, summary_of
from engine.record.state import RunState, require
from engine.record.stats import Averages


class RunDigest:
    def __init__(self, run: RunDir, *, curves: bool = False):
        self.run = run
        self.summary: RunSummary | None = None
        self._want_curves = curves
        self._start_over()

    def _start_over(self) -> None:
        self._follower = EventFollower(self.run.events_path)
        self.state = RunState()
        self._curves = CurveFold() if self._want_curves else None
        self._seen: tuple | None = None   # (events size, run.toml mtime) at the last look

    @property
    def summarized(self) -> RunSummary:
        """The summary as of the last refresh(): a reader refreshes before it reads."""
        assert self.summary is not None, "refresh() the digest first"
        return self.summary

    @property
    def averages(self) -> Averages:
        return self.state.averages

    @property
    def curves(self) -> RunCurves | None:
        return self._curves.curves if self._curves is not None else None

    def refresh(self) -> bool:
        """Read what was appended; True if the summary may have changed. A running run is
        summarized again each time: its supervisor can die without writing a line."""
        seen = (file_size(self.run.events_path), _mtime(self.run.config_path))
        if seen[0] < self._follower.offset:   # the file was replaced, not appended to
            self._start_over()
        changed = seen != self._seen or self.summary is None
        try:
            if changed:
                for e in self._follower.poll():
                    self._add(e)
                self._seen = seen
            if changed or self.summary is None or self.summary.status == "running":
                self.summary = summary_of(self.run, self.state)
                return True
        except UNREADABLE as e:
            # Broken, as summarize() would say, so the runs beside it are still listed. What was
            # folded so far is dropped: the next change to the run reads it again from the start.
            self._start_over()
            self._seen = seen
            self.summary = broken(self.run, e)
            return True
        return False

    def _add(self, e: dict) -> None:
        self.state.add(require(e))
        if self._curves is not None:
            self._curves.add(e)


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


def _mtime(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None

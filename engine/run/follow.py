"""Following a run until it ends: the one loop both front ends read a run through (the TUI's
worker thread, `cockpit runs follow`).

The end has one test. A run is over once nothing is at work on it -- its supervisor's process
is gone, no lifeline of a dead one holds its lock (engine.run.resume.at_work), no attempt runs
on without them -- and either its end was read (run_finished, or the lifeline's run_interrupted)
or the last look brought no news (a supervisor killed with its lifeline: a 'lost' run). Whether
anything is at work is asked before the events are read: once nobody writes, that read is the
last word. A dead supervisor pid alone is not the end: its lifeline still writes how the run
ended after the pid is gone; nor is its end read alone: the lifeline may still be writing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

from engine.record.events import EventFollower, run_end
from engine.record.rundir import RunDir
from engine.run import resume

POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class Batch:
    """One look at the run."""

    events: list[dict]   # appended since the last look (possibly none)
    live: bool           # its supervisor's process lives (never in the last batch)
    ended: bool          # nothing more will come: the last batch
    end: dict | None     # the event that ended the run, when one was read (run_finished, run_interrupted)


def at_work(run: RunDir) -> bool:
    """Something may still write to the run (its events, an attempt's log): its supervisor's
    process lives, or its lock is held, or its last attempt runs on without either. The end
    test's half that every follower asks, `cockpit runs log --follow` too."""
    return run.supervised() or resume.at_work(run)


def follow(run: RunDir, poll_s: float = POLL_S, follower: EventFollower | None = None) -> Iterator[Batch]:
    """A batch every `poll_s` (so a consumer can stop between them), from the run's first event
    (or where `follower` has read to) to its end; the batch that ends it is the last. Polling is
    the coalescing: however fast events are written, at most one batch a poll."""
    follower, end = follower or EventFollower(run.events_path), None
    while True:
        # first: what was written before this is all read below. The supervisor's pid is read
        # once a poll (a file and a process lookup), for both questions.
        live = run.supervised()   # here, or on a SLURM job's node
        working = live or resume.at_work(run)
        events = follower.poll()
        end = run_end(events, end)
        ended = not working and (end is not None or not events)
        yield Batch(events, live, ended, end)
        if ended:
            return
        time.sleep(poll_s)

"""Following a run from the dashboard's worker thread.

The supervisor is its own process (engine.run.supervisor.start_detached): quitting the UI or an
SSH hangup leaves the run alive. The thread only reads events.jsonl and hands batches to
`post` -- the screen's post_message, the one thread-safe way into Textual. Polling every
POLL_S is the coalescing: at most ten batches a second, however fast events are written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from textual.message import Message

from engine.run import supervisor
from engine.record.events import EventFollower, run_end
from engine.run.resume import at_work
from engine.record.rundir import RunDir

POLL_S = 0.1


@dataclass
class RunEvents(Message):
    """New events of the followed run (possibly none), and whether its supervisor lives."""

    run_id: str
    events: list[dict]
    live: bool
    ended: bool   # nothing more will come: the run's end was read, or no supervisor and no news


def follow(run: RunDir, post: Callable[[RunEvents], object], cancelled: Callable[[], bool], *,
           start: bool = False, poll_s: float = POLL_S) -> None:
    """Start the run's supervisor if asked, then post its events until it ends or we are cancelled."""
    if start:
        supervisor.start_detached(run)
    follower = EventFollower(run.events_path)
    last_live, end = None, None
    while not cancelled():
        events = follower.poll()
        live = run.supervisor_pid() is not None
        end = run_end(events, end)
        done = end is not None and not live
        # The lifeline of a supervisor that died holds the run's lock until it has written
        # how the run ended: no news then is not the end.
        ended = done or (not events and not live and not at_work(run))
        if events or live != last_live or ended:
            post(RunEvents(run.id, events, live and not done, ended))
        if ended:
            return
        last_live = live
        time.sleep(poll_s)

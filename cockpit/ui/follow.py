"""Following a run from the dashboard's worker thread.

The supervisor is its own process (engine.run.detached.start_detached): quitting the UI or an
SSH hangup leaves the run alive. The thread only reads events.jsonl, through engine.run.follow
(the loop `cockpit runs follow` reads a run through too), and hands batches to `post` -- the
screen's post_message, the one thread-safe way into Textual. Polling every POLL_S is the
coalescing: at most ten batches a second, however fast events are written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from textual.message import Message

from engine.record.events import EventFollower
from engine.run import detached, follow as run_follow
from engine.record.rundir import RunDir

POLL_S = run_follow.POLL_S


@dataclass
class RunEvents(Message):
    """New events of the followed run (possibly none), and whether its supervisor lives."""

    run_id: str
    events: list[dict]
    live: bool
    ended: bool   # nothing more will come (engine.run.follow: nothing at work on it, its end read or no news)
    starting: bool = False   # what was on disk before its supervisor was started (a resume)


def follow(run: RunDir, post: Callable[[RunEvents], object], cancelled: Callable[[], bool], *,
           start: bool = False, poll_s: float = POLL_S) -> None:
    """Start the run's supervisor if asked, then post its events until it ends or we are cancelled.
    A run resumed this way is posted as it stands first: starting a supervisor takes a second,
    which the screen spends showing where the run is, not an empty run."""
    follower = EventFollower(run.events_path)
    if start:
        if (before := follower.poll()):
            post(RunEvents(run.id, before, live=False, ended=False, starting=True))
        detached.start_detached(run)
    last_live = None
    # engine.run.follow says when the run is over (the same end as `cockpit runs follow`)
    for batch in run_follow.follow(run, poll_s, follower):
        if cancelled():
            return
        if batch.events or batch.live != last_live or batch.ended:
            post(RunEvents(run.id, batch.events, batch.live, batch.ended))
        last_live = batch.live

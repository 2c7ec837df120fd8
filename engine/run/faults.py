"""Faults delivered to a command from outside: native-crash, hang and slow, as real signals.

The user's own script cannot fire these itself: the supervisor (engine.run.rehearsal) and the
probe's command worker deliver them, at the step they read from its output or at their time.
The faults raised inside a process (the trainer's, or cockpit.report's in a script) are
engine.train.faults'; how a fault is written and read is engine.vocabulary's.
"""

from __future__ import annotations

import os
import signal

from engine.run.process import signal_group
from engine.vocabulary import Fault

SLOW_PERIOD_S = 0.4  # `slow` from outside: the process stopped three quarters of each period


# How long a command may outlive native-crash's SIGABRT before the supervisor ends it with SIGKILL.
ABORT_GRACE_S = 2.0


def deliver(fault: Fault, pid: int) -> bool:
    """A signal fault, for real, to the process `pid` leads (its own session): SIGABRT to it
    for native-crash (as Metal's abort), SIGSTOP to its group for hang (a process that
    answers nothing but SIGKILL). True for slow: the caller then calls `throttle` as it polls."""
    if fault.kind == "native-crash":
        try:
            os.kill(pid, signal.SIGABRT)
        except ProcessLookupError:
            pass
    elif fault.kind == "hang":
        signal_group(pid, signal.SIGSTOP, strays=False)
    return fault.kind == "slow"


def throttle(pid: int, now: float) -> None:
    """The `slow` fault from outside: the group runs a quarter of each SLOW_PERIOD_S (steps
    four times longer, what swapping looks like from the loop); `now` is a monotonic clock."""
    running = (now % SLOW_PERIOD_S) < SLOW_PERIOD_S / 4
    # its group alone, as before: a walk of its descendants at every poll would cost the loop
    signal_group(pid, signal.SIGCONT if running else signal.SIGSTOP, strays=False)

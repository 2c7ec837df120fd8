"""Fault rehearsal in a command: the faults the supervisor delivers itself, and the word on those
that cannot fire.

The built-in trainer fires its own faults (engine.run.faults.Injector). A command, the user's own
script, cannot: the supervisor delivers native-crash, hang and slow for real, as signals
(engine.run.faults.deliver), at the step it reads from the output or the script reports, or at
their time; cockpit.report raises the other kinds inside the script when it calls report.step.
What cannot fire is said rather than let the rehearsal pass in silence: a step fault in output
with no step numbers, a fault cockpit.report raises in a script that never calls report.step.

One Rehearsal an attempt. The supervisor's loop calls `tick()` at every poll (timed faults, the
`slow` fault's throttle, a SIGABRT survived); whoever reads the command's progress calls
`at_step` for each step number learnt. For the trainer it has nothing to do: its launch hands
the supervisor no faults.
"""

from __future__ import annotations

import signal
import time

from engine.record.events import EventWriter
from engine import vocabulary
from engine.run import faults
from engine.run.launch import Launch
from engine.run.process import AttemptProcess
from engine.run.watch import AttemptWatch


class Rehearsal:
    def __init__(self, launch: Launch, watch: AttemptWatch, events: EventWriter):
        self._launch, self._watch, self._events = launch, watch, events
        self.process: AttemptProcess | None = None   # set once the attempt is started
        self._faults = [vocabulary.parse(s) for s in launch.signal_faults]   # due at a step
        self._timed = [vocabulary.parse(s) for s in launch.timed_faults]     # due at a time
        # the step faults cockpit.report raises inside the command, parsed once for the attempt
        self._in_script = [f for f in map(vocabulary.parse, launch.script_faults) if not f.timed]
        self._stepless_told = False            # its step faults were said unable to fire
        self._overdue_told: set[str] = set()   # in-script faults said due and not fired
        self._slowed = False                   # the `slow` fault is throttling the command
        self._aborted_at: float | None = None  # when native-crash's SIGABRT was sent (monotonic)
        self.abort_escalated = False           # it survived that, so SIGKILL ended it

    def _running(self) -> bool:
        return self.process is not None and self.process.running

    # ------------------------------------------------------------ delivering

    def tick(self) -> None:
        """What the clock decides, at every poll: timed faults, the `slow` fault's throttle, a
        SIGABRT survived."""
        self._deliver_timed()
        if self._slowed and self.process is not None and self.process.running:
            faults.throttle(self.process.pid, time.monotonic())
        self._escalate_abort()

    def at_step(self, step: int, reported_steps: bool) -> None:
        """The signal faults due at this step, delivered for real (engine.run.faults.deliver);
        `reported_steps`: the script reports its steps through cockpit.report."""
        for fault in [f for f in self._faults if f.step is not None and f.step <= step]:
            if not self._running():
                return  # read after it ended: nothing left to deliver to
            self._faults.remove(fault)
            self._deliver(fault, step=step)
        if not reported_steps:
            self._overdue(step)

    def release(self) -> None:
        """End the `slow` fault's throttling (before a stop: the command must run to obey it)."""
        if self._slowed and self.process is not None:
            self._slowed = False
            self.process.signal_group(signal.SIGCONT)

    def _deliver_timed(self) -> None:
        """A command's timed signal faults whose time has come: counted from the attempt's
        start, which the script's cockpit.report counts from too."""
        elapsed = time.time() - self._launch.started
        for fault in [f for f in self._timed if (f.after_s or 0.0) <= elapsed]:
            if not self._running():
                return
            self._timed.remove(fault)
            self._deliver(fault, step=self._watch.last_step, at_s=round(elapsed, 3))

    def _deliver(self, fault: vocabulary.Fault, **where) -> None:
        if fault.spec in self._watch.fired:
            return  # a script that reports its steps aborted itself at it (cockpit.report)
        assert self.process is not None  # delivered only while it runs (_running)
        self._events.emit("fault_injected", attempt=self._watch.attempt, spec=fault.spec,
                          kind=fault.kind, by="supervisor", **where)
        self._slowed |= faults.deliver(fault, self.process.pid)
        if fault.kind == "native-crash":
            self._aborted_at = time.monotonic()

    def _escalate_abort(self) -> None:
        """A real abort() cannot be survived, but a SIGABRT sent from outside can: a native
        library may catch it (one does in a CUDA process: seen on the H100 under Lightning).
        Past ABORT_GRACE_S the rehearsal ends the command as the crash would have."""
        if self._aborted_at is None or time.monotonic() - self._aborted_at < faults.ABORT_GRACE_S:
            return
        self._aborted_at, self.abort_escalated = None, True
        self._events.emit("warning", attempt=self._watch.attempt, kind="fault-survived",
                          message=f"the command survived the injected SIGABRT for "
                                  f"{faults.ABORT_GRACE_S:.0f} s (a native library in it catches "
                                  "the signal when it comes from outside); SIGKILL ends it as the "
                                  "crash would have", advice=[], fallback=False)
        if self.process is not None:
            self.process.kill()

    # ------------------------------------------------------------ what cannot fire

    def _warn(self, kind: str, faults: list[str], message: str) -> None:
        """A warning about faults that cannot fire, or did not, naming them."""
        self._events.emit("warning", attempt=self._watch.attempt, kind=kind, faults=faults,
                          advice=[], fallback=False, message=message)

    def _pending(self) -> list[str]:
        """A command's step faults not fired yet: the supervisor's signals and cockpit.report's."""
        specs = [f.spec for f in self._faults] + [
            f.spec for f in self._in_script if f.spec not in self._watch.fired]
        return list(dict.fromkeys(specs))  # native-crash is in both

    def stepless(self, reported_steps: bool) -> None:
        """The output turned out to give losses and no step numbers (the no-step-numbers
        warning): a step fault waits for a step that will not be read, so say now that it
        cannot fire, not only when the attempt ends."""
        if self._stepless_told or reported_steps:
            return
        pending = self._pending()
        if pending:
            self._stepless_told = True
            self._warn("fault-cannot-fire", pending,
                       f"{_named(pending)} cannot fire: a step fault waits for a step number, "
                       "which this command's output does not give (unless the script calls "
                       "cockpit.report.step); a timed fault (KIND@SECONDSs, e.g. hang@30s) needs none")

    def _overdue(self, step: int) -> None:
        """A fault cockpit.report raises whose step the output has reached, in a script that has
        not called report.step yet: said now, not when the attempt ends (hours later, maybe). A
        script that reports at an interval fires it at its next report; one that never does,
        never."""
        due = [f.spec for f in self._in_script if f.kind in vocabulary.REPORTED_KINDS
               and f.step is not None and f.step <= step
               and f.spec not in self._watch.fired and f.spec not in self._overdue_told]
        if due:
            self._overdue_told.update(due)
            self._warn("fault-not-fired", due,
                       f"{_named(due)} {'is' if len(due) == 1 else 'are'} due (the output is at step "
                       f"{step}) and not injected: cockpit.report.step raises it inside the script, "
                       "which has not called it (a script that never does cannot fire oom, backend, "
                       "openmp, nan or user-code; native-crash, hang and slow work on any command)")

    def unfired(self, finished: bool, reported_steps: bool) -> None:
        """At the attempt's end, step faults that could not fire: a fault that cockpit.report
        raises inside the script, in a script that never calls report.step; any step fault, in
        a command that `finished` with no step number read."""
        if reported_steps or self._stepless_told:
            return
        if self._watch.last_step is None and finished:
            if pending := self._pending():
                self._warn("fault-not-fired", pending,
                           f"{_named(pending)} {'was' if len(pending) == 1 else 'were'} not injected: "
                           "the command's output gave no step number and it never called "
                           "cockpit.report.step (a timed fault, KIND@SECONDSs, needs neither)")
            return
        reached = self._watch.last_step or 0
        for fault in self._in_script:
            spec = fault.spec
            if fault.step is not None and fault.step <= reached and spec not in self._watch.fired \
                    and spec not in self._overdue_told:
                self._warn("fault-not-fired", [spec],
                           f"fault {spec} was not injected: cockpit.report.step raises it inside the "
                           "script, and this command never calls it (native-crash, hang and slow work "
                           "on any command)")


def _named(specs: list[str]) -> str:
    return ("fault " if len(specs) == 1 else "faults ") + ", ".join(specs)

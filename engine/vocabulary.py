"""The words the engine's floors share: how an attempt can crash, what a fallback rule can do,
the exit codes a trainer ends with on purpose, and how a fault to inject is written.

The ground floor: it imports nothing from engine, so presets and runconfig check a preset's
[rules] and `inject` against it without importing the supervisor's floor (engine.run), and the
trainer, the supervisor and the front ends all say the same words. Each kind is a StrEnum: a
member is its string ("oom" == CrashKind.OOM), so presets, run.toml and events.jsonl hold the
plain strings they always did. Membership of a plain string is tested against the tuples
(`kind in CRASH_KINDS`): `"oom" in CrashKind` raises on Python 3.11.

What is done with the words lives with whoever does it: classifying an attempt's end
(engine.run.crashes), the rules (engine.run.fallback), firing a fault (engine.train.faults
inside a process, engine.run.faults from outside).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class CrashKind(StrEnum):
    """How an attempt crashed (engine.run.crashes.classify); a device preset's [rules] key."""

    OOM = "oom"
    BACKEND = "backend"
    NATIVE_CRASH = "native-crash"
    OPENMP = "openmp"
    NUMERICAL = "numerical"
    NUMERICAL_PARITY = "numerical-parity"
    COMPILE = "compile"
    HANG = "hang"
    KILLED = "killed"
    USER_CODE = "user-code"
    CHECKPOINT = "checkpoint"
    SLOWDOWN = "slowdown"
    NODE_LOST = "node-lost"
    UNKNOWN = "unknown"


# Every crash kind a device preset's [rules] can name, in the order messages list them.
CRASH_KINDS: tuple[CrashKind, ...] = tuple(CrashKind)
# The ends of an attempt that are not crashes; an adopted process's (engine.run.launchers.adopted) "ended"
# (its exit status unknown, no error in its log: no crash cockpit can show) and "released"
# (cockpit stopped following it) too.
CLEAN = ("finished", "stopped", "config", "ended", "released")

# Exit codes the trainer uses on purpose (engine.train.trainer); anything else is evidence.
EXIT_FINISHED, EXIT_FAILED, EXIT_CONFIG, EXIT_STOPPED, EXIT_NUMERICAL, EXIT_PARITY = 0, 1, 2, 3, 4, 5


class Action(StrEnum):
    """What a fallback rule does after a crash (engine.run.fallback says each in full)."""

    NEXT = "next"
    RETRY = "retry"
    RETRY_PROGRESS = "retry-progress"
    RETRY_ENV = "retry-env"
    FP32 = "fp32"
    EAGER = "eager"
    HALVE_BATCH = "halve-batch"
    STOP = "stop"


ACTIONS: tuple[Action, ...] = tuple(Action)
# The environment a `retry-env` rule sets, by crash kind: the only kinds it can fix.
ENV_FIXES: dict[str, dict[str, str]] = {CrashKind.OPENMP: {"KMP_DUPLICATE_LIB_OK": "TRUE"}}


# ---------------------------------------------------------------- the fault grammar


class FaultKind(StrEnum):
    """A failure the fault injector reproduces for real (engine.train.faults, engine.run.faults)."""

    NATIVE_CRASH = "native-crash"
    OOM = "oom"
    BACKEND = "backend"
    OPENMP = "openmp"
    NAN = "nan"
    HANG = "hang"
    USER_CODE = "user-code"
    SLOW = "slow"
    WRONG_GRAD = "wrong-grad"
    COMPILE_ERROR = "compile-error"
    PREEMPT = "preempt"
    NODE_LOST = "node-lost"
    SPIKE = "spike"
    DIVERGE = "diverge"


FAULT_KINDS: tuple[FaultKind, ...] = tuple(FaultKind)
# What a supervisor delivers to a command from outside, as real signals (engine.run.faults.
# deliver); the other kinds are raised inside a command by cockpit.report, inside the trainer
# by engine.train.faults.Injector.
SIGNAL_KINDS = (FaultKind.NATIVE_CRASH, FaultKind.HANG, FaultKind.SLOW)
# What cockpit.report raises inside a command that reports its steps: native-crash as both, the
# script's own abort at its step, else the supervisor's SIGABRT at the step it reads.
IN_SCRIPT_KINDS = (FaultKind.NATIVE_CRASH, FaultKind.OOM, FaultKind.BACKEND, FaultKind.OPENMP,
                   FaultKind.NAN, FaultKind.USER_CODE, FaultKind.SPIKE)
# What the supervisor itself does at a step, whatever launches the attempt: preempt, the warning
# a cluster sends before a job's time ends (engine.run.supervisor.Supervisor.preempt); node-lost,
# this machine's torchrun agent and workers killed at once, as a host lost (a node of several).
SUPERVISOR_KINDS = (FaultKind.PREEMPT, FaultKind.NODE_LOST)
# Raised inside a command by cockpit.report alone: native-crash, hang and slow need no report.
REPORTED_KINDS = tuple(k for k in IN_SCRIPT_KINDS if k not in SIGNAL_KINDS)


@dataclass(frozen=True)
class Fault:
    """One fault to inject, as `parse` reads it from 'kind@step[+]' or 'kind@SECONDSs[+]'."""

    kind: FaultKind
    step: int | None         # fires at the start of this optimizer step; None for a timed fault
    repeat: bool             # '+': in every attempt, not once per run
    spec: str
    after_s: float | None = None   # a timed fault: seconds after the attempt started

    @property
    def timed(self) -> bool:
        return self.after_s is not None


_SPEC = re.compile(r"(?P<kind>[a-z-]+)@(?:(?P<step>\d+)|(?P<seconds>\d+(?:\.\d+)?)s)(?P<repeat>\+?)")
GRAMMAR = ("KIND@STEP[+] or KIND@SECONDSs[+] (an optimizer step, 0 = start-up, or seconds after "
           "the attempt's start; + for every attempt) with KIND one of " + ", ".join(FAULT_KINDS)
           + " (e.g. 'native-crash@117', 'oom@120+', 'hang@30s', 'nan@1.5s+')")


def parse(spec: str) -> Fault:
    """'native-crash@117' or 'hang@30s+' -> Fault; ValueError with a message that says what was
    expected."""
    text = spec.strip()
    found = _SPEC.fullmatch(text)
    if found is None or found["kind"] not in FAULT_KINDS:
        raise ValueError(f"{spec!r} is not a fault; expected {GRAMMAR}")
    step, seconds = found["step"], found["seconds"]
    return Fault(FaultKind(found["kind"]), None if step is None else int(step), bool(found["repeat"]),
                 text, None if seconds is None else float(seconds))

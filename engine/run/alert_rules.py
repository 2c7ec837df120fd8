"""Which of a run's events alert, and what the alert says.

A run's events in, alerts out: at most one alert per incident (a crash and the fallback or
failure it led to are one alert, named for the most telling of them: hang, then fallback or
failure, then crash), for the names the user's settings.toml asks for ([alerts] on). The
supervisor's alerts (engine.run.alerts) send them to a terminal, the desktop and a notify
command; the TUI rings its own bell and toast by the same rules (cockpit.ui). Torch-free, and
no I/O but the host's name.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Iterable

from engine.numbers import count
from engine.record.rundir import interrupted_next

TITLE_WORDS = {"crash": "crashed", "hang": "hung", "fallback": "fell back", "failure": "failed",
               "finish": "finished", "slowdown": "slowed down", "health": "is going bad"}


@dataclass(frozen=True)
class Alert:
    event: str                      # the name it alerts as, one of settings.ALERT_EVENTS
    events: tuple[str, ...]         # every name that applies ("crash", "fallback")
    title: str
    message: str
    source: tuple[dict, ...] = ()   # the run's events it is about

    @property
    def text(self) -> str:
        return f"{self.title}: {self.message}"


@dataclass
class AlertRules:
    """A run's events in, alerts out. `since`: events written before it are history (the TUI
    replaying a run), not news."""

    on: frozenset[str]
    workload: str = "run"
    since: float | None = None
    host: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    _crash: dict | None = None       # a crash whose outcome (fallback, failure) is not known yet
    _failed: bool = False            # run_failed said it; its run_finished says nothing new

    def see(self, events: Iterable[dict]) -> list[Alert]:
        alerts: list[Alert] = []
        for e in events:
            if self.since is not None and e.get("t", 0) < self.since:
                continue
            kind = e["type"]
            if kind == "crash":
                alerts += self.flush()
                self._crash = e
            elif kind == "fallback":
                alerts += self._incident("fallback", e, self._fallback_text(e))
            elif kind == "run_failed":
                self._failed = True
                alerts += self._incident("failure", e, f"no further attempt: {e.get('reason', '?')}")
            elif kind == "run_finished":
                status = e.get("status")
                if status == "failed" and not self._failed:
                    alerts += self._incident("failure", e, _summary_text(e))
                elif status in ("finished", "ended"):   # ended: an adopted process's end
                    alerts += self.flush() + self._alert(("finish",), (e,), _summary_text(e))
                else:
                    alerts += self.flush()
            elif kind == "run_interrupted":   # the lifeline's word: the supervisor died
                alerts += self._incident("failure", e, f"{e.get('reason', 'interrupted')}; {interrupted_next(e)}")
            elif kind in ("attempt_started", "run_resumed"):
                alerts += self.flush()
                self._failed = self._failed and kind != "run_resumed"   # a resumed run may fail anew
            elif kind == "warning" and e.get("kind") == "slowdown":
                alerts += self._alert(("slowdown",), (e,), e.get("message", "throughput fell"))
            elif kind == "health":   # a loss spike, a gradient explosion, divergence
                done = {"stop": " (stopping it)", "rewind": " (going back to a checkpoint before it)",
                        "lower-lr": " (going back, the learning rate halved)"}.get(e.get("action") or "", "")
                alerts += self._alert(("health",), (e,), e.get("sentence", e.get("kind", "?")) + done)
        return alerts

    def flush(self) -> list[Alert]:
        """A crash whose outcome never came (the run was stopped): an alert of its own."""
        crash, self._crash = self._crash, None
        return self._alert((_crash_name(crash),), (crash,), _crash_text(crash)) if crash else []

    def _incident(self, name: str, e: dict, outcome: str) -> list[Alert]:
        crash, self._crash = self._crash, None
        if crash is None:
            return self._alert((name,), (e,), outcome)
        return self._alert((_crash_name(crash), name), (crash, e), f"{_crash_text(crash)}; {outcome}")

    def _alert(self, names: tuple[str, ...], source: tuple[dict, ...], message: str) -> list[Alert]:
        # hang is the most telling, then what the crash led to, then the crash itself
        order = sorted(names, key=lambda n: ("hang", "fallback", "failure").index(n)
                       if n in ("hang", "fallback", "failure") else 3)
        wanted = [n for n in order if n in self.on]
        if not wanted:
            return []
        word = TITLE_WORDS[wanted[0]]
        if wanted[0] == "fallback" and is_retry(source[-1]):
            word = "retried"  # the same preset again: no fallback to another
        elif wanted[0] == "finish" and source[-1].get("status") == "ended":
            word = "ended"    # an adopted process: whether it finished is not known
        title = f"cockpit@{self.host}: {self.workload} {word}"
        return [Alert(wanted[0], tuple(names), title, message, source)]

    @staticmethod
    def _fallback_text(e: dict) -> str:
        resume, to = e.get("resume") or {}, e.get("to_preset", "?")
        again = "again " if is_retry(e) else ""
        how = f"resumes on {to} {again}at step {resume['step']}" if resume.get("step") is not None else \
            f"resumes on {to} {again}from its checkpoint" if resume else f"starts over on {to}"
        return f"attempt {e.get('next_attempt', '?')} {how}"


def is_retry(e: dict) -> bool:
    """A fallback event that runs the same preset again (a retry), not the next one."""
    return e.get("type") == "fallback" and e.get("from") is not None and e.get("from") == e.get("to_preset")


def _crash_name(crash: dict) -> str:
    return "hang" if crash.get("kind") == "hang" else "crash"


def _crash_text(crash: dict) -> str:
    word = "hung" if crash.get("kind") == "hang" else f"crashed ({crash.get('kind', '?')})"
    return f"attempt {crash.get('attempt', '?')} on {crash.get('preset', '?')} {word}"


def _summary_text(e: dict) -> str:
    summary = e.get("summary") or {}
    attempts = summary.get("attempts") or []
    text = e.get("status", "ended")
    if summary.get("final_step") is not None:
        text += f" at step {summary['final_step']}"
    if len(attempts) > 1:
        text += f" after {len(attempts)} attempts"
    if attempts and e.get("status") == "failed":
        text += f" (the last ended {attempts[-1].get('outcome', '?')})"
    if summary.get("steps_lost"):
        text += f", {count(summary['steps_lost'], 'step')} lost to crashes"
    if summary.get("steps_rewound"):
        text += f", {count(summary['steps_rewound'], 'step')} rewound"
    return text

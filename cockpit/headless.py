"""Headless output: one human line per event worth a line, or every event as JSON."""

from __future__ import annotations

import json
import sys
from typing import TextIO


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _metrics(metrics: dict) -> str:
    return "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())


def human_line(e: dict) -> str | None:
    """The line for one event, or None for events that are not worth one."""
    kind = e["type"]
    if kind == "run_started":
        return f"run {e['run']}: workload {e['workload']}, device preset {e['device_preset']}"
    if kind == "trainer_ready":
        resumed = e.get("resumed_from")
        line = (f"attempt {e['attempt']}: {e['device']} {e['precision']}, batch {e['batch_size']} x "
                f"{e['accumulation']}, {e['parameters']:,} parameters, {e['total_steps']} steps "
                f"({e['reason']})")
        if resumed:
            line += f"; resumed at step {resumed['step']}, sample {resumed['samples_seen']:,}"
        return line
    if kind == "step":
        pct = 100 * e["step"] / max(1, e["total"])
        line = (f"step {e['step']}/{e['total']} ({pct:.0f}%)  loss {e['loss']:.4g}  "
                f"{e['samples_per_s']:,.0f} samples/s")
        if "gflop_s" in e:
            line += f"  {e['gflop_s']:,.1f} GFLOP/s"
        return line + f"  ETA {duration(e.get('eta_s'))}"
    if kind == "eval":
        return f"eval at step {e['step']}: {_metrics(e['metrics'])}"
    if kind == "warning":
        return f"warning: {e.get('message', '')} {e.get('advice', '')}".rstrip()
    if kind == "fault_injected":
        return f"attempt {e['attempt']}: injecting fault {e['spec']} at step {e['step']}"
    if kind == "crash":
        line = f"attempt {e['attempt']} ({e['preset']}) crashed: {e['kind']}. {e['sentence']}"
        message = (e.get("evidence") or {}).get("message")
        if e["kind"] == "user-code" and e.get("exception"):
            line += "\n" + _indent(e["exception"], 15)
        elif message:
            line += "\n" + _indent(message, 3)
        return line
    if kind == "attempt_ended" and e["outcome"] == "config":
        return f"attempt {e['attempt']} ({e['preset']}) refused its configuration:\n" + _indent(e.get("tail", ""), 4)
    if kind == "fallback":
        return fallback_line(e)
    if kind == "run_failed":
        return f"no further attempt: {e['why']}"
    if kind == "run_finished":
        return f"run {e['status']}" + (f": {summary_text(e['summary'])}" if e.get("summary") else "")
    return None


def _indent(text: str, last: int) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines()[-last:])


def fallback_line(e: dict) -> str:
    resume = e.get("resume")
    where = (f"resuming at step {resume['step']}, sample {resume['samples_seen']:,}" if resume
             else "starting over (no checkpoint yet)")
    changes = "; ".join(f"{k} {_value(a)} -> {_value(b)}" for k, (a, b) in (e.get("changed") or {}).items())
    return (f"fallback: attempt {e['next_attempt']} on {e['to_preset']} ({e['why']})"
            + (f": {changes}" if changes else "") + f"; {where}")


def _value(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={v}" for k, v in value.items()) + "}"
    return str(value)


def summary_text(summary: dict) -> str:
    """'3 attempts (mps: native-crash at step 117; cpu: finished), 17 steps lost to crashes'."""
    parts = [f"{a['preset']}: {a['outcome']}" + (f" after step {a['last_step']}" if a["outcome"] not in
                                                  ("finished", "stopped") and a.get("last_step") else "")
             for a in summary.get("attempts", [])]
    n = len(parts)
    text = f"{n} attempt{'s' if n != 1 else ''} ({'; '.join(parts)})"
    if summary.get("steps_lost"):
        text += f", {summary['steps_lost']} steps lost to crashes"
    return text


class HeadlessPrinter:
    """Callable on a list of events; survives its terminal going away (SSH drop, closed pipe)."""

    def __init__(self, as_json: bool = False, stream: TextIO | None = None):
        self.as_json = as_json
        self.stream = stream or sys.stdout
        self.alive = True

    def __call__(self, events: list[dict]) -> None:
        if not self.alive:
            return
        lines = [json.dumps(e) if self.as_json else human_line(e) for e in events]
        text = "".join(line + "\n" for line in lines if line is not None)
        if not text:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.alive = False  # the terminal is gone; the run goes on

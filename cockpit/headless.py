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
    if kind == "attempt_ended" and e["outcome"] not in ("finished", "stopped"):
        tail = "\n".join("    " + line for line in e.get("tail", "").splitlines()[-8:])
        return f"attempt {e['attempt']} ({e['preset']}) ended: {e['outcome']} ({e['exit']})" + \
            (f"\n{tail}" if tail else "")
    if kind == "run_finished":
        return f"run {e['status']}"
    return None


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

"""Headless output, for people and for log files.

- On a terminal: one live status line (progress bar, step, loss, the main metric, samples/s --
  steps/s where the samples per step are not known -- tokens/s, ETA, pressure), redrawn in
  place, with every event worth a line (eval, checkpoint, crash, fallback, a machine of several
  lost or back, warnings) printed above it.
- Not on a terminal (nohup, a pipe, a file): a plain progress line at most every `log_every_s`
  seconds of the run's own clock (the events' times), the first and last of each attempt, and
  every event worth a line: a five-hour run is a few hundred lines, not tens of thousands.
- `--json`: every event as a JSON line, exactly as events.jsonl has it.

Only the printing is here: the lines and their rhythm are cockpit.present's (transcript.py), the
same the TUI's log view shows. An attempt's first step windows measure warm-up (allocation,
caches, compilation), so its ETA says "settling" until SETTLE_WINDOWS of them are in. The rate
shown is the smoothed one (engine.monitor.throughput): a window can be a checkpoint's 0.05 s
fragment. While a mining pass or an eval runs (minutes on a big bank, no step at all) the line
says so instead of only "no step". Before an attempt's first step (a model loading, a first step
compiling for minutes) the line says how long it has been waiting: 'attempt 2: no step yet
(1m30s)', on a terminal and, once per `log_every_s`, in a log file.
"""

from __future__ import annotations

import json
import shutil
import sys
from typing import TextIO

from cockpit.present.transcript import LOG_EVERY_S, Transcript


class HeadlessPrinter:
    """Callable on a list of events; survives its terminal going away (SSH drop, closed pipe).
    `live`: a status line redrawn in place (default: when the stream is a terminal)."""

    def __init__(self, as_json: bool = False, stream: TextIO | None = None, *, live: bool | None = None,
                 log_every_s: float = LOG_EVERY_S, width: int | None = None, main_metric: str = ""):
        self.as_json = as_json
        self.stream = stream or sys.stdout
        self.alive = True
        if live is None:
            try:
                live = self.stream.isatty()
            except (AttributeError, ValueError):
                live = False
        self.live = live and not as_json
        self.width = width
        # the live line gets the terminal's columns less one (at least 20); `main_metric`: the
        # preset's (RunDir.main_metric), '' for the default choice
        self.transcript = Transcript(live=self.live, log_every_s=log_every_s, main_metric=main_metric,
                                     width=lambda: max(20, (self.width or shutil.get_terminal_size().columns) - 1))
        self.status = ""                 # the live line now on screen

    def __call__(self, events: list[dict]) -> None:
        if not self.alive:
            return
        if self.as_json:
            self._write("".join(json.dumps(e) + "\n" for e in events))
            return
        shown = self.status   # the live line on screen now: lines go where it is
        lines: list[str] = []
        for e in events:
            lines += self.transcript.see(e)
        text = "".join(line + "\n" for line in lines)
        if self.live:
            status = self.transcript.status()
            if not text and status == shown:
                return
            text = ("\r\x1b[K" if shown else "") + text + status
            self.status = status
        self._write(text)

    def close(self) -> None:
        """End the live line (the run is over); a no-op otherwise."""
        if self.live and self.status:
            self.status = ""
            self._write("\n")

    def _write(self, text: str) -> None:
        if not text:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.alive = False  # the terminal is gone; the run goes on

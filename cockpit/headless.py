"""Headless output, for people and for log files.

- On a terminal: one live status line (progress bar, step, loss, samples/s, ETA, pressure),
  redrawn in place, with every event worth a line (eval, checkpoint, crash, fallback, warnings)
  printed above it.
- Not on a terminal (nohup, a pipe, a file): a plain progress line at most every `log_every_s`
  seconds of the run's own clock (the events' times), the first and last of each attempt, and
  every event worth a line: a five-hour run is a few hundred lines, not tens of thousands.
- `--json`: every event as a JSON line, exactly as events.jsonl has it.

An attempt's first step windows measure warm-up (allocation, caches, compilation), so its ETA
says "settling" until SETTLE_WINDOWS of them are in. The rate shown is the smoothed one
(engine.monitor.throughput): a window can be a checkpoint's 0.05 s fragment. While a mining
pass or an eval runs (minutes on a big bank, no step at all) the line says so instead of only
"no step". Before an attempt's first step (a model loading, a first step compiling for minutes)
the line says how long it has been waiting: 'attempt 2: no step yet (1m30s)', on a terminal and,
once per `log_every_s`, in a log file.
"""

from __future__ import annotations

import json
import shutil
import sys
from typing import TextIO

from engine.run.fallback import describe_change
from engine.record.rundir import interrupted_next
from engine.numbers import count, rate


SETTLE_WINDOWS = 5
LOG_EVERY_S = 30.0
BAR = 12


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _metrics(metrics: dict) -> str:
    return "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())


def memory_text(m: dict) -> str:
    """'rss 1.2 GB, mem 71%, swap-in 0 MB/s, cpu 190%, gpu 97%, pressure normal' from a memory
    event."""
    parts = []
    if m.get("rss") is not None:
        parts.append(f"rss {m['rss'] / 1e9:.1f} GB")
    if m.get("system_total"):
        parts.append(f"mem {100 * m['system_used'] / m['system_total']:.0f}%")
    if m.get("swap_in_per_s") is not None:
        parts.append(f"swap-in {m['swap_in_per_s'] / 1e6:.1f} MB/s")
    if m.get("cpu_percent") is not None:  # the hardware panel's figures, short
        parts.append(f"cpu {m['cpu_percent']:.0f}%")
    if utils := [g["util_percent"] for g in m.get("gpus") or [] if g.get("util_percent") is not None]:
        parts.append("gpu " + ("/".join(f"{u}%" for u in utils) if len(utils) <= 2 else f"{min(utils)}-{max(utils)}%"))
    level = (m.get("pressure") or {}).get("level")
    parts.append(f"pressure {level or 'n/a'}")
    return ", ".join(parts)


def eta_text(eta_s: float | None, windows: int | None = None) -> str | None:
    """'ETA 3m10s', 'ETA settling' while the attempt has fewer than SETTLE_WINDOWS step windows
    (`windows` None: no count kept, the figure as it is), or None with no ETA."""
    if eta_s is None:
        return None
    return "ETA settling" if windows is not None and windows < SETTLE_WINDOWS else f"ETA {duration(eta_s)}"


def shown_rate(e: dict) -> float | None:
    """The step event's smoothed samples/s, or its window's from a writer that has none."""
    smoothed = e.get("smoothed_samples_per_s")
    return smoothed if smoothed is not None else e.get("samples_per_s")


def shown_per_sample(e: dict, key: str) -> float | None:
    """A figure proportional to the window's samples/s (GFLOP/s, MFU) at the shown rate, so
    the line's figures agree with each other."""
    value, window, speed = e.get(key), e.get("samples_per_s"), shown_rate(e)
    if value is None or not window or speed is None:
        return value
    return value * speed / window


def activity_text(started: dict, now: float | None) -> str:
    """'mining hard negatives for epoch 6 (35s)' from a mining_started event, 'evaluating at
    step 600 (12s)' from an eval_started one."""
    spent = f" ({duration(now - started['t'])})" if now is not None and now - started["t"] >= 1 else ""
    if started["type"] == "eval_started":
        return f"evaluating at step {started.get('step', '?')}{spent}"
    return f"mining hard negatives for epoch {started.get('epoch', '?')}{spent}"


def step_line(e: dict, memory: dict | None = None, windows: int | None = None) -> str:
    """'step 40/400 (10%)  loss 0.41  1,234 samples/s  ETA 2m10s  | rss 0.3 GB, ...'."""
    line = f"step {e['step']}"
    if e.get("total"):
        line += f"/{e['total']} ({100 * e['step'] / e['total']:.0f}%)"
    if e.get("loss") is not None:
        line += f"  loss {e['loss']:.4g}"
    if (speed := shown_rate(e)) is not None:
        line += f"  {rate(speed)} samples/s"
    if (gflop_s := shown_per_sample(e, "gflop_s")) is not None:
        line += f"  {gflop_s:,.1f} GFLOP/s"
    if (mfu := shown_per_sample(e, "mfu")) is not None:
        line += f" (MFU {mfu:.0%})"
    if not _done(e) and (eta := eta_text(e.get("eta_s"), windows)) is not None:
        line += f"  {eta}"
    if memory is not None:
        line += f"  | {memory_text(memory)}"
    return line


def _done(e: dict) -> bool:
    """At its last step: an ETA there says nothing (and 'settling' would mislead)."""
    return bool(e.get("total")) and e["step"] >= e["total"]


def status_line(e: dict, memory: dict | None, windows: int, quiet_s: float | None = None,
                width: int = 80, activity: str | None = None) -> str:
    """The live line, what fits in `width` in this order of importance:
    '[=====>     ]  35%  step 140/400  ETA 2m10s  loss 0.41  1,234 samples/s  pressure normal'.
    `activity` (a mining pass, an eval) says why there is no step, in place of 'no step for'."""
    total, step = e.get("total"), e["step"]
    parts = []
    if total:
        done = min(1.0, step / total)
        filled = int(done * BAR)
        drawn = "[" + "=" * filled + (">" if filled < BAR else "") + " " * (BAR - filled - 1) + "] "
        # below 100 columns the bar's room goes to the rest (pressure fits at 80)
        parts.append((drawn if width >= 100 else "") + f"{100 * done:3.0f}%")
    parts.append(f"step {step}/{total}" if total else f"step {step}")
    if activity is not None:
        parts.append(activity)
    elif quiet_s is not None:
        parts.append(f"no step for {duration(quiet_s)}")
    level = (memory.get("pressure") or {}).get("level") if memory is not None else None
    pressure = f"pressure {level or 'n/a'}" if memory is not None else None
    if pressure and level not in (None, "normal"):
        parts.append(pressure)  # memory trouble outranks the rest (note 003's swapping)
    if not _done(e) and (eta := eta_text(e.get("eta_s"), windows)) is not None:
        parts.append(eta)
    if e.get("loss") is not None:
        parts.append(f"loss {e['loss']:.4g}")
    if (speed := shown_rate(e)) is not None:
        parts.append(f"{rate(speed)} samples/s")
    if (mfu := shown_per_sample(e, "mfu")) is not None:
        parts.append(f"MFU {mfu:.0%}")
    if pressure and level in (None, "normal"):
        parts.append(pressure)
    line = ""
    for part in parts:  # in order of importance; one that does not fit leaves room for the next
        if len(line) + 2 + len(part) <= width:
            line = f"{line}  {part}" if line else part
    return line or parts[-1 if not total else 1][:width]


def human_line(e: dict, memory: dict | None = None) -> str | None:
    """The line for one event, or None for events that are not worth one; a step line ends
    with the latest memory sample when there is one."""
    kind = e["type"]
    if kind == "run_started":
        return f"run {e['run']}: workload {e['workload']}, device preset {e['device_preset']}"
    if kind == "run_resumed":
        resume = e.get("resume")
        where = f"from {resume_text(resume)}" if resume else "from the start (no checkpoint to resume from)"
        return (f"run {e['run']} resumed: attempt {e['next_attempt']} on {e['device_preset']}, "
                f"{where}")
    if kind == "stop_requested":
        return (f"stopping attempt {e['attempt']}: {e['signal']}" +
                (f" (request {e['request']}: at once)" if e["request"] > 1 else ""))
    if kind == "supervisor_lost":
        return e["message"]
    if kind == "run_interrupted":
        return f"run interrupted ({e['reason']}); {interrupted_next(e)}"
    if kind == "trainer_ready":
        resumed = e.get("resumed_from")
        line = (f"attempt {e['attempt']}: {e['device']} {e['precision']}"
                + (", compiled" if e.get("compile") else "")
                + f", batch {e['batch_size']} x {e['accumulation']}, {e['parameters']:,} parameters, "
                f"{e['total_steps']} steps ({e['reason']})")
        if e.get("optimizer"):  # which optimizer and learning-rate curve: never silently
            line += f"; {e['optimizer']}"
        if e.get("world_size", 1) > 1:
            line += f"; world size {e['world_size']}, global batch {e['global_batch']}"
        if resumed:
            line += f"; resumed at step {resumed['step']}, sample {resumed['samples_seen']:,}"
        return line
    if kind == "attempt_started" and e.get("command_line"):
        resumed = e.get("resume")
        line = (f"attempt {e['attempt']}: {e['preset']} on {e.get('device') or '?'}: "
                f"{e['command_line']}")
        if resumed:
            line += "\n    resuming from " + resumed["path"] + (
                f" (step {resumed['step']})" if resumed.get("step") is not None else "")
        return line
    if kind == "step":
        return step_line(e, memory)
    if kind == "eval":
        at = f" at step {e['step']}" if e.get("step") is not None else ""
        return f"eval{at}: {_metrics(e['metrics'])}"
    if kind == "mining" and e.get("mode", "none") != "none":
        exact = "exact" if e.get("exact") else "recall not measured" \
            if e.get("recall_vs_exact") is None else f"recall {e['recall_vs_exact']:.3f} vs exact"
        built = f", index built in {e['index_build_s']:.1f} s" if "index_build_s" in e else ""
        return (f"mining epoch {e['epoch']}: {e['mode']} over {e['index']} ({exact}), "
                f"{e['queries']:,} queries in {e['mining_s']:.1f} s{built}")
    if kind == "warning":
        lines = [f"warning: {e.get('message', '')}"]
        for tip in e.get("advice") or []:
            how = "  (--set " + " --set ".join(tip["set"]) + ")" if tip.get("set") else ""
            lines.append(f"    - {tip['text']}{how}")
        if e.get("fallback"):
            lines.append("    the preset says fall back: checkpointing and moving to the next preset")
        return "\n".join(lines)
    if kind == "checkpoint":
        at = f" at step {e['step']}" if e.get("step") is not None else ""
        return f"checkpoint{at}: {e.get('path', '?')}"
    if kind == "fault_injected":
        at = f"{e['at_s']:.1f} s in" + (f", step {e['step']}" if e.get("step") is not None else "") \
            if e.get("at_s") is not None else f"step {e.get('step')}"  # a timed fault: its time
        return f"attempt {e['attempt']}: injecting fault {e['spec']} at {at}"
    if kind == "parity":
        return f"attempt {e['attempt']}: parity check {e['verdict']}: {e['message']}"
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
        return f"no further attempt: {e.get('why') or e.get('reason', '?')}"  # the supervisor writes 'reason'
    if kind == "run_finished":
        return f"run {e['status']}" + (f": {summary_text(e['summary'])}" if e.get("summary") else "")
    return None


def _indent(text: str, last: int) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines()[-last:])


def resume_text(resume: dict) -> str:
    """'step 40, sample 1,280', or a command's checkpoint file when its step is not known."""
    parts = []
    if resume.get("step") is not None:
        parts.append(f"step {resume['step']}")
    if resume.get("samples_seen") is not None:
        parts.append(f"sample {resume['samples_seen']:,}")
    if not parts and resume.get("path"):
        parts.append(str(resume["path"]).rsplit("/", 1)[-1])
    return ", ".join(parts) or "the last checkpoint"


def fallback_line(e: dict) -> str:
    resume = e.get("resume")
    where = f"resuming at {resume_text(resume)}" if resume else "starting over (no checkpoint yet)"
    changes = describe_change(e.get("changed") or {}, sep="; ")
    return (f"fallback: attempt {e['next_attempt']} on {e['to_preset']} ({e['why']})"
            + (f": {changes}" if changes else "") + f"; {where}")


def summary_text(summary: dict) -> str:
    """'3 attempts (mps: native-crash at step 117; cpu: finished), 17 steps lost to crashes'."""
    parts = [f"{a['preset']}: {a['outcome']}" + (f" after step {a['last_step']}" if a["outcome"] not in
                                                  ("finished", "stopped") and a.get("last_step") else "")
             for a in summary.get("attempts", [])]
    n = len(parts)
    text = f"{count(n, 'attempt')} ({'; '.join(parts)})"
    if summary.get("steps_lost"):
        text += f", {count(summary['steps_lost'], 'step')} lost to crashes"
    return text


def _quiet(step: dict, t: float) -> float | None:
    """How long there has been no step as of `t`, when that is unusual for this run (longer than
    10 s and three of its windows)."""
    gap = t - step["t"]
    return gap if gap > max(10.0, 3 * (step.get("window_s") or 0.0)) else None


class HeadlessPrinter:
    """Callable on a list of events; survives its terminal going away (SSH drop, closed pipe).
    `live`: a status line redrawn in place (default: when the stream is a terminal)."""

    def __init__(self, as_json: bool = False, stream: TextIO | None = None, *, live: bool | None = None,
                 log_every_s: float = LOG_EVERY_S, width: int | None = None):
        self.as_json = as_json
        self.stream = stream or sys.stdout
        self.alive = True
        if live is None:
            try:
                live = self.stream.isatty()
            except (AttributeError, ValueError):
                live = False
        self.live = live and not as_json
        self.log_every_s = log_every_s
        self.width = width
        self.memory: dict | None = None  # the latest memory event, shown with the step
        self.step: dict | None = None    # the attempt's latest step event
        self.windows = 0                 # its step windows so far (the ETA settles)
        self.activity: dict | None = None  # the mining_started or eval_started under way
        self.started: dict | None = None     # the attempt's attempt_started (its wait for a first step)
        self.group: dict | None = None       # the last heartbeat inside a long accumulation group
        self.logged_t: float | None = None   # the event time of the last progress line written
        self.logged: dict | None = None      # the step it showed
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
            lines += self._see(e)
        text = "".join(line + "\n" for line in lines)
        if self.live:
            status = self._status()
            if not text and status == shown:
                return
            text = ("\r\x1b[K" if shown else "") + text + status
            self.status = status
        self._write(text)

    def _see(self, e: dict) -> list[str]:
        kind = e["type"]
        if kind == "memory":
            self.memory = e
            return self._progress(e["t"], stalled=True) if not self.live else []
        if kind == "step":
            self.step, self.windows, self.activity, self.group = e, self.windows + 1, None, None
            return self._progress(e["t"]) if not self.live else []
        if kind == "heartbeat":
            self.group = e if e.get("micro_batches") is not None else self.group
            return []
        if kind in ("mining_started", "eval_started"):
            self.activity = e
            return []
        if kind in ("mining", "eval", "crash", "attempt_ended"):
            self.activity = None
        lines = []
        if kind in ("crash", "attempt_started", "attempt_ended", "run_finished"):
            lines += self._end_attempt()
        if kind == "attempt_started":
            self.started = e
        line = human_line(e, self.memory)
        return lines + ([line] if line is not None else [])

    def _progress(self, t: float, stalled: bool = False) -> list[str]:
        """Not live: the attempt's first step, then one line per log_every_s of event time;
        before the first step, one per log_every_s saying how long the attempt has waited."""
        step = self.step
        if step is None:
            return self._waiting(t) if stalled else []
        if self.logged is not None and t - self.logged_t < self.log_every_s:
            return []
        line = step_line(step, self.memory, self.windows)
        if stalled and self.activity is not None:
            line += f"  ({activity_text(self.activity, t)})"
        elif stalled and (quiet := _quiet(step, t)) is not None:
            line += f"  (no step for {duration(quiet)}{self._group_text('; ')})"
        self.logged_t, self.logged = t, step
        return [line]

    def _waiting(self, t: float) -> list[str]:
        """Not live, no step yet: a line once the attempt (or its mining pass) has waited
        log_every_s since it began or since the last such line."""
        begun = self.activity or self.started
        if begun is None or t - (self.logged_t if self.logged_t is not None else begun["t"]) < self.log_every_s:
            return []
        self.logged_t = t
        return [self._before_first_step(t)]

    def _before_first_step(self, now: float | None) -> str:
        """'mining hard negatives for epoch 0 (40s)', 'attempt 1: no step yet (1m30s)', or ''."""
        if self.activity is not None:
            return activity_text(self.activity, now)
        if self.started is None or now is None or now - self.started["t"] < 1:
            return ""
        waiting = f"first step, {self._group_text()}" if self.group else "no step yet"
        return f"attempt {self.started.get('attempt', '?')}: {waiting} ({duration(now - self.started['t'])})"

    def _group_text(self, before: str = "") -> str:
        """'12/64 micro-batches': how far a long accumulation group is, from its heartbeats."""
        g = self.group
        return f"{before}{g['micro_batches']}/{g.get('of', '?')} micro-batches" if g else ""

    def _end_attempt(self) -> list[str]:
        """Where the attempt got to: the live line kept on screen, or its last step written."""
        step = self.step
        line = None if step is None else self._status() if self.live else \
            None if step is self.logged else step_line(step, self.memory, self.windows)
        self.step, self.windows, self.logged_t, self.logged, self.status = None, 0, None, None, ""
        self.started = self.group = None
        return [line] if line else []

    def _status(self) -> str:
        now = self.memory["t"] if self.memory is not None else None
        if self.step is None:  # loading, compiling, or a schedule that mines from epoch 0
            return self._before_first_step(now)
        quiet = _quiet(self.step, now) if now is not None else None
        activity = activity_text(self.activity, now) if self.activity is not None else \
            f"no step for {duration(quiet)}{self._group_text('; ')}" if quiet is not None and self.group else None
        width = self.width or shutil.get_terminal_size().columns
        return status_line(self.step, self.memory, self.windows, quiet, max(20, width - 1), activity)

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

"""Headless output: one human line per event worth a line, or every event as JSON."""

from __future__ import annotations

import json
import sys
from typing import TextIO

from engine.run.fallback import describe_change
from engine.numbers import rate


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
    """'rss 1.2 GB, mem 71%, swap-in 0 MB/s, pressure normal' from a memory event."""
    parts = []
    if m.get("rss") is not None:
        parts.append(f"rss {m['rss'] / 1e9:.1f} GB")
    if m.get("system_total"):
        parts.append(f"mem {100 * m['system_used'] / m['system_total']:.0f}%")
    if m.get("swap_in_per_s") is not None:
        parts.append(f"swap-in {m['swap_in_per_s'] / 1e6:.1f} MB/s")
    level = (m.get("pressure") or {}).get("level")
    parts.append(f"pressure {level or 'n/a'}")
    return ", ".join(parts)


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
        return f"run interrupted ({e['reason']}); continue it with: {e['resume']}"
    if kind == "trainer_ready":
        resumed = e.get("resumed_from")
        line = (f"attempt {e['attempt']}: {e['device']} {e['precision']}, batch {e['batch_size']} x "
                f"{e['accumulation']}, {e['parameters']:,} parameters, {e['total_steps']} steps "
                f"({e['reason']})")
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
        line = f"step {e['step']}"
        if e.get("total"):
            line += f"/{e['total']} ({100 * e['step'] / e['total']:.0f}%)"
        if e.get("loss") is not None:
            line += f"  loss {e['loss']:.4g}"
        if e.get("samples_per_s") is not None:
            line += f"  {rate(e['samples_per_s'])} samples/s"
        if "gflop_s" in e:
            line += f"  {e['gflop_s']:,.1f} GFLOP/s"
        if e.get("eta_s") is not None:
            line += f"  ETA {duration(e['eta_s'])}"
        if memory is not None:
            line += f"  | {memory_text(memory)}"
        return line
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
        self.memory: dict | None = None  # the latest memory event, shown on step lines

    def __call__(self, events: list[dict]) -> None:
        if not self.alive:
            return
        lines = []
        for e in events:
            if e["type"] == "memory":
                self.memory = e
            lines.append(json.dumps(e) if self.as_json else human_line(e, self.memory))
        text = "".join(line + "\n" for line in lines if line is not None)
        if not text:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self.alive = False  # the terminal is gone; the run goes on

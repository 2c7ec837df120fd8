"""The words and figures of a run that both front ends write: durations, ETAs, rates as
shown, what an attempt resumed from, a run's summary, a memory sample in one line. No Textual
and no terminal here (the headless printer and the TUI both import this).
"""

from __future__ import annotations

from engine.event_types import MemoryFields
from engine.numbers import count, duration, metric, rate

SETTLE_WINDOWS = 5   # an attempt's first step windows measure warm-up: its ETA says "settling"

# A run's status (engine.record.rundir.RunSummary's), in colour: the runs table, the comparison
# and the dashboard's title (which shows every status bold).
STATUS_STYLE = {"running": "bold cyan", "resuming": "bold cyan", "finished": "green", "stopped": "yellow",
                "failed": "bold red", "lost": "red", "interrupted": "yellow", "created": "dim", "broken": "bold red",
                # an adopted run's (cockpit adopt): its process ended, exit status unknown; or
                # cockpit stopped following it
                "ended": "green", "released": "yellow",
                # its time on a machine ended (a SLURM job's warning or preemption): requeued
                "preempted": "yellow"}


def rss_label(m: MemoryFields | dict) -> str:
    """What a memory event's `rss` measures: "rss", or on macOS "footprint" (the physical
    footprint, Activity Monitor's figure) and "footprint+rss" (some processes by RSS)."""
    return m.get("rss_kind") or "rss"


def memory_text(m: dict) -> str:
    """'rss 1.2 GB, mem 71%, swap-in 0 MB/s, cpu 190%, gpu 97%, pressure normal' from a memory
    event ('footprint 1.2 GB, ...' on macOS)."""
    parts = []
    if m.get("rss") is not None:
        parts.append(f"{rss_label(m)} {m['rss'] / 1e9:.1f} GB")
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


def throughput_parts(samples_per_s: float | None, steps_per_s: float | None,
                     tokens_per_s: float | None = None) -> list[str]:
    """['1,234 samples/s', '52,100 tokens/s']: samples/s where the samples per step are known,
    else steps/s (a guessed sample count is worse than none: a script that accumulates for
    itself reads 40x too low); tokens/s where the tokens per step are known. [] with no rate."""
    if samples_per_s is not None:
        parts = [f"{rate(samples_per_s)} samples/s"]
    elif steps_per_s is not None:
        parts = [f"{rate(steps_per_s)} steps/s"]
    else:
        parts = []
    if tokens_per_s is not None:
        parts.append(f"{rate(tokens_per_s)} tokens/s")
    return parts


def average_rate(figures, per: str = "", steps: str = "st/s") -> str:
    """A run's average rate in a column (`figures`: its Averages or RunSummary, or None):
    '317' (samples/s; with `per` '317/s'), or its steps/s where its samples per step are not
    known ('4.95 st/s', `steps` naming the unit), '-' with no rate."""
    found = None if figures is None else figures.rate
    if found is None:
        return "-"
    value, unit = found
    return f"{rate(value)}{per}" if unit == "samples" else f"{rate(value)} {steps}"


def shown_rates(e: dict) -> list[str]:
    """A step event's throughput as shown: the smoothed samples/s (and tokens/s at the same
    rate), or the window's steps/s where its samples per step are not known."""
    return throughput_parts(shown_rate(e), e.get("steps_per_s"), shown_per_sample(e, "tokens_per_s"))


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


def checkpoint_step(e: dict) -> str:
    """' at step 40', or ' after step 16' for a file whose name says no step (the step read
    before it was written: the script may have gone a little further), or ''."""
    if e.get("step") is None:
        return ""
    return f" {'after' if e.get('step_source') == 'reached' else 'at'} step {e['step']}"


def resume_text(resume: dict) -> str:
    """'step 40, sample 1,280', or a command's checkpoint file when its step is not known or
    known only as the step read before it was written ('ckpt.pt, written after step 16')."""
    parts = []
    if resume.get("step") is not None and resume.get("step_source") == "reached":
        name = str(resume.get("path", "its checkpoint")).rsplit("/", 1)[-1]
        return f"{name}, written after step {resume['step']}"
    if resume.get("step") is not None:
        parts.append(f"step {resume['step']}")
    if resume.get("samples_seen") is not None:
        parts.append(f"sample {resume['samples_seen']:,}")
    if not parts and resume.get("path"):
        parts.append(str(resume["path"]).rsplit("/", 1)[-1])
    return ", ".join(parts) or "the last checkpoint"


def summary_text(summary: dict) -> str:
    """'3 attempts (mps: native-crash at step 117; cpu: finished), 17 steps lost to crashes'."""
    parts = [f"{a['preset']}: {a['outcome']}" + (f" after step {a['last_step']}" if a["outcome"] not in
                                                  ("finished", "stopped") and a.get("last_step") else "")
             for a in summary.get("attempts", [])]
    n = len(parts)
    text = f"{count(n, 'attempt')} ({'; '.join(parts)})"
    if summary.get("steps_lost"):
        text += f", {count(summary['steps_lost'], 'step')} lost to crashes"
    if summary.get("steps_rewound"):
        text += f", {count(summary['steps_rewound'], 'step')} rewound"
    return text


# A goodput bucket in words (engine.record.goodput.BUCKETS), as the lines below name them.
BUCKET_WORDS = {"startup": "start-up", "compile": "compile", "checkpoint_save": "checkpoint saves",
                "checkpoint_load": "checkpoint loads", "eval": "evaluation", "epoch_prep": "epoch preparation",
                "lost": "steps trained again",
                "rewound": "steps rewound (a health finding went back)", "recovery": "recovery", "stalls": "stalls",
                "preemption": "preemption (the exit after the warning)",
                "unknown": "between steps (not told apart)", "other": "exits and the rest"}


def span(value: float) -> str:
    """A bucket's time: '0.3 s', '14 s', '3m05s'."""
    if value < 10:
        return f"{value:.1f} s"
    return f"{value:.0f} s" if value < 60 else duration(value)


def goodput_line(g: dict) -> str:
    """'goodput 72% of 1m10s: 50 s training kept (3m10s stopped, not counted)'."""
    if g.get("goodput") is None:
        return "goodput -: nothing timed yet"
    line = f"goodput {g['goodput']:.0%} of {duration(g['wall_s'])}: {span(g['productive_s'])} training kept"
    if g.get("gaps_s"):
        queued = g.get("queued_s") or 0.0
        line += (f" ({duration(queued)} queued after a preemption"
                 + (f", {duration(g['gaps_s'] - queued)} stopped" if g["gaps_s"] - queued >= 1 else "")
                 + ", not counted)" if queued >= 1 else f" ({duration(g['gaps_s'])} stopped, not counted)")
    return line


def badput_parts(g: dict, detail: bool = True) -> list[str]:
    """The badput's buckets, largest first ('start-up 14 s', ...), then those not known;
    `detail`: the start-up's parts too, where the trainer timed them."""
    buckets = g.get("buckets") or {}
    known = sorted(((v, k) for k, v in buckets.items() if v), reverse=True)
    parts = [f"{BUCKET_WORDS.get(k, k)} {span(v)}" + (startup_parts(g) if k == "startup" and detail else "")
             for v, k in known if v >= 0.05]
    unknown = [BUCKET_WORDS.get(k, k) for k, v in buckets.items() if v is None]
    if unknown:
        parts.append("not known: " + ", ".join(unknown))
    return parts


def startup_parts(g: dict, most: int = 3) -> str:
    """' (launch 2.7 s, model 2.2 s, data 1.1 s)': the start-up's largest parts
    (engine.train.startup), where the trainer timed them: not a command's, nor a run's from
    before they were timed (their start-up is all 'other')."""
    parts = g.get("startup_parts") or {}
    if not set(parts) - {"other", "cockpit"}:
        return ""
    timed = sorted(((v, k) for k, v in parts.items() if v >= 0.05 and k != "other"), reverse=True)
    return f" ({', '.join(f'{k} {span(v)}' for v, k in timed[:most])})" if timed else ""


def goodput_text(g: dict) -> str:
    """goodput_line and its badput in one line, for a log: '...; the rest: start-up 14 s, ...'."""
    parts = badput_parts(g)
    return goodput_line(g) + (f"; the rest: {', '.join(parts)}" if parts and g.get("goodput") is not None else "")

"""One line per event, as a person reads it: the step line, the live status line that fits a
terminal's width, and the sentence for every event worth one (eval, checkpoint, crash, fallback,
a machine of several lost or back, warning...). The headless printer writes them; the TUI's log
and events show them.
"""

from __future__ import annotations

from cockpit.present.words import (checkpoint_step, duration, eta_text, memory_text, resume_text,
                                   shown_per_sample, shown_rates, summary_text)
from engine.numbers import count, metric
from engine.text import strip_ansi
from engine.record.metrics import shown_metrics
from engine.record.state import MainMetric
from engine.record.rundir import interrupted_next
from engine.run.fallback import describe_change

BAR = 12


def _metrics(metrics: dict) -> str:
    """An eval's metrics: its loss first, timings left out (engine.record.metrics.shown_metrics)."""
    return "  ".join(f"{k} {metric(v)}" for k, v in shown_metrics(metrics).items())


def _main_text(main: MainMetric | None) -> str | None:
    """The run's main metric as a line shows it, once it is reported."""
    if main is None or main.value is None:
        return None
    return f"{main.name} {metric(main.value)}"


def step_line(e: dict, memory: dict | None = None, windows: int | None = None,
              main: MainMetric | None = None) -> str:
    """'step 40/400 (10%)  loss 0.41  reward 0.62  1,234 samples/s  52,100 tokens/s  ETA 2m10s
    | rss 0.3 GB, ...': steps/s in place of samples/s where the samples per step are not known."""
    line = f"step {e['step']}"
    if e.get("total"):
        line += f"/{e['total']} ({100 * e['step'] / e['total']:.0f}%)"
    if e.get("loss") is not None:
        line += f"  loss {metric(e['loss'])}"
    if (said := _main_text(main)) is not None:
        line += f"  {said}"
    for part in shown_rates(e):
        line += f"  {part}"
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
                width: int = 80, activity: str | None = None, main: MainMetric | None = None) -> str:
    """The live line, what fits in `width` in this order of importance:
    '[=====>     ]  35%  step 140/400  ETA 2m10s  loss 0.41  reward 0.62  1,234 samples/s
    52,100 tokens/s  pressure normal' (steps/s where the samples per step are not known).
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
        parts.append(f"loss {metric(e['loss'])}")
    if (said := _main_text(main)) is not None:
        parts.append(said)
    parts += shown_rates(e)
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
        if resume:
            where = f"from {resume_text(resume)}"
        elif e.get("resume_args"):   # an adopted run's own arguments say where: not the start
            where = "from where its own arguments say (" + " ".join(e["resume_args"]) + ")"
        else:
            where = "from the start (no checkpoint to resume from)"
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
                + (compiled_words(e) if e.get("compile") else "")
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
            step = checkpoint_step(resumed)
            line += "\n    resuming from " + resumed["path"] + (f" ({step.strip()})" if step else "")
            if resumed.get("restores"):  # what the program restores of it (mlx-lm: the adapters only)
                line += "\n    " + resumed["restores"]
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
    if kind == "health":
        done = {"stop": "; stopping the run", "rewind": "; going back to a checkpoint before it",
                "lower-lr": "; going back to a checkpoint before it, the learning rate halved"
                }.get(e.get("action") or "", "")
        return f"health: {e.get('sentence', e.get('kind'))}{done}"
    if kind == "warning":
        lines = [f"warning: {e.get('message', '')}"]
        for tip in e.get("advice") or []:
            how = "  (--set " + " --set ".join(tip["set"]) + ")" if tip.get("set") else ""
            lines.append(f"    - {tip['text']}{how}")
        if e.get("fallback"):
            lines.append("    the preset says fall back: checkpointing and moving to the next preset")
        return "\n".join(lines)
    if kind == "checkpoint":
        return f"checkpoint{checkpoint_step(e)}: {e.get('path', '?')}"
    if kind == "fault_injected":
        at = f"{e['at_s']:.1f} s in" + (f", step {e['step']}" if e.get("step") is not None else "") \
            if e.get("at_s") is not None else f"step {e.get('step')}"  # a timed fault: its time
        return f"attempt {e['attempt']}: injecting fault {e['spec']} at {at}"
    if kind == "parity":
        return f"attempt {e['attempt']}: parity check {e['verdict']}: {e['message']}"
    if kind == "crash":
        if e["kind"] == "health":   # ended by the supervisor, to go back (engine.run.rewind)
            return f"attempt {e['attempt']} ({e['preset']}) ended to go back: {e['sentence']}"
        line = f"attempt {e['attempt']} ({e['preset']}) crashed: {e['kind']}. {e['sentence']}"
        message = (e.get("evidence") or {}).get("message")
        # a run recorded before its evidence was cleaned may carry Rich's colour codes
        if e["kind"] == "user-code" and e.get("exception"):
            line += "\n" + _indent(strip_ansi(e["exception"]), 15)
        elif message:
            line += "\n" + _indent(strip_ansi(message), 3)
        return line
    if kind == "attempt_ended" and e["outcome"] == "config":
        if e.get("sentence"):   # its launcher judged it (a rendezvous that never formed)
            return f"attempt {e['attempt']} ({e['preset']}) could not start: {e['sentence']}"
        return f"attempt {e['attempt']} ({e['preset']}) refused its configuration:\n" + _indent(strip_ansi(e.get("tail", "")), 4)
    if kind == "fallback":
        return fallback_line(e)
    if kind == "nodes_changed":
        return nodes_changed_line(e)
    if kind == "threads":
        return threads_line(e)
    if kind == "run_failed":
        return f"no further attempt: {e.get('why') or e.get('reason', '?')}"  # the supervisor writes 'reason'
    if kind == "run_finished":
        return f"run {e['status']}" + (f": {summary_text(e['summary'])}" if e.get("summary") else "")
    return None


def compiled_words(e: dict) -> str:
    """How a trainer_ready's model was compiled: whole, or block by block (engine.train.compiling)."""
    if e.get("compiled") == "regional":
        blocks = e.get("compiled_blocks", 0)
        return f", compiled (regional: {blocks} repeated block{'s' if blocks != 1 else ''})"
    if e.get("compiled") == "model":
        return ", compiled (whole model)"
    return ", compiled"   # written before the trainer said how


def _indent(text: str, last: int) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines()[-last:])


def nodes_changed_line(e: dict) -> str:
    """'attempt 2: world 2 -> 1 machines, 2 processes (a machine lost); resumed at step 40,
    2 steps lost': a machine of several restarted its workers in another world."""
    before, now, world = e["nodes_before"], e["nodes"], e["world_size"]
    gone = before - now
    what = (("a machine" if abs(gone) == 1 else f"{abs(gone)} machines") + (" lost" if gone > 0 else " back")
            if gone else "the same machines")
    lost = f"{count(e['steps_lost'], 'step')} lost" if e["steps_lost"] else "no step lost"
    return (f"attempt {e['attempt']}: world {before} -> {now} machines, {world} process{'es' * (world != 1)} "
            f"({what}); resumed at step {e['resumed_step']}, {lost}")


def threads_line(e: dict) -> str:
    """'attempt 1: torch threads 4 -> 2 at step 3: other processes need about 2.1 of the 4 cores
    (threads beyond the free cores wait on each other)', or '... 1 -> 2 at step 40: the cores
    are free again (others use 0.1 of 2)': the trainer fitting its threads to the machine."""
    head = f"attempt {e['attempt']}: torch threads {e['was']} -> {e['threads']} at step {e['step']}"
    if e["reason"] == "contention":
        return (f"{head}: other processes need {need_text(e['others_need'], e['cores'])} "
                "(threads beyond the free cores wait on each other)")
    return f"{head}: the cores are free again (others use {e['others']:.1f} of {e['cores']})"


def need_text(need: float, cores: int) -> str:
    """'about 1.4 of the 2 cores', or 'all 2 cores' where the estimate is as many or more (it
    can be: engine.train.threads scales what the others got by how they were squeezed)."""
    if need >= cores - 0.05:
        return "all " + count(cores, "core") if cores > 1 else "the one core"
    return f"about {need:.1f} of the {count(cores, 'core')}"


def fallback_line(e: dict) -> str:
    resume = e.get("resume")
    where = f"resuming at {resume_text(resume)}" if resume else "starting over (no checkpoint yet)"
    changes = describe_change(e.get("changed") or {}, sep="; ")
    if e.get("rewind"):   # a health finding's: the same preset, from before it
        return f"rewind: attempt {e['next_attempt']} on {e['to_preset']} ({e['why']}); {where}"
    return (f"fallback: attempt {e['next_attempt']} on {e['to_preset']} ({e['why']})"
            + (f": {changes}" if changes else "") + f"; {where}")

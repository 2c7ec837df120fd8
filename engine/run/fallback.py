"""The fallback rules: what the next attempt is, given how the last one ended.

This is the notes' "decision script", done properly. Each crash kind maps to an action in
the device preset's [rules] table (DEFAULT_RULES fill the gaps):

    next         the next preset of the run's ladder (the starting preset's `fallback` list)
    retry        the same preset again, from the last checkpoint
    retry-progress  the same preset again while each attempt gets at least one checkpoint
                 further than the one before it (a crash that strikes at random points, as
                 note 001's Metal aborts at batch 927, then 117); the next preset once an
                 attempt makes no progress, or when the attempts left are only enough for one
                 on each preset below (max_attempts)
    retry-env    the same preset with the environment fix for the kind (openmp:
                 KMP_DUPLICATE_LIB_OK=TRUE); the next preset if the fix is already in place
    fp32         the same preset in fp32; the next preset if it already ran in fp32
    eager        the same preset with compile = false; the next preset if it ran eagerly
    halve-batch  half the micro-batch, twice the accumulation (the same effective batch);
                 the next preset once the micro-batch is 1
    stop         end the run as failed

user-code always stops: falling back does not fix a bug. Every attempt resumes from the
last checkpoint by samples seen, so a changed batch continues at the same sample.
Torch-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.preset_types import DevicePreset
from engine.run.crashes import Verdict
# The actions and the environment fixes are engine.vocabulary's (presets check rules against
# them without importing this floor).
from engine.vocabulary import ENV_FIXES

DEFAULT_RULES: dict[str, str] = {
    "oom": "halve-batch",
    "backend": "next",
    "native-crash": "retry-progress",
    "openmp": "retry-env",
    "numerical": "fp32",
    # The device computed wrong numbers: the next preset, whose own check (seconds) says whether
    # its settings (the known bugs hang on shapes and layouts) avoid them, before the CPU.
    "numerical-parity": "next",
    # torch.compile failed (no Triton here, a model Dynamo cannot trace): the device is fine.
    "compile": "eager",
    "hang": "next",
    "killed": "retry",
    "user-code": "stop",
    "checkpoint": "retry",   # from the checkpoint before it: the supervisor skips the bad one
    "slowdown": "next",
    # A machine of several is gone: this node's agent joins the rendezvous again, which re-forms
    # the run without it where nnodes is 'MIN:MAX' (and with it once it is back); a run whose
    # nnodes is a number cannot go on without it, and stops.
    "node-lost": "retry",
    "unknown": "next",
}
# Fields a rule may change; what `changed` reports.
_COMPARED = ("device", "nproc_per_node", "nnodes", "batch_size", "accumulation", "precision", "env",
             "grad_checkpointing",
             "compile", "threads")


@dataclass(frozen=True)
class Rung:
    """A place on the fallback ladder: a preset by name (rules may have adjusted it). Not an
    optimizer step."""

    name: str
    preset: "DevicePreset"


@dataclass(frozen=True)
class Decision:
    action: str                 # the action taken (after fall-throughs), or "stop"
    why: str                    # in words: the rule, and any fall-through
    next: Rung | None = None    # None: the run ends as failed
    changed: dict | None = None  # field -> [before, after]


class Ladder:
    """The run's ordered presets: the starting one, then its fallback list."""

    def __init__(self, start: Rung, rungs: dict[str, "DevicePreset"]):
        self.start = start
        self.order = [start.name, *start.preset.fallback]
        self.rungs = {start.name: start.preset, **rungs}

    def below(self, name: str) -> int:
        """How many presets of the ladder come after this one."""
        return len(self.order) - 1 - self.order.index(name) if name in self.order else 0

    def after(self, name: str) -> Rung | None:
        index = self.order.index(name) if name in self.order else len(self.order)
        for later in self.order[index + 1:]:
            return Rung(later, self.rungs[later])
        return None


def rule_for(preset: "DevicePreset", kind: str) -> str:
    return "stop" if kind == "user-code" else preset.rules.get(kind, DEFAULT_RULES[kind])


def got_further(before: dict | None, after: dict | None) -> bool:
    """Whether an attempt got a checkpoint further: `before` is the resume point it started
    from, `after` the one the next attempt would start from (the supervisor's resume points)."""
    if after is None:
        return False
    if before is None:
        return True
    if before.get("step") is not None and after.get("step") is not None:
        return after["step"] > before["step"]
    # Steps not known: another file is progress; the same one written again is not known to be
    # (nanoGPT re-saves its one ckpt.pt at the step it resumed from), so never a file's mtime.
    return after.get("path") != before.get("path")


def decide(verdict: Verdict, current: Rung, ladder: Ladder, attempts: int, max_attempts: int,
           precision_used: str | None = None, fixed: frozenset[str] = frozenset(),
           progressed: bool = False, node_losses: int = 0) -> Decision:
    """The next attempt after `verdict`, or a decision to stop. `fixed` names the settings the
    workload cannot change (a command that takes no {batch_size}): a rule that would change
    only those moves to the next preset instead of retrying the same thing. `progressed`: the
    attempt got a checkpoint further than the one it started from (`got_further`); `node_losses`:
    the run's attempts that ended with a machine lost, this one included."""
    action = rule_for(current.preset, verdict.kind)
    why = f"{verdict.kind} -> {action} (rule)"
    preset = current.preset
    if verdict.kind == "node-lost" and action != "stop":
        if not preset.elastic:
            return Decision("stop", f"{why}, but nnodes = {preset.nnodes!r} needs every machine: "
                                    "nnodes = 'MIN:MAX' goes on at fewer")
        if node_losses > preset.max_restarts:
            return Decision("stop", f"{why}, but the run has re-formed {preset.max_restarts} times "
                                    "(max_restarts)")
        # Re-forming after a lost machine is the rendezvous doing its work, not an attempt of
        # the run's own failing: max_restarts counts them, not max_attempts.
        return _to(action, why, current, Rung(current.name, preset))
    if action != "stop" and attempts >= max_attempts:
        return Decision("stop", f"{why}, but the run has used its {max_attempts} attempts (max_attempts)")
    if action == "retry":
        return _to(action, why, current, Rung(current.name, preset))
    if action == "retry-progress":
        below = ladder.below(current.name)
        if not progressed:
            why += "; the attempt got no checkpoint further than where it started, so the next preset"
        elif below and max_attempts - attempts <= below:
            why += (f"; it made progress, but the {max_attempts - attempts} attempts left "
                    "(max_attempts) are kept for the presets below, so the next preset")
        else:
            return _to(action, why + "; it got a checkpoint further", current, Rung(current.name, preset))
    if action == "retry-env":
        fix = ENV_FIXES.get(verdict.kind, {})
        if fix and any(preset.env.get(k) != v for k, v in fix.items()):
            return _to(action, why, current, Rung(current.name, dataclasses.replace(
                preset, env={**preset.env, **fix})))
        why += "; the environment fix is already in place, so the next preset"
    elif action == "fp32" and "precision" in fixed:
        why += "; the command takes no {precision}, so the next preset"
    elif action == "eager" and "compile" in fixed:
        why += "; the command compiles as its own code says, so the next preset"
    elif action == "eager":
        if preset.compile:
            return _to(action, why, current, Rung(current.name, dataclasses.replace(preset, compile=False)))
        why += "; it already ran eagerly, so the next preset"
    elif action == "halve-batch" and "batch_size" in fixed:
        why += "; the command takes no {batch_size}, so the next preset"
    elif action == "fp32":
        if (precision_used or preset.precision) != "fp32":
            return _to(action, why, current, Rung(current.name, dataclasses.replace(preset, precision="fp32")))
        why += "; it already ran in fp32, so the next preset"
    elif action == "halve-batch":
        if preset.batch_size > 1:
            return _to(action, why, current, Rung(current.name, dataclasses.replace(
                preset, batch_size=preset.batch_size // 2, accumulation=preset.accumulation * 2)))
        why += "; the micro-batch is already 1, so the next preset"
    elif action == "stop":
        return Decision("stop", why)
    following = ladder.after(current.name)
    if following is None:
        return Decision("stop", why + "; the fallback ladder is exhausted")
    return _to("next", why, current, following)


def _to(action: str, why: str, current: Rung, following: Rung) -> Decision:
    before, after = current.preset, following.preset
    changed = {k: [_plain(getattr(before, k)), _plain(getattr(after, k))]
               for k in _COMPARED if getattr(before, k) != getattr(after, k)}
    return Decision(action, why, following, changed)


def _plain(value):
    return dict(value) if hasattr(value, "items") else value


def describe_change(changed: dict, sep: str = ", ") -> str:
    """'batch_size 32 -> 16, env {} -> {KMP_DUPLICATE_LIB_OK=TRUE}' from a decision's `changed`."""
    def show(value) -> str:
        if isinstance(value, dict):
            return "{" + ", ".join(f"{k}={v}" for k, v in value.items()) + "}"
        return str(value)

    return sep.join(f"{k} {show(a)} -> {show(b)}" for k, (a, b) in changed.items())

"""Slowdown detection: throughput far below its own best while memory is the reason.

Note 003: a run that fits in unified memory only by swapping does not crash, it crawls
(226 s/it instead of 40-80). The supervisor feeds this detector the trainer's step windows
and its own memory samples (engine.monitor.sysmon); when smoothed throughput stays below `ratio` of
its best for `sustain_s` seconds AND the memory evidence is there -- swap-in above a floor
or pressure warn/critical -- it returns one `warning` event's fields, with advice built from
the workload's parameters and the device preset. Slow without memory evidence (an eval, a
slow disk, a neighbour on the GPU) is not this warning's business.

One warning per episode: after it fires, it stays quiet until throughput recovers to
`recover` of its best (hysteresis), so a run hovering at the threshold is not a stream of
warnings. Pure: no clock, no I/O; the caller passes times (any clock, the same for both feeds).

Limit: the best is the run's own. A run that swaps from its first step has no healthy best to
fall from; its memory events (pressure, swap) still show it.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any, Mapping

from engine import command
from engine.numbers import per_s, rate
from engine.preset_types import DevicePreset
from engine.event_types import Advice, WarningFields
from engine.schema import fields

# Parameter names that are a sequence length: activation memory grows with them (attention's
# scores quadratically). Note 003's biggest win was max_completion_length 512 -> 128.
SEQUENCE_PARAMS = ("seq_len", "seq_length", "max_seq_len", "max_seq_length", "max_length",
                   "max_len", "max_completion_length", "max_prompt_length", "context_length",
                   "block_size", "max_tokens")
MIN_SEQUENCE = 16  # below this, halving again is no longer a sequence-length fix


@dataclasses.dataclass(frozen=True)
class Context:
    """What advice is built from: the workload and its params, the preset, and what the
    trainer resolved (trainer_ready's `device` and `precision`)."""

    workload: str = ""
    params: Any = None                 # the workload's Params dataclass, or a plain mapping
    preset: DevicePreset = dataclasses.field(default_factory=DevicePreset)
    device: str | None = None          # "cpu" | "cuda" | "cuda:0" | "mps"
    precision: str | None = None       # resolved: fp32 | bf16 | fp16


def _params_table(params: Any) -> dict[str, tuple[Any, float | None]]:
    """name -> (value, schema minimum or None)."""
    if params is None:
        return {}
    if dataclasses.is_dataclass(params):
        return {name: (getattr(params, name), f.metadata.get("min"))
                for name, (f, _) in fields(type(params)).items()}
    return {name: (value, None) for name, value in dict(params).items()}


def advice(ctx: Context) -> list[Advice]:
    """Concrete changes, most effective first, each with the `--set` items that apply it."""
    out: list[Advice] = []
    preset = ctx.preset
    name = f"the {ctx.workload} workload's " if ctx.workload else ""
    for key, (value, lo) in _params_table(ctx.params).items():
        if key not in SEQUENCE_PARAMS or isinstance(value, bool) or not isinstance(value, int):
            continue
        new = value // 2
        if new < max(MIN_SEQUENCE, lo or 0):
            continue
        out.append({"text": f"cut params.{key} {value} -> {new}: {name}activation memory grows "
                            "with sequence length", "set": [f"params.{key}={new}"]})
    if not preset.grad_checkpointing:
        out.append({"text": "set device.grad_checkpointing=true: activations are recomputed in "
                            "the backward pass, roughly 20-30% more compute for far less memory",
                    "set": ["device.grad_checkpointing=true"]})
    b, a = preset.batch_size, preset.accumulation
    if b > 1:
        nb, na = b // 2, a * 2
        same = nb * na == b * a
        effective = f"same effective batch {b * a}" if same else f"effective batch {b * a} -> {nb * na}"
        out.append({"text": f"batch_size {b} -> {nb} with accumulation {a} -> {na} ({effective}): "
                            "half the activations in memory at once",
                    "set": [f"device.batch_size={nb}", f"device.accumulation={na}"]})
    kind = (ctx.device or preset.device).split(":")[0]
    # On CUDA, precision 'auto' resolves to fp32 only when the GPU lacks bf16: no advice then.
    auto_refused_bf16 = kind == "cuda" and preset.precision == "auto"
    if ctx.precision == "fp32" and kind in ("cuda", "mps") and not auto_refused_bf16:
        where = "needs macOS 14 or later" if kind == "mps" else "needs an Ampere or newer GPU"
        out.append({"text": f"precision fp32 -> bf16 ({where}): activations in 16 bits instead of 32",
                    "set": ["device.precision=bf16"]})
    out = [tip for tip in out if _takes(ctx, tip.get("set", []))]
    if not out:
        what = ("your command takes none of the preset's memory settings: give it {batch_size} "
                "and {accumulation}, or lower its own" if ctx.workload == "command" else
                "no memory setting left to lower in this preset: use a smaller model "
                "or a machine with more memory")
        out.append({"text": what, "set": []})
    if preset.on_slowdown == "warn" and preset.fallback:
        out.append({"text": f"or fall back on its own next time (next preset: {preset.fallback[0]})",
                    "set": ["device.on_slowdown=fallback"]})
    return out


def _takes(ctx: Context, settings: list[str]) -> bool:
    """A command changes only through the placeholders in its arguments: advice to set
    device.batch_size is no use to a script that takes no {batch_size}."""
    if ctx.workload != "command" or not hasattr(ctx.params, "command"):
        return True
    takes = command.used(ctx.params)
    keys = {item.partition("=")[0].removeprefix("device.") for item in settings}
    return all(k in takes for k in keys if k in ("batch_size", "accumulation", "precision",
                                                 "grad_checkpointing", "compile"))


class SlowdownDetector:
    """Feed `step()` with each step window and `memory()` with each memory sample; either
    returns a warning's fields (kind, message, advice, fallback, figures) or None."""

    def __init__(self, context: Context | None = None, *, ratio: float = 0.5,
                 recover: float = 0.8, smooth_s: float = 10.0, sustain_s: float = 30.0,
                 swap_in_floor: float = 1e6, min_windows: int = 2):
        # ratio 0.5: half speed is "well below", past step-to-step noise (about +-15% here,
        # README) and past the cost of gradient checkpointing (20-30%), which a user may turn
        # on mid-run. swap_in_floor 1 MB/s averaged over the last sustain_s: a healthy run pages
        # in about nothing; an idle browser tab paging back in is a brief burst, not an average.
        self.context = context or Context()
        self.ratio, self.recover = ratio, recover
        self.smooth_s, self.sustain_s = smooth_s, sustain_s
        self.swap_in_floor, self.min_windows = swap_in_floor, min_windows
        self.windows: deque[tuple[float, float, float]] = deque()  # (start, end, samples/s)
        self.samples: deque[tuple[float, float | None, str | None]] = deque()  # (t, swap-in, level)
        self.longest_window = 0.0
        self.best: float | None = None
        self.smoothed: float | None = None
        self.slow_since: float | None = None
        self.slow_windows = 0
        self.warned = False
        self.episodes = 0

    # ------------------------------------------------------------ feeds

    def step(self, samples_per_s: float, t: float,
             window_s: float | None = None) -> WarningFields | None:
        window_s = window_s if window_s and window_s > 0 else 1.0
        self.windows.append((t - window_s, t, float(samples_per_s)))
        self.longest_window = max(self.longest_window, window_s)
        while self.windows[0][1] <= t - self.smooth_s and len(self.windows) > 1:
            self.windows.popleft()
        covered = t - self.windows[0][0]
        span = sum(end - start for start, end, _ in self.windows)
        self.smoothed = sum((end - start) * s for start, end, s in self.windows) / span
        if covered < self.smooth_s:
            return None  # warm-up: one early window must not set an unreachable best
        if self.best is None or self.smoothed > self.best:
            self.best = self.smoothed
        if self.smoothed < self.ratio * self.best:
            if self.slow_since is None:
                self.slow_since = t - window_s
            self.slow_windows += 1
        elif not self.warned or self.smoothed >= self.recover * self.best:
            # Not slow enough (yet), or recovered after a warning: the episode is over. A
            # warned episode outlives the band between ratio and recover (hysteresis).
            self.slow_since, self.slow_windows, self.warned = None, 0, False
        return self._check(t)

    def memory(self, sample: Mapping, t: float) -> WarningFields | None:
        level = (sample.get("pressure") or {}).get("level")
        self.samples.append((t, sample.get("swap_in_per_s"), level))
        # Keep enough for the evidence window even if the next step window is twice the
        # longest so far; a healthy day-long run must not grow this without bound.
        keep = 2 * max(self.sustain_s, self.longest_window)
        while self.samples[0][0] < t - keep:
            self.samples.popleft()
        return self._check(t)

    # ------------------------------------------------------------ decision

    def _evidence(self, t: float) -> tuple[float | None, str | None]:
        """Mean swap-in and the worst pressure level over the last sustain_s (or the last
        step window, when steps are slower than that): evidence from now, not from the
        start of a long slow period."""
        last = self.windows[-1][1] - self.windows[-1][0] if self.windows else 0.0
        horizon = t - max(self.sustain_s, last)
        recent = [s for s in self.samples if s[0] >= horizon]
        rates = [r for _, r, _ in recent if r is not None]
        swap_in = sum(rates) / len(rates) if rates else None
        levels = [lvl for _, _, lvl in recent if lvl in ("warn", "critical")]
        worst = "critical" if "critical" in levels else ("warn" if levels else None)
        return swap_in, worst

    def _check(self, t: float) -> WarningFields | None:
        if self.warned or self.slow_since is None or self.slow_windows < self.min_windows:
            return None
        if t - self.slow_since < self.sustain_s:
            return None
        swap_in, pressure = self._evidence(t)
        swapping = swap_in is not None and swap_in >= self.swap_in_floor
        if not (swapping or pressure):
            return None
        self.warned = True
        self.episodes += 1
        return self._warning(swap_in if swapping else None, pressure)

    def _warning(self, swap_in: float | None, pressure: str | None) -> WarningFields:
        because = []
        if swap_in is not None:
            because.append(f"swap-in is {per_s(swap_in)}")
        if pressure:
            because.append(f"memory pressure is {pressure}")
        smoothed, best = self.smoothed, self.best
        assert smoothed is not None and best is not None  # _check warns only after slow windows
        percent = round(100 * smoothed / best)
        message = (f"throughput {rate(smoothed)} samples/s is {percent}% of its best "
                   f"{rate(best)} while " + " and ".join(because)
                   + ": memory is too full for this configuration")
        preset = self.context.preset
        return {
            "kind": "slowdown", "message": message, "advice": advice(self.context),
            "fallback": preset.on_slowdown == "fallback" and bool(preset.fallback),
            "samples_per_s": round(smoothed, 3), "best_samples_per_s": round(best, 3),
            "swap_in_per_s": None if swap_in is None else round(swap_in, 1), "pressure": pressure,
        }

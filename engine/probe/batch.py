"""The batch finder: the largest micro-batch that fits, and on unified memory the largest
that keeps the machine calm.

Note 003's LoRA run did not crash at its batch size: it ran at 226 s/it instead of 40,
because unified memory was swapping. "Largest before out-of-memory" is the wrong answer
there, so a trial fits only if it
  - trains without a crash (an out-of-memory is the usual one),
  - keeps memory pressure normal (or no worse than before the finder started),
  - keeps swap flat (less than SWAP_FLAT_BYTES swapped in, swap use not growing by more),
  - stays within the device's memory with headroom for fragmentation (CUDA: the caching
    allocator's peak under 90% of the GPU; MPS: Metal's allocation under 90% of its
    recommended working set), and
  - stays under --memory-limit, if one is given (the trainer's footprint: its peak RSS, or
    the GPU's peak allocation on CUDA).

Search: double from the preset's micro-batch until a trial does not fit (halve if the first
does not), then bisect between the largest that fits and the smallest that does not, in
multiples of 8, until they are within an eighth of each other. One worker runs trials while
they fit; a trial that does not fit ends its worker (its memory may be wrecked, the machine
may be swapping), and the next trial starts a fresh one.

A command workload (engine.probe.command_worker) is sized through its `{batch_size}`: each
trial is a fresh run of the command at that size with `{accumulation}` 1, timed for the
trial's time after its first step and judged alike. Its GPU memory is not visible from here
(no torch in its process from our side), so on CUDA a command's batch is judged by whether it
runs out of memory (and by the machine's memory), not by the 90% headroom.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, cast

from engine import command as commands
from engine.errors import ConfigError
from engine.numbers import rate
from engine.preset_types import DevicePreset
from engine.probe import FINDER_BUDGET_S, MAX_BATCH, TRIAL_S
from engine.probe.measure import POLL_S, PRESSURE_RANK, SAMPLE_EVERY_S, Worker
from engine.probe.workers import start_worker
from engine.runconfig import RunConfig
from engine.schema import to_table
from engine.monitor.sysmon import SystemSampler

SWAP_FLAT_BYTES = 64 * 2**20
DEVICE_HEADROOM = 0.9
# Crashes that say the batch is too big (Metal's out-of-memory is often an abort, and the
# kernel's OOM killer a SIGKILL); any other crash is a problem no batch size fixes, and stops
# the search with its verdict.
TOO_BIG = ("oom", "native-crash", "backend", "killed", "hang")
SETTLE_S = 20.0   # at most this long for pressure to fall back after a trial that raised it
# A compiled model recompiles for each new batch shape: a trial's allowance grows by this.
COMPILE_ALLOWANCE_S = 120.0
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt])i?b?\s*$", re.I)   # a memory limit: 6G, 800M, 1.5GiB


@dataclass
class Trial:
    batch: int
    fits: bool
    why: str                               # "fits", or why it does not
    samples_per_s: float | None = None
    footprint_mb: float | None = None      # what the limits are checked against
    footprint_kind: str = ""               # which figure that is (peak RSS, CUDA peak, ...)
    pressure: str | None = None
    swap_in_mb: float | None = None
    crash: dict | None = None
    fatal: bool = False                    # a failure no batch size fixes: the search stops
    # torch's threads when it ended: the trainer lowers them while other processes take the
    # cores (engine.train.threads), and speeds at different counts are not the batch's doing
    threads: int | None = None



@dataclass
class BatchResult:
    workload_preset: str
    preset: str
    device: str | None
    base_batch: int
    base_accumulation: int
    trials: list[Trial]
    found: int | None                      # the largest micro-batch that fits
    smallest_misfit: int | None            # the smallest that does not (None: cap reached)
    micro_batch: int | None                # the suggestion, keeping the effective batch
    accumulation: int | None
    sentence: str
    memory_limit_mb: float | None = None
    seconds: float = 0.0
    created: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- judging one trial


def judge(batch: int, end_event: dict | None, reading, *, device: str, baseline_pressure: str | None,
          memory_limit_mb: float | None, crash: dict | None = None, why_not: str | None = None) -> Trial:
    """Does this trial fit? `reading` is the MemoryReading taken over the trial."""
    trial = Trial(batch, True, "fits", pressure=reading.pressure,
                  swap_in_mb=None if reading.swap_in is None else round(reading.swap_in / 2**20, 1))
    peak = (end_event or {}).get("peak", {})
    dev = (end_event or {}).get("device_memory", {})
    if end_event:
        trial.samples_per_s, trial.threads = end_event["samples_per_s"], end_event.get("threads")
    if device == "cuda":
        trial.footprint_mb, trial.footprint_kind = peak.get("peak_cuda_allocated_mb"), "CUDA peak allocated"
    else:
        rss = [v for v in (peak.get("peak_rss_mb"),
                           reading.peak_rss / 2**20 if reading.peak_rss else None) if v]
        footprint = max(rss) if rss else None
        if device == "mps" and peak.get("mps_driver_allocated_mb"):
            footprint = max(footprint or 0.0, peak["mps_driver_allocated_mb"])
        trial.footprint_mb, trial.footprint_kind = footprint, "peak footprint"

    def misfit(why: str) -> Trial:
        trial.fits, trial.why = False, why
        return trial

    if crash:
        trial.crash, trial.fatal = crash, crash["kind"] not in TOO_BIG
        return misfit(f"crashed ({crash['kind']}): {crash['sentence'].rstrip('.')}")
    if why_not:
        return misfit(why_not)
    if PRESSURE_RANK[reading.pressure] > PRESSURE_RANK[baseline_pressure or "normal"]:
        return misfit(f"memory pressure went to {reading.pressure}")
    if reading.swap_in is not None and reading.swap_in > SWAP_FLAT_BYTES:
        return misfit(f"swapped in {reading.swap_in / 2**20:.0f} MB during the trial")
    if reading.swap_growth > SWAP_FLAT_BYTES:
        return misfit(f"swap use grew by {reading.swap_growth / 2**20:.0f} MB")
    if device == "cuda" and dev.get("total") and peak.get("peak_cuda_allocated_mb"):
        if peak["peak_cuda_allocated_mb"] * 2**20 > DEVICE_HEADROOM * dev["total"]:
            return misfit(f"peak {peak['peak_cuda_allocated_mb']:,.0f} MB is over "
                          f"{DEVICE_HEADROOM:.0%} of the GPU's {dev['total'] / 2**20:,.0f} MB")
    if device == "mps" and dev.get("limit") and dev.get("driver"):
        if dev["driver"] > DEVICE_HEADROOM * dev["limit"]:
            return misfit(f"Metal holds {dev['driver'] / 2**20:,.0f} MB, over {DEVICE_HEADROOM:.0%} "
                          f"of its recommended {dev['limit'] / 2**20:,.0f} MB")
    if memory_limit_mb and trial.footprint_mb and trial.footprint_mb > memory_limit_mb:
        return misfit(f"{trial.footprint_kind} {trial.footprint_mb:,.0f} MB is over the "
                      f"--memory-limit of {memory_limit_mb:,.0f} MB")
    return trial


# ---------------------------------------------------------------- the search


def _nice(value: float, low: int, high: int) -> int | None:
    """A batch strictly between low and high near `value`: a multiple of 8 when there is one."""
    for step in (8, 1):
        candidate = int(round(value / step)) * step
        if low < candidate < high:
            return candidate
    return None


def next_batch(start: int, cap: int, good: int | None, bad: int | None) -> int | None:
    """The next size to try, or None when the search is done."""
    if good is None:
        return min(start, cap) if bad is None else (None if bad <= 1 else bad // 2)
    if bad is None:
        return None if good >= cap else min(2 * good, cap)
    if bad - good <= max(1, good // 8):
        return None
    return _nice((good + bad) / 2, good, bad)


def suggest(found: int, effective: int) -> tuple[int, int]:
    """(micro-batch, accumulation) with micro-batch <= found and their product = effective."""
    if found >= effective:
        return effective, 1
    micro = max(d for d in range(1, found + 1) if effective % d == 0)
    return micro, effective // micro


def preset_table(config: RunConfig, result: BatchResult) -> dict:
    """The device preset the batch finder suggests: the sized preset with the found
    micro-batch and the accumulation that keeps its effective batch."""
    table = to_table(config.device)
    table.update(batch_size=result.micro_batch, accumulation=result.accumulation,
                 description=f"found by cockpit probe --find-batch for {config.workload_preset}: "
                             f"micro-batch {result.micro_batch} x {result.accumulation} "
                             f"(largest that fits: {result.found})")
    return table


def parse_size_mb(text: str, argument: str = "--memory-limit") -> float:
    """A memory limit the user typed ('6G', '800M', '1.5GiB') in MB (2**20 bytes)."""
    match = SIZE.match(text)
    if not match:
        raise ConfigError(argument, None, f"got {text!r}; expected a size with its unit, such as 6G, "
                                          "800M or 1.5GiB")
    scale = {"k": 2**-10, "m": 1, "g": 2**10, "t": 2**20}[match.group(2).lower()]
    value = float(match.group(1)) * scale
    if value <= 0:
        raise ConfigError(argument, None, f"got {text!r}; expected a size above zero")
    return value


def find_batch(config: RunConfig, preset_name: str, preset: DevicePreset, *,
               max_batch: int = MAX_BATCH, memory_limit_mb: float | None = None,
               budget_s: float = FINDER_BUDGET_S, trial_s: float = TRIAL_S,
               on_progress: Callable[[dict], None] | None = None,
               cancel: threading.Event | None = None) -> BatchResult:
    check(config, preset, memory_limit_mb)
    # Trials run eagerly: each batch is a new shape, which a compiled model compiles again
    # (85 s for trm-chat-small on the H100). Eager memory is the larger (31 GB against 25 GB
    # compiled there), so a batch that fits eagerly fits compiled; the preset keeps its compile.
    preset = replace(preset, compile=False)
    tell = on_progress or (lambda update: None)
    started = time.time()
    deadline = started + budget_s
    system = SystemSampler(os.getpid())  # this process: the machine's pressure, not a worker's
    baseline = system.sample()["pressure"]["level"]
    trials: list[Trial] = []
    good = bad = None
    device = None
    worker = None
    out_of_time = False
    with tempfile.TemporaryDirectory(prefix="cockpit-batch-") as scratch:
        batch = next_batch(preset.batch_size, max_batch, None, None)
        try:
            while batch is not None and not (cancel and cancel.is_set()):
                if worker is None or not worker.alive:
                    worker = start_worker(config, preset, Path(scratch), batches=True, trial_s=trial_s)
                tell({"type": "trial", "batch": batch})
                last = next((t for t in reversed(trials) if t.fits and t.samples_per_s), None)
                expected_step_s = batch / last.samples_per_s if last and last.samples_per_s else None
                kind, value = _trial(worker, batch, baseline, memory_limit_mb, trial_s,
                                     expected_step_s, deadline, cancel)
                device = device or next((e["device"].split(":")[0]
                                         for e in worker.of_type("trainer_ready")), None)
                if kind == "time":
                    out_of_time = True
                    break
                if kind == "cap":  # the workload has only this many samples
                    max_batch = cast(int, value)
                else:
                    trial = cast(Trial, value)   # ("trial", Trial)
                    trials.append(trial)
                    tell({"type": "trial_done", "trial": trial})
                    if trial.fatal:
                        break
                    if trial.fits:
                        good = batch
                    else:
                        bad = batch
                        if worker.alive:  # its memory may be wrecked; the next starts afresh
                            worker.kill("probe")
                            worker.end()
                        if not _settled(system, baseline, deadline, cancel):
                            out_of_time = True
                            break
                batch = next_batch(preset.batch_size, max_batch, good, bad)
            if worker is not None and worker.alive:
                worker.send("done")
                worker.wait(time.time() + 10)
        finally:  # Ctrl-C or an error: the worker runs in its own session and must not linger
            if worker is not None and worker.alive:
                worker.kill("probe")
                worker.end()
    return _result(config, preset_name, preset, device, trials, good, bad, max_batch,
                   memory_limit_mb, out_of_time, round(time.time() - started, 1))


def check(config: RunConfig, preset: DevicePreset, memory_limit_mb: float | None) -> None:
    """ConfigError for what the finder cannot do here: a command it can size only through
    its {batch_size}, and its GPU memory it cannot see."""
    if not config.workload.is_command:
        return
    if not commands.used(config.workload.params) & {"batch_size", "effective_batch"}:
        raise ConfigError("--find-batch", None, f"varies the command's {{batch_size}}, and the command of "
                          f"{config.workload_preset!r} takes none; expected {{batch_size}} in its arguments")
    if memory_limit_mb and commands.resolve_device(preset.device) == "cuda":
        raise ConfigError("--memory-limit", None, "a command's GPU memory is not visible to cockpit, so "
                          "a limit on CUDA cannot be checked; expected none (the finder judges a "
                          "command on CUDA by whether it runs out of memory)")


def _settled(system: SystemSampler, baseline: str | None, deadline: float,
             cancel: threading.Event | None) -> bool:
    """Wait (up to SETTLE_S) for memory pressure to fall back to where it was before the
    finder started: PSI's avg10 and the macOS level trail a trial that raised them, and the
    next trial must not be blamed for it. False when the budget ran out first."""
    give_up = min(deadline, time.time() + SETTLE_S)
    while PRESSURE_RANK[system.sample()["pressure"]["level"]] > PRESSURE_RANK[baseline or "normal"]:
        if time.time() >= give_up or (cancel and cancel.is_set()):
            return time.time() < deadline
        time.sleep(0.5)
    return True


def _trial(worker: Worker, batch: int, baseline: str | None, memory_limit_mb: float | None,
           trial_s: float, expected_step_s: float | None, deadline: float,
           cancel: threading.Event | None = None) -> tuple[str, object]:
    """One trial on a live worker: ("trial", Trial), ("cap", the workload's sample count) when
    the batch is larger than that, or ("time", None) when the finder's budget ran out or it
    was cancelled."""
    sent = worker.send(str(batch))
    began = time.monotonic()
    # A trial far slower than the last batch's throughput predicts is thrashing (swap,
    # memory compression): not a fit. The clock starts once the worker is ready.
    allowance = max(20.0, 3 * (2 * (expected_step_s or 0.0) + trial_s))
    if worker.preset.compile:
        allowance += COMPILE_ALLOWANCE_S
    if worker.of_type("trainer_ready"):
        give_up = time.time() + allowance
    elif worker.startup_s is not None:  # a command starts afresh for each trial: its start-up again
        give_up = time.time() + allowance + 2 * worker.startup_s
    else:
        give_up = math.inf
    start = end = None
    while sent and worker.alive and time.time() < min(give_up, deadline):
        if cancel and cancel.is_set():
            return "time", None
        for e in worker.poll():
            if e["type"] == "trainer_ready":
                give_up = time.time() + allowance
            elif e["type"] == "batch_trial" and e["batch"] == batch:
                if e["phase"] == "skipped":
                    return "cap", e["num_samples"]
                if e["phase"] == "start":
                    start = e["_received"]
                elif e["phase"] == "end":
                    end = e
        if end:
            break
        time.sleep(POLL_S)
    time.sleep(SAMPLE_EVERY_S)  # one more memory sample, after the trial's peak
    worker.poll()
    # What came with the last output of a process that just ended (a command that finished)
    for e in worker.of_type("batch_trial"):
        if e["batch"] == batch and e["phase"] == "start":
            start = start or e["_received"]
        elif e["batch"] == batch and e["phase"] == "end":
            end = end or e
    reading = worker.memory(since=start or began)
    crash = why_not = None
    if end is None:
        if worker.alive:
            worker.kill("probe")
            worker.end()
            if time.time() >= deadline:
                return "time", None
            predicted = f", {allowance / 3:.0f} s expected" if expected_step_s else ""
            why_not = f"no answer within {time.monotonic() - began:.0f} s{predicted} (thrashing?)"
        else:
            ended = worker.end()
            if ended.verdict and ended.verdict.kind == "config":
                why_not = ended.config_error or ended.verdict.sentence
            elif ended.crashed and ended.verdict is not None:   # crashed: it has a verdict
                crash = {"kind": ended.verdict.kind, "sentence": ended.verdict.sentence,
                         "evidence": ended.verdict.evidence}
            else:
                why_not = "the worker ended without answering"
    device = next((e["device"].split(":")[0] for e in worker.of_type("trainer_ready")),
                  worker.preset.device)
    return "trial", judge(batch, end, reading, device=device, baseline_pressure=baseline,
                          memory_limit_mb=memory_limit_mb, crash=crash, why_not=why_not)


def _result(config: RunConfig, preset_name: str, preset: DevicePreset, device: str | None,
            trials: list[Trial], good: int | None, bad: int | None, cap: int,
            memory_limit_mb: float | None, out_of_time: bool, seconds: float) -> BatchResult:
    effective = preset.effective_batch
    on = f"on {device or preset.device} for {config.workload_preset}"
    micro = accumulation = None
    fatal = next((t for t in trials if t.fatal), None)
    if fatal:
        sentence = (f"The finder stopped {on}: batch {fatal.batch} {fatal.why}. No batch size fixes "
                    "that; fix it, then try again.")
    elif good is None:
        sentence = (f"No micro-batch fits {on}: batch {bad} {next(t.why for t in trials if t.batch == bad)}."
                    if bad else f"The finder ran out of time {on} before any trial finished: raise --budget.")
    else:
        micro, accumulation = suggest(good, effective)
        best = next(t for t in trials if t.batch == good)
        calm = "keeps pressure normal and swap flat" if device in ("mps", "cpu") else "fits"
        if memory_limit_mb:
            calm += f" within {memory_limit_mb:,.0f} MB"
        peak = f" (peak {best.footprint_mb:,.0f} MB)" if best.footprint_mb else ""
        if bad:
            limit = f"; {bad} did not: {next(t.why for t in trials if t.batch == bad)}"
        elif out_of_time:
            limit = "; the finder ran out of time before finding a batch that does not fit"
        else:
            limit = f"; the search stopped at the cap of {cap}"
        found = "the largest that" if bad or not out_of_time else "the largest tried that"
        sentence = f"Micro-batch {good} is {found} {calm} {on}{peak}{limit}. "
        if micro == effective and good > effective:
            sentence += (f"Your effective batch is {effective}: run it as {micro} x 1 (a larger "
                         "effective batch changes the optimisation, not just the speed).")
        else:
            sentence += f"To keep the effective batch of {effective}, use {micro} x {accumulation}."
            if micro < good / 2:  # the effective batch has no divisor near what fits
                rounded = good * math.ceil(effective / good)
                sentence += (f" ({effective} has no divisor between {micro} and {good}; an "
                             f"effective batch of {rounded} would run as {good} x {rounded // good}.)")
        fastest = max((t for t in trials if t.fits and t.samples_per_s and t.threads == best.threads),
                      key=lambda t: t.samples_per_s or 0.0, default=None)
        if fastest and fastest.samples_per_s and fastest.batch != good \
                and fastest.samples_per_s > 1.1 * (best.samples_per_s or 0):
            sentence += (f" Batch {fastest.batch} was the fastest ({rate(fastest.samples_per_s)} "
                         f"samples/s against {rate(best.samples_per_s or 0)}).")
        if out_of_time and bad:
            sentence += " (The finder ran out of time before narrowing it down: raise --budget.)"
        counts = sorted({t.threads for t in trials if t.threads}, reverse=True)
        if len(counts) > 1:
            sentence += (f" (Other processes took the cores: the trials ran at {' and '.join(map(str, counts))} "
                         "threads, so their speeds compare only at the same count.)")
    if config.workload.is_command and device == "cuda" and not fatal:
        sentence += (" (A command's GPU memory is not visible to cockpit: on CUDA its trials are "
                     "judged by whether it ran out of memory, with no headroom kept.)")
    return BatchResult(workload_preset=config.workload_preset, preset=preset_name, device=device,
                       base_batch=preset.batch_size, base_accumulation=preset.accumulation,
                       trials=trials, found=good, smallest_misfit=bad, micro_batch=micro,
                       accumulation=accumulation, sentence=sentence, memory_limit_mb=memory_limit_mb,
                       seconds=seconds)

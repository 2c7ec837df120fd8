"""The probe: each candidate in its own worker, one after another, within a time budget.

The budget is shared out as the probe goes (a candidate that crashes early leaves its time to
the rest), each worker is told when to be done and is ended at its slice's end regardless.
Candidates that trained are ranked by samples/s from their timed micro-batches (a command's:
its step windows), each with a 90% confidence interval (engine.probe.timings); the
recommendation says by how much the best beats the best other device, and how sure that is,
in a sentence. A candidate that finished no micro-batch in its time is an answer too: slower
than its micro-batch over the time waited, and the --budget that would time it.
"""

from __future__ import annotations

import math
import statistics
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from engine.numbers import count, rate
from engine.probe import PROBE_BUDGET_S, cache
from engine.probe.candidates import Candidate
from engine.probe.measure import POLL_S, Worker, WorkerEnd
from engine.probe.workers import start_worker
from engine.probe.timings import CONFIDENCE, Estimate, Timing, estimate, rates_interval
from engine.runconfig import RunConfig

FINISH_MARGIN_S = 2.5    # ranking, the cache write and printing, after the last worker
EXIT_MARGIN_S = 1.0      # a worker is told to stop this long before its slice ends
MIN_SLICE_S = 5.0

# A measurement whose timings' standard deviation is more than this share of their mean is
# reported as unsteady: on a machine this busy the ranking may not hold.
UNSTEADY = 0.35
# A too-slow candidate's suggested budget leaves room for a warm-up micro-batch and this many
# timed ones, each as long as the time it waited in vain (a lower bound: they may take longer).
SETTLE_TIMED = 3
# Ranked first to last: measured, measured roughly, measured not at all, broken.
STATUS_ORDER = {"ok": 0, "rough": 1, "wrong": 2, "too-slow": 3, "crashed": 4, "unavailable": 5}
# A compiled candidate's slice counts this many shares of the budget: its first steps compile.
COMPILE_SHARES = 2


@dataclass
class CandidateResult:
    label: str
    preset: str
    status: str                        # ok | rough | wrong | too-slow | crashed | unavailable
    device: str | None = None          # as the trainer resolved it ("cuda:0", "cpu")
    precision: str | None = None
    batch_size: int = 0
    accumulation: int = 1
    threads: int | None = None
    # the count the trainer had lowered its threads to beside other processes when it ended
    # (engine.train.threads: a run does the same); None: it ended at `threads`
    threads_fitted: int | None = None
    samples_per_s: float | None = None  # from the timed micro-batches (rough: warm-up's); a command's windows
    spread: list | None = None          # its 90% confidence interval [low, high]; high None: no fast end
    windows: int = 0                    # timings behind it (a command's: step windows)
    startup_s: float | None = None      # process start to model ready on the device
    first_step_s: float | None = None   # the first timing (a micro-batch), one-time costs included
    peak: dict = field(default_factory=dict)          # the worker's own peak-memory figure
    device_memory: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)        # MemoryReading.to_dict(): rss, pressure, swap
    crash: dict | None = None          # kind, sentence, evidence
    note: str = ""
    seconds: float = 0.0
    basis: str = ""                    # a command's: how its samples/s was derived, in words
    unit: str = "samples"              # "steps": a command that takes no {batch_size}
    compiled: bool = False             # compile = true (a CUDA candidate's compiled twin)
    compile_s: float | None = None     # its first micro-batch less a typical one: the compiling
    parity: dict | None = None         # the parity check's verdict, worst gradient and message
    micro_batches: int = 0             # micro-batches timed after warm-up (the trainer's)
    micro_batch_s: float | None = None  # the mean micro-batch: forward and backward
    optimizer_s: float | None = None   # the mean optimizer step's own work (None: not timed alone)
    steps_timed: int = 0               # optimizer steps timed, alone or whole (0: the figure leaves them out)
    waited_s: float | None = None      # too-slow: trained this long without finishing a micro-batch

    @property
    def trained(self) -> bool:
        return self.status in ("ok", "rough") and self.samples_per_s is not None

    @property
    def device_kind(self) -> str:
        return (self.device or "?").split(":")[0]

    @property
    def peak_mb(self) -> tuple[float | None, str]:
        """Peak memory in MB and where: the device's own figure where there is one ("gpu":
        the CUDA peak allocation, "metal": Metal's allocation), else the worker's peak RSS ("")."""
        for key, where in (("peak_cuda_allocated_mb", "gpu"), ("mps_driver_allocated_mb", "metal"),
                           ("peak_rss_mb", "")):
            if key in self.peak:
                return self.peak[key], where
        rss = self.memory.get("peak_rss")
        return (rss / 2**20 if rss else None), ""

    @property
    def peak_text(self) -> str:
        value, where = self.peak_mb
        return "-" if value is None else f"{value:,.0f} MB" + (f" {where}" if where else "")

    @property
    def batch_text(self) -> str:
        return f"{self.batch_size}" + (f" x {self.accumulation}" if self.accumulation > 1 else "")


@dataclass
class ProbeResult:
    workload_preset: str
    workload: str
    candidates: list[CandidateResult]
    recommended: str | None
    sentence: str
    budget_s: float
    seconds: float
    created: float = field(default_factory=time.time)
    machine: dict = field(default_factory=dict)
    key: str = ""
    workload_key: str = ""
    cached: bool = False
    settle_budget_s: float | None = None  # the --budget that would time its too-slow candidates

    @property
    def answered(self) -> bool:
        """A candidate to use, or one too slow to time: a bound measured (slower than its
        micro-batch over the time it waited, or a start-up longer than its slice), which is an
        answer too. Not when every candidate crashed, was unavailable or computed wrong numbers."""
        return self.recommended is not None or any(c.status == "too-slow" for c in self.candidates)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ProbeResult":
        data = dict(data)
        data["candidates"] = [CandidateResult(**c) for c in data["candidates"]]
        return cls(**data)


# ---------------------------------------------------------------- measuring


def probe(config: RunConfig, candidates: list[Candidate], budget_s: float = PROBE_BUDGET_S,
          on_progress: Callable[[dict], None] | None = None, started: float | None = None,
          cancel: threading.Event | None = None) -> ProbeResult:
    """Measure every candidate within `budget_s` seconds of wall time, counted from `started`
    (time.time(); default now: the CLI passes its process's start), and rank them. Setting
    `cancel` ends the probe after the current candidate's worker is stopped."""
    started = started or time.time()
    end = started + budget_s - FINISH_MARGIN_S
    tell = on_progress or (lambda update: None)
    results = []
    with tempfile.TemporaryDirectory(prefix="cockpit-probe-") as scratch:
        # Every worker starts now, so their imports (seconds each, cold) overlap; then they
        # are measured one at a time, with nothing else running.
        workers = [start_worker(config, c.preset, Path(scratch), **_parity(config, c))
                   for c in candidates]
        shares = [COMPILE_SHARES if c.preset.compile else 1 for c in candidates]
        try:
            if not config.workload.is_command:  # a command starts from scratch at its turn
                tell({"type": "importing", "total": len(candidates)})
            while not all(w.imported for w in workers) and time.time() < started + budget_s / 2 \
                    and not (cancel and cancel.is_set()):
                for w in workers:
                    w.poll()
                time.sleep(POLL_S)
            ready = time.time()  # what came before the first turn (imports) is the probe's own cost
            for i, (candidate, worker) in enumerate(zip(candidates, workers)):
                if cancel and cancel.is_set():
                    break
                share = (end - time.time()) * shares[i] / sum(shares[i:])
                slice_end = time.time() + max(MIN_SLICE_S, share)
                tell({"type": "candidate", "index": i, "total": len(candidates),
                      "label": candidate.label, "until": slice_end})
                worker.go(slice_end - EXIT_MARGIN_S)
                ended = worker.wait(slice_end, cancel=cancel, on_events=lambda new, c=candidate: tell(
                    {"type": "events", "label": c.label, "events": new}))
                result = candidate_result(candidate, worker, ended)
                results.append(result)
                tell({"type": "result", "result": result})
        finally:  # Ctrl-C, a cancel or an error: workers run in their own sessions
            for worker in workers:
                if worker.alive:
                    worker.kill("probe")
                    worker.end()
    ranked = rank(results)
    settle = settle_budget(ranked, ready - started)
    recommended, sentence = recommend(config.workload_preset, ranked, settle)
    return ProbeResult(workload_preset=config.workload_preset, workload=config.workload.workload,
                       candidates=ranked, recommended=recommended, sentence=sentence,
                       budget_s=budget_s, seconds=round(time.time() - started, 1),
                       settle_budget_s=settle, **cache.identify(config.workload, candidates, budget_s))


def settle_budget(results: list[CandidateResult], before_s: float) -> float | None:
    """The --budget that gives each too-slow candidate room for its start-up, a warm-up
    micro-batch and SETTLE_TIMED timed ones, each as long as it waited in vain (at least: its
    micro-batch took longer than that), with slices shared as the probe shares them and
    `before_s` (imports) first; None when no candidate was too slow with a bound."""
    slow = [r for r in results if r.waited_s]
    if not slow:
        return None
    shares = {id(r): COMPILE_SHARES if r.compiled else 1 for r in results}
    total = sum(shares.values())
    need = max(((r.startup_s or 0.0) + (1 + SETTLE_TIMED) * (r.waited_s or 0.0) + EXIT_MARGIN_S)
               * total / shares[id(r)] for r in slow)
    return float(math.ceil((before_s + need + FINISH_MARGIN_S) / 10) * 10)


def _parity(config: RunConfig, candidate: Candidate) -> dict:
    """Check the candidate against the CPU in fp32 first, unless it is that CPU (or a command,
    whose model cockpit cannot run twice)."""
    p = candidate.preset
    if config.workload.is_command or (p.device == "cpu" and p.precision in ("auto", "fp32")):
        return {}
    return {"parity": "also"}


def candidate_result(candidate: Candidate, worker: Worker, ended: WorkerEnd) -> CandidateResult:
    """What one worker's events, memory readings and end say about its candidate."""
    preset = candidate.preset
    result = CandidateResult(label=candidate.label, preset=candidate.preset_name, status="ok",
                             batch_size=preset.batch_size, accumulation=preset.accumulation,
                             seconds=round(time.monotonic() - (worker.went or worker.started), 1))
    ready = next(iter(worker.of_type("trainer_ready")), None)
    if ready:
        result.device, result.precision = ready["device"], ready["precision"]
        result.threads, result.startup_s = ready.get("threads"), ready.get("startup_s")
    result.basis, result.unit = worker.basis, worker.unit
    result.compiled = preset.compile
    checked = next(iter(worker.of_type("parity")), None)
    if checked:
        result.parity = {k: checked.get(k) for k in ("verdict", "ok", "worst_grad", "message")}
    done = next(iter(worker.of_type("probe_done")), None)
    steps = worker.of_type("step")
    last = done or (steps[-1] if steps else {})
    result.peak = (done or {}).get("peak", {})
    result.device_memory = last.get("device_memory", {}) or {}
    result.memory = worker.memory(since=worker.went or 0.0).to_dict()
    if worker.is_command:
        _command_figures(result, worker)
    else:
        _trainer_figures(result, worker)
    verdict = ended.verdict
    if ended.config_error or (verdict and verdict.kind == "config"):
        result.status = "unavailable"
        result.note = ended.config_error or (verdict.evidence.get("message") or verdict.sentence
                                             if verdict else "")
        result.samples_per_s = None
    elif ended.crashed and verdict is not None:   # crashed: it has a verdict
        result.status = "crashed"
        result.crash = {"kind": verdict.kind, "sentence": verdict.sentence,
                        "evidence": verdict.evidence}
        result.note = verdict.sentence
    elif result.parity and not result.parity["ok"]:
        result.status, result.note = "wrong", result.parity["message"]  # fast garbage is no candidate
    elif result.samples_per_s is None:
        result.status = "too-slow"
        if worker.is_command:
            result.note = _command_too_slow(ready, result.seconds)
        elif ready is None:
            result.note = (f"not ready to train after {result.seconds:.0f} s (start-up: data, model, "
                           "device); a larger --budget gives it time")
        else:
            waited = max(1e-9, result.seconds - (result.startup_s or 0.0))
            result.waited_s = round(waited, 1)
            result.note = (f"no micro-batch finished in {waited:.0f} s: slower than "
                           f"{rate(preset.batch_size / waited)} samples/s")
        if preset.compile:
            result.note += "; compile=true: compiling counts here, a larger --budget gives it time"
    fitted = worker.of_type("threads")
    if fitted and fitted[-1]["reason"] == "contention":   # raised again: it ended at its own count
        result.threads_fitted = fitted[-1]["threads"]
        said = (f"trained at {count(result.threads_fitted, 'thread')} from step {fitted[-1]['step']}: "
                "other processes took the cores (a run fits its threads the same way)")
        result.note = f"{result.note}; {said}" if result.note else said
    return result


def _trainer_figures(result: CandidateResult, worker: Worker) -> None:
    """samples/s and its interval from the worker's timed micro-batches; failing those, a
    rough figure from its warm-up."""
    b, a = result.batch_size, result.accumulation
    timed = [Timing.of(e) for e in worker.of_type("probe_timing")]
    warmup = [Timing.of(e) for e in worker.of_type("probe_warmup")]
    result.first_step_s = warmup[0].seconds if warmup else None
    # A group's optimizer step timed in warm-up, after the first (the optimizer's state is
    # allocated then), still says what one costs.
    tails = [t for t in warmup if t.steps and not t.micro_batches][1:]
    found = estimate(timed + tails, b, a) if timed else None
    if found is not None:
        _fill(result, found)
        if found.variation is not None and found.variation > UNSTEADY:
            result.note = (f"unsteady: its timings vary by {found.variation:.0%} of their mean "
                           "(was something else running?)")
    elif (found := estimate([t for t in warmup[1:] if t.micro_batches] + tails, b, a)) is not None:
        # the first micro-batch pays one-time costs: it is left out where others were timed
        result.samples_per_s, result.micro_batch_s = found.samples_per_s, found.micro_batch_s
        result.optimizer_s = found.optimizer_s
        result.status = "rough"
        result.note = f"from warm-up only ({_timed_text(found.micro_batches)}); none timed after it"
    elif warmup and (found := estimate(warmup[:1], b, a)) is not None:
        result.samples_per_s, result.micro_batch_s = found.samples_per_s, found.micro_batch_s
        result.status = "rough"
        result.note = "from its first micro-batch only (one-time costs included)"
    if result.compiled and warmup and result.samples_per_s:
        first = warmup[0]  # holds the first micro-batch: its compiling
        result.compile_s = round(max(0.0, first.seconds - first.micro_batches * b / result.samples_per_s), 1)


def _fill(result: CandidateResult, found: Estimate) -> None:
    result.samples_per_s = found.samples_per_s
    result.spread = [round(v, 4) if v is not None else None for v in found.interval] if found.interval else None
    result.windows, result.micro_batches = found.timings, found.micro_batches
    result.micro_batch_s, result.optimizer_s = found.micro_batch_s, found.optimizer_s
    result.steps_timed = found.steps


def _command_figures(result: CandidateResult, worker: Worker) -> None:
    """samples/s from a command's step windows (the mean, with its 90% interval); failing those,
    a rough figure from its warm-up windows."""
    steps = worker.of_type("step")
    warmup = worker.of_type("probe_warmup")
    result.first_step_s = warmup[0]["seconds"] if warmup else None
    if steps:
        rates = [e["samples_per_s"] for e in steps]
        result.samples_per_s = mean = statistics.fmean(rates)
        interval = rates_interval(rates)
        result.spread = [round(v, 4) for v in interval] if interval else None
        result.windows = len(rates)
        if len(rates) >= 2 and statistics.stdev(rates) > UNSTEADY * mean:
            result.note = (f"unsteady: its windows vary by {statistics.stdev(rates) / mean:.0%} "
                           "of their mean (was something else running?)")
    elif len(warmup) >= 2:
        later = warmup[1:]  # the first window pays one-time costs
        result.samples_per_s = sum(e["samples"] for e in later) / max(1e-9, sum(e["seconds"] for e in later))
        result.status, result.note = "rough", f"from {len(later)} warm-up window(s); no timed window fitted"
    elif warmup:
        result.samples_per_s = warmup[0]["samples"] / max(1e-9, warmup[0]["seconds"])
        result.status, result.note = "rough", "from its first window of steps only (early steps may be slower)"


def _timed_text(n: int) -> str:
    return f"{n:,} micro-batch{'es' * (n != 1)}"


def _command_too_slow(ready: dict | None, seconds: float) -> str:
    """Why a command gave no figure: the probe sees only the progress it prints or reports."""
    if ready is None:
        return (f"no training step seen in {seconds:.0f} s: its start-up (imports, data, model) "
                "counts here, and the probe reads only the progress it prints (tqdm, step lines, "
                "key=value, HF logs) or reports (cockpit.report); a larger --budget gives it time")
    return (f"its first step came after {ready['startup_s']:.0f} s and no window of steps "
            "followed in its time: it may print its progress too rarely; a larger --budget, a "
            "shorter logging interval or cockpit.report helps")


# ---------------------------------------------------------------- ranking


def rank(results: list[CandidateResult]) -> list[CandidateResult]:
    """Trained candidates fastest first, then the rest by how far they got."""
    return sorted(results, key=lambda r: (0 if r.trained else STATUS_ORDER[r.status],
                                          -(r.samples_per_s or 0.0)))


def _failures(results: list[CandidateResult]) -> list[str]:
    out = []
    for r in results:
        if r.status == "crashed":
            out.append(f"{r.label} crashed ({(r.crash or {}).get('kind')})")
        elif r.status == "too-slow":
            out.append(f"{r.label} was too slow to time ({r.note})")
        elif r.status == "unavailable":
            out.append(f"{r.label} is unavailable")
        elif r.status == "wrong":
            out.append(f"{r.label} computes wrong numbers (parity check: "
                       f"{(r.parity or {}).get('message')})")
    return out


def overlap(a: CandidateResult, b: CandidateResult) -> bool:
    """The two measurements' confidence intervals overlap: their order is noise. An interval
    with no fast end reaches every faster figure."""
    if not (a.spread and b.spread):
        return False
    inf = float("inf")
    return a.spread[0] <= (b.spread[1] or inf) and b.spread[0] <= (a.spread[1] or inf)


def interval_text(spread: list | None) -> str:
    """A confidence interval for a table: '1.1-1.4', '≥1.1' (no fast end: too few timings, far
    apart), '-' (none)."""
    if not spread:
        return "-"
    return f"≥{rate(spread[0])}" if spread[1] is None else f"{rate(spread[0])}-{rate(spread[1])}"


def sureness(r: CandidateResult) -> str:
    """How sure its figure is, in words: '±12% from 5 micro-batches timed', '±2% from 40 timings
    of 1,600 micro-batches', '1 micro-batch timed: no spread to judge by', 'at least 4
    samples/s, from 2 micro-batches timed' (an interval with no fast end); '' where nothing
    was timed after warm-up."""
    if not r.windows:
        return ""
    if r.micro_batches and r.micro_batches != r.windows:  # whole steps, several to a timing
        timed = f"{r.windows:,} timings of {_timed_text(r.micro_batches)}"
    elif r.micro_batches:
        timed = f"{_timed_text(r.micro_batches)} timed"
    else:
        timed = f"{r.windows:,} window{'s' * (r.windows != 1)} of steps"
    if not r.spread:
        return f"{timed}: no spread to judge by"
    if r.spread[1] is None:
        return f"at least {rate(r.spread[0])} {r.unit}/s, from {timed}"
    margin = max(r.spread[1] / r.samples_per_s - 1, 1 - r.spread[0] / r.samples_per_s)
    return f"±{margin:.0%} from {timed}"


def _how_sure(compared: list[CandidateResult]) -> str:
    said = [(r, sureness(r)) for r in compared]
    said = [(r, text) for r, text in said if text]
    if not said:
        return ""
    if len(said) == 1:
        return f" ({CONFIDENCE:.0%} confidence: {said[0][1]})"
    return f" ({CONFIDENCE:.0%} confidence: " + "; ".join(f"{r.label} {text}" for r, text in said) + ")"


def recommend(workload: str, ranked: list[CandidateResult],
              settle_s: float | None = None) -> tuple[str | None, str]:
    """(the label to use, the sentence that says why). `settle_s`: the --budget that would
    time the too-slow candidates (settle_budget)."""
    trained = [r for r in ranked if r.trained]
    failures = _failures(ranked)
    slow = [r for r in ranked if r.waited_s]  # a bound to time them by (not: not ready to train)
    settle = ""
    if settle_s is not None and slow:
        them = "them" if len(slow) > 1 and not trained else " and ".join(r.label for r in slow)
        settle = (f"; --budget {settle_s:.0f} or more would time {them} (room for a warm-up and "
                  f"{SETTLE_TIMED} timed micro-batches each, if one takes no longer than the time waited)")
    if not trained:
        if any(r.status == "too-slow" for r in ranked):  # an answer: each is slower than its bound
            return None, (f"No candidate finished a micro-batch of {workload} in its time: "
                          + "; ".join(failures) + settle + ".")
        return None, f"No candidate trained {workload}: " + "; ".join(failures) + "."
    best = trained[0]
    # A command that takes no {batch_size} is measured in steps/s: its batch is its own.
    at = f"for {workload}" + ("" if best.unit == "steps" else f" at batch {best.batch_text}")
    others = [r for r in trained[1:] if r.device_kind != best.device_kind] or trained[1:]
    if not others:
        sentence = f"{best.label} is the only candidate that trained {at}"
    else:
        other = others[0]
        ratio = (best.samples_per_s or 0.0) / max(other.samples_per_s or 0.0, 1e-12)  # trained: set
        times = f"{ratio:.2f}x" if ratio < 2 else f"{ratio:.1f}x"
        batch = "" if other.batch_text == best.batch_text or other.unit == "steps" \
            else f" (at batch {other.batch_text})"
        if overlap(best, other):
            sentence = (f"{best.label} and {other.label}{batch} are within measurement noise of each "
                        f"other {at} ({times}); {best.label} measured faster")
        elif best.windows and other.windows and not (best.spread and other.spread):
            # one timing (or one window) has no spread: the order is what was seen, no more
            sentence = f"{best.label} measured {times} faster than {other.label}{batch} {at}"
        else:
            sentence = f"{best.label} is {times} faster than {other.label}{batch} {at}"
        if other.status == "rough":  # a first step carries one-time costs: the margin is rough too
            sentence += f" ({other.label}'s figure is rough: {other.note})"
    compared = [best, *others[:1]]
    sentence += _how_sure(compared)
    if best.status == "rough":
        sentence += f" (rough: {best.note})"
    if best.basis:
        sentence += f" (a command: {best.basis})"
    sentence += _compile_verdict(best, trained)
    sentence += "".join(f"; {r.label} was {r.note}" for r in compared if r.note.startswith("unsteady"))
    untimed = [r.label for r in compared if r.status == "ok" and r.micro_batches and not r.steps_timed]
    if untimed:  # a long group: its figure is a little high, by one optimizer step per group
        sentence += (f"; no optimizer step of {' or '.join(untimed)} finished after warm-up: "
                     + ("its figure leaves" if len(untimed) == 1 else "their figures leave") + " it out")
    if failures:
        sentence += "; " + "; ".join(failures) + settle
    return best.label, sentence + "."


def _compile_verdict(best: CandidateResult, trained: list[CandidateResult]) -> str:
    """Whether compiling won on the best device, and by how much, against its eager twin."""
    twins = [r for r in trained if r.device_kind == best.device_kind and r.compiled != best.compiled
             and r.batch_text == best.batch_text]
    if not twins:
        return ""
    compiled, eager = (best, twins[0]) if best.compiled else (twins[0], best)
    ratio = (compiled.samples_per_s or 0.0) / max(eager.samples_per_s or 0.0, 1e-12)  # trained: set
    cost = f" after {compiled.compile_s:.0f} s of compiling" if compiled.compile_s is not None else ""
    if best.compiled:
        eager_rate = rate(eager.samples_per_s or 0.0)
        return f"; compiling wins: {ratio:.2f}x eager's {eager_rate} samples/s{cost}"
    return f"; compiling does not pay here: {ratio:.2f}x eager{cost}"

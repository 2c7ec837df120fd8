"""The device probe and the batch finder, through real worker processes on the CPU."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import types

import pytest

from conftest import child_env, cockpit_cmd, user_preset
from engine import runconfig
from engine.monitor.machine import machine as machine_info
from engine.probe import batch as finder, cache, candidates, measure, speed
from engine.probe.measure import MemoryReading
from engine.probe.speed import CandidateResult, probe, recommend, settle_budget
from engine.probe.timings import Timing, estimate
from engine.record.rundir import RunDir
from engine.run.supervisor import Supervisor

MATMUL = ["params.n=64", "params.products=8", "params.samples=4096", "params.eval_samples=64"]
# A TRM small enough for CPU trials whose memory grows steeply with the batch (activations).
SMALL_TRM = ["params.hidden_size=64", "params.num_heads=2", "params.L_layers=1", "params.H_cycles=1",
             "params.L_cycles=1", "params.seq_len=128", "params.corpus_bytes=200000", "threads=1"]


def _presets(home):
    user_preset(home, "devices", "small", 'device = "cpu"\nbatch_size = 4\nthreads = 1\n')
    user_preset(home, "devices", "large", 'device = "cpu"\nbatch_size = 128\nthreads = 1\n')
    user_preset(home, "devices", "crashy", 'device = "cpu"\nbatch_size = 16\nthreads = 1\n'
                                           'inject = ["native-crash@2+"]\n')


def _run(*args, timeout=120):
    return subprocess.run(cockpit_cmd(*args), capture_output=True, text=True, env=child_env(),
                          timeout=timeout)


# A direct run is stopped after this many step windows, however long they take to come: a
# fixed wall-clock window left a loaded machine too little time after the trainer's start-up.
DIRECT_WINDOWS = 12


def _direct_samples_per_s(workload: str, device: str, overrides: list[str]) -> tuple[float, dict]:
    """What a real run reports: the median of its step windows after the first, and its
    trainer_ready event."""
    config = runconfig.resolve(workload, device, overrides + ["train.max_steps=400000",
                                                             "train.epochs=1000", "train.report_every_s=0.2"])
    run = RunDir.create(config)
    windows = 0

    def count(events: list[dict]) -> None:
        nonlocal windows
        before, windows = windows, windows + sum(e["type"] == "step" for e in events)
        if before < DIRECT_WINDOWS <= windows:
            sup.request_stop()  # once: a second request would be "stop now"

    sup = Supervisor(run, on_events=count)
    assert sup.supervise() == "stopped"
    events = run.events()
    rates = [e["samples_per_s"] for e in events if e["type"] == "step"][1:]
    assert len(rates) >= DIRECT_WINDOWS - 1
    ready = next(e for e in events if e["type"] == "trainer_ready")
    return statistics.median(rates), ready


def test_a_probe_of_two_presets_ranks_them_as_a_direct_measurement_does(home):
    _presets(home)
    config = runconfig.resolve("matmul", "small", MATMUL)
    cands = candidates.build(config.workload, devices=[], preset_names=["small", "large"], base="auto",
                             overrides=MATMUL, threads=False)
    result = probe(config, cands, budget_s=20)
    measured = {c.label: c for c in result.candidates}
    assert all(c.status == "ok" and c.windows >= 3 for c in result.candidates), result.candidates
    runs = {name: _direct_samples_per_s("matmul", name, MATMUL) for name in ("small", "large")}
    direct = {name: rate for name, (rate, _) in runs.items()}
    probe_order = [c.label for c in result.candidates]
    assert probe_order == sorted(direct, key=direct.get, reverse=True)  # 10-30x apart here
    assert result.recommended == probe_order[0]
    # Not just the order: the probe's figures are the run's figures, of the same batch. Taken
    # a minute apart on a shared machine they differ by up to ~2.3x (seen beside three busy
    # loops on 2 cores), so the band is wide; a unit mistake (steps/s for samples/s) is 128x
    # off for 'large', and micro- for global batch is checked exactly.
    for name, (_, ready) in runs.items():
        c = measured[name]
        assert (c.batch_size, c.accumulation) == (ready["batch_size"], ready["accumulation"]), (c, ready)
        assert c.batch_size * c.accumulation == ready["global_batch"]
        assert 0.25 < c.samples_per_s / direct[name] < 4.0, (c, direct)
    ratio = measured[probe_order[0]].samples_per_s / measured[probe_order[1]].samples_per_s
    assert f"{ratio:.1f}x faster than" in result.sentence and "for matmul at batch" in result.sentence


def test_crashed_and_unavailable_candidates_are_results_not_the_end_of_the_probe(home):
    _presets(home)
    missing = "mps" if sys.platform != "darwin" else "cuda"  # a device this machine lacks
    user_preset(home, "devices", "gpu", f'device = "{missing}"\nbatch_size = 16\n')
    out = _run("probe", "-w", "matmul", "--presets", "crashy,small,gpu", "--budget", "24",
               "--no-threads", *[a for o in MATMUL for a in ("--set", o)], "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    rows = {c["label"]: c for c in result["candidates"]}
    assert rows["crashy"]["status"] == "crashed" and rows["crashy"]["crash"]["kind"] == "native-crash"
    assert rows["gpu"]["status"] == "unavailable" and f"'{missing}' is not available" in rows["gpu"]["note"]
    assert rows["small"]["status"] == "ok" and rows["small"]["samples_per_s"] > 0
    assert [c["label"] for c in result["candidates"]] == ["small", "crashy", "gpu"]
    assert result["recommended"] == "small"
    assert "crashy crashed (native-crash)" in result["sentence"]


def test_a_candidate_whose_step_outlasts_its_time_is_timed_by_its_micro_batches(home):
    # 200,000 micro-batches of one sample to a step: at least half a minute on any machine (the
    # loop's own work per micro-batch), far longer than its slice; its micro-batches are quick.
    user_preset(home, "devices", "long-steps", 'device = "cpu"\nbatch_size = 1\naccumulation = 200000\n'
                                               'threads = 1\n')
    sets = ["params.n=16", "params.products=8", "params.samples=200000", "params.eval_samples=64"]
    out = _run("probe", "-w", "matmul", "--presets", "long-steps", "--no-threads", "--budget", "14",
               "--json",
               *[a for o in sets for a in ("--set", o)])
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    (c,) = result["candidates"]
    assert c["status"] == "ok" and c["samples_per_s"] > 0, c
    assert c["micro_batches"] >= c["windows"] >= 1 and c["micro_batch_s"] > 0, c
    assert c["steps_timed"] == 0 and c["optimizer_s"] is None, c   # no step finished: left out, and said
    assert result["recommended"] == "long-steps"
    assert "micro-batches timed" in result["sentence"] or "timings of" in result["sentence"]
    assert "no optimizer step of long-steps finished after warm-up: its figure leaves it out" in result["sentence"]


def test_every_candidate_too_slow_is_an_answer_exit_0_with_its_bound_and_a_budget(home):
    # A candidate whose first micro-batch never ends (a wedged kernel, or a machine this slow):
    # the probe cannot tell, and says what it measured.
    user_preset(home, "devices", "stuck", 'device = "cpu"\nbatch_size = 4\nthreads = 1\n'
                                          'inject = ["hang@1+"]\n')
    args = ["probe", "-w", "matmul", "--presets", "stuck", "--no-threads", "--budget", "10",
            *[a for o in MATMUL for a in ("--set", o)]]
    out = _run(*args, "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    (c,) = result["candidates"]
    assert c["status"] == "too-slow" and c["waited_s"] > 0, c
    bound = f"no micro-batch finished in {c['waited_s']:.0f} s: slower than "
    assert c["note"].startswith(bound) and c["note"].endswith(" samples/s"), c
    assert result["recommended"] is None and result["settle_budget_s"] > 10
    assert result["sentence"].startswith("No candidate finished a micro-batch of matmul in its time: stuck was "
                                         f"too slow to time ({bound}")
    assert f"--budget {result['settle_budget_s']:.0f} or more would time stuck" in result["sentence"]
    shown = _run(*args)  # the table and the sentence, from the cache: exit 0 too
    assert shown.returncode == 0 and "cached result" in shown.stderr, shown.stderr
    assert result["sentence"] in shown.stdout and "run it:" not in shown.stdout


def test_cpu_candidates_are_tried_at_1_physical_and_logical_threads(home, monkeypatch):
    monkeypatch.setattr(candidates.psutil, "cpu_count", lambda logical=True: 8 if logical else 4)
    config = runconfig.resolve("matmul", "auto", [])
    found = candidates.build(config.workload, devices=["cpu"], preset_names=[], base="auto", overrides=[])
    assert [(c.label, c.preset.threads) for c in found] == [
        ("cpu (1 thread)", 1), ("cpu (4 threads)", 4), ("cpu (8 threads)", 8)]
    assert {c.preset.device for c in found} == {"cpu"} and {c.preset.batch_size for c in found} == {32}


def test_the_cache_answers_until_the_workload_configuration_changes(home):
    _presets(home)
    args = ["probe", "-w", "matmul", "--presets", "large", "--no-threads", "--budget", "8",
            *[a for o in MATMUL for a in ("--set", o)]]
    first = _run(*args)
    assert first.returncode == 0 and "probing matmul" in first.stderr, first.stderr
    again = _run(*args)
    assert again.returncode == 0 and "cached result" in again.stderr and "probing" not in again.stderr
    assert again.stdout == first.stdout
    changed = _run(*args, "--set", "params.n=48")
    assert "probing matmul" in changed.stderr and "cached" not in changed.stderr
    fresh = _run(*args, "--fresh")
    assert "probing matmul" in fresh.stderr
    assert len(list(cache.probes_dir().glob("*.json"))) == 2
    # The launch screen's line: the newest probe of matmul, the --fresh one of the default params.
    newest = cache.latest("matmul")
    assert newest["workload_key"] == cache.workload_key(runconfig.resolve("matmul", "auto", MATMUL).workload)
    assert cache.latest("trm-tiny") is None

    # A cache file this version cannot read is a miss, not a crash: an older version's schema,
    # then a candidate with fields this version does not know.
    (stored,) = [p for p in cache.probes_dir().glob("*.json")
                 if json.loads(p.read_text())["workload_key"] == newest["workload_key"]]
    data = json.loads(stored.read_text())
    stored.write_text(json.dumps({**data, "schema": 0}))
    assert cache.latest("matmul")["workload_key"] != newest["workload_key"]  # the other one, n=48
    older = _run(*args)
    assert older.returncode == 0 and "probing matmul" in older.stderr and "Traceback" not in older.stderr
    stored.write_text(json.dumps({**data, "candidates": [{"label": "x", "unknown": 1}]}))
    from cockpit.commands.probe import _cached  # what the command reads: a miss, as above

    assert stored.stem == data["key"] and _cached(data["key"]) is None


def test_the_cache_key_follows_params_presets_and_machine(home):
    config = runconfig.resolve("matmul", "auto", [])
    other = runconfig.resolve("matmul", "auto", ["params.n=128"])
    cands = candidates.build(config.workload, devices=["cpu"], preset_names=[], base="auto",
                             overrides=[], threads=False)
    machine = machine_info()
    base = cache.key(machine, config.workload, cands, 60)
    assert base == cache.key(machine, runconfig.resolve("matmul", "auto", []).workload, cands, 60)
    assert base != cache.key(machine, other.workload, cands, 60)
    assert base != cache.key({**machine, "gpus": ["NVIDIA H100"]}, config.workload, cands, 60)
    assert base != cache.key(machine, config.workload, cands, 120)
    bigger = candidates.build(config.workload, devices=["cpu"], preset_names=[], base="auto",
                              overrides=["batch_size=64"], threads=False)
    assert base != cache.key(machine, config.workload, bigger, 60)


# ---------------------------------------------------------------- recommendation sentences


def _r(label, rate, spread=None, device="cpu", status="ok", **kw):
    return CandidateResult(label=label, preset=label, status=status, device=device, batch_size=32,
                           samples_per_s=rate, spread=spread, **kw)


def test_the_sentence_names_the_margin_and_the_failures():
    label, text = recommend("trm", [_r("cuda", 310.0, [300, 320], "cuda:0"), _r("cpu (16 threads)", 10.0, [9, 11]),
                                    _r("mps", None, device="mps", status="crashed", crash={"kind": "oom"})])
    assert label == "cuda"
    assert text == "cuda is 31.0x faster than cpu (16 threads) for trm at batch 32; mps crashed (oom)."
    _, text = recommend("trm", [_r("cpu (2 threads)", 105.0, [95, 110]), _r("cpu (1 thread)", 100.0, [96, 104])])
    assert "within measurement noise" in text and "(1.05x)" in text
    unsteady = _r("cpu (2 threads)", 284.0, [129, 1358], note="unsteady: the middle half of its windows "
                  "spans 129-1,358 samples/s (was something else running?)")
    _, text = recommend("matmul", [_r("cpu (1 thread)", 2512.0, [2486, 2540]), unsteady])
    assert text.endswith("; cpu (2 threads) was unsteady: the middle half of its windows spans 129-1,358 "
                         "samples/s (was something else running?).")
    label, text = recommend("trm", [_r("mps", None, device="mps", status="too-slow", note="no step")])
    assert label is None and text.startswith("No candidate finished a micro-batch of trm in its time: mps was "
                                             "too slow to time (no step)")
    label, text = recommend("trm", [_r("mps", None, device="mps", status="crashed", crash={"kind": "oom"})])
    assert label is None and text == "No candidate trained trm: mps crashed (oom)."


def test_a_step_is_its_micro_batches_and_its_optimizer_step():
    # Three micro-batches of 0.5, 0.6 and 0.7 s timed alone, two optimizer steps of 0.2 s: a
    # step of 64 micro-batches of 8 samples is 64 x 0.6 + 0.2 s.
    timed = [Timing(0.5, 1, 0), Timing(0.2, 0, 1), Timing(0.6, 1, 0), Timing(0.2, 0, 1), Timing(0.7, 1, 0)]
    found = estimate(timed, micro_batch=8, accumulation=64)
    assert found.samples_per_s == pytest.approx(512 / (64 * 0.6 + 0.2))
    assert found.micro_batch_s == pytest.approx(0.6) and found.optimizer_s == pytest.approx(0.2)
    assert (found.timings, found.micro_batches, found.steps) == (3, 3, 2)
    assert found.low < found.samples_per_s < found.high
    # No step finished: the optimizer step is left out (and said to be), not guessed.
    alone = estimate([t for t in timed if t.micro_batches], micro_batch=8, accumulation=64)
    assert alone.samples_per_s == pytest.approx(8 / 0.6) and alone.optimizer_s is None and alone.steps == 0
    # Short steps timed whole, several to a timing: a step is what they took.
    whole = estimate([Timing(1.0, 40, 10), Timing(1.1, 40, 10)], micro_batch=8, accumulation=4)
    assert whole.samples_per_s == pytest.approx(32 / 0.105) and whole.steps == 20
    # Runs of short micro-batches and whole steps together: the optimizer step is what whole
    # steps take beyond their micro-batches.
    both = estimate([Timing(1.0, 10, 0), Timing(1.2, 4 * 3, 3)], micro_batch=8, accumulation=4)
    assert both.optimizer_s == pytest.approx(0.4 - 4 * 0.1)
    assert estimate([Timing(0.2, 0, 1)], micro_batch=8, accumulation=4) is None


def test_how_sure_follows_how_many_timings_and_how_far_apart():
    steady = [Timing(1.0 + 0.01 * (i % 3), 1, 0) for i in range(30)]
    few = steady[:3]
    margin = lambda timings: estimate(timings, 8, 1).margin  # noqa: E731
    assert margin(steady) < margin(few)                              # more timings: surer
    assert margin([Timing(1.0, 1, 0), Timing(1.5, 1, 0), Timing(0.8, 1, 0)]) > margin(few)  # farther apart
    one = estimate([Timing(1.0, 1, 0)], 8, 1)
    assert one.interval is None and one.samples_per_s == pytest.approx(8.0)
    # Two timings far apart: the interval has a slow end and no fast one.
    apart = estimate([Timing(1.0, 1, 0), Timing(2.0, 1, 0)], 8, 1)
    assert apart.high is None and 0 < apart.low < apart.samples_per_s


class _SleepyTrainer:
    """What MicroBatchClock sees of a Trainer: micro-batches of `micro_s` (a sleep), the hook
    after each, then an optimizer step of 10 ms."""

    def __init__(self, micro_s: float, accumulation: int):
        import torch

        self.device, self.micro_s, self.step, self.done = torch.device("cpu"), micro_s, 0, 0
        self.preset = types.SimpleNamespace(batch_size=2, accumulation=accumulation)
        self.emitted: list[tuple[str, dict]] = []
        self.events = types.SimpleNamespace(emit=lambda kind, **f: self.emitted.append((kind, f)))
        self.micro_batch_hook = None

    def train_step(self):
        of = self.preset.accumulation
        for m in range(of):
            time.sleep(self.micro_s)
            self.done += 1
            self.micro_batch_hook(m + 1, of)
        time.sleep(0.01)
        self.step += 1

    def maybe_report(self):
        pass


def test_the_worker_times_long_micro_batches_one_by_one_and_the_optimizer_step_alone():
    from engine.probe.worker import measure_speed

    trainer = _SleepyTrainer(micro_s=0.3, accumulation=3)
    measure_speed(trainer, until=time.time() + 3.0)
    assert trainer.micro_batch_hook is None
    timings = [(kind, f["micro_batches"], f["steps"]) for kind, f in trainer.emitted]
    # Each micro-batch is a timing of its own (it outlasts TIMING_S), and so is each optimizer step.
    assert {(m, s) for _, m, s in timings} <= {(1, 0), (0, 1)}, timings
    # The first micro-batch and the first optimizer step are warm-up, whenever they come.
    assert timings[0] == ("probe_warmup", 1, 0)
    assert next(t for t in timings if t[2]) == ("probe_warmup", 0, 1)
    assert any(t == ("probe_timing", 1, 0) for t in timings)
    assert sum(m for _, m, _ in timings) <= trainer.done and sum(s for *_, s in timings) <= trainer.step


def test_the_worker_times_short_steps_whole_and_never_splits_a_step_from_its_group():
    from engine.probe.worker import measure_speed

    trainer = _SleepyTrainer(micro_s=0.0, accumulation=4)
    measure_speed(trainer, until=time.time() + 1.5)
    timed = [f for kind, f in trainer.emitted if kind == "probe_timing"]
    assert timed and any(f["steps"] for f in timed)
    for f in timed:  # micro-batches of a group alone, its optimizer step alone, or whole groups
        assert f["steps"] == 0 or f["micro_batches"] in (0, 4 * f["steps"]), f
        assert f["samples"] == 2 * f["micro_batches"]
    assert all(f["samples_per_s"] > 0 for f in timed if f["micro_batches"])  # the figure so far, shown live


def _slow(label, waited, startup=2.0, compiled=False):
    return CandidateResult(label=label, preset="cpu", status="too-slow", device="cpu", batch_size=32,
                           accumulation=4, startup_s=startup, waited_s=waited, compiled=compiled,
                           note=f"no micro-batch finished in {waited:.0f} s: slower than "
                                f"{32 / waited:.3g} samples/s")


def test_every_candidate_too_slow_is_an_answer_with_its_bound_and_the_budget_that_settles_it():
    ranked = [_slow("cpu (1 thread)", 24.0), _slow("cpu (2 threads)", 21.0)]
    # Each needs its start-up, a warm-up and three timed micro-batches of at least the time it
    # waited: (2 + 4 x 24 + 1) s of a slice that is half the budget, after 10 s of imports.
    settle = settle_budget(ranked, before_s=10.0)
    assert settle >= 10.0 + 2 * (2 + 4 * 24 + 1) and settle % 10 == 0
    label, text = recommend("trm-tiny", ranked, settle)
    assert label is None
    assert text.startswith("No candidate finished a micro-batch of trm-tiny in its time: cpu (1 thread) was "
                           "too slow to time (no micro-batch finished in 24 s: slower than 1.33 samples/s)")
    assert f"--budget {settle:.0f} or more would time them" in text
    result = speed.ProbeResult("trm-tiny", "trm", ranked, label, text, 60.0, 58.0, settle_budget_s=settle)
    assert result.answered
    crashed = CandidateResult(label="mps", preset="mps", status="crashed", crash={"kind": "oom"})
    assert not speed.ProbeResult("trm-tiny", "trm", [crashed], None, "", 60.0, 58.0).answered
    # Not even ready to train in its time: a bound on its start-up, an answer too, but no
    # budget to name (how long its micro-batches take is unknown).
    unready = CandidateResult(label="cpu", preset="cpu", status="too-slow",
                              note="not ready to train after 20 s (start-up: data, model, device); a "
                                   "larger --budget gives it time")
    assert settle_budget([unready, crashed], 10.0) is None
    assert speed.ProbeResult("trm-tiny", "trm", [unready, crashed], None, "", 60.0, 58.0).answered
    _, text = recommend("trm-tiny", [unready, crashed])
    assert text == ("No candidate finished a micro-batch of trm-tiny in its time: cpu was too slow to time "
                    "(not ready to train after 20 s (start-up: data, model, device); a larger --budget "
                    "gives it time); mps crashed (oom).")
    # A compiled candidate's slice is twice the others': the budget gives it its room.
    assert settle_budget([_slow("cuda compiled", 24.0, compiled=True), _slow("cpu", 1.0)], 10.0) \
        < settle_budget([_slow("cuda compiled", 24.0), _slow("cpu", 1.0)], 10.0)
    # One too slow beside one that trained: the answer is the one that trained, and the other's bound.
    fast = _r("cpu (2 threads)", 3.0, [2.5, 3.6], windows=5, micro_batches=5, steps_timed=1)
    label, text = recommend("trm-tiny", [fast, _slow("cpu (1 thread)", 24.0)], 250.0)
    assert label == "cpu (2 threads)"
    assert "(90% confidence: ±20% from 5 micro-batches timed)" in text
    assert text.endswith("cpu (1 thread) was too slow to time (no micro-batch finished in 24 s: slower than "
                         "1.33 samples/s); --budget 250 or more would time cpu (1 thread) (room for a warm-up "
                         "and 3 timed micro-batches each, if one takes no longer than the time waited).")


def test_the_sentence_says_how_sure_each_figure_is():
    a = _r("cpu (2 threads)", 10.0, [9.0, 11.0], windows=6, micro_batches=6, steps_timed=2)
    b = _r("cpu (1 thread)", 5.0, [4.0, 6.0], windows=3, micro_batches=3, steps_timed=1)
    _, text = recommend("trm", [a, b])
    assert text == ("cpu (2 threads) is 2.0x faster than cpu (1 thread) for trm at batch 32 (90% "
                    "confidence: cpu (2 threads) ±10% from 6 micro-batches timed; cpu (1 thread) "
                    "±20% from 3 micro-batches timed).")
    # An interval with no fast end (two timings far apart) reaches a: the order is noise.
    _, text = recommend("trm", [a, _r("cpu (1 thread)", 5.0, [4.0, None], windows=2, micro_batches=2)])
    assert "are within measurement noise of each other" in text
    assert "cpu (1 thread) at least 4 samples/s, from 2 micro-batches timed" in text
    # ... and it timed no optimizer step: its figure leaves it out, and the sentence says so.
    assert text.endswith("; no optimizer step of cpu (1 thread) finished after warm-up: its figure leaves "
                         "it out.")
    # One side timed once: no spread, so the order is only what was seen.
    _, text = recommend("trm", [a, _r("cpu (1 thread)", 5.0, None, windows=1, micro_batches=1, steps_timed=1)])
    assert text.startswith("cpu (2 threads) measured 2.0x faster than cpu (1 thread) for trm at batch 32")
    one = _r("cpu", 8.0, None, windows=1, micro_batches=1, steps_timed=1)
    _, text = recommend("trm", [one])
    assert text == ("cpu is the only candidate that trained for trm at batch 32 (90% confidence: 1 "
                    "micro-batch timed: no spread to judge by).")
    whole = _r("cuda", 900.0, [880.0, 920.0], device="cuda:0", windows=40, micro_batches=1600, steps_timed=400)
    _, text = recommend("trm", [whole])
    assert "(90% confidence: ±2% from 40 timings of 1,600 micro-batches)" in text


# ---------------------------------------------------------------- the batch finder


def _reading(**kw):
    base = dict(peak_rss=None, pressure="normal", pressure_source="psi", swap_in=0.0, swap_growth=0,
                system_percent=50.0, samples=4)
    return MemoryReading(**{**base, **kw})


END = {"samples_per_s": 100.0, "peak": {"peak_rss_mb": 500.0}, "device_memory": {}}


def test_a_trial_fits_only_with_calm_memory():
    ok = finder.judge(64, END, _reading(), device="cpu", baseline_pressure="normal", memory_limit_mb=None)
    assert ok.fits and ok.footprint_mb == 500.0
    assert not finder.judge(64, END, _reading(pressure="warn"), device="mps", baseline_pressure="normal",
                            memory_limit_mb=None).fits
    # A machine already under pressure: only a worse level counts against the batch.
    assert finder.judge(64, END, _reading(pressure="warn"), device="mps", baseline_pressure="warn",
                        memory_limit_mb=None).fits
    swapped = finder.judge(64, END, _reading(swap_in=200 * 2**20), device="mps", baseline_pressure="normal",
                           memory_limit_mb=None)
    assert not swapped.fits and "swapped in 200 MB" in swapped.why
    assert not finder.judge(64, END, _reading(swap_growth=100 * 2**20), device="cpu",
                            baseline_pressure=None, memory_limit_mb=None).fits
    assert not finder.judge(64, END, _reading(), device="cpu", baseline_pressure=None, memory_limit_mb=400).fits
    cuda_end = {"samples_per_s": 1.0, "peak": {"peak_cuda_allocated_mb": 76_000.0},
                "device_memory": {"total": 80 * 2**30}}
    full = finder.judge(64, cuda_end, _reading(), device="cuda", baseline_pressure=None, memory_limit_mb=None)
    assert not full.fits and "over 90% of the GPU" in full.why
    # MPS: Metal's own allocation against its recommended working set, and it is the footprint.
    mps_end = {"samples_per_s": 1.0, "peak": {"mps_driver_allocated_mb": 15_000.0},
               "device_memory": {"driver": 15_000 * 2**20, "limit": 16_000 * 2**20}}
    metal = finder.judge(64, mps_end, _reading(peak_rss=900 * 2**20), device="mps", baseline_pressure="normal",
                         memory_limit_mb=None)
    assert not metal.fits and "Metal holds 15,000 MB, over 90% of its recommended 16,000 MB" in metal.why
    assert metal.footprint_mb == 15_000.0
    crashed = finder.judge(64, None, _reading(), device="cuda", baseline_pressure=None, memory_limit_mb=None,
                           crash={"kind": "oom", "sentence": "The device ran out of memory."})
    assert not crashed.fits and crashed.why.startswith("crashed (oom)")


def test_the_search_doubles_then_bisects_in_multiples_of_8():
    fits = lambda b: b <= 300  # noqa: E731
    good = bad = None
    tried = []
    while (b := finder.next_batch(32, 4096, good, bad)) is not None:
        tried.append(b)
        good, bad = (b, bad) if fits(b) else (good, b)
    assert tried[:5] == [32, 64, 128, 256, 512]
    assert good <= 300 < bad and bad - good <= good // 8 and all(t % 8 == 0 for t in tried)
    assert finder.suggest(96, 512) == (64, 8)
    assert finder.suggest(1000, 512) == (512, 1)
    assert finder.suggest(100, 96) == (96, 1)


def test_the_batch_finder_finds_the_boundary_under_a_memory_limit(home):
    config = runconfig.resolve("trm-tiny", "cpu", SMALL_TRM)
    # Without a limit: every doubling fits; the footprint grows with the batch.
    # Budgets here are for a hang only: the search ends when it has narrowed the boundary down
    # (20-50 s with three busy loops beside it), and one cut short would end elsewhere.
    free = finder.find_batch(config, "cpu", config.device, max_batch=128, trial_s=0.2, budget_s=300)
    assert free.found == 128 and free.smallest_misfit is None
    footprint = {t.batch: t.footprint_mb for t in free.trials}
    # Only the top of the range is asked to grow: at small batches the start-up's peak (torch's
    # import, the corpus) can be the footprint, and how big that is depends on the machine's
    # allocator (flat at 466 MB up to batch 32 on CI's, 341-431 MB here).
    assert footprint[128] > footprint[64] + 50 and footprint[128] > footprint[8] + 100, footprint
    limit = (footprint[64] + footprint[128]) / 2
    limited = finder.find_batch(config, "cpu", config.device, max_batch=128, memory_limit_mb=limit,
                                trial_s=0.2, budget_s=300)
    assert 64 <= limited.found < 128 and limited.smallest_misfit > limited.found
    assert limited.smallest_misfit - limited.found <= max(8, limited.found // 8)
    for t in limited.trials:  # each verdict is the limit's, and nothing else's
        assert t.fits == (t.footprint_mb <= limit), t
    # The cpu preset's effective batch (8 x 64 = 512) is kept with the found micro-batch.
    assert limited.micro_batch * limited.accumulation == 512 and limited.micro_batch <= limited.found
    assert f"Micro-batch {limited.found} is the largest" in limited.sentence


def test_on_unified_memory_rising_pressure_ends_the_search_before_any_crash(home, monkeypatch):
    """A simulated unified-memory machine: pressure goes to 'warn' once the trainer's RSS
    passes 550 MB, long before anything would run out of memory."""
    real = measure.SystemSampler.sample

    def sample(self):
        out = real(self)
        if self.pid != os.getpid() and out["rss"] and out["rss"] > 550 * 2**20:
            out["pressure"] = {"level": "warn", "raw": 12.0, "source": "sysctl", "detail": "simulated"}
        return out

    monkeypatch.setattr(measure.SystemSampler, "sample", sample)
    config = runconfig.resolve("trm-tiny", "cpu", SMALL_TRM)
    result = finder.find_batch(config, "cpu", config.device, max_batch=256, trial_s=0.2, budget_s=300)
    misfit = next(t for t in result.trials if t.batch == result.smallest_misfit)
    assert misfit.why == "memory pressure went to warn" and misfit.crash is None
    assert result.found is not None and result.found < result.smallest_misfit <= 256
    assert all(t.pressure == "normal" for t in result.trials if t.fits)


def test_a_crash_no_batch_size_fixes_stops_the_search_with_its_verdict(home):
    config = runconfig.resolve("matmul", "cpu", MATMUL + ["threads=1", "inject=['user-code@1+']"])
    result = finder.find_batch(config, "cpu", config.device, max_batch=64, trial_s=0.2, budget_s=60)
    assert [t.batch for t in result.trials] == [8] and result.trials[0].fatal
    assert result.found is None and result.sentence.startswith(
        "The finder stopped on cpu for matmul: batch 8 crashed (user-code)")


def _t(batch, fits, why="fits", **kw):
    return finder.Trial(batch, fits, why, samples_per_s=100.0, footprint_mb=500.0, **kw)


def test_the_finders_sentence_says_what_it_knows():
    config = runconfig.resolve("matmul", "cpu", [])  # effective batch 8 x 64 = 512
    out = finder._result(config, "cpu", config.device, "cpu", [], None, None, 4096, None, True, 60.0)
    assert out.sentence == "The finder ran out of time on cpu for matmul before any trial finished: raise --budget."
    trials = [_t(8, True), _t(16, True)]
    out = finder._result(config, "cpu", config.device, "cpu", trials, 16, None, 4096, None, True, 60.0)
    assert out.sentence.startswith("Micro-batch 16 is the largest tried that keeps pressure normal and swap "
                                   "flat on cpu for matmul (peak 500 MB); the finder ran out of time before "
                                   "finding a batch that does not fit.")
    assert "use 16 x 32" in out.sentence and "cap" not in out.sentence
    prime = runconfig.resolve("matmul", "cpu", ["batch_size=97", "accumulation=1"])
    trials = [_t(64, True), _t(97, False, "memory pressure went to warn")]
    out = finder._result(prime, "cpu", prime.device, "cpu", trials, 64, 97, 4096, None, False, 30.0)
    assert out.micro_batch == 1 and out.accumulation == 97
    assert "97 has no divisor between 1 and 64; an effective batch of 128 would run as 64 x 2" in out.sentence


def test_find_batch_saves_a_new_preset_and_never_overwrites_one(home):
    args = ["probe", "-w", "trm-tiny", "-d", "cpu", "--find-batch", "--max-batch", "16",
            "--trial-seconds", "0.2", *[a for o in SMALL_TRM for a in ("--set", o)]]
    out = _run(*args, "--save", "cpu-trm")
    assert out.returncode == 0, out.stderr
    saved = home / "config" / "presets" / "devices" / "cpu-trm.toml"
    text = saved.read_text()
    assert 'batch_size = 16' in text and "accumulation = 32" in text and 'device = "cpu"' in text
    again = _run(*args, "--save", "cpu-trm")
    assert again.returncode == 2 and "--save: 'cpu-trm' is already your preset" in again.stderr
    assert saved.read_text() == text
    shipped = _run(*args, "--save", "cpu")
    assert shipped.returncode == 2 and "'cpu' is already a shipped preset" in shipped.stderr


@pytest.mark.parametrize("args, message", [
    (["--devices", "cpu,tpu"], "--devices: 'tpu' is not a device; expected one of cuda, mps, cpu"),
    (["--devices", "cpu,cpu"], "--devices: got 'cpu,cpu'; expected a comma-separated list"),
    (["--presets", "nope"], "device preset 'nope': not found"),
    (["--budget", "1"], "--budget: got 1; expected seconds"),
    (["--find-batch", "--memory-limit", "lots"], "--memory-limit: got 'lots'; expected a size"),
    (["--memory-limit", "2G"], "--memory-limit: belongs to the batch finder"),
    (["--find-batch", "--presets", "cpu"], "--find-batch: sizes one device preset"),
    (["--set", "params.nope=1"], "params.nope"),
    (["--find-batch", "--memory-limit", "6000"], "--memory-limit: got '6000'; expected a size with its unit"),
    (["--devices", "cpu", "--budget", "6"], "--budget: got 6; 2 candidates need at least 12.5 s"),
])
def test_bad_probe_arguments_are_one_line_and_exit_2(home, args, message):
    out = _run("probe", "-w", "matmul", *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (home / "cache").exists()

"""The dashboard's model, folded from recorded real runs: what the panels will say, and
memory that stays bounded however long the run."""

from __future__ import annotations

import tracemalloc

from cockpit.ui.dashboard import regions
from cockpit.ui.model import LOG_LINES, MAX_POINTS, Change, RunModel, Series
from cockpit.ui.widgets.attempts import attempts_text
from cockpit.ui.widgets.memory import device_line, memory_text
from engine.record.events import read_events
from ui_support import RUNS


def test_crash_and_fallback_fold_into_two_attempts():
    m = RunModel()
    m.fold(read_events(RUNS / "crash-fallback" / "events.jsonl"))
    assert m.status == "finished" and len(m.attempts) == 2
    first, second = m.attempts
    assert (first.preset, first.device, first.outcome, first.exit) == ("auto", "cpu", "native-crash", "SIGABRT")
    assert first.crash["evidence"]["signal"] == "SIGABRT"
    assert first.fallback["to_preset"] == "cpu" and first.fallback["resume"]["step"] == 10
    assert (second.preset, second.outcome) == ("cpu", "finished")
    assert second.resumed_from["step"] == 10
    assert len(m.marks) == 1 and m.marks[0][1] == "native-crash"
    text = attempts_text(m).plain
    assert "native-crash" in text and "SIGABRT" in text and "resume at step 10" in text
    assert "batch_size 32→8" in text


def test_finished_run_has_progress_metrics_and_memory():
    m = RunModel()
    m.fold(read_events(RUNS / "finished" / "events.jsonl"))
    assert m.status == "finished" and m.step == m.total > 0 and m.fraction == 1.0
    assert m.metrics["r2"] > 0.9                      # the recorded run really learned
    assert len(m.loss_series) > 10 and m.loss_series.y[0] > m.loss_series.y[-1]
    assert m.memory is not None and m.memory["rss"] > 0
    assert "pressure" in memory_text(m).plain and "RSS" in memory_text(m).plain


def test_memory_panel_colours_pressure_and_shows_device_limit():
    m = RunModel()
    m.fold([{"type": "memory", "t": 1.0, "rss": 2e9, "processes": 3, "system_total": 16e9,
             "system_used": 15e9, "swap_in_per_s": 5e6, "swap_out_per_s": 1e6,
             "pressure": {"level": "critical", "raw": 4, "source": "sysctl"}},
            {"type": "warning", "t": 2.0, "kind": "slowdown", "message": "throughput 10% of its best",
             "advice": [{"text": "shorter sequences", "set": ["params.seq_len=128"]}]}])
    text = memory_text(m)
    assert "critical" in text.plain and "5.0 MB/s" in text.plain and "3 procs" in text.plain
    assert any(span.style == "bold white on red" for span in text.spans)
    assert "throughput 10% of its best" in text.plain
    assert "--set params.seq_len=128" in "\n".join(m.log)
    assert device_line({"allocated": 3e9, "total": 80e9}) == "3.0 GB of 80.0 GB (4%)"
    assert device_line({"allocated": 1e9, "driver": 2e9, "limit": 8e9}) == "2.0 GB of 8.0 GB (25%)"


def test_a_macos_sample_says_footprint_not_rss():
    from cockpit.present.words import memory_text as memory_words

    sample = {"type": "memory", "t": 1.0, "rss": 3.5e9, "processes": 1, "system_total": 16e9,
              "system_used": 8e9, "pressure": {"level": "normal", "raw": 1, "source": "sysctl"}}
    m = RunModel()
    m.fold([sample])
    assert "RSS      3.5 GB" in memory_text(m).plain and "footprint" not in memory_text(m).plain
    assert memory_words(sample).startswith("rss 3.5 GB")
    for kind in ("footprint", "footprint+rss"):
        m = RunModel()
        m.fold([{**sample, "rss_kind": kind}])
        assert "footprint 3.5 GB" in memory_text(m).plain and "RSS" not in memory_text(m).plain
        assert memory_words({**sample, "rss_kind": kind}).startswith(f"{kind} 3.5 GB")


def test_series_stays_bounded_and_spans_the_run():
    s = Series(cap=64)
    for i in range(100_000):
        s.add(float(i), float(-i))
    assert len(s) < 64 and s.x[0] == 0.0          # the start of the run is kept
    xs, ys = s.points()
    assert xs[-1] == 99_999.0 and ys[-1] == -99_999.0   # the line reaches 'now'
    assert xs == sorted(xs)


def test_replaying_a_long_run_keeps_memory_bounded():
    events = read_events(RUNS / "finished" / "events.jsonl")
    span = events[-1]["t"] - events[0]["t"] + 1

    def shifted(k):
        return [{**e, "t": e["t"] + k * span} for e in events if e["type"] in ("step", "memory", "eval")]

    m = RunModel()
    m.fold(events[:2])
    for k in range(20):
        m.fold(shifted(k))
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for k in range(20, 220):
        m.fold(shifted(k))
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert m.events_seen >= 220 * len(shifted(0)) > 220 * 50
    assert len(m.samples_series) < MAX_POINTS and len(m.loss_series) < MAX_POINTS
    assert len(m.log) <= LOG_LINES
    assert grown < 200_000, f"the model grew by {grown:,} bytes over 200 more replays"


def _step(t, step, samples, window_s, *, loss=1.0, lr=0.01, attempt=1):
    return {"type": "step", "t": t, "attempt": attempt, "step": step, "total": 100,
            "samples_seen": samples, "loss": loss, "lr": lr, "window_s": window_s,
            "samples_per_s": 10 / window_s * 10, "steps_per_s": 10 / window_s}


def test_throughput_is_the_run_average_not_the_last_fragment():
    # Nine 1 s windows of 100 samples, then a 0.01 s fragment whose rate reads 10,000/s.
    m = RunModel()
    m.fold([{"type": "run_started", "t": 0.0, "run": "r", "workload": "w", "device_preset": "cpu"},
            {"type": "attempt_started", "t": 0.0, "attempt": 1, "preset": "cpu", "config": {}},
            {"type": "trainer_ready", "t": 0.0, "attempt": 1, "total_steps": 100, "resumed_from": None}])
    m.fold([_step(float(i), 10 * i, 100 * i, 1.0) for i in range(1, 10)])
    m.fold([_step(9.01, 100, 1000, 0.01)])
    assert m.samples_per_s == 10_000            # the window's own figure, for the live plot
    assert m.avg_samples_per_s == 1000 / 9.01   # samples trained over time spent training
    assert m.avg_steps_per_s == 100 / 9.01


def test_lr_and_eval_metrics_are_series_over_run_time():
    m = RunModel()
    m.fold(read_events(RUNS / "finished" / "events.jsonl"))
    assert m.lr == 0.02 and len(m.lr_series) > 10
    xs, ys = m.eval_series["r2"].points()
    assert ys[-1] == m.metrics["r2"] and 0 < xs[-1] <= m.duration_s(0)
    assert m.avg_samples_per_s is not None and m.steps_lost == 0


def test_mining_is_folded_with_a_log_line_and_active_while_it_runs():
    m = RunModel()
    m.fold([{"type": "run_started", "t": 0.0, "run": "r", "workload": "twotower", "device_preset": "cpu"},
            {"type": "attempt_started", "t": 0.0, "attempt": 1, "preset": "cpu", "config": {}}])
    assert m.fold([{"type": "mining_started", "t": 1.0, "attempt": 1, "epoch": 0, "negatives": 16}])
    assert m.mining_active
    m.fold([{"type": "mining", "t": 1.0, "attempt": 1, "epoch": 0, "mode": "none"}])
    assert not m.mining_active and m.mining is None   # an epoch the schedule does not mine
    mined = {"type": "mining", "t": 30.0, "attempt": 1, "epoch": 6, "mode": "faiss@64",
             "index": "IVF256,Flat nprobe 16", "exact": False, "recall_vs_exact": 0.9731,
             "queries": 20000, "mining_s": 28.4, "index_build_s": 3.2}
    m.fold([{"type": "mining_started", "t": 2.0, "attempt": 1, "epoch": 6, "negatives": 64}])
    assert m.mining_active
    changed = m.fold([mined])
    assert not m.mining_active and m.mining == mined and Change.LOG in changed
    assert "recall 0.973 vs exact" in m.log[-1] and "28.4 s" in m.log[-1]


def test_the_running_attempt_last_step_follows_every_step():
    m = RunModel()
    m.fold(read_events(RUNS / "crash-fallback" / "events.jsonl")[:3])
    for step in (5, 10):
        changed = m.fold([_step(float(step), step, 64 * step, 0.5)])
        assert m.attempts[-1].last_step == step and Change.ATTEMPTS in changed
        assert "attempts" in regions(changed)  # the panel redraws


def test_steps_lost_to_a_crash_are_counted_when_the_next_attempt_resumes():
    m = RunModel()
    m.fold([{"type": "run_started", "t": 0.0, "run": "r", "workload": "w", "device_preset": "mps"},
            {"type": "attempt_started", "t": 0.0, "attempt": 1, "preset": "mps", "config": {}},
            {"type": "trainer_ready", "t": 0.0, "attempt": 1, "total_steps": 100, "resumed_from": None},
            _step(1.0, 10, 100, 1.0), {"type": "checkpoint", "t": 1.0, "attempt": 1, "step": 10},
            _step(2.0, 17, 170, 1.0),
            {"type": "attempt_ended", "t": 3.0, "attempt": 1, "outcome": "native-crash", "last_step": 17}])
    assert m.steps_lost == 7   # past its last checkpoint
    m.fold([{"type": "attempt_started", "t": 4.0, "attempt": 2, "preset": "cpu", "config": {}},
            {"type": "trainer_ready", "t": 5.0, "attempt": 2, "total_steps": 100,
             "resumed_from": {"step": 10, "samples_seen": 100}}])
    assert m.steps_lost == 7


def test_a_partial_window_is_neither_the_live_rate_nor_a_plotted_point():
    m = RunModel()
    m.fold([{"type": "run_started", "t": 0.0, "run": "r", "workload": "w", "device_preset": "cpu"},
            {"type": "attempt_started", "t": 0.0, "attempt": 1, "preset": "cpu", "config": {}},
            {"type": "trainer_ready", "t": 0.0, "attempt": 1, "total_steps": 100, "resumed_from": None}])
    m.fold([{**_step(float(i), 10 * i, 100 * i, 1.0), "gflop_s": 2.0} for i in range(1, 4)])
    m.fold([{**_step(3.01, 31, 310, 0.01), "partial": True, "gflop_s": 20.0}])
    assert m.samples_per_s == 100 and m.step == 31 and m.attempts[-1].last_step == 31
    assert m.samples_series.points()[1][-1] == 100 and len(m.loss_series.points()[0]) == 4
    assert m.avg_samples_per_s == 310 / 3.01       # the average counts its samples and time
    assert abs(m.avg_gflop_s - (6.0 + 0.2) / 3.01) < 1e-12


def test_an_eval_under_way_is_active_until_its_result_or_the_next_step():
    m = RunModel()
    m.fold(read_events(RUNS / "finished" / "events.jsonl")[:3])
    m.fold([{"type": "eval_started", "t": 5.0, "attempt": 1, "step": 10}])
    assert m.eval_active
    m.fold([{"type": "eval", "t": 9.0, "attempt": 1, "step": 10, "metrics": {"r2": 0.5}}])
    assert not m.eval_active and m.metrics == {"r2": 0.5}
    m.fold([{"type": "eval_started", "t": 10.0, "attempt": 1, "step": 20}, _step(11.0, 21, 2100, 1.0)])
    assert not m.eval_active   # a workload whose eval said nothing: training again ends it

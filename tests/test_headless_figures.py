"""The headless lines' figures: the smoothed rate rather than a fragment window's, and a
mining pass named while it runs (throughput at nothing for minutes, with no word why, was
issue 16's item 2)."""

from __future__ import annotations

import io

from cockpit.headless import HeadlessPrinter
from cockpit.present.lines import status_line


def step(t: float, n: int, **extra) -> dict:
    return {"type": "step", "attempt": 1, "t": t, "step": n, "total": 100, "loss": 0.5,
            "samples_per_s": 317.0, "smoothed_samples_per_s": 317.0, "eta_s": 60.0,
            "window_s": 0.5, **extra}


def memory(t: float) -> dict:
    return {"type": "memory", "attempt": 1, "t": t, "rss": 1e9, "pressure": {"level": "normal"}}


def screen_after(printer: HeadlessPrinter, out: io.StringIO, events: list[dict]) -> str:
    """The live line on screen once `events` were handed over one by one."""
    for e in events:
        printer([e])
    return out.getvalue().rsplit("\r\x1b[K", 1)[-1]


def test_the_live_line_names_a_mining_pass_and_its_time():
    out = io.StringIO()
    printer = HeadlessPrinter(stream=out, live=True, width=120)
    steps = [step(float(i), i) for i in range(1, 7)]
    started = {"type": "mining_started", "attempt": 1, "t": 7.0, "epoch": 2, "negatives": 16}
    line = screen_after(printer, out, steps + [started, memory(8.0), memory(42.0)])
    assert "mining hard negatives for epoch 2 (35s)" in line and "no step" not in line
    mined = {"type": "mining", "attempt": 1, "t": 43.0, "epoch": 2, "mode": "faiss@16",
             "index": "ivf447,probe32", "exact": False, "recall_vs_exact": 0.976,
             "queries": 6000, "mining_s": 36.0}
    line = screen_after(printer, out, [mined, memory(44.0)])
    assert "mining" not in line and "step 6/100" in line
    assert "mining epoch 2: faiss@16 over ivf447,probe32 (recall 0.976 vs exact), 6,000 queries in 36.0 s" \
        in out.getvalue()


def test_mining_before_the_first_step_is_on_the_live_line():
    out = io.StringIO()
    printer = HeadlessPrinter(stream=out, live=True, width=80)
    line = screen_after(printer, out, [{"type": "attempt_started", "attempt": 1, "t": 0.0, "preset": "cpu"},
                                       {"type": "mining_started", "attempt": 1, "t": 1.0, "epoch": 0},
                                       memory(4.0)])
    assert line == "mining hard negatives for epoch 0 (3s)"


def test_a_log_file_says_mining_where_it_would_say_no_step():
    out = io.StringIO()
    printer = HeadlessPrinter(stream=out, live=False, log_every_s=30)
    printer([step(1.0, 1), {"type": "mining_started", "attempt": 1, "t": 2.0, "epoch": 1}])
    printer([memory(40.0)])
    lines = out.getvalue().splitlines()
    assert lines[-1].endswith("(mining hard negatives for epoch 1 (38s))")


def test_the_rate_shown_is_the_smoothed_one_not_a_fragments():
    fragment = step(9.0, 100, samples_per_s=6990.0, smoothed_samples_per_s=317.4, window_s=0.05)
    line = status_line({**fragment, "step": 90}, None, 10, width=100)
    assert "317 samples/s" in line and "6,990" not in line
    older = {k: v for k, v in fragment.items() if k != "smoothed_samples_per_s"}
    assert "6,990 samples/s" in status_line(older, None, 10, width=100)   # a writer without it


def test_gflop_and_mfu_are_given_at_the_rate_shown():
    from cockpit.present.lines import step_line

    fragment = step(9.0, 100, samples_per_s=6990.0, smoothed_samples_per_s=349.5, window_s=0.05,
                    gflop_s=20.0, mfu=0.4)
    line = step_line(fragment)
    assert "350 samples/s  1.0 GFLOP/s (MFU 2%)" in line
    assert "MFU 2%" in status_line({**fragment, "step": 90}, None, 10, width=200)


def test_an_eval_under_way_is_said_too():
    out = io.StringIO()
    printer = HeadlessPrinter(stream=out, live=True, width=120)
    started = {"type": "eval_started", "attempt": 1, "t": 3.0, "step": 2}
    line = screen_after(printer, out, [step(1.0, 1), step(2.0, 2), started, memory(15.0)])
    assert "evaluating at step 2 (12s)" in line
    done = {"type": "eval", "attempt": 1, "t": 16.0, "step": 2, "metrics": {"recall@50": 0.9}}
    assert "evaluating" not in screen_after(printer, out, [done, memory(17.0)])


def test_an_attempts_first_line_says_what_it_trains_with():
    """Which optimizer and learning-rate curve, and whether it compiles: never silently."""
    from cockpit.present.lines import human_line

    ready = {"type": "trainer_ready", "attempt": 1, "device": "cuda:0", "precision": "bf16",
             "compile": True, "batch_size": 32, "accumulation": 16, "parameters": 29_884_416,
             "total_steps": 14, "reason": "preset asks for cuda",
             "optimizer": "AdamW (fused), constant at 0.0003 after 100 warmup steps"}
    assert human_line(ready) == ("attempt 1: cuda:0 bf16, compiled, batch 32 x 16, 29,884,416 parameters, "
                                 "14 steps (preset asks for cuda); AdamW (fused), constant at 0.0003 "
                                 "after 100 warmup steps")
    assert ", compiled" not in human_line({**ready, "compile": False})
    # how, where the trainer says it (engine.train.compiling)
    assert ", compiled (regional: 2 repeated blocks), batch" in human_line(
        {**ready, "compiled": "regional", "compiled_blocks": 2})
    assert ", compiled (whole model), batch" in human_line({**ready, "compiled": "model"})

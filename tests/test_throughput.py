"""Throughput and ETA figures of the trainer and a command's tracker: averages that reporting
fragments cannot inflate, and an ETA that holds still through mining and eval pauses. The
trainer runs on a clock of the test's (it moves only when the test says), so none of this
depends on how busy the machine is."""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest

from conftest import TINY
from engine import runconfig
from engine.command.observation import Observation
from engine.command.tracker import Tracker, Units
from engine.monitor.throughput import RateMeter
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.record.stats import averages
from engine.train import saving as saving_module, trainer as trainer_module

# 8 epochs of 32 steps of 64 samples, a report every 0.2 s of the fake clock (about 4 steps),
# a checkpoint every 10 steps (each one a reporting fragment), an eval every epoch.
RUN = TINY + ["params.n=64", "params.products=4", "params.samples=2048", "train.epochs=8",
              "train.report_every_s=0.2", "batch_size=32", "accumulation=2",
              "train.checkpoint_every_steps=10", "train.eval_every_steps=32"]
STEP_S = (0.04, 0.06)        # a step's time on the fake clock, seeded jitter
MINING_S, INDEX_BUILD_S, EVAL_S = 1.5, 2.0, 0.4
MINES_FROM = 3               # twotower's "0-2:none,3-7:faiss@16"


def fake_clock_trainer(monkeypatch, overrides=RUN):
    clock = SimpleNamespace(now=1000.0)
    fake_time = SimpleNamespace(**{**vars(time), "monotonic": lambda: clock.now})
    # the trainer's clock only: its loop's and its checkpoints' (engine.train.saving)
    for module in (trainer_module, saving_module):
        monkeypatch.setattr(module, "time", fake_time)
    run = RunDir.create(runconfig.resolve("matmul", "cpu", overrides))
    trainer = trainer_module.Trainer(run, EventWriter(run.events_path, attempt=1), "cpu", run.config().device)
    return run, trainer, clock


def test_a_mining_run_has_a_steady_eta_and_honest_rates(home, monkeypatch):
    run, trainer, clock = fake_clock_trainer(monkeypatch)
    jitter, ended = random.Random(0), {0: clock.now}
    train_step, evaluate = trainer.train_step, trainer.workload.evaluate

    def timed_step() -> None:
        train_step()
        clock.now += jitter.uniform(*STEP_S)
        ended[trainer.step] = clock.now

    def prepare_epoch(model, epoch, device, emit) -> None:
        """twotower's shape: nothing to do before MINES_FROM, then a mining pass per epoch,
        the first of them building the index too."""
        if epoch < MINES_FROM:
            emit("mining", epoch=epoch, mode="none")
            return
        built = {"index_build_s": INDEX_BUILD_S} if epoch == MINES_FROM else {}
        clock.now += MINING_S + built.get("index_build_s", 0.0)
        emit("mining", epoch=epoch, mode="faiss@16", mining_s=MINING_S, **built)

    def slow_evaluate(model, device):
        clock.now += EVAL_S
        return evaluate(model, device)

    trainer.train_step = timed_step
    trainer.workload.prepare_epoch = prepare_epoch
    trainer.workload.evaluate = slow_evaluate
    assert trainer.fit() == "finished"
    end, start = clock.now, ended[0]
    events = run.events()
    steps = [e for e in events if e["type"] == "step"]

    # The ETA once mining has begun (before, nothing says it will) predicts the end within 5%
    # of the run, and consecutive predictions of the end move by less than 3% of it: no
    # swing from a checkpoint's fragment window, an eval or a mining pass.
    first_mining = next(e["t"] for e in events if e["type"] == "mining" and e["mode"] != "none")
    late = [e for e in steps if e["t"] > first_mining and e["step"] < trainer.total_steps]
    assert len(late) > 20
    predicted = [ended[e["step"]] + e["eta_s"] for e in late]
    for e, end_at in zip(late, predicted):
        assert abs(end_at - end) < 0.05 * (end - start), e
    assert max(abs(b - a) for a, b in zip(predicted, predicted[1:])) < 0.03 * (end - start)

    # Fragments: checkpoints cut windows short, and such windows do not set the best.
    full = [e for e in steps if e["window_s"] >= 0.2]
    assert any(e["window_s"] < 0.1 for e in steps)
    assert all(bool(e.get("partial")) == (e["window_s"] < 0.2) for e in steps)  # said so
    # each eval is announced before it starts (the screens say why no step comes)
    kinds = [e["type"] for e in events if e["type"] in ("eval_started", "eval")]
    assert kinds == ["eval_started", "eval"] * 8
    assert steps[-1]["best_samples_per_s"] == max(e["samples_per_s"] for e in full)
    assert steps[-1]["best_samples_per_s"] <= 64 / STEP_S[0]   # no faster than the fastest step

    # The run's average: samples over the time spent training, mining and evals left out.
    avg = averages(events)
    train_s = sum(ended[i + 1] - ended[i] for i in range(trainer.total_steps)) - \
        MINING_S * (8 - MINES_FROM) - INDEX_BUILD_S - EVAL_S * 7
    assert abs(avg.train_s - train_s) < 0.01 * train_s
    assert abs(avg.samples_per_s - 2048 * 8 / train_s) < 0.01 * avg.samples_per_s
    assert 64 / STEP_S[1] <= avg.samples_per_s <= 64 / STEP_S[0]


def test_the_eta_before_mining_counts_only_training_and_evals(home, monkeypatch):
    # No preparation, steady steps: the ETA is the steps left at the measured rate.
    run, trainer, clock = fake_clock_trainer(monkeypatch, RUN + ["train.eval_every_steps=0"])
    train_step = trainer.train_step

    def timed_step() -> None:
        train_step()
        clock.now += 0.05

    trainer.train_step = timed_step
    trainer.fit()
    for e in [e for e in run.events() if e["type"] == "step"][2:-1]:
        assert abs(e["eta_s"] - (e["total"] - e["step"]) * 0.05) < 0.5, e


def test_rate_meter_weights_windows_by_their_time():
    meter = RateMeter(full_window_s=1.0)
    meter.add(steps=2, samples=20, seconds=2.0)          # warm-up: held aside
    assert meter.samples_per_s == 10
    for _ in range(10):
        meter.add(steps=10, samples=100, seconds=1.0)
    meter.add(steps=1, samples=10, seconds=0.001)        # a fragment: 10,000/s
    assert abs(meter.samples_per_s - 100) < 2 and meter.best_samples_per_s == 100
    assert abs(meter.seconds_for(50) - 5.0) < 0.1


def test_rate_meter_forgets_old_speed_over_its_horizon():
    meter = RateMeter(full_window_s=1.0, horizon_s=10.0)
    for _ in range(60):
        meter.add(steps=10, samples=100, seconds=1.0)
    for _ in range(60):
        meter.add(steps=5, samples=50, seconds=1.0)      # half speed (a neighbour, swapping)
    assert abs(meter.samples_per_s - 50) < 1 and meter.best_samples_per_s == 100


def _seen(step: int) -> Observation:
    return Observation(kind="step", step=step, total=1000, loss=1.0, source="tqdm")


def test_a_commands_flush_fragment_does_not_set_its_best():
    tracker = Tracker(Units(10, "placeholders"), report_every_s=1.0)
    steps, t = [], 0.0
    for step in range(0, 401):       # 100 steps a second
        t = step / 100
        steps += [fields for kind, fields in tracker.parsed(_seen(step), t) if kind == "step"]
    tracker.parsed(_seen(405), t + 0.001)   # five steps in a millisecond, then the end
    last = [fields for kind, fields in tracker.flush(t + 0.001) if kind == "step"][-1]
    assert last["samples_per_s"] > 10_000 and last["partial"]   # the fragment's own figure
    assert not any(fields.get("partial") for fields in steps)
    assert abs(last["best_samples_per_s"] - 1000) < 1
    assert abs(last["smoothed_samples_per_s"] - 1000) < 20
    assert abs(last["eta_s"] - 595 / 100) < 0.2


def test_steps_read_past_a_window_closed_by_the_last_read_are_not_dropped():
    # The supervisor's last read of an attempt's output (it ended: SIGABRT, say) is parsed at one
    # time t: it closes a window at step 120 and reads on to 124; flush(t) must still say 124.
    tracker = Tracker(Units(1, "placeholders"), report_every_s=1.0)
    tracker.parsed(_seen(100), 0.0)
    produced = [f for step in range(101, 125) for k, f in tracker.parsed(_seen(step), 1.0) if k == "step"]
    assert [f["step"] for f in produced] == [101]
    (kind, last), = tracker.flush(1.0)
    assert kind == "step" and last["step"] == 124 and last["partial"] and last["window_s"] is None


def test_a_burst_read_with_the_first_sight_is_not_counted_as_fast_training():
    """A resumed script printed steps 20 to 30 before the supervisor's first read (mlx-lm's
    first rows, a buffered log): all read at one moment, trained in time no window measured.
    The first window's rate counts from the last of them, at the 4 steps a second it trains,
    and still says the attempt began at 20 (steps lost count from there)."""
    tracker = Tracker(Units(1, "placeholders"), report_every_s=1.0)
    for step in range(20, 31):
        assert tracker.parsed(_seen(step), 100.0) == []
    windows = [f for i in range(1, 21) for k, f in tracker.parsed(_seen(30 + i), 100.0 + i / 4)
               if k == "step"]
    first = windows[0]
    assert first["from_step"] == 30 and first["begun_step"] == 20
    assert abs(first["steps_per_s"] - 4) < 1e-6 and abs(first["samples_per_s"] - 4) < 1e-6
    assert abs(windows[-1]["best_samples_per_s"] - 4) < 1e-6
    assert all("begun_step" not in w for w in windows[1:])
    assert averages([{"type": "run_started", "t": 99.0, "run": "r"},
                     {"type": "attempt_started", "t": 99.0, "attempt": 1, "preset": "cpu", "config": {}},
                     *({"type": "step", "t": 100.0, "attempt": 1, **w} for w in windows)]).steps_per_s < 4.01


def test_a_commands_best_rate_is_not_a_print_intervals_rounding():
    """mlx-lm trains 1.2 steps a second and its bar is printed once a second: each read shows
    the step reached by then, so a window of a second holds 1 step or 2. The best is taken over
    windows pooled to 8 steps or more, within a step of the truth, not the 2 steps/s a lucky
    window read."""
    tracker = Tracker(Units(4, "placeholders"), report_every_s=1.0)
    events = [f for second in range(1, 121)
              for k, f in tracker.parsed(_seen(int(second * 1.2)), float(second)) if k == "step"]
    assert max(e["samples_per_s"] for e in events) == 8.0        # the lucky windows
    best = events[-1]["best_samples_per_s"]
    assert 4.8 * 7 / 8 <= best <= 4.8 * 9 / 8, best
    assert abs(events[-1]["smoothed_samples_per_s"] - 4.8) < 0.2


def test_a_commands_eta_rides_out_its_eval_pauses():
    """A script's evals are gaps between its steps that the tracker cannot tell from slow
    steps: 60 s of 100 steps/s, then a 20 s eval, over and over. The long horizon spreads the
    pauses over the rate, which is what they cost the ETA, instead of each one swinging it."""
    total = 60_000
    tracker = Tracker(Units(8, "placeholders"), total_steps=total)
    predicted, t, step = [], 0.0, 0
    while step < total:
        step += 1
        t += 0.01
        if step % 6000 == 0:
            t += 20.0                       # the eval, seen as a long wait for the next step
        for kind, fields in tracker.parsed(_seen(step), t):
            if kind == "step" and fields["eta_s"] is not None:
                predicted.append(t + fields["eta_s"])
    end = t
    late = predicted[len(predicted) // 2:]
    # The old 0.3-weighted average of windows: 12% off at worst, jumps of 15% at each eval;
    # this is a sawtooth of +-4% around the end, its steepest jump 6%.
    assert all(abs(p - end) < 0.05 * end for p in late)
    assert max(abs(b - a) for a, b in zip(late, late[1:])) < 0.07 * end


def test_losses_without_step_numbers_are_said_once():
    """A Hugging Face Trainer with disable_tqdm=True prints its log dicts and no bar: losses
    and no step. The run would end 'step 0' with no word why; the tracker says it once."""
    from engine.command.progress import OutputParser

    parser, tracker, produced = OutputParser(), Tracker(Units(8, "placeholders")), []
    for i in range(6):
        line = f"{{'loss': {3.0 - i / 10}, 'grad_norm': 1.5, 'learning_rate': 5e-05, 'epoch': {i / 10}}}\n"
        for observation in parser.feed(line):
            produced += tracker.parsed(observation, float(i))
    warnings = [fields for kind, fields in produced if kind == "warning"]
    assert len(warnings) == 1 and warnings[0]["kind"] == "no-step-numbers"
    assert "CockpitCallback" in warnings[0]["advice"][0]["text"] and tracker.loss == 2.5
    from cockpit.present.lines import human_line

    said = human_line({"type": "warning", **warnings[0]})
    assert said.startswith("warning: the output gave 3 losses and no step number") and "CockpitCallback" in said
    # with steps, nothing to say
    stepped = Tracker(Units(8, "placeholders"), total_steps=10)
    said = [kind for i in range(6) for kind, _ in stepped.parsed(
        Observation(kind="step", step=i, loss=1.0, source="tqdm"), float(i))]
    assert "warning" not in said


def test_values_read_after_the_last_window_are_said_at_the_end():
    """The Trainer's bar reaches 60/60, then its last log dict (its loss and reward) is printed:
    no step follows to carry them, so the attempt's end does, once."""
    from engine.command.progress import OutputParser

    parser, tracker, said = OutputParser(), Tracker(Units(8, "stated")), []
    for t, line in [(0.0, " 97%|█████████▋| 58/60 [00:10<00:00,  5.00it/s]"),
                    (1.5, "100%|██████████| 60/60 [00:11<00:00,  5.00it/s]"),
                    (1.6, "{'loss': 0.8964, 'reward': 0.2104, 'epoch': 1.0}")]:
        for o in parser.feed(line + "\n"):
            said += tracker.parsed(o, t)
    said += tracker.flush(2.0)
    last = [f for kind, f in said if kind == "step"][-1]
    assert (last["step"], last["loss"], last["metrics"]["reward"]) == (60, 0.8964, 0.2104)
    assert tracker.flush(2.5) == []


def _replayed(recording: str, units: Units) -> list[dict]:
    """A recorded command's output (tests/scripts/record_output.py: each chunk with when it came)
    through the parser and a tracker at the recorded times: its step events."""
    import json

    from conftest import FIXTURES
    from engine.command.progress import OutputParser

    parser, tracker, events, t = OutputParser(), Tracker(units), [], 0.0
    for line in (FIXTURES / recording).read_text().splitlines():
        chunk = json.loads(line)
        t = chunk["t"]
        for observation in parser.feed(chunk["text"]):
            events += [f for kind, f in tracker.parsed(observation, t) if kind == "step"]
    return events + [f for kind, f in tracker.flush(t) if kind == "step"]


@pytest.mark.parametrize("recording, samples_per_step", [
    ("outputs/rich_slow", 8),     # tests/scripts/shapes/richbar.py: 8 steps of 2 s, redrawn 10 a second
    ("mlx_lm/lora_slow", 4),      # mlx-lm on the tiny Llama, 10 iterations of 2.5 s (shapes/mlx_lora.py)
])
def test_slow_steps_under_a_bar_that_redraws_itself_are_timed_whole(recording, samples_per_step):
    """Rich redraws the same count several times a second while a step of seconds trains: a
    window closed on such a redraw held no step, and its second was lost to the rate (0.98
    steps/s shown for 0.33, an ETA a third of the time left; mlx-lm's tokens/s 0, 400, 0...).
    Every window holds a step, and the rate a step line shows, its ETA at half-way and its
    tokens/s are the script's own clock's (the first window, which holds the start-up, aside)."""
    import json

    from conftest import FIXTURES

    truth = json.loads((FIXTURES / f"{recording}.truth.json").read_text())
    (attempt,) = truth["attempts"]
    times = dict((step, t) for step, t in attempt["times"])
    last = max(times)
    events = _replayed(f"{recording}.jsonl", Units(samples_per_step, "placeholders"))
    assert [e["step"] for e in events] == sorted({e["step"] for e in events})  # never back
    assert events[-1]["step"] == last
    measured = events[0]["step"]     # the rate is measured from the first window's end
    windows = [e for e in events[1:] if not e.get("partial")]
    assert len(windows) >= 4 and all(e["step"] > e["from_step"] for e in windows)
    for e in windows:   # the shown rate against the script's clock over the same steps
        if e["step"] - measured < 2:
            continue  # one step, its ends read a refresh late (mlx-lm's first frame: 0.6 s)
        steps_per_s = (e["step"] - measured) / (times[e["step"]] - times[measured])
        assert abs(e["smoothed_samples_per_s"] / (steps_per_s * samples_per_step) - 1) < 0.15, e
    half = next(e for e in windows if e["step"] >= truth["total"] / 2)
    assert abs(half["eta_s"] / (times[last] - times[half["step"]]) - 1) < 0.25, half
    if truth["tokens_per_step"]:
        # mlx-lm's tokens column states them (4 x 25 a step): no window of none, each its steps'
        for e in windows:
            assert e["tokens_per_s"] == pytest.approx(e["steps_per_s"] * truth["tokens_per_step"], rel=1e-3)
            assert e["tokens_per_s"] > 0.5 * (e["step"] - e["from_step"]) * truth["tokens_per_step"] / 3.0

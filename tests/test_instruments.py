"""The instruments a step event carries (issue 38): the gradient norm before clipping (mean and
largest of the window's steps), the largest step loss and the non-finite steps; from the
built-in trainer (in this process, and under torchrun), from a command's output, from
cockpit.report and from the Lightning callback. No timings here: benchmarks/instruments.py
measures what the norm costs."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import TINY, child_env, cockpit_cmd
from engine import runconfig
from engine.command.tracker import Tracker
from engine.record.rundir import RunDir, list_runs
from engine.run.supervisor import Supervisor
from engine.train.failures import NonFiniteLoss
from engine.train.window import Window
from train_support import trainer_for

PY = sys.executable


def new_run(*overrides: str, device: str = "cpu") -> RunDir:
    return RunDir.create(runconfig.resolve("matmul", device, TINY + list(overrides)))


def steps_of(run: RunDir) -> list[dict]:
    return [e for e in run.events() if e["type"] == "step"]


def norms_at_the_optimizer(trainer) -> list[float]:
    """The gradient's total norm as the optimizer is handed it (after any clipping), per step."""
    seen: list[float] = []
    step = trainer.optimizer.step

    def measuring_step(*a, **k):
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        seen.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
        return step(*a, **k)
    trainer.optimizer.step = measuring_step
    return seen


def step_losses(trainer) -> list[list[float]]:
    """Each step's micro-batch losses, as the trainer computed them."""
    losses: list[list[float]] = []
    loss, train_step = trainer.workload.loss, trainer.train_step

    def recording_loss(*a, **k):
        value = loss(*a, **k)
        losses[-1].append(float(value.detach()))
        return value

    def recording_step():
        losses.append([])
        train_step()
    trainer.workload.loss, trainer.train_step = recording_loss, recording_step
    return losses


# ---------------------------------------------------------------- the built-in trainer


def test_each_step_event_carries_the_norm_of_the_gradient_the_optimizer_stepped_with(home):
    run = new_run("train.report_every_s=1e-9")   # a report every step
    trainer = trainer_for(run)
    seen = norms_at_the_optimizer(trainer)
    assert trainer.fit() == "finished"
    steps = steps_of(run)
    assert [e["step"] for e in steps] == list(range(1, 9))
    for event, norm in zip(steps, seen):
        assert math.isfinite(event["grad_norm"]) and event["grad_norm"] > 0
        assert event["grad_norm"] == pytest.approx(norm, rel=1e-5)
        assert event["grad_norm_max"] == event["grad_norm"]   # one step a window
        assert event["loss_max"] == pytest.approx(event["loss"], rel=1e-6)
        assert "nonfinite" not in event


def test_a_window_of_several_steps_reports_their_mean_and_largest(home):
    run = new_run("train.report_every_s=3600")   # one window: the final report
    trainer = trainer_for(run)
    seen, losses = norms_at_the_optimizer(trainer), step_losses(trainer)
    trainer.fit()
    (event,) = steps_of(run)
    assert event["step"] == 8 and len(seen) == len(losses) == 8
    assert event["grad_norm"] == pytest.approx(sum(seen) / 8, rel=1e-5)
    assert event["grad_norm_max"] == pytest.approx(max(seen), rel=1e-5)
    # four micro-batches of 8 a step: a step's loss is their mean; the window's, all steps'
    per_step = [sum(s) / len(s) for s in losses]
    assert event["loss_max"] == pytest.approx(max(per_step), rel=1e-5)
    assert event["loss"] == pytest.approx(sum(per_step) / 8, rel=1e-5)
    assert event["loss_max"] > event["loss"]   # the loss falls: the first steps are the largest


def test_with_grad_clip_the_norm_reported_is_the_one_before_clipping(home):
    run = new_run("train.report_every_s=1e-9", "train.grad_clip=0.01", "train.lr=0.5")
    trainer = trainer_for(run)
    clipped = norms_at_the_optimizer(trainer)
    trainer.fit()
    steps = steps_of(run)
    assert all(n <= 0.01 * 1.001 for n in clipped)   # the optimizer saw the clipped gradient
    assert all(e["grad_norm"] > 10 * 0.01 for e in steps[:3]), [e["grad_norm"] for e in steps]


def test_clipping_measures_the_norm_itself_no_second_norm(home, monkeypatch):
    run = new_run("train.grad_clip=1.0")
    trainer = trainer_for(run)
    calls = []
    monkeypatch.setattr("engine.train.trainer.grad_norm", lambda params: calls.append(1))
    trainer.fit()
    assert calls == [] and all(e["grad_norm"] > 0 for e in steps_of(run))


def test_a_gradient_gone_infinite_under_a_finite_loss_is_counted_then_the_nan_crash_follows(home):
    run = new_run("train.report_every_s=1e-9")
    trainer = trainer_for(run)
    first = next(trainer.model.parameters())
    # at step 2 only: an overflow in backward, as fp16 gives, while the loss itself is finite
    first.register_hook(lambda g: g * math.inf if trainer.step == 1 else g)
    with pytest.raises(NonFiniteLoss) as raised:
        trainer.fit()
    steps = steps_of(run)
    assert [e["step"] for e in steps] == [1, 2]
    assert "nonfinite" not in steps[0] and math.isfinite(steps[1]["loss"])
    assert steps[1]["nonfinite"] == 1 and "grad_norm" not in steps[1]   # no finite norm to show
    # the infinite gradient made the weights NaN: the next report's loss is, and it crashes
    assert raised.value.step == 3 and "loss nan over the last 1 steps, 1 of them non-finite" in str(raised.value)


def test_the_nan_fault_still_crashes_at_the_report_and_counts_its_steps(home):
    run = new_run("train.report_every_s=3600", "inject=['nan@3']")
    trainer = trainer_for(run)
    with pytest.raises(NonFiniteLoss) as raised:
        trainer.fit()
    # steps 3 to 8 poisoned, in the one window the end of the schedule reports
    assert raised.value.step == 8 and "over the last 8 steps, 6 of them non-finite" in str(raised.value)
    assert steps_of(run) == []


def test_without_the_instrument_the_event_has_no_norm(home):
    run = new_run("train.report_every_s=1e-9")
    trainer = trainer_for(run)
    trainer.grad_norms = False   # benchmarks/instruments.py's switch
    trainer.fit()
    steps = steps_of(run)
    assert steps and all("grad_norm" not in e and e["loss_max"] > 0 for e in steps)


def test_a_rank_whose_share_ran_out_counts_no_loss_for_that_step():
    w = Window(torch.device("cpu"), 1.0, 0.0)
    w.keep_loss(torch.tensor(2.0), 4)
    w.keep_loss(torch.tensor(4.0), 4)
    w.count(8, torch.tensor(3.0))
    w.count(8, torch.tensor(5.0))       # no samples here: a norm, no loss
    w.keep_loss(torch.tensor(1.0), 2)
    w.count(8, torch.tensor(math.nan))
    got = w.read()
    assert got.loss == pytest.approx((8 + 16 + 2) / 10)
    assert got.loss_max == pytest.approx(3.0)     # the first step's mean, the empty one left out
    assert (got.grad_norm, got.grad_norm_max, got.nonfinite) == (4.0, 5.0, 1)


def test_two_processes_report_the_global_norm_as_one_does(home):
    """Under DDP each rank's gradient is the all-reduced one: rank 0's norm is the global
    gradient's, the same as one process's at the same global batch, with no collective added."""
    def supervised(*overrides: str) -> list[dict]:
        run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY + [
            "params.n=32", "train.report_every_s=1e-9", *overrides]))
        assert Supervisor(run, poll_s=0.05).supervise() == "finished", run.attempt_log(1).read_text()[-3000:]
        return steps_of(run)
    one = supervised("batch_size=8", "accumulation=4")
    two = supervised("batch_size=8", "accumulation=2", "nproc_per_node=2")
    assert [e["step"] for e in one] == [e["step"] for e in two] == list(range(1, 9))
    for a, b in zip(one, two):
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)


# ---------------------------------------------------------------- a command


def cockpit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(cockpit_cmd(*args), capture_output=True, text=True, env=child_env(),
                          timeout=180)


# Shaped like the HF Trainer's output: a tqdm bar on stderr and every 5 steps a log dict written
# above it (tqdm.write: the bar cleared first) with the grad norm it measured, one of them
# infinite (an fp16 overflow the scaler skipped).
HF_SHAPED = """\
    import sys, time
    for step in range(1, 61):
        time.sleep(0.04)
        sys.stderr.write(f"\\r{100 * step // 60:3d}%|#####     | {step}/60 [00:01<00:01, 20.0it/s]")
        if step % 5 == 0:
            norm = float("inf") if step == 30 else step / 5
            logs = {'loss': 3.0 - step / 60, 'grad_norm': norm, 'learning_rate': 5e-05, 'epoch': step / 60}
            sys.stderr.write("\\r" + " " * 60 + "\\r" + str(logs) + "\\n")
        sys.stderr.flush()
"""


def test_a_commands_printed_grad_norm_reaches_its_step_events(home, tmp_path):
    path = tmp_path / "hf_shaped.py"
    path.write_text(textwrap.dedent(HF_SHAPED))
    done = cockpit("run", "-d", "cpu", "--", PY, str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = list_runs()
    steps = steps_of(run)
    assert len(steps) >= 2 and steps[-1]["step"] == 60
    with_norm = [e for e in steps if "grad_norm" in e]
    assert with_norm, steps
    printed = {step / 5 for step in range(5, 61, 5) if step != 30}
    assert all(e["grad_norm"] in printed for e in with_norm)
    assert steps[-1]["grad_norm"] == 12.0   # the last printed
    assert sum(e.get("nonfinite", 0) for e in steps) == 1   # the infinite one, counted once


REPORTED = """\
    import time
    from cockpit import report
    for step in range(1, 41):
        time.sleep(0.05)
        report.step(step, total=40, loss=1 / step, samples=step * 8, grad_norm=100 + step)
"""


def test_report_steps_grad_norm_reaches_the_step_event(home, tmp_path):
    path = tmp_path / "reported.py"
    path.write_text(textwrap.dedent(REPORTED))
    done = cockpit("run", "-d", "cpu", "--", PY, str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = list_runs()
    steps = steps_of(run)
    assert steps and {e["source"] for e in steps} == {"report"}
    assert all(e["grad_norm"] == 100 + e["step"] for e in steps)
    assert not any("nonfinite" in e for e in steps)


def test_the_tracker_keeps_the_last_finite_norm_and_counts_a_non_finite_one():
    tracker = Tracker()
    tracker.reported({"t": 0.0, "step": 1, "loss": 2.0, "metrics": {"grad_norm": 3.0}})
    tracker.reported({"t": 0.5, "step": 2, "loss": 2.0, "metrics": {"gnorm": math.nan}})
    ((kind, event), *_) = tracker.reported({"t": 1.5, "step": 3, "loss": 1.0, "metrics": {}})
    assert kind == "step" and event["nonfinite"] == 1 and "grad_norm" not in event
    tracker.reported({"t": 2.0, "step": 4, "loss": 1.0, "metrics": {"grad_norm": 7.0}})
    ((kind, event), *_) = tracker.reported({"t": 3.0, "step": 5, "loss": 1.0, "metrics": {}})
    assert event["grad_norm"] == 7.0 and "nonfinite" not in event


# ---------------------------------------------------------------- Lightning


def test_the_lightning_callback_reports_the_norm_lightning_clips(tmp_path, monkeypatch):
    """At its logging steps the callback reports the gradient's total norm as Lightning hands it
    to on_before_optimizer_step: accumulated, not yet clipped."""
    pl = pytest.importorskip("lightning.pytorch")
    from cockpit import report
    from cockpit.integrations.lightning import CockpitCallback
    from engine.record import reached

    events = tmp_path / "events.jsonl"
    for var in ("COCKPIT_INJECT", "RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COCKPIT_EVENTS", str(events))
    monkeypatch.setenv("COCKPIT_ATTEMPT", "1")
    monkeypatch.setenv("COCKPIT_REACHED", str(reached.path_of(tmp_path, 1)))
    report._reset()
    truth: dict[int, float] = {}

    class Truth(pl.Callback):
        def on_before_optimizer_step(self, trainer, module, optimizer):
            grads = [p.grad for p in module.parameters() if p.grad is not None]
            truth[trainer.global_step + 1] = float(torch.linalg.vector_norm(
                torch.stack([g.norm() for g in grads])))

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    x = torch.randn(128, 4)
    data = torch.utils.data.TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=12, accumulate_grad_batches=2,
                         log_every_n_steps=4, gradient_clip_val=0.01, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=str(tmp_path),
                         callbacks=[Truth(), CockpitCallback()])
    try:
        trainer.fit(Regression(), torch.utils.data.DataLoader(data, batch_size=4))
    finally:
        report._reset()
    import json
    progress = [json.loads(line) for line in events.read_text().splitlines()]
    logged = [e for e in progress if e["type"] == "progress" and e["loss"] is not None]
    assert [e["step"] for e in logged] == [4, 8, 12]
    for e in logged:
        assert e["metrics"]["grad_norm"] == pytest.approx(truth[e["step"]], rel=1e-5)
        assert e["metrics"]["grad_norm"] > 0.01   # before clipping
    unlogged = [e for e in progress if e["type"] == "progress" and e["loss"] is None]
    assert all("grad_norm" not in e["metrics"] for e in unlogged)

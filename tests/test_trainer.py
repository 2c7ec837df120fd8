"""The training loop in-process on a tiny matmul: learning, accumulation, checkpoints, resume."""

from __future__ import annotations

import pytest
import torch

from conftest import TINY
from engine import runconfig
from engine.monitor import device
from engine.record import checkpoint
from engine.train.data import SampleOrder
from engine.errors import ConfigError
from engine.record.rundir import RunDir
from train_support import trainer_for


def new_run(*overrides: str) -> RunDir:
    return RunDir.create(runconfig.resolve("matmul", "cpu", TINY + list(overrides)))


def test_loss_falls_and_the_model_learns(home):
    # A report every step: a window of wall-clock time would hold more steps on a fast machine
    # than on a loaded one, and its mean loss with them.
    run = new_run("train.epochs=4", "train.report_every_s=1e-9")
    assert trainer_for(run).fit() == "finished"
    events = run.events()
    losses = [e["loss"] for e in events if e["type"] == "step"]
    assert len(losses) == 32
    assert sum(losses[-4:]) < sum(losses[:4]) / 10, losses
    (evaluation,) = [e for e in events if e["type"] == "eval"]
    assert evaluation["metrics"]["r2"] > 0.9  # chance (predicting the mean) scores 0


def test_optimizer_steps_exactly_once_per_accumulation_group(home):
    run = new_run("params.samples=100", "batch_size=8", "accumulation=4")
    trainer = trainer_for(run)
    calls = {"step": 0, "loss": 0}
    opt_step, loss = trainer.optimizer.step, trainer.workload.loss

    def counting_step(*a, **k):
        calls["step"] += 1
        return opt_step(*a, **k)

    def counting_loss(*a, **k):
        calls["loss"] += 1
        return loss(*a, **k)
    trainer.optimizer.step, trainer.workload.loss = counting_step, counting_loss
    trainer.fit()
    # 100 samples in groups of 32: 32, 32, 32, 4 -> 4 optimizer steps over 4+4+4+1 micro-batches
    assert calls == {"step": 4, "loss": 13}
    assert trainer.step == trainer.total_steps == 4 and trainer.samples_seen == 100


def test_accumulated_gradient_equals_the_full_batch_gradient(home):
    """bs 8 x accum 4 and bs 32 x accum 1 take the same optimizer steps (up to rounding)."""
    finals = []
    for bs, accum in ((8, 4), (32, 1)):
        run = new_run(f"batch_size={bs}", f"accumulation={accum}")
        trainer = trainer_for(run)
        trainer.fit()
        finals.append({k: v.clone() for k, v in trainer.model.state_dict().items()})
    for k in finals[0]:
        torch.testing.assert_close(finals[0][k], finals[1][k], rtol=1e-4, atol=1e-5)


def test_interrupted_run_resumed_ends_with_the_same_weights(home):
    straight = new_run("batch_size=8", "accumulation=2", "train.epochs=2")
    reference = trainer_for(straight)
    reference.fit()

    broken = new_run("batch_size=8", "accumulation=2", "train.epochs=2")
    assert trainer_for(broken, stop_after=5).fit() == "stopped"
    assert checkpoint.latest(broken.checkpoints).name == "step-000000005.pt"
    resumed = trainer_for(broken, attempt=2)
    assert resumed.resumed_from["step"] == 5 and resumed.samples_seen == 5 * 16
    assert resumed.fit() == "finished"

    assert resumed.step == reference.step
    for k, v in reference.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k


def test_resume_with_another_batch_size_continues_at_the_same_sample(home):
    run = new_run("batch_size=8", "accumulation=4")
    seen: list[torch.Tensor] = []
    first = trainer_for(run, stop_after=3, record=seen)
    assert first.fit() == "stopped" and first.samples_seen == 96
    second = trainer_for(run, "batch_size=16", "accumulation=1", record=seen, attempt=2)
    assert second.samples_seen == 96
    assert second.total_steps == 3 + (256 - 96) // 16
    second.fit()
    order = SampleOrder(256, seed=0)
    # every sample exactly once, in the order the run would have seen them without the change
    assert torch.equal(torch.cat(seen), order.indices(0, 256))
    assert [len(i) for i in seen[12:]] == [16] * 10


def test_the_loss_is_read_once_per_reporting_window(home):
    run = new_run("train.report_every_s=3600")
    trainer = trainer_for(run)
    trainer.fit()
    steps = [e for e in run.events() if e["type"] == "step"]
    assert trainer.step == 8 and len(steps) == 1  # one window: the final report
    assert steps[0]["step"] == 8 and steps[0]["samples_per_s"] > 0 and steps[0]["gflop_s"] > 0


def test_checkpoints_are_complete_and_only_the_last_k_kept(home):
    # no health rule that rewinds: nothing older is kept to go back to
    run = new_run("checkpoint_every_steps=1", "keep_checkpoints=2", "batch_size=8", "accumulation=4",
                  "health.on_spike=warn")
    trainer_for(run).fit()
    files = checkpoint.checkpoint_files(run.checkpoints)
    assert [f.name for f in files] == ["step-000000007.pt", "step-000000008.pt"]
    state = checkpoint.load(files[-1])
    assert {"schema", "model", "optimizer", "scaler", "rng", "step", "samples_seen", "config"} <= set(state)
    assert state["samples_seen"] == 256 and state["config"]["device"]["batch_size"] == 8
    assert not list(run.checkpoints.glob("*.tmp"))
    saved = [e for e in run.events() if e["type"] == "checkpoint"]
    assert [e["step"] for e in saved] == list(range(1, 9))  # every step; the last one once


def test_gradient_checkpointing_changes_memory_not_results(home):
    finals = []
    for flag in ("false", "true"):
        run = new_run(f"grad_checkpointing={flag}")
        trainer = trainer_for(run)
        trainer.fit()
        finals.append(trainer.model.state_dict())
    for k in finals[0]:
        torch.testing.assert_close(finals[0][k], finals[1][k])


def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch, home):
    auto = runconfig.resolve("matmul", "auto").device
    assert device.resolve(auto).device.type == "cpu"
    assert "neither CUDA nor MPS" in device.resolve(auto).reason

    monkeypatch.setattr(device, "mps_available", lambda: True)
    resolved = device.resolve(auto)
    assert resolved.device.type == "mps" and resolved.precision == "fp32"
    assert "MPS is available" in resolved.reason

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    resolved = device.resolve(auto)
    assert resolved.device.type == "cuda" and resolved.precision == "bf16"
    assert "Fake GPU" in resolved.reason


def test_compile_is_refused_when_auto_lands_on_mps(monkeypatch, home):
    monkeypatch.setattr(device, "mps_available", lambda: True)
    auto = runconfig.resolve("matmul", "auto", ["compile=true"]).device
    with pytest.raises(ConfigError, match="compile: true is refused on MPS"):
        device.resolve(auto)


def test_a_compiled_trainer_trains_compiled_and_evaluates_eagerly(home, monkeypatch):
    """Evaluation and epoch preparation see other shapes than the training step: compiled,
    they would be compiled again (85 s for trm-chat-small's first eval on the H100)."""
    compiled: list[int] = []  # the micro-batch of each compiled call

    def compile(module):  # torch.compile's stand-in: a module that says it was called
        def forward(x, *args, **kwargs):
            compiled.append(len(x))
            return module(x, *args, **kwargs)
        return forward

    monkeypatch.setattr(torch, "compile", compile)
    # 100 samples in micro-batches of 8: the last is 4, a shape compiling would compile again
    run = new_run("compile=true", "params.samples=100", "batch_size=8", "accumulation=1", "train.epochs=1")
    trainer = trainer_for(run)
    seen = []
    evaluate = trainer.workload.evaluate
    trainer.workload.evaluate = lambda model, dev: seen.append(model) or evaluate(model, dev)
    trainer.fit()
    assert compiled == [8] * 12  # the short last micro-batch ran eagerly
    assert seen and all(model is trainer.model for model in seen)
    assert [e for e in run.events() if e["type"] == "eval"]
    assert trainer.samples_seen == 100


def test_bf16_autocast_on_cpu_trains(home):
    # a report every step: with TINY's 0.01 s window, 8 fast steps can fall in a single window
    run = new_run("precision=bf16", "train.report_every_s=1e-9")
    trainer = trainer_for(run)
    assert trainer.resolved.autocast_dtype == torch.bfloat16
    trainer.fit()
    losses = [e["loss"] for e in run.events() if e["type"] == "step"]
    assert losses[-1] < losses[0]


def test_prepare_epoch_runs_once_per_epoch_and_again_on_resume(home):
    run = new_run("params.samples=64", "train.epochs=3", "batch_size=8", "accumulation=2")
    seen: list[tuple[int, int, bool]] = []

    def attach(trainer):
        def prepare(model, epoch, dev, emit):
            seen.append((epoch, trainer.samples_seen, torch.is_grad_enabled()))
            emit("mining", epoch=epoch)
        trainer.workload.prepare_epoch = prepare
        return trainer

    assert attach(trainer_for(run, stop_after=5)).fit() == "stopped"
    assert seen == [(0, 0, False), (1, 64, False)]  # 5 steps x 16 samples reach into epoch 1
    seen.clear()
    assert attach(trainer_for(run, attempt=2)).fit() == "finished"
    assert seen == [(1, 80, False), (2, 128, False)]  # the resumed epoch is prepared again
    assert [e["epoch"] for e in run.events() if e["type"] == "mining"] == [0, 1, 1, 2]


def warnings_of(run: RunDir) -> list[dict]:
    return [e for e in run.events() if e["type"] == "warning"]


@pytest.mark.parametrize("damage", ["torn", "bit-rot", "garbage"])
def test_an_unreadable_newest_checkpoint_is_reported_and_the_one_before_it_loaded(home, damage):
    run = new_run("checkpoint_every_steps=1", "keep_checkpoints=3")
    assert trainer_for(run, stop_after=5).fit() == "stopped"
    newest = checkpoint.latest(run.checkpoints)
    data = bytearray(newest.read_bytes())
    if damage == "torn":  # a full disk: the write stopped half way
        data = data[:len(data) // 2]
    elif damage == "bit-rot":  # one flipped byte in a weight: torch.load alone would not notice
        data[len(data) // 2] ^= 0xFF
    else:
        data = bytearray(b"\x00garbage" * 64)
    newest.write_bytes(bytes(data))
    with pytest.raises(checkpoint.Unreadable):
        checkpoint.load(newest)
    assert checkpoint.newest_intact(run.checkpoints).name == "step-000000004.pt"

    resumed = trainer_for(run, attempt=2)
    assert resumed.resumed_from["step"] == 4 and resumed.samples_seen == 4 * 32
    (warning,) = warnings_of(run)
    assert warning["kind"] == "checkpoint-unreadable" and warning["path"] == "checkpoints/step-000000005.pt"
    assert "checkpoints/step-000000005.pt cannot be loaded" in warning["message"] and warning["error"]
    # set aside, so it is no longer the newest nor kept in place of a good one
    assert not newest.exists() and (run.checkpoints / "step-000000005.pt.unreadable").exists()
    assert resumed.fit() == "finished" and resumed.samples_seen == 256


def test_a_run_whose_checkpoints_all_fail_to_load_starts_fresh_with_a_warning(home):
    run = new_run("checkpoint_every_steps=2")
    assert trainer_for(run, stop_after=4).fit() == "stopped"
    for path in checkpoint.checkpoint_files(run.checkpoints):
        path.write_bytes(path.read_bytes()[:100])
    fresh = trainer_for(run, attempt=2)
    assert fresh.resumed_from is None and fresh.step == 0 and fresh.samples_seen == 0
    assert not fresh.optimizer.state  # nothing of a half-restored checkpoint left behind
    kinds = [(w["kind"], w["path"]) for w in warnings_of(run)]
    assert kinds == [("checkpoint-unreadable", "checkpoints/step-000000004.pt"),
                     ("checkpoint-unreadable", "checkpoints/step-000000002.pt"),
                     ("checkpoint-unreadable", None)]
    assert "training starts from the beginning" in warnings_of(run)[-1]["message"]
    assert fresh.fit() == "finished" and fresh.samples_seen == 256


def test_a_checkpoint_of_another_model_is_not_loaded(home):
    run = new_run("checkpoint_every_steps=2")
    assert trainer_for(run, stop_after=2).fit() == "stopped"
    path = checkpoint.latest(run.checkpoints)
    state = checkpoint.load(path)
    state["model"] = {k: v[..., :1] for k, v in state["model"].items()}
    torch.save(state, path)
    resumed = trainer_for(run, attempt=2)
    assert resumed.resumed_from is None
    assert "does not fit this run's model" in warnings_of(run)[0]["error"]


def test_max_steps_is_a_budget_of_samples_at_the_first_global_batch(home):
    # 32 samples a step at the run's own preset: 5 steps are 160 samples, whatever a later
    # attempt's batch is.
    run = new_run("batch_size=8", "accumulation=4", "train.max_steps=5", "checkpoint_every_steps=1")
    first = trainer_for(run, stop_after=2)
    assert (first.total_steps, first.total_samples) == (5, 160)
    assert first.fit() == "stopped"
    half = trainer_for(run, "batch_size=4", "accumulation=3", attempt=2)  # 12 a step
    assert half.total_samples == 160 and half.total_steps == 2 + 8  # 96 left: 8 steps of 12
    assert half.fit() == "finished" and half.samples_seen == 160
    assert checkpoint.load(checkpoint.latest(run.checkpoints))["first_global_batch"] == 32


def test_a_stop_another_rank_was_asked_for_takes_the_stop_path_here(home):
    # Its own signal has not come (another machine's supervisor was asked, or torchrun is
    # restarting the others): the stop agreed over the process group is this rank's too, so
    # it checkpoints where the others stop instead of evaluating and finishing alone.
    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY + ["train.epochs=4"]))
    trainer = trainer_for(run)
    trainer.world.any = lambda flag: flag or trainer.step >= 3   # type: ignore[method-assign]
    assert trainer.fit() == "stopped"
    assert trainer.step == 3 and not trainer.stop.requested
    events = run.events()
    assert [e["step"] for e in events if e["type"] == "checkpoint"][-1] == 3
    assert not [e for e in events if e["type"] == "eval"]

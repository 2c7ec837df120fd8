"""Compile paid once (issue 40, item 2): with the preset's compile on, the trainer compiles the
blocks a workload names one by one (engine.train.compiling), the whole model where it names
none; the parity check passes and a resume computes the same losses under each (item 5).

A tiny trm on the CPU, one cycle (no graph-free recursion, so one graph a block): its block is
compiled once in this process and reused by every trainer here (Dynamo's cache is the block's
code's, shared by every block of its class and shapes). No compile time is asserted:
benchmarks/compile.py measures it."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from engine import runconfig
from engine.record import checkpoint
from engine.record.rundir import RunDir
from engine.train import compiling
from train_support import trainer_for

TRM = ["threads=1", "batch_size=4", "accumulation=1", "params.hidden_size=32", "params.num_heads=2",
       "params.L_layers=2", "params.H_cycles=1", "params.L_cycles=1", "params.seq_len=16",
       "params.corpus_bytes=20000", "params.eval_bytes=256", "train.max_steps=6",
       "train.report_every_s=1e-9", "train.checkpoint_every_steps=1"]


def trm_run(*overrides: str) -> RunDir:
    return RunDir.create(runconfig.resolve("trm-tiny", "cpu", TRM + list(overrides)))


def losses(run: RunDir, attempt: int | None = None) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in run.events()
            if e["type"] == "step" and attempt in (None, e["attempt"])}


@pytest.mark.parametrize("compile_as", ["off", "regional", "model"])
def test_the_parity_check_passes_however_the_model_is_compiled(home, compile_as):
    # trm names its blocks: the whole model where the preset says compile_regions = false
    run = trm_run(f"compile={str(compile_as != 'off').lower()}", "parity_check=true",
                  f"compile_regions={str(compile_as != 'model').lower()}", "train.max_steps=2")
    trainer = trainer_for(run)
    assert trainer.fit() == "finished"
    (ready,) = [e for e in run.events() if e["type"] == "trainer_ready"]
    assert ready["compiled"] == compile_as
    assert ready["compiled_blocks"] == (2 if compile_as == "regional" else 0)
    (parity,) = [e for e in run.events() if e["type"] == "parity"]
    assert parity["ok"], parity["message"]
    assert len(losses(run)) == 2


def test_gradient_checkpointing_compiles_the_whole_model_and_trains(home):
    """Checkpointing's backward runs each block again outside the forward, eagerly: a regional
    block's saved tensors would not match (CheckpointError), so the whole model is compiled."""
    run = trm_run("compile=true", "grad_checkpointing=true", "train.max_steps=2")
    assert trainer_for(run).fit() == "finished"
    (ready,) = [e for e in run.events() if e["type"] == "trainer_ready"]
    assert ready["compiled"] == "model" and len(losses(run)) == 2


def test_regional_compile_shares_one_graph_and_leaves_the_model_eager(home):
    trainer = trainer_for(trm_run("compile=true"))
    blocks = trainer.workload.repeated_blocks(trainer.model)
    assert compiling.mode(trainer.forward) == "regional" and compiling.blocks(trainer.forward) == 2
    torch._dynamo.reset()   # the graphs this test makes, whatever an earlier test compiled
    counters.clear()
    batch = trainer.workload.batch(torch.arange(4), trainer.device)
    compiled = trainer.workload.loss(trainer.forward, batch)
    compiled.backward()
    # one graph for both blocks
    assert counters["stats"]["unique_graphs"] == 1
    # outside the forward the blocks run eagerly (the evaluation, the parity check): same numbers
    assert all(block._compiled_call_impl is None for block in blocks)
    captured = counters["stats"]["calls_captured"]
    eager = trainer.workload.loss(trainer.model, batch)
    assert counters["stats"]["calls_captured"] == captured
    torch.testing.assert_close(compiled.detach(), eager.detach(), rtol=1e-4, atol=1e-5)


def test_a_resumed_attempt_under_regional_compile_computes_the_same_losses(home):
    straight = trm_run("compile=true")
    assert trainer_for(straight).fit() == "finished"
    eager = trm_run("compile=false")
    assert trainer_for(eager).fit() == "finished"

    broken = trm_run("compile=true")
    assert trainer_for(broken, stop_after=3).fit() == "stopped"
    assert checkpoint.latest(broken.checkpoints).name == "step-000000003.pt"
    resumed = trainer_for(broken, attempt=2)
    assert resumed.resumed_from["step"] == 3 and resumed.fit() == "finished"

    reference = losses(straight)
    assert sorted(reference) == [1, 2, 3, 4, 5, 6]
    after = losses(broken, attempt=2)
    assert sorted(after) == [4, 5, 6]
    for step, loss in after.items():
        assert loss == pytest.approx(reference[step], rel=1e-4), step
    # and compiled, the numbers are eager's within float32's rounding
    for step, loss in losses(eager).items():
        assert loss == pytest.approx(reference[step], rel=1e-3), step

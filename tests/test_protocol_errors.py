"""A workload that breaks the protocol is told so in one sentence that names it and the method:
loss() returning a tuple, a number, a non-scalar, an integer or a tensor with no gradient;
at the first step of a real run that is a user-code crash with that sentence, not a trainer line."""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from conftest import ROOT, cockpit_cmd, user_preset
from engine import runconfig
from engine.errors import ProtocolError
from engine.record.events import EventWriter
from engine.record.rundir import RunDir, list_runs
from engine.train.trainer import Trainer

SOURCE = '''
import torch
from torch import nn


class Line:
    num_samples = 32

    def __init__(self, mistake):
        self.mistake = mistake
        self.x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))

    def build_model(self, *, grad_checkpointing):
        return nn.Linear(4, 1)

    def batch(self, indices, device):
        return self.x[indices].to(device)

    def loss(self, model, batch):
        errors = (model(batch).squeeze(1) - 1.0) ** 2
        if self.mistake == "tuple":
            return errors.mean(), {{"mse": errors.mean()}}
        if self.mistake == "number":
            return errors.mean().item()
        if self.mistake == "vector":
            return errors
        if self.mistake == "integer":
            return errors.mean().long()
        if self.mistake == "no-grad":
            return errors.mean().detach()
        if self.mistake == "returns-none":
            errors.mean()  # computed, never returned
            return None
        if self.mistake == "returns-dict":
            return {{"loss": errors.mean()}}
        if self.mistake == "numpy":
            return errors.mean().detach().numpy()
        if self.mistake == "object":
            return object()
        return errors.mean()


def build(params, seed):
    return Line(params["mistake"])
'''

SENTENCES = {
    "tuple": "loss() must return a scalar tensor, got a tuple of 2 (Tensor, dict); return the loss "
             "alone (report other figures from evaluate())",
    "number": "loss() must return a scalar tensor, got a Python float (",
    "vector": "loss() must return a scalar tensor, got a tensor of shape (8,); return the mean over "
              "the batch (.mean()), one number",
    "integer": "loss() must return a scalar tensor, got a tensor of dtype torch.int64; expected a "
               "floating-point loss",
    "no-grad": "loss() must return a scalar tensor, got a tensor that does not require grad "
               "(computed under torch.no_grad(), or detached): nothing to train",
    "returns-none": "loss() must return a scalar tensor, got None; return the loss (a missing `return`?)",
    "returns-dict": "loss() must return a scalar tensor, got a dict (loss); return the loss tensor alone",
    "numpy": "loss() must return a scalar tensor, got a numpy ndarray, which has no gradient; return "
             "the torch tensor (no .numpy() or .item())",
    "object": "loss() must return a scalar tensor, got an object",
}


def mistaken(home, mistake: str) -> tuple[str, str]:
    """A preset whose workload file makes this mistake; (preset name, the workload's name)."""
    folder = home / "config" / "presets" / "workloads"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "line_wl.py").write_text(textwrap.dedent(SOURCE.format()))
    user_preset(home, "workloads", "line", f'workload = "./line_wl.py:build"\n[train]\nepochs = 1\n'
                                           f'[params]\nmistake = "{mistake}"\n')
    return "line", f"{folder / 'line_wl.py'}:build"


@pytest.mark.parametrize("mistake", list(SENTENCES))
def test_each_loss_mistake_is_its_sentence_naming_the_workload(home, mistake):
    preset, name = mistaken(home, mistake)
    run = RunDir.create(runconfig.resolve(preset, "cpu", ["batch_size=8", "accumulation=1",
                                                          "threads=1", f"params.mistake={mistake}"]))
    trainer = Trainer(run, EventWriter(run.events_path, attempt=1), "cpu", run.config().device)
    with pytest.raises(ProtocolError) as e:
        trainer.train_step()
    assert str(e.value).startswith(f"workload {name!r}: " + SENTENCES[mistake])
    assert e.value.where == f"{home / 'config' / 'presets' / 'workloads' / 'line_wl.py'}:19"  # def loss


def test_a_correct_loss_passes_the_check(home):
    preset, _ = mistaken(home, "none")
    run = RunDir.create(runconfig.resolve(preset, "cpu", ["batch_size=8", "accumulation=1", "threads=1"]))
    trainer = Trainer(run, EventWriter(run.events_path, attempt=1), "cpu", run.config().device)
    assert trainer.fit() == "finished" and trainer.step == 4


def test_a_protocol_error_at_the_first_step_is_user_code_with_its_sentence(home):
    mistaken(home, "tuple")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cockpit_cmd("--no-ui", "--workload", "line", "--device", "cpu", "--set",
                                      "batch_size=8", "--set", "accumulation=1", "--set", "threads=1"),
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "crashed: user-code. The workload code raised ProtocolError; falling back will not fix " \
           "a bug." in done.stdout
    assert SENTENCES["tuple"] in done.stdout and "line_wl.py:19" in done.stdout
    assert "trainer.py" not in done.stdout  # the sentence, not the trainer's line that tripped
    (run,) = list_runs()
    (crash,) = [e for e in run.events() if e["type"] == "crash"]
    assert crash["kind"] == "user-code" and SENTENCES["tuple"] in crash["evidence"]["message"]

"""[train]'s optimizer and learning-rate schedule: the curve by samples seen (warmup, cosine,
linear), kept across a resume and a fallback to another batch, weight decay on matrices only,
SGD, and a workload's own configure_optimizers."""

from __future__ import annotations

import math
import secrets
import sys
import textwrap

import pytest
import torch
from torch import nn

from conftest import TINY, user_preset
from engine import runconfig
from engine.errors import ConfigError, ProtocolError
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.record import checkpoint
from engine.train import optim
from engine.train.trainer import Trainer

# matmul at TINY: 256 samples, 8 x 4 = 32 a step; two epochs are 16 steps, 512 samples.
COSINE = ["train.epochs=2", "train.lr=0.05", "train.schedule=cosine", "train.warmup_steps=4",
          "train.min_lr=0.005", "checkpoint_every_steps=1"]


def new_run(*overrides: str, workload: str = "matmul") -> RunDir:
    return RunDir.create(runconfig.resolve(workload, "cpu", TINY + list(overrides)))


def trainer_for(run: RunDir, *device_overrides: str, attempt: int = 1, stop_after: int | None = None,
                lrs: list | None = None) -> Trainer:
    """A trainer that records (samples seen at the end of each step, the lr it stepped with)."""
    config = run.config()
    _, preset = runconfig.apply_overrides(config.workload, config.device, list(device_overrides))
    trainer = Trainer(run, EventWriter(run.events_path, attempt=attempt), "cpu", preset)
    step = trainer.train_step

    def recording_step():
        step()
        if lrs is not None:
            lrs.append((trainer.samples_seen, trainer.lr))
        if trainer.step == stop_after:
            trainer.stop.requested = True
    trainer.train_step = recording_step
    return trainer


def cosine(samples: int, peak=0.05, low=0.005, warmup=128, total=512) -> float:
    if samples < warmup:
        return peak * samples / warmup
    return low + (peak - low) * 0.5 * (1 + math.cos(math.pi * (samples - warmup) / (total - warmup)))


def test_the_schedule_at_warmup_end_middle_and_end():
    s = optim.Schedule(kind="cosine", warmup_samples=100, total_samples=1100, min_ratio=0.1)
    assert s.factor(50) == pytest.approx(0.5)           # half way up the warmup
    assert s.factor(100) == pytest.approx(1.0)          # warmup's end: the peak
    assert s.factor(600) == pytest.approx(0.55)         # half way down: (1 + 0.1) / 2
    assert s.factor(1100) == pytest.approx(0.1)         # the end: min_lr
    assert s.factor(5000) == pytest.approx(0.1)         # never below it
    linear = optim.Schedule(kind="linear", warmup_samples=0, total_samples=1000, min_ratio=0.0)
    assert [linear.factor(n) for n in (0, 250, 1000)] == pytest.approx([1.0, 0.75, 0.0])
    constant = optim.Schedule(kind="constant", warmup_samples=10, total_samples=1000, min_ratio=0.5)
    assert [constant.factor(n) for n in (5, 10, 1000)] == pytest.approx([0.5, 1.0, 1.0])


def test_the_trainer_steps_on_the_curve_and_reports_lr_in_step_events(home):
    run = new_run(*COSINE)
    lrs: list = []
    trainer_for(run, lrs=lrs).fit()
    assert [s for s, _ in lrs] == list(range(32, 513, 32))
    assert [lr for _, lr in lrs] == pytest.approx([cosine(s) for s, _ in lrs])
    assert lrs[3][1] == pytest.approx(0.05) and lrs[-1][1] == pytest.approx(0.005)
    events = [e for e in run.events() if e["type"] == "step"]  # a window per checkpoint here
    assert [e["lr"] for e in events] == pytest.approx([cosine(e["samples_seen"]) for e in events])
    assert events[-1]["samples_seen"] == 512 and events[-1]["lr"] == pytest.approx(0.005)
    ready = next(e for e in run.events() if e["type"] == "trainer_ready")
    assert ready["optimizer"] == "AdamW, cosine from 0.05 to 0.005 after 4 warmup steps"
    state = checkpoint.load(checkpoint.latest(run.checkpoints))
    assert state["scheduler"]["schedule"] == {"kind": "cosine", "warmup_samples": 128,
                                              "total_samples": 512, "min_ratio": pytest.approx(0.1)}


def test_a_resume_mid_warmup_continues_the_same_curve(home):
    straight: list = []
    reference = trainer_for(new_run(*COSINE), lrs=straight)
    reference.fit()

    run = new_run(*COSINE)
    resumed: list = []
    assert trainer_for(run, stop_after=2, lrs=resumed).fit() == "stopped"  # step 2 of 4 warming up
    second = trainer_for(run, attempt=2, lrs=resumed)
    assert second.resumed_from["step"] == 2
    second.fit()
    assert resumed == straight  # the same samples, the same learning rates, to the bit
    for k, v in reference.model.state_dict().items():
        assert torch.equal(v, second.model.state_dict()[k]), k


def test_a_fallback_to_half_the_batch_keeps_lr_a_function_of_samples(home):
    run = new_run(*COSINE)
    lrs: list = []
    trainer_for(run, stop_after=3, lrs=lrs).fit()          # 96 samples, warming up
    half = trainer_for(run, "batch_size=8", "accumulation=2", attempt=2, lrs=lrs)  # 16 a step
    half.fit()
    assert [s for s, _ in lrs] == [32, 64, 96, *range(112, 513, 16)]
    assert [lr for _, lr in lrs] == pytest.approx([cosine(s) for s, _ in lrs])
    # The warmup ends at sample 128, at step 5 of the new batch, not at its 4th step.
    assert dict(lrs)[112] < 0.05 and dict(lrs)[128] == pytest.approx(0.05)


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied, as GPT-2's


def test_weight_decay_reaches_matrices_only_by_default(home):
    model = Tiny()
    config = runconfig.resolve("matmul", "cpu", ["train.weight_decay=0.5", "train.lr=0.1"])
    groups = optim.param_groups(model, 0.5)
    named = {id(p): n for n, p in model.named_parameters()}
    assert [[named[id(p)] for p in g["params"]] for g in groups] == [
        ["proj.weight"], ["embed.weight", "proj.bias", "norm.weight", "norm.bias"]]
    assert [g["weight_decay"] for g in groups] == [0.5, 0.0]

    # What that means for a step: with zero gradients only the matrix shrinks (by lr x decay).
    optimizer = optim.build(model, config.workload.train, torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    for name, p in model.named_parameters():
        expected = before[name] * (1 - 0.1 * 0.5) if name == "proj.weight" else before[name]
        torch.testing.assert_close(p.detach(), expected)

    every = optim.param_groups(model, 0.5, "all")
    assert len(every) == 1 and len(every[0]["params"]) == 5


def test_the_optimizer_settings_reach_torch(home):
    train = runconfig.resolve("matmul", "cpu", ["train.beta2=0.95", "train.eps=1e-6"]).workload.train
    adamw = optim.build(Tiny(), train, torch.device("cpu"))
    assert isinstance(adamw, torch.optim.AdamW)
    assert adamw.defaults["betas"] == (0.9, 0.95) and adamw.defaults["eps"] == 1e-6
    assert not adamw.defaults.get("fused")  # fused only on CUDA
    train = runconfig.resolve("matmul", "cpu", ["train.optimizer=sgd", "train.momentum=0.8"]).workload.train
    sgd = optim.build(Tiny(), train, torch.device("cpu"))
    assert isinstance(sgd, torch.optim.SGD) and sgd.defaults["momentum"] == 0.8


@pytest.mark.parametrize("override, message", [
    ("train.beta2=1.0", "train.beta2: got 1.0, expected a number from 0 to below 1"),
    ("train.min_lr=0.1", "train.min_lr: got 0.1, above lr 0.001; expected at most lr"),
    ("train.schedule=step", "train.schedule: got 'step', expected one of 'constant', 'cosine', 'linear'"),
    ("train.optimizer=adam", "train.optimizer: got 'adam', expected one of 'adamw', 'sgd'"),
    ("train.warmup_steps=-1", "train.warmup_steps: got -1, expected an integer >= 0"),
])
def test_bad_optimizer_settings_are_one_clear_error(home, override, message):
    with pytest.raises(ConfigError) as e:
        runconfig.resolve("matmul", "cpu", ["train.lr=0.001", override])
    assert message in e.value.line()


# ---------------------------------------------------------------- configure_optimizers

OWN = '''
import torch
from torch import nn

class Plain:
    num_samples = 64
    def __init__(self, returns):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
        self.returns = returns
    def build_model(self, *, grad_checkpointing):
        return nn.Linear(4, 1)
    def batch(self, indices, device):
        return self.x[indices].to(device), self.y[indices].to(device)
    def loss(self, model, batch):
        x, y = batch
        return ((model(x).squeeze(1) - y) ** 2).mean()

class Line(Plain):
    def configure_optimizers(self, model, train):
        sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=train.momentum)
        if self.returns == "optimizer":
            return sgd
        if self.returns == "pair":
            return sgd, torch.optim.lr_scheduler.StepLR(sgd, step_size=2, gamma=0.5)
        if self.returns == "stranger":
            return torch.optim.SGD(nn.Linear(4, 1).parameters(), lr=0.1)
        return self.returns

def build(params, seed):
    return Line(params["returns"])

def plain(params, seed):
    return Plain(params["returns"])
'''


def own_run(home, tmp_path, monkeypatch, returns: str, *overrides: str, factory: str = "build") -> RunDir:
    name = f"own_opt_{secrets.token_hex(4)}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(OWN))
    monkeypatch.syspath_prepend(str(tmp_path))
    user_preset(home, "workloads", "own", f'workload = "{name}:{factory}"\n[train]\nepochs = 1\n'
                                          f'[params]\nreturns = "{returns}"\n')
    return RunDir.create(runconfig.resolve("own", "cpu", ["batch_size=8", "accumulation=1", "threads=1",
                                                          "checkpoint_every_steps=1", *overrides]))


def test_a_workloads_own_optimizer_trains_on_the_schedule(home, tmp_path, monkeypatch):
    run = own_run(home, tmp_path, monkeypatch, "optimizer", "train.schedule=linear")
    lrs: list = []
    trainer = trainer_for(run, lrs=lrs)
    assert isinstance(trainer.optimizer, torch.optim.SGD) and trainer.scheduler is None
    trainer.fit()
    # its own peak, 0.05, decayed linearly over the 64 samples
    assert [s for s, _ in lrs] == list(range(8, 65, 8))
    assert [lr for _, lr in lrs] == pytest.approx([0.05 * (1 - s / 64) for s in range(8, 65, 8)])
    ready = next(e for e in run.events() if e["type"] == "trainer_ready")
    assert ready["optimizer"] == "SGD from configure_optimizers, linear from its lr to 0x"


def test_a_workloads_own_scheduler_steps_once_a_step_and_resumes(home, tmp_path, monkeypatch):
    run = own_run(home, tmp_path, monkeypatch, "pair")
    lrs: list = []
    assert trainer_for(run, stop_after=3, lrs=lrs).fit() == "stopped"
    state = checkpoint.load(checkpoint.latest(run.checkpoints))
    assert state["scheduler"]["last_epoch"] == 3
    trainer_for(run, attempt=2, lrs=lrs).fit()
    # StepLR halves every 2 steps: steps 1-2 at 0.05, 3-4 at 0.025, ... across the resume
    assert [lr for _, lr in lrs] == pytest.approx([0.05, 0.05, 0.025, 0.025, 0.0125, 0.0125,
                                                   0.00625, 0.00625])


@pytest.mark.parametrize("returns, message", [
    ("junk", "workload '{mod}:build': configure_optimizers() must return a torch optimizer or "
             "(optimizer, scheduler), got a str"),
    ("stranger", "workload '{mod}:build': configure_optimizers() must return an optimizer over the "
                 "parameters of the model it is given; 2 of its parameters are not that model's"),
])
def test_a_bad_configure_optimizers_is_named(home, tmp_path, monkeypatch, returns, message):
    run = own_run(home, tmp_path, monkeypatch, returns)
    with pytest.raises(ProtocolError) as e:
        trainer_for(run)
    mod = run.config().workload.workload.partition(":")[0]
    assert str(e.value).startswith(message.format(mod=mod))
    assert e.value.where.startswith(str(tmp_path / f"{mod}.py") + ":")


def test_a_scheduler_of_its_own_and_a_schedule_in_train_are_refused(home, tmp_path, monkeypatch):
    run = own_run(home, tmp_path, monkeypatch, "pair", "train.schedule=cosine")
    with pytest.raises(ConfigError, match=r"configure_optimizers\(\) returns a scheduler of its own, "
                                          r"and \[train\] sets schedule = 'cosine'"):
        trainer_for(run)
    sys.modules.pop(run.config().workload.workload.partition(":")[0], None)


def test_the_shipped_presets_adopt_the_schedules_of_their_notes_and_papers(home):
    from engine import presets

    def train(name):
        t = presets.load_workload(name).train
        return t.schedule, t.warmup_steps, t.beta2

    assert train("trm-tiny") == ("constant", 10, 0.95)          # TRM: warmup, then constant
    assert train("trm-chat-small") == ("constant", 100, 0.95)
    assert train("clip-m1") == ("cosine", 10, 0.98)             # CLIP: warmup + cosine
    assert train("clip-tiny") == ("cosine", 0, 0.98)
    assert train("twotower-v4")[0] == "cosine"                  # notes 000/001's cosine decay
    assert train("lora-grpo-wordle")[0] == "linear"             # TRL's GRPOTrainer default
    assert train("matmul") == train("twotower-small") == ("constant", 0, 0.999)


# ---------------------------------------------------------------- resuming an optimizer's state


def test_a_checkpoint_from_before_the_decay_split_resumes_with_each_parameters_state(home, tmp_path,
                                                                                    monkeypatch):
    """A run checkpointed when the optimizer had one group of every trainable parameter (before
    weight decay split them into matrices and the rest) resumes from its step, each parameter
    with its own moments, instead of finding no checkpoint that loads and starting again."""
    run = own_run(home, tmp_path, monkeypatch, "none", "train.weight_decay=0.1", factory="plain")
    first = trainer_for(run, stop_after=3)
    assert first.fit() == "stopped" and len(first.optimizer.param_groups) == 2  # weight | bias
    path = checkpoint.latest(run.checkpoints)
    state = checkpoint.load(path)
    # The same moments, written as the one-group optimizer of before wrote them.
    params = list(first.model.parameters())
    old = torch.optim.AdamW(params, lr=0.05, weight_decay=0.1)
    old.state.update({p: first.optimizer.state[p] for p in params})
    state["optimizer"] = old.state_dict()
    torch.save(state, path)

    second = trainer_for(run, attempt=2)
    assert second.resumed_from is not None and second.resumed_from["step"] == 3
    for mine, theirs in zip(second.model.parameters(), params):
        torch.testing.assert_close(second.optimizer.state[mine]["exp_avg"], first.optimizer.state[theirs]["exp_avg"])
    assert [g["weight_decay"] for g in second.optimizer.param_groups] == [0.1, 0.0]
    assert second.fit() == "finished" and second.step == 8


def test_a_resumed_optimizer_keeps_this_attempts_kernel_choice():
    """A CUDA attempt's fused AdamW, resumed after a fallback to the CPU or MPS, runs the kernel
    that attempt chose: the checkpoint's 'fused' is not carried over."""
    model = Tiny()
    fused = torch.optim.AdamW(optim.param_groups(model, 0.1), lr=0.01, fused=True)  # fused on CPU too
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    fused.step()
    plain = torch.optim.AdamW(optim.param_groups(model, 0.1), lr=0.01)
    plain.load_state_dict(optim.loadable(plain, fused.state_dict(), model))
    assert not any(g["fused"] for g in plain.param_groups)
    plain.step()  # the loaded state fits the unfused kernel
    assert all(int(plain.state[p]["step"]) == 2 for p in model.parameters())

"""lora: adapters on a frozen trm base learn new text; the base stays bit-for-bit the same."""

from __future__ import annotations

import math
import random

import pytest
import torch

from engine import runconfig
from engine.record import checkpoint
from engine.errors import ConfigError
from engine.record.rundir import RunDir
from engine.train.sampling import continue_prompt
from test_trm import CPU, TRM_TINY, trained_run, trainer_for

ARCH = [o for o in TRM_TINY if o.split("=")[0] in (
    "params.hidden_size", "params.L_layers", "params.num_heads", "params.H_cycles", "params.L_cycles")]
LORA_TINY = ARCH + [o for o in TRM_TINY if not o.startswith("params.")] + [
    "params.max_seq_len=32", "params.rank=4", "params.dropout=0.0", "params.corpus_bytes=60000",
    "params.eval_bytes=4096", "params.grad_checkpointing=false"]


def wordle_text(path, games: int = 1500) -> str:
    """Note 003's task, as text: guesses and their clues, nothing like Python source."""
    words = ["CRANE", "BRINE", "FROST", "SLATE", "PLUMB", "GHOST", "TRAIN", "MOUSE"]
    rng = random.Random(0)
    lines = []
    for _ in range(games):
        answer, guess = rng.choice(words), rng.choice(words)
        clue = " ".join(f"{g}{'+' if g == a else '~' if g in answer else '-'}"
                        for g, a in zip(guess, answer))
        lines.append(f"<guess>{guess}</guess> {clue}\n")
    path.write_text("".join(lines))
    return str(path)


MARKUP_PROMPT, MARKUP = b"<guess>CRANE</guess> C+ R~ A- N- E+\n<guess>SLATE", b"</guess> S"


def markup_log_prob(model) -> float:
    """The mean log-probability per byte of the markup's bytes after a line of the game."""
    tokens = torch.tensor([list(MARKUP_PROMPT + MARKUP)])
    with torch.no_grad():
        logits = model(tokens[:, :-1]).float()
    picked = torch.log_softmax(logits, -1)[0].gather(-1, tokens[0, 1:, None])[-len(MARKUP):]
    return float(picked.mean())


def lora_run(*overrides: str) -> RunDir:
    return RunDir.create(runconfig.resolve("lora-grpo-wordle", "cpu", LORA_TINY + list(overrides)))


def test_adapters_learn_while_the_base_stays_frozen(home, tmp_path):
    base = trained_run()
    base_state = checkpoint.load(checkpoint.latest(base.checkpoints))["model"]
    run = lora_run(f"params.base_run={base.path}", f"params.data_path={wordle_text(tmp_path / 'w.txt')}",
                   "train.max_steps=60", "params.target_modules=['qkv', 'out', 'gate_up', 'down']")
    trainer = trainer_for(run)

    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all(n.rsplit(".", 1)[-1] in ("lora_a", "lora_b") for n in trainable)
    # One A and one B per wrapped layer: 4 kinds of layer in the 1-block stack.
    assert len(trainable) == 2 * 4
    with torch.no_grad():
        before = trainer.workload.evaluate(trainer.model, CPU)["bits_per_byte"]
    assert before < 8  # the base already knows some bytes: it starts from the base's weights
    markup_before = markup_log_prob(trainer.model)

    assert trainer.fit() == "finished"
    events = run.events()
    (ready,) = [e for e in events if e["type"] == "trainer_ready"]
    assert ready["trainable"] == sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    assert ready["trainable"] < ready["parameters"] / 4
    (evaluation,) = [e for e in events if e["type"] == "eval"]
    metrics = evaluation["metrics"]
    assert metrics["bits_per_byte"] < min(before - 2.5, 4.5)  # measured: 7.4 -> 3.5
    assert metrics["trainable_params"] == ready["trainable"]
    assert metrics["peak_rss_mb"] > 50

    # Every base weight, wrapped or not, is exactly what the base run saved.
    final = checkpoint.load(checkpoint.latest(run.checkpoints))["model"]
    base_keys = {k.replace(".base.", "."): k for k in final if "lora_" not in k}
    assert set(base_keys) == set(base_state)
    for name, key in base_keys.items():
        assert torch.equal(final[key], base_state[name]), name

    # The fine-tuning text's markup, which no Python source has, became far likelier: at least
    # 3x a byte on average (6.6x on a 2-core x86 VM). Greedy text's exact bytes are not
    # asserted: they move with the CPU's floating point (AVX-512 against AVX2) and with any
    # change to how the base trained.
    gained = markup_log_prob(trainer.model) - markup_before
    assert gained > math.log(3), (markup_before, gained)
    # and a checkpointed run writes text from it
    assert len(continue_prompt(run, "CRANE</guess> C+ R~", tokens=8, temperature=0, seed=0).text) == 8


def test_without_a_base_run_adapters_sit_on_a_fresh_trm(home):
    run = lora_run("train.max_steps=30", "params.grad_checkpointing=true")
    trainer = trainer_for(run)
    assert trainer.model.grad_checkpointing  # the workload's switch, though the device's is off
    frozen = sum(p.numel() for p in trainer.model.parameters() if not p.requires_grad)
    assert frozen == 45056  # the same trm as test_trm's tiny config
    assert trainer.fit() == "finished"
    losses = [e["loss"] for e in run.events() if e["type"] == "step"]
    assert losses[-1] < losses[0] - 0.5


def test_bad_lora_settings_are_config_errors(home):
    with pytest.raises(ConfigError, match=r"params.target_modules: got 'q_proj', expected names "
                                          r"from qkv, out, gate_up, down"):
        runconfig.resolve("lora-grpo-wordle", "cpu", ["params.target_modules=['q_proj']"])
    with pytest.raises(ConfigError, match=r"params.base_run: got 'last', which would name this run"):
        runconfig.resolve("lora-grpo-wordle", "cpu", ["params.base_run=last"])
    with pytest.raises(ConfigError, match=r"params.base_run: 'nope': not found"):
        trainer_for(lora_run("params.base_run=nope"))
    matmul = RunDir.create(runconfig.resolve("matmul", "cpu"))
    with pytest.raises(ConfigError, match=r"trained 'matmul'; expected a trm run"):
        trainer_for(lora_run(f"params.base_run={matmul.id}"))
    untrained = RunDir.create(runconfig.resolve("trm-tiny", "cpu", TRM_TINY))
    with pytest.raises(ConfigError, match=r"has no checkpoint yet"):
        trainer_for(lora_run(f"params.base_run={untrained.id}"))


def test_the_shipped_preset_carries_note_003s_settings(home):
    params = runconfig.resolve("lora-grpo-wordle", "cpu").workload.params
    assert params.max_seq_len == 128 and params.grad_checkpointing
    assert params.alpha / params.rank == 2.0

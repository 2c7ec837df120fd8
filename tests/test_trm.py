"""trm: the byte-level recursive LM learns real text on CPU in seconds; its corpus split is
fixed; `cockpit sample` continues a prompt from a real run's checkpoint."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from conftest import ROOT, child_env, cockpit_cmd
from engine import runconfig
from engine.errors import ConfigError
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.train.sampling import continue_prompt
from engine.train.trainer import Trainer
from engine.workloads.trm import corpus

# ~45k parameters, 32-byte windows of 60 kB of the standard library: 60 steps take ~2 s.
TRM_TINY = ["params.hidden_size=32", "params.L_layers=1", "params.num_heads=2",
            "params.H_cycles=2", "params.L_cycles=1", "params.seq_len=32",
            "params.corpus_bytes=60000", "params.eval_bytes=4096", "train.lr=0.01",
            "train.report_every_s=0.01", "threads=1", "batch_size=16", "accumulation=1"]
CPU = torch.device("cpu")


def new_run(*overrides: str, workload: str = "trm-tiny") -> RunDir:
    return RunDir.create(runconfig.resolve(workload, "cpu", TRM_TINY + list(overrides)))


def trainer_for(run: RunDir) -> Trainer:
    config = run.config()
    return Trainer(run, EventWriter(run.events_path, attempt=1), "cpu", config.device)


def trained_run(steps: int = 60) -> RunDir:
    run = new_run(f"train.max_steps={steps}")
    assert trainer_for(run).fit() == "finished"
    return run


def test_bits_per_byte_falls_far_below_chance(home):
    run = new_run("train.max_steps=60")
    trainer = trainer_for(run)
    with torch.no_grad():
        before = trainer.workload.evaluate(trainer.model, CPU)["bits_per_byte"]
    assert before > 7.5  # an untrained model is no better than a uniform guess: 8 bits
    assert trainer.fit() == "finished"
    events = run.events()
    losses = [e["loss"] for e in events if e["type"] == "step"]
    assert losses[-1] < losses[0] - 1.5
    (evaluation,) = [e for e in events if e["type"] == "eval"]
    metrics = evaluation["metrics"]
    # Below 4.8 bits, the held-out text's entropy under the training text's byte frequencies:
    # the model uses context, not only how common each byte is.
    assert metrics["bits_per_byte"] < 4.5
    assert metrics["held_out_loss"] == pytest.approx(metrics["bits_per_byte"] * 0.693147, rel=1e-5)
    assert metrics["peak_rss_mb"] > 50  # this process's peak, torch included


def test_grad_checkpointing_and_bf16_change_the_cost_not_the_learning(home):
    plain = trainer_for(new_run("train.max_steps=3"))
    plain.fit()
    checkpointed = trainer_for(new_run("train.max_steps=3", "grad_checkpointing=true"))
    assert checkpointed.model.grad_checkpointing
    checkpointed.fit()
    for a, b in zip(plain.model.parameters(), checkpointed.model.parameters()):
        assert torch.allclose(a, b, atol=1e-6)  # recomputing activations gives the same gradients

    bf16 = new_run("train.max_steps=20", "params.forward_dtype=bf16")
    trainer = trainer_for(bf16)
    assert trainer.fit() == "finished"
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # weights stay fp32
    (evaluation,) = [e for e in bf16.events() if e["type"] == "eval"]
    assert evaluation["metrics"]["bits_per_byte"] < 5.5


def test_the_stdlib_corpus_and_its_held_out_part_are_fixed():
    small = corpus.load("", corpus_bytes=20_000, eval_bytes=4096, min_bytes=33)
    large = corpus.load("", corpus_bytes=80_000, eval_bytes=4096, min_bytes=33)
    assert "standard library" in small.source
    assert small.held_out == large.held_out and len(small.held_out) == 4096
    assert large.train.startswith(small.train) and len(small.train) == 20_000
    assert corpus.stdlib_files() == sorted(corpus.stdlib_files(), key=lambda p: str(p))
    assert not any("site-packages" in p.parts for p in corpus.stdlib_files())


def test_a_txt_file_holds_out_its_tail(tmp_path):
    text = b"".join(b"line %d of the user's own text\n" % i for i in range(2000))
    path = tmp_path / "notes.txt"
    path.write_bytes(text)
    data = corpus.load(str(path), corpus_bytes=10**6, eval_bytes=4096, min_bytes=33)
    assert data.train + data.held_out == text and len(data.held_out) == 4096


def test_a_jsonl_chat_file_is_rendered_as_role_turns(tmp_path):
    path = tmp_path / "chat.jsonl"
    lines = [{"messages": [{"role": "user", "content": f"question {i}"},
                           {"role": "assistant", "content": f"answer {i}"}]} for i in range(400)]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    data = corpus.load(str(path), corpus_bytes=10**6, eval_bytes=1024, min_bytes=33)
    assert b"<|user|>\nquestion 7\n<|assistant|>\nanswer 7\n<|end|>\n" in data.train + data.held_out
    assert len(data.held_out) == 1024

    path.write_text(json.dumps(lines[0]) + "\n{not json\n")
    with pytest.raises(ConfigError, match=r"chat.jsonl:2: is not JSON"):
        corpus.load(str(path), corpus_bytes=10**6, eval_bytes=64, min_bytes=33)
    path.write_text(json.dumps({"messages": [{"role": "user"}]}) + "\n")
    with pytest.raises(ConfigError, match=r"chat.jsonl:1: each message must be"):
        corpus.load(str(path), corpus_bytes=10**6, eval_bytes=64, min_bytes=33)


def test_bad_params_name_the_key_and_what_was_expected(home, tmp_path):
    with pytest.raises(ConfigError, match=r"params.hidden_size: got 30, expected a multiple of "
                                          r"num_heads \(4\)"):
        runconfig.resolve("trm-tiny", "cpu", ["params.hidden_size=30", "params.num_heads=4"])
    with pytest.raises(ConfigError, match=r"params.data_path: got 'data.csv', expected a .txt "
                                          r"or .jsonl file"):
        runconfig.resolve("trm-tiny", "cpu", ["params.data_path=data.csv"])
    with pytest.raises(ConfigError, match=r"params.forward_dtype: got 'fp16', expected one of "
                                          r"'fp32', 'bf16'"):
        runconfig.resolve("trm-tiny", "cpu", ["params.forward_dtype=fp16"])
    missing = str(tmp_path / "nowhere.txt")
    with pytest.raises(ConfigError, match=r"params.data_path: .*nowhere.txt' is not a file"):
        trainer_for(new_run(f"params.data_path={missing}"))
    tiny_text = tmp_path / "tiny.txt"
    tiny_text.write_text("too short")
    with pytest.raises(ConfigError, match=r"has \d bytes, expected at least 33"):
        trainer_for(new_run(f"params.data_path={tiny_text}"))


def test_shipped_presets_have_the_notes_sizes(home):
    from engine.workloads.trm.model import Arch, RecursiveLM

    def size(name: str) -> int:
        params = runconfig.resolve(name, "cpu").workload.params
        with torch.device("meta"):  # shapes only: no memory, no initialisation time
            return sum(p.numel() for p in RecursiveLM(Arch.of(params)).parameters())

    assert 6.5e6 < size("trm-tiny") < 7.5e6          # note 002: Tiny ~7M
    assert 27e6 < size("trm-chat-small") < 32e6      # note 002: Small ~30M
    small = runconfig.resolve("trm-chat-small", "cpu").workload.params
    assert (small.hidden_size, small.L_layers, small.num_heads, small.forward_dtype) == \
        (768, 4, 12, "bf16")


def test_cockpit_sample_prints_the_runs_continuation(home):
    run = trained_run()
    args = ["--prompt", "def ", "--tokens", "60", "--temperature", "0.8", "--seed", "3"]
    out = subprocess.run(cockpit_cmd("sample", run.id, *args), capture_output=True, text=True,
                         env=child_env(), cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    expected = continue_prompt(run, "def ", tokens=60, temperature=0.8, seed=3)
    assert out.stdout == expected.text + "\n"
    assert f"checkpoint {expected.checkpoint.name} (step 60)" in out.stderr
    # A model that learned Python writes mostly printable ASCII; random bytes would be ~37%.
    printable = sum(c.isascii() and (c.isprintable() or c in "\n\t") for c in expected.text)
    assert printable / len(expected.text) > 0.9


def test_sample_refuses_runs_that_cannot_write_text(home, capsys):
    from cockpit.cli import main

    matmul = RunDir.create(runconfig.resolve("matmul", "cpu"))
    assert main(["sample", matmul.id, "--prompt", "x"]) == 2
    assert "its workload 'matmul' does not write text" in capsys.readouterr().err
    untrained = new_run()
    assert main(["sample", untrained.id, "--prompt", "x"]) == 2
    assert "has no checkpoint yet" in capsys.readouterr().err


def test_rope_tables_and_a_longer_window_give_the_same_numbers():
    """RoPE's tables cover the training window; a longer one (generating past it) computes
    its angles instead, which must be the same numbers."""
    from engine.workloads.trm.model import Arch, RecursiveLM

    torch.manual_seed(0)
    arch = Arch(hidden_size=32, L_layers=1, num_heads=2, expansion=2.0, H_cycles=1, L_cycles=1)
    short, long = RecursiveLM(arch, positions=16), RecursiveLM(arch, positions=64)
    long.load_state_dict(short.state_dict())
    tokens = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        assert torch.allclose(short(tokens), long(tokens), atol=1e-6)           # past the tables
        assert torch.allclose(short(tokens[:, :16]), long(tokens[:, :16]), atol=1e-6)

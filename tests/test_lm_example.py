"""examples/lm_workload.py end to end, the documented way: a token file written by
examples/lm_prepare.py, the preset naming the workload by its path (no PYTHONPATH), a cosine
schedule, and the held-out loss falling."""

from __future__ import annotations

import math
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, cockpit_cmd
from engine.record.rundir import list_runs

EXAMPLES = ROOT / "examples"
SMALL = ["params.n_layer=2", "params.n_embd=64", "params.n_head=4", "params.block_size=64",
         "params.eval_windows=32", "batch_size=16", "accumulation=1", "threads=2",
         "train.epochs=1.5", "train.warmup_steps=10", "train.eval_every_steps=40",
         "train.lr=0.003", "train.min_lr=0.0003", "train.report_every_s=0.2"]


def text(size: int, seed: int = 0) -> str:
    """Sentences from a small grammar: something a byte-level model can learn in a minute."""
    rng = random.Random(seed)
    nouns = ["cat", "dog", "bird", "fish", "horse", "mouse", "fox", "owl"]
    verbs = ["sees", "chases", "likes", "finds", "follows", "hears"]
    adjectives = ["small", "quick", "lazy", "brown", "old", "young"]
    out, n = [], 0
    while n < size:
        sentence = (f"the {rng.choice(adjectives)} {rng.choice(nouns)} {rng.choice(verbs)} "
                    f"the {rng.choice(nouns)}.\n")
        out.append(sentence)
        n += len(sentence)
    return "".join(out)[:size]


@pytest.fixture
def data(tmp_path):
    (tmp_path / "corpus.txt").write_text(text(100_000))
    done = subprocess.run([sys.executable, str(EXAMPLES / "lm_prepare.py"), str(tmp_path / "corpus.txt"),
                           "--out", str(tmp_path / "data")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "train.bin (90,000 tokens) and val.bin (10,000 tokens)" in done.stdout
    return tmp_path / "data"


def test_prepare_writes_numpy_token_files(data):
    train = np.fromfile(data / "train.bin", dtype=np.uint16)
    assert len(train) == 90_000 and bytes(train[:4].astype(np.uint8)) == b"the "


def test_the_lm_example_trains_on_cpu_and_its_held_out_loss_falls(home, data, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COCKPIT_CONFIG_DIR": str(EXAMPLES)}
    sets = [*SMALL, f"params.data_dir={data}"]
    (tmp_path / "elsewhere").mkdir()
    done = subprocess.run([sys.executable, "-P", *cockpit_cmd("--no-ui", "--workload", "lm", "--device", "cpu",
                                                              *[a for s in sets for a in ("--set", s)])[1:]],
                          capture_output=True, text=True, env=env, cwd=tmp_path / "elsewhere", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = list_runs()
    events = run.events()
    evals = [e["metrics"]["val_loss"] for e in events if e["type"] == "eval"]
    steps = [e for e in events if e["type"] == "step"]
    total = steps[-1]["total"]
    assert total == math.ceil(1.5 * (90_000 - 1) // 64 / 16) and len(evals) == 1 + total // 40
    assert evals[0] < math.log(256)                 # learning from the first eval on
    assert evals == sorted(evals, reverse=True) and evals[-1] < 1.2 and evals[-1] < 0.75 * evals[0], evals
    # the preset's cosine, counted in samples: down to min_lr at the last sample
    assert steps[-1]["lr"] == pytest.approx(0.0003)
    ready = next(e for e in events if e["type"] == "trainer_ready")
    assert ready["optimizer"] == "AdamW, cosine from 0.003 to 0.0003 after 10 warmup steps"
    assert re.search(r"val_loss [0-9.]+", done.stdout)


def test_missing_data_is_one_line_naming_the_setting_and_what_to_run(home, tmp_path):
    """The preset's own data_dir is not checked before --set replaces it; the workload checks
    the one it is given when it is built, and the run ends as bad input (exit 2)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COCKPIT_CONFIG_DIR": str(EXAMPLES)}
    done = subprocess.run(cockpit_cmd("--no-ui", "--workload", "lm", "--device", "cpu", "--set",
                                      f"params.data_dir={tmp_path / 'none'}"),
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert (f"lm_workload.py: params.data_dir: {tmp_path / 'none'} has no train.bin; write them with "
            "python examples/lm_prepare.py (from any text), or point data_dir at your own") in done.stdout


@pytest.mark.parametrize("args, message", [
    (["nope.txt"], "lm_prepare: nope.txt: no such file; expected a text file to take tokens from"),
    (["--val-fraction", "1.5"], "lm_prepare: --val-fraction: got 1.5, expected a fraction above 0 and below 1"),
])
def test_prepare_refuses_bad_input_in_one_line(tmp_path, args, message):
    done = subprocess.run([sys.executable, str(EXAMPLES / "lm_prepare.py"), *args, "--out",
                           str(tmp_path / "data")], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == message, done.stderr
    assert not (tmp_path / "data").exists()


def test_data_that_does_not_fit_the_settings_is_bad_input_naming_the_setting(tmp_path):
    """Too few tokens for block_size, or a token id past vocab_size: a ConfigError (the run ends
    as bad input, exit 2, one line), not the workload's traceback."""
    from engine.errors import ConfigError
    from engine.workloads import custom

    factory = custom.load(f"{EXAMPLES / 'lm_workload.py'}:build", "workload")
    folder = tmp_path / "data"
    folder.mkdir()
    np.arange(100, dtype=np.uint16).tofile(folder / "train.bin")
    np.arange(40, dtype=np.uint16).tofile(folder / "val.bin")
    with pytest.raises(ConfigError) as e:
        factory.factory(factory.params(data_dir=str(folder), block_size=64), 0)
    assert e.value.line() == (f"lm_workload.py: params.block_size: 64, but {folder}'s train.bin has 100 "
                              "tokens and val.bin 40; expected more than block_size tokens in each")
    import torch

    workload = factory.factory(factory.params(data_dir=str(folder), block_size=8, vocab_size=50), 0)
    with pytest.raises(ConfigError) as e:
        workload.batch(torch.arange(workload.num_samples), torch.device("cpu"))
    assert e.value.line() == ("lm_workload.py: params.vocab_size: 50, but the data has token id 96; "
                              "expected a vocab_size above every id in train.bin and val.bin")

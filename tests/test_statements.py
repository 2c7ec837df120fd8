"""engine.command.statements: the facts a command's argv states, with the words they came from."""
from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT, child_env

from engine.command.statements import fact_of, from_argv, is_setting, normalise, whole_number


@pytest.mark.parametrize("argv, expected", [
    # nanoGPT's configurator
    (["python", "train.py", "config/train_shakespeare_char.py", "--max_iters=200",
      "--gradient_accumulation_steps=4", "--batch_size=12"],
     {"total": (200, "--max_iters=200"), "accumulation": (4, "--gradient_accumulation_steps=4"),
      "batch_size": (12, "--batch_size=12")}),
    # argparse, the value as the next word
    (["train.py", "--max_steps", "300", "--epochs", "3", "--grad_accum", "2"],
     {"total": (300, "--max_steps 300"), "epochs": (3, "--epochs 3"),
      "accumulation": (2, "--grad_accum 2")}),
    # HF's run_clm: -1 means unset, 3.0 is three
    (["run_clm.py", "--num_train_epochs", "3.0", "--max_steps", "-1",
      "--gradient_accumulation_steps", "4", "--per_device_train_batch_size", "8"],
     {"epochs": (3, "--num_train_epochs 3.0"), "accumulation": (4, "--gradient_accumulation_steps 4"),
      "batch_size": (8, "--per_device_train_batch_size 8")}),
    # a micro-batch by its short names (issue 39: an adopted `--bs 32 --accum 16`)
    (["train.py", "--bs", "32", "--accum", "16"], {"batch_size": (32, "--bs 32"), "accumulation": (16, "--accum 16")}),
    # hydra overrides, dotted, with + and ++
    (["train.py", "trainer.max_steps=300", "+trainer.accumulate_grad_batches=2", "++data.epochs=5"],
     {"total": (300, "trainer.max_steps=300"), "accumulation": (2, "+trainer.accumulate_grad_batches=2"),
      "epochs": (5, "++data.epochs=5")}),
    # names in any case, dashes or underscores
    (["train.py", "--Num-Train-Steps", "500", "--max-epochs=7", "--ACCUM", "16"],
     {"total": (500, "--Num-Train-Steps 500"), "epochs": (7, "--max-epochs=7"),
      "accumulation": (16, "--ACCUM 16")}),
    (["train.py", "--max_iters=600_000"], {"total": (600000, "--max_iters=600_000")}),
])
def test_from_argv(argv, expected):
    assert from_argv(argv) == expected


def test_a_later_statement_wins():
    assert from_argv(["t.py", "--max_iters=100", "--max_steps", "300"]) == {"total": (300, "--max_steps 300")}


@pytest.mark.parametrize("argv", [
    ["train.py"], [], ["train.py", "--lr", "3e-4", "--out", "ckpt", "--eval_batch_size", "64"],
    ["train.py", "--max_steps"],                       # no value
    ["train.py", "--max_steps", "--epochs"],           # the next word is a flag
    ["train.py", "--max_steps", "{max_steps}"],        # an unfilled placeholder
    ["train.py", "--max_steps=3e2", "--epochs=2*3", "--accum=0", "--num_train_epochs", "0.5"],
    ["train.py", "max_steps=", "=300", "--=3", "-=4"],
])
def test_what_states_nothing(argv):
    assert from_argv(argv) == {}


def test_never_raises():
    assert from_argv([None, 3, b"--max_steps", "--max_steps", 300]) == {"total": (300, "--max_steps 300")}
    assert from_argv("not a list") == {}
    assert from_argv(None) == {}


@pytest.mark.parametrize("name, key", [
    ("max_iters", "total"), ("--max-steps", "total"), ("trainer.max_steps", "total"),
    ("num_train_epochs", "epochs"), ("accumulate_grad_batches", "accumulation"),
    ("batch_size", None), ("lr", None), ("eval_iters", None), ("max_lr", None)])
def test_fact_of(name, key):
    assert fact_of(name) == key


@pytest.mark.parametrize("name, setting", [
    ("max_steps", True), ("num_workers", True), ("eval_steps", True), ("warmup_iters", True),
    ("num_train_epochs", True), ("batch_size", True), ("micro_batch_size", True),
    ("grad_accum", True), ("limit_train_batches", True),
    ("loss", False), ("epoch", False), ("step", False), ("val_loss", False), ("grad_norm", False),
    ("train_loss_step", False), ("reward", False)])
def test_is_setting(name, setting):
    assert is_setting(name) is setting


def test_normalise_and_whole_numbers():
    assert normalise(" --Grad-Accum ") == "grad_accum"
    assert [whole_number(t) for t in ("200", "1_000", "3.0", "3.5", "-1", "0", "2e3", "")] == [
        200, 1000, 3, None, None, None, None, None]


def test_stdlib_only():
    out = subprocess.run([sys.executable, "-c",
                          "import engine.command.statements, sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, env=child_env(), check=True, cwd=ROOT)
    assert not {"torch", "textual", "numpy"} & set(out.stdout.split())


def test_a_printed_batch_size_states_no_fact():
    """A micro-batch counts only from the argv beside a stated accumulation; printed alone
    (nanoGPT's `Overriding: batch_size = 12`) it is no step's size."""
    from engine.command.statements import stated_in

    assert stated_in("Overriding: batch_size = 12") == {}
    assert stated_in("batch_size = 12") is None

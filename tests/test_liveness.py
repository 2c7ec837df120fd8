"""Liveness is not an optimizer step: a long accumulation group on a slow device is advancing,
and the hang watch knows it (issue 24: trm-tiny on the cpu preset, 8 x 64, was killed as a hang
after 300 s of its first step)."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap

from conftest import TINY, child_env, cockpit_cmd, user_preset

# Each micro-batch sleeps: 64 of them make a step of about 6 s, twice the hang timeout below,
# while a micro-batch (0.1 s) is far inside it (note 001's CPU fallback is 8 x 64).
SLOW_MICRO_BATCHES = '''
import time

import torch
from torch import nn


class Slow:
    num_samples = 128

    def __init__(self, params, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(128, 4, generator=g)
        self.y = self.x.sum(1)

    def build_model(self, *, grad_checkpointing):
        return nn.Linear(4, 1)

    def batch(self, indices, device):
        return self.x[indices].to(device), self.y[indices].to(device)

    def loss(self, model, batch):
        time.sleep(0.1)  # a slow device's micro-batch
        x, y = batch
        return ((model(x).squeeze(1) - y) ** 2).mean()


def build(params, seed):
    return Slow(params, seed)
'''


def test_a_step_of_many_micro_batches_longer_than_the_hang_timeout_finishes(home):
    (home / "slow_micro_batches.py").write_text(textwrap.dedent(SLOW_MICRO_BATCHES))
    user_preset(home, "workloads", "slowmb", f'workload = "{home / "slow_micro_batches.py"}:build"\n'
                                             "[train]\nepochs = 1\nmax_steps = 2\nreport_every_s = 0.05\n")
    done = subprocess.run(cockpit_cmd("--no-ui", "--json", "-w", "slowmb", "-d", "cpu", "--set", "batch_size=1",
                                      "--set", "accumulation=64", "--set", "hang_timeout_s=3",
                                      "--set", "threads=1"),
                          capture_output=True, text=True, env=child_env(), timeout=300)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, done.stderr[-2000:]
    assert [e["outcome"] for e in events if e["type"] == "attempt_ended"] == ["finished"]
    beats = [e for e in events if e["type"] == "heartbeat"]
    # the groups were seen advancing, micro-batch by micro-batch, in both steps
    assert {e["step"] for e in beats} == {0, 1} and all(e["of"] == 64 for e in beats)
    assert all(0 < e["micro_batches"] < 64 for e in beats)


# appended to SLOW_MICRO_BATCHES
SLOW_BUILD = '''

class SlowToBuild(Slow):
    def __init__(self, params, seed):
        time.sleep(6)   # a big bank of vectors to encode, a dataset to tokenize: 3x the timeout
        super().__init__(params, seed)


def build(params, seed):
    return SlowToBuild(params, seed)
'''


def test_a_data_build_longer_than_the_hang_timeout_is_start_up_not_a_hang(home):
    """Start-up (data, model, the first step's compile) is judged by the start-up allowance:
    the trainer's publisher, made before the data is built, says no step yet, not step 0."""
    (home / "slow_build.py").write_text(textwrap.dedent(SLOW_MICRO_BATCHES) + textwrap.dedent(SLOW_BUILD))
    user_preset(home, "workloads", "slowbuild", f'workload = "{home / "slow_build.py"}:build"\n'
                                                "[train]\nepochs = 1\nmax_steps = 2\nreport_every_s = 0.05\n")
    done = subprocess.run(cockpit_cmd("--no-ui", "--json", "-w", "slowbuild", "-d", "cpu", "--set", "batch_size=4",
                                      "--set", "accumulation=1", "--set", "hang_timeout_s=2",
                                      "--set", "max_attempts=1", "--set", "threads=1"),
                          capture_output=True, text=True, env=child_env(), timeout=300)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [e["outcome"] for e in events if e["type"] == "attempt_ended"] == ["finished"], done.stdout[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_run_that_died_before_its_first_checkpoint_says_so_and_its_total(home):
    """Nothing to resume from: no `runs resume` offered; the total is known from the trainer."""
    sets = [a for o in (*TINY, "max_attempts=1", "inject=['native-crash@1']") for a in ("--set", o)]
    done = subprocess.run(cockpit_cmd("--no-ui", "-w", "matmul", "-d", "cpu", *sets),
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "saved no checkpoint" in done.stdout and "runs resume" not in done.stdout
    listed = subprocess.run(cockpit_cmd("runs", "list"), capture_output=True, text=True,
                            env=child_env(), timeout=60)
    (row,) = [line for line in listed.stdout.splitlines() if "matmul" in line]
    assert re.search(r"\b0/\d+\b", row) and "0/?" not in row, row


def test_a_run_interrupted_before_its_first_checkpoint_is_not_offered_a_resume(home):
    """The lifeline's word when the supervisor dies, as the headless line and the alert say it."""
    from cockpit.present.lines import human_line
    from engine import runconfig
    from engine.record.events import EventWriter
    from engine.run.lifeline import stop_orphan
    from engine.record.rundir import RunDir

    def interrupted(run) -> str:
        stop_orphan(run.path, None)   # the supervisor died, with no attempt running
        (event,) = [e for e in run.events() if e["type"] == "run_interrupted"]
        return human_line(event, None)

    bare = RunDir.create(runconfig.resolve("matmul", "cpu", TINY))
    said = interrupted(bare)
    assert "saved no checkpoint" in said and "runs resume" not in said
    saved = RunDir.create(runconfig.resolve("matmul", "cpu", TINY))
    with EventWriter(saved.events_path, attempt=1) as events:
        events.emit("checkpoint", step=4, path="checkpoints/step-000000004.pt")
    assert interrupted(saved).endswith(f"continue it with: cockpit runs resume {saved.id}")

"""Two processes under torchrun with gloo on CPU: the same training as one process at the same
global batch, and a killed rank falling back to one process."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from conftest import TINY, user_preset
from engine import runconfig
from engine.record import checkpoint
from engine.errors import ConfigError
from engine.record.rundir import RunDir
from engine.run.supervisor import Supervisor

RUN = TINY + ["params.n=32", "params.samples=256", "train.epochs=3", "train.checkpoint_every_steps=2"]


def of_type(run: RunDir, kind: str) -> list[dict]:
    return [e for e in run.events() if e["type"] == kind]


def train(device: str, *overrides: str) -> RunDir:
    run = RunDir.create(runconfig.resolve("matmul", device, RUN + list(overrides)))
    assert Supervisor(run, poll_s=0.05).supervise() == "finished", run.attempt_log(1).read_text()[-3000:]
    return run


def final_weights(run: RunDir) -> dict:
    return checkpoint.load(checkpoint.latest(run.checkpoints))["model"]


def test_two_gloo_processes_train_like_one_at_the_same_global_batch(home):
    one = train("cpu", "batch_size=8", "accumulation=4")
    two = train("cpu", "batch_size=8", "accumulation=2", "nproc_per_node=2")
    ready = of_type(two, "trainer_ready")[0]
    assert (ready["world_size"], ready["global_batch"], ready["total_steps"]) == (2, 32, 24)
    assert of_type(one, "trainer_ready")[0]["total_steps"] == 24
    # rank 1 heartbeats at each report; rank 0 reports steps, and heartbeats only inside a group
    beats = of_type(two, "heartbeat")
    assert {e["rank"] for e in beats if "micro_batches" not in e} == {1}
    assert {e["rank"] for e in beats if "micro_batches" in e} <= {0}
    a, b = final_weights(one), final_weights(two)
    for key in a:  # the same gradients, summed in another order
        assert torch.allclose(a[key], b[key], rtol=1e-4, atol=1e-6), key
    r2 = [of_type(r, "eval")[-1]["metrics"]["r2"] for r in (one, two)]
    assert r2[0] > 0.5 and abs(r2[0] - r2[1]) < 1e-3
    assert of_type(two, "checkpoint")[-1]["samples_seen"] == 3 * 256


def test_a_killed_rank_falls_back_to_one_process_and_resumes(home):
    user_preset(home, "devices", "pair", 'device = "cpu"\nbatch_size = 8\naccumulation = 2\n'
                'threads = 1\nnproc_per_node = 2\nfallback = ["single"]\nrules = { killed = "next" }\n')
    user_preset(home, "devices", "single", 'device = "cpu"\nbatch_size = 8\naccumulation = 4\nthreads = 1\n')
    # A pause per step from step 1 (slow, on rank 0; rank 1 waits for it at each all-reduce):
    # the 2-process attempt lasts seconds, whatever the machine, so the kill lands mid-training
    # however late it comes (without it the steps after the first checkpoint took 0.8 s). Once
    # a run: the attempt on 'single' trains at full speed.
    run = RunDir.create(runconfig.resolve("matmul", "pair", RUN + ["train.epochs=40", "inject=['slow@1']"]))
    result = {}
    thread = threading.Thread(target=lambda: result.update(status=Supervisor(run, poll_s=0.05).supervise()))
    thread.start()
    deadline = time.monotonic() + 120
    rank1 = lambda: [e for e in of_type(run, "heartbeat") if e["rank"] == 1]  # noqa: E731
    # (rank 0 heartbeats too, inside an accumulation group: it is not the one to kill)
    while not (rank1() and [e for e in of_type(run, "checkpoint") if e["step"] >= 4]):
        assert time.monotonic() < deadline and thread.is_alive(), "the 2-process attempt never got going"
        time.sleep(0.05)
    os.kill(rank1()[-1]["pid"], signal.SIGKILL)
    thread.join(300)
    assert result["status"] == "finished"
    (crash,) = of_type(run, "crash")
    assert crash["kind"] == "killed" and crash["evidence"]["signal"] == "SIGKILL"
    (move,) = of_type(run, "fallback")
    assert (move["from"], move["to_preset"], move["changed"]["nproc_per_node"]) == ("pair", "single", [2, 1])
    second = of_type(run, "trainer_ready")[1]
    assert second["world_size"] == 1 and second["resumed_from"]["step"] == move["resume"]["step"] >= 4
    assert of_type(run, "checkpoint")[-1]["samples_seen"] == 40 * 256


def test_mps_refuses_several_processes(home):
    user_preset(home, "devices", "mps2", 'device = "mps"\nnproc_per_node = 2\n')
    with pytest.raises(ConfigError, match="nproc_per_node: 2 is refused on MPS: torch.distributed has no MPS backend"):
        runconfig.resolve("matmul", "mps2")

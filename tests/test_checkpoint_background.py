"""Checkpoints off the training path (engine.train.checkpointer): a host copy written by a
thread, atomically, one at a time, told once complete; the newest complete one is where a
resume starts. Blocked writers, not clocks: every wait here is on an event a test controls
(with a generous deadline that only a real hang reaches)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import OrderedDict

import pytest
import torch

from conftest import TINY, child_env
from engine import runconfig
from engine.record import checkpoint
from engine.record.rundir import RunDir
from engine.run.supervisor import Supervisor
from engine.schema import to_table
from engine.train import checkpointer
from train_support import trainer_for

DEADLINE_S = 120   # only a real hang gets near this
EVERY_2 = ["train.checkpoint_every_steps=2", "train.checkpoint_every_minutes=0"]


def new_run(*overrides: str) -> RunDir:
    return RunDir.create(runconfig.resolve("matmul", "cpu", TINY + EVERY_2 + list(overrides)))


def saved(run: RunDir) -> list[dict]:
    return [e for e in run.events() if e["type"] == "checkpoint"]


def tensors(state, prefix=""):
    """Every tensor of a nested state, by its path."""
    if isinstance(state, torch.Tensor):
        yield prefix, state
    elif isinstance(state, dict):
        for k, v in state.items():
            yield from tensors(v, f"{prefix}/{k}")
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            yield from tensors(v, f"{prefix}/{i}")


class BlockedSaves:
    """checkpoint.save, held at its start until the test releases that step's write; counts the
    writes in flight."""

    def __init__(self, monkeypatch, blocked: set[int]):
        self.blocked = blocked
        self.entered: dict[int, threading.Event] = {}
        self.release: dict[int, threading.Event] = {}
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.Lock()
        self.real = checkpoint.save
        monkeypatch.setattr(checkpoint, "save", self.save)

    def event(self, table: dict, step: int) -> threading.Event:
        with self.lock:
            return table.setdefault(step, threading.Event())

    def save(self, directory, state, keep, keep_before=0):
        step = state["step"]
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self.event(self.entered, step).set()
            if step in self.blocked:
                assert self.event(self.release, step).wait(DEADLINE_S), f"step {step}'s write never released"
            return self.real(directory, state, keep, keep_before)
        finally:
            with self.lock:
                self.in_flight -= 1

    def free_all(self) -> None:
        self.blocked = set()
        with self.lock:
            for e in self.release.values():
                e.set()


def in_thread(function) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run():
        try:
            result["value"] = function()
        except BaseException as e:   # noqa: BLE001 - handed to the test
            result["error"] = e
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def waited(event: threading.Event, what: str) -> None:
    assert event.wait(DEADLINE_S), f"no {what} within {DEADLINE_S} s"


# ---------------------------------------------------------------- the host copy

def test_the_host_copy_is_the_state_as_it_was_and_its_buffers_are_kept():
    weight = torch.randn(4, 3)
    model = OrderedDict(a=weight, tied=weight, b=torch.arange(5))
    model._metadata = OrderedDict({"": {"version": 1}})  # type: ignore[attr-defined]
    state = {"model": model, "optimizer": {"state": {0: {"exp_avg": torch.ones(2), "step": torch.tensor(3.0)}},
                                           "param_groups": [{"lr": 0.1, "betas": (0.9, 0.95), "params": [0]}]},
             "step": 7, "samples_seen": 56, "config": {"device": {"batch_size": 8}}}
    before = weight.clone()
    host = checkpointer.HostCopy()
    first = host.copy(state)
    host.ready()
    weight.add_(1.0)                       # training goes on: the copy does not move
    state["optimizer"]["param_groups"][0]["lr"] = 0.2
    assert torch.equal(first["model"]["a"], before)
    assert first["optimizer"]["param_groups"][0] == {"lr": 0.1, "betas": (0.9, 0.95), "params": [0]}
    assert first["model"]["tied"] is first["model"]["a"]          # tied weights stay one tensor
    assert first["model"]._metadata == {"": {"version": 1}}      # a module's versions, kept
    assert isinstance(first["model"], OrderedDict) and first["step"] == 7
    pointers = [t.data_ptr() for _, t in tensors(first)]
    second = host.copy(state)              # the next checkpoint: the same buffers, refilled
    assert [t.data_ptr() for _, t in tensors(second)] == pointers
    assert torch.equal(second["model"]["a"], weight)


# ---------------------------------------------------------------- checkpoint files

def test_a_temp_file_is_never_a_checkpoint_and_the_next_complete_save_removes_it(tmp_path):
    checkpoint.save(tmp_path, {"step": 2, "w": torch.ones(3)}, keep=1)
    leftover = tmp_path / ".step-000000004.pt.tmp"      # a write killed half-way
    leftover.write_bytes((tmp_path / "step-000000002.pt").read_bytes()[:100])
    assert [p.name for p in checkpoint.checkpoint_files(tmp_path)] == ["step-000000002.pt"]
    assert checkpoint.newest_intact(tmp_path).name == "step-000000002.pt"
    checkpoint.save(tmp_path, {"step": 4, "w": torch.ones(3)}, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000004.pt"]


def test_the_previous_checkpoint_is_pruned_only_once_the_new_one_is_complete(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, {"step": 2, "w": torch.ones(3)}, keep=1)

    def torn(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", torn)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path, {"step": 4, "w": torch.ones(3)}, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000000002.pt"]


# ---------------------------------------------------------------- the trainer

def test_background_and_synchronous_checkpoints_hold_the_same_state_and_resume_at_the_same_sample(home, monkeypatch):
    outcome = {}
    for background in (False, True):
        monkeypatch.setattr(checkpointer, "BACKGROUND", background)
        run = new_run()
        first = trainer_for(run, stop_after=5)
        assert first.fit() == "stopped"
        seen: list[torch.Tensor] = []
        second = trainer_for(run, attempt=2, record=seen)
        resumed = second.resumed_from
        assert second.fit() == "finished"
        outcome[background] = {
            "resumed": (resumed["step"], resumed["samples_seen"]),
            "events": [(e["attempt"], e["step"], e["samples_seen"]) for e in saved(run)],
            "state": dict(tensors(checkpoint.load(run.checkpoints / "step-000000005.pt"))),
            "samples": torch.cat(seen), "weights": second.model.state_dict()}
        assert all({"save_s", "write_s", "wait_s"} <= set(e) for e in saved(run))
    sync, background = outcome[False], outcome[True]
    assert background["resumed"] == sync["resumed"] == (5, 5 * 32)
    assert background["events"] == sync["events"] == \
        [(1, 2, 64), (1, 4, 128), (1, 5, 160), (2, 6, 192), (2, 8, 256)]
    assert background["state"].keys() == sync["state"].keys()
    for key, value in sync["state"].items():   # the host copy is the state the loop had
        assert torch.equal(background["state"][key], value), key
    assert torch.equal(background["samples"], sync["samples"])
    for key, value in sync["weights"].items():
        assert torch.equal(background["weights"][key], value), key


def test_a_checkpoint_due_while_one_is_written_waits_for_it_and_each_is_told_once_complete(home, monkeypatch):
    monkeypatch.setattr(checkpointer, "BACKGROUND", True)
    saves = BlockedSaves(monkeypatch, blocked={2})
    run = new_run("health.on_spike=warn")   # the last 3 only: no rewind target kept
    trainer = trainer_for(run)
    waiting = threading.Event()
    join, at_wait = trainer.checkpoints._join, {}

    def noted_join():   # the writer joining the write in flight before the next one
        if trainer.checkpoints.in_flight and not waiting.is_set():
            at_wait.update(step=trainer.step, told=[e["step"] for e in saved(run)],
                           files=[p.name for p in checkpoint.checkpoint_files(run.checkpoints)])
            waiting.set()
        return join()
    trainer.checkpoints._join = noted_join
    thread, result = in_thread(trainer.fit)
    try:
        waited(saves.event(saves.entered, 2), "write of step 2")
        waited(waiting, "wait for the write of step 2")
        # The loop trained on past step 2 and stopped at the next checkpoint, step 4, to wait:
        # step 4's write has not started, and step 2 is neither on disk nor told.
        assert at_wait == {"step": 4, "told": [], "files": []}
        assert 4 not in saves.entered and thread.is_alive()
    finally:
        saves.free_all()
    thread.join(DEADLINE_S)
    assert result.get("value") == "finished", result
    assert saves.most_in_flight == 1
    events = saved(run)
    assert [e["step"] for e in events] == [2, 4, 6, 8]
    assert all(e["save_s"] >= e["wait_s"] >= 0 and e["write_s"] >= 0 for e in events)
    assert [p.name for p in checkpoint.checkpoint_files(run.checkpoints)] == \
        ["step-000000004.pt", "step-000000006.pt", "step-000000008.pt"]


@pytest.mark.parametrize("stop_after", [None, 5], ids=["finished", "stopped"])
def test_the_last_checkpoint_is_complete_when_the_attempt_ends(home, monkeypatch, stop_after):
    monkeypatch.setattr(checkpointer, "BACKGROUND", True)
    last = 8 if stop_after is None else stop_after
    saves = BlockedSaves(monkeypatch, blocked={last})
    run = new_run()
    trainer = trainer_for(run, stop_after=stop_after)
    finishing = threading.Event()
    finish = trainer.finish_checkpoints

    def noted_finish():
        finishing.set()
        finish()
    trainer.finish_checkpoints = noted_finish
    thread, result = in_thread(trainer.fit)
    try:
        waited(saves.event(saves.entered, last), f"write of step {last}")
        waited(finishing, "the end of the attempt")
        assert thread.is_alive() and last not in [e["step"] for e in saved(run)]  # it waits
    finally:
        saves.free_all()
    thread.join(DEADLINE_S)
    assert result.get("value") == ("finished" if stop_after is None else "stopped"), result
    assert saved(run)[-1]["step"] == last
    newest = checkpoint.latest(run.checkpoints)
    assert newest.name == f"step-{last:09d}.pt" and checkpoint.load(newest)["step"] == last
    assert not list(run.checkpoints.glob(".*.tmp"))


def test_a_write_that_fails_fails_the_attempt_from_the_training_loop(home, monkeypatch):
    monkeypatch.setattr(checkpointer, "BACKGROUND", True)

    def full(directory, state, keep, keep_before=0):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(checkpoint, "save", full)
    trainer = trainer_for(new_run())
    with pytest.raises(OSError, match="No space left"):
        trainer.fit()
    assert trainer.step < trainer.total_steps


CRASHING = """\
import io, sys, threading
from pathlib import Path
import torch
from engine.train import trainer

run_dir, block_at, device = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
real = torch.save

def save(obj, f, *args, **kwargs):
    if isinstance(obj, dict) and obj.get("step") == block_at:
        whole = io.BytesIO()
        real(obj, whole, *args, **kwargs)
        f.write(whole.getvalue()[: len(whole.getvalue()) // 2])   # half of it on disk
        f.flush()
        (run_dir / "write-blocked").write_text(threading.current_thread().name)
        threading.Event().wait()   # until killed
    return real(obj, f, *args, **kwargs)

torch.save = save
sys.exit(trainer.main([str(run_dir), "--attempt", "1", "--preset", "cpu", "--device-json", device]))
"""


def test_a_process_killed_mid_write_leaves_the_previous_checkpoint_the_newest_and_resumes_from_it(home, tmp_path):
    run = new_run()
    script = tmp_path / "crashing.py"
    script.write_text(CRASHING)
    device = json.dumps(to_table(run.config().device))
    child = subprocess.Popen([sys.executable, str(script), str(run.path), "4", device],
                             env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not (run.path / "write-blocked").exists():
            assert child.poll() is None, child.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the write of step 4 never started"
            time.sleep(0.05)
        assert (run.path / "write-blocked").read_text() == "checkpoint-4"   # the writer's thread
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(DEADLINE_S)
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    assert (run.checkpoints / ".step-000000004.pt.tmp").exists()       # the killed write's
    assert [p.name for p in checkpoint.checkpoint_files(run.checkpoints)] == ["step-000000002.pt"]
    assert checkpoint.newest_intact(run.checkpoints).name == "step-000000002.pt"
    assert [e["step"] for e in saved(run)] == [2]                        # never told of step 4
    resumed = trainer_for(run, attempt=2)
    assert (resumed.resumed_from["step"], resumed.resumed_from["samples_seen"]) == (2, 64)
    assert resumed.fit() == "finished"
    assert not list(run.checkpoints.glob(".*.tmp"))                     # cleaned up by a later save
    assert checkpoint.latest(run.checkpoints).name == "step-000000008.pt"


def test_a_supervised_run_stopped_on_request_ends_with_its_checkpoint_complete(home):
    # A pause per step from step 1 (slow: a few hundredths of a second a step): the 320 steps
    # last seconds, whatever the machine, so the stop asked for at the first checkpoint lands
    # before the end however late it comes (at full speed they take about a second).
    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY + ["train.epochs=40",
                                                                  "train.checkpoint_every_steps=4",
                                                                  "inject=['slow@1']"]))
    supervisor = Supervisor(run, poll_s=0.05)

    def on_events(events):
        if any(e["type"] == "checkpoint" for e in events):
            supervisor.request_stop()
    supervisor.on_events = on_events
    assert supervisor.supervise() == "stopped"
    last = saved(run)[-1]
    newest = checkpoint.latest(run.checkpoints)
    assert newest.name == f"step-{last['step']:09d}.pt" and checkpoint.load(newest)["step"] == last["step"]
    assert last["step"] < 320 and not list(run.checkpoints.glob(".*.tmp"))
    assert [e["outcome"] for e in run.events() if e["type"] == "attempt_ended"] == ["stopped"]

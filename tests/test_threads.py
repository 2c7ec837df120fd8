"""Threads that fit the machine (engine.train.threads): the rule fed readings, the reader fed
CPU times, the adapter setting torch's count, what a person is shown of it, and a real trainer
beside busy processes lowering its threads.

No clock is read by the rule or the reader; the real test waits for the event, not for a time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import namedtuple

import pytest
import torch

from cockpit.commands.runs import threads_lines
from cockpit.present.lines import human_line
from conftest import child_env, cockpit_cmd, wait_until
from engine.presets import DevicePreset
from engine.record.rundir import RunSummary
from engine.record.state import RunState
from engine.train import threads
from engine.train.threads import Adapter, CpuReader, Load, ThreadRule


def feed(rule: ThreadRule, load: Load, times: int) -> list[int | None]:
    return [rule.feed(load) for _ in range(times)]


# ---------------------------------------------------------------- the rule


def test_two_busy_processes_on_two_cores_call_for_one_thread():
    # 2 threads of ours and 2 of theirs on 2 cores: each got half a core, so the others used one
    # core but need two
    squeezed = Load(cores=2, others=1.0, own=1.0, threads=2)
    assert squeezed.others_need == pytest.approx(2.0)
    rule = ThreadRule(2)
    assert feed(rule, squeezed, threads.LOWER_AFTER) == [None] * (threads.LOWER_AFTER - 1) + [1]
    assert rule.threads == 1
    # at one thread the others still hold both cores: no change, however long it lasts
    assert feed(rule, Load(cores=2, others=1.33, own=0.67, threads=1), 50) == [None] * 50


def test_what_others_use_on_a_machine_with_idle_time_is_what_they_need():
    idle = Load(cores=8, others=1.0, own=2.0, threads=2)
    assert idle.others_need == 1.0
    assert feed(ThreadRule(2), idle, 20) == [None] * 20


def test_raised_again_only_after_the_cores_have_been_free_for_a_while():
    rule = ThreadRule(4)
    # two busy processes beside 4 threads on 4 cores: 6 threads at 2/3 of a core each
    feed(rule, Load(cores=4, others=1.333, own=2.667, threads=4), threads.LOWER_AFTER)
    assert rule.threads == 2
    free = Load(cores=4, others=0.1, own=2.0, threads=2)
    said = feed(rule, free, threads.RAISE_AFTER)
    assert said == [None] * (threads.RAISE_AFTER - 1) + [4] and rule.threads == 4


def test_a_reading_that_disagrees_starts_the_count_again():
    rule = ThreadRule(2, lower_after=3)
    busy, calm = Load(cores=2, others=1.0, own=1.0, threads=2), Load(cores=2, others=0.0, own=2.0, threads=2)
    assert [rule.feed(x) for x in (busy, busy, calm, busy, busy)] == [None] * 5
    assert rule.feed(busy) == 1


def test_lowered_no_further_than_every_reading_of_the_run_asked():
    # 8 cores with idle time: one reading says 3 are taken, the next 6: lowered to what the
    # first leaves
    rule = ThreadRule(8)
    assert rule.feed(Load(cores=8, others=3.0, own=2.0, threads=8)) is None
    assert rule.feed(Load(cores=8, others=6.0, own=1.0, threads=8)) == 5


def test_a_neighbour_on_half_a_core_does_not_flip_the_count():
    rule = ThreadRule(2)
    feed(rule, Load(cores=2, others=0.5, own=1.5, threads=2), threads.LOWER_AFTER)
    assert rule.threads == 1
    # at one thread the neighbour's half core leaves 1.5 free: not a whole core more
    assert feed(rule, Load(cores=2, others=0.5, own=1.0, threads=1), 100) == [None] * 100
    # shells and daemons (a tenth of a core) do not keep a freed core taken
    assert feed(rule, Load(cores=2, others=0.1, own=1.0, threads=1), threads.RAISE_AFTER)[-1] == 2


def test_never_above_the_ceiling_nor_below_one():
    rule = ThreadRule(2)
    assert feed(rule, Load(cores=16, others=0.0, own=2.0, threads=2), 50) == [None] * 50
    crowded = Load(cores=4, others=3.9, own=0.1, threads=2)   # 30 hogs on 4 cores
    assert feed(rule, crowded, threads.LOWER_AFTER)[-1] == 1
    assert feed(rule, crowded, 50) == [None] * 50 and rule.threads == 1
    assert ThreadRule(0).threads == 1


# ---------------------------------------------------------------- the reader and the adapter

Times = namedtuple("Times", "user system idle")


def test_the_reader_counts_the_process_cores_only_and_the_rest_as_others():
    # core 2 is not the process's: its busy time is nobody's business here
    per_cpu = [[Times(10, 0, 90), Times(20, 0, 80), Times(0, 0, 100)],
               [Times(11, 0, 90), Times(21, 0, 80), Times(1, 0, 100)]]   # 1 s: cores 0, 1 busy
    own = [5.0, 5.5]                                                      # half of it ours
    reader = CpuReader([0, 1], per_cpu=lambda: per_cpu.pop(0), own=lambda: own.pop(0))
    assert reader.read(2) is None
    load = reader.read(2)
    assert load == Load(cores=2, others=1.5, own=0.5, threads=2)


def test_the_adapter_sets_torch_threads_and_says_why():
    class Scripted(CpuReader):
        def __init__(self, loads):
            self.loads, self.restarts = list(loads), 0

        def read(self, threads):
            return self.loads.pop(0)

        def restart(self):
            self.restarts += 1

    said = []
    busy = Load(cores=2, others=1.0, own=1.0, threads=2)
    # the first reading starts with the adapter; after a change, the next starts afresh
    reader = Scripted([None, busy, busy, None])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        adapter = Adapter(2, lambda kind, **fields: said.append((kind, fields)), reader=reader, every_s=0.5)
        for now in (0.0, 0.2, 0.5, 0.7):    # readings due at 0 and 0.5 only, then one to start afresh
            adapter.tick(now, step=3)
        assert reader.loads == [] and torch.get_num_threads() == 1 and reader.restarts == 1
        assert said == [("threads", {"threads": 1, "was": 2, "ceiling": 2, "step": 3, "cores": 2,
                                     "others": 1.0, "others_need": 2.0, "reason": "contention"})]
    finally:
        torch.set_num_threads(before)


def test_adapted_on_the_cpu_only_and_where_the_preset_lets_it():
    quiet = lambda *a, **k: None   # noqa: E731
    assert Adapter.for_run(DevicePreset(device="cpu"), torch.device("cpu"), quiet) is not None
    assert Adapter.for_run(DevicePreset(device="cpu", adapt_threads=False), torch.device("cpu"), quiet) is None
    assert Adapter.for_run(DevicePreset(device="cuda"), torch.device("cuda"), quiet) is None


# ---------------------------------------------------------------- what is shown

LOWERED = {"type": "threads", "attempt": 1, "threads": 1, "was": 2, "ceiling": 2, "step": 3,
           "cores": 2, "others": 1.0, "others_need": 2.0, "reason": "contention"}
RAISED = {**LOWERED, "threads": 2, "was": 1, "step": 40, "others": 0.1, "others_need": 0.1, "reason": "free"}


def test_each_change_has_its_line_and_runs_show_lists_them():
    assert human_line(LOWERED) == ("attempt 1: torch threads 2 -> 1 at step 3: other processes need all "
                                   "2 cores (threads beyond the free cores wait on each other)")
    assert human_line({**LOWERED, "cores": 4, "was": 4, "threads": 3, "others_need": 1.42}).endswith(
        "need about 1.4 of the 4 cores (threads beyond the free cores wait on each other)")
    assert human_line(RAISED) == ("attempt 1: torch threads 1 -> 2 at step 40: the cores are free "
                                  "again (others use 0.1 of 2)")
    state = RunState.of([LOWERED, RAISED])
    summary = RunSummary(id="r", workload="matmul", device_preset="cpu",
                         threads=[{k: e[k] for k in ("attempt", "step", "was", "threads", "reason", "cores",
                                                     "others_need")} for e in state.threads])
    assert threads_lines(summary) == [
        "threads   2 -> 1 at step 3 (others needed all 2 cores), 1 -> 2 at step 40 (cores",
        "          free)"]
    many = RunSummary(id="r", workload="matmul", device_preset="cpu", threads=summary.threads * 4)
    assert "4 more" in " ".join(threads_lines(many))


# ---------------------------------------------------------------- a real trainer beside busy processes

HOG = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\nwhile True: pass\n"
CORES = {0, 1}


def _pinned():
    os.sched_setaffinity(0, CORES)


@pytest.fixture
def hogs():
    """As many busy processes as the trainer has cores, on those cores."""
    procs = [subprocess.Popen([sys.executable, "-c", HOG], preexec_fn=_pinned) for _ in CORES]
    yield procs
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def _events(home) -> list[dict]:
    logs = list((home / "runs").glob("*/events.jsonl"))
    if not logs:
        return []
    return [json.loads(line) for line in logs[0].read_text().splitlines() if line.endswith("}")]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not CORES <= os.sched_getaffinity(0),
                    reason="pins the run and its neighbours to cores 0 and 1 (Linux)")
def test_a_trainer_beside_busy_processes_lowers_its_threads(home, hogs):
    # pinned to 2 cores, with 2 threads at most, beside a busy process on each: the trainer
    # must come down to 1 thread. It trains until told to stop: what it does, not how fast.
    run = subprocess.Popen(
        cockpit_cmd("--no-ui", "-w", "matmul", "-d", "cpu", "--set", "threads=2",
                    "--set", "params.n=128", "--set", "params.products=8", "--set", "train.epochs=1000",
                    "--set", "train.checkpoint_every_minutes=0"),
        env=child_env(), preexec_fn=_pinned, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        changed = wait_until(lambda: [e for e in _events(home) if e["type"] == "threads"],
                             "the trainer to change its threads", timeout=120)
    finally:
        run.send_signal(signal.SIGINT)   # stop: the run checkpoints and ends
        output, _ = run.communicate(timeout=120)
    ready = next(e for e in _events(home) if e["type"] == "trainer_ready")
    assert ready["threads"] == 2
    assert {k: changed[0][k] for k in ("was", "threads", "ceiling", "cores", "reason")} == {
        "was": 2, "threads": 1, "ceiling": 2, "cores": 2, "reason": "contention"}
    assert changed[0]["others_need"] >= 1.5
    assert "torch threads 2 -> 1" in output


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not CORES <= os.sched_getaffinity(0),
                    reason="pins the probe and its neighbours to cores 0 and 1 (Linux)")
def test_the_probe_fits_its_threads_by_the_same_rule(home, hogs):
    # the probe's worker trains with the trainer's own step: beside the busy processes its
    # 2-thread candidate comes down to 1, and its result says so
    done = subprocess.run(
        cockpit_cmd("probe", "-w", "matmul", "--devices", "cpu", "--no-threads", "--fresh", "--json",
                    "--budget", "30", "--set", "threads=2", "--set", "params.n=128"),
        env=child_env(), preexec_fn=_pinned, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (candidate,) = json.loads(done.stdout)["candidates"]
    assert candidate["threads"] == 2 and candidate["threads_fitted"] == 1
    assert "trained at 1 thread" in candidate["note"]


def test_the_batch_finder_compares_speeds_only_at_the_same_thread_count():
    from engine import runconfig
    from engine.probe import batch as finder

    config = runconfig.resolve("matmul", "cpu", [])
    # batch 8 ran at 2 threads before the neighbours came, 16 and 32 at 1: 8's speed is no
    # batch size's doing
    trials = [finder.Trial(8, True, "fits", samples_per_s=900.0, threads=2),
              finder.Trial(16, True, "fits", samples_per_s=300.0, threads=1),
              finder.Trial(32, True, "fits", samples_per_s=320.0, threads=1)]
    out = finder._result(config, "cpu", config.device, "cpu", trials, 32, None, 32, None, False, 30.0)
    assert "Batch 8 was the fastest" not in out.sentence
    assert out.sentence.endswith("(Other processes took the cores: the trials ran at 2 and 1 threads, "
                                 "so their speeds compare only at the same count.)")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not CORES <= os.sched_getaffinity(0),
                    reason="pins the batch finder and its neighbours to cores 0 and 1 (Linux)")
def test_the_batch_finder_fits_its_threads_by_the_same_rule(home, hogs):
    done = subprocess.run(
        cockpit_cmd("probe", "-w", "matmul", "-d", "cpu", "--find-batch", "--max-batch", "32",
                    "--trial-seconds", "1", "--json", "--set", "threads=2", "--set", "params.n=128"),
        env=child_env(), preexec_fn=_pinned, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    trials = json.loads(done.stdout)["trials"]
    assert trials and trials[-1]["threads"] == 1

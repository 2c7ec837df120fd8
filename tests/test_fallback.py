"""Crashes end to end: every fault injected into a real trainer process, classified from the
evidence, and the device preset's rule applied by the real supervisor."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from conftest import TINY, child_env, cockpit_cmd, user_preset
from engine import runconfig
from engine.record import checkpoint
from engine.record.rundir import RunDir, list_runs
from engine.run.supervisor import Supervisor

# Checkpoint every step, so a resume loses nothing and weights can be compared exactly.
FAST = TINY + ["train.checkpoint_every_steps=1", "train.epochs=3", "params.samples=128"]


def ladder(home, first_extra: str = "", second_extra: str = "") -> None:
    """Two CPU presets: 'first' falls back to 'second' (a different batch, so it shows)."""
    user_preset(home, "devices", "first",
                f'device = "cpu"\nbatch_size = 8\naccumulation = 4\nthreads = 1\n'
                f'fallback = ["second"]\n{first_extra}')
    user_preset(home, "devices", "second",
                f'device = "cpu"\nbatch_size = 4\naccumulation = 8\nthreads = 1\n{second_extra}')


def supervise(*overrides: str, device: str = "first") -> tuple[str, RunDir]:
    run = RunDir.create(runconfig.resolve("matmul", device, FAST + list(overrides)))
    return Supervisor(run, poll_s=0.05).supervise(), run


def of_type(run: RunDir, kind: str) -> list[dict]:
    return [e for e in run.events() if e["type"] == kind]


@pytest.mark.parametrize("fault, kind, action, to", [
    ("native-crash@5", "native-crash", "retry-progress", "first"),  # it got checkpoints further
    ("backend@5", "backend", "next", "second"),
    ("oom@5", "oom", "halve-batch", "first"),
    ("openmp@0", "openmp", "retry-env", "first"),
    ("nan@5", "numerical", "next", "second"),  # it already ran in fp32: fp32 falls through
    ("hang@5", "hang", "next", "second"),
])
def test_each_fault_is_classified_and_its_rule_applied(home, fault, kind, action, to, monkeypatch):
    # openmp fires only where KMP_DUPLICATE_LIB_OK is not set, and twotower's mining sets it in
    # the process it runs in: this pytest process, when a twotower test ran here first
    monkeypatch.delenv("KMP_DUPLICATE_LIB_OK", raising=False)
    # A short hang timeout only where a hang is expected, the first preset's: on a loaded 2-core
    # machine a trainer can be quiet for seconds without hanging, and `--set` would carry it to
    # the preset the run falls back to.
    ladder(home, first_extra="hang_timeout_s = 2\n" if kind == "hang" else "")
    status, run = supervise(f"inject=['{fault}']")
    assert status == "finished"
    (crash,) = of_type(run, "crash")
    assert crash["kind"] == kind and crash["attempt"] == 1 and crash["sentence"]
    (move,) = of_type(run, "fallback")
    assert (move["reason"], move["action"], move["to_preset"]) == (kind, action, to)
    ready = of_type(run, "trainer_ready")
    assert len(ready) == 2
    if action == "halve-batch":
        assert move["changed"] == {"batch_size": [8, 4], "accumulation": [4, 8]}
        assert (ready[1]["batch_size"], ready[1]["accumulation"]) == (4, 8)
    if action == "retry-env":
        assert move["changed"] == {"env": [{}, {"KMP_DUPLICATE_LIB_OK": "TRUE"}]}
        assert "OMP: Error #15" in crash["evidence"]["message"]
    if kind in ("native-crash", "backend", "openmp", "hang"):
        assert crash["evidence"]["signal"] in ("SIGABRT", "SIGKILL")
    # The second attempt resumed where the last checkpoint was, and the run ends with every
    # sample seen exactly once per epoch.
    checkpoints_before = [e for e in of_type(run, "checkpoint") if e["attempt"] == 1]
    if checkpoints_before:
        assert ready[1]["resumed_from"]["samples_seen"] == checkpoints_before[-1]["samples_seen"]
    last = of_type(run, "checkpoint")[-1]
    assert last["samples_seen"] == 3 * 128


def test_a_compile_that_fails_is_run_again_eagerly_on_the_same_preset(home):
    # compile-error@1: torch.compile's failure at the first compiled forward pass (no Triton)
    ladder(home, first_extra="compile = true\n")
    status, run = supervise("inject=['compile-error@1']")
    assert status == "finished"
    (crash,) = of_type(run, "crash")
    assert crash["kind"] == "compile" and "BackendCompilerFailed" in crash["sentence"]
    (move,) = of_type(run, "fallback")
    assert (move["action"], move["to_preset"], move["changed"]) == ("eager", "first", {"compile": [True, False]})
    assert [e["compile"] for e in of_type(run, "trainer_ready")] == [True, False]
    assert of_type(run, "checkpoint")[-1]["samples_seen"] == 3 * 128


def test_numerical_retries_in_fp32_when_it_ran_in_bf16(home):
    ladder(home, first_extra='precision = "bf16"\n')
    status, run = supervise("inject=['nan@4']")
    assert status == "finished"
    (move,) = of_type(run, "fallback")
    assert (move["action"], move["to_preset"], move["changed"]) == ("fp32", "first", {"precision": ["bf16", "fp32"]})
    assert [e["precision"] for e in of_type(run, "trainer_ready")] == ["bf16", "fp32"]
    # No checkpoint was written from the poisoned state.
    for path in checkpoint.checkpoint_files(run.checkpoints):
        assert all(torch.isfinite(t).all() for t in checkpoint.load(path)["model"].values())


def test_user_code_errors_stop_and_are_not_retried(home):
    ladder(home, first_extra='rules = { native-crash = "retry" }\n')
    status, run = supervise("inject=['user-code@3']")
    assert status == "failed"
    assert len(of_type(run, "attempt_started")) == 1 and not of_type(run, "fallback")
    (crash,) = of_type(run, "crash")
    assert crash["kind"] == "user-code" and "Traceback (most recent call last)" in crash["exception"]
    assert "ValueError: too many values to unpack" in crash["exception"]
    assert "falling back will not fix a bug" in crash["sentence"]


def test_max_attempts_is_respected(home):
    ladder(home, first_extra='rules = { native-crash = "retry" }\nmax_attempts = 3\n')
    status, run = supervise("inject=['native-crash@3+']")
    assert status == "failed"
    assert [e["kind"] for e in of_type(run, "crash")] == ["native-crash"] * 3
    (failed,) = of_type(run, "run_failed")
    assert "max_attempts" in failed["reason"]
    finished = of_type(run, "run_finished")[0]
    assert finished["status"] == "failed" and finished["attempts"] == 3


def test_an_exhausted_ladder_fails_the_run(home):
    # The run's faults reach every preset of the ladder: here both rungs crash.
    ladder(home, first_extra='rules = { native-crash = "next" }\n')
    status, run = supervise("inject=['native-crash@2+']")
    assert status == "failed"
    assert [e["preset"] for e in of_type(run, "crash")] == ["first", "second"]
    assert "ladder is exhausted" in of_type(run, "run_failed")[0]["reason"]


def final_weights(run: RunDir) -> dict:
    return checkpoint.load(checkpoint.latest(run.checkpoints))["model"]


def test_a_crash_resumed_on_the_same_preset_ends_with_the_same_weights(home):
    ladder(home, first_extra='rules = { native-crash = "retry" }\n')
    status, clean = supervise()
    assert status == "finished" and len(of_type(clean, "attempt_started")) == 1
    status, crashed = supervise("inject=['native-crash@6', 'native-crash@10']")
    assert status == "finished" and len(of_type(crashed, "attempt_started")) == 3
    assert [e["action"] for e in of_type(crashed, "fallback")] == ["retry", "retry"]
    a, b = final_weights(clean), final_weights(crashed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_external_sigkill_is_detected_and_resumed(home):
    ladder(home)
    # A pause per step from step 1 (slow: a few hundredths of a second a step): the 120 steps
    # last seconds, whatever the machine, so the kill lands mid-training however late it
    # comes (without it they took 0.7 s). Once a run: the resumed attempt trains at full speed.
    run = RunDir.create(runconfig.resolve("matmul", "first", FAST + ["train.epochs=30", "inject=['slow@1']"]))
    supervisor = Supervisor(run, poll_s=0.05)
    result = {}
    thread = threading.Thread(target=lambda: result.update(status=supervisor.supervise()))
    thread.start()
    deadline = time.monotonic() + 60
    while not [e for e in of_type(run, "checkpoint") if e["step"] >= 3]:
        assert time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.05)
    pid = of_type(run, "trainer_ready")[0]["pid"]
    os.kill(pid, signal.SIGKILL)
    thread.join(120)
    assert result["status"] == "finished"
    (crash,) = of_type(run, "crash")
    assert crash["kind"] == "killed" and crash["evidence"]["signal"] == "SIGKILL"
    (move,) = of_type(run, "fallback")
    assert move["action"] == "retry" and move["to_preset"] == "first" and move["resume"]["step"] >= 3
    assert of_type(run, "trainer_ready")[1]["resumed_from"]["step"] == move["resume"]["step"]


def test_headless_prints_crashes_fallbacks_and_a_summary(home):
    import subprocess

    ladder(home)
    args = [a for o in FAST for a in ("--set", o)]
    done = subprocess.run(cockpit_cmd("--no-ui", "--device", "first", "--inject", "native-crash@5",
                                      *args), capture_output=True, text=True, env=child_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "attempt 1 (first) crashed: native-crash. The trainer died from SIGABRT" in out
    assert "fallback: attempt 2 on first (native-crash -> retry-progress (rule); it got a checkpoint " \
           "further); resuming at step 4" in out
    assert "run finished: 2 attempts (first: native-crash after step" in out
    (run,) = list_runs()
    assert run.config().device.inject == ("native-crash@5",)


def test_a_bad_inject_flag_is_one_line_and_exit_2(home):
    import subprocess

    done = subprocess.run(cockpit_cmd("--no-ui", "--device", "cpu", "--inject", "explode@3"),
                          capture_output=True, text=True, env=child_env(), timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "cockpit: --inject: 'explode@3' is not a fault; expected KIND@STEP[+] or KIND@SECONDSs[+] "
        "(an optimizer step, 0 = start-up, or seconds after the attempt's start; + for every "
        "attempt) with KIND one of native-crash, oom, backend, openmp, nan, hang, user-code, slow, "
        "wrong-grad, compile-error, preempt, node-lost, spike, diverge (e.g. 'native-crash@117', 'oom@120+', 'hang@30s', "
        "'nan@1.5s+')"]
    assert not list_runs()


def test_a_crash_at_random_points_is_retried_while_each_attempt_gets_further(home):
    ladder(home)
    # note 001: Metal aborts at batch 927, then 117 -- each attempt gets past a checkpoint
    status, run = supervise("inject=['native-crash@4', 'native-crash@7']")
    assert status == "finished"
    assert [(m["action"], m["to_preset"]) for m in of_type(run, "fallback")] == \
        [("retry-progress", "first"), ("retry-progress", "first")]
    assert [e["resumed_from"]["step"] for e in of_type(run, "trainer_ready")[1:]] == [3, 6]


def test_a_crash_that_comes_back_before_the_next_checkpoint_moves_down_the_ladder(home):
    # The fault is the first preset's own (its file's), so the next preset runs clean.
    ladder(home, first_extra='inject = ["native-crash@4+"]\n')
    status, run = supervise()
    assert status == "finished"
    moves = of_type(run, "fallback")
    assert [(m["action"], m["to_preset"]) for m in moves] == [("retry-progress", "first"), ("next", "second")]
    assert "no checkpoint further" in moves[1]["why"]


def test_a_native_crash_with_no_ladder_is_retried_while_it_makes_progress_and_then_fails(home):
    user_preset(home, "devices", "alone", 'device = "cpu"\nthreads = 1\n')
    # A report every step, so the steps reached are exact, and a checkpoint every 4 steps.
    every4 = ["train.checkpoint_every_steps=4", "train.report_every_s=1e-9"]
    status, run = supervise("inject=['native-crash@6', 'native-crash@11']", *every4, device="alone")
    assert status == "finished"  # an empty ladder no longer ends a run that makes progress
    assert [m["action"] for m in of_type(run, "fallback")] == ["retry-progress", "retry-progress"]

    status, run = supervise("inject=['native-crash@7+']", *every4, device="alone")
    assert status == "failed"
    assert [m["action"] for m in of_type(run, "fallback")] == ["retry-progress"]
    assert "ladder is exhausted" in of_type(run, "run_failed")[0]["reason"]
    # steps 5-6 lost twice: the attempt that ended the run counts too
    assert of_type(run, "run_finished")[0]["summary"]["steps_lost"] == 4


def test_what_the_user_set_holds_across_the_ladder_unless_a_rule_changes_it(home):
    ladder(home)
    status, run = supervise("inject=['oom@3', 'backend@6']", "batch_size=16", "accumulation=2",
                            "grad_checkpointing=true")
    assert status == "finished"
    halve, move = of_type(run, "fallback")
    assert halve["changed"] == {"batch_size": [16, 8], "accumulation": [2, 4]}  # the rule's change wins
    # ...on the preset it was made for: the next one takes what the user set, and says so
    assert (move["action"], move["to_preset"]) == ("next", "second")
    assert move["changed"] == {"batch_size": [8, 16], "accumulation": [4, 2]}
    second = of_type(run, "trainer_ready")[2]
    assert (second["batch_size"], second["accumulation"], second["grad_checkpointing"]) == (16, 2, True)
    assert run.config().ladder["second"].batch_size == 16


def test_max_steps_holds_as_samples_across_a_fallback_to_half_the_batch(home):
    user_preset(home, "devices", "big", 'device = "cpu"\nbatch_size = 8\naccumulation = 4\nthreads = 1\n'
                'fallback = ["small"]\n')
    user_preset(home, "devices", "small", 'device = "cpu"\nbatch_size = 4\naccumulation = 4\nthreads = 1\n')
    own_batch = [o for o in FAST if not o.startswith(("batch_size", "accumulation"))]
    run = RunDir.create(runconfig.resolve("matmul", "big", own_batch + ["train.max_steps=6",
                                                                        "inject=['backend@3']"]))
    assert Supervisor(run, poll_s=0.05).supervise() == "finished"
    first, second = of_type(run, "trainer_ready")
    assert (first["total_steps"], first["total_samples"]) == (6, 6 * 32)
    # 2 steps of 32 done, 128 samples left in steps of 16
    assert (second["global_batch"], second["total_samples"], second["total_steps"]) == (16, 192, 2 + 8)
    assert of_type(run, "checkpoint")[-1]["samples_seen"] == 6 * 32

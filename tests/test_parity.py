"""The parity check: the device against the CPU in fp32 (engine.train.parity), the preset key
that runs it at the start of each attempt, its crash kind and rule, and `cockpit check`."""

from __future__ import annotations

import subprocess

import torch

from conftest import TINY, child_env, cockpit_cmd, user_preset
from engine import runconfig, vocabulary
from engine.run import crashes, fallback
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.run.supervisor import Supervisor
from engine.train import parity
from engine.train.trainer import Trainer

# A matmul whose readout starts non-zero would be nicer, but its scale gradient is zero at
# step 0 (readout starts at zero): the check must name a parameter whose gradient is not.
SMALL = TINY + ["params.n=64", "params.samples=256", "train.epochs=2"]


def trainer_for(*overrides: str, workload: str = "matmul") -> Trainer:
    base = SMALL if workload == "matmul" else ["threads=1", "batch_size=8", "accumulation=1"]
    run = RunDir.create(runconfig.resolve(workload, "cpu", base + list(overrides)))
    return Trainer(run, EventWriter(run.events_path, attempt=1), "cpu", run.config().device)


def of_type(run: RunDir, kind: str) -> list[dict]:
    return [e for e in run.events() if e["type"] == kind]


def test_the_cpu_against_itself_is_ok_and_the_check_trains_nothing(home):
    trainer = trainer_for()
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    result = parity.check(trainer)
    assert result.ok and result.verdict == "ok" and result.problems == []
    assert result.loss_rel == 0.0 and result.grad.rel == 0.0 and result.update.rel == 0.0
    assert result.loss > 0 and result.batch == parity.MAX_SAMPLES == 4
    # the run's weights and optimizer are as they were: nothing was trained
    assert all(torch.equal(weights[k], v) for k, v in trainer.model.state_dict().items())
    assert trainer.optimizer.state_dict()["state"] == {}
    assert all(p.grad is None for p in trainer.model.parameters())


def test_wrong_gradients_are_numerically_wrong_and_named(home):
    trainer = trainer_for(workload="twotower-small")
    result = parity.check(trainer, perturb=True)
    assert not result.ok and result.verdict == "numerically wrong"
    largest = max((p for p in trainer.model.parameters() if p.requires_grad), key=lambda p: p.numel())
    name = next(n for n, p in trainer.model.named_parameters() if p is largest)
    assert result.grad.name == name and result.grad.rel > 50   # a hundred times too big
    assert result.problems == [f"the gradient of {name} is off by {result.grad.rel:.3g} of its size "
                               f"(tolerance {parity.TOLERANCES['fp32'].grad:g})"]
    event = result.event()
    assert event["verdict"] == "numerically wrong" and event["worst_grad"]["name"] == name
    assert "computes wrong numbers" in event["message"]


def test_tolerances_follow_the_precision(home):
    """bf16 autocast on the CPU differs from fp32 by what its 8-bit mantissa costs: within the
    bf16 tolerances, beyond the fp32 ones (which would call every bf16 device wrong)."""
    assert set(parity.TOLERANCES) == {"fp32", "bf16", "fp16"}
    assert parity.TOLERANCES["fp32"].grad < parity.TOLERANCES["fp16"].grad < parity.TOLERANCES["bf16"].grad
    result = parity.check(trainer_for("precision=bf16", workload="twotower-small"))
    assert result.ok and result.tolerance == parity.TOLERANCES["bf16"]
    assert parity.TOLERANCES["fp32"].grad < result.grad.rel < parity.TOLERANCES["bf16"].grad
    # the optimizer is compared on the same gradients, so its tolerance is fp32's whatever the precision
    assert result.update.rel <= parity.TOLERANCES["fp32"].update


def test_a_model_with_its_own_bf16_forward_checks_ok_against_its_fp32_copy(home):
    """trm-chat-small's forward is bf16 on any preset; the reference is its fp32 copy, whose
    buffers (RoPE's tables) are fp32 too: the model must still compute in one dtype."""
    trainer = trainer_for("params.hidden_size=64", "params.num_heads=2", "params.L_layers=1",
                          "params.H_cycles=1", "params.L_cycles=1", "params.seq_len=32",
                          "params.corpus_bytes=20000", "params.forward_dtype=bf16", "precision=bf16",
                          workload="trm-tiny")
    result = parity.check(trainer)
    assert result.ok and result.tolerance == parity.TOLERANCES["bf16"]


def test_a_parity_failure_at_attempt_start_falls_back_to_the_next_preset(home):
    user_preset(home, "devices", "checked", 'device = "cpu"\nbatch_size = 8\naccumulation = 4\n'
                'threads = 1\nparity_check = true\nfallback = ["plain"]\n')
    user_preset(home, "devices", "plain", 'device = "cpu"\nbatch_size = 8\naccumulation = 4\n'
                'threads = 1\nparity_check = true\n')
    run = RunDir.create(runconfig.resolve("matmul", "checked", SMALL + ["inject=['wrong-grad@0']"]))
    assert Supervisor(run, poll_s=0.05).supervise() == "finished"
    (crash,) = of_type(run, "crash")
    assert crash["kind"] == "numerical-parity" and crash["attempt"] == 1
    assert "computed wrong numbers" in crash["sentence"]
    assert "readout" in crash["evidence"]["message"]  # the wrong parameter, named
    (move,) = of_type(run, "fallback")
    assert (move["action"], move["to_preset"]) == ("next", "plain")
    checks = of_type(run, "parity")
    assert [(c["attempt"], c["verdict"]) for c in checks] == [(1, "numerically wrong"), (2, "ok")]
    assert not [e for e in of_type(run, "step") if e["attempt"] == 1]  # nothing trained on it
    assert of_type(run, "run_finished")


def test_the_rule_and_the_classification():
    assert fallback.DEFAULT_RULES["numerical-parity"] == "next"
    assert "numerical-parity" in vocabulary.CRASH_KINDS
    verdict = crashes.classify(crashes.AttemptEnd(
        exit_code=vocabulary.EXIT_PARITY, signal=None, device="mps",
        tail="parity: mps in fp32 computes wrong numbers: the gradient of w is off by 99"))
    assert verdict.kind == "numerical-parity" and verdict.sentence.startswith("The MPS computed wrong")
    assert verdict.evidence["message"].endswith("off by 99")


def test_cockpit_check_says_ok_or_wrong_with_its_exit_code(home):
    # bf16 on the CPU: the CPU in fp32 is the reference itself
    base = ["check", "-w", "matmul", "-d", "cpu", "--set", "precision=bf16",
            *[a for o in SMALL for a in ("--set", o)]]
    ok = subprocess.run(cockpit_cmd(*base), capture_output=True, text=True, env=child_env(), timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "verdict: ok" in ok.stdout and "against the CPU in fp32" in ok.stdout
    wrong = subprocess.run(cockpit_cmd(*base, "--inject", "wrong-grad@0"), capture_output=True,
                           text=True, env=child_env(), timeout=120)
    assert wrong.returncode == 1, wrong.stderr
    assert "verdict: numerically wrong — the gradient of readout is off by" in wrong.stdout


def test_cockpit_check_refuses_a_command_workload_in_one_line(home):
    user_preset(home, "workloads", "mine", 'command = ["python", "train.py"]\n')
    done = subprocess.run(cockpit_cmd("check", "-w", "mine", "-d", "cpu"), capture_output=True,
                          text=True, env=child_env(), timeout=60)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "a parity check does not apply" in line and "'mine'" in line


def test_wrong_grad_is_refused_for_a_command(home):
    import pytest

    from engine.errors import ConfigError

    with pytest.raises(ConfigError, match="wrong-grad perturbs the gradients of cockpit's own trainer"):
        runconfig.resolve_command(["python", "-c", "pass"], "x", "cpu", ["inject=['wrong-grad@3']"])


def test_a_command_on_a_preset_that_asks_for_the_check_is_told_once_and_runs(home):
    user_preset(home, "devices", "checked", 'device = "cpu"\nparity_check = true\n')
    config = runconfig.resolve_command(["python", "-c", "print('trained')"], "script", "checked")
    run = RunDir.create(config)
    assert Supervisor(run, poll_s=0.05).supervise() == "finished"
    (warning,) = [w for w in of_type(run, "warning") if w["kind"] == "parity-not-applicable"]
    assert "does not apply to a command" in warning["message"] and not warning["fallback"]


def test_a_model_that_computes_in_bf16_itself_is_judged_by_bf16s_tolerances():
    """trm-chat-small casts its forward to bf16 on any preset (its forward_dtype): its fp32
    preset's gradients differ from the CPU's by bf16's error, which is not a wrong device."""
    from types import SimpleNamespace

    def fake(preset_precision, forward_dtype=None):
        params = SimpleNamespace(**({"forward_dtype": forward_dtype} if forward_dtype else {}))
        config = SimpleNamespace(workload=SimpleNamespace(params=params))
        return SimpleNamespace(run=SimpleNamespace(config=lambda: config),
                               resolved=SimpleNamespace(precision=preset_precision))

    assert parity.computed_in(fake("fp32", "bf16")) == "bf16"
    assert parity.computed_in(fake("fp32", "fp32")) == "fp32"
    assert parity.computed_in(fake("bf16")) == "bf16"     # a workload without the setting
    assert parity.computed_in(fake("fp16", "fp32")) == "fp16"


def test_cockpit_check_refuses_what_it_cannot_check_in_one_line(home):
    def check(*args):
        done = subprocess.run(cockpit_cmd("check", "-w", "matmul", *args), capture_output=True,
                              text=True, env=child_env(), timeout=60)
        return done.returncode, done.stderr.strip().splitlines()

    code, lines = check("-d", "cpu")
    assert code == 2 and len(lines) == 1 and "the check's reference itself: nothing to compare" in lines[0]
    code, lines = check("-d", "cpu", "--set", "precision=bf16", "--inject", "nan@0")
    assert code == 2 and lines == ["cockpit: --inject: got 'nan@0'; the check trains no step, expected wrong-grad@0"]
    code, lines = check("-d", "cpu", "--set", "precision=bf16", "--inject", "bogus@0")
    assert code == 2 and len(lines) == 1 and "'bogus@0' is not a fault; expected KIND@STEP" in lines[0]
    code, lines = check("-d", "mps")   # no Mac here: the worker's refusal, under the user's preset name
    # after the progress line ("checking ..."), one line of refusal
    assert code == 2 and len(lines) == 2 and lines[-1].startswith("cockpit: device preset 'mps': ")
    assert "'probe'" not in lines[-1] and "not available" in lines[-1]


def test_a_device_that_hangs_in_the_check_is_stopped_and_said(home):
    done = subprocess.run(cockpit_cmd("check", "-w", "matmul", "-d", "cpu", "--set", "precision=bf16",
                                      "--set", "inject=['hang@0']", "--set", "hang_timeout_s=3",
                                      *[a for o in SMALL for a in ("--set", o)]),
                          capture_output=True, text=True, env=child_env(), timeout=120)
    assert done.returncode == 3, done.stderr
    assert "the worker said nothing for" in done.stderr and "a hang" in done.stderr

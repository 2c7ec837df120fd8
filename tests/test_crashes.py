"""Classification from evidence alone, and the fallback rules, as pure functions."""

from __future__ import annotations

import pytest

from engine import vocabulary
from engine.train import faults
from engine.run.crashes import COMMAND, AttemptEnd, classify
from engine.run.fallback import Ladder, Rung, decide, got_further
from engine.preset_types import DevicePreset


DYNAMO_WARNING = ("W1124 torch/_dynamo/convert_frame.py:1200] WON'T CONVERT forward model.py line 40\n"
                  "W1124 torch/_dynamo/convert_frame.py:1200] due to: backend='inductor' raised:\n"
                  "W1124 torch/_dynamo/convert_frame.py:1200] torch._dynamo.exc.Unsupported: generator\n")


@pytest.mark.parametrize("end, kind", [
    (AttemptEnd(0, None), "finished"),
    (AttemptEnd(3, None), "stopped"),
    (AttemptEnd(None, "SIGTERM", stop_requested=True), "stopped"),
    (AttemptEnd(2, None, tail="device preset 'x': device: 'mps' is not available"), "config"),
    (AttemptEnd(1, None, exception={"error": "RuntimeError", "message": faults.MPS_OOM}), "oom"),
    (AttemptEnd(1, None, exception={"error": "OutOfMemoryError", "message": faults.CUDA_OOM}), "oom"),
    (AttemptEnd(1, None, exception={"error": "RuntimeError", "message": faults.CPU_OOM}), "oom"),
    (AttemptEnd(None, "SIGKILL", memory_percent=97.0), "oom"),
    (AttemptEnd(None, "SIGKILL", memory_percent=41.0), "killed"),
    (AttemptEnd(1, None, exception={"error": "RuntimeError",
                                    "message": "Placeholder storage has not been allocated on MPS device!"}), "backend"),
    (AttemptEnd(1, None, exception={"error": "NotImplementedError", "message":
                                    "The operator 'aten::_ctc_loss' is not currently implemented for "
                                    "the MPS device."}), "backend"),
    (AttemptEnd(None, "SIGABRT", tail=faults.METAL_ERROR), "backend"),
    (AttemptEnd(1, None, exception={"error": "RuntimeError", "message": faults.CUDA_ERROR}), "backend"),
    (AttemptEnd(None, "SIGABRT", tail=faults.OMP_ERROR), "openmp"),
    (AttemptEnd(None, "SIGABRT"), "native-crash"),
    (AttemptEnd(None, "SIGSEGV", tail="Fatal Python error: Segmentation fault\n\nCurrent thread "
                                      "(most recent call first):\n  File \"x.py\", line 3"), "native-crash"),
    (AttemptEnd(None, "SIGBUS"), "native-crash"),
    (AttemptEnd(4, None, numerical={"step": 30, "message": "loss nan at step 30"}), "numerical"),
    (AttemptEnd(None, "SIGKILL", hung_for_s=312.0), "hang"),
    (AttemptEnd(1, None, exception={"error": "KeyError", "message": "'label'"}), "user-code"),
    (AttemptEnd(1, None, tail="Traceback (most recent call last):\n  File ...\nImportError: x"), "user-code"),
    (AttemptEnd(7, None), "unknown"),
    (AttemptEnd(1, None, exception={"error": "BackendCompilerFailed", "message": faults.COMPILE_ERROR}), "compile"),
    (AttemptEnd(1, None, exception={"error": "InductorError", "message": "CppCompileError: C++ compile error"}), "compile"),
    (AttemptEnd(1, None, tail="Traceback (most recent call last):\n  File ...\ntorch._dynamo.exc."
                              "Unsupported: generator\n"), "compile"),
    (AttemptEnd(1, None, exception={"error": "TritonMissing", "message": "Cannot find a working triton"}), "compile"),
    (AttemptEnd(None, "SIGKILL", compiling_hung_for_s=612.0), "compile"),
    # an out-of-memory raised while compiling is an out-of-memory
    (AttemptEnd(1, None, exception={"error": "BackendCompilerFailed",
                                    "message": "backend='inductor' raised:\n" + faults.CUDA_OOM}), "oom"),
    # Dynamo's warnings on the way (it carries on eagerly) are not what ended the attempt
    (AttemptEnd(None, "SIGKILL", memory_percent=99.0, tail=DYNAMO_WARNING), "oom"),
    (AttemptEnd(None, "SIGTERM", tail=DYNAMO_WARNING), "killed"),
    (AttemptEnd(1, None, tail=DYNAMO_WARNING + "Traceback (most recent call last):\n  File ...\n"
                              "KeyError: 'label'\n"), "user-code"),
    # a command compiles as its own code says: its compile errors are its own
    (AttemptEnd(1, None, subject=COMMAND, tail="Traceback (most recent call last):\n  File ...\n"
                "torch._dynamo.exc.TorchRuntimeError: RuntimeError when making fake tensor call\n"), "user-code"),
])
def test_classification(end, kind):
    verdict = classify(end)
    assert verdict.kind == kind
    assert verdict.sentence.endswith(".") and "{" not in verdict.sentence


def test_evidence_names_the_message_signal_and_step():
    verdict = classify(AttemptEnd(None, "SIGABRT", tail=faults.OMP_ERROR, last_step=117))
    assert verdict.evidence["message"].startswith("OMP: Error #15")
    assert verdict.evidence["signal"] == "SIGABRT" and verdict.evidence["last_step"] == 117
    crash = classify(AttemptEnd(None, "SIGABRT", last_step=927, device="mps"))
    assert crash.sentence == ("The trainer died from SIGABRT after step 927 without a Python traceback: "
                              "a native crash, as Metal/MPS aborts are.")


@pytest.mark.parametrize("device", ["cpu", "cuda:0", None])
def test_the_native_crash_sentence_names_metal_only_on_mps(device):
    sentence = classify(AttemptEnd(None, "SIGSEGV", device=device)).sentence
    assert "Metal" not in sentence and "a native crash in torch" in sentence
    assert ("CUDA" in sentence) == (device == "cuda:0")


TORN = "PytorchStreamReader failed reading zip archive: failed finding central directory"
UNPICKLING = ("Traceback (most recent call last):\n  File \"train.py\", line 9\n"
              "_pickle.UnpicklingError: invalid load key, '\\x00'.")


@pytest.mark.parametrize("end", [
    AttemptEnd(1, None, exception={"error": "Unreadable", "message": "runs/x/checkpoints/step-5.pt: "
                                   "is not a whole checkpoint"}),
    # A command given a checkpoint to resume from, failing to load before its first step.
    AttemptEnd(1, None, subject=COMMAND, resumed_from="out/ckpt-4.pt",
               tail=f"Traceback (most recent call last):\nRuntimeError: {TORN}"),
    AttemptEnd(1, None, subject=COMMAND, resumed_from="out/ckpt-4.pt", tail=UNPICKLING),
])
def test_a_checkpoint_that_cannot_be_loaded_is_never_user_code(end):
    verdict = classify(end)
    assert verdict.kind == "checkpoint" and "not a bug" in verdict.sentence


@pytest.mark.parametrize("end", [
    # The trainer's own load errors are engine.record.checkpoint.Unreadable; any other is the
    # workload's (its data, its pretrained weights).
    AttemptEnd(1, None, exception={"error": "RuntimeError", "message": TORN}),
    # A command that was not resuming, or that trained past the load: its own file.
    AttemptEnd(1, None, subject=COMMAND, tail=UNPICKLING),
    AttemptEnd(1, None, subject=COMMAND, resumed_from="out/ckpt-4.pt", last_step=12, tail=UNPICKLING),
])
def test_the_same_load_errors_about_the_users_own_files_are_user_code(end):
    assert classify(end).kind == "user-code"


MPS = DevicePreset(device="mps", batch_size=32, accumulation=16, fallback=("mps-safe", "cpu"))
SAFE = DevicePreset(device="mps", batch_size=24, accumulation=4, empty_cache="before-mining",
                    fallback=("cpu",))
CPU = DevicePreset(device="cpu", batch_size=8, accumulation=64)
LADDER = Ladder(Rung("mps", MPS), {"mps-safe": SAFE, "cpu": CPU})


def verdict(kind: str):
    ends = {"oom": AttemptEnd(None, "SIGKILL", memory_percent=99.0),
            "native-crash": AttemptEnd(None, "SIGABRT"),
            "openmp": AttemptEnd(None, "SIGABRT", tail=faults.OMP_ERROR),
            "numerical": AttemptEnd(4, None)}
    return classify(ends[kind])


def test_oom_halves_the_micro_batch_then_moves_down_the_ladder():
    d = decide(verdict("oom"), Rung("mps", MPS), LADDER, attempts=1, max_attempts=9)
    assert (d.action, d.next.name, d.changed) == \
        ("halve-batch", "mps", {"batch_size": [32, 16], "accumulation": [16, 32]})
    assert d.next.preset.effective_batch == MPS.effective_batch
    tiny = Rung("mps", DevicePreset(device="mps", batch_size=1, accumulation=512, fallback=MPS.fallback))
    d = decide(verdict("oom"), tiny, LADDER, attempts=2, max_attempts=9)
    assert (d.action, d.next.name) == ("next", "mps-safe") and "already 1" in d.why


def test_next_follows_the_starting_presets_ladder_and_ends():
    d = decide(verdict("native-crash"), Rung("mps-safe", SAFE), LADDER, attempts=2, max_attempts=9)
    assert (d.action, d.next.name) == ("next", "cpu")
    d = decide(verdict("native-crash"), Rung("cpu", CPU), LADDER, attempts=3, max_attempts=9)
    assert d.next is None and "ladder is exhausted" in d.why


def test_openmp_retries_with_the_env_fix_once():
    d = decide(verdict("openmp"), Rung("mps", MPS), LADDER, attempts=1, max_attempts=9)
    assert d.action == "retry-env" and d.next.preset.env == {"KMP_DUPLICATE_LIB_OK": "TRUE"}
    d = decide(verdict("openmp"), d.next, LADDER, attempts=2, max_attempts=9)
    assert (d.action, d.next.name) == ("next", "mps-safe")


def test_a_failed_compile_runs_the_same_preset_eagerly_then_moves_on():
    end = AttemptEnd(1, None, exception={"error": "BackendCompilerFailed", "message": faults.COMPILE_ERROR},
                     last_step=None)
    v = classify(end)
    assert v.kind == "compile" and "Cannot find a working triton installation" in v.evidence["message"]
    assert v.sentence == "torch.compile failed (BackendCompilerFailed)."
    compiled = Rung("cuda", DevicePreset(device="cuda", compile=True, fallback=("cpu",)))
    ladder = Ladder(compiled, {"cpu": CPU})
    d = decide(v, compiled, ladder, attempts=1, max_attempts=9)
    assert (d.action, d.next.name, d.changed) == ("eager", "cuda", {"compile": [True, False]})
    d = decide(v, d.next, ladder, attempts=2, max_attempts=9)
    assert (d.action, d.next.name) == ("next", "cpu") and "already ran eagerly" in d.why
    # a command compiles as its own code says: nothing of the preset can change that
    d = decide(v, compiled, ladder, attempts=1, max_attempts=9, fixed=frozenset({"compile"}))
    assert (d.action, d.next.name) == ("next", "cpu")


def test_a_plain_bug_is_still_user_code_and_stops():
    v = classify(AttemptEnd(1, None, exception={"error": "ValueError", "message": "too many values to unpack"}))
    assert v.kind == "user-code"
    assert decide(v, Rung("cpu", CPU), Ladder(Rung("cpu", CPU), {}), attempts=1, max_attempts=9).action == "stop"


def test_numerical_goes_to_fp32_unless_it_already_ran_in_fp32():
    bf16 = Rung("mps", DevicePreset(device="mps", precision="bf16", fallback=MPS.fallback))
    d = decide(verdict("numerical"), bf16, LADDER, attempts=1, max_attempts=9, precision_used="bf16")
    assert d.action == "fp32" and d.changed == {"precision": ["bf16", "fp32"]}
    d = decide(verdict("numerical"), Rung("mps", MPS), LADDER, attempts=1, max_attempts=9,
               precision_used="fp32")
    assert (d.action, d.next.name) == ("next", "mps-safe")


def test_max_attempts_stops_the_run():
    d = decide(verdict("native-crash"), Rung("mps", MPS), LADDER, attempts=3, max_attempts=3)
    assert d.next is None and "max_attempts" in d.why


def test_a_native_crash_is_retried_while_each_attempt_gets_a_checkpoint_further():
    # note 001: Metal aborts at random points (batch 927, then 117)
    d = decide(verdict("native-crash"), Rung("mps", MPS), LADDER, attempts=1, max_attempts=9, progressed=True)
    assert (d.action, d.next.name, d.changed) == ("retry-progress", "mps", {})
    d = decide(verdict("native-crash"), Rung("mps", MPS), LADDER, attempts=2, max_attempts=9, progressed=False)
    assert (d.action, d.next.name) == ("next", "mps-safe") and "no checkpoint further" in d.why


def test_retries_keep_an_attempt_for_each_preset_below():
    # 5 attempts, two presets below mps: mps gets three of them, then the ladder
    d = decide(verdict("native-crash"), Rung("mps", MPS), LADDER, attempts=2, max_attempts=5, progressed=True)
    assert d.action == "retry-progress"
    d = decide(verdict("native-crash"), Rung("mps", MPS), LADDER, attempts=3, max_attempts=5, progressed=True)
    assert (d.action, d.next.name) == ("next", "mps-safe") and "kept for the presets below" in d.why


def test_a_native_crash_on_the_last_preset_is_retried_while_it_makes_progress():
    d = decide(verdict("native-crash"), Rung("cpu", CPU), LADDER, attempts=3, max_attempts=5, progressed=True)
    assert (d.action, d.next.name) == ("retry-progress", "cpu")
    d = decide(verdict("native-crash"), Rung("cpu", CPU), LADDER, attempts=4, max_attempts=5, progressed=False)
    assert d.next is None and "ladder is exhausted" in d.why
    d = decide(verdict("native-crash"), Rung("cpu", CPU), LADDER, attempts=5, max_attempts=5, progressed=True)
    assert d.next is None and "max_attempts" in d.why


def test_progress_is_a_checkpoint_further_than_the_attempt_started_from():
    at = lambda step, path="c": {"step": step, "path": path}  # noqa: E731
    assert got_further(None, at(3)) and got_further(at(3), at(4))
    assert not got_further(None, None) and not got_further(at(4), at(4)) and not got_further(at(4), None)
    assert got_further(at(None, "a.pt"), at(None, "b.pt")) and not got_further(at(None, "a.pt"), at(None, "a.pt"))


def test_a_presets_own_rules_override_the_defaults():
    retry = DevicePreset(device="mps", rules={"native-crash": "retry", "oom": "stop"}, fallback=("cpu",))
    d = decide(verdict("native-crash"), Rung("mps", retry), LADDER, attempts=1, max_attempts=9)
    assert (d.action, d.next.name, d.changed) == ("retry", "mps", {})
    d = decide(verdict("oom"), Rung("mps", retry), LADDER, attempts=1, max_attempts=9)
    assert d.next is None


@pytest.mark.parametrize("spec", ["oom", "oom@", "explode@3", "oom@-1", "oom@3x"])
def test_bad_fault_specs(spec):
    with pytest.raises(ValueError, match="expected KIND@STEP"):
        vocabulary.parse(spec)


def test_fault_specs():
    assert vocabulary.parse("native-crash@117") == vocabulary.Fault("native-crash", 117, False, "native-crash@117")
    assert vocabulary.parse("oom@120+").repeat


def test_every_trainer_is_starting_up_until_its_first_step():
    """torch.compile compiles in the first step (85 s for trm-chat-small on the H100), and an
    eager first step of 8 x 64 on a slow CPU takes minutes: a hang is judged by the start-up
    timeout until that step, not by hang_timeout_s, compiling or not; only a compiling trainer's
    hang then is the compile's."""
    from engine.run.watch import AttemptWatch

    eager, compiling = AttemptWatch(attempt=1), AttemptWatch(attempt=1)
    eager.see({"type": "trainer_ready", "compile": False}, 1.0)
    compiling.see({"type": "trainer_ready", "compile": True}, 1.0)
    assert not eager.ready and not compiling.ready
    assert compiling.compiling and not eager.compiling  # a hang now is the compile's (kind compile)
    for watch in (eager, compiling):
        watch.see({"type": "heartbeat", "rank": 0, "step": 0, "micro_batches": 12, "of": 64}, 60.0)
        assert not watch.ready  # a group under way is a sign of life, not the first step
        watch.see({"type": "step", "step": 1}, 90.0)
        assert watch.ready and watch.last_step == 1 and not watch.compiling


# Lightning's Rich traceback as a terminal-less Rich still colours it (FORCE_COLOR, a CI runner):
# bold red exception names, a hyperlink to the file, a box around it.
RICH_TAIL = ("\x1b[31m╭─\x1b[0m\x1b[31m──── \x1b[0m\x1b[1;31mTraceback \x1b[0m\x1b[1;2;31m(most recent call last)"
             "\x1b[0m\x1b[31m ────\x1b[0m\x1b[31m─╮\x1b[0m\n"
             "\x1b[31m│\x1b[0m \x1b]8;id=1;file:///home/u/train.py\x1b\\\x1b[33mtrain.py\x1b[0m\x1b]8;;\x1b\\:\x1b[94m42\x1b[0m"
             " in \x1b[92mtraining_step\x1b[0m \x1b[31m│\x1b[0m\n"
             "\x1b[1;91mRuntimeError: \x1b[0mexpected scalar type Float but found Half\n")


def test_a_crash_excerpt_carries_no_terminal_escapes():
    verdict = classify(AttemptEnd(exit_code=1, signal=None, tail=RICH_TAIL, subject=COMMAND, last_step=130))
    assert verdict.kind == "user-code"
    assert verdict.evidence["message"] == "RuntimeError: expected scalar type Float but found Half"
    assert "\x1b" not in verdict.sentence and "RuntimeError" in verdict.sentence


def test_the_log_tail_read_as_evidence_drops_escapes_but_the_log_keeps_them(tmp_path):
    from engine.record.attempt_log import LogLines, log_tail

    log = tmp_path / "attempt-1.log"
    log.write_text("step 130 loss 0.5\n" + RICH_TAIL)
    tail = log_tail(log)
    assert "\x1b" not in tail and "]8;" not in tail
    assert "train.py:42 in training_step" in tail
    assert "\x1b[1;91m" in log.read_text()   # on disk, as the script wrote it
    lines, _ = LogLines(log).read()          # the log view, as a terminal showed it
    assert lines[-1] == "RuntimeError: expected scalar type Float but found Half"
    assert not any("\x1b" in line or "]8;" in line for line in lines)


def test_a_commands_native_crash_on_the_cpu_does_not_blame_torch():
    """A command need not be torch (mlx-lm is MLX): its crash is in a native library it loaded."""
    sentence = classify(AttemptEnd(None, "SIGABRT", device="cpu", subject=COMMAND)).sentence
    assert "torch" not in sentence and "a native crash in a native library it loaded" in sentence


# torchrun's report as a killed rank 1 left it, its peer's broken collective seen exit first
# (the trainer's end is quick: rank 0's exit 1 reached the agent before rank 1's SIGKILL)
TORCHRUN_REPORT = """\
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:4242: Connection reset by peer.
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
engine.train.trainer FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-29_22:46:57
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 22028)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 22028
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_22:46:57
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 22027)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_a_rank_a_signal_ended_is_the_root_cause_wherever_torchrun_lists_it():
    from engine.run.crashes import torchrun_root_cause

    assert torchrun_root_cause(TORCHRUN_REPORT) == (1, -9)
    # with no rank ended by a signal, torchrun's first observed failure
    exited = TORCHRUN_REPORT.replace("-9 (pid: 22028)  (SIGKILL)", "1 (pid: 22028)")
    assert torchrun_root_cause(exited) == (0, 1)
    assert torchrun_root_cause("Traceback (most recent call last):\nValueError: x\n") is None

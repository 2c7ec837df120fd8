"""examples/hf and examples/lightning end to end through `cockpit run`: steps with loss and lr,
evaluations and the framework's own checkpoints as events; an injected native crash resumes
from the framework's last checkpoint on the next preset, where the framework's global step
continues from the checkpoint's; without the callback the Trainer's output is read instead;
and each script runs alone, outside cockpit, unchanged."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, child_env, cockpit_cmd, user_preset
from engine import command, runconfig
from engine.record.rundir import list_runs

pytest.importorskip("transformers")
pytest.importorskip("lightning")

PY = sys.executable
HF = str(ROOT / "examples" / "hf" / "train_lm.py")
LIGHTNING = str(ROOT / "examples" / "lightning" / "train.py")
# Text that does not change as the project's own files do (the examples learn the README by
# default, which every session edits): the standard library's os module.
TEXT = os.__file__
# The tiny LM: a 32-wide, one-layer Llama over 32-byte blocks.
HF_SMALL = ["--text_file", TEXT, "--block_size", "32", "--hidden", "32", "--layers", "1",
            "--heads", "2", "--learning_rate", "1e-3"]


def cockpit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(cockpit_cmd(*args), capture_output=True, text=True, env=child_env(),
                          timeout=600)


def ladder(home: Path) -> None:
    """'first' (batch 8) falls back to 'second' (batch 4 x 2: the same samples per step)."""
    user_preset(home, "devices", "first", 'device = "cpu"\nbatch_size = 8\naccumulation = 1\n'
                                          'threads = 1\nfallback = ["second"]\n')
    user_preset(home, "devices", "second", 'device = "cpu"\nbatch_size = 4\naccumulation = 2\n'
                                           'threads = 1\n')


def by_type(run, kind: str, attempt: int | None = None) -> list[dict]:
    return [e for e in run.events()
            if e["type"] == kind and (attempt is None or e.get("attempt") == attempt)]


def check_fallback_resumed_at_the_checkpoint(done, run, batch_flags: list[str], resume_flag: str):
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (crash,) = by_type(run, "crash")
    assert crash["kind"] == "native-crash"
    (move,) = by_type(run, "fallback")
    assert move["to_preset"] == "second"
    at = command.step_in_name(move["resume"]["path"])
    assert at and at == move["resume"]["step"]
    second = by_type(run, "attempt_started")[1]["command"]
    assert " ".join(batch_flags) in " ".join(second)
    assert second[-2:] == [resume_flag, move["resume"]["path"]]
    # The framework's own global step after resuming is the checkpoint's: the first step
    # its callback reports in the new attempt is the one after it.
    assert min(e["step"] for e in by_type(run, "progress", attempt=2)) == at + 1
    for attempt in (1, 2):
        steps = by_type(run, "step", attempt)
        assert steps and all(e["source"] == "report" for e in steps)
        # each attempt reported its loss and lr; whether one of attempt 1's few windows (it dies
        # at its 50th step) ends after such a report is the machine's timing, so the windows
        # are asked over the run
        assert any(e["loss"] is not None and e["metrics"].get("lr") for e in by_type(run, "progress", attempt))
    assert any(e["loss"] is not None and e["lr"] for e in by_type(run, "step"))
    assert by_type(run, "eval") and by_type(run, "eval", 2)
    reported = [e for e in by_type(run, "checkpoint") if e.get("source") == "report"]
    assert all(Path(e["path"]).exists() and command.step_in_name(e["path"]) == e["step"]
               for e in reported)
    assert {e["attempt"] for e in reported} == {1, 2}


def test_hf_example_falls_back_and_resumes_from_the_trainers_checkpoint(home):
    ladder(home)
    # The callback's first report at or after step 25 aborts the script (cockpit.report), the
    # supervisor's SIGABRT at the step it reads from the bar otherwise; checkpoints every 10
    # steps, evaluations every 20, the run 60 steps long.
    done = cockpit("run", "-d", "first", "--inject", "native-crash@25",
                   "--set", "rules={native-crash='next'}",
                   "--set", "command.resume=['--resume_from_checkpoint', '{checkpoint}']",
                   "--", PY, HF, "--output_dir", "{run_dir}/out",
                   "--per_device_train_batch_size", "{batch_size}",
                   "--gradient_accumulation_steps", "{accumulation}",
                   "{hf_precision_flag}", "{hf_device_flag}", "--max_steps", "60",
                   "--logging_steps", "5", "--eval_strategy", "steps", "--eval_steps", "20",
                   "--save_steps", "10", *HF_SMALL)
    (run,) = list_runs()
    check_fallback_resumed_at_the_checkpoint(
        done, run, ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2",
                    "--use_cpu"], "--resume_from_checkpoint")
    steps = by_type(run, "step")
    assert steps[-1]["step"] == 60 and steps[-1]["total"] == 60
    assert steps[-1]["samples_seen"] == 60 * 8  # global step x batch x accumulation
    losses = [e["loss"] for e in steps if e["loss"] is not None]
    assert losses[-1] < losses[0]
    assert "eval_loss" in by_type(run, "eval")[-1]["metrics"]


def test_lightning_example_falls_back_and_resumes_from_its_checkpoint(home):
    ladder(home)
    # The callback aborts the script at its first report at or after step 50 (at a logging
    # step: 50 itself), with the checkpoint of step 40 behind it.
    done = cockpit("run", "-d", "first", "--inject", "native-crash@50",
                   "--set", "rules={native-crash='next'}",
                   "--set", "command.resume=['--ckpt_path', '{checkpoint}']",
                   "--", PY, LIGHTNING, "--text_file", TEXT, "--out", "{run_dir}/out",
                   "--accelerator", "{device}",
                   "--precision", "{lightning_precision}", "--batch_size", "{batch_size}",
                   "--accumulate", "{accumulation}", "--max_steps", "400", "--ckpt_every", "40",
                   "--val_every", "80")
    (run,) = list_runs()
    check_fallback_resumed_at_the_checkpoint(
        done, run, ["--precision", "32-true", "--batch_size", "4", "--accumulate", "2"],
        "--ckpt_path")
    steps = by_type(run, "step")
    assert steps[-1]["step"] == 400 and steps[-1]["total"] == 400
    evals = [e["metrics"]["val_loss"] for e in by_type(run, "eval")]
    assert evals[-1] < evals[0]


def test_without_the_callback_the_trainers_output_is_read(home):
    """Nothing added to the script: steps from its bar, loss and lr from its log lines,
    evaluations from its eval dicts, checkpoints from the `checkpoints` glob."""
    done = cockpit("run", "-d", "cpu", "--set", "accumulation=1", "--set", "threads=1", "--json",
                   "--set", "command.checkpoints={run_dir}/out/checkpoint-*",
                   "--", PY, HF, "--no_callback", "--output_dir", "{run_dir}/out",
                   "--per_device_train_batch_size", "{batch_size}",
                   "--gradient_accumulation_steps", "{accumulation}", "{hf_device_flag}",
                   "--max_steps", "40", "--logging_steps", "5", "--eval_strategy", "steps",
                   "--eval_steps", "20", "--save_steps", "20", *HF_SMALL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = list_runs()
    assert not by_type(run, "progress")  # nothing reported from inside
    steps = by_type(run, "step")
    assert steps[-1]["step"] == 40 and steps[-1]["total"] == 40
    assert {e["source"] for e in steps} <= {"tqdm", "hf"}
    assert any(e["loss"] is not None and e["lr"] for e in steps)
    assert [e["step"] for e in by_type(run, "eval")][:1] == [20]
    assert set(by_type(run, "eval")[0]["metrics"]) == {"eval_loss"}  # not the Trainer's timings
    assert (run.path / "out" / "checkpoint-40").is_dir()


def test_without_the_callback_lightnings_rich_bar_is_read(home):
    """Lightning draws a Rich bar where rich is installed (it is, beside textual): to a file
    only its last frame, unless told it may draw (cockpit does, for every command)."""
    pytest.importorskip("rich")
    done = cockpit("run", "-d", "cpu", "--set", "accumulation=1", "--set", "threads=1", "--json",
                   "--", PY, LIGHTNING, "--no_callback", "--text_file", TEXT,
                   "--out", "{run_dir}/out",
                   "--batch_size", "{batch_size}", "--max_steps", "100", "--ckpt_every", "50",
                   "--val_every", "50")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = list_runs()
    steps = by_type(run, "step")
    assert {e["source"] for e in steps} == {"rich"} and steps[-1]["step"] == 100
    assert steps[-1]["loss"] is not None and steps[-1]["epoch"] > 0


def test_hf_example_trains_lora_adapters_under_cockpit(home):
    done = cockpit("run", "-d", "cpu", "--set", "accumulation=1", "--set", "threads=1",
                   "--", PY, HF, "--lora", "--text_file", TEXT,
                   "--output_dir", "{run_dir}/out",
                   "--per_device_train_batch_size", "{batch_size}", "{hf_device_flag}",
                   "--max_steps", "30", "--logging_steps", "5", "--save_steps", "30",
                   "--block_size", "32", "--hidden", "32", "--layers", "1", "--heads", "2",
                   "--learning_rate", "1e-2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = list_runs()
    # every logged loss as the callback reported it (step events are a second's windows)
    losses = [e["loss"] for e in by_type(run, "progress") if e["loss"] is not None]
    assert len(losses) == 6 and losses[-1] < losses[0]
    (checkpoint,) = [e for e in by_type(run, "checkpoint") if e["step"] == 30]
    assert (Path(checkpoint["path"]) / "adapter_model.safetensors").is_file()  # adapters only


@pytest.mark.parametrize("script, args", [
    (HF, ["--output_dir", "{out}", "--max_steps", "10", "--use_cpu", "--save_steps", "5",
          *HF_SMALL]),
    (LIGHTNING, ["--text_file", TEXT, "--out", "{out}", "--max_steps", "20",
                 "--ckpt_every", "10", "--val_every", "10"]),
])
def test_the_examples_run_alone_unchanged(tmp_path, script, args):
    env = {k: v for k, v in child_env().items() if not k.startswith("COCKPIT_")}
    env["OMP_NUM_THREADS"] = "1"  # as the runs under cockpit: a tiny model, a busy machine
    out = tmp_path / "out"
    done = subprocess.run([PY, script, *(a.format(out=out) for a in args)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^done: step (10|20) ", done.stdout, re.M)
    assert any(out.rglob("*checkpoint*")) or any(out.rglob("*.ckpt"))


@pytest.mark.parametrize("name", ["hf-tiny-lm", "lightning-bytes"])
def test_the_example_presets_fill_the_frameworks_flags(monkeypatch, name):
    monkeypatch.setenv("COCKPIT_CONFIG_DIR", str(ROOT / "examples"))
    config = runconfig.resolve(name, "cpu")
    spec = config.workload.params
    values = command.values(config.device, Path("/runs/r"), 1)
    argv = command.fill(spec.command, values)
    assert str(config.device.batch_size) in argv and "{" not in " ".join(argv)
    assert spec.resume and command.fill(spec.resume, {**values, "checkpoint": "/c"})[-1] == "/c"

"""The framework callbacks (cockpit.integrations) and the placeholders that map a device preset
onto the frameworks' flags, checked in this process against the real libraries: what each
callback reports under cockpit, that it reports nothing outside it, and the one line a user
reads when the framework is missing. The examples run end to end through `cockpit run` in
test_integration_examples.py."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import ROOT, child_env
from cockpit import report
from engine import command
from engine.record import reached
from engine.preset_types import DevicePreset

pytest.importorskip("transformers")
pytest.importorskip("lightning")

# Text that does not change as the project's own files do: the standard library's os module.
TEXT = Path(os.__file__).read_bytes()[:20_000]


@pytest.fixture(autouse=True)
def one_thread():
    """The trainers here train in this process on tiny models: one torch thread, so that on a
    machine whose cores are taken a step does not wait on threads that wait on each other."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def events_file(tmp_path, monkeypatch):
    """What a script sees under cockpit: COCKPIT_EVENTS set, cockpit.report active."""
    path = tmp_path / "events.jsonl"
    for var in ("COCKPIT_INJECT", "RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COCKPIT_EVENTS", str(path))
    monkeypatch.setenv("COCKPIT_ATTEMPT", "1")
    monkeypatch.setenv("COCKPIT_REACHED", str(reached.path_of(tmp_path, 1)))
    report._reset()
    yield path
    monkeypatch.undo()
    report._reset()


def read(path: Path) -> dict[str, list[dict]]:
    by_type: dict[str, list[dict]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            event = json.loads(line)
            by_type.setdefault(event["type"], []).append(event)
    return by_type


def example(relative: str):
    spec = importlib.util.spec_from_file_location(Path(relative).stem, ROOT / "examples" / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- Hugging Face Trainer


def hf_trainer(out: Path, callbacks: list, **limits):
    from transformers import Trainer, TrainingArguments

    lm = example("hf/train_lm.py")
    script = lm.ScriptArguments(block_size=32, hidden=32, layers=1, heads=2)
    limits = {"max_steps": 12, **limits}
    args = TrainingArguments(output_dir=str(out), **limits, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, logging_steps=4, eval_strategy="steps",
                             eval_steps=8, save_steps=8, learning_rate=1e-3, use_cpu=True,
                             disable_tqdm=True, report_to="none")
    return Trainer(model=lm.build_model(script), args=args, train_dataset=lm.Blocks(TEXT, 32),
                   eval_dataset=lm.Blocks(TEXT[:2048], 32), callbacks=callbacks)


def test_hf_callback_reports_steps_evals_and_checkpoints(events_file, tmp_path):
    from cockpit.integrations.transformers import CockpitCallback

    hf_trainer(tmp_path / "out", [CockpitCallback()]).train()
    got = read(events_file)
    progress = got["progress"]
    assert progress[-1]["step"] == 12 and {e["total"] for e in progress} == {12}
    # samples = global step x per-device batch x accumulation x world size
    assert all(e["samples"] == e["step"] * 4 * 2 for e in progress)
    logged = [e for e in progress if e["loss"] is not None]
    assert [e["step"] for e in logged] == [4, 8, 12]  # the Trainer's logging steps
    assert all(e["metrics"]["lr"] > 0 and "grad_norm" in e["metrics"] and e["metrics"]["epoch"] > 0
               for e in logged)
    assert logged[-1]["loss"] < logged[0]["loss"]
    evals = got["eval"]  # eval_steps, and the Trainer's evaluation at the last step
    assert [e["step"] for e in evals] == [8, 12]
    assert all(set(e["metrics"]) == {"eval_loss"} for e in evals)  # its timings left out
    checkpoints = {e["step"]: Path(e["path"]) for e in got["checkpoint"]}
    assert 8 in checkpoints and checkpoints[8].name == "checkpoint-8"
    assert all(p.is_dir() and command.step_in_name(p) == s for s, p in checkpoints.items())


def test_hf_callback_says_how_long_each_save_held_training_up(events_file, tmp_path, monkeypatch):
    """From the hook before the save (the step's end, its log, its evaluation) to on_save: the
    save's own time, never the evaluation's before it. A clock that moves only in the save (7 s)
    and the evaluation (100 s) says exactly which was counted."""
    import transformers

    from cockpit.integrations import transformers as integration

    now = [0.0]
    monkeypatch.setattr(integration, "time", SimpleNamespace(monotonic=lambda: now[0]))

    def took(seconds, method):
        def timed(self, *args, **kwargs):
            now[0] += seconds
            return method(self, *args, **kwargs)
        return timed

    Trainer = transformers.Trainer
    monkeypatch.setattr(Trainer, "_save_checkpoint", took(7.0, Trainer._save_checkpoint))
    monkeypatch.setattr(Trainer, "_evaluate", took(100.0, Trainer._evaluate))
    hf_trainer(tmp_path / "out", [integration.CockpitCallback()]).train()
    saves = read(events_file)["checkpoint"]
    assert [e["step"] for e in saves] == [8, 12]
    assert [e["save_s"] for e in saves] == [7.0, 7.0]


def published_steps(monkeypatch) -> list[int]:
    """The steps report.reached is told, as it is told them."""
    told: list[int] = []
    publish = report.reached
    monkeypatch.setattr(report, "reached", lambda step, samples=None: (told.append(step), publish(step, samples)))
    return told


def test_hf_callback_publishes_every_step_reached(events_file, tmp_path, monkeypatch):
    from cockpit.integrations.transformers import CockpitCallback

    told = published_steps(monkeypatch)
    hf_trainer(tmp_path / "out", [CockpitCallback()]).train()
    assert told == list(range(1, 13))
    assert reached.Reader(reached.path_of(tmp_path, 1)).read() == (12, 12 * 4 * 2)


def test_hf_callbacks_total_is_what_the_epochs_come_to(events_file, tmp_path):
    """No max_steps: the Trainer's total from num_train_epochs is the ETA's."""
    from cockpit.integrations.transformers import CockpitCallback

    trainer = hf_trainer(tmp_path / "out", [CockpitCallback()], max_steps=-1,
                         num_train_epochs=0.1)
    trainer.train()
    total = trainer.state.max_steps
    assert 0 < total < 78  # a tenth of 625 blocks at 4 x 2
    progress = read(events_file)["progress"]
    assert {e["total"] for e in progress} == {total} and progress[-1]["step"] == total


def test_hf_callback_does_nothing_outside_cockpit(tmp_path, monkeypatch):
    from cockpit.integrations.transformers import CockpitCallback

    monkeypatch.delenv("COCKPIT_EVENTS", raising=False)
    report._reset()
    trainer = hf_trainer(tmp_path / "out", [CockpitCallback()])
    trainer.train()
    assert trainer.state.global_step == 12 and not report.active
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# ---------------------------------------------------------------- Lightning


def lightning_run(package: str, root: Path, callbacks: list, **limits):
    """A four-feature regression trained 12 optimizer steps (batch 4 x accumulation 2; `limits`:
    other max_steps or max_epochs) with the given package's Trainer, validated every 8
    batches, checkpointed every 6 steps."""
    import torch

    pl = importlib.import_module(package)
    checkpoint = importlib.import_module(package + ".callbacks").ModelCheckpoint

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    x = torch.randn(256, 4)
    data = torch.utils.data.TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    limits = {"max_steps": 12, **limits}
    trainer = pl.Trainer(accelerator="cpu", devices=1, **limits, accumulate_grad_batches=2,
                         log_every_n_steps=4, val_check_interval=8, limit_val_batches=2,
                         num_sanity_val_steps=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(root),
                         callbacks=[*callbacks, checkpoint(dirpath=str(root / "ckpt"),
                                                           every_n_train_steps=6, save_top_k=-1)])
    trainer.fit(Regression(), loader, loader)
    return trainer


@pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
def test_lightning_callback_reports_steps_validations_and_checkpoints(events_file, tmp_path, package):
    pytest.importorskip(package)
    from cockpit.integrations.lightning import CockpitCallback

    trainer = lightning_run(package, tmp_path, [CockpitCallback()])
    assert "save_checkpoint" not in vars(trainer)  # the wrapper is gone after fit
    got = read(events_file)
    progress = got["progress"]
    assert progress[-1]["step"] == 12 and {e["total"] for e in progress} == {12}
    assert all(e["samples"] == e["step"] * 4 * 2 for e in progress)
    logged = [e for e in progress if e["loss"] is not None]
    assert [e["step"] for e in logged] == [4, 8, 12]  # log_every_n_steps
    assert all(e["metrics"]["lr"] == 0.05 and e["metrics"]["epoch"] > 0 for e in logged)
    assert logged[-1]["loss"] < logged[0]["loss"]
    assert not any("val_loss" in e["metrics"] for e in progress)  # evals are not step metrics
    # val_check_interval counts batches: 8, 16, 24 are optimizer steps 4, 8, 12; the sanity
    # check before training is not an evaluation
    evals = got["eval"]
    assert [e["step"] for e in evals] == [4, 8, 12]
    assert all(set(e["metrics"]) == {"val_loss"} for e in evals)
    assert evals[-1]["metrics"]["val_loss"] < evals[0]["metrics"]["val_loss"]
    checkpoints = [(e["step"], Path(e["path"])) for e in got["checkpoint"]]
    assert [s for s, _ in checkpoints] == [6, 12]
    assert all(p.is_file() and command.step_in_name(p) == s for s, p in checkpoints)


def test_lightning_callback_publishes_every_step_reached(events_file, tmp_path, monkeypatch):
    from cockpit.integrations.lightning import CockpitCallback

    told = published_steps(monkeypatch)
    lightning_run("lightning.pytorch", tmp_path, [CockpitCallback()])
    assert told == list(range(1, 13))   # optimizer steps, not the 24 micro-batches
    assert reached.Reader(reached.path_of(tmp_path, 1)).read() == (12, 12 * 4 * 2)


@pytest.mark.parametrize("limits", [{"max_steps": -1, "max_epochs": 1},
                                    {"max_steps": 100, "max_epochs": 1}])
def test_lightning_callbacks_total_is_what_max_epochs_come_to(events_file, tmp_path, limits):
    """The ETA's total without max_steps, or with one the epochs reach first: one epoch of 64
    batches at accumulation 2 is 32 optimizer steps."""
    from cockpit.integrations.lightning import CockpitCallback

    trainer = lightning_run("lightning.pytorch", tmp_path, [CockpitCallback()], **limits)
    assert trainer.global_step == 32
    progress = read(events_file)["progress"]
    assert {e["total"] for e in progress} == {32} and progress[-1]["step"] == 32


def test_lightning_callback_does_nothing_outside_cockpit(tmp_path, monkeypatch):
    from cockpit.integrations.lightning import CockpitCallback

    monkeypatch.delenv("COCKPIT_EVENTS", raising=False)
    report._reset()
    trainer = lightning_run("lightning.pytorch", tmp_path, [CockpitCallback()])
    assert trainer.global_step == 12 and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


# ---------------------------------------------------------------- without the framework


@pytest.mark.parametrize("module, blocked, needle", [
    ("transformers", ["transformers"], "pip install transformers"),
    ("lightning", ["lightning", "lightning.pytorch", "pytorch_lightning"], "pip install lightning"),
])
def test_importing_an_integration_without_its_framework_says_what_to_install(module, blocked, needle):
    code = (f"import sys; sys.modules.update(dict.fromkeys({blocked!r}))\n"
            f"import cockpit.integrations.{module}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child_env(), timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: cockpit.integrations.") and last.endswith(needle)
    assert f"not installed in this Python ({sys.executable})" in last


@pytest.mark.parametrize("module, broken, blocked, cause", [
    ("transformers", "import tokenizers_not_here", [],
     "ModuleNotFoundError: No module named 'tokenizers_not_here'"),
    ("lightning", "raise ImportError('lightning needs torch>=9')", ["pytorch_lightning"],
     "ImportError: lightning needs torch>=9"),
])
def test_a_framework_installed_but_failing_to_import_is_told_as_such(tmp_path, module, broken,
                                                                     blocked, cause):
    """Not 'pip install transformers' when transformers is there but a package it needs is
    not: the line says why it failed, and the cause's traceback stands above it."""
    (tmp_path / module).mkdir()
    (tmp_path / module / "__init__.py").write_text(broken + "\n")
    code = (f"import sys; sys.modules.update(dict.fromkeys({blocked!r}))\n"
            f"import cockpit.integrations.{module}")
    env = {**child_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: cockpit.integrations.{module} needs ")
    assert last.endswith(f"is installed in this Python ({sys.executable}) but fails to import: "
                         f"{cause}")
    assert "pip install" not in done.stderr and str(tmp_path / module) in done.stderr


# ---------------------------------------------------------------- placeholders


@pytest.mark.parametrize("device, precision, hf, lightning", [
    ("cpu", "fp32", ["--use_cpu"], "32-true"),
    ("cpu", "bf16", ["--bf16", "--use_cpu"], "bf16-mixed"),
    ("cuda", "auto", ["--bf16"], "bf16-mixed"),
    ("cuda", "fp16", ["--fp16"], "16-mixed"),
    ("mps", "auto", [], "32-true"),
])
def test_derived_placeholders_fill_the_frameworks_flags(tmp_path, device, precision, hf, lightning):
    preset = DevicePreset(device=device, precision=precision, batch_size=4, accumulation=3)
    values = command.values(preset, tmp_path, 1)
    argv = command.fill(["train.py", "--per_device_train_batch_size", "{batch_size}",
                         "--gradient_accumulation_steps", "{accumulation}",
                         "{hf_precision_flag}", "{hf_device_flag}"], values)
    assert argv == ["train.py", "--per_device_train_batch_size", "4",
                    "--gradient_accumulation_steps", "3", *hf]  # fp32: no argument at all
    assert command.fill(["--accelerator", "{device}", "--precision={lightning_precision}"],
                        values) == ["--accelerator", device, f"--precision={lightning}"]


def test_a_command_that_takes_a_derived_precision_placeholder_feels_precision():
    """(Only what the placeholders decide: other settings no placeholder carries may be fixed.)"""
    spec = command.CommandSpec(command=("python", "train.py"))
    assert {"batch_size", "precision"} <= command.fixed_settings(spec)
    spec = command.CommandSpec(command=("python", "train.py", "{hf_precision_flag}"))
    fixed = command.fixed_settings(spec)
    assert "batch_size" in fixed and "precision" not in fixed
    spec = command.CommandSpec(command=("python", "train.py", "--bs", "{effective_batch}",
                                        "--precision", "{lightning_precision}"))
    assert not {"batch_size", "precision"} & command.fixed_settings(spec)


# ---------------------------------------------------------------- the edges a user hits


def test_a_metric_named_like_report_steps_parameters_does_not_stop_training(events_file, tmp_path):
    import lightning.pytorch as pl

    from cockpit.integrations.lightning import CockpitCallback

    class LogSamples(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            pl_module.log("samples", 4.0)
            pl_module.log("total", 1.0)

    trainer = lightning_run("lightning.pytorch", tmp_path, [LogSamples(), CockpitCallback()])
    assert trainer.global_step == 12
    logged = [e for e in read(events_file)["progress"] if e["loss"] is not None]
    assert logged and all(e["metrics"]["metric_samples"] == 4.0 for e in logged)
    assert all(e["samples"] == e["step"] * 8 for e in logged)  # its own count, not the metric


def test_a_failing_hook_stops_reporting_not_training(events_file, tmp_path, monkeypatch, capsys):
    from cockpit.integrations.transformers import CockpitCallback

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(report, "eval", broken)
    trainer = hf_trainer(tmp_path / "out", [CockpitCallback()])
    trainer.train()
    assert trainer.state.global_step == 12  # trained to the end
    err = capsys.readouterr().err
    assert err.count("CockpitCallback stopped reporting: OSError: disk full") == 1
    assert max(e["step"] for e in read(events_file)["progress"]) == 8  # quiet from the failure


def test_a_callback_given_twice_reports_once(events_file, tmp_path):
    from cockpit.integrations.lightning import CockpitCallback

    lightning_run("lightning.pytorch", tmp_path, [CockpitCallback(), CockpitCallback()])
    got = read(events_file)
    steps = [e["step"] for e in got["progress"]]
    assert steps == sorted(set(steps))  # no step twice
    assert [e["step"] for e in got["eval"]] == [4, 8, 12]
    assert [e["step"] for e in got["checkpoint"]] == [6, 12]


@pytest.mark.parametrize("env", [{"LOCAL_RANK": "1", "NODE_RANK": "0"}, {"SLURM_PROCID": "2"},
                                 {"RANK": "3", "LOCAL_RANK": "0"}])
def test_only_the_first_process_of_a_job_reports(events_file, monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    report._reset()
    assert not report.active
    for name in env:
        monkeypatch.setenv(name, "0")
    report._reset()
    assert report.active


def test_samples_continue_from_the_checkpoint_after_a_fallback_changed_the_batch(
        events_file, tmp_path, monkeypatch):
    """Attempt 1 saw 8 samples a step and checkpointed at step 8 (64 samples); the fallback's
    attempt trains 4 a step: at step 12 it has seen 64 + 4 x 4, not 12 x 4."""
    from cockpit.integrations.transformers import CockpitCallback

    hf_trainer(tmp_path / "out", [CockpitCallback()]).train()
    (saved,) = [e for e in read(events_file)["checkpoint"] if e["step"] == 8]
    assert saved["samples"] == 64
    events_file.unlink()
    monkeypatch.setenv("COCKPIT_RESUME_STEP", "8")
    monkeypatch.setenv("COCKPIT_RESUME_SAMPLES", str(saved["samples"]))
    report._reset()
    trainer = hf_trainer(tmp_path / "out", [CockpitCallback()])
    trainer.args.per_device_train_batch_size = 2  # 2 x accumulation 2 = 4 a step
    trainer.train(resume_from_checkpoint=saved["path"])
    progress = read(events_file)["progress"]
    assert progress[0]["step"] == 9 and progress[-1]["step"] == 12
    assert all(e["samples"] == 64 + (e["step"] - 8) * 4 for e in progress)


def test_the_lightning_callback_subclasses_pytorch_lightning_when_that_is_what_is_imported():
    code = ("import pytorch_lightning, sys\n"
            "from cockpit.integrations.lightning import CockpitCallback\n"
            "assert issubclass(CockpitCallback, pytorch_lightning.Callback)\n"
            "assert 'lightning' not in sys.modules, 'lightning was imported too'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=child_env(), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]

"""Model FLOP utilisation: the datasheet table, the step events that carry it where the
device's peak is known, and the headless lines that show it."""

from __future__ import annotations

from conftest import TINY
from cockpit.present import lines
from engine import runconfig
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.train import peaks, trainer as trainer_module


def test_the_table_knows_gpus_by_whole_name_and_precision():
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4   # SXM
    assert peaks.peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.5          # not the SXM's figure
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "fp32") == 66.9
    assert peaks.peak_tflops("NVIDIA H100 80GB HBM3", "fp32", tf32=True) == 494.7
    assert peaks.peak_tflops("NVIDIA A100-SXM4-80GB", "bf16") == 312.0
    assert peaks.peak_tflops("NVIDIA A10", "bf16") == 125.0
    assert peaks.peak_tflops("NVIDIA A10G", "bf16") is None     # another chip: no guess
    assert peaks.peak_tflops("NVIDIA L40", "bf16") is None
    assert peaks.peak_tflops("Apple M2 Max", "fp32") is None


def _steps(home, monkeypatch, peak):
    monkeypatch.setattr(peaks, "device_peak", lambda device, precision: peak)
    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY))
    trainer = trainer_module.Trainer(run, EventWriter(run.events_path, attempt=1), "cpu", run.config().device)
    trainer.fit()
    return trainer, [e for e in run.events() if e["type"] == "step"]


def test_step_events_carry_mfu_where_the_peak_is_known(home, monkeypatch):
    trainer, steps = _steps(home, monkeypatch, (0.5, "a GPU of half a TFLOP/s"))
    assert steps and all(e["mfu"] == round(e["gflop_s"] / 500.0, 4) for e in steps)
    ready = trainer.describe()
    assert ready["peak_tflops"] == 0.5


def test_no_peak_no_mfu(home, monkeypatch):
    _, steps = _steps(home, monkeypatch, None)
    assert steps and not any("mfu" in e for e in steps)


def test_the_headless_lines_show_it():
    step = {"type": "step", "step": 40, "total": 400, "loss": 0.41, "samples_per_s": 1234.0,
            "gflop_s": 412_000.0, "mfu": 0.4163, "eta_s": 130.0}
    assert "412,000.0 GFLOP/s (MFU 42%)" in lines.step_line(step)
    assert "MFU 42%" in lines.status_line(step, None, windows=5, width=120)
    assert "MFU" not in lines.step_line({k: v for k, v in step.items() if k != "mfu"})


def test_the_dashboard_model_keeps_the_newest_full_windows_mfu():
    from cockpit.ui.model import RunModel

    m = RunModel()
    m.fold([{"type": "step", "t": 1.0, "step": 1, "samples_per_s": 10.0, "gflop_s": 400_000.0, "mfu": 0.40},
            {"type": "step", "t": 1.1, "step": 2, "samples_per_s": 90.0, "gflop_s": 900_000.0, "mfu": 0.91,
             "partial": True}])
    assert m.mfu == 0.40   # a fragment's figure is noise
    m.fold([{"type": "step", "t": 2.0, "step": 3, "samples_per_s": 10.0, "gflop_s": 1.0}])
    assert m.mfu is None   # no peak known: not shown

"""cockpit.report: a no-op outside cockpit; under it, exact events, and faults that are the
real thing."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys

import pytest

from cockpit import report
from conftest import ROOT, child_env
from engine.train import faults
from engine.record import reached
from engine.record.events import read_events

ENV = ("COCKPIT_EVENTS", "COCKPIT_ATTEMPT", "COCKPIT_DEVICE", "COCKPIT_INJECT", "COCKPIT_REACHED", "RANK")


@pytest.fixture
def outside(monkeypatch):
    for var in ENV:
        monkeypatch.delenv(var, raising=False)
    report._reset()
    yield
    monkeypatch.undo()
    report._reset()


@pytest.fixture
def cockpit_env(tmp_path, monkeypatch):
    """Under cockpit: `cockpit_env(inject=..., device=...)` sets the environment and re-reads
    it; returns the events file."""
    events = tmp_path / "run" / "events.jsonl"
    events.parent.mkdir()

    def enter(inject: str = "", device: str = "cpu", attempt: int = 3, path=events):
        for var in ENV:
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("COCKPIT_EVENTS", str(path))
        monkeypatch.setenv("COCKPIT_ATTEMPT", str(attempt))
        monkeypatch.setenv("COCKPIT_DEVICE", device)
        monkeypatch.setenv("COCKPIT_INJECT", inject)
        monkeypatch.setenv("COCKPIT_REACHED", str(reached.path_of(events.parent, attempt)))
        report._reset()
        return path

    yield enter
    monkeypatch.undo()
    report._reset()


def types(events):
    return [(e["type"], e.get("step")) for e in read_events(events)]


# ---------------------------------------------------------------- outside cockpit


def test_outside_cockpit_every_call_is_a_no_op(outside, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COCKPIT_INJECT", "oom@0,user-code@0")  # without COCKPIT_EVENTS: ignored
    report._reset()
    assert report.active is False
    report.step(5, total=10, loss=0.5, samples=160, lr=0.1)
    report.reached(6, samples=192)
    report.eval(val_loss=0.4)
    report.checkpoint("ckpt.pt", 5)
    assert list(tmp_path.iterdir()) == []


def test_bad_values_raise_outside_cockpit_too(outside):
    """So a mistake shows when the script runs on its own, not first under cockpit."""
    with pytest.raises(TypeError, match="loss"):
        report.step(1, loss="0.5")


# ---------------------------------------------------------------- events


def test_events_read_back_in_the_writers_format(cockpit_env, tmp_path, monkeypatch):
    events = cockpit_env(attempt=3)
    monkeypatch.chdir(tmp_path)
    assert report.active is True
    report.eval(early=1)  # before any step: no step to attach it to
    report.step(10, total=100, loss=2.5, samples=320, lr=0.01, grad_norm=3)
    report.step(20)
    report.checkpoint("out/ckpt-000020.pt", 20)
    report.eval(val_loss=1.25, accuracy=0.5)

    got = read_events(events)
    assert [e["type"] for e in got] == ["eval", "progress", "progress", "checkpoint", "eval"]
    for e in got:
        assert e["v"] == 1 and e["attempt"] == 3 and isinstance(e["t"], float)
    assert got[0]["step"] is None and got[0]["metrics"] == {"early": 1.0}
    assert got[1] | {"t": 0} == {"v": 1, "t": 0, "type": "progress", "attempt": 3, "step": 10,
                                 "total": 100, "loss": 2.5, "samples": 320,
                                 "metrics": {"lr": 0.01, "grad_norm": 3.0}}
    assert isinstance(got[1]["metrics"]["grad_norm"], float)
    assert got[2]["total"] is None and got[2]["loss"] is None and got[2]["samples"] is None
    assert got[2]["metrics"] == {}
    assert got[3]["path"] == str(tmp_path / "out" / "ckpt-000020.pt") and got[3]["step"] == 20
    assert got[3]["source"] == "report"
    assert got[4]["step"] == 20 and got[4]["metrics"] == {"val_loss": 1.25, "accuracy": 0.5}
    assert got[4]["source"] == "report"
    # One line per event, compact separators, as EventWriter writes them.
    lines = events.read_text().splitlines()
    assert len(lines) == 5 and all(", " not in line and '": ' not in line for line in lines)


def test_tensors_and_numpy_scalars_are_numbers(cockpit_env):
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    events = cockpit_env()
    report.step(torch.tensor(7), loss=torch.tensor(0.5), samples=np.int64(64),
                acc=np.float32(0.25), lr=torch.tensor([0.5]))
    e = read_events(events)[0]
    assert (e["step"], e["loss"], e["samples"]) == (7, 0.5, 64)
    assert e["metrics"] == {"acc": 0.25, "lr": 0.5}
    assert type(e["step"]) is int and type(e["samples"]) is int


def test_a_non_finite_loss_is_reported_as_it_is(cockpit_env):
    events = cockpit_env()
    report.step(1, loss=float("nan"))
    report.step(2, loss=float("inf"))
    got = read_events(events)
    assert math.isnan(got[0]["loss"]) and got[1]["loss"] == math.inf


@pytest.mark.parametrize("call, name", [
    (lambda: report.step(True), "step"),
    (lambda: report.step("3"), "step"),
    (lambda: report.step(1.5), "step"),
    (lambda: report.step(float("nan")), "step"),
    (lambda: report.step(1, total=None, loss=True), "loss"),
    (lambda: report.step(1, loss="0.5"), "loss"),
    (lambda: report.step(1, loss=None, samples=3.5), "samples"),
    (lambda: report.step(1, total=[100]), "total"),
    (lambda: report.step(1, accuracy="high"), "accuracy"),
    (lambda: report.eval(val_loss=None), "val_loss"),
    (lambda: report.eval(val_loss=False), "val_loss"),
    (lambda: report.checkpoint(3, 1), "path"),
    (lambda: report.checkpoint("ckpt.pt", "1"), "step"),
    (lambda: report.reached(True), "step"),
    (lambda: report.reached(4, samples=2.5), "samples"),
])
def test_bad_values_raise_a_type_error_naming_the_argument(cockpit_env, call, name):
    events = cockpit_env()
    with pytest.raises(TypeError, match=rf"\b{name}\b"):
        call()
    assert not events.exists() or read_events(events) == []


def test_each_step_reached_is_published_without_an_event(cockpit_env):
    events = cockpit_env(attempt=2)
    published = reached.Reader(reached.path_of(events.parent, 2))
    report.reached(1)
    assert published.read() == (1, None)
    report.reached(2, samples=64)
    assert published.read() == (2, 64)
    assert not events.exists()   # a store into memory, nothing written to the events
    report.step(3, loss=0.5, samples=96)   # a step reported is reached too
    assert published.read() == (3, 96)


def test_a_tensor_of_several_elements_is_not_a_number(cockpit_env):
    torch = pytest.importorskip("torch")
    cockpit_env()
    with pytest.raises(TypeError, match="loss"):
        report.step(1, loss=torch.ones(3))


def test_an_unwritable_events_file_goes_quiet(cockpit_env, tmp_path):
    cockpit_env(path=tmp_path / "missing" / "dir" / "events.jsonl")
    report.step(1, loss=0.5)
    report.eval(val_loss=0.5)
    report.checkpoint("x.pt", 1)
    if os.path.exists("/dev/full"):  # opens, but every write fails (ENOSPC)
        cockpit_env(path="/dev/full")
        report.step(1, loss=0.5)
        report.step(2, loss=0.5)


def test_other_ranks_stay_quiet(cockpit_env, monkeypatch):
    events = cockpit_env()
    monkeypatch.setenv("RANK", "1")
    report._reset()
    assert report.active is False
    report.step(1)
    monkeypatch.setenv("RANK", "0")
    report._reset()
    report.step(2)
    assert types(events) == [("progress", 2)]


# ---------------------------------------------------------------- fault injection


@pytest.mark.parametrize("device, text", [("cpu", faults.CPU_OOM), ("mps", faults.MPS_OOM),
                                          ("cuda", faults.CUDA_OOM)])
def test_oom_raises_the_devices_own_error_once(cockpit_env, device, text):
    events = cockpit_env(inject="oom@5", device=device)
    report.step(4, loss=1.0)
    with pytest.raises(RuntimeError) as raised:
        report.step(6, loss=1.0)  # due from step 5: the first report at or after it fires
    assert str(raised.value) == text
    report.step(7, loss=1.0)  # once: the next attempt would not see it
    got = read_events(events)
    assert types(events) == [("progress", 4), ("fault_injected", 6), ("progress", 7)]
    assert got[1]["spec"] == "oom@5" and got[1]["kind"] == "oom"


def test_backend_on_cuda_raises_the_cuda_error(cockpit_env):
    events = cockpit_env(inject="backend@0", device="cuda")
    with pytest.raises(RuntimeError) as raised:
        report.step(0)
    assert str(raised.value) == faults.CUDA_ERROR
    assert types(events) == [("fault_injected", 0)]


def test_user_code_raises_the_scripts_own_kind_of_error(cockpit_env):
    events = cockpit_env(inject="user-code@2")
    report.step(1)
    with pytest.raises(ValueError, match="too many values to unpack"):
        report.step(2)
    assert types(events) == [("progress", 1), ("fault_injected", 2)]


def test_nan_poisons_every_loss_from_then_on(cockpit_env):
    events = cockpit_env(inject="nan@3")
    report.step(2, loss=1.0)
    report.step(3, loss=0.9)
    report.step(4, loss=0.8)
    report.step(5)  # a script that reports no loss still shows the fault
    got = read_events(events)
    assert [e["type"] for e in got] == ["progress", "fault_injected", "progress", "progress",
                                        "progress"]
    assert got[0]["loss"] == 1.0
    assert all(math.isnan(e["loss"]) for e in got[2:])


def test_repeat_specs_fire_once_and_signal_kinds_are_left_to_the_supervisor(cockpit_env):
    events = cockpit_env(inject="hang@1,slow@1,not-a-fault,oom@2+")
    report.step(1)
    with pytest.raises(RuntimeError):
        report.step(2)
    report.step(3)
    assert types(events) == [("progress", 1), ("fault_injected", 2), ("progress", 3)]
    assert read_events(events)[1]["spec"] == "oom@2+"


def test_openmp_does_not_fire_when_the_duplicate_runtime_is_allowed(cockpit_env, monkeypatch):
    monkeypatch.setenv("KMP_DUPLICATE_LIB_OK", "TRUE")
    events = cockpit_env(inject="openmp@1")
    report.step(1)
    report.step(2)
    assert types(events) == [("progress", 1), ("progress", 2)]


@pytest.mark.parametrize("inject, device, text", [
    ("backend@3", "cpu", faults.METAL_ERROR),
    ("backend@3", "mps", faults.METAL_ERROR),
    ("openmp@3", "cpu", faults.OMP_ERROR),
    ("native-crash@3", "cuda", ""),  # silent, as the notes' Metal aborts
])
def test_abort_kinds_die_by_sigabrt_with_the_real_text(tmp_path, inject, device, text):
    """Even past a SIGABRT handler (a CUDA process has one a native library installed)."""
    events = tmp_path / "events.jsonl"
    env = {k: v for k, v in child_env().items() if k not in (*ENV, "KMP_DUPLICATE_LIB_OK")}
    env.update(COCKPIT_EVENTS=str(events), COCKPIT_ATTEMPT="2", COCKPIT_DEVICE=device,
               COCKPIT_INJECT=inject)
    code = ("import signal\n"
            "from cockpit import report\n"
            "signal.signal(signal.SIGABRT, lambda signum, frame: None)\n"
            "for s in range(10):\n"
            "    report.step(s, loss=1.0)\n"
            "print('survived')\n")
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == -signal.SIGABRT
    assert text in done.stderr and "survived" not in done.stdout
    got = read_events(events)
    assert [(e["type"], e["step"]) for e in got] == [("progress", 0), ("progress", 1),
                                                     ("progress", 2), ("fault_injected", 3)]
    assert got[-1]["attempt"] == 2 and got[-1]["spec"] == inject


# ---------------------------------------------------------------- import cost


@pytest.mark.parametrize("inject", ["", "oom@5"])
def test_importing_report_stays_light(tmp_path, inject):
    env = {**child_env(), "COCKPIT_EVENTS": str(tmp_path / "events.jsonl"),
           "COCKPIT_INJECT": inject}
    code = "import sys, cockpit.report; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    assert "cockpit.report" in out
    heavy = [m for m in out if m.split(".")[0] in ("torch", "textual", "numpy", "engine")]
    assert heavy == []

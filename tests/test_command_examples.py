"""examples/command: the zero-touch script and its cockpit.report twin run on their own (outside
cockpit), learn, checkpoint, resume at the checkpoint's step and save on Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, child_env

EXAMPLES = ROOT / "examples" / "command"
SCRIPTS = ("train.py", "train_reported.py")


def outside_cockpit() -> dict[str, str]:
    env = {k: v for k, v in child_env().items() if not k.startswith("COCKPIT_")}
    return {**env, "OMP_NUM_THREADS": "1"}  # tiny model; the runs go side by side


def start(script: str, *args: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(EXAMPLES / script), *args], cwd=ROOT,
                            env=outside_cockpit(), stdout=subprocess.PIPE, stderr=stderr,
                            text=True)


def finish(proc: subprocess.Popen) -> tuple[str, str]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    return out, err


def val_losses(out: str) -> dict[int, float]:
    """The held-out losses printed as 'step N: val_loss X', by step."""
    return {int(m[1]): float(m[2]) for m in re.finditer(r"^step (\d+): val_loss (\S+)$", out, re.M)}


def done(out: str) -> tuple[int, float]:
    """'done: step N loss X' -> (N, X)."""
    m = re.search(r"^done: step (\d+) loss (\S+)$", out, re.M)
    assert m, f"no done line in {out!r}"
    return int(m[1]), float(m[2])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each script, 40 steps with a checkpoint every 20, then resumed from step 20 into a
    fresh directory, beside a long run stopped by Ctrl-C: each stage's runs side by side
    (importing torch is most of the time). Whatever fails on the way, nothing it started runs on."""
    base = tmp_path_factory.mktemp("examples")
    started: list[subprocess.Popen] = []

    def launch(*args, **kwargs) -> subprocess.Popen:
        started.append(start(*args, **kwargs))
        return started[-1]

    try:
        return stages(base, launch)
    finally:
        for proc in started:
            proc.kill()
            proc.wait()


def stages(base, start):
    common = ("--steps", "40", "--ckpt-every", "20", "--bs", "16", "--accum", "2")
    procs = {s: start(s, *common, "--out", str(base / s / "full")) for s in SCRIPTS}
    full = {s: finish(p) for s, p in procs.items()}
    procs = {s: start(s, *common, "--out", str(base / s / "resumed"),
                      "--resume", str(base / s / "full" / "ckpt-000020.pt")) for s in SCRIPTS}
    # Its bar goes to a file: nothing reads a pipe while the resumed runs finish.
    with open(base / "interrupted.err", "w+") as bar:
        long = start("train.py", "--steps", "100000", "--step-delay", "0.01", "--ckpt-every",
                     "100000", "--out", str(base / "interrupted"), stderr=bar)
        resumed = {s: finish(p) for s, p in procs.items()}
        assert long.stdout.readline().startswith("step 0: val_loss")
        # Well into the loop: its bar has counted steps. (A fixed sleep can end before the
        # first step on a loaded machine, and a Ctrl-C before the loop is not the one tested.)
        deadline = time.monotonic() + 60
        while not re.search(r"\b[1-9]\d*/100000\b", (base / "interrupted.err").read_text()):
            assert time.monotonic() < deadline and long.poll() is None, "the loop never started"
            time.sleep(0.05)
        long.send_signal(signal.SIGINT)
        out, _ = long.communicate(timeout=60)
        bar.seek(0)
        return base, full, resumed, (long.returncode, out, bar.read())


@pytest.mark.parametrize("script", SCRIPTS)
def test_loss_falls_and_checkpoints_appear(runs, script):
    base, full, _, _ = runs
    out, _ = full[script]
    held_out = val_losses(out)
    assert sorted(held_out) == [0, 40]
    assert held_out[40] < held_out[0] / 4
    step, loss = done(out)
    assert step == 40 and loss < held_out[0] / 4
    assert sorted(p.name for p in (base / script / "full").iterdir()) == [
        "ckpt-000020.pt", "ckpt-000040.pt"]  # and no temporary file left behind


def test_the_bar_carries_the_loss(runs):
    _, full, _, _ = runs
    bar = full["train.py"][1].split("\r")[-1]
    assert "40/40" in bar and re.search(r"loss=[\d.]+, lr=0.01", bar)


@pytest.mark.parametrize("script", SCRIPTS)
def test_resume_continues_at_the_checkpoints_step(runs, script):
    base, full, resumed, _ = runs
    out, err = resumed[script]
    assert f"resumed from {base / script / 'full' / 'ckpt-000020.pt'} at step 20" in out
    # Model, optimizer and RNG state all restored: the same run as the uninterrupted one.
    held_out = val_losses(out)
    assert sorted(held_out) == [20, 40]  # it started at the checkpoint's step
    assert held_out[40] == val_losses(full[script][0])[40]
    assert done(out) == done(full[script][0])
    assert sorted(p.name for p in (base / script / "resumed").iterdir()) == ["ckpt-000040.pt"]
    if script == "train.py":
        assert " 20/40 " in err  # the bar shows the global step from the start


def test_ctrl_c_saves_a_checkpoint_and_exits_130(runs):
    base, _, _, (returncode, _, err) = runs
    assert returncode == 130, err[-2000:]
    saved = re.search(r"interrupted: saved (\S+) at step (\d+)", err)
    assert saved and int(saved[2]) > 0
    assert [p.name for p in (base / "interrupted").iterdir()] == [f"ckpt-{int(saved[2]):06d}.pt"]

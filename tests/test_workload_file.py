"""A workload named by its file, `workload = "./my_workload.py:factory"`: relative to the preset
file (or absolute, '~' expanded), found from any working directory without PYTHONPATH by the
CLI, the trainer, `cockpit runs resume`, the probe and the TUI's editor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, cockpit_cmd, user_preset
from engine import files, presets, runconfig, workloads
from engine.errors import ConfigError
from engine.record.rundir import list_runs

WORKLOAD = '''
from dataclasses import dataclass

import torch
from torch import nn

from engine.schema import setting
from {helper} import WEIGHTS   # a module beside this file


@dataclass(frozen=True, kw_only=True, slots=True)
class Params:
    samples: int = setting(256, "training samples", min=1)


class Line:
    def __init__(self, params, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(params.samples, 4, generator=g)
        self.y = self.x @ torch.tensor(WEIGHTS)
        self.num_samples = params.samples

    def build_model(self, *, grad_checkpointing):
        return nn.Linear(4, 1)

    def batch(self, indices, device):
        return self.x[indices].to(device), self.y[indices].to(device)

    def loss(self, model, batch):
        x, y = batch
        return ((model(x).squeeze(1) - y) ** 2).mean()


def build(params, seed):
    return Line(params, seed)
'''


def write_workload(folder: Path, name: str) -> Path:
    """A small workload file and the module beside it that it imports (named for this test:
    modules are cached by name)."""
    folder.mkdir(parents=True, exist_ok=True)
    helper = f"{name}_helper"
    (folder / f"{helper}.py").write_text("WEIGHTS = [1.0, -2.0, 0.5, 3.0]\n")
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(WORKLOAD.format(helper=helper)))
    return path


def file_preset(home: Path, spec: str, name: str = "filewl") -> Path:
    return user_preset(home, "workloads", name, f'workload = "{spec}"\n[train]\nepochs = 2\nlr = 0.05\n'
                                                "checkpoint_every_steps = 1\n[params]\nsamples = 256\n")


def test_a_relative_path_is_taken_from_the_preset_file_whatever_the_working_directory(home, monkeypatch):
    preset = file_preset(home, "./wl/rel_wl.py:build")
    path = write_workload(preset.parent / "wl", "rel_wl")
    elsewhere = home / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = runconfig.resolve("filewl", "cpu", ["params.samples=64"])
    assert config.workload.workload == f"{path}:build"  # absolute in run.toml, for every later process
    assert type(config.workload.params).__name__ == "Params" and config.workload.params.samples == 64
    workload = workloads.build(config.workload.workload, config.workload.params, 0)
    assert workload.num_samples == 64 and workload.y.shape == (64,)
    with pytest.raises(ConfigError, match=r"--set: params\.samples: got 0, expected a positive integer"):
        runconfig.resolve("filewl", "cpu", ["params.samples=0"])


def test_an_absolute_path_and_one_from_home(home, monkeypatch):
    path = write_workload(home / "user-home" / "models", "home_wl")
    monkeypatch.setenv("HOME", str(home / "user-home"))
    file_preset(home, "~/models/home_wl.py:build", "tilde")
    file_preset(home, f"{path}:build", "absolute")
    assert runconfig.resolve("tilde", "cpu").workload.workload == f"{path}:build"
    assert runconfig.resolve("absolute", "cpu").workload.workload == f"{path}:build"


@pytest.mark.parametrize("spec, source, message", [
    ("./nope.py:build", None,
     "workload: './nope.py:build': no file {dir}/nope.py (relative to {dir}, the preset's directory); "
     "expected a Python file defining the factory"),
    ("./bad_attr_wl.py:2build", "", "workload: got './bad_attr_wl.py:2build', expected "
                                   "'path/to/file.py:factory' (a dotted Python name after the last ':')"),
    ("./syntax_wl.py:build", "def build(params, seed)\n", "workload: '{dir}/syntax_wl.py:build': syntax error in "
                                                          "{dir}/syntax_wl.py, line 1: expected ':'"),
    ("./raising_wl.py:build", "raise RuntimeError('no GPU here')\n",
     "workload: '{dir}/raising_wl.py:build': importing {dir}/raising_wl.py raised RuntimeError: no GPU here"),
    ("./spelt_wl.py:build", "def buidl(params, seed): ...\n",
     "workload: '{dir}/spelt_wl.py:build': {mod} ({dir}/spelt_wl.py) has no attribute 'build'; "
     "did you mean 'buidl'?"),
])
def test_file_mistakes_are_one_line_naming_the_preset(home, spec, source, message):
    preset = file_preset(home, spec, "broken")
    if source is not None:
        (preset.parent / spec[2:].partition(":")[0]).write_text(source)
    with pytest.raises(ConfigError) as e:
        runconfig.resolve("broken", "cpu")
    assert e.value.line() == f"{preset}: " + message.format(dir=preset.parent, mod="spelt_wl")
    if source is None:  # presets list sees a missing file without importing anything
        with pytest.raises(ConfigError, match="no file"):
            presets.check(presets.find("workloads", "broken"), files.read_toml(preset))


def test_a_relative_path_outside_a_preset_file_is_refused(home):
    with pytest.raises(ConfigError) as e:
        presets.workload_from_table({"workload": "./x.py:build"}, "run.toml [workload]")
    assert e.value.line() == ("run.toml [workload]: workload: './x.py:build' is a relative path, and "
                              "run.toml [workload] is not a preset file it could be relative to; "
                              "expected an absolute path")


def test_the_cli_the_resume_and_the_probe_find_it_from_another_directory(home):
    """No PYTHONPATH but cockpit's own, `python -P` as the installed script, a different working
    directory for each command."""
    preset = file_preset(home, "./wl/cli_wl.py:build")
    path = write_workload(preset.parent / "wl", "cli_wl")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COCKPIT_CONFIG_DIR": str(home / "config"),
           "COCKPIT_RUNS_DIR": str(home / "runs"), "COCKPIT_CACHE_DIR": str(home / "cache")}

    def cockpit(*args: str, cwd: str) -> subprocess.CompletedProcess:
        (home / cwd).mkdir(exist_ok=True)
        return subprocess.run([sys.executable, "-P", *cockpit_cmd(*args)[1:]], capture_output=True,
                              text=True, env=env, cwd=home / cwd, timeout=300)

    sets = ["batch_size=16", "accumulation=1", "threads=1", "inject=['user-code@3']"]
    done = cockpit("--no-ui", "--workload", "filewl", "--device", "cpu",
                   *[a for s in sets for a in ("--set", s)], cwd="a")
    assert done.returncode == 1 and "crashed: user-code" in done.stdout, done.stdout + done.stderr
    (run,) = list_runs()
    assert files.read_toml(run.config_path)["workload"]["workload"] == f"{path}:build"

    done = cockpit("runs", "resume", "last", cwd="b")
    assert done.returncode == 0, done.stdout + done.stderr
    assert any(line.startswith("finished: step 32/32") for line in done.stdout.splitlines()), done.stdout

    # The probe's worker, started in c/, imports the file and builds its trainer: its
    # trainer_ready names the device. Whether a timed window then fits in its few seconds
    # depends on the machine's load (a loaded one can leave it 'rough', or 'too-slow': exit 1),
    # not on finding the file, which would make it 'unavailable' or 'crashed'.
    done = cockpit("probe", "-w", "filewl", "--presets", "cpu", "--budget", "12", "--no-threads",
                   "--set", "batch_size=16", "--set", "accumulation=1", "--json", cwd="c")
    assert done.returncode in (0, 1), done.stderr
    (candidate,) = json.loads(done.stdout)["candidates"]
    # (so loaded that it was not even ready within the budget: too-slow, no device named)
    assert candidate["status"] in ("ok", "rough", "too-slow"), candidate
    assert candidate["device"] == "cpu" or candidate["status"] == "too-slow", candidate
    if candidate["status"] == "ok":
        assert candidate["samples_per_s"] > 0


def test_the_editor_saves_a_file_workload_that_loads_from_anywhere(home):
    import tomllib

    from cockpit.app import make_app
    from test_ui_editor import _open_editor, _type
    from ui_support import run

    preset = file_preset(home, "./wl/ed_wl.py:build")
    path = write_workload(preset.parent / "wl", "ed_wl")

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await _open_editor(pilot, app, "workloads", "filewl")
            await _type(pilot, screen, "train.epochs", "3")
            assert not screen.errors
            screen._save("filewl-copy")
            await pilot.pause()

    run(drive())
    saved = home / "config" / "presets" / "workloads" / "filewl-copy.toml"
    assert tomllib.loads(saved.read_text())["workload"] == f"{path}:build"
    assert runconfig.resolve("filewl-copy", "cpu").workload.train.epochs == 3

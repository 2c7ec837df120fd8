"""Custom workloads: 'package.module:factory' and entry points, their params, the protocol check,
import errors as one line, and the example run end to end through the headless CLI."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, cockpit_cmd, user_preset
from engine import files, presets, runconfig, workloads
from engine.errors import ConfigError
from engine.record.rundir import list_runs
from engine.schema import to_table

FAKE = '''
class Fake:
    """Enough of the protocol to be accepted; never trained here (no torch needed)."""
    num_samples = 8
    def build_model(self, *, grad_checkpointing): ...
    def batch(self, indices, device): ...
    def loss(self, model, batch): ...

received = []

def build(params, seed):
    received.append((params, seed))
    return Fake()
'''


def user_module(tmp_path: Path, monkeypatch, source: str) -> str:
    """Write a module under a fresh name (sys.modules caches names) and put it on sys.path."""
    name = f"user_wl_{secrets.token_hex(4)}"
    folder = tmp_path / "mods"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(folder))
    return name


def preset_for(home: Path, workload: str, params: str = "", name: str = "mine") -> str:
    user_preset(home, "workloads", name, f'workload = "{workload}"\n[train]\nepochs = 1\n[params]\n{params}')
    return name


def test_a_declared_params_class_is_checked_like_a_builtin(home, tmp_path, monkeypatch):
    mod = user_module(tmp_path, monkeypatch, FAKE + '''
from dataclasses import dataclass
from engine.schema import setting

@dataclass(frozen=True, kw_only=True, slots=True)
class Params:
    width: int = setting(4, "model width", min=1)
    rate: float = setting(0.5, "a rate", min=0.0, max=1.0)
''')
    name = preset_for(home, f"{mod}:build", "width = 16\n")
    config = runconfig.resolve(name, "cpu", ["params.rate=0.25"])
    assert type(config.workload.params).__module__ == mod
    assert (config.workload.params.width, config.workload.params.rate) == (16, 0.25)

    workload = workloads.build(config.workload.workload, config.workload.params, 7)
    module = sys.modules[mod]
    assert module.received == [(config.workload.params, 7)]  # the Params instance and the seed
    assert workload.evaluate(None, None) == {} and workload.flops_per_sample is None  # defaults

    with pytest.raises(ConfigError, match=r"mine\.toml: params\.width: got 0, expected a positive integer"):
        runconfig.resolve(preset_for(home, f"{mod}:build", "width = 0\n"), "cpu")
    with pytest.raises(ConfigError, match=r"params\.widht: unknown key; did you mean 'params\.width'"):
        runconfig.resolve(preset_for(home, f"{mod}:build", "widht = 3\n"), "cpu")


def test_without_params_the_factory_gets_the_table_as_a_dict(home, tmp_path, monkeypatch):
    mod = user_module(tmp_path, monkeypatch, FAKE)
    name = preset_for(home, f"{mod}:build", 'hidden = 8\nlr_scale = 0.5\nkind = "a"\ntags = ["x", "y"]\n')
    config = runconfig.resolve(name, "cpu", ["params.hidden=32"])
    workloads.build(config.workload.workload, config.workload.params, 3)
    params, seed = sys.modules[mod].received[-1]
    assert params == {"hidden": 32, "lr_scale": 0.5, "kind": "a", "tags": ["x", "y"]} and seed == 3
    # run.toml round trip: the trainer rebuilds the same settings from the written table
    table = presets.workload_to_table(config.workload)
    again = presets.workload_from_table(table, "run.toml").params
    assert presets.workload_to_table(config.workload)["params"] == table["params"] == to_table(again)

    # Each key keeps the type the preset gave it, and only the preset's keys exist.
    with pytest.raises(ConfigError, match=r"params\.hidden: got 0\.5, expected an integer"):
        runconfig.resolve(name, "cpu", ["params.hidden=0.5"])
    with pytest.raises(ConfigError, match=r"params\.depth: unknown key"):
        runconfig.resolve(name, "cpu", ["params.depth=2"])
    with pytest.raises(ConfigError, match=r"params\.nested: got \{'a': 1\}, expected a number, a string"):
        runconfig.resolve(preset_for(home, f"{mod}:build", "nested = { a = 1 }\n"), "cpu")


def test_an_object_lacking_the_protocol_is_named_with_what_it_lacks(home, tmp_path, monkeypatch):
    mod = user_module(tmp_path, monkeypatch, '''
class Half:
    num_samples = 0
    def build_model(self, *, grad_checkpointing): ...

def build(params, seed):
    return Half()

class NoLoss:
    def __init__(self, params, seed): ...
    def build_model(self, *, grad_checkpointing): ...
    def batch(self, indices, device): ...
''')
    name = preset_for(home, f"{mod}:build")
    config = runconfig.resolve(name, "cpu")  # a function's result is known only when called
    with pytest.raises(ConfigError) as e:
        workloads.build(config.workload.workload, config.workload.params, 0)
    assert e.value.line() == (
        f"workload '{mod}:build': the Half its factory returned lacks batch(indices, device), "
        "loss(model, batch), num_samples (a positive int, got 0); a workload needs num_samples, "
        "build_model, batch and loss (see engine/workloads/custom.py)")
    # A class is checked when the preset is read, before any run starts.
    with pytest.raises(ConfigError, match=rf"'{mod}:NoLoss': class NoLoss lacks loss\(model, batch\)"):
        runconfig.resolve(preset_for(home, f"{mod}:NoLoss"), "cpu")


@pytest.mark.parametrize("source, attr, message", [
    ("def build(params):\n    return 1\n", "build",
     r"'{mod}:build' cannot be called as factory\(params, seed\); its signature is \(params\)"),
    ("build = 3\n", "build", r"'{mod}:build' is a int, expected a factory called as factory\(params, seed\)"),
    ("raise RuntimeError('no GPU here')\n", "build",
     r"'{mod}:build': importing {mod} raised RuntimeError: no GPU here"),
    (FAKE + "Params = dict\n", "build", r"{mod}\.Params is not a dataclass"),
])
def test_bad_factories_are_one_clear_error(home, tmp_path, monkeypatch, source, attr, message):
    mod = user_module(tmp_path, monkeypatch, source)
    with pytest.raises(ConfigError, match=message.format(mod=mod)):
        runconfig.resolve(preset_for(home, f"{mod}:{attr}"), "cpu")


def test_an_entry_point_names_a_workload(home, tmp_path, monkeypatch):
    mod = user_module(tmp_path, monkeypatch, FAKE)
    dist = tmp_path / "mods" / "cockpit_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: cockpit-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[cockpit.workloads]\ndemo-fake = {mod}:build\n")
    config = runconfig.resolve(preset_for(home, "demo-fake", "n = 2\n"), "cpu")
    workloads.build(config.workload.workload, config.workload.params, 0)
    assert sys.modules[mod].received[-1] == ({"n": 2}, 0)
    with pytest.raises(ConfigError, match=r"got 'demo-fak', expected one of 'matmul', .*'\./file\.py:factory' "
                                          r"or 'package\.module:factory' for your own workload, or an entry point in group "
                                          r"'cockpit\.workloads' \('demo-fake'\)"):
        runconfig.resolve(preset_for(home, "demo-fak"), "cpu")


def test_checking_a_custom_preset_imports_torch_only_if_the_module_does(home, tmp_path, monkeypatch):
    mod = user_module(tmp_path, monkeypatch, FAKE)
    name = preset_for(home, f"{mod}:build", "n = 1\n")
    code = (f"from engine import runconfig; runconfig.resolve({name!r}, 'cpu'); import sys; "
            "print('torch' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path / "mods")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- through the real CLI


def cli_env(home: Path, *pythonpath: Path, config_dir: Path | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in (ROOT, *pythonpath)),
            "COCKPIT_CONFIG_DIR": str(config_dir or home / "config"),
            "COCKPIT_RUNS_DIR": str(home / "runs")}


@pytest.mark.parametrize("source, spec, message", [
    (None, "not_there_at_all:build",
     "workload: 'not_there_at_all:build': no module named 'not_there_at_all' on the Python path; "
     "add its directory to PYTHONPATH or install its package"),
    ("def build(params, seed)\n    return 1\n", "{mod}:build",
     "workload: '{mod}:build': syntax error in {path}, line 1: expected ':'"),
    ("def buidl(params, seed):\n    return 1\n", "{mod}:build",
     "workload: '{mod}:build': {mod} ({path}) has no attribute 'build'; did you mean 'buidl'?"),
])
def test_import_errors_are_one_line_and_exit_2(home, tmp_path, source, spec, message):
    mod = f"cli_wl_{secrets.token_hex(4)}"
    path = tmp_path / "mods" / f"{mod}.py"
    if source is not None:
        path.parent.mkdir()
        path.write_text(source)
    preset_for(home, spec.format(mod=mod))
    done = subprocess.run(cockpit_cmd("--no-ui", "--workload", "mine", "--device", "cpu"), capture_output=True,
                          text=True, env=cli_env(home, tmp_path / "mods"), timeout=60)
    assert done.returncode == 2
    where = home / "config" / "presets" / "workloads" / "mine.toml"
    assert done.stderr == f"cockpit: {where}: {message.format(mod=mod, path=path)}\n"
    assert not list_runs()  # nothing was written


def test_the_example_runs_end_to_end_and_the_trainer_imports_the_module_the_cli_checked(home, tmp_path):
    # A decoy of the same name in the working directory: a child that put its working
    # directory on sys.path (as `python -m` does) would import it and fail.
    (tmp_path / "sine_workload.py").write_text("raise RuntimeError('the decoy was imported')\n")
    # The documented way: PYTHONPATH=examples COCKPIT_CONFIG_DIR=examples cockpit --no-ui --workload sine
    env = cli_env(home, ROOT / "examples", config_dir=ROOT / "examples")
    sets = ["batch_size=64", "accumulation=1", "params.samples=1024", "train.epochs=6", "threads=1",
            "train.report_every_s=0.2"]
    # -P: like the installed console script, the CLI does not see its working directory.
    done = subprocess.run([sys.executable, "-P", *cockpit_cmd("--no-ui", "--workload", "sine", "--device",
                                                              "cpu", *[a for s in sets for a in ("--set", s)])[1:]],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    last = next(line for line in done.stdout.splitlines() if line.startswith("finished: "))
    assert last.startswith("finished: step 96/96"), last
    r2 = float(re.search(r"r2 ([0-9.]+)", last).group(1))
    assert r2 > 0.9, last  # predicting the mean scores 0
    (run,) = list_runs()
    assert files.read_toml(run.config_path)["workload"]["workload"] == "sine_workload:build"
    assert "decoy" not in run.attempt_log(1).read_text()


def test_a_workload_that_lacks_a_method_exits_2_naming_it(home, tmp_path):
    """The protocol of what a factory returns can only be checked by building it, in the
    trainer; the run still ends as bad input: exit 2, with the line that says what is missing."""
    mod = f"cli_wl_{secrets.token_hex(4)}"
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / f"{mod}.py").write_text(
        "class Half:\n    num_samples = 8\n    def build_model(self, *, grad_checkpointing): ...\n"
        "def build(params, seed):\n    return Half()\n")
    preset_for(home, f"{mod}:build")
    done = subprocess.run(cockpit_cmd("--no-ui", "--workload", "mine", "--device", "cpu"), capture_output=True,
                          text=True, env=cli_env(home, tmp_path / "mods"), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"workload '{mod}:build': the Half its factory returned lacks batch(indices, device), " \
           "loss(model, batch)" in done.stdout
    assert "run failed: 1 attempt (cpu: config)" in done.stdout


def test_a_workload_of_the_users_own_ends_as_python_ends(home, tmp_path):
    """The trainer of a built-in workload leaves without the interpreter's slow teardown
    (engine.train.trainer.ending); a workload of the user's own keeps Python's whole end: what it
    registered with atexit (a logger's flush, wandb.finish) runs, a file it never closed is
    flushed."""
    (tmp_path / "hooked.py").write_text(textwrap.dedent(f"""\
        import atexit
        import torch
        from torch import nn

        class Data:
            num_samples = 32
            def __init__(self, seed):
                self.x = torch.randn(32, 4, generator=torch.Generator().manual_seed(seed))
            def build_model(self, *, grad_checkpointing):
                return nn.Linear(4, 1)
            def batch(self, indices, device):
                return self.x[indices].to(device)
            def loss(self, model, batch):
                LOG.write("loss\\n")   # buffered, never flushed nor closed by the workload
                return model(batch).pow(2).mean()

        LOG = open({str(tmp_path / "log")!r}, "w")

        def build(params, seed):
            atexit.register(lambda: open({str(tmp_path / "ended")!r}, "a").write("flushed\\n"))
            return Data(seed)
        """))
    user_preset(home, "workloads", "hooked", f'workload = "{tmp_path / "hooked.py"}:build"\n[train]\nepochs = 1\n')
    sets = [a for o in ("batch_size=8", "accumulation=1", "threads=1") for a in ("--set", o)]
    done = subprocess.run(cockpit_cmd("--no-ui", "-w", "hooked", "-d", "cpu", *sets), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (tmp_path / "ended").read_text() == "flushed\n"
    assert (tmp_path / "log").read_text().count("loss\n") >= 4   # every step's, 32 samples in 8s

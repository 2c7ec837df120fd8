"""The one-way arrow and the fast paths: engine never pulls in the UI, --help never torch."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from conftest import ROOT, TINY, child_env


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "; import sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, env=child_env(), check=True, cwd=ROOT)
    return set(out.stdout.split())


def test_engine_does_not_import_textual():
    mods = _modules_after("import engine, engine.run.supervisor, engine.record.rundir, engine.train.trainer, "
                          "engine.probe.worker, engine.probe.speed, engine.probe.batch")
    assert "torch" in mods  # the trainer really was imported
    assert not any(m == "textual" or m.startswith(("textual.", "cockpit", "rich")) for m in mods)


def test_help_and_presets_do_not_import_torch():
    mods = _modules_after("from cockpit.cli import build_parser; build_parser(); "
                          "from engine import presets, runconfig; runconfig.resolve('matmul', 'cpu')")
    assert "torch" not in mods


def test_the_supervisor_of_a_cpu_run_never_imports_torch(home):
    """Its trainer imports its own; the supervisor's would be a second of CPU at every start and
    some 200 MB held for the run. The preset is still judged before anything is written."""
    sets = ", ".join(f"'--set', '{o}'" for o in TINY)
    mods = _modules_after("import contextlib, io; from cockpit.cli import main\n"   # its output apart
                          "with contextlib.redirect_stdout(io.StringIO()):\n"
                          f"    code = main(['--no-ui', '-w', 'matmul', '-d', 'cpu', {sets}])\n"
                          "assert code == 0, code")
    assert "torch" not in mods and "engine.run.supervisor" in mods
    (ran,) = (home / "runs").iterdir()
    refused = subprocess.run([sys.executable, "-m", "cockpit", "--no-ui", "-w", "matmul", "-d", "cpu",
                              "--set", "precision=fp16"], capture_output=True, text=True, env=child_env())
    assert refused.returncode == 2 and "precision" in refused.stderr and "'fp16' needs CUDA" in refused.stderr
    assert list((home / "runs").iterdir()) == [ran]   # nothing written for the refused one


def test_a_cached_probe_answers_without_torch():
    """The launch screen's probe line and a cache lookup stay light: no torch."""
    mods = _modules_after("from engine.probe import cache, candidates, speed, batch, measure; "
                          "from engine.monitor.machine import machine; "
                          "from engine import runconfig; c = runconfig.resolve('matmul', 'auto'); "
                          "cands = candidates.build(c.workload, devices=[], preset_names=[], base='auto', "
                          "overrides=[]); cache.key(machine(), c.workload, cands, 60); "
                          "cache.latest(); import cockpit.ui.probe")
    assert "torch" not in mods


def test_every_package_is_in_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for top in ("engine", "cockpit")
             for p in (ROOT / top).rglob("__init__.py")}
    assert found <= listed, f"add to pyproject's packages: {sorted(found - listed)}"


def test_the_layers_hold():
    """pyproject.toml's import-linter contract: each layer imports only from those below it,
    and the engine never from a front end (docs/ARCHITECTURE.md draws them)."""
    lint = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                           "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True))"],
                          capture_output=True, text=True, env=child_env(), cwd=ROOT)
    assert lint.returncode == 0, lint.stdout[-3000:] + lint.stderr[-2000:]

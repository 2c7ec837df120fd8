"""A device preset's [slurm] table (engine.preset_types.SlurmSettings): the job `cockpit submit`
asks SLURM for, its flags overriding each key. Read by engine.schema's nested tables: bad keys
and values are one line naming the file and the dotted key; `--set slurm.partition=...`, `presets
show`, saved presets, run.toml and the editor keep it. No cluster is needed: the job script is
what is checked (engine.run.slurm.script), and `sbatch` here is a script that only answers a job
id, so that the real `cockpit submit` writes RUN/slurm/job.sh as it would on a cluster."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from cockpit.app import make_app
from cockpit.cli import main
from cockpit.commands import submit
from cockpit.ui.editor import EditorScreen
from conftest import child_env, cockpit_cmd, user_preset
from engine import presets, runconfig
from engine.errors import ConfigError
from engine.preset_types import DevicePreset, SlurmSettings
from engine.record.rundir import RunDir, find_run
from engine.run import slurm
from engine.schema import to_table
from ui_support import run as run_ui

SMALL = ["--set", "params.n=16"]
GPU_JOB = """description = "a GPU partition's job"
device = "cpu"

[slurm]
time = "2:00:00"
partition = "gpu"
account = "proj-7"
gpus_per_node = 2
warning_s = 300
"""


def sbatch_lines(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH ")]


@pytest.fixture
def sbatch(tmp_path, monkeypatch) -> Path:
    """An `sbatch` first on PATH that answers job 4242 and keeps nothing: what cockpit submit
    wrote is RUN/slurm/job.sh."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text("#!/bin/sh\necho 4242\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return fake


def submitted(capsys, *args: str) -> tuple[RunDir, list[str]]:
    """`cockpit submit ARGS` in this process: the run and its job script's #SBATCH lines."""
    assert main(["submit", "-w", "matmul", *SMALL, *args]) == 0, capsys.readouterr().err
    run = find_run(capsys.readouterr().out.strip())
    return run, sbatch_lines((run.path / "slurm" / "job.sh").read_text())


# ---------------------------------------------------------------- into the job script


def test_the_presets_slurm_table_is_the_jobs_sbatch_lines(home, sbatch, capsys):
    user_preset(home, "devices", "gpu-job", GPU_JOB)
    run, lines = submitted(capsys, "-d", "gpu-job")
    for line in ("#SBATCH --time=2:00:00", "#SBATCH --partition=gpu", "#SBATCH --account=proj-7",
                 "#SBATCH --gpus-per-node=2", "#SBATCH --signal=B:USR1@300"):
        assert line in lines
    # run.toml keeps the table as the job asked for it
    assert run.config().device.slurm == SlurmSettings(time="2:00:00", partition="gpu", account="proj-7",
                                                      gpus_per_node=2, warning_s=300)


def test_each_flag_overrides_its_key_and_the_rest_of_the_table_stays(home, sbatch, capsys):
    user_preset(home, "devices", "gpu-job", GPU_JOB)
    run, lines = submitted(capsys, "-d", "gpu-job", "--partition", "debug", "--warning", "60",
                           "--gpus-per-node", "0")
    assert "#SBATCH --partition=debug" in lines and "#SBATCH --signal=B:USR1@60" in lines
    assert not any(line.startswith("#SBATCH --partition=gpu") for line in lines)
    assert not any("--gpus-per-node" in line for line in lines)           # 0 given: none asked
    assert "#SBATCH --time=2:00:00" in lines and "#SBATCH --account=proj-7" in lines   # the preset's
    slurm_table = tomllib.loads(run.config_path.read_text())["device"]["slurm"]
    assert slurm_table == {"time": "2:00:00", "partition": "debug", "account": "proj-7",
                           "gpus_per_node": 0, "warning_s": 60}


def test_what_neither_sets_keeps_the_defaults(home, sbatch, capsys):
    _, lines = submitted(capsys, "-d", "cpu")
    assert f"#SBATCH --signal=B:USR1@{slurm.WARNING_S}" in lines
    assert not [line for line in lines if line.split("=")[0] in (
        "#SBATCH --time", "#SBATCH --partition", "#SBATCH --account", "#SBATCH --gpus-per-node")]


def test_gpus_per_node_auto_is_a_gpu_per_process_on_cuda_and_none_elsewhere():
    on_cuda = DevicePreset(device="cuda", nproc_per_node=4)
    assert submit.job_spec(on_cuda).gpus_per_node == 4
    assert submit.job_spec(DevicePreset(device="cpu", nproc_per_node=4)).gpus_per_node == 0
    fixed = DevicePreset(device="cuda", nproc_per_node=4, slurm=SlurmSettings(gpus_per_node=1))
    assert submit.job_spec(fixed).gpus_per_node == 1


def test_set_reaches_a_key_of_the_table(home, sbatch, capsys):
    user_preset(home, "devices", "gpu-job", GPU_JOB)
    run, lines = submitted(capsys, "-d", "gpu-job", "--set", "slurm.partition=long",
                           "--set", "device.slurm.time=1-00:00:00")
    assert "#SBATCH --partition=long" in lines and "#SBATCH --time=1-00:00:00" in lines
    assert run.config().device.slurm.account == "proj-7"


def test_the_script_has_the_partition_of_the_spec_built_from_the_preset(home):
    device = presets.device_from_table(tomllib.loads(GPU_JOB), "gpu-job.toml")
    config = runconfig.resolve("matmul", "cpu", ["params.n=16"])
    run = RunDir.create(config)
    assert "#SBATCH --partition=gpu" in sbatch_lines(slurm.script(run, submit.job_spec(device)))


# ---------------------------------------------------------------- bad input, one line


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(cockpit_cmd(*args), capture_output=True, text=True, timeout=120, env=child_env())


@pytest.mark.parametrize("table, said", [
    ('[slurm]\npartiton = "gpu"', "slurm.partiton: unknown key; did you mean 'slurm.partition'?"),
    ('[slurm]\ntime = "an hour"', "slurm.time: got 'an hour', expected a SLURM time limit"),
    ("[slurm]\nwarning_s = 0", "slurm.warning_s: got 0, expected a positive integer"),
    ("[slurm]\ngpus_per_node = -1", "slurm.gpus_per_node: got -1, expected an integer >= 0 or 'auto'"),
    ('slurm = "gpu"', "slurm: got 'gpu', expected a table of time, partition"),
    ('partition = "gpu"', "partition: unknown key; did you mean 'slurm.partition'?"),
    ("[slurm]\nbatch_size = 8", "slurm.batch_size: unknown key; batch_size belongs at the top level, not in [slurm]"),
])
def test_a_bad_table_is_one_line_naming_the_file_and_key_exit_2(home, table, said):
    path = user_preset(home, "devices", "bad-job", f'device = "cpu"\n{table}\n')
    done = cli("submit", "-w", "matmul", "-d", "bad-job")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"cockpit: {path}: {said}")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert not (home / "runs").exists() or not list((home / "runs").iterdir())


def test_a_bad_time_flag_is_refused_by_the_same_check_as_the_presets(home):
    done = cli("submit", "-w", "matmul", "-d", "cpu", "--time", "an hour")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "--time: an hour: " + SlurmSettings.time_problem("an hour") in done.stderr
    with pytest.raises(ConfigError, match="--set: device.slurm.time: got '1h'"):
        runconfig.resolve("matmul", "cpu", ["slurm.time=1h"])
    for good in ("90", "2:00:00", "1-12", "1-12:30", "1-12:30:00", "30:00"):
        assert SlurmSettings(time=good).time == good


def test_a_mistyped_set_key_of_the_table_is_pointed_to_it():
    for key in ("slurm.partiton", "device.slurm.partiton", "partition"):
        with pytest.raises(ConfigError, match=f"--set: {key}: unknown key; did you mean 'device.slurm.partition'"):
            runconfig.resolve("matmul", "cpu", [f"{key}=gpu"])


# ---------------------------------------------------------------- round trips


def test_presets_show_and_a_saved_preset_keep_the_table(home):
    path = user_preset(home, "devices", "gpu-job", GPU_JOB)
    done = cli("presets", "show", "gpu-job")
    assert done.returncode == 0, done.stderr
    shown = tomllib.loads(done.stdout)
    assert shown["slurm"] == tomllib.loads(GPU_JOB)["slurm"]
    assert presets.device_from_table(shown, "shown") == presets.load_device("gpu-job")
    # saved again under a new name: the same preset, the table in it
    saved = presets.save_user_preset("devices", "gpu-job-2", shown)
    assert tomllib.loads(saved.read_text())["slurm"]["partition"] == "gpu"
    assert presets.load_device("gpu-job-2") == presets.load_device("gpu-job") != presets.load_device("cpu")
    assert path.read_text() == GPU_JOB    # showing and saving never wrote the preset itself


def test_a_preset_without_the_table_shows_its_defaults_and_reads_back_the_same(home):
    table = to_table(presets.load_device("cpu"))
    assert table["slurm"] == {"time": "", "partition": "", "account": "", "gpus_per_node": "auto",
                              "warning_s": slurm.WARNING_S}
    assert presets.device_from_table(table, "cpu") == presets.load_device("cpu")


def test_run_toml_keeps_the_table(home):
    user_preset(home, "devices", "gpu-job", GPU_JOB)
    config = runconfig.resolve("matmul", "gpu-job", ["params.n=16"])
    run = RunDir.create(config)
    assert tomllib.loads(run.config_path.read_text())["device"]["slurm"]["partition"] == "gpu"
    assert run.config() == config


# ---------------------------------------------------------------- the editor


def test_the_editor_shows_the_tables_keys_as_rows_and_saves_the_table(home):
    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            app.push_screen(EditorScreen("devices", "cpu"))
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, EditorScreen)
            keys = [s.key for s in screen.specs]
            first = keys.index("slurm.time")
            assert keys[first:first + 5] == ["slurm.time", "slurm.partition", "slurm.account",
                                             "slurm.gpus_per_node", "slurm.warning_s"]
            assert "slurm" not in keys
            time_field = screen.query_one("#field-slurm__time")
            time_field.value = "an hour"
            await pilot.pause()
            assert set(screen.errors) == {"slurm.time"}
            assert "expected a SLURM time limit" in str(screen.query_one("#note-slurm__time").render())
            time_field.value = "4:00:00"
            screen.query_one("#field-slurm__partition").value = "gpu"
            await pilot.pause()
            assert not screen.errors
            assert "slurm.partition  → gpu" in str(screen.query_one("#editor-head").render())
            await pilot.press("ctrl+s")
            await pilot.pause()

    run_ui(drive())
    saved = tomllib.loads((home / "config" / "presets" / "devices" / "cpu.toml").read_text())
    assert saved["slurm"] == {"time": "4:00:00", "partition": "gpu", "account": "",
                              "gpus_per_node": "auto", "warning_s": slurm.WARNING_S}
    assert presets.load_device("cpu").slurm.partition == "gpu"

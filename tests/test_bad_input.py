"""Bad input, as a new user or an adversary gives it: each case is one line naming the file or
argument and the key, exit 2, no traceback, nothing written; a broken preset or run dir is
listed as broken beside the others; a closed stdout ends quietly."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import ROOT, TINY, child_env, cockpit_cmd, user_preset
from cockpit.cli import main
from engine import runconfig
from engine.errors import ConfigError
from engine.run.events import EventWriter
from engine.run.digest import RunDigests
from engine.run.rundir import RunDir, list_runs, summarize
from engine.train.data import SampleOrder


def bad_input(capsys, *args: str) -> str:
    """Run the CLI in-process; assert it refused the input the one way, and return the line."""
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert out == "" and err.count("\n") == 1 and err.startswith("cockpit: "), err
    return err


@pytest.mark.parametrize("data, words", [
    (b"\xff\xfe\x00\x01binary", "is not UTF-8 text (byte 0xff at offset 0)"),
    ('description = "café"\n'.encode("latin-1"), "is not UTF-8 text (byte 0xe9 at offset 18)"),
    (("a = " + "{ b = " * 3000 + "1" + " }" * 3000 + "\n").encode(), "nests tables or arrays too deeply"),
    (("a = " + "[" * 3000 + "]" * 3000 + "\n").encode(), "nests tables or arrays too deeply"),
    (b"", "has no settings; expected at least one key"),
    (b"# only a comment\n\n", "has no settings"),
    (b"# " + b"x" * (1 << 20) + b"\n", "is larger than 1 MiB"),
    (b"env = { A = 1 }\n", "env.A: got 1, expected a string"),
    (b"env = 4\n", "env: got 4, expected a table of string values"),
    (b'env = "A=1"\n', "env: got 'A=1', expected a table of string values"),
    (b'rules = "abc"\n', "rules: got 'abc', expected a table of string values"),
    (b"rules = { oom = 3 }\n", "rules.oom: got 3, expected a string"),
    (b"threads = 100000\n", "threads: got 100000, expected 0 (torch's default) to 1024: threads "
                            "beyond the cores only slow torch down"),
])
def test_a_bad_device_preset_file_is_one_line_naming_it(home, capsys, data, words):
    path = user_preset(home, "devices", "bad", "")
    path.write_bytes(data)
    line = bad_input(capsys, "--no-ui", "--device", "bad")
    assert f"{path}: " in line and words in line
    assert not (home / "runs").exists()
    assert path.read_bytes() == data
    assert bad_input(capsys, "presets", "show", "bad") == line


def test_a_preset_linked_to_an_endless_file_is_refused_unread(home, capsys):
    path = user_preset(home, "devices", "zero", "")
    path.unlink()
    path.symlink_to("/dev/zero")
    assert f"{path}: is not a regular file" in bad_input(capsys, "--no-ui", "--device", "zero")


def test_an_empty_workload_preset_is_refused_naming_the_file(home, capsys):
    path = user_preset(home, "workloads", "blank", "")
    assert f"{path}: has no settings" in bad_input(capsys, "--no-ui", "--workload", "blank", "--device", "cpu")


@pytest.mark.parametrize("override, words", [
    ("device.env=4", "--set: device.env: got 4, expected a table of string values"),
    ("device.rules=abc", "--set: device.rules: got 'abc', expected a table of string values"),
    ("device.env={ A = 1 }", "--set: device.env.A: got 1, expected a string"),
    ("device.env=" + "[" * 3000, "--set: device.env: got '[[["),
    ('device.fallback=["cpu"]', "--set: device.fallback: names 'cpu' itself; expected other presets"),
    ('device.fallback=["nope"]', "--set: device.fallback: 'nope': device preset 'nope': not found"),
    ("threads=100000", "--set: device.threads: got 100000, expected 0 (torch's default) to 1024"),
    (f"train.seed={2**64}", f"--set: train.seed: got {2**64}, expected an integer from 0 to {2**64 - 1}"),
    ("train.seed=-1", "--set: train.seed: got -1, expected an integer from 0 to"),
    ("batch_size=100000", "device preset 'cpu': batch_size: 100000 x accumulation 64 = 6400000 samples "
                          "per optimizer step, but the data set has 8192; expected at most 8192"),
    ("params.samples=100", "device preset 'cpu': batch_size: 8 x accumulation 64 = 512 samples per "
                           "optimizer step, but the data set has 100"),
])
def test_a_bad_override_is_one_line_naming_the_argument_and_key(home, capsys, override, words):
    line = bad_input(capsys, "--no-ui", "--workload", "matmul", "--device", "cpu", "--set", override)
    assert words in line
    assert ".toml" not in line  # the argument is to blame, not a preset file
    assert not (home / "runs").exists()


def test_bounds_keep_every_sane_value(home):
    config = runconfig.resolve("matmul", "cpu", [f"train.seed={2**64 - 1}", "threads=1024",
                                                 "batch_size=8192", "accumulation=1"])
    assert config.workload.train.seed == 2**64 - 1 and config.device.threads == 1024
    # the data order takes any 64-bit seed (seed x 1_000_003 no longer overflows manual_seed)
    assert len(SampleOrder(10, 2**64 - 1).indices(0, 25)) == 25


def test_a_ladder_from_the_preset_file_is_still_the_file_s_to_fix(home):
    path = user_preset(home, "devices", "loop", 'device = "cpu"\nfallback = ["loop"]\n')
    with pytest.raises(ConfigError) as err:
        runconfig.resolve("matmul", "loop", ["batch_size=4"])
    assert err.value.line().startswith(f"{path}: fallback: names 'loop' itself")


def test_a_batch_larger_than_the_data_set_is_refused_by_the_trainer_too(home):
    """Where only the built workload knows its size, the trainer refuses it as a config error."""
    from engine.train.trainer import Trainer

    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY))  # 256 samples, 8 x 4 a step
    _, preset = runconfig.apply_overrides(run.config().workload, run.config().device, ["batch_size=100"])
    with pytest.raises(ConfigError) as err:
        Trainer(run, EventWriter(run.events_path, attempt=1), "cpu", preset)
    assert err.value.line().startswith("device preset 'cpu': batch_size: 100 x accumulation 4 = 400 "
                                       "samples per optimizer step, but the data set has 256")


def test_a_custom_workload_smaller_than_a_step_fails_as_config_exit_2(home):
    env = {**child_env(), "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples")]),
           "COCKPIT_CONFIG_DIR": str(ROOT / "examples")}
    done = subprocess.run(cockpit_cmd("--no-ui", "--workload", "sine", "--device", "cpu",
                                      *[a for s in ("batch_size=64", "accumulation=1", "threads=1",
                                                    "params.samples=32") for a in ("--set", s)]),
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "device preset 'cpu': batch_size: 64 = 64 samples per optimizer step, but the data set " \
           "has 32" in done.stdout
    assert "run failed: 1 attempt (cpu: config)" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_presets_list_shows_a_broken_preset_as_broken_and_lists_the_rest(home, capsys):
    user_preset(home, "devices", "latin", "").write_bytes('description = "café"\n'.encode("latin-1"))
    user_preset(home, "devices", "typo", 'device = "cpu"\nbatch_sise = 4\n')
    user_preset(home, "workloads", "blank", "")
    user_preset(home, "devices", "fine", 'description = "mine"\ndevice = "cpu"\n')
    assert main(["presets", "list"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert {"matmul", "cpu", "mps-safe", "fine"} <= set(lines) and "mine" in lines["fine"]
    assert "BROKEN: " in lines["latin"] and "latin.toml: is not UTF-8 text" in lines["latin"]
    assert "typo.toml: batch_sise: unknown key" in lines["typo"]
    assert "blank.toml: has no settings" in lines["blank"]
    assert "BROKEN" not in lines["cpu"] + lines["matmul"] + lines["fine"]
    assert main(["presets", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    errors = {p["name"]: p["error"] for kind in listed.values() for p in kind}
    assert errors["cpu"] is None and "is not UTF-8 text" in errors["latin"]


def _run(status: str = "finished") -> RunDir:
    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY))
    with EventWriter(run.events_path, attempt=0) as events:
        events.emit("run_started", run=run.id, workload="matmul", device_preset="cpu")
        events.emit("run_finished", status=status)
    return run


def test_runs_list_shows_a_broken_run_dir_as_broken_and_lists_the_rest(home, capsys):
    good = _run()
    latin = _run()
    latin.config_path.write_bytes('workload_preset = "café"\n'.encode("latin-1"))
    no_t = _run()
    with open(no_t.events_path, "a") as f:
        f.write(json.dumps({"type": "run_started", "run": no_t.id}) + "\n")
    no_step = _run()
    with open(no_step.events_path, "a") as f:
        f.write(json.dumps({"type": "step", "t": 1.0}) + "\n")
    assert summarize(good).status == "finished" and summarize(good).error is None
    assert main(["runs", "list"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(rows) == {r.id for r in list_runs()} and "finished" in rows[good.id]
    assert f"broken      {latin.config_path}: is not UTF-8 text" in rows[latin.id]
    assert f"broken      {no_t.events_path}: an event lacks 't'" in rows[no_t.id]
    assert f"{no_step.events_path}: an event lacks 'step'" in rows[no_step.id]
    assert summarize(no_t).workload == "matmul"
    line = bad_input(capsys, "runs", "show", no_t.id)
    assert f"run {no_t.id}: is broken: {no_t.events_path}: an event lacks 't'" in line


def test_a_step_that_is_not_a_number_breaks_only_its_own_run(home, capsys):
    """Well-formed JSON, a step of "x": that run is broken for the digest (the runs screen,
    `runs compare`) as for summarize() (`runs list`), and the runs beside it are still read."""
    good, other = _run(), _run()
    bad = _run()
    with open(bad.events_path, "a") as f:
        f.write(json.dumps({"type": "step", "t": 1.0, "step": "x", "window_s": 1.0,
                            "samples_per_s": 2.0}) + "\n")
    digests = {d.run.id: d for d in RunDigests().refresh()}
    assert digests[good.id].summary.status == "finished" and digests[other.id].summary.error is None
    s = digests[bad.id].summary
    assert s.status == "broken" and s.workload == "matmul"
    assert s.error == summarize(bad).error and "ValueError" in s.error
    assert not digests[bad.id].refresh()      # nothing new: still broken, not read again
    with open(bad.events_path, "a") as f:     # appended to: read again from the start, still broken
        f.write(json.dumps({"type": "warning", "t": 2.0}) + "\n")
    assert digests[bad.id].refresh() and digests[bad.id].summary.status == "broken"

    assert main(["runs", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows[bad.id].split()[1] == "broken" and rows[good.id].split()[1] == "finished"
    line = bad_input(capsys, "runs", "compare", good.id, bad.id)
    assert line.startswith(f"cockpit: run {bad.id}: is broken") and "ValueError" in line
    assert main(["runs", "compare", good.id, other.id]) == 0


def test_a_closed_stdout_ends_quietly(home):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line, as after `| head -1`
    try:
        for args in (("presets", "list"), ("runs", "list"), ("--help",)):
            done = subprocess.run(cockpit_cmd(*args), stdout=write, stderr=subprocess.PIPE, text=True,
                                  env=child_env(), timeout=60)
            assert done.stderr == "", args  # no BrokenPipeError traceback, no "Exception ignored"
    finally:
        os.close(write)


def test_a_huge_preset_is_refused_after_reading_a_mebibyte(home, capsys):
    path = user_preset(home, "devices", "huge", 'device = "cpu"\n')
    with open(path, "r+b") as f:
        f.truncate(64 << 30)  # sparse: 64 GiB that a read without bound would try to hold
    assert f"{path}: is larger than 1 MiB" in bad_input(capsys, "--no-ui", "--device", "huge")

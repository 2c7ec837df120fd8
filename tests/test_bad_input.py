"""Bad input, as a new user or an adversary gives it: each case is one line naming the file or
argument and the key, exit 2, no traceback, nothing written; a broken preset or run dir is
listed as broken beside the others; a closed stdout ends quietly."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, TINY, child_env, cockpit_cmd, user_preset
from cockpit.cli import main
from engine import runconfig
from engine.errors import ConfigError
from engine.record.events import EventWriter
from engine.record.digest import RunDigests
from engine.record.rundir import RunDir, list_runs, summarize
from engine.train.data import SampleOrder


def bad_input(capsys, *args: str) -> str:
    """Run the CLI in-process; assert it refused the input the one way, and return the line."""
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 2, out + err
    assert out == "" and err.count("\n") == 1 and err.startswith("cockpit: "), err
    return err


@pytest.mark.parametrize("data, words", [
    (b"\xff\xfe\x00\x01binary", ", line 1: is not UTF-8 text (byte 0xff at column 1, offset 0"),
    # the line and key to look at, as a file saved in Latin-1 has them (issue 39)
    ('device = "cpu"\ndescription = "café"\n'.encode("latin-1"),
     ", line 2: description: is not UTF-8 text (byte 0xe9 at column 19, offset 33"),
    (('device = "cpu"\n[env]\nA = "1"\n' + "a = " + "{ b = " * 3000 + "1" + " }" * 3000 + "\n").encode(),
     ", line 4: env.a: nests tables or arrays too deeply"),
    (("a = " + "[" * 3000 + "]" * 3000 + "\n").encode(), ", line 1: a: nests tables or arrays too deeply"),
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
    assert line.startswith(f"cockpit: {path}") and words in line
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
    ("batch_size=100000", "--set: device.batch_size: 100000 x accumulation 64 = 6400000 samples per "
                          "optimizer step, but the data set has 8192; expected at most 8192"),
    ("params.samples=100", "--set: params.samples: makes a data set of 100 samples, fewer than one "
                           "optimizer step of device preset 'cpu' (8 x accumulation 64 = 512); "
                           "expected at least 512 samples"),
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
    # (who is blamed, the preset or a --set, is test_a_step_larger_than_trms_data_set_...'s)
    assert ": 100 x accumulation 4 = 400 samples per optimizer step, but the data set has 256" \
        in err.value.line()


def test_a_custom_workload_smaller_than_a_step_fails_as_config_exit_2(home):
    env = {**child_env(), "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "examples")]),
           "COCKPIT_CONFIG_DIR": str(ROOT / "examples")}
    done = subprocess.run(cockpit_cmd("--no-ui", "--workload", "sine", "--device", "cpu",
                                      *[a for s in ("batch_size=64", "accumulation=1", "threads=1",
                                                    "params.samples=32") for a in ("--set", s)]),
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    # the trainer names the --set that sized the step (issue 24), as runconfig does where it can count
    assert "--set: device.batch_size: 64 samples per optimizer step, but the data set " \
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
    assert "BROKEN: " in lines["latin"] and "latin.toml, line 1: description: is not UTF-8 text" in lines["latin"]
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
    assert f"broken      {latin.config_path}, line 1: workload_preset: is not UTF-8 text" in rows[latin.id]
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


# ---------------------------------------------------------------- what a newcomer types first


@pytest.mark.parametrize("program, words", [
    ("/no/such/binary", "run: command: '/no/such/binary' does not exist; expected an executable "
                        "file (only a bare name like 'python' is looked up on PATH)"),
    ("./nosuch", "run: command: './nosuch' does not exist in {cwd} (the command's working directory)"),
    ("./adir", "run: command: './adir' is a directory"),
    ("./script.py", "run: command: './script.py' is not executable; expected an executable file "
                    "(chmod +x ./script.py, or run it through its interpreter: python ./script.py)"),
    ("script.py", "run: command: 'script.py' was not found on PATH (a bare name is looked up on PATH "
                  "only); expected a program on PATH or a path: script.py is in {cwd}, so write "
                  "python script.py"),
    ("no-such-program-here", "run: command: 'no-such-program-here' was not found on PATH"),
])
def test_cockpit_run_of_a_missing_program_says_how_it_was_looked_for(home, capsys, monkeypatch,
                                                                     program, words):
    """A path is run as it is (never "looked in" the working directory when absolute); only a
    bare name is looked up on PATH; and the line does not say 'cockpit' twice."""
    monkeypatch.chdir(home)
    (home / "adir").mkdir()
    (home / "script.py").write_text("print('hi')\n")
    line = bad_input(capsys, "run", "--", program, "--lr", "3")
    assert words.format(cwd=home) in line and "looked in" not in line
    assert not line.startswith("cockpit: cockpit")


@pytest.mark.parametrize("command", [["runs", "show"], ["runs", "log"], ["runs", "follow"],
                                     ["runs", "stop"], ["runs", "resume"], ["runs", "compare", "last"],
                                     ["sample", "--prompt", "a"]])
@pytest.mark.parametrize("what, words", [
    ("dir", "is not a run directory"),
    ("file", "is a file, not a run directory (a run directory holds run.toml and events.jsonl)"),
    ("missing/run", "no such directory; expected a run id"),
    ("nosuchid", "not found in"),
])
def test_a_run_argument_that_is_no_run_says_what_it_is(home, capsys, command, what, words):
    """Every command that takes a RUN looks it up alike, and a directory that is there is never
    'not found': it is said not to be a run's, with what a run's directory holds."""
    _run()  # one run, so 'last' (runs compare's first) is found and the bad one is to blame
    (home / "dir").mkdir()
    (home / "dir" / "events.jsonl").write_text("")
    (home / "file").write_text("")
    ref = what if what == "nosuchid" else str(home / what)
    line = bad_input(capsys, *command[:2], ref, *command[2:]) if command[0] == "runs" else \
        bad_input(capsys, command[0], ref, *command[1:])
    assert line.startswith(f"cockpit: run: {ref}: ")
    if what == "dir":
        assert "is not a run directory (a run directory holds run.toml and events.jsonl; it has no " \
               "run.toml)" in line
    else:
        assert words in line
    assert "expected a run id, a unique prefix or end of one (cockpit runs list), 'last', or a " \
           "run directory" in line


@pytest.mark.parametrize("override, words", [
    # nothing like any key: no "did you mean" of keys only difflib finds alike (issue 39:
    # 'nosuch' got 'device.nnodes', 'train.epochs' or 'train.schedule')
    ("nosuchkey=1", "--set: nosuchkey: unknown key; known keys include "),
    ("nosuch=1", "--set: nosuch: unknown key; known keys include "),
    ("warmup=10", "--set: warmup: unknown key; did you mean 'train.warmup_steps'?"),
    ("grad_accum=4", "--set: grad_accum: unknown key; did you mean 'device.accumulation'?"),
    ("device.grad_accum=4", "--set: device.grad_accum: unknown key; did you mean 'device.accumulation'?"),
    ("device.lr=0.1", "--set: device.lr: unknown key; did you mean 'train.lr'?"),
    ("learning_rate=0.1", "--set: learning_rate: unknown key; did you mean 'train.lr'?"),
    ("train.batch_size=4", "--set: train.batch_size: unknown key; did you mean 'device.batch_size'?"),
    ("params.lr=0.1", "--set: params.lr: unknown key; did you mean 'train.lr'?"),
    ("nproc=2", "did you mean 'device.nproc_per_node'?"),
    ("training.lr=0.1", "--set: training.lr: unknown section 'training'; expected one of device, "
                        "train, params; did you mean 'train.lr'?"),
])
def test_an_unknown_set_key_gets_the_nearest_known_one_in_a_short_line(home, capsys, override, words):
    """The nearest keys, across sections, by spelling or by the name other tools give them
    (grad_accum for accumulation); never a list of every key (it was 859
    characters)."""
    line = bad_input(capsys, "--no-ui", "--workload", "matmul", "--device", "cpu", "--set", override)
    assert words in line and len(line) < 200
    assert "known keys:" not in line and line.count("device.") + line.count("train.") <= 3


def test_a_trainer_setting_given_to_a_command_says_the_command_trains_with_its_own(home, capsys):
    for override in ("lr=0.1", "train.lr=0.1", "learning_rate=0.1"):
        line = bad_input(capsys, "run", "--set", override, "--", "python", "train.py")
        assert "lr is a setting of cockpit's own trainer ([train]); a command trains with its own, " \
               "so give it in the command's arguments" in line, line


@pytest.mark.parametrize("kind, text, key, words", [
    ("devices", 'device = "cpu"\nlr = 0.1\n', "lr",
     "lr: unknown key; lr belongs in a workload preset's [train] table (train.lr with --set)"),
    ("devices", 'device = "cpu"\nlearning_rate = 0.1\n', "learning_rate",
     "unknown key; did you mean 'lr'? lr belongs in a workload preset's [train] table"),
    ("devices", 'device = "cpu"\ngrad_accum = 4\n', "grad_accum",
     "grad_accum: unknown key; did you mean 'accumulation'?"),
    ("devices", 'workload = "matmul"\n', "workload",
     "workload is a workload preset's key, and this is a device preset; workload presets go in "
     "the workloads/ folder"),
    ("workloads", 'workload = "matmul"\nlr = 0.1\n', "lr", "lr belongs in this preset's [train] table"),
    ("workloads", 'workload = "matmul"\nn = 16\n', "n", "n belongs in this preset's [params] table"),
    ("workloads", 'workload = "matmul"\ngrad_accum = 4\n', "grad_accum",
     "did you mean 'accumulation'? accumulation is a device setting: it belongs in a device preset "
     "(devices/), or device.accumulation with --set"),
    ("workloads", 'workload = "matmul"\n[train]\nbatch_size = 4\n', "train.batch_size",
     "batch_size is a device setting: it belongs in a device preset"),
    ("workloads", 'workload = "matmul"\n[params]\nlr = 0.1\n', "params.lr", "lr belongs in [train], not [params]"),
    ("workloads", 'command = ["python", "t.py"]\nlr = 0.1\n', "lr", "lr is a setting of cockpit's own trainer"),
])
def test_a_key_in_the_wrong_table_or_preset_is_pointed_where_it_belongs(home, capsys, kind, text, key, words):
    path = user_preset(home, kind, "mine", text)
    args = ("--device", "mine") if kind == "devices" else ("--workload", "mine", "--device", "cpu")
    line = bad_input(capsys, "--no-ui", *args)
    assert f"{path}: {key}: unknown key; " in line and words in line
    assert "known keys" not in line


def test_a_setting_outside_its_settings_toml_table_is_pointed_there(home):
    from engine import settings

    (home / "config").mkdir()
    for text, words in (('notify_command = "x"\n', "notify_command: unknown key; notify_command "
                                                   "belongs in the [alerts] table"),
                        ("desktp = false\n", "desktp: unknown key; did you mean 'desktop'? desktop "
                                             "belongs in the [alerts] table")):
        (home / "config" / "settings.toml").write_text(text)
        with pytest.raises(ConfigError) as err:
            settings.load()
        assert words in err.value.line()


@pytest.mark.parametrize("text, where, key, words", [
    ('device = "cpu"\nbatch_size = 4\nbatch_size = 8\n', 3, "batch_size",
     "is not valid TOML, set twice: batch_size = 8; expected each key once"),
    ('device = "cpu"\ndescription = "oops\nbatch_size = 8\n', 2, "description",
     'is not valid TOML, a string not closed on its line: description = "oops; expected a closing quote'),
    ('device = "cpu"\n[env]\nA = "1"\nA = "2"\n', 4, "env.A", "set twice: A = \"2\""),
    ('device = cpu\n', 1, "device", 'expected a quoted string (device = "cpu")'),
    ('device = "cpu"\nfallback = ["mps",\n', 2, "fallback",
     'is not valid TOML, never finished: fallback = ["mps",; expected the string, [list] or {table} closed'),
    ('device = "cpu"\nthis is no setting\n', 2, None, "this line is not valid TOML, not key = value: this is no setting"),
])
def test_a_toml_syntax_error_names_the_line_its_key_and_its_text(home, capsys, text, where, key, words):
    path = user_preset(home, "devices", "bad", text)
    line = bad_input(capsys, "--no-ui", "--device", "bad")
    assert line.startswith(f"cockpit: {path}, line {where}: " + (f"{key}: " if key else ""))
    assert words in line and "(tomllib: " in line


def test_a_step_larger_than_the_data_set_names_the_file_or_the_argument_plainly(home, capsys):
    """Never 'batch_size: 100000 = 100000 samples' (a product of one factor), and the file or
    --set that made the step is named, not the preset's name."""
    big = 100_000
    path = user_preset(home, "devices", "big", f'device = "cpu"\nbatch_size = {big}\n')
    line = bad_input(capsys, "--no-ui", "--device", "big")
    assert line.startswith(f"cockpit: {path}: batch_size: {big} samples per optimizer step, but the "
                           "data set has 8192; expected at most 8192")
    line = bad_input(capsys, "--no-ui", "--device", "cpu", "--set", "accumulation=1", "--set",
                     f"batch_size={big}")
    assert line.startswith(f"cockpit: --set: device.batch_size: {big} samples per optimizer step")
    for line in (line, bad_input(capsys, "--no-ui", "--device", "big")):
        assert f"{big} = {big}" not in line and "device preset 'big'" not in line


HUGE = 99999999999999999   # issue 39's: past what any device or data set could take


@pytest.mark.parametrize("workload", ["trm-tiny", "matmul", "clip-tiny", "twotower-small"])
def test_a_batch_past_any_device_is_refused_where_it_is_written_for_every_workload(home, capsys, workload):
    path = user_preset(home, "devices", "huge", f'device = "cpu"\nbatch_size = {HUGE}\n')
    line = bad_input(capsys, "--no-ui", "-w", workload, "-d", "huge")
    assert line == f"cockpit: {path}: batch_size: got {HUGE}, expected a positive integer up to {2**31 - 1}\n"
    assert not (home / "runs").exists()
    assert bad_input(capsys, "presets", "show", "huge") == line
    assert main(["presets", "list"]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.split()[:1] == ["huge"])
    assert f"BROKEN: {path}: batch_size: got {HUGE}" in row
    assert f"--set: device.accumulation: got {HUGE}, expected a positive integer up to" in \
        bad_input(capsys, "--no-ui", "-w", workload, "-d", "cpu", "--set", f"accumulation={HUGE}")


def test_a_step_larger_than_trms_text_can_be_is_refused_before_the_run(home, capsys):
    """trm counts its windows only once its text is read, but the text is at most corpus_bytes:
    a step larger than that is refused before any run directory, naming the file or the --set."""
    path = user_preset(home, "devices", "big", 'device = "cpu"\nbatch_size = 100000\n')
    line = bad_input(capsys, "--no-ui", "-w", "trm-tiny", "-d", "big")
    assert line == (f"cockpit: {path}: batch_size: 100000 samples per optimizer step, but the data set "
                    "has at most 15624; expected at most 15624 a step (a smaller batch_size or "
                    "accumulation, or more samples)\n")
    line = bad_input(capsys, "--no-ui", "-w", "trm-tiny", "-d", "cpu", "--set", "batch_size=100000")
    assert line.startswith("cockpit: --set: device.batch_size: 100000 x accumulation 64 = 6400000 "
                           "samples per optimizer step, but the data set has at most 15624")
    # of two --set factors, the one that made the step too large, in whatever order they came
    assert bad_input(capsys, "--no-ui", "-w", "trm-tiny", "-d", "cpu", "--set", "batch_size=8",
                     "--set", "accumulation=99999").startswith(
        "cockpit: --set: device.accumulation: 8 x accumulation 99999 ")
    assert bad_input(capsys, "--no-ui", "-w", "trm-tiny", "-d", "cpu", "--set", "params.seq_len=100000") \
        .startswith("cockpit: --set: params.seq_len: makes a data set of at most 39 samples, fewer than one "
                    "optimizer step of device preset 'cpu' (8 x accumulation 64 = 512)")
    assert not (home / "runs").exists()
    # a step the text can hold is not refused by the bound (the trainer counts the real windows)
    assert runconfig.resolve("trm-tiny", "cpu", ["batch_size=15624", "accumulation=1"]).device.batch_size == 15624


def test_a_batch_larger_than_a_built_data_set_names_the_preset_file(home):
    """Where only the built data set says it is too small, the trainer names the file to fix."""
    from engine.train.trainer import Trainer

    path = user_preset(home, "devices", "small", 'device = "cpu"\nbatch_size = 8\naccumulation = 4\n')
    run = RunDir.create(runconfig.resolve("matmul", "small", TINY[:-2]))  # 256 samples
    preset = dataclasses.replace(run.config().device, batch_size=100)
    with pytest.raises(ConfigError) as err:
        Trainer(run, EventWriter(run.events_path, attempt=1), "small", preset)
    assert err.value.line().startswith(f"{path}: batch_size: 100 x accumulation 4 = 400 samples per "
                                       "optimizer step, but the data set has 256")


def test_a_configuration_refused_in_a_run_says_why_in_runs_show(home, capsys):
    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY))
    why = "--set: device.batch_size: 200 samples per optimizer step, but the data set has 84; expected at most 84"
    with EventWriter(run.events_path, attempt=1) as events:
        events.emit("run_started", run=run.id, workload="matmul", device_preset="cpu")
        events.emit("attempt_started", preset="cpu")
        events.emit("config_error", message=why)
        events.emit("attempt_ended", preset="cpu", outcome="config", exit="exit 2", tail=why + "\n")
        events.emit("run_finished", status="failed")
    capsys.readouterr()
    assert main(["runs", "show", run.id]) == 0
    assert f"attempt 1: cpu on ?, config (exit 2), last step 0\n          {why}\n" in capsys.readouterr().out
    assert main(["runs", "show", run.id, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attempts"][0]["crash"] == why


@pytest.mark.parametrize("placed, words", [
    ("{root}/mine.toml", "device preset 'mine': not found; {root}/mine.toml is in the presets folder "
                         "itself, where nothing is read: move it to {root}/devices/mine.toml"),
    ("{root}/workloads/mine.toml", "device preset 'mine': not found; 'mine' is a workload preset "
                                   "({root}/workloads/mine.toml); if it is a device preset, move it "
                                   "to {root}/devices/mine.toml"),
    ("{root}/devices/mine.toml.txt", "not found; {root}/devices/mine.toml.txt is not read (a preset "
                                     "is a NAME.toml file): rename it to {root}/devices/mine.toml"),
])
def test_a_preset_saved_in_the_wrong_place_is_pointed_to(home, capsys, placed, words):
    root = home / "config" / "presets"
    path = Path(placed.format(root=root))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('device = "cpu"\n')
    assert words.format(root=root) in bad_input(capsys, "--no-ui", "--device", "mine")
    shown = bad_input(capsys, "presets", "show", "mine")
    if "workloads" in placed:  # there it is found, as a workload preset that has only device settings
        assert shown.startswith(f"cockpit: {path}: has device settings (device) and no workload: it "
                                "is a device preset, and those go in the devices/ folder")
    else:
        assert words.format(root=root).partition("; ")[2] in shown


def test_a_misspelt_preset_name_gets_the_nearest_and_a_workload_given_as_device_says_so(home, capsys):
    assert "device preset 'mps-saf': not found; did you mean 'mps-safe'? available: auto" in \
        bad_input(capsys, "--no-ui", "--device", "mps-saf")
    assert "device preset 'matmul': not found; 'matmul' is a workload preset (" in \
        bad_input(capsys, "--no-ui", "--device", "matmul")


def test_presets_path_names_the_subfolders_and_a_stray_preset(home, capsys):
    root = home / "config" / "presets"
    root.mkdir(parents=True)
    (root / "mine.toml").write_text('device = "cpu"\n')
    assert main(["presets", "path"]) == 0
    out = capsys.readouterr().out
    assert f"device presets:   {root / 'devices'}/NAME.toml" in out
    assert f"workload presets: {root / 'workloads'}/NAME.toml" in out
    assert f"not read: {root / 'mine.toml'} (a preset goes in devices/ or workloads/ beside it)" in out
    assert main(["presets", "list"]) == 0
    assert f"not read: {root / 'mine.toml'}" in capsys.readouterr().out


def test_adopting_pid_1_says_what_pid_1_is(home, capsys):
    from engine.run.adoption import _ancestors

    if 1 not in _ancestors():   # a PID namespace where cockpit does not run under PID 1
        pytest.skip("PID 1 is not an ancestor of this process here")
    line = bad_input(capsys, "adopt", "1")
    assert line.startswith("cockpit: PID: 1: is the system's first process (")
    assert "shell" not in line and "cockpit itself" not in line
    assert "cockpit itself" in bad_input(capsys, "adopt", str(os.getpid()))   # in-process: it is


def test_a_preset_not_found_lists_broken_ones_apart_from_those_available(home, capsys):
    user_preset(home, "devices", "huge", f'device = "cpu"\nbatch_size = {HUGE}\n')
    user_preset(home, "devices", "mine", 'device = "cpu"\n')
    line = bad_input(capsys, "--no-ui", "-d", "nosuch")
    available, _, broken = line.partition("; broken: ")
    assert "mine" in available.split("available: ")[1] and "huge" not in available
    assert broken == "huge (cockpit presets show NAME says why)\n"
    # a preset whose ladder names a missing one is broken too, and checking it ends
    user_preset(home, "devices", "ladder", 'device = "cpu"\nfallback = ["gone"]\n')
    assert "; broken: huge, ladder (" in bad_input(capsys, "--no-ui", "-d", "nosuch")

"""A Python command's spare (engine.handover): the command's own interpreter, started
while the attempt before it trains, torch imported, runs the next attempt's script or module as
`python [options] script.py ...` would: the same __name__, sys.argv, sys.path[0], __file__,
environment, exit code, traceback and death by a signal, its output in the attempt's log. End
to end, a crashed command resumes in it. Which process ran an attempt is what the script says
of itself; nothing here is timed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine import runconfig
from engine.command.interpreter import python_parts
from engine.record.rundir import RunDir
from engine.run.launch import Launch
from engine.run.launchers.command import HANDOVER, SPARE_VARYING, ahead
from engine.run.process import spawn
from engine.run.spare import Spare
from engine.run.supervisor import Supervisor
from test_recovery_fast import gone

PY = sys.executable

# What a script knows of how it was started, written where its first argument says
SHOW = textwrap.dedent("""
    \"\"\"A script that says how it was started.\"\"\"
    import json, os, sys
    import helper   # beside the script: found through sys.path[0]; it notes whether torch is loaded
    import torch
    seen = {"name": __name__, "argv": sys.argv[1:], "argv0": sys.argv[0], "path0": sys.path[0],
            "file": __file__, "env": os.environ.get("SPARE_TEST"), "attempt": os.environ.get("COCKPIT_ATTEMPT"),
            "stdin": sys.stdin.read(), "helper": helper.WHERE, "builtins": type(__builtins__).__name__,
            "pid": os.getpid(), "torch": helper.TORCH_BEFORE}
    with open(sys.argv[1], "w") as f:
        json.dump(seen, f)
    print("said", flush=True)
    how = sys.argv[2]
    if how == "raise":
        raise ValueError("the script's own error")
    if how == "wait":
        import time
        time.sleep(600)
    if how == "pickle at exit":   # after its top level returns, __main__ is still the script
        import atexit, pickle

        class Box:
            pass

        atexit.register(lambda: print("pickled", len(pickle.dumps(Box())) > 0, flush=True))
        sys.exit(0)
    sys.exit(int(how))
""")
HELPER = "import sys\nWHERE = 'beside the script'\nTORCH_BEFORE = 'torch' in sys.modules\n"


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    where = tmp_path / "scripts"
    (where / "pkg").mkdir(parents=True)
    (where / "show.py").write_text(SHOW)
    (where / "helper.py").write_text(HELPER)
    (where / "pkg" / "__init__.py").write_text("")
    (where / "pkg" / "__main__.py").write_text(SHOW)
    return where


def started(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[Spare, Launch]:
    """A spare for `argv` (its interpreter and options; handed the rest), and the launch it runs."""
    python, rest, path0 = python_parts(argv, str(cwd))
    target = rest[:2] if rest[0] == "-m" else rest[:1]
    modules = ahead(target, str(cwd))
    assert modules is not None
    spare = Spare(env, subprocess.DEVNULL, cwd=str(cwd), argv=[*python, "-c", HANDOVER.read_text(), path0, *modules],
                  runs=python, target=target, varying=SPARE_VARYING, restore_sigint=True)
    return spare, Launch(argv=argv, env={**env, "COCKPIT_ATTEMPT": "2"}, cwd=str(cwd))


def directly(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """As an attempt is started: a session of its own, SIGINT handled by default."""
    with open(log, "ab") as out:
        return spawn(argv, cwd=cwd, env={**env, "COCKPIT_ATTEMPT": "2"}, stdin=subprocess.DEVNULL,
                     stdout=out, stderr=subprocess.STDOUT, restore_sigint=True)


def comparable(seen: dict) -> dict:
    """All but the process, what it had imported, and the file each way writes to."""
    return {**{k: v for k, v in seen.items() if k not in ("pid", "torch")}, "argv": seen["argv"][1:]}


# each way a command names what it runs, and each way a script ends (two processes a case, each
# importing torch: not every pair)
@pytest.mark.parametrize("form, how", [
    ("script", "0"), ("relative script", "0"), ("linked script", "0"), ("module", "0"),
    ("script", "3"), ("script", "raise"), ("module", "raise"), ("script", "pickle at exit"),
    ("module", "pickle at exit")])
def test_a_spare_runs_the_script_as_its_interpreter_would(scripts, tmp_path, form, how):
    env = {**os.environ, "SPARE_TEST": "the command's", "COCKPIT_ATTEMPT": "1"}
    env.pop("PYTHONPATH", None)   # the helper must come from sys.path[0], as the script's
    (tmp_path / "linked.py").symlink_to(scripts / "show.py")   # sys.path[0]: the link's target's directory
    target = {"script": [str(scripts / "show.py")], "relative script": ["show.py"],
              "linked script": [str(tmp_path / "linked.py")], "module": ["-m", "pkg"]}[form]
    results = {}
    for way in ("direct", "spare"):
        out, log = tmp_path / f"{way}.json", tmp_path / f"{way}.log"
        argv = [PY, "-u", *target, str(out), how]
        if way == "direct":
            process = directly(argv, scripts, env, log)
        else:
            spare, launch = started(argv, scripts, env)
            assert spare.fits(launch)
            pid = spare.pid
            process = spare.take(launch, log)
            assert process is not None and process.pid == pid
        code = process.wait(timeout=120)
        results[way] = (code, json.loads(out.read_text()), log.read_text())
    (code, seen, log), (spare_code, spare_seen, spare_log) = results["direct"], results["spare"]
    expected = {"raise": 1, "pickle at exit": 0}.get(how)
    assert spare_code == code == (int(how) if expected is None else expected)
    assert comparable(spare_seen) == comparable(seen)
    assert seen["name"] == "__main__" and spare_seen["attempt"] == "2"   # the attempt's environment
    assert spare_seen["torch"] and not seen["torch"]   # imported ahead, and only there
    # the same output, its traceback ending in the script's own error
    assert spare_log.splitlines()[0] == log.splitlines()[0] == "said"
    assert spare_log.strip().splitlines()[-1] == log.strip().splitlines()[-1]
    if how == "pickle at exit":
        assert spare_log.strip().splitlines()[-1] == "pickled True"


def test_a_stop_reaches_the_script_as_ctrl_c_does(scripts, tmp_path):
    env = {**os.environ, "COCKPIT_ATTEMPT": "1"}
    codes = []
    for way in ("direct", "spare"):
        out, log = tmp_path / f"{way}.json", tmp_path / f"{way}.log"
        argv = [PY, str(scripts / "show.py"), str(out), "wait"]
        if way == "direct":
            process = directly(argv, scripts, env, log)
        else:
            spare, launch = started(argv, scripts, env)
            process = spare.take(launch, log)
        while not out.exists():   # it is running the script
            assert process.poll() is None, log.read_text()
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGINT)
        codes.append(process.wait(timeout=120))
        assert "KeyboardInterrupt" in log.read_text()
    assert codes[0] == codes[1] != 0


def test_a_launch_it_was_not_started_for_is_not_run_in_it(scripts, tmp_path):
    env = {**os.environ, "COCKPIT_ATTEMPT": "1"}
    argv = [PY, "-u", str(scripts / "show.py"), str(tmp_path / "x.json"), "0"]
    spare, launch = started(argv, scripts, env)
    assert not spare.fits(Launch(argv=[PY, *argv[2:]], env=launch.env, cwd=launch.cwd))          # other options
    assert not spare.fits(Launch(argv=[PY, "-u", "-B", *argv[2:]], env=launch.env, cwd=launch.cwd))
    other = scripts / "other.py"
    other.write_text(SHOW)
    assert not spare.fits(Launch(argv=[PY, "-u", str(other), *argv[3:]], env=launch.env, cwd=launch.cwd))
    assert not spare.fits(Launch(argv=argv, env={**launch.env, "OMP_NUM_THREADS": "3"}, cwd=launch.cwd))
    assert not spare.fits(Launch(argv=argv, env=launch.env, cwd=str(tmp_path)))
    assert spare.take(Launch(argv=argv, env=launch.env, cwd=str(tmp_path)), tmp_path / "log") is None
    assert spare.popen is None   # used up: ended, and the attempt starts as usual


@pytest.mark.parametrize("argv", [["bash", "train.sh"], [PY, "-c", "print(1)"], [PY, "-"],
                                  ["torchrun", "--nproc_per_node=2", "train.py"], [PY, "-mpkg"], [PY, "-u"]])
def test_what_is_not_a_python_script_or_module_gets_no_spare(argv):
    assert python_parts(argv, "/tmp") is None


def test_options_before_the_script_stay_the_interpreters():
    assert python_parts([PY, "-X", "dev", "-u", "train.py", "-X", "1"], "/work") == \
        ([PY, "-X", "dev", "-u"], ["train.py", "-X", "1"], "/work")
    assert python_parts([PY, "-m", "pkg.train", "--bs", "4"], "/work") == ([PY], ["-m", "pkg.train", "--bs", "4"], "/work")


@pytest.mark.parametrize("source, modules", [
    ('"""Trains."""\nimport os\nimport torch\nmodel = torch.nn.Linear(2, 2)\n', ["torch", "torch._dynamo"]),
    ("import math\nfrom transformers import Trainer\n", ["torch", "torch._dynamo"]),
    ("import torch\nmodel = torch.compile(torch.nn.Linear(2, 2))\n",
     ["torch", "torch._dynamo", "torch._inductor.compile_fx"]),
    # its own code runs before torch loads: it may set what torch reads as it loads
    ("import os\nos.environ['OMP_NUM_THREADS'] = '1'\nimport torch\n", None),
    ("import sys\nsys.path.insert(0, 'vendor')\nimport torch\n", None),
    ("def main():\n    import torch\nmain()\n", None),   # torch only in a function: not known
    ("import numpy\n", None),
    ("this is not Python\n", None),
])
def test_torch_is_imported_ahead_only_where_the_script_loads_it_first(tmp_path, source, modules):
    (tmp_path / "train.py").write_text(source)
    assert ahead(["train.py"], str(tmp_path)) == modules


def test_a_module_is_read_from_the_working_directory_and_an_installed_one_gets_no_spare(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text("import torch\n")
    assert ahead(["-m", "pkg.train"], str(tmp_path)) == ["torch", "torch._dynamo"]
    assert ahead(["-m", "torch.distributed.run"], str(tmp_path)) is None


# ---------------------------------------------------------------- end to end

LOOP = textwrap.dedent("""
    import json, os, sys, time
    import helper   # beside it: notes whether torch was loaded before the script's first line
    import torch   # as a training script would, before anything of its own
    out, resume = sys.argv[1], sys.argv[3] if len(sys.argv) > 3 else None
    os.makedirs(out, exist_ok=True)
    attempt = os.environ["COCKPIT_ATTEMPT"]
    with open(os.path.join(out, f"attempt-{attempt}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "torch ahead": helper.TORCH_BEFORE}, f)
    start = int(open(resume).read()) if resume else 0
    for step in range(start + 1, 61):
        time.sleep(0.05)
        print(f"step {step}/60 loss {1 / step:.4f}", flush=True)
        if step % 10 == 0:
            with open(os.path.join(out, f"ckpt-{step:03d}.txt"), "w") as f:
                f.write(str(step))
""")


def test_a_crashed_command_resumes_in_its_spare(home, tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    (tmp_path / "helper.py").write_text(HELPER)
    config = runconfig.resolve_command(
        [PY, str(tmp_path / "loop.py"), "{run_dir}/out"], "loop", "cpu",
        ["command.resume=['--resume', '{checkpoint}']", "command.checkpoints={run_dir}/out/ckpt-*.txt",
         "inject=['native-crash@30']"])
    run = RunDir.create(config)
    supervisor = Supervisor(run, poll_s=0.05, spare=True)
    assert supervisor.supervise() == "finished"
    (crash,) = [e for e in run.events() if e["type"] == "crash"]
    assert crash["kind"] == "native-crash"
    first, second = (json.loads((run.path / "out" / f"attempt-{n}.json").read_text()) for n in (1, 2))
    assert second["pid"] == supervisor.spare_pids[0] != first["pid"]   # the second ran in the spare
    assert second["torch ahead"] and not first["torch ahead"]
    steps = [e["step"] for e in run.events() if e["type"] == "step" and e.get("attempt") == 2]
    assert steps and min(steps) > 10 and steps[-1] == 60   # resumed from a checkpoint, to the end
    assert "step 60/60" in run.attempt_log(2).read_text()
    assert all(gone(pid) for pid in supervisor.spare_pids)   # the last, unused, ended with the run

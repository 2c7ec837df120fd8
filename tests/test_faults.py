"""Fault injection as the help says it works: once per run whatever preset an attempt runs,
KIND@STEP+ in every attempt down the ladder, timed faults (KIND@30s) in the trainer and in a
command, a step fault that cannot fire refused before the run starts (one line, exit 2), and
one that turns out unable to fire said when that shows."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import ROOT, TINY, child_env, cockpit_cmd, user_preset
from engine import runconfig
from engine import vocabulary
from engine.train import faults
from engine.record.rundir import RunDir, list_runs
from engine.run.supervisor import Supervisor

TRAIN = str(ROOT / "examples" / "command" / "train.py")
REPORTED = str(ROOT / "examples" / "command" / "train_reported.py")
PY = sys.executable
# Checkpoint every step, so each attempt resumes where the last one crashed.
FAST = TINY + ["train.checkpoint_every_steps=1", "train.epochs=3", "params.samples=128"]


def ladder(home: Path, first_extra: str = "") -> None:
    """Two CPU presets: 'first' (8 x 4) falls back to 'second' (4 x 8)."""
    user_preset(home, "devices", "first", 'device = "cpu"\nbatch_size = 8\naccumulation = 4\n'
                                          f'threads = 1\nfallback = ["second"]\n{first_extra}')
    user_preset(home, "devices", "second", 'device = "cpu"\nbatch_size = 4\naccumulation = 8\nthreads = 1\n')


def of_type(run: RunDir, kind: str) -> list[dict]:
    return [e for e in run.events() if e["type"] == kind]


def cockpit(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(cockpit_cmd(*args), capture_output=True, text=True, env=child_env(),
                          timeout=timeout)


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


# ---------------------------------------------------------------- down the ladder


def test_a_repeating_fault_fires_in_every_attempt_down_the_ladder_and_a_plain_one_once(home):
    """--inject's faults are the run's: oom@2 fires once (attempt 1; attempt 2 passes step 2
    again on a halved batch), native-crash@4+ in attempt 2 on 'first' and attempt 3 on
    'second', whose preset file has no fault of its own, until the ladder is exhausted."""
    ladder(home, first_extra='rules = { native-crash = "next" }\n')
    inject = runconfig.inject_override(["oom@2", "native-crash@4+"])  # what --inject becomes
    run = RunDir.create(runconfig.resolve("matmul", "first", FAST + [inject]))
    assert Supervisor(run, poll_s=0.05).supervise() == "failed"
    fired = [(e["attempt"], e["spec"]) for e in of_type(run, "fault_injected")]
    assert fired == [(1, "oom@2"), (2, "native-crash@4+"), (3, "native-crash@4+")]
    started = of_type(run, "attempt_started")
    assert [e["preset"] for e in started] == ["first", "first", "second"]
    assert [e["kind"] for e in of_type(run, "crash")] == ["oom", "native-crash", "native-crash"]
    assert of_type(run, "trainer_ready")[1]["resumed_from"]["step"] == 1  # step 2 ran again
    assert "ladder is exhausted" in of_type(run, "run_failed")[0]["reason"]


# ---------------------------------------------------------------- timed faults


def test_timed_faults_parse_and_fire_in_the_injector_by_the_attempts_clock(monkeypatch):
    assert vocabulary.parse("hang@30s") == vocabulary.Fault("hang", None, False, "hang@30s", 30.0)
    assert vocabulary.parse("nan@1.5s+") == vocabulary.Fault("nan", None, True, "nan@1.5s+", 1.5)
    for bad in ("hang@30m", "hang@s", "hang@.5s", "hang@-1s", "hang@30 s"):
        with pytest.raises(ValueError, match="KIND@SECONDSs"):
            vocabulary.parse(bad)
    # The attempt started an hour ago (its launch says so): a fault due a minute in has come,
    # one due in a day has not. after_micro_batch calls check_time between micro-batches.
    monkeypatch.setenv(faults.STARTED_ENV, repr(time.time() - 3600))
    said = []
    injector = faults.Injector(("nan@60s", "wrong-grad@86400s+", "slow@5"), "cpu",
                               lambda event, **fields: said.append(fields))
    injector.before_step(1)
    assert injector.poison_loss and not injector.wrong_grad and injector.slow_s is None
    assert said[0]["spec"] == "nan@60s" and said[0]["step"] == 1 and said[0]["at_s"] >= 3600
    injector.check_time()
    assert len(said) == 1


def test_a_timed_fault_fires_in_the_trainer_once_per_run(home):
    ladder(home)
    run = RunDir.create(runconfig.resolve("matmul", "first", FAST + [
        runconfig.inject_override(["oom@0.2s"])]))
    assert Supervisor(run, poll_s=0.05).supervise() == "finished"
    (fired,) = of_type(run, "fault_injected")
    assert fired["attempt"] == 1 and fired["at_s"] >= 0.2
    (crash,) = of_type(run, "crash")
    assert crash["kind"] == "oom"
    assert [e["outcome"] for e in of_type(run, "attempt_ended")] == ["oom", "finished"]


@pytest.mark.parametrize("fault, by, kind", [
    ("native-crash@1s", "supervisor", "native-crash"),   # a signal, delivered at its time
    ("user-code@1s", None, "user-code"),                # raised by cockpit.report in the script
])
def test_a_timed_fault_fires_in_a_command(home, fault, by, kind):
    done = cockpit("run", "-d", "cpu", "--json", "--inject", fault, "--set", "rules={native-crash='stop'}",
                   "--", PY, REPORTED, "--steps", "100000", "--step-delay", "0.01", "--out", "{run_dir}/out")
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    (run,) = list_runs()
    (fired,) = of_type(run, "fault_injected")
    assert fired["spec"] == fault and fired.get("by") == by and fired["at_s"] >= 1.0
    (crash,) = of_type(run, "crash")
    assert crash["kind"] == kind


# ---------------------------------------------------------------- faults that cannot fire


def test_a_step_past_the_end_is_refused_in_one_line(home):
    ladder(home)
    sets = [a for o in FAST for a in ("--set", o)]
    # 3 epochs of 128 samples: 12 steps of 32 on 'first', 12 on 'second' (4 x 8)
    done = cockpit("--no-ui", "--device", "first", *sets, "--inject", "native-crash@13+")
    assert done.returncode == 2 and not list_runs()
    assert done.stderr.strip().splitlines() == [
        "cockpit: --inject: native-crash@13+: step 13 is past the run's last step, 12 (384 samples "
        "in steps of 32); expected a step from 0 to 12, or a time ('native-crash@30s')"]
    # the same fault given as --set names --set, and a preset file's names the file
    done = cockpit("--no-ui", "--device", "first", *sets, "--set", "inject=['native-crash@13+']")
    assert done.returncode == 2 and done.stderr.startswith(
        "cockpit: --set: inject: native-crash@13+: step 13 is past the run's last step, 12"), done.stderr
    user_preset(home, "devices", "faulty", 'device = "cpu"\nbatch_size = 32\ninject = ["oom@13"]\n')
    done = cockpit("--no-ui", "--device", "faulty", *sets)
    assert done.returncode == 2 and "faulty.toml: inject: oom@13: step 13 is past" in done.stderr, done.stderr
    done = cockpit("run", "-d", "cpu", "--set", "command.total_steps=100", "--inject", "hang@101",
                   "--", PY, TRAIN)
    assert done.returncode == 2 and not list_runs()
    (line,) = done.stderr.strip().splitlines()
    assert "--inject: hang@101: step 101 is past the run's last step, 100 (command.total_steps)" in line


# A workload whose size only its build knows (as trm's): runconfig cannot count its steps.
SIZED_BY_ITS_DATA = """
import torch
from torch import nn


class Data:
    num_samples = 64

    def __init__(self, params, seed):
        self.x = torch.randn(64, 4, generator=torch.Generator().manual_seed(seed))

    def build_model(self, *, grad_checkpointing):
        return nn.Linear(4, 1)

    def batch(self, indices, device):
        return self.x[indices].to(device)

    def loss(self, model, batch):
        return model(batch).pow(2).mean()


def build(params, seed):
    return Data(params, seed)
"""


def test_a_step_past_the_end_of_a_workload_only_the_trainer_can_count_is_refused(home):
    """trm tells its size only once its data is built: the first attempt refuses the fault, in
    the line runconfig gives where it can count (the README's trm-tiny ran to its end with an
    oom@99999 that never fired, and nothing said so)."""
    (home / "sized.py").write_text(SIZED_BY_ITS_DATA)
    user_preset(home, "workloads", "sized", f'workload = "{home / "sized.py"}:build"\n[train]\nepochs = 1\n')
    # 64 samples in steps of 8 x 2: 4 steps
    sets = [a for o in ("batch_size=8", "accumulation=2", "threads=1") for a in ("--set", o)]
    done = cockpit("--no-ui", "-w", "sized", "-d", "cpu", *sets, "--inject", "oom@5")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert ("--inject: oom@5: step 5 is past the run's last step, 4 (64 samples in steps of 16); "
            "expected a step from 0 to 4, or a time ('oom@30s')") in done.stdout + done.stderr
    assert not of_type(list_runs()[0], "step")
    done = cockpit("--no-ui", "-w", "sized", "-d", "cpu", *sets, "--json", "--inject", "oom@4")
    assert done.returncode != 2 and "past the run's last step" not in done.stdout + done.stderr
    fired = [json.loads(line) for line in done.stdout.splitlines() if '"fault_injected"' in line]
    assert [(e["spec"], e["step"]) for e in fired] == [("oom@4", 4)]  # the last step can fire
    # A fallback's smaller step reaches further: a fault for its attempt is no mistake.
    user_preset(home, "devices", "big", 'device = "cpu"\nbatch_size = 8\naccumulation = 2\nthreads = 1\n'
                                        'fallback = ["small"]\n')
    user_preset(home, "devices", "small", 'device = "cpu"\nbatch_size = 4\naccumulation = 1\nthreads = 1\n')
    done = cockpit("--no-ui", "-w", "sized", "-d", "big", "--inject", "oom@16")
    assert done.returncode == 0 and "past the run's last step" not in done.stdout + done.stderr
    done = cockpit("--no-ui", "-w", "sized", "-d", "big", "--inject", "oom@17")
    assert done.returncode == 2 and "step 17 is past the run's last step, 16 (64 samples in steps " \
        "of 4)" in done.stdout


def test_a_reported_fault_in_a_python_that_cannot_import_cockpit_is_refused(home, tmp_path):
    path = script(tmp_path, """\
        import time
        for step in range(1, 201):
            print(f"step {step}/200 loss={1 / step}", flush=True)
            time.sleep(0.05)
    """)
    # -I -S: no PYTHONPATH, no site-packages: what a Python of another environment sees
    done = cockpit("run", "-d", "cpu", "--inject", "oom@5", "--", PY, "-I", "-S", path)
    assert done.returncode == 2 and not list_runs()
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"cockpit: --inject: oom@5: oom is raised inside the script by "
                           f"cockpit.report.step, and {PY} -I -S cannot import cockpit.report")
    # native-crash, hang and slow need no cockpit.report: the supervisor delivers them
    done = cockpit("run", "-d", "cpu", "--inject", "native-crash@5",
                   "--set", "rules={native-crash='stop'}", "--", PY, "-I", "-S", path)
    assert done.returncode == 1 and "crashed: native-crash" in done.stdout


def test_step_faults_in_a_command_with_no_step_numbers_are_said_unable_to_fire_when_that_shows(home, tmp_path):
    path = script(tmp_path, """\
        import time
        for i in range(40):  # what a Trainer with disable_tqdm=True prints: losses, no steps
            print({"loss": 1 / (i + 1), "learning_rate": 0.001}, flush=True)
            time.sleep(0.02)
    """)
    done = cockpit("run", "-d", "cpu", "--inject", "hang@10", "--inject", "native-crash@20+",
                   "--", PY, path)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = list_runs()
    kinds = [e.get("kind", e.get("outcome")) for e in run.events() if e.get("kind", e.get("outcome"))
             in ("no-step-numbers", "fault-cannot-fire", "fault-not-fired", "finished")]
    # said with the no-step-numbers warning, while it runs; not again at its end
    assert kinds == ["no-step-numbers", "fault-cannot-fire", "finished"]
    (warning,) = [e for e in of_type(run, "warning") if e["kind"] == "fault-cannot-fire"]
    assert warning["faults"] == ["hang@10", "native-crash@20+"]
    assert "warning: faults hang@10, native-crash@20+ cannot fire" in done.stdout

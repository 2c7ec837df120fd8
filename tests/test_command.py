"""Command workloads: the user's own script, supervised like a built-in workload.

End to end through the real CLI (`cockpit run -- ...`, `cockpit --no-ui -w PRESET`) with
examples/command/train.py, a plain PyTorch script that knows nothing of cockpit, and tiny
scripts written here for the ways a script ends."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import ROOT, child_env, cockpit_cmd, user_preset
from engine import command, runconfig
from engine.run import launchers
from engine.run.crashes import COMMAND, AttemptEnd, classify
from engine.record.rundir import RunDir, list_runs

TRAIN = str(ROOT / "examples" / "command" / "train.py")
REPORTED = str(ROOT / "examples" / "command" / "train_reported.py")
PY = sys.executable


def cockpit(*args: str, timeout: float = 180, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cockpit_cmd(*args), capture_output=True, text=True, env=child_env(),
                          timeout=timeout, cwd=cwd)


def events(run: RunDir, kind: str) -> list[dict]:
    return [e for e in run.events() if e["type"] == kind]


def only_run() -> RunDir:
    (run,) = list_runs()
    return run


def ladder(home: Path, first_extra: str = "") -> None:
    """Two CPU presets: 'first' (batch 16) falls back to 'second' (batch 8)."""
    user_preset(home, "devices", "first", 'device = "cpu"\nbatch_size = 16\naccumulation = 2\n'
                                          f'threads = 1\nfallback = ["second"]\n{first_extra}')
    user_preset(home, "devices", "second", 'device = "cpu"\nbatch_size = 8\naccumulation = 4\nthreads = 1\n')


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


# ---------------------------------------------------------------- presets and placeholders


def test_placeholders_are_filled_per_attempt_from_its_preset(home, tmp_path):
    ladder(home)
    config = runconfig.resolve_command(
        [PY, TRAIN, "--bs", "{batch_size}", "--accum", "{accumulation}", "--device", "{device}",
         "--out", "{run_dir}/out", "--tag", "a{attempt}-{precision}-{effective_batch}"],
        "train", "first", ["command.resume=['--resume', '{checkpoint}']", f"command.cwd={tmp_path}"])
    run = RunDir.create(config)
    first = launchers.for_attempt(run, config, config.device).launch(1, "first", config.device, None)
    assert first.argv[2:] == ["--bs", "16", "--accum", "2", "--device", "cpu",
                              "--out", f"{run.path.resolve()}/out", "--tag", "a1-fp32-32"]
    assert first.cwd == str(tmp_path) and first.env["OMP_NUM_THREADS"] == "1"
    ckpt = tmp_path / "ckpt-000040.pt"
    second = launchers.for_attempt(run, config, config.ladder["second"]).launch(
        2, "second", config.ladder["second"], resume={"path": str(ckpt), "step": 40})
    assert second.argv[2:6] == ["--bs", "8", "--accum", "4"]
    assert second.argv[-2:] == ["--resume", str(ckpt)] and "a2-fp32-32" in second.argv


def test_newest_checkpoint_is_the_newest_written_in_this_run(tmp_path):
    spec = command.CommandSpec(command=("python",), cwd=str(tmp_path), checkpoints="out/*.pt")
    out = tmp_path / "out"
    out.mkdir()
    old, mid, new = out / "a.pt", out / "b.pt", out / "c.pt"
    for i, path in enumerate((old, mid, new)):
        path.write_text("x")
        os.utime(path, (1000 + i * 100, 1000 + i * 100))
    assert command.newest_checkpoint(spec, tmp_path) == new
    assert command.newest_checkpoint(spec, tmp_path, since=1100) == new
    assert command.newest_checkpoint(spec, tmp_path, since=1500) is None   # an older run's files
    assert command.newest_checkpoint(spec, tmp_path, before=1150) == mid   # before the loss went bad


@pytest.mark.parametrize("text, key", [
    ('command = ["python", "train.py", "--bs", "{bs}"]\n', "command"),
    ('command = []\n', "command"),
    ('cwd = "/tmp"\n', "command"),
    ('command = ["python", "train.py", "--resume", "{checkpoint}"]\n', "command"),
    ('command = ["{device}", "train.py"]\n', "command"),
    ('command = ["python"]\nresume = ["--from", "{ckpt}"]\n', "resume"),
    ('command = ["python"]\nprogress_regex = "step (?P<step>\\\\d+"\n', "progress_regex"),
    ('command = ["python"]\nprogress_regex = "(?P<foo>\\\\d+)"\n', "progress_regex"),
    ('command = ["python"]\nprogress = "tqdm-ish"\n', "progress"),
    ('command = ["no-such-program-here"]\n', "command"),
    ('command = ["python"]\ncwd = "/no/such/dir"\n', "cwd"),
    ('command = ["python"]\n[train]\nepochs = 2\n', "train"),
])
def test_bad_command_presets_are_one_line_naming_file_and_key(home, text, key):
    path = user_preset(home, "workloads", "mine", text)
    done = cockpit("--no-ui", "-w", "mine", "-d", "cpu")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert str(path) in line and f": {key}:" in line and "Traceback" not in done.stderr
    assert not (home / "runs").exists() or not list((home / "runs").iterdir())  # nothing written


@pytest.mark.parametrize("args, needle", [
    ([], "command: missing"),
    (["--", "no-such-program-here", "x"], "command: 'no-such-program-here' was not found on PATH"),
    (["--", PY, "t.py", "--bs", "{batch}"], "unknown placeholder {batch}"),
    (["--set", "command.cwd=/no/such/dir", "--", PY, "t.py"], "cwd: '/no/such/dir' is not a directory"),
    (["--set", "params.n=3", "--", PY, "t.py"], "unknown section 'params'; expected one of device, command"),
    (["-d", "no-such-preset", "--", PY, "t.py"], "device preset 'no-such-preset'"),
])
def test_bad_cockpit_run_input_is_exit_2_and_writes_nothing(home, args, needle):
    done = cockpit("run", *args)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert needle in done.stderr and "Traceback" not in done.stderr
    assert not (home / "runs").exists() or not list((home / "runs").iterdir())


def test_a_command_cannot_ask_for_several_processes(home):
    user_preset(home, "devices", "ddp", 'device = "cpu"\nnproc_per_node = 2\n')
    done = cockpit("run", "-d", "ddp", "--", PY, "t.py")
    assert done.returncode == 2 and "nproc_per_node" in done.stderr and "torchrun" in done.stderr


def test_save_writes_a_workload_preset_once(home, tmp_path):
    args = ["run", "-d", "cpu", "--save", "mine", "--set", "command.checkpoints={run_dir}/out/*.pt",
            "--", PY, TRAIN, "--bs", "{batch_size}"]
    done = cockpit(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "cockpit --no-ui -w mine -d cpu" in done.stdout
    saved = home / "config" / "presets" / "workloads" / "mine.toml"
    preset = runconfig.resolve("mine", "cpu")
    assert preset.workload.params.command == (PY, TRAIN, "--bs", "{batch_size}")
    assert preset.workload.params.cwd == str(tmp_path) and "checkpoints" in saved.read_text()
    before = saved.read_bytes()
    again = cockpit(*args)
    assert again.returncode == 2 and "already exists" in again.stderr
    assert saved.read_bytes() == before
    assert not (home / "runs").exists()  # saving runs nothing


# ---------------------------------------------------------------- how a command ends


def test_classification_of_a_command_end():
    oom = classify(AttemptEnd(exit_code=1, signal=None, subject=COMMAND, tail=textwrap.dedent("""\
        Traceback (most recent call last):
          File "train.py", line 3, in <module>
        RuntimeError: MPS backend out of memory (MPS allocated: 17.80 GB)""")))
    assert oom.kind == "oom"
    bug = classify(AttemptEnd(exit_code=1, signal=None, subject=COMMAND, last_step=7, tail=textwrap.dedent("""\
        Traceback (most recent call last):
          File "train.py", line 3, in <module>
            a, b = x
        ValueError: too many values to unpack""")))
    assert bug.kind == "user-code" and "raised ValueError after step 7" in bug.sentence
    usage = classify(AttemptEnd(exit_code=2, signal=None, subject=COMMAND,
                                tail="usage: train.py [-h] [--bs BS]\ntrain.py: error: unrecognized arguments: --accum 4"))
    assert usage.kind == "config" and "unrecognized arguments" in usage.evidence["message"]
    # a command's exit codes are its own: 3 is not the trainer's 'stopped', 4 not 'numerical'
    assert classify(AttemptEnd(exit_code=3, signal=None, subject=COMMAND)).kind == "unknown"
    assert classify(AttemptEnd(exit_code=130, signal=None, subject=COMMAND, stop_requested=True)).kind == "stopped"
    assert classify(AttemptEnd(exit_code=None, signal="SIGABRT", subject=COMMAND)).sentence.startswith("The command died")


def test_a_script_that_raises_stops_as_user_code(home, tmp_path):
    ladder(home)
    path = script(tmp_path, """\
        import sys
        for step in range(1, 4):
            print(f"step {step}/10 loss={1.0 / step}", flush=True)
        rows = [(1, 2, 3)]
        a, b = rows[0]
    """)
    done = cockpit("run", "-d", "first", "--", PY, path)
    assert done.returncode == 1, done.stdout + done.stderr
    run = only_run()
    (crash,) = events(run, "crash")
    assert crash["kind"] == "user-code" and "ValueError" in crash["sentence"]
    assert not events(run, "fallback") and "ValueError: too many values to unpack" in done.stdout


def test_a_command_is_given_the_users_compile_caches_unless_it_names_its_own(home, tmp_path, monkeypatch):
    """A script's torch.compile finds the kernels compiled before it, by its previous attempt
    or another run: the caches reach it through the environment, the user's own winning."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    ladder(home)
    seen = tmp_path / "seen.json"
    path = script(tmp_path, f"""\
        import json, os
        names = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
        with open({str(seen)!r}, "w") as out:
            json.dump({{name: os.environ.get(name) for name in names}}, out)
        print("step 1/1 loss=0.5", flush=True)
    """)
    done = cockpit("run", "-d", "first", "--", PY, path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(seen.read_text()) == {
        "TORCHINDUCTOR_CACHE_DIR": str(home / "cache" / "compile" / "inductor"),
        "TRITON_CACHE_DIR": str(tmp_path / "mine")}


def test_a_script_that_prints_the_mps_oom_text_is_oom_and_gets_half_the_batch(home, tmp_path):
    ladder(home)
    path = script(tmp_path, """\
        import sys
        bs = int(sys.argv[1])
        if bs > 8:
            print("RuntimeError: MPS backend out of memory (MPS allocated: 17.80 GB, other "
                  "allocations: 1.23 GB, max allowed: 18.13 GB).", file=sys.stderr)
            sys.exit(1)
        print(f"step 1/1 loss=0.5 bs={bs}")
    """)
    done = cockpit("run", "-d", "first", "--", PY, path, "{batch_size}", "{accumulation}")
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run()
    (crash,) = events(run, "crash")
    (move,) = events(run, "fallback")
    assert crash["kind"] == "oom" and move["action"] == "halve-batch"
    started = events(run, "attempt_started")
    assert started[1]["command"][-2:] == ["8", "4"]  # half the micro-batch, twice the accumulation


# ---------------------------------------------------------------- the examples, end to end


def test_zero_touch_script_gives_steps_with_loss_and_eta(home):
    done = cockpit("run", "-d", "cpu", "--json", "--set", "accumulation=2", "--", PY, TRAIN, "--bs", "{batch_size}",
                   "--accum", "{accumulation}", "--out", "{run_dir}/out", "--steps", "300",
                   "--step-delay", "0.005")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    steps = [e for e in lines if e["type"] == "step"]
    assert len(steps) >= 2 and steps[-1]["step"] == steps[-1]["total"] == 300
    # every window has a rate (its samples per step known: {batch_size} x {accumulation}); a
    # last sighting of steps read as a window closed has none to measure, and says so
    windows = [e for e in steps if e["window_s"] is not None]
    assert windows and all(e["samples_per_s"] > 0 for e in windows)
    assert all(e["samples_per_s"] is None for e in steps if e["window_s"] is None)
    # The bar shows the loss from step 10 on: a window that ends before (the first second of
    # a loaded machine may not get that far) has none yet; every later one has it.
    assert all(e["loss"] is not None for e in steps if e["step"] >= 10)
    assert any(e["eta_s"] is not None for e in steps)
    losses = [e["loss"] for e in steps if e["loss"] is not None]
    # The bar's loss starts above 10 (step 17) and is below 0.5 from step 50 on; on a loaded
    # machine the first window with a loss can come late, where the loss only wanders
    assert losses and losses[-1] < 1.0
    (started,) = [e for e in lines if e["type"] == "attempt_started"]
    assert started["command"][2:6] == ["--bs", "8", "--accum", "2"]  # the cpu preset's micro-batch
    run = only_run()
    assert run.attempt_log(1).read_bytes().count(b"\r") > 2  # tqdm's redraws kept in the log
    assert [e["outcome"] for e in events(run, "attempt_ended")] == ["finished"]


def test_native_crash_resumes_on_the_next_preset_from_the_newest_checkpoint(home):
    ladder(home)
    # The fault is delivered once the supervisor reads step 120 from the bar, a few steps
    # later; the next checkpoint after 100 would be 200, the end, far beyond any such lag.
    done = cockpit("run", "-d", "first", "--inject", "native-crash@120",
                   "--set", "rules={native-crash='next'}",  # not the default retry-progress
                   "--set", "command.resume=['--resume', '{checkpoint}']",
                   "--set", "command.checkpoints={run_dir}/out/*.pt",
                   "--", PY, TRAIN, "--bs", "{batch_size}", "--accum", "{accumulation}",
                   "--out", "{run_dir}/out", "--steps", "200", "--ckpt-every", "100",
                   "--step-delay", "0.015")   # 1.2 s past step 120: a loaded poll still reads it
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run()
    (crash,) = events(run, "crash")
    assert crash["kind"] == "native-crash" and crash["evidence"]["signal"] == "SIGABRT"
    (move,) = events(run, "fallback")
    assert move["to_preset"] == "second" and move["resume"]["path"].endswith("ckpt-000100.pt")
    second = events(run, "attempt_started")[1]
    assert second["command"][2:6] == ["--bs", "8", "--accum", "4"]
    assert second["command"][-2:] == ["--resume", move["resume"]["path"]]
    log = run.attempt_log(2).read_text()
    assert "resumed from" in log and "at step 100" in log
    steps = [e["step"] for e in events(run, "step") if e["attempt"] == 2]
    assert steps and min(steps) > 100 and steps[-1] == 200
    assert "fallback: attempt 2 on second" in done.stdout


def test_runs_stop_ends_a_command_gracefully(home):
    done = cockpit("run", "-d", "cpu", "--detach", "--", PY, TRAIN, "--out", "{run_dir}/out",
                   "--steps", "100000", "--step-delay", "0.01")
    assert done.returncode == 0, done.stderr
    run = only_run()
    deadline = time.monotonic() + 120
    while not events(run, "step") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert events(run, "step"), run.attempt_log(1).read_text()
    stop = cockpit("runs", "stop", run.id)
    assert stop.returncode == 0 and "SIGINT" in stop.stdout
    while run.supervisor_pid() is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    (end,) = events(run, "run_finished")
    assert end["status"] == "stopped"
    assert list((run.path / "out").glob("ckpt-*.pt"))  # the script saved on Ctrl-C, as it does
    assert "exit 130" in events(run, "attempt_ended")[0]["exit"]


def test_reported_progress_wins_and_evals_arrive(home):
    done = cockpit("run", "-d", "cpu", "--", PY, REPORTED, "--out", "{run_dir}/out", "--steps", "200",
                   "--step-delay", "0.005")
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run()
    steps = events(run, "step")
    assert steps and {e["source"] for e in steps} == {"report"}
    assert steps[-1]["step"] == 200 and steps[-1]["loss"] < steps[0]["loss"]
    # the script's own start line is parsed before it first reports; its reported eval follows
    (evaluation,) = [e for e in events(run, "eval") if e.get("source") == "report"]
    assert "val_loss" in evaluation["metrics"] and evaluation["step"] == 200
    assert [e["source"] for e in events(run, "checkpoint")].count("report") >= 2


def test_reporter_faults_oom_and_nan_take_their_rules(home):
    ladder(home)
    done = cockpit("run", "-d", "first", "--inject", "oom@30", "--inject", "nan@60",
                   "--set", "command.checkpoints={run_dir}/out/*.pt",
                   "--set", "command.resume=['--resume', '{checkpoint}']",
                   "--", PY, REPORTED, "--bs", "{batch_size}", "--out", "{run_dir}/out",
                   "--steps", "120", "--ckpt-every", "20", "--step-delay", "0.005")
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run()
    kinds = [(e["kind"], e["attempt"]) for e in events(run, "crash")]
    assert kinds == [("oom", 1), ("numerical", 2)]
    moves = events(run, "fallback")
    assert [m["action"] for m in moves] == ["halve-batch", "next"]  # cpu ran fp32: fp32 falls through
    # the numerical attempt resumes from a checkpoint written before the loss went bad
    assert moves[1]["resume"] and int(re.search(r"(\d+)\.pt$", moves[1]["resume"]["path"]).group(1)) <= 60


def test_an_injected_hang_is_killed_and_falls_back(home):
    # the short timeout for the hanging preset only: `--set` would carry it to the one it falls
    # back to, which a loaded machine can keep quiet for 3 s without a hang
    ladder(home, first_extra="hang_timeout_s = 3\n")
    # hang@20 of 120: the supervisor reads step 20 with a second of training left to do it in
    done = cockpit("run", "-d", "first", "--inject", "hang@20",
                   "--", PY, TRAIN, "--out", "{run_dir}/out", "--steps", "120", "--step-delay", "0.01")
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run()
    (crash,) = events(run, "crash")
    assert crash["kind"] == "hang"
    assert [e["outcome"] for e in events(run, "attempt_ended")] == ["hang", "finished"]


# ---------------------------------------------------------------- the TUI


def test_a_command_preset_appears_in_the_launch_screen_and_runs_from_it(home):
    from cockpit.app import make_app
    from cockpit.ui.dashboard import DashboardScreen
    from ui_support import run as run_app, wait_for

    user_preset(home, "devices", "fast", 'device = "cpu"\nbatch_size = 8\naccumulation = 2\nthreads = 1\n')
    user_preset(home, "workloads", "mine", textwrap.dedent(f"""\
        description = "the example script, zero-touch"
        command = ["{PY}", "{TRAIN}", "--bs", "{{batch_size}}", "--out", "{{run_dir}}/out",
                   "--steps", "150", "--step-delay", "0.005"]
        cwd = "{ROOT}"
    """))

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = app.screen
            names = [o.id for o in screen.query_one("#workloads")._options]
            screen.query_one("#workloads").highlighted = names.index("mine")
            screen.query_one("#devices").highlighted = [o.id for o in screen.query_one("#devices")._options].index("fast")
            await pilot.pause()
            text = str(screen.query_one("#resolved-text").render())
            assert "runs as" in text and "--bs 8 --out '<run dir>/out'" in text
            await pilot.press("r")
            await pilot.pause()
            dash = app.screen
            assert isinstance(dash, DashboardScreen)
            await wait_for(pilot, lambda: dash.model.finished, timeout=120, what="the run to end")
            await pilot.pause(0.3)
            m = dash.model
            assert m.status == "finished", "\n".join(m.log)
            assert m.step == m.total == 150 and m.loss is not None and m.attempts[0].device == "cpu"
            assert any("--bs 8" in line for line in m.log)  # the attempt's command line

    run_app(drive())


def test_a_rule_that_changes_what_the_command_does_not_take_moves_on(home):
    from engine.run import fallback
    from engine.run.crashes import Verdict
    from engine.preset_types import DevicePreset

    first = fallback.Rung("first", DevicePreset(device="cpu", batch_size=16, fallback=("second",)))
    ladder_ = fallback.Ladder(first, {"second": DevicePreset(device="cpu", batch_size=8)})
    oom = Verdict("oom", "out of memory")
    spec = command.CommandSpec(command=("python", "train.py"))          # takes no {batch_size}
    moved = fallback.decide(oom, first, ladder_, 1, 5, fixed=command.fixed_settings(spec))
    assert moved.next.name == "second" and "takes no {batch_size}" in moved.why
    spec = command.CommandSpec(command=("python", "train.py", "--bs", "{batch_size}"))
    halved = fallback.decide(oom, first, ladder_, 1, 5, fixed=command.fixed_settings(spec))
    assert halved.action == "halve-batch" and halved.next.preset.batch_size == 8


def test_an_injected_slowdown_really_slows_the_command_and_it_still_finishes(home):
    done = cockpit("run", "-d", "cpu", "--json", "--inject", "slow@40", "--set", "accumulation=1",
                   "--", PY, TRAIN, "--out", "{run_dir}/out", "--steps", "120", "--step-delay", "0.005")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    (fault,) = [e for e in lines if e["type"] == "fault_injected"]
    assert fault["kind"] == "slow" and fault["by"] == "supervisor"
    assert [e["outcome"] for e in lines if e["type"] == "attempt_ended"] == ["finished"]


# ---------------------------------------------------------------- edges a review found


def test_odd_scripts_end_in_a_verdict_never_a_supervisor_traceback(home, tmp_path):
    fast = script(tmp_path, """\
        for step in range(1, 101):
            print(f"step {step}/100 loss={1 / step}")
    """)
    done = cockpit("run", "-d", "cpu", "--inject", "native-crash@50", "--", PY, fast)
    assert done.returncode == 0 and "Traceback" not in done.stderr  # the fault came due after it ended
    huge = tmp_path / "huge.py"
    huge.write_text('print("step " + "9" * 400 + "/10 loss=1.0", flush=True)\n')
    done = cockpit("run", "-d", "cpu", "--", PY, str(huge))
    assert done.returncode == 0 and "Traceback" not in done.stderr
    nan = tmp_path / "nan.py"
    nan.write_text('print("step 2/10 loss=nan", flush=True)\nraise SystemExit(1)\n')
    done = cockpit("run", "-d", "cpu", "--json", "--", PY, str(nan))
    crashes = [json.loads(line) for line in done.stdout.splitlines() if '"type": "crash"' in line]
    assert done.returncode == 1 and [c["kind"] for c in crashes] == ["numerical"]


def test_a_nan_run_resumes_from_a_checkpoint_written_before_the_loss_went_bad(home, tmp_path):
    ladder(home)
    path = script(tmp_path, """\
        import os, sys, time
        out, resume = sys.argv[1], sys.argv[2:]
        os.makedirs(out, exist_ok=True)
        if resume:
            print(f"resumed from {resume[-1]}", flush=True)
            print("step 40/40 loss=0.1", flush=True)
            raise SystemExit(0)
        for step in range(1, 31):
            loss = "nan" if step == 30 else 1 / step
            print(f"step {step}/40 loss={loss}", flush=True)
            if step % 10 == 0:  # it saves after printing, the NaN step's weights too
                open(os.path.join(out, f"ckpt-{step:04d}.pt"), "w").write("x")
            time.sleep(0.05)
        time.sleep(30)
    """)
    done = cockpit("run", "-d", "first", "--set", "command.checkpoints={run_dir}/out/*.pt",
                   "--set", "command.resume=['--resume', '{checkpoint}']",
                   "--", PY, path, "{run_dir}/out")
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run()
    (move,) = events(run, "fallback")
    assert move["reason"] == "numerical" and move["resume"]["path"].endswith("ckpt-0020.pt")


def test_what_a_command_run_cannot_take_is_refused_in_one_line(home):
    done = cockpit("run", "--save", "mine", "--set", "device.batch_size=4", "--", PY, TRAIN)
    assert done.returncode == 2 and "--save" in done.stderr and "Traceback" not in done.stderr
    assert not (home / "config").exists()


def test_an_in_script_fault_on_a_script_that_never_reports_is_a_warning(home):
    done = cockpit("run", "-d", "cpu", "--set", "accumulation=1", "--inject", "oom@10", "--",
                   PY, TRAIN, "--steps", "30", "--out", "{run_dir}/out")
    assert done.returncode == 0
    # said once, when the output reached its step (not only when the attempt ended)
    assert "warning: fault oom@10 is due (the output is at step" in done.stdout
    assert done.stdout.count("fault oom@10") == 1


# A script whose process catches SIGABRT, as one running CUDA does (a native library's handler:
# seen on the H100 under Lightning), and ignores it; it reports its steps through cockpit.report
# or only prints them.
CATCHES_SIGABRT = """\
    import signal, sys, time
    from cockpit import report
    signal.signal(signal.SIGABRT, lambda signum, frame: None)
    reports = sys.argv[1] == "report"
    for step in range(1, 1501):  # 15 s at least: far past the supervisor's grace
        time.sleep(0.01)
        print(f"step {step}/1500 loss={1 / step}", flush=True)
        if reports:
            report.step(step, total=1500, loss=1 / step)
"""


@pytest.mark.parametrize("how", ["report", "print"])
def test_an_injected_native_crash_ends_a_script_that_catches_sigabrt(home, tmp_path, how):
    """A script that reports its steps aborts itself at the fault's step, as a real abort()
    does, handler or not; one that only prints survives the supervisor's SIGABRT, and after
    a grace period SIGKILL ends it as the crash would have: native-crash either way."""
    path = script(tmp_path, CATCHES_SIGABRT)
    done = cockpit("run", "-d", "cpu", "--json", "--inject", "native-crash@40",
                   "--set", "rules={native-crash='stop'}", "--", PY, path, how)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    run = only_run()
    (crash,) = events(run, "crash")
    assert crash["kind"] == "native-crash"
    injected = events(run, "fault_injected")
    survived = [e for e in events(run, "warning") if e["kind"] == "fault-survived"]
    if how == "report":
        assert [(e["step"], e.get("by")) for e in injected][:1] == [(40, None)]  # by the script
        assert crash["evidence"]["signal"] == "SIGABRT" and not survived
    else:
        assert [e["by"] for e in injected] == ["supervisor"]
        assert crash["evidence"]["signal"] == "SIGKILL" and len(survived) == 1
        assert events(run, "step")[-1]["step"] < 1500  # it never got to finish

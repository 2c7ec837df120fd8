"""The headless CLI through real subprocesses: runs, JSON, bad input, stop, detach."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import TINY, child_env, cockpit_cmd, user_preset
from engine.record.checkpoint import checkpoint_files
from engine.record.rundir import list_runs, summarize


def sets(*overrides: str) -> list[str]:
    return [a for o in (*TINY, *overrides) for a in ("--set", o)]


def cockpit(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cockpit_cmd(*args), capture_output=True, text=True, env=child_env(),
                          timeout=timeout)


def wait_for(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


def test_headless_run_end_to_end(home):
    done = cockpit("--no-ui", "--device", "cpu", *sets())
    assert done.returncode == 0, done.stderr
    assert "step 8/8 (100%)" in done.stdout and "eval at step 8: r2" in done.stdout
    (run,) = list_runs()
    # the summary, then where the run is and what to type next
    assert done.stdout.rstrip().splitlines()[-2:] == [f"run dir {run.path}",
                                                       f"  cockpit runs show {run.id}      its summary"]
    last = done.stdout.rstrip().splitlines()
    assert last[-4].startswith("finished: step 8/8") and last[-3].startswith("goodput ")
    types = [e["type"] for e in run.events()]
    assert types[0] == "run_started" and types[-1] == "run_finished"
    assert {"attempt_started", "trainer_ready", "step", "eval", "checkpoint", "attempt_ended"} <= set(types)
    assert run.config().device.batch_size == 8
    assert "attempt 1: finished at step 8/8" in run.attempt_log(1).read_text()
    assert checkpoint_files(run.checkpoints)
    assert summarize(run).status == "finished" and not run.pid_path.exists()


def test_json_lines_are_the_events(home):
    done = cockpit("--no-ui", "--device", "cpu", "--json", *sets())
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events == list_runs()[0].events()
    step = next(e for e in events if e["type"] == "step")
    assert {"step", "total", "loss", "samples_per_s", "steps_per_s", "eta_s", "epoch"} <= set(step)


@pytest.mark.parametrize("args, words", [
    (["--device", "nope"], "device preset 'nope': not found; available: auto, cpu"),
    (["--workload", "nope"], "workload preset 'nope': not found"),
    (["--set", "batch_size=0"], "--set: device.batch_size: got 0, expected a positive integer"),
    (["--set", "batch_sze=4"], "did you mean 'device.batch_size'?"),
    (["--set", "precision=fp8"], "expected one of 'auto', 'fp32', 'bf16', 'fp16'"),
    (["--device", "cuda"], "'cuda' is not available on this machine"),
    (["--device", "broken"], "broken.toml, line 1: device: is not valid TOML, a string not closed"),
    (["--device", "typo"], "typo.toml: batch_sise: unknown key; did you mean 'batch_size'?"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--runs-dir", "{file}/runs"], "is not writable"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(home, args, words):
    user_preset(home, "devices", "broken", 'device = "cpu\n')
    user_preset(home, "devices", "typo", 'device = "cpu"\nbatch_sise = 4\n')
    blocker = home / "a-file"
    blocker.write_text("")
    args = [a.replace("{file}", str(blocker)) for a in args]
    done = cockpit("--no-ui", *args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert words in done.stderr
    assert done.stdout == ""
    assert not (home / "runs").exists()
    assert (home / "config" / "presets" / "devices" / "broken.toml").read_text() == 'device = "cpu\n'


def test_ctrl_c_stops_gracefully_with_a_checkpoint(home):
    proc = subprocess.Popen(cockpit_cmd("--no-ui", "--device", "cpu", *sets("train.epochs=1000")),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    run = wait_for(lambda: list_runs() and list_runs()[0])
    wait_for(lambda: any(e["type"] == "step" for e in run.events()))
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert summarize(run).status == "stopped"
    ended = [e for e in run.events() if e["type"] == "attempt_ended"]
    assert ended[-1]["outcome"] == "stopped" and ended[-1]["exit_code"] == 3
    saved = [e for e in run.events() if e["type"] == "checkpoint"]
    assert saved and saved[-1]["samples_seen"] > 0
    last = out.rstrip().splitlines()
    assert last[-5].startswith("stopped: step") and last[-4].startswith("goodput ") and last[-3:] == [
        f"run dir {run.path}", f"  cockpit runs show {run.id}      its summary",
        f"  cockpit runs resume {run.id}    continue it from its newest checkpoint"]


def test_detached_run_survives_its_launcher_and_can_be_followed_and_stopped(home):
    done = cockpit("--no-ui", "--device", "cpu", "--detach", *sets("train.epochs=1000"))
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip()
    (run,) = list_runs()
    assert run.id == run_id
    # The launcher did not wait for the run (a clock would say so only on an idle machine).
    assert not [e for e in run.events() if e["type"] == "run_finished"]
    pid = wait_for(run.supervisor_pid)
    assert os.getsid(pid) == pid  # its own session: a closed terminal does not reach it
    wait_for(lambda: any(e["type"] == "step" for e in run.events()))

    listed = cockpit("runs", "list")
    assert run_id in listed.stdout and "running" in listed.stdout
    stopped = cockpit("runs", "stop", run_id[:15])
    assert stopped.returncode == 0, stopped.stderr
    followed = cockpit("runs", "follow", run_id, timeout=60)
    assert followed.returncode == 130
    assert "run stopped" in followed.stdout
    # and it ends as the command that ran the run would have: where it is, what to type next
    assert followed.stdout.rstrip().splitlines()[-3:] == [
        f"run dir {run.path}", f"  cockpit runs show {run.id}      its summary",
        f"  cockpit runs resume {run.id}    continue it from its newest checkpoint"]
    wait_for(lambda: run.supervisor_pid() is None)
    shown = cockpit("runs", "show", "last")
    assert "status    stopped" in shown.stdout and "attempt 1: cpu on cpu, stopped" in shown.stdout


def test_presets_and_runs_commands(home):
    listed = cockpit("presets", "list")
    assert listed.returncode == 0 and "mps-safe" in listed.stdout and "matmul" in listed.stdout
    shown = cockpit("presets", "show", "mps-safe")
    assert 'empty_cache = "before-mining"' in shown.stdout
    missing = cockpit("presets", "show", "nope")
    assert missing.returncode == 2 and "not found" in missing.stderr
    where = cockpit("presets", "path")
    assert str(home / "config" / "presets") in where.stdout
    assert cockpit("runs", "list").stdout.startswith("no runs yet")
    assert cockpit("runs", "show", "nope").returncode == 2


def test_bare_cockpit_without_a_terminal_says_so(home):
    done = cockpit()
    assert done.returncode == 2 and "needs a terminal" in done.stderr


def test_a_slow_run_shows_its_rate_not_zero():
    from cockpit.present.lines import human_line

    step = {"type": "step", "step": 3, "total": 10, "loss": 1.5, "samples_per_s": 0.4237}
    assert "0.424 samples/s" in human_line(step)
    assert "1,235 samples/s" in human_line({**step, "samples_per_s": 1234.6})


def test_runs_list_columns(home, capsys):
    """`runs list`: 'steps lost' (a count) is not to be read as the status 'lost'; a line fits
    100 columns."""
    from cockpit.cli import main
    from engine import runconfig
    from engine.record.events import EventWriter
    from engine.record.rundir import RunDir

    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY))
    with EventWriter(run.events_path, attempt=1) as events:
        events.emit("run_started", run=run.id, workload="matmul", device_preset="cpu")
        events.emit("attempt_started", preset="cpu")
        events.emit("step", step=10, total=20, window_s=1.0, samples_per_s=8.0, samples_seen=80)
        events.emit("checkpoint", step=6)
        events.emit("attempt_ended", outcome="crashed")
        events.emit("run_finished", status="failed")
    assert main(["runs", "list"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[0] == "run" and header.endswith(" steps lost")
    assert row.split()[:3] == [run.id, "failed", "10/20"] and row.endswith(" 4")
    assert len(header) == len(row) <= 100

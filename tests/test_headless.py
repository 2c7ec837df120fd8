"""Headless output: in a log file a progress line per --log-every seconds of the run plus every
event; on a terminal one live line with the events above it; an ETA that says it is settling;
last lines that name the run directory and what to type next."""

from __future__ import annotations

import io
import json
import re
import subprocess

import pytest

from conftest import TINY, child_env, cockpit_cmd
from cockpit.headless import HeadlessPrinter
from cockpit.present.words import SETTLE_WINDOWS
from engine.record.rundir import list_runs


def steps(start_t: float, n: int, every_s: float, total: int = 1000) -> list[dict]:
    return [{"type": "step", "attempt": 1, "t": start_t + i * every_s, "step": i + 1, "total": total,
             "loss": 1.0 / (i + 1), "samples_per_s": 100.0, "eta_s": 99.0, "window_s": every_s}
            for i in range(n)]


def printed(events: list[dict], **kw) -> list[str]:
    out = io.StringIO()
    printer = HeadlessPrinter(stream=out, **kw)
    for i in range(0, len(events), 7):   # in batches, as the supervisor hands them over
        printer(events[i:i + 7])
    printer.close()
    return out.getvalue().splitlines()


def test_a_log_gets_a_progress_line_per_interval_plus_every_event():
    events = [{"type": "attempt_started", "attempt": 1, "t": 0.0, "preset": "cpu"}]
    events += steps(1.0, 1000, 0.1)    # 100 s of 0.1 s windows
    events.insert(500, {"type": "eval", "attempt": 1, "t": 50.0, "step": 499, "metrics": {"r2": 0.5}})
    events.insert(600, {"type": "checkpoint", "attempt": 1, "t": 60.0, "step": 599, "path": "c/599.pt"})
    events += [{"type": "attempt_ended", "attempt": 1, "t": 101.0, "outcome": "finished"}]
    lines = printed(events, live=False, log_every_s=30)
    progress = [line for line in lines if line.startswith("step ")]
    # the first step, one per 30 s of the run's clock, and where the attempt ended
    assert [line.split()[1] for line in progress] == ["1/1000", "301/1000", "601/1000", "901/1000", "1000/1000"]
    assert "eval at step 499: r2 0.5" in lines and "checkpoint at step 599: c/599.pt" in lines
    assert len(lines) == len(progress) + 2
    assert "ETA settling" in progress[0] and "ETA 1m39s" in progress[1]


def test_a_stalled_run_still_logs_a_line_per_interval_saying_so():
    events = steps(0.0, 3, 0.5) + [{"type": "memory", "attempt": 1, "t": 1.0 + 10 * i, "rss": 1e9}
                                   for i in range(1, 8)]
    lines = printed(events, live=False, log_every_s=30)
    assert lines[0].startswith("step 1/1000")
    assert lines[1].startswith("step 3/1000") and lines[1].endswith("(no step for 30s)")
    assert lines[2].endswith("(no step for 1m00s)") and len(lines) == 3


def test_before_its_first_step_an_attempt_says_how_long_it_has_waited():
    """A model loading or a first step compiling takes minutes with no step: a log file still
    gets a line per interval, and the first step is written whatever the interval."""
    started = {"type": "attempt_started", "attempt": 1, "t": 0.0, "preset": "cpu"}
    waiting = [{"type": "memory", "attempt": 1, "t": 10.0 * i, "rss": 1e9} for i in range(1, 10)]
    ended = {"type": "attempt_ended", "attempt": 1, "t": 96.0, "outcome": "finished"}
    lines = printed([started, *waiting, *steps(95.0, 2, 0.5), ended], live=False, log_every_s=30)
    assert lines[:3] == ["attempt 1: no step yet (30s)", "attempt 1: no step yet (1m00s)",
                         "attempt 1: no step yet (1m30s)"]
    assert lines[3].startswith("step 1/1000") and lines[4].startswith("step 2/1000") and len(lines) == 5

    out = io.StringIO()
    printer = HeadlessPrinter(stream=out, live=True, width=80)
    crash = {"type": "crash", "attempt": 1, "t": 50.0, "preset": "cpu", "kind": "hang",
             "sentence": "No step for 45 s."}
    second = {**started, "attempt": 2, "t": 51.0}
    for e in (started, {**waiting[0], "t": 0.5}):
        printer([e])
    assert out.getvalue() == ""                               # under a second: nothing to say
    for e in (waiting[3], crash, second, {**waiting[5], "attempt": 2}):
        printer([e])
    drawn = re.split(r"\r\x1b\[K|\n", out.getvalue())     # each line as drawn, in order
    assert drawn[0] == "attempt 1: no step yet (40s)"
    assert drawn[1].startswith("attempt 1 (cpu) crashed: hang.")   # over it: the line gave way
    assert drawn[-1] == "attempt 2: no step yet (9s)"          # counted from its own start
    printer(steps(62.0, 1, 0.5))
    assert out.getvalue().rsplit("\r\x1b[K", 1)[-1].startswith("  0%  step 1/1000")


def test_on_a_terminal_one_live_line_with_events_above_it():
    events = [{"type": "attempt_started", "attempt": 1, "t": 0.0, "preset": "cpu"}, *steps(1.0, 20, 0.1),
              {"type": "eval", "attempt": 1, "t": 3.0, "step": 20, "metrics": {"r2": 0.9}},
              {"type": "attempt_ended", "attempt": 1, "t": 3.1, "outcome": "finished"},
              {"type": "run_finished", "t": 3.2, "status": "finished", "summary": {}}]
    out = io.StringIO()
    printer = HeadlessPrinter(stream=out, live=True, width=60)
    for e in events:
        printer([e])
    printer.close()
    text = out.getvalue()
    assert text.count("\n") == 3   # the eval, the attempt's last live line kept, the end of the run
    screen = [line.rsplit("\r\x1b[K", 1)[-1] for line in text.split("\n")]
    assert screen[0] == "eval at step 20: r2 0.9"
    assert screen[1].strip().startswith("2%") and "step 20/1000" in screen[1] and len(screen[1]) <= 59
    assert screen[2] == "run finished" and screen[3] == ""
    first = text.split("\r\x1b[K")[0]
    assert "ETA settling" in first and "ETA 1m39s" in text.split("\r\x1b[K")[SETTLE_WINDOWS - 1]


def test_the_main_job_in_a_log_file(home, monkeypatch):
    """The main job's shape (matmul), not on a terminal: at most one progress line per
    --log-every second of the run plus its events; the last lines name the run dir. Alerts on:
    the finish reaches the notify command, and no bell or escape reaches the log."""
    monkeypatch.delenv("COCKPIT_ALERTS")
    (home / "config").mkdir()
    (home / "config" / "settings.toml").write_text("[alerts]\ndesktop = false\n")
    alert = home / "alert.json"
    sets = [a for o in (*TINY, "train.epochs=40") for a in ("--set", o)]
    done = subprocess.run(cockpit_cmd("--no-ui", "--device", "cpu", "--log-every", "1",
                                      "--notify-command", f"cat > {alert}", *sets),
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    (run,) = list_runs()
    assert json.loads(alert.read_text())["event"] == "finish"
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout
    events = run.events()
    seconds = events[-1]["t"] - events[0]["t"]
    lines = done.stdout.splitlines()
    progress = [line for line in lines if line.startswith("step ") or "no step yet" in line]
    windows = [e for e in events if e["type"] == "step"]
    assert 1 <= len(progress) <= int(seconds) + 2, (seconds, progress)   # + the first and the last
    # the rest were not printed: the step lines, against the windows, both of the training's
    # time ('no step yet' lines count the start-up's seconds, which a loaded machine stretches
    # while the training's windows stay as many)
    printed = [line for line in progress if line.startswith("step ")]
    assert len(windows) > 2 * len(printed), (len(windows), printed)
    assert progress[-1].startswith("step 320/320 (100%)")
    assert not any(len(line) > 200 for line in lines)
    finished = next(i for i, line in enumerate(lines) if line.startswith("finished: step 320/320"))
    assert lines[finished + 1].startswith("goodput ") and "training kept" in lines[finished + 1]
    assert lines[finished + 2:] == [f"run dir {run.path}", f"  cockpit runs show {run.id}      its summary"]


def test_a_bad_log_every_is_one_line_and_exit_2(home, capsys):
    from cockpit.cli import main

    for value in ("0", "-5", "soon", "inf", "nan"):
        with pytest.raises(SystemExit) as stop:
            main(["--no-ui", "--device", "cpu", "--log-every", value])
        out, err = capsys.readouterr()
        assert stop.value.code == 2 and out == "", (value, out)
        assert err == f"cockpit: argument --log-every: got '{value}', expected seconds > 0 (e.g. 30) " \
                      "(see cockpit --help)\n"
    assert not list_runs()


def test_a_stopped_run_says_how_to_resume_it(home):
    from cockpit.commands.train import _print_where
    from engine import runconfig
    from engine.record.rundir import RunDir, RunSummary
    import contextlib

    run = RunDir.create(runconfig.resolve("matmul", "cpu", TINY))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _print_where(run, RunSummary(id=run.id, workload="matmul", device_preset="cpu", status="stopped",
                                     checkpoints=1))
    assert re.search(rf"cockpit runs resume {run.id} +continue it", out.getvalue())


def test_the_live_line_keeps_pressure_at_80_columns_and_puts_trouble_first():
    from cockpit.present.lines import status_line

    e = {"step": 140, "total": 400, "eta_s": 130, "loss": 0.41, "samples_per_s": 1234.5}
    line = status_line(e, {"pressure": {"level": "normal"}}, 10, width=79)
    assert line.split() == ["35%", "step", "140/400", "ETA", "2m10s", "loss", "0.41", "1,234",
                            "samples/s", "pressure", "normal"]
    assert status_line(e, {"pressure": {"level": "normal"}}, 10, width=120).startswith("[====>")
    trouble = status_line(e, {"pressure": {"level": "critical"}}, 10, width=50)
    assert "pressure critical" in trouble and "samples/s" not in trouble
    done = status_line({**e, "step": 400}, {"pressure": {"level": "normal"}}, 1, width=79)
    assert "ETA" not in done  # nothing left: no ETA, no 'settling'

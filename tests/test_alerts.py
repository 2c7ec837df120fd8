"""Alerts: which events alert (one alert per incident), the terminal's escape written only to a
terminal and only while its session lives, a notify command that gets the alert as JSON and is
killed when it hangs, and runs that alert from the CLI, a detached supervisor and the TUI."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest

from conftest import TINY, child_env, cockpit_cmd, user_preset
from engine import runconfig
from engine.run.alert_rules import Alert, AlertRules
from engine.run.alerts import Alerts, Commands, Terminal, desktop_argv, escape
from engine.record.identity import ProcessId
from engine.record.rundir import RunDir, list_runs, summarize
from engine.settings import AlertSettings

ALL = frozenset({"crash", "fallback", "finish", "failure", "slowdown", "hang"})
# A checkpoint every step: an injected crash is retried from the one before it (a fallback).
FAST = TINY + ["train.checkpoint_every_steps=1", "train.epochs=3", "params.samples=128"]


def sets(*overrides: str) -> list[str]:
    return [a for o in (*FAST, *overrides) for a in ("--set", o)]


@pytest.fixture
def alerting(home, monkeypatch):
    """Alerts on (the `home` fixture turns them off), but no desktop notifications from tests."""
    monkeypatch.delenv("COCKPIT_ALERTS")
    settings_toml(home, "")
    return home


def settings_toml(home, text: str) -> None:
    (home / "config").mkdir(exist_ok=True)
    (home / "config" / "settings.toml").write_text("[alerts]\ndesktop = false\n" + text)


# ---------------------------------------------------------------- the rules

CRASH = {"type": "crash", "attempt": 1, "preset": "mps", "kind": "native-crash", "t": 10.0}
FALLBACK = {"type": "fallback", "attempt": 1, "to_preset": "cpu", "next_attempt": 2,
            "resume": {"step": 40, "path": "checkpoints/step-40.pt"}, "t": 10.1}
FINISHED = {"type": "run_finished", "status": "finished", "t": 20.0,
            "summary": {"final_step": 100, "attempts": [{}, {}], "steps_lost": 3}}


def test_a_crash_and_the_fallback_it_led_to_are_one_alert():
    (alert,) = AlertRules(ALL, "clip").see([CRASH, {"type": "attempt_ended"}, FALLBACK])
    assert alert.event == "fallback" and alert.events == ("crash", "fallback")
    assert alert.title.endswith(": clip fell back")
    assert alert.message == "attempt 1 on mps crashed (native-crash); attempt 2 resumes on cpu at step 40"
    (alert,) = AlertRules(frozenset({"crash"}), "clip").see([CRASH, FALLBACK])
    assert alert.event == "crash"                     # fallbacks not asked for; the crash is
    assert AlertRules(frozenset({"finish"}), "clip").see([CRASH, FALLBACK]) == []


def test_hang_failure_finish_slowdown_and_a_stopped_crash():
    rules = AlertRules(ALL, "w")
    hang = {**CRASH, "kind": "hang"}
    assert [a.event for a in rules.see([hang, FALLBACK])] == ["hang"]
    failed = [CRASH, {"type": "run_failed", "reason": "the ladder is exhausted", "t": 11},
              {"type": "run_finished", "status": "failed", "t": 11, "summary": {}}]
    (alert,) = rules.see(failed)
    assert alert.event == "failure" and "the ladder is exhausted" in alert.message
    (alert,) = rules.see([FINISHED])
    assert alert.message == "finished at step 100 after 2 attempts, 3 steps lost to crashes"
    slow = {"type": "warning", "kind": "slowdown", "message": "throughput 3 samples/s is 20% of its best"}
    assert [a.message for a in rules.see([slow])] == [slow["message"]]
    assert rules.see([{"type": "warning", "kind": "alert", "message": "x"}]) == []
    # a crash whose run was then stopped: no fallback follows, the crash alerts by itself
    assert [a.event for a in rules.see([CRASH, {"type": "run_finished", "status": "stopped"}])] == ["crash"]


def test_events_from_before_a_screen_opened_do_not_alert():
    rules = AlertRules(ALL, "w", since=15.0)
    assert rules.see([CRASH, FALLBACK]) == [] and len(rules.see([FINISHED])) == 1


def test_the_escape_is_osc_9_99_or_777_with_the_text_made_safe():
    alert = Alert("crash", ("crash",), "cockpit@box: w crashed", "a\x1b]0;evil\x07 b;c")
    assert escape(alert, "auto", {"TERM": "xterm-256color"}) == \
        "\x07\x1b]9;cockpit@box: w crashed: a ]0;evil  b;c\x07"
    assert escape(alert, "auto", {"TERM": "foot"}) == \
        "\x07\x1b]777;notify;cockpit@box: w crashed;a ]0;evil  b;c\x07"
    assert escape(alert, "auto", {"TERM": "xterm-kitty"}) == \
        "\x07\x1b]99;;cockpit@box: w crashed: a ]0;evil  b;c\x1b\\"
    assert escape(alert, "bell", {}) == "\x07" and escape(alert, "off", {}) == ""
    wrapped = escape(alert, "osc9", {"TMUX": "/tmp/tmux-1/default,1,0"})
    assert wrapped.startswith("\x07\x1bPtmux;\x1b\x1b]9;") and wrapped.endswith("\x1b\\")


# ---------------------------------------------------------------- channels


def _read_all(fd: int, until: float = 0.5) -> bytes:
    out = b""
    while select.select([fd], [], [], until)[0]:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        out += data
    return out


def test_a_terminal_is_written_while_its_session_lives():
    master, slave = pty.openpty()
    try:
        path = os.ttyname(slave)
        alert = Alert("finish", ("finish",), "t", "done")
        assert Terminal(path, ProcessId.of(os.getpid()), "osc9").send(alert)
        assert _read_all(master) == b"\x07\x1b]9;t: done\x07"
        gone = ProcessId(os.getpid(), ProcessId.of(os.getpid()).start - 100)  # a session since ended
        assert not Terminal(path, gone, "osc9").send(alert)
        assert _read_all(master, 0.2) == b""
        assert not Terminal("/nonexistent/tty", None).send(alert)
    finally:
        os.close(master)
        os.close(slave)


def test_a_hanging_command_is_killed_at_its_timeout_and_a_failing_one_said(tmp_path):
    # The commands' clock is the test's: on the real one, a loaded machine could take the 0.5 s
    # to start the shell that fails, and it too would be killed as hanging.
    clock = [0.0]
    said: list[str] = []
    commands = Commands(timeout_s=0.5, say=said.append, clock=lambda: clock[0])
    pid_file = tmp_path / "pid"
    commands.start(f"echo $$ > {pid_file}; exec sleep 600", b"{}", dict(os.environ), label="notify command")
    commands.start("echo boom >&2; exit 3", b"{}", dict(os.environ), label="notify command")
    commands.poll()   # returns at once, whatever the commands do
    deadline = time.monotonic() + 120   # for a hang only
    while not said:   # the failing one is said once it has exited, however long that took
        assert time.monotonic() < deadline, "the failing command never ended"
        time.sleep(0.02)
        commands.poll()
    assert said == ["notify command exited 3: boom"] and len(commands.running) == 1
    while not pid_file.exists() or not pid_file.read_text().strip():   # the hanging one has started
        assert time.monotonic() < deadline, "the hanging command never started"
        time.sleep(0.02)
    clock[0] = 0.5    # its timeout is up
    commands.close()  # each at most until its timeout
    assert sorted(said) == ["notify command did not finish in 0.5 s; killed", "notify command exited 3: boom"]
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


# ---------------------------------------------------------------- runs that alert


def test_an_injected_crash_reaches_the_notify_command_which_hangs_is_killed_and_the_run_goes_on(alerting):
    """One run for both: the notify command writes its stdin (JSON) and environment, then hangs
    until it is killed at notify_timeout_s; the run goes on meanwhile. --notify-command replaces
    settings.toml's command (which would fail, said as a warning)."""
    user_preset(alerting, "devices", "first", 'device = "cpu"\nthreads = 1\nfallback = ["cpu"]\n')
    settings_toml(alerting, 'notify_timeout_s = 1\nnotify_command = "exit 9"\n')
    out, env, pids = alerting / "alerts.jsonl", alerting / "env", alerting / "pids"
    hangs = (f'cat >> {out}; echo "$COCKPIT_ALERT_EVENT|$COCKPIT_ALERT_TITLE|$COCKPIT_ALERT_MESSAGE|'
             f'$COCKPIT_RUN_ID|$COCKPIT_RUN_DIR" >> {env}; echo $$ >> {pids}; exec sleep 600')
    done = subprocess.run(cockpit_cmd("--no-ui", "--device", "first", "--inject", "native-crash@5",
                                      "--notify-command", hangs, *sets()),
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = list_runs()
    fell, finished = [json.loads(line) for line in out.read_text().splitlines()]
    assert env.read_text().splitlines() == [f"{a['event']}|{a['title']}|{a['message']}|{run.id}|{run.path.resolve()}"
                                            for a in (fell, finished)]
    # killed at the timeout, each said once; the fallback's while attempt 2 went on (it started
    # before the kill was said: the supervisor never waited on the command)
    events = run.events()
    said = [i for i, e in enumerate(events) if e["type"] == "warning" and e["kind"] == "alert"]
    assert [events[i]["message"] for i in said] == [f"notify command ({a} alert) did not finish in 1 s; killed"
                                                    for a in ("fallback", "finish")]
    second = next(i for i, e in enumerate(events) if e["type"] == "attempt_started" and e["attempt"] == 2)
    assert second < said[0] and summarize(run).status == "finished"
    assert "warning: notify command (fallback alert) did not finish in 1 s; killed" in done.stdout
    for pid in pids.read_text().split():
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
    assert (fell["event"], fell["events"]) == ("fallback", ["crash", "fallback"])
    assert fell["run"] == run.id and fell["run_dir"] == str(run.path.resolve())
    assert fell["workload"] == "matmul" and fell["device_preset"] == "first"
    crash, move = fell["source"]
    assert crash["type"] == "crash" and crash["kind"] == "native-crash" and move["type"] == "fallback"
    assert "attempt 1 on first crashed (native-crash)" in fell["message"]
    assert finished["event"] == "finish" and finished["message"].startswith("finished at step")


def test_the_desktop_notification_is_notify_send_with_a_display_or_osascript_on_a_mac(tmp_path, monkeypatch):
    """Stand-ins for notify-send and osascript on PATH record how they were called."""
    seen = tmp_path / "seen"
    for name in ("notify-send", "osascript"):
        (tmp_path / name).write_text(f'#!/bin/sh\nprintf "%s\\n" "${{0##*/}}" "$@" >> {seen}\n')
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    for var in ("DISPLAY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    alert = Alert("crash", ("crash",), "cockpit@box: w crashed", "attempt 1 on \x1b[31mmps")
    assert desktop_argv(alert) is None                      # a server over SSH: no display
    monkeypatch.setenv("WAYLAND_DISPLAY", "wayland-0")
    assert desktop_argv(alert) == ["notify-send", "--app-name=cockpit", "cockpit@box: w crashed",
                                   "attempt 1 on  [31mmps"]
    monkeypatch.setattr(sys, "platform", "darwin")          # the text as arguments, never in the script
    argv = desktop_argv(alert)
    assert argv[0] == "osascript" and argv[-2:] == ["cockpit@box: w crashed", "attempt 1 on  [31mmps"]
    assert not any("crashed" in a for a in argv[:-2])

    monkeypatch.setattr(sys, "platform", "linux")
    for desktop in (False, True):
        sent = Alerts(AlertSettings(desktop=desktop), run_id="r", run_dir=tmp_path, workload="w",
                      device_preset="cpu", terminal=None, say=pytest.fail)
        sent.send(alert)
        sent.close()
    assert seen.read_text().splitlines() == ["notify-send", "--app-name=cockpit", "cockpit@box: w crashed",
                                             "attempt 1 on  [31mmps"]


def test_bad_settings_are_one_line_naming_the_file_and_key(alerting, capsys, monkeypatch):
    from cockpit.cli import main

    for text, words in (('[alerts]\nnotify_comand = "x"\n', "alerts.notify_comand: unknown key; did you "
                                                           "mean 'alerts.notify_command'?"),
                        ('[alerts]\non = ["crash", "boom"]\n', "alerts.on: got 'boom', expected a list of "
                                                              "crash, fallback, finish"),
                        ('[alerts]\nnotify_timeout_s = 0\n', "alerts.notify_timeout_s: got 0, expected a number > 0 "
                                                              "and <= 600"),
                        ('[alerts]\nnotify_timeout_s = 1e9\n', "alerts.notify_timeout_s: got 1000000000.0, "
                                                                "expected a number > 0 and <= 600"),
                        ('alerts = 3\n', "alerts: got 3, expected a table ([alerts])"),
                        ('[alert]\n', "alert: unknown key; did you mean 'alerts'?")):
        (alerting / "config" / "settings.toml").write_text(text)
        assert main(["--no-ui", "--device", "cpu"]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, err
        assert err.startswith(f"cockpit: {alerting / 'config' / 'settings.toml'}: ") and words in err, err
    settings_toml(alerting, "")
    monkeypatch.setenv("COCKPIT_ALERTS", "no")
    assert main(["--no-ui", "--device", "cpu"]) == 2
    assert capsys.readouterr() == ("", "cockpit: COCKPIT_ALERTS: got 'no', expected 'off' or unset\n")
    assert not list_runs()


def _in_a_pty(args: list[str], timeout: float = 300) -> tuple[int, bytes]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; returns its exit and output."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(cockpit_cmd(*args), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                            env={**child_env(), "COLUMNS": "100"})
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every writer has closed the terminal
                    break
                if not data:
                    break
                out += data
            elif proc.poll() is not None:
                break
        return proc.wait(timeout=60), out
    finally:
        os.close(master)


def test_on_a_terminal_the_alert_escape(alerting):
    """In a pipe, none: tests/test_headless.py's main job in a log file. --notify-command ''
    silences settings.toml's command for the run."""
    marker = alerting / "notified"
    settings_toml(alerting, f'notify_command = "touch {marker}"\n')
    code, out = _in_a_pty(["--no-ui", "--device", "cpu", "--notify-command", "", *sets("train.epochs=1")])
    text = out.decode()
    assert code == 0, text
    (run,) = list_runs()
    assert "\x07\x1b]9;cockpit@" in text and f": matmul finished: finished at step {summarize(run).step}\x07" in text
    assert "\r\x1b[K" in text and "%  step " in text    # the live line, redrawn in place
    assert not marker.exists()   # the finish's commands ran before the CLI returned: none was started


def test_a_detached_run_alerts_the_terminal_it_was_started_from(alerting):
    master, slave = pty.openpty()
    try:
        done = subprocess.run(cockpit_cmd("--no-ui", "--detach", "--device", "cpu", *sets("train.epochs=1")),
                              stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE, env=child_env(),
                              timeout=120)
        assert done.returncode == 0, done.stderr
        (run,) = list_runs()
        deadline = time.monotonic() + 300   # for a hang only
        while summarize(run).status in ("created", "running") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert summarize(run).status == "finished"
        # The supervisor writes the alert after run_finished, once it reads it back: read the
        # terminal until the alert is there (a pause of half a second is not the end of it on
        # a loaded machine), or the supervisor has exited and can write nothing more.
        alert = f": matmul finished: finished at step {summarize(run).step}\x07"
        out = _read_all(master).decode()
        while alert not in out and time.monotonic() < deadline:
            if run.supervisor_pid() is None:   # exited: what it wrote is in the terminal now
                out += _read_all(master).decode()
                break
            out += _read_all(master, 0.2).decode()
        assert out.startswith(run.id + "\r\n")           # what the command printed, then the alert
        assert "\x07\x1b]9;cockpit@" in out and alert in out, out
    finally:
        os.close(master)
        os.close(slave)


def test_the_tui_rings_for_what_happens_while_it_watches_not_for_the_past(alerting, monkeypatch):
    from cockpit.app import make_app
    from cockpit.ui.alerts import ScreenAlerts
    from ui_support import copy_run, run as drive_app, wait_for

    path = copy_run(alerting, "crash-fallback")
    lines = (path / "events.jsonl").read_text().splitlines(keepends=True)
    crash = next(i for i, line in enumerate(lines) if '"type":"crash"' in line)
    (path / "events.jsonl").write_text("".join(lines[:crash]))
    rung, ring = [], ScreenAlerts.ring
    monkeypatch.setattr(ScreenAlerts, "ring", lambda self, app, alert: (rung.append(alert), ring(self, app, alert)))
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a live supervisor
    try:
        RunDir(path).write_supervisor_pid(stand_in.pid)

        async def drive():
            app = make_app(attach=False)
            # the toasts the rings made, as asked for (a loaded machine can reap one before it is read)
            toasts, notify = [], app.notify
            app.notify = lambda message, **kw: (toasts.append(kw.get("title")), notify(message, **kw))[-1]
            async with app.run_test(size=(80, 24)) as pilot:
                dash = app.open_run(RunDir(path))
                await wait_for(pilot, lambda: dash.model.step > 0 and dash.model.live, what="the history")
                await pilot.pause(0.3)
                assert rung == []   # a crash before the screen opened is not news
                now = time.time()
                with open(path / "events.jsonl", "a") as f:
                    for line in lines[crash:]:
                        f.write(json.dumps({**json.loads(line), "t": now}) + "\n")
                await wait_for(pilot, lambda: len(rung) == 2, what="the alerts")
                assert [a.event for a in rung] == ["fallback", "finish"]
                assert "crashed (native-crash)" in rung[0].message
                assert toasts[-2:] == [a.title for a in rung]

        drive_app(drive())
    finally:
        stand_in.kill()


def test_a_supervisor_that_dies_is_told_by_its_lifeline(alerting):
    import signal

    from engine.run.detached import start_detached

    out = alerting / "alerts.jsonl"
    # slow: a pause per step, so that the run is mid-training when its supervisor dies
    run = RunDir.create(runconfig.resolve("matmul", "cpu", FAST + ["train.epochs=1000", "inject=['slow@1+']"]))
    start_detached(run, notify_command=f"cat >> {out}")
    deadline = time.monotonic() + 300   # for a hang only
    # past its first checkpoint, so that there is something to continue from
    while not any(e["type"] == "checkpoint" for e in run.events()) and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(ProcessId.parse(run.pid_path.read_text()).pid, signal.SIGKILL)
    while not (out.exists() and out.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.1)
    (alert,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert alert["event"] == "failure" and alert["source"][0]["type"] == "run_interrupted"
    assert alert["message"] == f"the supervisor died; continue it with: cockpit runs resume {run.id}"


def test_a_retry_on_the_same_preset_is_said_to_be_one():
    retry = {**FALLBACK, "from": "mps", "to_preset": "mps"}
    (alert,) = AlertRules(ALL, "clip").see([CRASH, retry])
    assert alert.event == "fallback" and alert.title.endswith(": clip retried")
    assert alert.message == "attempt 1 on mps crashed (native-crash); attempt 2 resumes on mps again at step 40"
    (moved,) = AlertRules(ALL, "clip").see([CRASH, {**FALLBACK, "from": "mps"}])
    assert moved.title.endswith(": clip fell back")

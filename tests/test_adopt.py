"""`cockpit adopt PID`: a run made of a process cockpit did not start (engine.run.launchers.adopted).

A real script (tests/scripts/steps.py, `step N/M loss X` a few times a second) is started with
subprocess, not under cockpit, in a session of its own as `nohup ... &` would leave it; cockpit
adopts it and the tests see its steps and memory, its end, a stop, and a resume that starts it
again as a command run from the argv, directory and environment recorded. The script runs until
a file appears, so no test depends on how fast anything runs; every wait is on a condition with
a generous timeout. The macOS side (KERN_PROCARGS2) is tested with a crafted buffer and a ctypes
stand-in for sysctl: it has not run on a Mac.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, child_env, cockpit_cmd, wait_until
from engine.errors import ConfigError
from engine.monitor import procinfo
from engine.record.rundir import RunDir, find_run, summarize
from engine.run import adoption, resume as resumption
from engine.run.launchers import adopted
from engine.run.watch import AttemptWatch

SCRIPT = ROOT / "tests" / "scripts" / "steps.py"
TIMEOUT = 60.0   # for a hang only: what is waited on takes a second or two, more beside a CPU hog
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


class Script:
    """steps.py started as a user would, not under cockpit: its own session, its output to a file."""

    def __init__(self, tmp: Path, *args: str, log: str = "-"):
        self.dir = tmp / "work"
        self.dir.mkdir(exist_ok=True)
        self.out = self.dir / "train.log"             # its stdout and stderr
        self.log = self.out if log == "-" else self.dir / log   # where its steps go
        self.until = self.dir / "stop-now"
        env = {**child_env(), "ADOPT_TEST_TOKEN": "recorded"}
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, str(SCRIPT), log, "--until", str(self.until), *args],
                                         cwd=self.dir, stdout=out, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        wait_until(lambda: self.log.exists() and self.log.read_text().count("\nstep ") >= 3,
                   "the script's first steps")

    def end(self) -> None:
        self.until.touch()
        self.proc.wait(TIMEOUT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def script(home):
    started: list[Script] = []

    def start(*args: str, **kw) -> Script:
        s = Script(home, *args, **kw)
        started.append(s)
        return s

    yield start
    for s in started:
        s.kill()


def cockpit(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cockpit_cmd(*args), capture_output=True, text=True, timeout=TIMEOUT * 2,
                          env={**child_env(), **(env or {})}, **kw)


def events(run: RunDir, kind: str | None = None) -> list[dict]:
    return [e for e in run.events() if kind is None or e["type"] == kind]


def finished(run: RunDir) -> dict:
    """Its run_finished, once its supervisor has written it and gone."""
    ends = wait_until(lambda: events(run, "run_finished"), "the run's end")
    wait_until(lambda: run.supervisor_pid() is None and not run.locked(), "its supervisor to exit")
    return ends[-1]


# ---------------------------------------------------------------- the whole way, by the CLI


@linux_only
def test_an_adopted_script_shows_its_steps_and_memory_and_ends_and_a_resume_relaunches_it(home, script):
    s = script()
    adopt = cockpit("adopt", str(s.proc.pid), "--detach")
    assert adopt.returncode == 0, adopt.stderr
    run = find_run(adopt.stdout.strip())
    assert f"progress from {s.out} (stdout and stderr)" in adopt.stderr
    assert run.path.stat().st_mode & 0o777 == 0o700   # run.toml holds its environment

    # steps so far, as one sighting (no rate from one read of its history), then windows
    first = wait_until(lambda: events(run, "step"), "a step event")[0]
    assert first["step"] >= 3 and first["total"] == 1000 and first["steps_per_s"] is None
    steps = wait_until(lambda: [e for e in events(run, "step") if e.get("window_s")], "a window")
    assert steps[0]["from_step"] >= first["step"] and steps[0]["loss"] is not None
    memory = wait_until(lambda: events(run, "memory"), "a memory event")[0]
    assert memory["rss"] > 1_000_000 and memory["processes"] >= 1
    assert "rss_kind" not in memory   # Linux: RSS, as for any run
    started = events(run, "run_started")[0]["adopted"]
    assert started["pid"] == s.proc.pid and started["cwd"] == str(s.dir)
    assert started["argv"][1:] == [str(SCRIPT), "-", "--until", str(s.until)]
    assert summarize(run).status == "running"
    listed = cockpit("runs", "list")
    assert run.id in listed.stdout and "adopted" in listed.stdout.split(run.id)[1].splitlines()[0]

    s.end()   # it exits on its own; its exit status is its parent's (ours here), not cockpit's
    end = finished(run)
    assert end["status"] == "ended"
    ended = events(run, "attempt_ended")[-1]
    assert ended["outcome"] == "ended" and ended["exit_code"] is None
    assert ended["exit"] == adopted.UNKNOWN_EXIT and ended["last_step"] >= steps[0]["step"]
    assert not events(run, "crash")
    assert "done" in run.attempt_log(1).read_text()   # its log, copied into the run directory
    shown = cockpit("runs", "show", run.id).stdout
    assert f"adopted   pid {s.proc.pid}" in shown and "status    ended" in shown

    # started again under cockpit: its argv + the resume arguments, its directory, its
    # environment (recorded, not this shell's)
    resumed = cockpit("runs", "resume", run.id, "--resume-args", "--resumed 'two words'",
                      env={"ADOPT_TEST_TOKEN": "not-recorded"}, cwd=home)
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    again = events(run, "attempt_started")[-1]
    assert again["attempt"] == 2 and again["cwd"] == str(s.dir)
    assert again["command"] == [*started["argv"], "--resumed", "two words"]
    log = run.attempt_log(2).read_text()
    assert f"started in {s.dir} with ['--resumed', 'two words'] token=recorded" in log
    # it resumes where its own arguments say, never "from the start" (issue 39, item 5)
    assert events(run, "run_resumed")[-1]["resume_args"] == ["--resumed", "two words"]
    assert "from where its own arguments say (--resumed two words)" in resumed.stdout
    assert "from the start" not in resumed.stdout
    assert events(run, "run_finished")[-1]["status"] == "finished"
    # a second resume appends to the argv it was adopted with, not to the last one
    config = resumption.plan(run, resumption.History.of(run.events()), resume_args=["--other"])
    assert list(config.workload.params.command) == [*started["argv"], "--other"]


@contextlib.contextmanager
def adopting(*args: str, stderr=subprocess.PIPE):
    """`cockpit adopt ARGS` in the foreground, its output piped; killed if the test leaves it."""
    proc = subprocess.Popen(cockpit_cmd("adopt", *args), stdout=subprocess.PIPE, stderr=stderr,
                            text=True, env=child_env())
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

@linux_only
def test_a_traceback_in_its_log_is_a_crash_said_with_its_unknown_exit_status(home, script):
    s = script("--fail", log="own.log")   # a log file of its own, in its working directory
    with adopting(str(s.proc.pid), "--log", str(s.log), "--json") as adopt:
        first = json.loads(adopt.stdout.readline())
        assert first["type"] == "run_started" and first["adopted"]["log_source"] == "--log"
        wait_until(lambda: json.loads(adopt.stdout.readline())["type"] == "step", "a step printed")
        s.end()
        out, err = adopt.communicate(timeout=TIMEOUT)
    assert adopt.returncode == 1, err
    run = find_run("last")
    crash = events(run, "crash")[-1]
    assert crash["kind"] == "user-code" and "RuntimeError" in crash["sentence"]
    assert "exit status unknown" in crash["sentence"] and crash["evidence"]["exit_code"] is None
    assert finished(run)["status"] == "failed"


@linux_only
def test_cockpit_signals_it_only_when_the_run_is_stopped(home, script):
    s = script()
    run = find_run(cockpit("adopt", str(s.proc.pid), "--detach").stdout.strip())
    wait_until(lambda: events(run, "memory"), "the first memory sample")
    assert s.proc.poll() is None   # adopting signals nothing
    stop = cockpit("runs", "stop", run.id)
    assert stop.returncode == 0 and "SIGINT" in stop.stdout
    assert s.proc.wait(TIMEOUT) != 0   # SIGINT: KeyboardInterrupt
    assert finished(run)["status"] == "stopped"
    assert [e["signal"] for e in events(run, "stop_requested")] == ["SIGINT"]
    assert events(run, "attempt_ended")[-1]["outcome"] == "stopped"


@linux_only
def test_ctrl_c_on_a_foreground_adopt_stops_following_and_leaves_it_running(home, script):
    s = script()
    with adopting(str(s.proc.pid), stderr=subprocess.STDOUT) as adopt:
        wait_until(lambda: (runs := list((home / "runs").glob("*"))) and events(RunDir(runs[0]), "memory"),
                   "the first memory sample")
        adopt.send_signal(signal.SIGINT)
        out, _ = adopt.communicate(timeout=TIMEOUT)
    assert adopt.returncode == 130, out
    run = find_run("last")
    assert finished(run)["status"] == "released"
    assert s.proc.poll() is None   # it runs on, unsignalled
    refused = cockpit("runs", "resume", run.id)
    assert refused.returncode == 2 and "still running" in refused.stderr
    s.end()


@linux_only
def test_a_silent_adopted_process_is_told_as_hung_and_left_running(home, script):
    """The hang watch a started command has, for a process cockpit did not start: a warning,
    never a signal (SIGSTOP makes it silent, whatever the machine's speed)."""
    s = script()
    run = find_run(cockpit("adopt", str(s.proc.pid), "--detach", "--set", "hang_timeout_s=2").stdout.strip())
    wait_until(lambda: events(run, "step"), "its steps")
    os.kill(s.proc.pid, signal.SIGSTOP)
    try:
        hung = wait_until(lambda: [w for w in events(run, "warning") if w["kind"] == "hang"], "the hang warning")
    finally:
        os.kill(s.proc.pid, signal.SIGCONT)
    assert "no output for" in hung[0]["message"] and hung[0]["fallback"] is False
    assert events(run, "stop_requested") == [] and s.proc.poll() is None   # never signalled
    s.end()
    assert s.proc.returncode == 0 and finished(run)["status"] == "ended"


@linux_only
def test_a_supervisor_that_fails_leaves_the_adopted_process_running(home, script, monkeypatch):
    """A bug in cockpit while it follows a process must not take the process with it: a
    process cockpit started would be killed (it must not train on unsupervised); one it found
    goes on as it did before cockpit came."""
    from engine.run.attempt import Attempt
    from engine.run.launchers.adopted import AdoptedLauncher
    from engine.run.supervisor import Supervisor

    s = script()
    run = adoption.create(adoption.inspect(s.proc.pid))

    def broken(self):
        raise RuntimeError("a bug in cockpit")

    monkeypatch.setattr(Attempt, "_sample_health", broken)
    with pytest.raises(RuntimeError, match="a bug in cockpit"):
        Supervisor(run, poll_s=0.05, launcher=AdoptedLauncher(run)).supervise()
    assert s.proc.poll() is None   # unsignalled, still training
    s.end()
    assert s.proc.returncode == 0


# ---------------------------------------------------------------- bad input


def test_bad_pids_and_logs_are_one_line_and_exit_2(home, tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for args, words in ((["adopt", str(gone.pid)], "PID: {}: no such process".format(gone.pid)),
                            (["adopt", str(os.getpid())], "is the process that started cockpit ("),   # its parent
                            (["adopt", "0"], "PID: 0: expected the pid"),
                            (["adopt", "abc"], "argument PID: got 'abc', expected a process id"),
                            (["adopt", str(sleeper.pid), "--log", str(tmp_path / "none.log")],
                             f"--log: {tmp_path / 'none.log'}: cannot be read"),
                            (["adopt", str(sleeper.pid), "--log", str(tmp_path)], "not a regular file")):
            result = cockpit(*args)
            assert result.returncode == 2, (args, result.stderr)
            assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
            assert words in result.stderr, result.stderr
        assert not list((home / "runs").glob("*"))   # nothing written for bad input
    finally:
        sleeper.kill()
        sleeper.wait()


@linux_only
def test_a_missing_log_and_an_unreadable_process_name_the_argument(home, script, monkeypatch):
    s = script()
    with pytest.raises(ConfigError) as e:
        adoption.inspect(s.proc.pid, str(home / "nowhere.log"))
    assert e.value.line().startswith("--log: ") and "cannot be read" in e.value.line()

    def refused(pid, platform=sys.platform):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(procinfo, "read", refused)
    with pytest.raises(ConfigError) as e:
        adoption.inspect(s.proc.pid)
    assert e.value.line().startswith(f"PID: {s.proc.pid}: ") and "another user" in e.value.line()


@linux_only
def test_without_a_file_for_its_output_it_says_progress_needs_log(home):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        found = adoption.inspect(proc.pid)
        assert found.logs == [] and "--log FILE" in found.no_log
        assert "--log FILE" in adoption.inspect(proc.pid, platform="linux").no_log
        monkey = adoption._logs(proc.pid, None, "darwin")
        assert monkey[0] == [] and "on macOS" in monkey[2] and "--log FILE" in monkey[2]
    finally:
        proc.kill()
        proc.wait()


def test_resume_args_are_for_an_adopted_run_only(home):
    from ui_support import copy_run

    run = RunDir(copy_run(home, "finished"))
    with pytest.raises(ConfigError) as e:
        resumption.plan(run, resumption.History.of(run.events()), resume_args=["--x"])
    assert e.value.line().startswith("--resume-args: ") and "cockpit adopt" in e.value.line()


# ---------------------------------------------------------------- its end, judged from its log


@pytest.mark.parametrize("tail, kind, words", [
    ("step 5/10 loss 1\nTraceback (most recent call last):\n  File \"t.py\"\nValueError: bad\n",
     "user-code", "ValueError"),
    ("step 5/10 loss 1\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n", "oom", "memory"),
    ("step 5/10 loss 1\ndone\n", "ended", "at step 5 of 10; its log shows no error"),
    ("Traceback (most recent call last):\n  File \"t.py\"\nKeyboardInterrupt\n", "ended", "KeyboardInterrupt"),
])
def test_its_end_is_judged_from_its_log(tail, kind, words):
    watch = AttemptWatch(1)
    watch.last_step = 5
    verdict = adopted.judge(tail, watch, stopped=False, released=False, pid=1, memory_percent=None, total=10)
    assert verdict.kind == kind and words in verdict.sentence
    assert adopted.UNKNOWN_EXIT in verdict.sentence and verdict.evidence["exit_code"] is None


def test_stopped_and_released_need_no_log():
    watch = AttemptWatch(1)
    tail = "Traceback (most recent call last):\nKeyboardInterrupt\n"
    assert adopted.judge(tail, watch, stopped=True, released=False, pid=7, memory_percent=None,
                         total=None).kind == "stopped"
    assert "pid 7" in adopted.judge("", watch, stopped=False, released=True, pid=7, memory_percent=None,
                                    total=None).sentence


# ---------------------------------------------------------------- its log, copied


def test_the_log_copy_reads_the_history_then_what_is_appended_line_by_line(tmp_path, monkeypatch):
    monkeypatch.setattr(adopted, "HISTORY_BYTES", 40)
    out, err, dest = tmp_path / "out", tmp_path / "err", tmp_path / "attempt-1.log"
    out.write_bytes(b"an early line that is cut off\nstep 1/9 loss 2\nstep 2/9 loss 1\n")
    err.write_bytes(b"")
    copy = adopted.LogCopy([str(out), str(err)], dest)
    assert copy.copy()
    # the last 40 bytes, from the first whole line in them
    assert dest.read_bytes() == b"step 1/9 loss 2\nstep 2/9 loss 1\n"
    with open(out, "ab") as f:
        f.write(b"step 3/9 lo")
    with open(err, "ab") as f:
        f.write(b"warning: x\n")
    copy.copy()
    assert dest.read_bytes().endswith(b"step 2/9 loss 1\nwarning: x\n")   # no half line between
    with open(out, "ab") as f:
        f.write(b"ss 0.5\n")
    copy.copy()
    assert dest.read_bytes().endswith(b"warning: x\nstep 3/9 loss 0.5\n")
    out.write_bytes(b"again\n")   # truncated and written anew
    copy.copy(final=True)
    assert dest.read_bytes().endswith(b"again\n")


# ---------------------------------------------------------------- what a process is


@linux_only
def test_linux_proc_gives_its_argv_cwd_environment_and_output_file(home, script):
    s = script("an arg", "{braces}")
    info = procinfo.read(s.proc.pid)
    assert info.argv == [sys.executable, str(SCRIPT), "-", "--until", str(s.until), "an arg", "{braces}"]
    assert info.cwd == str(s.dir) and info.env["ADOPT_TEST_TOKEN"] == "recorded"
    assert procinfo.output_files(s.proc.pid) == {str(s.out): ["stdout", "stderr"]}
    config = adoption.config_for(adoption.inspect(s.proc.pid), "steps")
    assert config.workload.params.command[-1] == "{{braces}}"   # no placeholder of cockpit's


def procargs2_buffer(argv: list[bytes], env: list[bytes], exec_path: bytes = b"/usr/bin/python3",
                     padding: int = 5) -> bytes:
    """As xnu lays out KERN_PROCARGS2: int32 argc, the executable path, NUL padding, argv
    strings, env strings, an empty string, then the loader's apple[] strings."""
    return (struct.pack("=i", len(argv)) + exec_path + b"\0" * padding
            + b"".join(a + b"\0" for a in argv) + b"".join(e + b"\0" for e in env)
            + b"\0" + b"ptr_munge=\0executable_path=/usr/bin/python3\0")


def test_kern_procargs2_buffer_is_parsed():
    buf = procargs2_buffer([b"python3", b"train.py", b"--lr", b"3e-4", b""],
                           [b"PATH=/usr/bin:/bin", b"HF_HOME=/Volumes/x y", b"EMPTY="])
    exec_path, argv, env = procinfo.parse_procargs2(buf)
    assert exec_path == "/usr/bin/python3"
    assert argv == ["python3", "train.py", "--lr", "3e-4", ""]   # an empty argument kept
    assert env == ["PATH=/usr/bin:/bin", "HF_HOME=/Volumes/x y", "EMPTY="]   # not apple[]
    assert procinfo.parse_procargs2(procargs2_buffer([b"a"], [], padding=1))[1:] == (["a"], [])
    for bad in (b"\x01\x00", struct.pack("=i", 3) + b"/bin/x\0\0a\0b\0",
                struct.pack("=i", 1) + b"/bin/x-with-no-end"):
        with pytest.raises(ValueError):
            procinfo.parse_procargs2(bad)


SYSCTL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_uint, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_size_t)


def fake_sysctl(buffers: dict[int, bytes]):
    """A C-callable stand-in for sysctl(3): kern.argmax, and kern.procargs2 for the pids given."""
    def impl(name, namelen, oldp, oldlenp, newp, newlen):
        mib = [name[i] for i in range(namelen)]
        if mib == [procinfo.CTL_KERN, procinfo.KERN_ARGMAX]:
            data = struct.pack("=i", 4096)
        elif mib[:2] == [procinfo.CTL_KERN, procinfo.KERN_PROCARGS2] and mib[2] in buffers:
            data = buffers[mib[2]]
        else:
            return -1
        ctypes.memmove(oldp, data, min(len(data), oldlenp[0]))
        oldlenp[0] = min(len(data), oldlenp[0])
        return 0
    return SYSCTL(impl)


def test_macos_reads_through_sysctl_kern_procargs2(monkeypatch):
    me = os.getpid()
    fn = fake_sysctl({me: procargs2_buffer([b"python3", b"train.py", b"\xff"],
                                           [b"TOKEN=1", b"BAD=\xfe", b"NOEQUALS"])})
    monkeypatch.setattr(procinfo, "_sysctl", lambda: fn)
    info = procinfo.read(me, platform="darwin")
    assert info.argv[:2] == ["python3", "train.py"] and info.cwd == os.getcwd()
    assert info.env == {"TOKEN": "1"} and info.undecodable == ["argument 2", "BAD"]
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with pytest.raises(ProcessLookupError):   # refused, and no such process: gone
        procinfo.read(gone.pid, platform="darwin")
    with pytest.raises(PermissionError):      # refused, and it exists: not ours to read
        procinfo.read(psutil.Process().ppid(), platform="darwin")


# ---------------------------------------------------------------- the runs screen's a


@linux_only
def test_a_on_the_runs_screen_adopts_a_pid_and_attaches_at_80x24(home, script):
    from textual.widgets import Input
    from textual.widgets._footer import FooterKey

    from cockpit.app import make_app
    from cockpit.ui.adopt import AdoptScreen
    from cockpit.ui.dashboard import DashboardScreen
    from ui_support import open_runs, run as run_async, wait_for

    s = script()

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=(80, 24)) as pilot:
            screen = await open_runs(app, pilot, 0)
            # shown at 80 columns; the footer composes its keys after a refresh (call_after_refresh)
            await wait_for(pilot, lambda: "adopt" in [k.action for k in screen.query(FooterKey)],
                           what="Adopt in the footer")
            await pilot.press("a")
            await wait_for(pilot, lambda: isinstance(app.screen, AdoptScreen), what="the adopt dialog")
            dialog = app.screen
            dialog.query_one("#adopt-pid", Input).value = "0"
            await pilot.press("enter")
            await pilot.pause()
            assert "PID: 0: expected the pid" in str(dialog.query_one("#adopt-error").render())
            assert app.screen is dialog   # stays open to fix it
            dialog.query_one("#adopt-pid", Input).value = str(s.proc.pid)
            dialog.query_one("#adopt-pid", Input).focus()
            await pilot.press("enter")
            await wait_for(pilot, lambda: isinstance(app.screen, DashboardScreen), what="its dashboard")
            dashboard = app.screen
            await wait_for(pilot, lambda: dashboard.model.step >= 3, what="its steps on the dashboard")
            run = dashboard.run
            assert run.id.split("-")[-2] == "adopted"
            s.end()
            await wait_for(pilot, lambda: dashboard.model.status == "ended", what="its end on the dashboard")
        return run

    run = run_async(drive())
    assert finished(run)["status"] == "ended"


def test_an_adopted_argv_s_batch_and_accumulation_make_its_samples_per_step(home):
    """`--bs 32 --accum 16` in the argv it was adopted with: 512 samples a step, from the argv
    (issue 39, item 5: the accumulation was read for the count of batches, the batch was not)."""
    argv = [sys.executable, "train.py", "--bs", "32", "--accum", "16", "--lr", "3e-4"]
    run = adoption.create(adoption.Adoption(pid=os.getpid(), start=0.0, argv=argv, cwd=str(home), env={}))
    units = adopted.AdoptedLauncher(run).launch(1, adoption.PRESET, run.config().device).units
    assert (units.samples_per_step, units.samples_source, units.said) == (512, "argv", "--bs 32 x --accum 16")
    assert units.accumulation == 16
    # a micro-batch alone is no step: the script may accumulate by default
    run = adoption.create(adoption.Adoption(pid=os.getpid(), start=0.0, argv=argv[:4], cwd=str(home), env={}))
    assert adopted.AdoptedLauncher(run).launch(1, adoption.PRESET, run.config().device).units.samples_per_step is None


def test_a_resumed_adopted_run_says_it_resumes_through_its_own_arguments(home):
    from cockpit.present.lines import human_line

    argv = [sys.executable, "train.py", "--config", '{"lr": 3e-4}']
    run = adoption.create(adoption.Adoption(pid=os.getpid(), start=0.0, argv=argv, cwd=str(home), env={}))
    history = resumption.History(adopted={"argv": argv})
    config = resumption.plan(run, history, resume_args=["--resume", "ckpt/last.pt"])
    assert resumption.own_resume_args(history, config) == ["--resume", "ckpt/last.pt"]
    assert resumption.own_resume_args(history, run.config()) == []   # none given
    line = human_line({"type": "run_resumed", "run": run.id, "next_attempt": 2, "device_preset": "adopted",
                       "resume": None, "resume_args": ["--resume", "ckpt/last.pt"]})
    assert line.endswith("attempt 2 on adopted, from where its own arguments say (--resume ckpt/last.pt)")

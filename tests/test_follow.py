"""Following a run until it ends (engine.run.follow): the one loop under the TUI's worker and
`cockpit runs follow`, with one end test -- nothing at work on the run (no lock held, no
orphaned attempt) and its end read, or no news."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from conftest import child_env, cockpit_cmd
from engine.record.events import EventWriter
from engine.record.identity import ProcessId
from engine.record.rundir import RunDir, find_run
from engine.run.follow import follow

DEADLINE_S = 120


def a_run(tmp_path) -> tuple[RunDir, EventWriter]:
    path = tmp_path / "runs" / "20261126-000000-loop-cpu-0000"
    path.mkdir(parents=True)
    run = RunDir(path)
    return run, EventWriter(run.events_path)


def test_a_run_ends_once_its_end_is_read_and_nothing_holds_it(tmp_path):
    run, writer = a_run(tmp_path)
    lock = run.try_lock()                  # its supervisor, here
    run.write_supervisor_pid(os.getpid())
    writer.emit("run_started", run=run.id)
    writer.emit("step", attempt=1, step=1)
    batches = follow(run, poll_s=0)
    first = next(batches)
    assert [e["type"] for e in first.events] == ["run_started", "step"]
    assert first.live and not first.ended and first.end is None
    assert next(batches).events == []      # no news from a run at work is not its end
    writer.emit("run_finished", status="finished")
    read = next(batches)
    assert read.end["status"] == "finished" and read.live and not read.ended
    run.pid_path.unlink()                  # its supervisor has exited ...
    gone = next(batches)
    assert not gone.live and not gone.ended  # ... but the lock is held: a lifeline may still write
    writer.emit("warning", kind="late", message="written before the lock was let go")
    os.close(lock)
    last = next(batches)
    assert last.ended and not last.live and last.end["status"] == "finished"
    assert [e["type"] for e in last.events] == ["warning"]   # the last word is read, not lost
    assert next(batches, None) is None


def test_a_live_supervisor_holding_no_lock_is_at_work(tmp_path):
    # (the recorded runs the UI tests make look live: a live pid, no lock)
    run, writer = a_run(tmp_path)
    run.write_supervisor_pid(os.getpid())
    writer.emit("run_started", run=run.id)
    batches = follow(run, poll_s=0)
    assert next(batches).live and not next(batches).ended
    run.pid_path.unlink()
    assert next(batches).ended


def test_a_run_resumed_after_its_end_is_followed_on(tmp_path):
    run, writer = a_run(tmp_path)
    writer.emit("run_started", run=run.id)
    writer.emit("run_finished", status="stopped")
    lock = run.try_lock()                  # `cockpit runs resume`'s supervisor took it
    writer.emit("run_resumed", run=run.id)
    batches = follow(run, poll_s=0)
    assert not next(batches).ended
    os.close(lock)
    last = next(batches)
    assert last.ended and last.end is None   # a lost run: no end, nobody at work, no news


def test_a_run_whose_supervisor_died_with_nothing_left_ends_with_no_news(tmp_path):
    run, writer = a_run(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    run.pid_path.write_text(f"{dead.pid} 0\n")   # a supervisor killed with its lifeline
    writer.emit("run_started", run=run.id)
    writer.emit("step", attempt=1, step=3)
    batches = follow(run, poll_s=0)
    first = next(batches)
    assert len(first.events) == 2 and not first.live and not first.ended
    last = next(batches)
    assert last.ended and last.end is None and last.events == []


def test_an_attempt_running_on_without_its_supervisor_is_not_the_end(tmp_path):
    run, writer = a_run(tmp_path)
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = ProcessId.of(orphan.pid)
        writer.emit("run_started", run=run.id)
        writer.emit("attempt_process", attempt=1, pid=me.pid, start=me.start)
        batches = follow(run, poll_s=0)
        next(batches)
        assert not next(batches).ended    # `cockpit runs stop` is still to stop it
    finally:
        orphan.kill()
        orphan.wait()
    assert next(batches).ended


LOOP = textwrap.dedent("""
    import pathlib, sys, time
    out = pathlib.Path(sys.argv[1])
    for step in range(1, 100000):
        print(f"step {step} loss {1 / step:.4f}", flush=True)
        if step == 3:
            (out / "ckpt-3.txt").write_text("3")
        time.sleep(0.05)
""")


def test_a_run_whose_supervisor_is_killed_ends_with_its_lifelines_word(home, tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    started = subprocess.run(cockpit_cmd("run", "-d", "cpu", "--detach",
                                         "--set", f"command.checkpoints={tmp_path}/ckpt-*.txt",
                                         "--", sys.executable, str(script), str(tmp_path)),
                             capture_output=True, text=True, env=child_env(), timeout=DEADLINE_S)
    assert started.returncode == 0, started.stderr
    run = find_run(started.stdout.split()[0])
    seen, killed, live_after_kill = [], False, []
    deadline = time.monotonic() + DEADLINE_S
    for batch in follow(run, poll_s=0.05):
        assert time.monotonic() < deadline, "the follow did not end"
        seen += batch.events
        if killed:
            live_after_kill.append(batch.live)
        elif any(e["type"] == "step" and e["step"] >= 3 for e in seen):
            supervisor = ProcessId.parse(run.pid_path.read_text())
            os.kill(supervisor.pid, signal.SIGKILL)
            # gone once the kernel has run its exit (a loaded machine may take more than a
            # poll to): from then on, every look must see it gone
            while supervisor.alive():
                assert time.monotonic() < deadline, "the killed supervisor never exited"
                time.sleep(0.01)
            killed = True
    assert batch.ended and batch.end["type"] == "run_interrupted"
    assert live_after_kill and not any(live_after_kill)   # the pid's process is gone at the next look
    assert seen == run.events()               # everything, the lifeline's last words too

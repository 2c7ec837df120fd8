"""The step an attempt reached, exact at its death: published every optimizer step
(engine.record.reached) by the trainer and by cockpit.report, read by the supervisor after the
process is gone, so the crash sentence, steps lost and the fault line agree with where training
was, not with the last report half a second before."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from conftest import TINY, child_env, cockpit_cmd, user_preset
from engine import runconfig
from engine.record import reached, stats
from engine.record.rundir import RunDir, list_runs, summarize
from engine.run.supervisor import Supervisor


def test_a_published_step_survives_the_sigkill_of_its_publisher(tmp_path):
    path = reached.path_of(tmp_path, 3)
    reader = reached.Reader(path)
    assert reader.read() is None   # nothing published yet: no file
    script = textwrap.dedent(f"""\
        import os, signal
        from engine.record.reached import Publisher
        p = Publisher({str(path)!r})
        for step in range(1, 42):
            p.publish(step, step * 32)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], env=child_env(), timeout=60)
    assert done.returncode == -9
    assert reader.read() == (41, 41 * 32)
    reached.Publisher(path).publish(42)   # samples not known
    assert reader.read() == (42, None)


def test_a_publisher_that_published_nothing_reads_as_nothing(tmp_path):
    """The trainer makes its publisher before it builds data and model: a file that reads as
    step 0 then would tell the supervisor a step was done, and start-up (its data, its model,
    its first step's compile) would be judged by hang_timeout_s instead of the start-up's."""
    path = reached.path_of(tmp_path, 1)
    first = reached.Publisher(path)
    assert reached.Reader(path).read() is None
    first.publish(5, 40)
    reached.Publisher(path)   # a second in the same attempt (a callback and cockpit.report)
    assert reached.Reader(path).read() == (5, 40)


def test_a_trainer_crash_between_reports_is_told_at_the_step_it_reached(home):
    # No report but the checkpoint's: the last step reported is the checkpoint's, 4. The fault
    # fires as step 7 begins, with 6 done.
    user_preset(home, "devices", "alone", 'device = "cpu"\nbatch_size = 8\naccumulation = 1\nthreads = 1\n')
    config = runconfig.resolve("matmul", "alone", TINY + [
        "batch_size=8", "accumulation=1", "train.report_every_s=3600", "train.checkpoint_every_steps=4",
        "train.checkpoint_every_minutes=0", "inject=['native-crash@7']"])
    run = RunDir.create(config)
    assert Supervisor(run, poll_s=0.05).supervise() == "finished"
    events = run.events()
    (fired,) = [e for e in events if e["type"] == "fault_injected"]
    (crash,) = [e for e in events if e["type"] == "crash"]
    first_end = next(e for e in events if e["type"] == "attempt_ended")
    assert fired["step"] == 7
    assert crash["evidence"]["last_step"] == first_end["last_step"] == 6
    assert "after step 6 " in crash["sentence"]
    assert first_end["samples_seen"] == 6 * 8
    assert summarize(run).attempts[0].last_step == 6   # runs show, the runs screen
    assert stats.fold(events).steps_lost == 2   # steps 5 and 6, trained again from step 4
    (finished,) = [e for e in events if e["type"] == "run_finished"]
    assert finished["summary"]["steps_lost"] == 2


# Reports every 10 steps, says each step reached, checkpoints every 20 and, in its first
# attempt, dies at step 37 with no Python traceback (a native crash).
SCRIPT = """\
    import json, os, sys
    from cockpit import report
    out, resume = sys.argv[1], sys.argv[2:]
    os.makedirs(out, exist_ok=True)
    start = json.load(open(resume[-1]))["step"] if resume else 0
    for step in range(start + 1, 61):
        report.reached(step, samples=step * 4)
        print(f"trained step {step}", flush=True)
        if step == 37 and not resume:
            os.abort()
        if step % 10 == 0:
            report.step(step, total=60, loss=1 / step, samples=step * 4)
        if step % 20 == 0:
            path = os.path.join(out, f"ckpt-{step}.json")
            json.dump({"step": step}, open(path, "w"))
            report.checkpoint(path, step, samples=step * 4)
"""


def test_a_command_that_says_each_step_reached_is_told_at_the_step_it_died(home, tmp_path):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(cockpit_cmd(
        "run", "-d", "cpu", "--set", "command.resume=['{checkpoint}']",
        "--", sys.executable, str(path), "{run_dir}/out"),
        capture_output=True, text=True, env=child_env(), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = list_runs()
    events = run.events()
    # the script's own word: the last step it trained before it died
    died_after = max(int(s) for s in re.findall(r"^trained step (\d+)$", run.attempt_log(1).read_text(), re.M))
    (crash,) = [e for e in events if e["type"] == "crash"]
    assert crash["kind"] == "native-crash"
    assert crash["evidence"]["last_step"] == died_after
    assert f"after step {died_after} " in crash["sentence"]
    assert stats.fold(events).steps_lost == died_after - 20   # resumed from its checkpoint at 20
    assert f"{died_after - 20} steps lost to crashes" in done.stdout

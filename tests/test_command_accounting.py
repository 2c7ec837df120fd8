"""Steps lost, one figure everywhere: a command that crashes and resumes from its own checkpoint,
end to end through `cockpit run --inject`, against what the script's own log says it trained
again. run_finished (the headless last lines, the alerts), `cockpit runs show` and the run's
fold of its events (engine.record.stats, behind runs list/compare and the TUI) must agree."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

from cockpit.ui.model import RunModel
from conftest import child_env, cockpit_cmd
from engine.record import stats
from engine.record.digest import RunDigest
from engine.record.rundir import list_runs

# Prints every step it trains; a checkpoint every 50 steps, named with its step or one file
# rewritten (whose name says nothing: cockpit learns the step only from the next attempt).
SCRIPT = """\
    import json, os, sys, time
    out, naming, resume = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(out, exist_ok=True)
    start = 0
    if resume:
        start = json.load(open(resume[-1]))["step"]
        print(f"resumed from {resume[-1]} at step {start}", flush=True)
    for step in range(start + 1, 201):
        time.sleep(0.01)
        print(f"step {step}/200 loss={1 / step:.4f}", flush=True)
        if step % 50 == 0:
            name = f"ckpt-{step:04d}.json" if naming == "named" else "last.json"
            tmp = os.path.join(out, "tmp")
            with open(tmp, "w") as f:
                json.dump({"step": step}, f)
            os.replace(tmp, os.path.join(out, name))
    print("done", flush=True)
"""


def trained_again(run) -> int:
    """What the script's logs say: the last step attempt 1 printed, less the step attempt 2
    resumed from."""
    reached = max(int(n) for n in re.findall(r"^step (\d+)/", run.attempt_log(1).read_text(), re.M))
    (resumed,) = re.findall(r"at step (\d+)$", run.attempt_log(2).read_text(), re.M)
    return reached - int(resumed)


@pytest.mark.parametrize("naming", ["named", "rewritten"])
def test_steps_lost_are_what_the_script_trained_again_everywhere(home, tmp_path, naming):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(cockpit_cmd(
        "run", "-d", "cpu", "--inject", "native-crash@120",
        "--set", "command.resume=['{checkpoint}']", "--set", "command.checkpoints={run_dir}/out/*.json",
        "--", sys.executable, str(path), "{run_dir}/out", naming),
        capture_output=True, text=True, env=child_env(), timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = list_runs()
    events = run.events()
    assert [e["outcome"] for e in events if e["type"] == "attempt_ended"] == ["native-crash", "finished"]
    truth = trained_again(run)
    assert truth > 0   # resumed from step 100, after the crash past step 120

    lost = stats.fold(events).steps_lost
    if naming == "named":
        assert lost == truth
    else:
        # The checkpoint's step is in no event: the next attempt's first reported step stands in
        # for it. This script prints a step once it has trained it, so that is one past the step
        # it resumed from: a lower bound, by one step, never the whole attempt from step 0.
        assert lost == truth - 1
    (finished,) = [e for e in events if e["type"] == "run_finished"]
    assert finished["summary"]["steps_lost"] == lost
    assert f"{lost} steps lost to crashes" in done.stdout   # the headless last lines
    shown = subprocess.run(cockpit_cmd("runs", "show", run.id, "--json"), capture_output=True,
                           text=True, env=child_env(), timeout=60)
    shown = json.loads(shown.stdout)
    assert shown["steps_lost"] == lost
    # each checkpoint the script wrote, with the step it holds or, for the one rewritten file,
    # a step it holds at least (the step read before the write)
    writes = shown["checkpoint_writes"]
    written = re.findall(r"^step (\d+)/", run.attempt_log(1).read_text() + run.attempt_log(2).read_text(), re.M)
    saved = sorted({int(s) for s in written if int(s) % 50 == 0})
    if naming == "named":
        assert [w["step"] for w in writes] == saved and {w["step_source"] for w in writes} == {"name"}
    else:
        assert {w["step_source"] for w in writes} == {"reached"}
        assert all(w["step"] <= s for w, s in zip(writes, saved))
    digest = RunDigest(run)   # the runs screen and compare
    digest.refresh()
    assert digest.summary.steps_lost == digest.averages.steps_lost == lost
    model = RunModel()        # the dashboard, fed the events as its worker reads them: the
    for i, e in enumerate(events):   # figure of the events so far at each one, not only at the end
        model.fold([e])
        assert model.steps_lost == stats.fold(events[:i + 1]).steps_lost, e
    assert model.steps_lost == lost

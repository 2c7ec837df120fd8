"""A health finding answered by going back (engine.run.rewind): the right checkpoint, the batches
skipped exactly, the learning rate lowered, the limit, what a command is given, and the
checkpoint retention that keeps a target to go back to."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from engine.preset_types import HealthSettings
from engine.record import checkpoint
from engine.record.rundir import list_runs, summarize
from engine.run.rewind import Rewinds

from test_training_health import sine

# Checkpoints every 25 steps, a rewind 20 steps before the spike, 10 batches skipped at least.
REWINDING = ["--set", "train.checkpoint_every_steps=25", "--set", "health.rewind_steps=20",
             "--set", "health.skip_batches=10"]


def newest(home):
    return max(list_runs(home / "runs"), key=lambda r: r.path.stat().st_mtime)


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


@pytest.mark.health_findings   # its runs are meant to go bad
def test_a_spike_is_rewound_to_the_checkpoint_before_it_and_its_batches_skipped_exactly(home):
    done, events = sine(home, *REWINDING, "--inject", "spike@300")
    assert done.returncode == 0, done.stdout[-3000:]
    (finding,) = of(events, "health")
    first = min(e["step"] for e in events if e["type"] == "step" and e["step"] >= 300)
    assert finding["kind"] == "loss-spike" and finding["step"] == first and finding["action"] == "rewind"
    assert finding["began"] <= 300
    (back,) = of(events, "fallback")
    rewind = back["rewind"]
    # the newest checkpoint at least 20 steps before the spike began, kept whatever the pruning
    # (which of those is still on disk depends on how far the attempt got before it was ended:
    # keep_checkpoints prunes, the oldest is kept until one is a minute old)
    assert rewind["to_step"] is not None and rewind["to_step"] <= finding["began"] - 1 - 20
    assert rewind["to_step"] % 25 == 0
    assert back["action"] == "rewind" and back["to_preset"] == back["from"]
    assert f"rewound to {rewind['to_step']:,}, skipping {rewind['skip_batches']:,} batches" in back["why"]
    # every batch the first attempt trained past the target is skipped, and at least 10
    first_ended = of(events, "attempt_ended")[0]
    assert first_ended["outcome"] == "health"
    assert rewind["skip_batches"] == max(10, first_ended["last_step"] - rewind["to_step"])
    # the checkpoints after it set aside, so that no resume finds them
    assert rewind["set_aside"] and all(
        p.endswith(".rewound") and checkpoint.step_of(Path(p.removesuffix(".rewound"))) > rewind["to_step"]
        for p in rewind["set_aside"])
    # the next attempt resumed there, its data that many batches further on, by sample position
    ready = [e for e in of(events, "trainer_ready") if e["attempt"] == 2][0]
    resumed = ready["resumed_from"]
    assert resumed["step"] == rewind["to_step"]
    assert resumed["data_position"] == resumed["samples_seen"] + rewind["skip_batches"] * 64
    # the run ends where its twin does, its loss close to the unspiked twin's
    finished = of(events, "run_finished")[0]
    assert finished["status"] == "finished" and finished["summary"]["final_step"] == 480
    assert finished["summary"]["steps_rewound"] == first_ended["last_step"] - rewind["to_step"]
    assert finished["summary"]["goodput"]["buckets"]["rewound"] > 0
    assert "rewind: attempt 2 on" in done.stdout and "steps rewound" in done.stdout
    # runs show: the finding and what was done about it
    (shown,) = [f for f in summarize(newest(home)).health if f["kind"] == "loss-spike"]
    assert shown["done"] == f"rewound to {rewind['to_step']:,}, skipping {rewind['skip_batches']:,} batches"
    twin_done, twin = sine(home)
    assert twin_done.returncode == 0 and not of(twin, "health")
    # what each model learned, on the same held-out samples (a last window's loss is a few
    # noisy steps' mean on a loaded machine); the two train on different batches after the
    # rewind, so the rewound one ends near its twin, not equal (0.94-0.99 each in CI)
    r2, twin_r2 = (of(e, "eval")[-1]["metrics"]["r2"] for e in (events, twin))
    assert twin_r2 > 0.8 and r2 > twin_r2 - 0.1, (r2, twin_r2)


@pytest.mark.health_findings   # its runs are meant to go bad
def test_lower_lr_halves_the_learning_rate_from_the_rewind_on(home):
    done, events = sine(home, *REWINDING, "--inject", "spike@300", "--set", "health.on_spike=lower-lr")
    assert done.returncode == 0, done.stdout[-3000:]
    (back,) = of(events, "fallback")
    assert back["action"] == "lower-lr" and back["rewind"]["lr_scale"] == 0.5
    assert "the learning rate x0.5" in back["why"]
    before = {e["lr"] for e in of(events, "step") if e["attempt"] == 1}
    after = {e["lr"] for e in of(events, "step") if e["attempt"] == 2}
    (lr,) = before   # a constant schedule
    assert len(after) == 1 and after.pop() == pytest.approx(lr / 2)


@pytest.mark.health_findings   # its runs are meant to go bad
def test_a_spike_that_keeps_coming_back_stops_the_run_at_the_limit(home):
    # the second in every attempt ('+'): a loaded machine's first attempt may train past 350
    # before it is ended, and a fault fires once a run
    done, events = sine(home, *REWINDING, "--set", "health.max_rewinds=1",
                        "--inject", "spike@200", "--inject", "spike@350+")
    assert [e["action"] for e in of(events, "fallback")] == ["rewind"]
    (failed,) = of(events, "run_failed")
    assert failed["kind"] == "health" and "max_rewinds 1" in failed["reason"]
    assert of(events, "run_finished")[0]["status"] == "failed" and done.returncode != 0


def test_rewinds_tell_an_attempt_what_to_skip_for_the_checkpoint_it_resumes_from():
    rewinds = Rewinds(HealthSettings())
    assert rewinds.attach(None) is None and rewinds.attach({"path": "a"}) == {"path": "a"}
    rewinds.done += [dict(checkpoint="checkpoints/step-100.pt", skip_batches=200, lr_scale=1.0, step=150),
                     dict(checkpoint="checkpoints/step-100.pt", skip_batches=300, lr_scale=0.5, step=160),
                     dict(checkpoint="checkpoints/step-400.pt", skip_batches=200, lr_scale=0.5, step=460)]
    same = rewinds.attach({"path": "checkpoints/step-100.pt", "step": 100})["rewind"]
    assert (same["skip_batches"], same["lr_scale"]) == (500, 0.5)   # both went back to it
    later = rewinds.attach({"path": "checkpoints/step-600.pt", "step": 600})["rewind"]
    # a later checkpoint of the trainer keeps what was skipped before it: nothing more to skip
    assert (later["skip_batches"], later["lr_scale"]) == (0, 1.0)
    # a command's checkpoint keeps nothing of it: the run's whole
    assert (later["run_skip_batches"], later["run_lr_scale"]) == (700, 0.25)


def test_a_command_is_given_the_rewinds_through_its_placeholders():
    from engine import command
    from engine.preset_types import DevicePreset

    spec = command.CommandSpec(command=("python", "train.py", "--skip", "{skip_batches}",
                                        "--offset", "{data_offset}", "--lr-scale", "{lr_scale}"))
    preset = DevicePreset(device="cpu", batch_size=8, accumulation=4)
    values = command.values(preset, ".", 2, rewind={"run_skip_batches": 300, "run_lr_scale": 0.5})
    assert command.fill(spec.command, values)[2:] == ["--skip", "300", "--offset", "9600",
                                                       "--lr-scale", "0.5"]
    untouched = command.values(preset, ".", 1)
    assert (untouched["skip_batches"], untouched["data_offset"], untouched["lr_scale"]) == ("0", "0", "1")


def test_retention_keeps_a_checkpoint_old_enough_to_go_back_to(tmp_path):
    pytest.importorskip("torch")
    for step in range(10, 110, 10):
        checkpoint.save(tmp_path, {"step": step}, keep=3, keep_before=30)
    # written just now: none is a minute old, so the oldest stays the target
    assert [checkpoint.step_of(p) for p in checkpoint.checkpoint_files(tmp_path)] == [10, 80, 90, 100]
    old = time.time() - 2 * checkpoint.ANCHOR_AGE_S
    for p in checkpoint.checkpoint_files(tmp_path):
        os.utime(p, (old, old))
    for step in (110, 120):
        checkpoint.save(tmp_path, {"step": step}, keep=3, keep_before=30)
    # the newest at least 30 steps and a minute older than the newest: 90 (10 and 80 pruned)
    assert [checkpoint.step_of(p) for p in checkpoint.checkpoint_files(tmp_path)] == [90, 100, 110, 120]
    # without a rule that rewinds, the last 3 only
    checkpoint.save(tmp_path, {"step": 130}, keep=3)
    assert [checkpoint.step_of(p) for p in checkpoint.checkpoint_files(tmp_path)] == [110, 120, 130]


@pytest.mark.health_findings   # its run is meant to go bad
def test_a_command_is_rewound_to_its_checkpoint_and_skips_its_bad_batch_by_its_placeholder(home, tmp_path):
    import json
    import subprocess
    import sys

    from conftest import ROOT, child_env, cockpit_cmd

    script = ROOT / "tests" / "scripts" / "bad_batch.py"
    bad = 200
    done = subprocess.run(cockpit_cmd(
        "run", "-d", "cpu", "--json",
        "--set", 'command.resume=["--resume", "{checkpoint}"]',
        # judged from the 4th report (a command's report is a second of its output)
        "--set", "health.min_reports=4", "--set", "health.rewind_steps=10", "--set", "health.skip_batches=5",
        "--", sys.executable, str(script), "--out", "{run_dir}/out", "--skip", "{skip_batches}",
        "--bad-index", str(bad), "--total", "260"),
        capture_output=True, text=True, env=child_env(), timeout=600, cwd=tmp_path)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, (done.stderr[-3000:], events[-5:])
    (finding,) = of(events, "health")
    assert finding["kind"] == "loss-spike" and finding["action"] == "rewind" and finding["began"] <= bad + 1
    (back,) = of(events, "fallback")
    rewind = back["rewind"]
    assert rewind["skips"] and rewind["to_step"] <= finding["began"] - 1 - 10 and rewind["to_step"] % 10 == 0
    assert rewind["checkpoint"].endswith(f"ckpt-{rewind['to_step']}.json")
    run_dir = newest(home).path
    # the script's own truth: the second attempt began at the checkpoint, that many batches on,
    # and the corrupted batch was trained once, before the rewind, never again
    log = (run_dir / "attempt-2.log").read_text()
    skip = rewind["skip_batches"]
    assert f"starting at step {rewind['to_step']}, data index {rewind['to_step'] + skip} (skip {skip})" in log
    trained = [int(i) for i in (run_dir / "out" / "trained.txt").read_text().split()]
    assert trained.count(bad) == 1 and skip >= 5
    assert [e["outcome"] for e in of(events, "attempt_ended")] == ["health", "finished"]


@pytest.mark.health_findings   # its run is meant to go bad
def test_a_rehearsed_spike_in_a_command_takes_the_whole_path(home, tmp_path):
    """--inject spike@N on a command that reports through cockpit.report: its reported loss at
    step N fifty times its own, found, rewound, and the script started again from before it."""
    import json
    import subprocess
    import sys

    from conftest import ROOT, child_env, cockpit_cmd

    done = subprocess.run(cockpit_cmd(
        "run", "-d", "cpu", "--json", "--inject", "spike@200",
        "--set", 'command.resume=["--resume", "{checkpoint}"]', "--set", "health.min_reports=4",
        "--set", "health.rewind_steps=10", "--set", "health.skip_batches=5",
        "--", sys.executable, str(ROOT / "tests" / "scripts" / "bad_batch.py"), "--out", "{run_dir}/out",
        "--skip", "{skip_batches}", "--bad-index", "-1", "--total", "240"),
        capture_output=True, text=True, env=child_env(), timeout=600, cwd=tmp_path)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0, (done.stderr[-3000:], events[-5:])
    (fired,) = of(events, "fault_injected")
    (finding,) = of(events, "health")
    assert fired["step"] == 200 and finding["kind"] == "loss-spike" and finding["began"] <= 200
    (back,) = of(events, "fallback")
    assert back["rewind"]["to_step"] <= finding["began"] - 1 - 10
    assert [e["outcome"] for e in of(events, "attempt_ended")] == ["health", "finished"]


def test_diverge_is_refused_for_a_command_in_one_line(home, capsys):
    from cockpit import cli

    assert cli.main(["run", "-d", "cpu", "--inject", "diverge@5", "--", "python", "train.py"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "diverge raises the learning rate of cockpit's own trainer" in err[0]

"""A command's gradient-norm explosion, caught from what it prints: an HF Trainer-shaped script
(tests/scripts/hf_grad_norm.py: its tqdm bar and its log dicts as transformers 5.23.0 prints
them) whose logged grad_norm is ~1e3 for one step, supervised end to end through the real CLI
and supervisor (`cockpit run -- ...`), with the default [health] settings; its twin, the same
output without the explosion, is no finding at all.

The script is paced by the supervisor's own step events, not by sleeps (see its docstring), so
the reports the detectors judge, and the step they judge each at, are the same on every run."""

from __future__ import annotations

import pytest

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from conftest import ROOT, child_env, cockpit_cmd
from engine.command.progress import OutputParser
from engine.command.tracker import Tracker
from engine.preset_types import HealthSettings
from engine.run.training_health import TrainingHealth

SCRIPT = str(ROOT / "tests" / "scripts" / "hf_grad_norm.py")
STEPS, SYNC_EVERY = 66, 3
EXPLODES_AT = 57   # the 19th report: the detectors judge from the 17th (min_reports 16)


def start(tmp_path: Path, name: str, *script_args: str) -> tuple[subprocess.Popen, Path]:
    """`cockpit run --json -- python hf_grad_norm.py ...`, its events (stdout) to a file."""
    out = tmp_path / f"{name}.jsonl"
    with open(out, "w") as stdout, open(tmp_path / f"{name}.err", "w") as stderr:
        process = subprocess.Popen(
            cockpit_cmd("run", "-d", "cpu", "--json", "--", sys.executable, SCRIPT,
                        "--events", "{run_dir}/events.jsonl", "--steps", str(STEPS),
                        "--sync-every", str(SYNC_EVERY), *script_args),
            stdout=stdout, stderr=stderr, env=child_env())
    return process, out


def finished(process: subprocess.Popen, out: Path) -> list[dict]:
    """Its events once it has exited 0, its one attempt finished."""
    code = process.wait(timeout=240)
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert code == 0, (out.with_suffix(".err").read_text()[-3000:], events[-5:])
    ended = [e for e in events if e["type"] == "attempt_ended"]
    assert [(e["outcome"], e["exit_code"]) for e in ended] == [("finished", 0)], ended
    return events


def stop(process: subprocess.Popen) -> None:
    """A supervisor still running (a failed test): stopped as Ctrl-C stops it, its script with
    it; what is left after 30 s is killed, its children first."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        for child in psutil.Process(process.pid).children(recursive=True):
            child.kill()
        process.kill()
        process.wait()


def norm(event: dict) -> float:
    """The norm the detectors judge a step event by: its window's largest, else its last."""
    return event.get("grad_norm_max", event.get("grad_norm"))


@pytest.mark.health_findings   # its runs are meant to go bad
def test_an_hf_commands_printed_grad_norm_explosion_is_caught_at_its_step(home, tmp_path):
    # both at once: each waits on its own supervisor's reports, a second or so each
    runs = [start(tmp_path, "exploded", "--explode-at", str(EXPLODES_AT)), start(tmp_path, "twin")]
    try:
        exploded, twin = [finished(*run) for run in runs]
    finally:
        for process, _ in runs:
            stop(process)

    (finding,) = [e for e in exploded if e["type"] == "health"]
    assert finding["kind"] == "grad-explosion" and finding["step"] == EXPLODES_AT
    assert finding["sentence"].startswith(f"gradient norm explosion at step {EXPLODES_AT}: grad norm ")
    steps = {e["step"]: e for e in exploded if e["type"] == "step"}
    # the norm it printed for that step (`'grad_norm': '901.9'`), read from its log dict
    assert 500 < finding["value"] == steps[EXPLODES_AT]["grad_norm_max"] < 2000
    assert 0.5 < finding["mean"] < 2 and finding["action"] == "warn"
    # judged against every report before it, each with a norm read from a log dict
    reports = [e for e in exploded if e["type"] == "step" and e["step"] < EXPLODES_AT]
    assert len(reports) >= 17 and all(0.5 < norm(e) < 2 for e in reports)
    assert f"of the last {len(reports)} reports" in finding["sentence"]
    # normal again after it: nothing more is said
    assert all(norm(e) < 2 for e in exploded if e["type"] == "step" and e["step"] > EXPLODES_AT)

    assert not [e for e in twin if e["type"] == "health"]
    twin_steps = [e for e in twin if e["type"] == "step"]
    assert twin_steps[-1]["step"] == STEPS and len(twin_steps) >= 20   # judged, and found fine
    assert all(0.5 < norm(e) < 2 for e in twin_steps)


def hf_step(step: int, norm: float) -> str:
    """What the Trainer prints for a logged step, as hf_grad_norm.py prints it: its bar at the
    step, then the log dict written above it (the bar cleared, the dict, the bar redrawn)."""
    logs = {"loss": f"{2.5 - 0.01 * step:.4g}", "grad_norm": f"{norm:.4g}",
            "learning_rate": f"{5e-5 * (1 - step / STEPS):.4g}", "epoch": f"{step / STEPS:.4g}"}
    return f"\r{bar(step)}\r{' ' * len(bar(step))}\r{logs}\n\r{bar(step)}"


def bar(step: int) -> str:
    return f"{100 * step // STEPS:3d}%|#####     | {step}/{STEPS} [00:05<00:05,  3.00it/s]"


def test_a_norm_that_exploded_mid_window_is_judged_not_hidden_by_the_last():
    """A window holds every log dict printed in its second; a norm that exploded at its first
    step and was back to normal by its last is its grad_norm_max, which the detectors judge
    (its grad_norm is the last printed). The finding's step is the window's last: the first
    report that holds it. Pure: the times are given, windows as hf_grad_norm.py paces them."""
    parser, tracker = OutputParser(), Tracker()
    health = TrainingHealth(HealthSettings())
    windows, findings = [], []

    def feed(text: str, t: float) -> None:
        for observation in parser.feed(text):
            for kind, event in tracker.parsed(observation, t):
                if kind == "step":
                    windows.append(event)
                    findings.extend(health.see({"type": "step", **event}))

    exploded = EXPLODES_AT - 2
    feed(f"\r{bar(0)}", 0.0)
    for step in range(1, STEPS + 1):
        t = float((step - 1) // SYNC_EVERY)   # a window's three steps read together
        feed(hf_step(step, 1e3 if step == exploded else 1.0 + 0.01 * (step % 5)), t)
        if step % SYNC_EVERY == 0:
            feed(f"\r{bar(step)}", t + 1.0)   # the bar redrawn a second on: the window closes
    (found,) = findings
    window = next(e for e in windows if e["step"] == found.step)
    assert found.kind == "grad-explosion" and found.value == 1000.0
    assert (window["from_step"], window["step"]) == (EXPLODES_AT - SYNC_EVERY, EXPLODES_AT)
    assert window["grad_norm"] < 2 and window["grad_norm_max"] == 1000.0

"""Training health's detectors (engine.run.training_health), fed step and eval events as the
supervisor reads them: a loss spike, a gradient explosion and divergence are found with their
evidence; a noisy, falling loss is not a finding."""

from __future__ import annotations

import os
import random
import subprocess

import pytest

from cockpit import cli
from engine.preset_types import HealthSettings
from engine.record.rundir import list_runs
from engine.run.training_health import TrainingHealth


def steps(health: TrainingHealth, losses, first: int = 1, **extra) -> list:
    found = []
    for i, loss in enumerate(losses, start=first):
        found += health.see({"type": "step", "step": i, "loss": loss, **extra})
    return found


def falling(n: int, seed: int = 0) -> list[float]:
    """A loss as training gives it: falling fast, then slowly, with noise of a few percent."""
    rng = random.Random(seed)
    return [(2.0 / (1 + i / 20) + 0.05) * (1 + rng.gauss(0, 0.03)) for i in range(n)]


def test_a_noisy_falling_loss_is_no_finding():
    for seed in range(20):
        assert steps(TrainingHealth(HealthSettings()), falling(600, seed)) == []


def test_a_spike_is_found_with_its_evidence_and_kept_out_of_the_window():
    health = TrainingHealth(HealthSettings())
    history = falling(300)
    assert steps(health, history) == []
    (spike,) = steps(health, [history[-1] * 8], first=301)
    assert (spike.kind, spike.step, spike.action) == ("loss-spike", 301, "rewind")
    assert spike.value > 6 * spike.mean and (spike.value - spike.mean) / spike.std > 6
    assert "loss spike at step 301" in spike.sentence() and "limits: z 6, 2x" in spike.rule
    # the spike did not raise the bar: the next one is found too, a normal step is not
    assert steps(health, [history[-1]], first=302) == []
    assert [f.kind for f in steps(health, [history[-1] * 8], first=303)] == ["loss-spike"]


def test_float_noise_of_a_converged_run_is_no_finding():
    """A regression's loss from 0.9 to a millionth of it, its gradient norm with it: from there
    a report 100x the window's mean is still noise (seen on a loaded CI machine), not a spike."""
    health = TrainingHealth(HealthSettings())
    found = [f for i in range(200) for f in health.see(
        {"type": "step", "step": i, "loss": 0.9 * 0.93 ** i, "grad_norm": 2.0 * 0.93 ** i})]
    rng = random.Random(2)
    for i in range(200, 400):
        loss, norm = 1e-6 * (1 + rng.random()), 2e-5 * (1 + rng.random())
        if i in (300, 350):
            loss, norm = 1e-4, 6e-3
        found += health.see({"type": "step", "step": i, "loss": loss, "grad_norm": norm})
    assert found == []
    (spike,) = health.see({"type": "step", "step": 400, "loss": 0.1, "grad_norm": 2e-5})
    assert spike.kind == "loss-spike"   # a rise of a tenth of its start is one


def test_the_window_largest_step_is_what_is_judged():
    health = TrainingHealth(HealthSettings())
    for i in range(50):   # a window's mean hides one bad step; its loss_max does not
        assert health.see({"type": "step", "step": i, "loss": 1.0, "loss_max": 1.1 + 0.01 * (i % 3)}) == []
    (spike,) = health.see({"type": "step", "step": 50, "loss": 1.05, "loss_max": 9.0})
    assert spike.value == 9.0


def test_a_gradient_explosion_is_found_on_the_gradient_norm():
    health = TrainingHealth(HealthSettings())
    rng = random.Random(1)
    for i in range(100):
        assert health.see({"type": "step", "step": i, "loss": 1.0, "grad_norm": 1 + rng.random() * 0.2}) == []
    assert health.see({"type": "step", "step": 100, "loss": 1.0, "grad_norm": 5.0}) == []   # below 10x
    (found,) = health.see({"type": "step", "step": 101, "loss": 1.0, "grad_norm": 40.0})
    assert found.kind == "grad-explosion" and "grad norm 40" in found.rule


def test_nothing_is_judged_before_the_first_reports():
    health = TrainingHealth(HealthSettings(min_reports=16))
    assert steps(health, [1.0] * 15 + [50.0]) == []


def test_divergence_is_the_eval_loss_rising_k_evals_in_a_row_and_said_once():
    health = TrainingHealth(HealthSettings(diverge_evals=3, on_divergence="stop"))
    evals = [2.0, 1.5, 1.6, 1.7]
    found = [f for i, v in enumerate(evals) for f in health.see({"type": "eval", "step": i * 100,
                                                                 "metrics": {"eval_loss": v}})]
    assert found == []
    (rising,) = health.see({"type": "eval", "step": 400, "metrics": {"eval_loss": 1.8}})
    assert (rising.kind, rising.action, rising.step) == ("divergence", "stop", 400)
    assert "1.5 -> 1.6 -> 1.7 -> 1.8" in rising.rule
    assert health.see({"type": "eval", "step": 500, "metrics": {"eval_loss": 1.9}}) == []


def test_a_non_finite_loss_is_left_to_the_numerical_crash():
    health = TrainingHealth(HealthSettings())
    steps(health, falling(100))
    assert steps(health, [float("nan"), float("inf")], first=101) == []


@pytest.mark.parametrize("setting, said", [
    ("health.loss_ratio=0.5", "health.loss_ratio: got 0.5, expected a number > 1"),
    ("health.on_spike=retreat", "health.on_spike: got 'retreat', expected one of 'warn', 'stop', "
                                "'rewind', 'lower-lr'"),
    ("health.max_rewinds=0", "health.max_rewinds: got 0, expected"),
    ("health.lose_z=3", "did you mean"),
])
def test_bad_health_settings_are_one_line_naming_the_key(home, capsys, setting, said):
    assert cli.main(["--no-ui", "-w", "matmul", "-d", "cpu", "--set", setting]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1


def test_a_finding_alerts_once_with_its_sentence_and_what_was_done():
    from engine.run.alert_rules import AlertRules
    from engine.settings import ALERT_EVENTS

    finding = {"type": "health", "t": 1.0, "kind": "loss-spike", "action": "stop",
               "sentence": "loss spike at step 1,204: loss 9.1 is z 9.1 and 8.0x the mean"}
    (alert,) = AlertRules(frozenset(ALERT_EVENTS), "trm").see([finding])
    assert alert.event == "health" and "trm is going bad" in alert.title
    assert alert.message.startswith("loss spike at step 1,204") and alert.message.endswith("(stopping it)")
    assert AlertRules(frozenset({"crash"}), "trm").see([finding]) == []


def test_a_converged_loss_wandering_in_float_noise_is_no_spike():
    health = TrainingHealth(HealthSettings())
    rng = random.Random(3)
    found = steps(health, [2.0 / (1 + i) for i in range(50)]   # the run's scale: 2.0
                  + [10 ** rng.uniform(-11, -9) for _ in range(300)], )
    assert found == []


def test_a_resume_judges_against_the_history_up_to_its_checkpoint():
    # a curve that fell fast and levelled off: back at a checkpoint from step 70, the loss is
    # eight times the last window's, and no spike (the reports past the checkpoint are gone)
    rng = random.Random(0)
    curve = [(0.016 + 0.97 ** i) * (1 + rng.gauss(0, 0.01)) for i in range(350)]
    health = TrainingHealth(HealthSettings())
    assert steps(health, curve) == []
    health.see({"type": "trainer_ready", "resumed_from": {"step": 70}})
    assert steps(health, curve[70:200], first=71) == []
    # whereas the same value with no resume before it is one
    fresh = TrainingHealth(HealthSettings())
    steps(fresh, curve)
    assert [f.kind for f in steps(fresh, curve[70:71], first=351)] == ["loss-spike"]


def test_an_incident_is_said_once_and_a_lasting_new_level_becomes_the_window():
    health = TrainingHealth(HealthSettings())
    steps(health, falling(300))
    level = falling(300)[-1]
    found = steps(health, [level * 8] * 10, first=301)   # knocked off course, and staying there
    assert [f.step for f in found] == [301]
    assert steps(health, [level * 8] * 20, first=311) == []   # the new level, no longer news


# The sine example with noisy targets: its loss levels off at the noise's variance (0.25), where
# a spike is a spike (a loss falling by orders of magnitude is no place for a z-score).
SINE = ["batch_size=64", "accumulation=1", "params.samples=1024", "params.noise=0.5",
        "train.epochs=30", "threads=1", "train.report_every_s=0.01"]


def sine(home, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    from conftest import ROOT, cockpit_cmd

    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "examples"))),
           "COCKPIT_CONFIG_DIR": str(ROOT / "examples"), "COCKPIT_RUNS_DIR": str(home / "runs")}
    done = subprocess.run(cockpit_cmd("--no-ui", "-w", "sine", "-d", "cpu", *[a for s in SINE for a in ("--set", s)],
                                      *args), capture_output=True, text=True, env=env, timeout=300)
    (run,) = [r for r in list_runs(home / "runs") if r.id not in seen]
    seen.add(run.id)
    return done, run.events()


seen: set[str] = set()


@pytest.mark.health_findings   # its runs are meant to go bad
def test_a_rehearsed_spike_is_caught_at_its_step_and_stops_the_run_where_asked(home):
    done, events = sine(home, "--inject", "spike@300", "--set", "health.on_spike=stop")
    (finding,) = [e for e in events if e["type"] == "health"]
    # caught at the first report that holds step 300, whatever the window's length
    first = min(e["step"] for e in events if e["type"] == "step" and e["step"] >= 300)
    assert finding["kind"] == "loss-spike" and finding["step"] == first
    assert finding["value"] > 2 * finding["mean"] and finding["action"] == "stop"
    assert done.returncode == 130, done.stdout[-2000:]
    assert f"health: loss spike at step {finding['step']}" in done.stdout
    # the attempt stopped when asked, or had finished before its finding was read (a loaded
    # machine's supervisor reads late): the run is stopped either way, as the rule says
    ended = [e for e in events if e["type"] == "attempt_ended"][-1]
    assert ended["outcome"] in ("stopped", "finished")
    # the unspiked twin: no finding at all (the suite's other runs are the wider check)
    done, events = sine(home)
    assert done.returncode == 0 and not [e for e in events if e["type"] == "health"]


@pytest.mark.health_findings   # its runs are meant to go bad
@pytest.mark.parametrize("action, status, first_outcome", [("stop", "stopped", "finished"),
                                                           ("rewind", "finished", "health")])
def test_a_finding_read_only_after_its_attempt_exited_is_acted_on_all_the_same(
        home, monkeypatch, action, status, first_outcome):
    """A fast run outpaces its supervisor on a loaded machine; here the supervisor reads the
    attempt's events only once it has exited (its poll outlasts the run), and the finding still
    ends the run as its rule says: stopped, or gone back from."""
    from conftest import ROOT
    from engine import runconfig
    from engine.record.rundir import RunDir
    from engine.run.supervisor import Supervisor

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join((str(ROOT), str(ROOT / "examples"))))
    monkeypatch.setenv("COCKPIT_CONFIG_DIR", str(ROOT / "examples"))
    monkeypatch.syspath_prepend(str(ROOT / "examples"))   # the workload's module, here as in the child
    run = RunDir.create(runconfig.resolve("sine", "cpu", SINE + [
        "inject=['spike@300']", f"health.on_spike={action}", "train.checkpoint_every_steps=25"]))
    assert Supervisor(run, poll_s=3600, spare=False).supervise() == status
    events = run.events()
    (finding,) = [e for e in events if e["type"] == "health"]
    assert finding["kind"] == "loss-spike" and finding["action"] == action
    ended = [e for e in events if e["type"] == "attempt_ended"]
    assert ended[0]["outcome"] == first_outcome and ended[0]["last_step"] == 480   # it had finished
    if action == "rewind":   # trained again from before the spike, its batches skipped
        (back,) = [e for e in events if e["type"] == "fallback"]
        assert back["rewind"]["to_step"] < finding["began"] and back["rewind"]["skip_batches"] > 0
        assert ended[1]["outcome"] == "finished"

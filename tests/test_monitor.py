"""Monitoring wired into real runs: memory events from the supervisor, the slowdown warning
and its automatic fallback; and an ETA that converges, on a clock of the test's."""

from __future__ import annotations


import random
import time
from types import SimpleNamespace

from conftest import TINY, user_preset
from engine import runconfig
from engine.run import health as health_module
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.run.attempt import Attempt
from engine.run.supervisor import Supervisor
from engine.monitor.sysmon import SystemSampler
from engine.train import saving as saving_module, trainer as trainer_module

# About three seconds of steady training: enough reporting windows to judge an ETA.
STEADY = TINY + ["params.n=256", "params.products=16", "params.samples=2048", "train.epochs=8",
                 "train.report_every_s=0.2", "batch_size=32", "accumulation=2"]


def of_type(run: RunDir, kind: str) -> list[dict]:
    return [e for e in run.events() if e["type"] == kind]


def test_a_real_run_emits_memory_events_with_plausible_rss(home):
    run = RunDir.create(runconfig.resolve("matmul", "cpu", STEADY))
    assert Supervisor(run, poll_s=0.05).supervise() == "finished"
    memory = of_type(run, "memory")
    assert len(memory) >= 2
    for m in memory:
        assert m["attempt"] == 1
        # above zero only: a sample taken as the interpreter starts (or exits) can be under
        # a megabyte (0.7 MB seen on a loaded CI machine); the max below is the real check
        assert 0 < m["rss"] < m["system_total"]
        assert 0 < m["system_used"] <= m["system_total"]
        assert set(m["pressure"]) >= {"level", "raw", "source"}
    assert max(m["rss"] for m in memory) > 50e6  # once torch is loaded: tens of MB at least
    assert memory[0]["swap_in_per_s"] is None  # no rate from a single reading
    # the best is the best full window's after the warm-up one: a fragment cut short by the
    # last checkpoint ("partial") can read faster than any of them
    full = [e for e in of_type(run, "step") if not e.get("partial")]
    assert len(full) >= 2 and all(e["samples_per_s"] > 0 for e in full)
    assert all(full[-1]["best_samples_per_s"] >= e["samples_per_s"] for e in full[1:])


def test_a_sample_taken_after_the_attempt_exited_is_not_an_event(home):
    """poll() said running, then the trainer exited: its sample has no RSS (nothing left to
    measure) and would be a memory event of nothing; the system's fullness is still kept."""
    run = RunDir.create(runconfig.resolve("matmul", "cpu", STEADY))
    sup = Supervisor(run)
    attempt = Attempt(1, "cpu", run.config().device, sup.launcher_for(run.config().device), sup.context)
    gone = {"rss": None, "processes": 0, "system_total": 8e9, "system_used": 2e9}
    attempt.health = SimpleNamespace(sample=lambda: dict(gone), warnings=lambda sample: [])
    attempt._sample_health()
    assert of_type(run, "memory") == [] and attempt.memory_percent == 25.0


def test_eta_converges_on_a_steady_run(home, monkeypatch):
    """The trainer's clock is one that moves only when a step is trained, by 40-60 ms (seeded):
    a steady rate with jitter, however busy the machine is. On the real clock this was a test
    of the machine's steadiness: a neighbour starting halfway through moves the end, and no
    ETA can know that."""
    clock = SimpleNamespace(now=1000.0)
    fake_time = SimpleNamespace(**{**vars(time), "monotonic": lambda: clock.now})
    # the trainer's clock only: its loop's and its checkpoints' (engine.train.saving)
    for module in (trainer_module, saving_module):
        monkeypatch.setattr(module, "time", fake_time)
    run = RunDir.create(runconfig.resolve("matmul", "cpu", STEADY))
    trainer = trainer_module.Trainer(run, EventWriter(run.events_path, attempt=1), "cpu", run.config().device)
    jitter, ended = random.Random(0), {0: clock.now}   # step -> the clock when it ended
    train_step = trainer.train_step

    def timed_step() -> None:
        train_step()
        clock.now += jitter.uniform(0.04, 0.06)
        ended[trainer.step] = clock.now

    trainer.train_step = timed_step
    assert trainer.fit() == "finished"
    steps = of_type(run, "step")
    start, end = ended[0], ended[trainer.step]
    assert len(steps) >= 6
    late = steps[len(steps) // 2:-1]
    for e in late:  # the predicted end from the second half is within a tenth of the run (2% here)
        assert abs(ended[e["step"]] + e["eta_s"] - end) < 0.1 * (end - start), e


class SwappingSampler:
    """The real sampler's figures, with the machine swapping hard during the first attempt
    from the injected slowdown on. Before it, no swap figure at all: a neighbour slowing the
    healthy stretch on a busy machine is then no evidence of memory trouble (nor dilutes the
    swap rate the warning quotes)."""

    attempts = 0
    events_path = None

    def __init__(self, pid, **kwargs):
        self.real = SystemSampler(pid, **kwargs)  # the supervisor passes the trainer's env
        SwappingSampler.attempts += 1
        self.swapping = SwappingSampler.attempts == 1

    def sample(self):
        sample = self.real.sample()
        if not self.swapping:
            return sample
        if "fault_injected" not in self.events_path.read_text():
            return {**sample, "swap_in_per_s": None}
        return {**sample, "swap_in_per_s": 80e6, "swap_used": 6e9}


def test_a_slowdown_with_swapping_warns_with_advice_and_falls_back(home, monkeypatch):
    monkeypatch.setattr(health_module, "SystemSampler", SwappingSampler)
    # Fractions of a second instead of the production half-minute, so the test is short. The
    # healthy stretch before the fault (200 steps, about 1.5 s here) must outlast smooth_s
    # several times over, or no healthy best exists to fall from on a faster machine.
    monkeypatch.setattr(health_module, "SLOWDOWN_SETTINGS", {"smooth_s": 0.3, "sustain_s": 1.0})
    monkeypatch.setattr(SwappingSampler, "attempts", 0)
    user_preset(home, "devices", "laptop",
                'device = "cpu"\nbatch_size = 32\naccumulation = 2\nthreads = 1\n'
                'on_slowdown = "fallback"\nfallback = ["desk"]\n')
    user_preset(home, "devices", "desk", 'device = "cpu"\nbatch_size = 32\naccumulation = 2\nthreads = 1\n')
    run = RunDir.create(runconfig.resolve("matmul", "laptop", STEADY + [
        "train.epochs=12", "train.checkpoint_every_steps=5", "inject=['slow@200']"]))
    monkeypatch.setattr(SwappingSampler, "events_path", run.events_path)
    assert Supervisor(run, poll_s=0.05).supervise() == "finished"
    (warning,) = of_type(run, "warning")
    assert warning["kind"] == "slowdown" and warning["fallback"] is True
    assert "swap-in is 80.0 MB/s" in warning["message"]
    sets = [s for tip in warning["advice"] for s in tip["set"]]
    assert "device.grad_checkpointing=true" in sets and "device.batch_size=16" in sets
    (crash,) = of_type(run, "crash")
    assert crash["kind"] == "slowdown"
    (move,) = of_type(run, "fallback")
    assert (move["reason"], move["to_preset"]) == ("slowdown", "desk")
    ready = of_type(run, "trainer_ready")
    assert ready[1]["resumed_from"]["step"] >= 200  # it checkpointed on the way out


def test_a_healthy_run_gets_no_warning(home):
    run = RunDir.create(runconfig.resolve("matmul", "cpu", STEADY))
    assert Supervisor(run, poll_s=0.05).supervise() == "finished"
    assert not of_type(run, "warning")


"""The probe's compiled twins of CUDA candidates and its parity column (issue 18)."""

from __future__ import annotations

import json
import subprocess

from conftest import child_env, cockpit_cmd, user_preset
from engine import runconfig
from engine.probe import candidates
from engine.probe.speed import CandidateResult, recommend
from cockpit.commands.probe import run_command

MATMUL = ["params.n=64", "params.products=8", "params.samples=4096", "params.eval_samples=64"]


def _labels(found):
    return [(c.label, c.preset.compile) for c in found]


def test_cuda_candidates_get_a_compiled_twin_and_no_other_device_does(home, monkeypatch):
    config = runconfig.resolve("matmul", "auto", [])
    # what this machine has, as the probe reads it without torch: here, an NVIDIA GPU
    monkeypatch.setattr(candidates, "available_devices", lambda: ["cuda", "cpu"])
    found = candidates.build(config.workload, devices=[], preset_names=[], base="auto", overrides=[],
                             threads=False)
    assert _labels(found) == [("cuda", False), ("cuda compiled", True), ("cpu", False)]
    monkeypatch.setattr(candidates, "available_devices", lambda: ["mps", "cpu"])
    found = candidates.build(config.workload, devices=[], preset_names=[], base="auto", overrides=[],
                             threads=False)
    assert _labels(found) == [("mps", False), ("cpu", False)]   # never on MPS, where it is refused
    found = candidates.build(config.workload, devices=["cuda"], preset_names=[], base="auto",
                             overrides=[], compile=False)
    assert _labels(found) == [("cuda", False)]                  # --no-compile
    found = candidates.build(config.workload, devices=["cuda"], preset_names=[], base="auto",
                             overrides=["compile=true"])
    assert _labels(found) == [("cuda", True), ("cuda eager", False)]  # compiled already: an eager twin
    found = candidates.build(config.workload, devices=[], preset_names=["cuda", "cpu"], base="auto",
                             overrides=[], threads=False)              # the shipped cuda preset compiles
    assert _labels(found) == [("cuda", True), ("cuda eager", False), ("cpu", False)]
    # devices from a compiling base: compile holds on CUDA only, and run it: says so for the CPU
    monkeypatch.setattr(candidates, "available_devices", lambda: ["cuda", "cpu"])
    cuda = runconfig.resolve("matmul", "cuda", [])
    found = candidates.build(cuda.workload, devices=[], preset_names=[], base="cuda", overrides=[],
                             threads=False)
    assert _labels(found) == [("cuda", True), ("cuda eager", False), ("cpu", False)]
    assert run_command(cuda, found[2], "cuda", False).endswith("-d cuda --set device=cpu --set compile=false")
    assert run_command(cuda, found[0], "cuda", False).endswith("-d cuda --set device=cuda")


def _r(label, rate, compiled=False, compile_s=None, device="cuda:0"):
    return CandidateResult(label=label, preset="cuda", status="ok", device=device, batch_size=16,
                           samples_per_s=rate, spread=[rate * 0.98, rate * 1.02], compiled=compiled,
                           compile_s=compile_s)


def test_the_recommendation_says_when_compiling_wins_and_by_how_much():
    label, text = recommend("trm-chat-small", [_r("cuda compiled", 208.0, True, 41.0), _r("cuda", 100.0),
                                               _r("cpu", 2.0, device="cpu")])
    assert label == "cuda compiled"
    assert "; compiling wins: 2.08x eager's 100 samples/s after 41 s of compiling" in text
    label, text = recommend("matmul", [_r("cuda", 100.0), _r("cuda compiled", 90.0, True, 12.0)])
    assert label == "cuda" and "; compiling does not pay here: 0.90x eager after 12 s of compiling" in text
    config = runconfig.resolve("matmul", "auto", [])
    chosen = candidates.Candidate("cuda compiled", "auto", config.device.__class__(device="cuda", compile=True),
                                  twin=True)
    assert run_command(config, chosen, "auto", False).endswith("--set device=cuda --set compile=true")
    # --presets: the preset is named as it is, and a twin says how it differs from it
    eager = candidates.Candidate("cuda eager", "cuda", config.device.__class__(device="cuda"), twin=True)
    assert run_command(config, eager, "auto", True).endswith("-d cuda --set compile=false")
    same = candidates.Candidate("cuda", "cuda", config.device.__class__(device="cuda", compile=True))
    assert run_command(config, same, "auto", True).endswith("-d cuda")


def test_a_candidate_with_wrong_numbers_is_shown_and_never_recommended(home):
    """bf16 on the CPU is checked against fp32 (the CPU in fp32 is the reference itself); the
    wrong-grad fault, which fires in every attempt, makes its gradients wrong."""
    user_preset(home, "devices", "bf16", 'device = "cpu"\nprecision = "bf16"\nbatch_size = 16\n'
                'threads = 1\ninject = ["wrong-grad@0+"]\n')
    user_preset(home, "devices", "plain", 'device = "cpu"\nbatch_size = 16\nthreads = 1\n')
    out = subprocess.run(cockpit_cmd("probe", "-w", "matmul", "--presets", "bf16,plain", "--budget", "20", "--no-threads",
                                     *[a for o in MATMUL for a in ("--set", o)], "--json"),
                         capture_output=True, text=True, env=child_env(), timeout=180)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    rows = {c["label"]: c for c in result["candidates"]}
    assert rows["bf16"]["status"] == "wrong" and rows["bf16"]["parity"]["verdict"] == "numerically wrong"
    assert rows["bf16"]["parity"]["worst_grad"]["name"] == "readout"
    assert rows["plain"]["parity"] is None and rows["plain"]["status"] == "ok"  # the reference itself
    assert result["recommended"] == "plain"
    assert "bf16 computes wrong numbers (parity check:" in result["sentence"]
    table = subprocess.run(cockpit_cmd("probe", "-w", "matmul", "--presets", "bf16,plain", "--budget", "20", "--no-threads",
                                       *[a for o in MATMUL for a in ("--set", o)]),
                           capture_output=True, text=True, env=child_env(), timeout=180)  # cached
    header, *lines = table.stdout.splitlines()
    assert "parity" in header and any(line.startswith("bf16") and "WRONG" in line for line in lines)


def test_compiled_candidates_bring_their_own_time_to_the_default_budget(home, monkeypatch):
    """A compile takes minutes on a large model: the default budget grows by COMPILE_EXTRA_S for
    each compiled twin, so the twin is measured rather than 'too-slow'."""
    from types import SimpleNamespace

    from cockpit.commands import probe as probe_cmd
    from engine.probe import PROBE_BUDGET_S, speed

    seen = {}

    def fake_probe(config, cands, budget, **kwargs):
        seen["budget"] = budget
        return speed.ProbeResult(config.workload_preset, "matmul", [], None, "nothing", budget, 0.0)

    monkeypatch.setattr(probe_cmd, "probe", fake_probe)
    config = runconfig.resolve("matmul", "auto", [])
    cands = candidates.build(config.workload, devices=["cuda", "cpu"], preset_names=[], base="auto",
                             overrides=[], threads=False)
    args = SimpleNamespace(budget=None, fresh=True, device="auto", presets=None)
    probe_cmd._probe(args, config, cands, as_json=True)
    assert seen["budget"] == PROBE_BUDGET_S + probe_cmd.COMPILE_EXTRA_S   # one twin

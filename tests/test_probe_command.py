"""The probe and the batch finder on command workloads: the user's own script, timed from
its output, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, child_env, cockpit_cmd, user_preset

PY = sys.executable
TRAIN = ROOT / "examples" / "command" / "train.py"

# Prints a step line every 10 ms; at batch 16 or more it aborts at step 5 (as Metal does on a
# batch too large for it), without a Python traceback.
ABORTS = """\
import argparse, os, time
p = argparse.ArgumentParser()
p.add_argument("--bs", type=int, default=4)
args = p.parse_args()
for step in range(1, 100000):
    time.sleep(0.01)
    print(f"step {step}/100000 loss={1 / step:.4f}", flush=True)
    if args.bs >= 16 and step == 5:
        os.abort()
"""

# Above batch 100 it fails after three steps with the CPU allocator's real out-of-memory text.
OOM_ABOVE_100 = """\
import argparse, sys, time
p = argparse.ArgumentParser()
p.add_argument("--bs", type=int, required=True)
args = p.parse_args()
for step in range(1, 100000):
    time.sleep(0.01)
    print(f"step {step}/100000 loss={1 / step:.4f}", flush=True)
    if args.bs > 100 and step == 3:
        print("Traceback (most recent call last):\\n  File \\"train.py\\", line 9, in <module>\\n"
              "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not "
              f"enough memory: you tried to allocate {args.bs * 2**26} bytes.", file=sys.stderr, flush=True)
        sys.exit(1)
"""


def _run(*args, timeout=120):
    return subprocess.run(cockpit_cmd(*args), capture_output=True, text=True, env=child_env(),
                          timeout=timeout)


def _script(home, name: str, text: str) -> str:
    path = home / name
    path.write_text(text)
    return str(path)


def _command_preset(home, name: str, argv: list[str], cwd: str = "") -> None:
    user_preset(home, "workloads", name, f"command = {json.dumps(argv)}\n"
                                         + (f"cwd = {json.dumps(cwd)}\n" if cwd else ""))


def _cpu_presets(home) -> None:
    for name, batch, extra in (("small", 4, ""), ("large", 256, ""), ("big", 16, ""),
                               ("injected", 4, 'inject = ["native-crash@3+"]\n')):
        user_preset(home, "devices", name, f'device = "cpu"\nbatch_size = {batch}\nthreads = 1\n{extra}')


def test_the_probe_times_the_users_own_script_from_its_output(home):
    _cpu_presets(home)
    _command_preset(home, "example", [PY, str(TRAIN), "--bs", "{batch_size}", "--steps", "100000",
                                      "--out", "{run_dir}/out", "--ckpt-every", "1000000"], cwd=str(ROOT))
    # A command starts from scratch at its turn: its torch import (~3.5 s here, idle or beside
    # three busy loops) is in its slice of the budget, which must leave room for a slower machine.
    args = ["probe", "-w", "example", "--presets", "small,large", "--no-threads", "--budget", "32"]
    out = _run(*args, "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    rows = {c["label"]: c for c in result["candidates"]}
    assert set(rows) == {"small", "large"}
    for c in rows.values():  # both measured from the script's own tqdm bar
        assert c["status"] in ("ok", "rough") and c["samples_per_s"] > 0, c
        assert c["windows"] > 0 or c["status"] == "rough", c
        assert c["device"] == "cpu" and c["threads"] == 1 and c["startup_s"] > 0, c
        assert c["basis"] == "samples/s = its steps/s, read from its tqdm bar, x its {batch_size}", c
        assert c["unit"] == "samples"
    assert result["recommended"] in rows
    assert "for example at batch" in result["sentence"]
    assert "(a command: samples/s = its steps/s, read from its tqdm bar, x its {batch_size})" in result["sentence"]
    # The same table and sentence as any probe (here from the cache, at once).
    again = _run(*args)
    assert again.returncode == 0 and "cached result" in again.stderr, again.stderr
    lines = again.stdout.splitlines()
    assert lines[0].split()[:4] == ["candidate", "device", "batch", "samples/s"]
    assert {line.split()[0] for line in lines[1:3]} == {"small", "large"}
    assert lines[3] == result["sentence"]
    assert lines[4].startswith(f"run it:  cockpit --no-ui -w example -d {result['recommended']}")


def test_a_command_that_aborts_is_a_crash_and_the_other_candidates_are_still_measured(home):
    _cpu_presets(home)
    _command_preset(home, "aborts", [PY, _script(home, "aborts.py", ABORTS), "--bs", "{batch_size}"])
    out = _run("probe", "-w", "aborts", "--presets", "big,injected,small", "--no-threads",
               "--budget", "18", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    rows = {c["label"]: c for c in result["candidates"]}
    # Its own abort (batch 16), and the preset's injected fault delivered at the step read
    # from its output: both native crashes of the command, and the probe goes on.
    for name in ("big", "injected"):
        assert rows[name]["status"] == "crashed" and rows[name]["crash"]["kind"] == "native-crash", rows[name]
        assert rows[name]["crash"]["sentence"].startswith("The command died from SIGABRT after step")
    assert rows["small"]["status"] in ("ok", "rough") and rows["small"]["samples_per_s"] > 0
    assert result["recommended"] == "small"
    assert "big crashed (native-crash)" in result["sentence"]
    assert "injected crashed (native-crash)" in result["sentence"]


def test_a_command_that_takes_no_batch_size_is_measured_in_steps_per_second(home):
    _cpu_presets(home)
    _command_preset(home, "nobatch", [PY, _script(home, "aborts.py", ABORTS)])
    out = _run("probe", "-w", "nobatch", "--presets", "small", "--no-threads", "--budget", "8")
    assert out.returncode == 0, out.stderr
    header, row, sentence = out.stdout.splitlines()[:3]
    assert row.split()[0] == "small" and row.split()[-1] in ("ok", "rough")
    assert sentence.startswith("small is the only candidate that trained for nobatch (")  # no "at batch"
    assert "its arguments take no {batch_size}, so its figures are steps/s, read from its step lines" in sentence
    assert "steps/s" in out.stderr  # the progress line says the unit too


def test_find_batch_on_a_command_finds_the_largest_batch_before_its_out_of_memory(home):
    _cpu_presets(home)
    user_preset(home, "devices", "start8", 'device = "cpu"\nbatch_size = 8\naccumulation = 4\nthreads = 1\n')
    _command_preset(home, "oomy", [PY, _script(home, "oomy.py", OOM_ABOVE_100), "--bs", "{batch_size}"])
    # a budget for a hang only: the search ends once it has found the boundary
    out = _run("probe", "-w", "oomy", "-d", "start8", "--find-batch", "--trial-seconds", "0.3",
               "--budget", "300", "--json", timeout=400)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    trials = {t["batch"]: t for t in result["trials"]}
    assert [t["batch"] for t in result["trials"]][:5] == [8, 16, 32, 64, 128]
    for batch, t in trials.items():  # each trial a fresh run of the command at that size
        assert t["fits"] == (batch <= 100), t
        if t["fits"]:
            assert t["samples_per_s"] > 0 and t["footprint_mb"] > 0, t
        else:
            assert t["crash"]["kind"] == "oom" and not t["fatal"], t
            assert "DefaultCPUAllocator: not enough memory" in t["crash"]["evidence"]["message"]
    assert result["found"] == 96 and result["smallest_misfit"] == 104
    assert result["micro_batch"] * result["accumulation"] == 32  # the preset's 8 x 4 kept
    assert result["sentence"].startswith("Micro-batch 96 is the largest that keeps pressure normal and "
                                         "swap flat on cpu for oomy")
    assert "104 did not: crashed (oom)" in result["sentence"]


def test_find_batch_needs_a_batch_size_placeholder_to_vary(home):
    _command_preset(home, "nobatch", [PY, "-c", "print('hi')"])
    out = _run("probe", "-w", "nobatch", "-d", "cpu", "--find-batch")
    assert out.returncode == 2 and "--find-batch: varies the command's {batch_size}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1

"""The system sampler (engine.monitor.sysmon) and the slowdown detector (engine.run.slowdown).

Pressure readers run against fixture trees in tests/fixtures/sysmon (a fake / with proc/ and
sys/fs/cgroup/), the macOS sysctl path through a monkeypatched reader and a ctypes stand-in
for sysctlbyname, so every platform's path runs on this Linux VM.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from conftest import FIXTURES
from engine.monitor import sysmon
from engine.errors import ConfigError
from engine.preset_types import DevicePreset
from engine.presets import device_from_table
from engine.schema import setting
from engine.run.slowdown import Context, SlowdownDetector, advice

SYSMON = FIXTURES / "sysmon"


# ---------------------------------------------------------------- PSI parsing


@pytest.mark.parametrize("name, level, some10, full10", [
    ("psi_normal.txt", "normal", 0.0, 0.0),
    ("psi_warn.txt", "warn", 23.51, 4.2),
    ("psi_critical.txt", "critical", 61.3, 38.75),
    ("psi_full_critical.txt", "critical", 12.0, 10.0),   # full >= 10 alone is critical
    ("psi_some_only.txt", "normal", 9.99, None),         # just under the warn line
])
def test_psi_fixtures_parse_to_levels(name, level, some10, full10):
    psi = sysmon.parse_psi((SYSMON / name).read_text())
    assert psi["some"]["avg10"] == some10
    assert psi.get("full", {}).get("avg10") == full10
    assert sysmon.psi_level(psi) == level


def test_psi_keeps_every_figure():
    psi = sysmon.parse_psi((SYSMON / "psi_warn.txt").read_text())
    assert psi["some"] == {"avg10": 23.51, "avg60": 8.02, "avg300": 1.75, "total": 48213577}
    assert isinstance(psi["full"]["total"], int)


@pytest.mark.parametrize("text", ["", "Operation not supported\n", "some avg10\n",
                                  "full avg10=1.00 avg60=0 avg300=0 total=1\n"])
def test_psi_rejects_what_is_not_psi(text):
    with pytest.raises(ValueError):
        sysmon.parse_psi(text)


# ---------------------------------------------------------------- Linux sources


def test_cgroup_pressure_is_preferred_over_system_psi():
    root = SYSMON / "slice_tree"
    source = sysmon.pressure_source(4242, root=root, platform="linux")
    p = source.read()
    # The trainer's session scope is under pressure while the host as a whole is not.
    assert (p["source"], p["level"]) == ("cgroup", "warn")
    assert p["raw"] == {"some_avg10": 23.51, "some_avg60": 8.02, "full_avg10": 4.2,
                        "full_avg60": 1.1}
    assert "session-3.scope/memory.pressure" in p["detail"]
    assert sysmon.psi_level(sysmon.parse_psi((root / "proc/pressure/memory").read_text())) == "normal"


def test_hybrid_hierarchy_finds_cgroup2_under_unified():
    root = SYSMON / "hybrid_tree"
    assert sysmon.cgroup2_mounts(root) == [("/", "/sys/fs/cgroup/unified")]
    assert sysmon.cgroup2_path(77, root) == "/"
    p = sysmon.pressure_source(77, root=root, platform="linux").read()
    assert (p["source"], p["level"]) == ("cgroup", "critical")
    assert "unified/memory.pressure (cgroup /)" in p["detail"]


def test_cgroup_v1_only_uses_system_psi():
    root = SYSMON / "v1_tree"
    assert sysmon.cgroup2_path(5, root) is None
    p = sysmon.pressure_source(5, root=root, platform="linux").read()
    assert (p["source"], p["level"]) == ("psi", "warn")
    assert p["detail"].endswith("proc/pressure/memory")


def test_unreadable_cgroup_file_falls_back_to_system_psi():
    p = sysmon.pressure_source(8, root=SYSMON / "broken_cgroup_tree", platform="linux").read()
    assert (p["source"], p["level"]) == ("psi", "critical")


def test_no_psi_is_unavailable_not_invented():
    source = sysmon.pressure_source(9, root=SYSMON / "no_psi_tree", platform="linux")
    p = source.read()
    assert (p["level"], p["raw"], p["source"]) == (None, None, None)
    assert "no /proc/pressure/memory" in p["detail"]
    other = sysmon.pressure_source(9, root=SYSMON / "no_psi_tree", platform="win32").read()
    assert (other["level"], other["source"]) == (None, None) and "win32" in other["detail"]


def test_mount_point_escapes_and_subtree_mounts(tmp_path):
    # A cgroup namespace bind-mounts a subtree; mountinfo escapes the space as \040.
    (tmp_path / "proc/3").mkdir(parents=True)
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/3/cgroup").write_text("0::/jobs/train-7\n")
    (tmp_path / "proc/self/mountinfo").write_text(
        "50 24 0:26 /jobs /mnt/my\\040cgroups rw - cgroup2 cgroup2 rw\n")
    group = tmp_path / "mnt/my cgroups/train-7"
    group.mkdir(parents=True)
    (group / "memory.pressure").write_text((SYSMON / "psi_warn.txt").read_text())
    assert sysmon.cgroup_pressure_file(3, tmp_path) == group / "memory.pressure"


# ---------------------------------------------------------------- macOS sysctl


@pytest.mark.parametrize("raw, level", [(1, "normal"), (2, "warn"), (4, "critical"), (3, None)])
def test_sysctl_levels(raw, level):
    asked = []

    def reader(name):
        asked.append(name)
        return raw

    source = sysmon.pressure_source(1, platform="darwin", sysctl=reader)
    p = source.read()
    # An undocumented value keeps its raw figure but gets no invented level.
    assert (p["level"], p["raw"], p["source"]) == (level, raw, "sysctl")
    assert asked[0] == "kern.memorystatus_vm_pressure_level"


def test_sysctl_unreadable_is_unavailable():
    p = sysmon.pressure_source(1, platform="darwin", sysctl=lambda name: None).read()
    assert (p["level"], p["raw"], p["source"]) == (None, None, None)
    assert "kern.memorystatus_vm_pressure_level" in p["detail"]


SYSCTL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p, ctypes.c_size_t)


def fake_sysctlbyname(values: dict[bytes, int], size: int = 4):
    """A C-callable stand-in for libc's sysctlbyname: writes an int into *oldp like xnu."""
    def impl(name, oldp, oldlenp, newp, newlen):
        if name not in values or newp:
            return -1
        ctypes.c_int.from_address(oldp).value = values[name]
        oldlenp[0] = size
        return 0
    return SYSCTL(impl)


def test_sysctl_int_marshals_through_ctypes():
    fn = fake_sysctlbyname({b"kern.memorystatus_vm_pressure_level": 4})
    assert sysmon.sysctl_int("kern.memorystatus_vm_pressure_level", fn) == 4
    assert sysmon.sysctl_int("kern.no_such_name", fn) is None
    wrong = fake_sysctlbyname({b"kern.memorystatus_vm_pressure_level": 4}, size=8)
    assert sysmon.sysctl_int("kern.memorystatus_vm_pressure_level", wrong) is None


@pytest.mark.skipif(sys.platform == "darwin", reason="the real sysctl exists on macOS")
def test_sysctl_without_bsd_libc_is_none():
    assert sysmon.sysctl_int("kern.memorystatus_vm_pressure_level") is None


# ---------------------------------------------------------------- swap rates


class FakeSwap:
    def __init__(self):
        self.sin = self.sout = 0

    def __call__(self):
        return SimpleNamespace(total=8 << 30, used=1 << 30, sin=self.sin, sout=self.sout)


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def fake_sampler(swap, clock, **kw):
    vm = SimpleNamespace(total=16 << 30, available=4 << 30)
    return sysmon.SystemSampler(psutil.Process().pid, pressure=sysmon.NoPressure("test"),
                                swap_reader=swap, memory_reader=lambda: vm, clock=clock, **kw)


def test_swap_rates_are_deltas_over_monotonic_time():
    swap, clock = FakeSwap(), FakeClock()
    sampler = fake_sampler(swap, clock)
    first = sampler.sample()
    assert (first["swap_in_per_s"], first["swap_out_per_s"]) == (None, None)
    swap.sin, swap.sout, clock.t = 40_000_000, 2_000_000, 102.0
    second = sampler.sample()
    assert (second["swap_in_per_s"], second["swap_out_per_s"]) == (20_000_000.0, 1_000_000.0)
    swap.sin, clock.t = 40_000_000 + 512 * 4096, 102.5
    assert sampler.sample()["swap_in_per_s"] == 512 * 4096 / 0.5
    clock.t = 102.5  # no time passed: no rate rather than a division by zero
    assert sampler.sample()["swap_in_per_s"] is None
    swap.sin, clock.t = 0, 103.5  # a counter that went back (wrapped): no figure
    assert sampler.sample()["swap_in_per_s"] is None
    swap.sin, clock.t = 1_000_000, 104.5
    s = sampler.sample()
    assert s["swap_in_per_s"] == 1_000_000.0
    assert (s["system_total"], s["system_used"], s["swap_used"]) == (16 << 30, 12 << 30, 1 << 30)


@pytest.mark.filterwarnings("ignore:'sin' and 'sout'")
def test_swap_counters_psutil_could_not_read_are_not_zero():
    def warning_swap():
        # What psutil does when /proc/vmstat is missing.
        warnings.warn("'sin' and 'sout' swap memory stats couldn't be determined and were "
                      "set to 0", RuntimeWarning)
        return SimpleNamespace(total=0, used=0, sin=0, sout=0)

    clock = FakeClock()
    sampler = fake_sampler(warning_swap, clock)
    sampler.sample()
    clock.t += 1
    assert sampler.sample()["swap_in_per_s"] is None


# ---------------------------------------------------------------- RSS of a real process tree


def test_rss_of_a_real_child_and_its_child():
    code = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # reap the grandchild when killed\n"
            "block = bytearray(40_000_000)\n"
            "sub = subprocess.Popen([sys.executable, '-c', "
            "'import time; block = bytearray(20_000_000); print(1, flush=True); time.sleep(60)'],"
            " stdout=sys.stdout)\n"
            "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"1"  # the grandchild holds its 20 MB
        sampler = sysmon.SystemSampler(child.pid, children_every_s=0.0)
        s = sampler.sample()
        total = psutil.virtual_memory().total
        assert s["processes"] == 2
        assert 60_000_000 < s["rss"] < total
        assert 0 < s["system_used"] <= s["system_total"] == total
        grandchild = psutil.Process(child.pid).children()[0]
        grandchild.kill()
        grandchild.wait(5)
        s = sampler.sample()  # the grandchild is gone: tolerated, not counted
        assert s["processes"] == 1 and 40_000_000 < s["rss"] < 60_000_000
    finally:
        child.kill()
        child.wait()
    gone = sampler.sample()
    assert (gone["rss"], gone["processes"]) == (None, 0)


def test_real_sample_on_this_machine():
    s = sysmon.SystemSampler(psutil.Process().pid).sample()
    assert s["rss"] > 1_000_000 and s["processes"] >= 1
    assert s["system_total"] == psutil.virtual_memory().total
    p = s["pressure"]
    assert set(p) == {"level", "raw", "source", "detail"}
    if sys.platform.startswith("linux") and Path("/proc/pressure/memory").is_file():
        assert p["source"] in ("cgroup", "psi") and p["level"] in sysmon.LEVELS
    elif p["source"] is None:
        assert p["level"] is None and p["raw"] is None and p["detail"]
    assert "pressure" in sysmon.summary(s)


# ---------------------------------------------------------------- slowdown detection


@dataclass(frozen=True, kw_only=True, slots=True)
class LoraParams:
    max_length: int = setting(512, "tokens per sample", min=16)
    rank: int = setting(8, "LoRA rank", min=1)


MPS_PRESET = DevicePreset(device="mps", batch_size=32, accumulation=16, precision="fp32",
                          fallback=("mps-safe", "cpu"))
LORA = Context(workload="lora", params=LoraParams(), preset=MPS_PRESET, device="mps",
               precision="fp32")


def simulate(detector, seconds, throughput, swap_in, level=lambda t: "normal"):
    """Step windows every 0.5 s and a memory sample every second, as the supervisor sees them."""
    warnings_seen = []
    for i in range(1, int(seconds * 2) + 1):
        t = i / 2
        w = detector.step(throughput(t), t, window_s=0.5)
        if w:
            warnings_seen.append((t, w))
        if i % 2 == 0:
            sample = {"swap_in_per_s": swap_in(t), "pressure": {"level": level(t)}}
            if w := detector.memory(sample, t):
                warnings_seen.append((t, w))
    return warnings_seen


def noisy(base):
    return lambda t: base * (1 + 0.15 * ((int(t * 2) * 7919) % 13 - 6) / 6)  # +-15%


def test_healthy_run_gives_no_warning():
    assert simulate(SlowdownDetector(LORA), 600, noisy(39.0), lambda t: 0.0) == []


def test_brief_dips_and_background_swap_give_no_warning():
    # A 9 s dip every 100 s (a checkpoint, an eval) while something else on the machine
    # pages in 5 MB/s: slow is not sustained, so no warning.
    def throughput(t):
        return 10.0 if t % 100 > 91 else noisy(39.0)(t)

    assert simulate(SlowdownDetector(LORA), 600, throughput, lambda t: 5e6,
                    level=lambda t: "warn" if t % 100 > 91 else "normal") == []


def test_slowdown_with_rising_swap_warns_once_with_advice():
    def throughput(t):
        return 39.0 if t < 120 else 12.0

    def swap_in(t):  # swapping starts with the slowdown and keeps growing
        return 0.0 if t < 118 else 20e6 + (t - 118) * 0.5e6

    detector = SlowdownDetector(LORA)
    seen = simulate(detector, 600, throughput, swap_in)
    assert len(seen) == 1
    t, w = seen[0]
    assert 140 < t < 170  # smoothing (~10 s) plus sustain (30 s) after the drop at 120 s
    assert w["kind"] == "slowdown" and w["fallback"] is False
    assert w["samples_per_s"] == 12.0 and w["best_samples_per_s"] == 39.0
    assert w["message"].startswith("throughput 12 samples/s is 31% of its best 39 while "
                                   "swap-in is ")
    assert "MB/s" in w["message"]
    sets = [s for a in w["advice"] for s in a["set"]]
    assert sets == ["params.max_length=256", "device.grad_checkpointing=true",
                    "device.batch_size=16", "device.accumulation=32", "device.precision=bf16",
                    "device.on_slowdown=fallback"]
    texts = " | ".join(a["text"] for a in w["advice"])
    assert "cut params.max_length 512 -> 256" in texts
    assert "batch_size 32 -> 16 with accumulation 16 -> 32 (same effective batch 512)" in texts
    assert "macOS 14" in texts


def test_slowdown_without_memory_evidence_is_not_this_warning():
    seen = simulate(SlowdownDetector(LORA), 400, lambda t: 39.0 if t < 100 else 10.0,
                    lambda t: 0.0)
    assert seen == []


def test_pressure_alone_is_evidence_and_fallback_follows_the_preset():
    preset = DevicePreset(device="mps", batch_size=1, accumulation=2, precision="bf16",
                          grad_checkpointing=True, on_slowdown="fallback", fallback=("cpu",))
    ctx = Context(workload="matmul", params={"n": 256}, preset=preset, device="mps",
                  precision="bf16")
    seen = simulate(SlowdownDetector(ctx), 300, lambda t: 40.0 if t < 100 else 15.0,
                    lambda t: None, level=lambda t: "critical" if t > 90 else "normal")
    assert len(seen) == 1
    w = seen[0][1]
    assert w["fallback"] is True and w["pressure"] == "critical" and w["swap_in_per_s"] is None
    assert "memory pressure is critical" in w["message"] and "swap-in" not in w["message"]
    # Nothing left to lower in this preset: the advice says so instead of inventing a knob.
    assert [a["set"] for a in w["advice"]] == [[]]


def test_hysteresis_one_warning_per_episode():
    def throughput(t):
        if t < 100 or 250 <= t < 350:
            return 40.0
        if 200 <= t < 250:
            return 26.0  # between ratio and recover: still the same episode
        return 10.0

    seen = simulate(SlowdownDetector(LORA), 500, throughput, lambda t: 5e6)
    times = [t for t, _ in seen]
    assert len(times) == 2, times
    assert 100 < times[0] < 150 and 350 < times[1] < 400


def test_slow_steps_need_two_slow_windows():
    # Note 003's scale: 60 s per step, then 226 s per step while swapping.
    detector = SlowdownDetector(LORA)
    t, seen = 0.0, []
    for i in range(12):
        step_s = 60.0 if i < 6 else 226.0
        for k in range(int(step_s)):
            if w := detector.memory({"swap_in_per_s": 0.0 if i < 6 else 30e6,
                                     "pressure": {"level": "normal"}}, t + k):
                seen.append(w)
        t += step_s
        if w := detector.step(32 / step_s, t, window_s=step_s):
            seen.append(w)
        if i == 6:
            assert seen == []  # one slow window could be a fluke
    assert len(seen) == 1 and "27% of its best" in seen[0]["message"]


def test_advice_for_cuda_and_odd_batches():
    auto = DevicePreset(device="cuda", batch_size=33, accumulation=1, precision="auto")
    texts = [a["text"] for a in advice(Context(preset=auto, device="cuda:0", precision="fp32"))]
    assert any("effective batch 33 -> 32" in t for t in texts)
    assert not any("bf16" in t for t in texts)  # auto chose fp32: this GPU lacks bf16
    fp32 = DevicePreset(device="cuda", batch_size=8, precision="fp32")
    sets = [a["set"] for a in advice(Context(preset=fp32, device="cuda", precision="fp32"))]
    assert ["device.precision=bf16"] in sets
    cpu = DevicePreset(device="cpu", batch_size=8, precision="fp32")
    assert not any("bf16" in a["text"] for a in advice(Context(preset=cpu, precision="fp32")))
    short = Context(params=LoraParams(max_length=24), preset=cpu)
    assert not any("max_length" in a["text"] for a in advice(short))  # 12 < min 16


def test_on_slowdown_fallback_needs_a_ladder():
    with pytest.raises(ConfigError) as e:
        device_from_table({"on_slowdown": "fallback"}, "mine.toml")
    assert "mine.toml" in str(e.value) and "on_slowdown" in str(e.value)
    with pytest.raises(ConfigError) as e:
        device_from_table({"on_slowdown": "always"}, "mine.toml")
    assert "'warn', 'fallback'" in str(e.value)
    assert device_from_table({"on_slowdown": "fallback", "fallback": ["cpu"]},
                             "ok.toml").on_slowdown == "fallback"


def test_a_trainer_that_exited_but_is_not_yet_reaped_is_not_read_as_zero_rss():
    """Between a trainer's exit and the supervisor's poll() it is a zombie whose RSS reads 0:
    that is no process, not a process using no memory."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    zombie = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60  # `python -c pass` exits in a fraction of that, even loaded
    while zombie.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.02)
    assert zombie.status() == psutil.STATUS_ZOMBIE
    sample = sysmon.SystemSampler(proc.pid).sample()
    proc.wait()
    assert sample["rss"] is None and sample["processes"] == 0


# ---------------------------------------------------------------- macOS physical footprint


RUSAGE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)


def fake_proc_pid_rusage(footprints: dict[int, int]):
    """A C-callable stand-in for libproc's proc_pid_rusage: fills a rusage_info_v2 like xnu
    (every field, the footprint where it belongs), -1 for a pid it does not know."""
    def impl(pid, flavor, buffer):
        if flavor != sysmon.RUSAGE_INFO_V2 or pid not in footprints:
            return -1
        info = sysmon.RusageInfoV2.from_address(buffer)
        info.ri_resident_size = 1           # anything but the footprint
        info.ri_phys_footprint = footprints[pid]
        info.ri_diskio_byteswritten = 7     # the struct's last field: the whole of it is ours
        return 0
    return RUSAGE(impl)


def test_rusage_info_v2_layout_matches_sys_resource_h():
    # uuid[16], then 18 uint64: footprint is the 8th of them
    assert sysmon.RusageInfoV2.ri_phys_footprint.offset == 16 + 7 * 8
    assert ctypes.sizeof(sysmon.RusageInfoV2) == 16 + 18 * 8


def test_phys_footprint_marshals_through_ctypes():
    fn = fake_proc_pid_rusage({42: 3_500_000_000})
    assert sysmon.phys_footprint(42, fn) == 3_500_000_000
    assert sysmon.phys_footprint(43, fn) is None


@pytest.mark.skipif(sys.platform == "darwin", reason="the real proc_pid_rusage exists on macOS")
def test_phys_footprint_without_libproc_is_none():
    assert sysmon.phys_footprint(psutil.Process().pid) is None


def _tree_with_a_grandchild():
    code = ("import signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
            "sub = subprocess.Popen([sys.executable, '-c', "
            "'import time; print(1, flush=True); time.sleep(60)'], stdout=sys.stdout)\n"
            "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout.readline().strip() == b"1"
    return child, psutil.Process(child.pid).children()[0]


def test_footprint_summed_over_a_real_tree_on_macos(monkeypatch):
    child, grandchild = _tree_with_a_grandchild()
    try:
        footprints = {child.pid: 3_000_000_000, grandchild.pid: 500_000_000}
        fn = fake_proc_pid_rusage(footprints)
        monkeypatch.setattr(sysmon, "_proc_pid_rusage", lambda: fn)
        sampler = sysmon.SystemSampler(child.pid, platform="darwin", children_every_s=0.0,
                                       pressure=sysmon.NoPressure("test"))
        s = sampler.sample()
        assert (s["rss"], s["processes"], s["rss_kind"]) == (3_500_000_000, 2, "footprint")
        assert sysmon.summary(s).startswith("footprint 3.5 GB")
        # the grandchild's footprint cannot be read (another user's, say): its RSS instead
        del footprints[grandchild.pid]
        s = sampler.sample()
        rss = psutil.Process(grandchild.pid).memory_info().rss
        assert (s["rss"], s["processes"], s["rss_kind"]) == (3_000_000_000 + rss, 2, "footprint+rss")
        # no footprint at all (the call fails for every pid): RSS, said so
        footprints.clear()
        s = sampler.sample()
        assert s["rss_kind"] == "rss" and s["rss"] < 3_000_000_000
    finally:
        grandchild.kill()
        child.kill()
        child.wait()


def test_linux_samples_are_rss_as_before(monkeypatch):
    monkeypatch.setattr(sysmon, "_proc_pid_rusage", lambda: pytest.fail("called on Linux"))
    s = sysmon.SystemSampler(psutil.Process().pid, platform="linux",
                             pressure=sysmon.NoPressure("test")).sample()
    assert "rss_kind" not in s and s["rss"] == pytest.approx(psutil.Process().memory_info().rss, rel=0.5)

"""The hardware monitor (engine.monitor.hardware) and its panel (cockpit.ui.widgets.hardware).

CPU figures are read from real processes: a child that spins and one that sleeps. The clock
handed to the readers is a fake one, and the tests wait for CPU seconds to accrue (not for a
wall-clock window), so a loaded machine makes them slower, never wrong. NVML runs through a
fake `pynvml` module in sys.modules, with the real binding's function names.
"""

from __future__ import annotations

import subprocess
import sys
import time
import types
from collections import namedtuple
from types import SimpleNamespace

import psutil
import pytest
from textual.app import App, ComposeResult

from cockpit.present.lines import human_line
from cockpit.present.words import memory_text
from cockpit.ui.model import RunModel
from cockpit.ui.widgets import hardware as panel_module
from cockpit.ui.widgets.hardware import HardwarePanel, hardware_text
from engine.monitor import hardware, sysmon
from ui_support import run, wait_for

SPIN = "import time\nwhile True: pass\n"
SLEEP = "import time\ntime.sleep(600)\n"


@pytest.fixture
def spinner():
    proc = subprocess.Popen([sys.executable, "-c", SPIN])
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", SLEEP])
    yield psutil.Process(proc.pid)
    proc.kill()
    proc.wait()


def cpu_seconds(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def wait_cpu(proc: psutil.Process, seconds: float) -> None:
    """Until the process has used `seconds` more CPU; the deadline only catches a hang."""
    start, deadline = cpu_seconds(proc), time.monotonic() + 120
    while cpu_seconds(proc) - start < seconds:
        assert time.monotonic() < deadline, "the spinning child got no CPU in two minutes"
        time.sleep(0.05)


# ---------------------------------------------------------------- the run's CPU


def test_tree_cpu_counts_cpu_seconds_over_the_sampler_clock(spinner, sleeper):
    cpu = hardware.TreeCpu()
    assert cpu.percent([spinner, sleeper], now=10.0) is None  # no earlier figure yet
    wait_cpu(spinner, 0.5)
    # 0.5+ CPU seconds in what the (fake) clock calls one second: 50% of a core or more.
    assert cpu.percent([spinner, sleeper], now=11.0) >= 50.0
    assert cpu.percent([sleeper], now=12.0) < 5.0          # the sleeper alone uses about none
    assert cpu.percent([sleeper], now=12.0) is None        # no time passed: no figure


def test_sampler_reports_tree_cpu_and_cores_and_keeps_the_run_out_of_others(spinner):
    clock = SimpleNamespace(t=100.0)
    others = hardware.OtherProcesses(every_s=0.0)
    sampler = sysmon.SystemSampler(spinner.pid, pressure=sysmon.NoPressure("test"),
                                   clock=lambda: clock.t, others=others, gpus=hardware.Gpus("") )
    first = sampler.sample()
    assert first["cpu_percent"] is None and first["gpus"] == []
    assert first["cpu_count"] == len(psutil.Process().cpu_affinity()) if hasattr(
        psutil.Process, "cpu_affinity") else psutil.cpu_count()
    wait_cpu(spinner, 0.5)
    clock.t += 1.0
    second = sampler.sample()
    assert second["cpu_percent"] >= 50.0
    assert spinner.pid not in [o["pid"] for o in second["cpu_others"]]  # it is the run
    assert 0.0 <= second["cpu_system_percent"] <= 100.0
    assert "cpu" in hardware.summary(second) and "cores" in hardware.summary(second)


# ---------------------------------------------------------------- other processes


def test_a_busy_neighbour_is_named_and_the_excluded_are_not(spinner, sleeper):
    others = hardware.OtherProcesses(every_s=5.0)
    assert others.due(0.0)
    others.scan(0.0, exclude=set())
    assert others.others == [] and not others.due(4.9) and others.due(5.0)
    wait_cpu(spinner, 0.5)
    others.scan(1.0, exclude=set())
    busy = {o["pid"]: o for o in others.others}
    assert spinner.pid in busy and busy[spinner.pid]["cpu_percent"] >= 50.0
    assert busy[spinner.pid]["name"].startswith("python")
    assert sleeper.pid not in busy
    assert len(others.others) <= hardware.OTHERS_SHOWN
    assert others.others_percent >= sum(o["cpu_percent"] for o in others.others)
    assert [o["cpu_percent"] for o in others.others] == sorted(
        (o["cpu_percent"] for o in others.others), reverse=True)
    wait_cpu(spinner, 0.5)
    others.scan(2.0, exclude={spinner.pid})
    assert spinner.pid not in [o["pid"] for o in others.others]


Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")


def test_machine_busy_share_leaves_out_guest_and_counts_iowait_as_idle():
    feed = iter([Times(100, 0, 50, 800, 50, 0, 0, 0, 30, 0),
                 Times(250, 0, 100, 840, 60, 0, 0, 0, 80, 0)])  # +200 busy, +50 idle, +50 guest
    others = hardware.OtherProcesses(pids=lambda: [], machine_times=lambda: next(feed))
    others.scan(0.0, exclude=set())
    assert others.system_percent is None
    others.scan(5.0, exclude=set())
    assert others.system_percent == 80.0


# ---------------------------------------------------------------- contention


def contended(percent=95.0, busy=98.0):
    return {"cpu_percent": 110.0, "cpu_count": 2, "cpu_system_percent": busy,
            "cpu_others": [{"pid": 4242, "name": "stress", "cpu_percent": percent}]}


def test_sustained_contention_warns_once_and_never_falls_back():
    detector = hardware.ContentionDetector()
    fired = [(t, w) for t in range(0, 120) if (w := detector.sample(contended(), float(t)))]
    assert [t for t, _ in fired] == [30]
    w = fired[0][1]
    assert w["kind"] == "cpu-contention" and w["fallback"] is False
    assert "stress (pid 4242) at 95% of a core" in w["message"] and "2 cores" in w["message"]
    assert "renice -n 19 -p 4242" in w["advice"][0]["text"]
    assert w["advice"][1]["set"] == ["device.threads=1"]  # 2 cores less the neighbour's one


def test_more_neighbours_than_are_shown_count_in_full():
    """Seen on the 16-core GPU host: 16 spinners, five shown at about 99% each. The warning
    must count all sixteen, and leaves no core to give the run."""
    sample = contended() | {"cpu_count": 16, "cpu_others_percent": 1584.0,
                            "cpu_others": [{"pid": p, "name": "python3", "cpu_percent": 99.0} for p in range(5)]}
    w = hardware.ContentionDetector(sustain_s=0).sample(sample, 0.0)
    assert "python3 (pid 4) at 99% and more, 1,584% in all;" in w["message"]
    assert w["cpu_others_percent"] == 1584.0 and len(w["advice"]) == 1  # no threads to suggest


def test_brief_or_harmless_neighbours_give_no_warning():
    detector = hardware.ContentionDetector()
    for t in range(0, 300):
        # 20 s of contention every minute: never sustained
        sample = contended() if t % 60 < 20 else contended(busy=40.0)
        assert detector.sample(sample, float(t)) is None
    for t in range(300, 400):  # a machine with idle cores: the neighbour takes nothing
        assert detector.sample(contended(busy=60.0), float(t)) is None
    for t in range(400, 500):  # saturated by the run itself
        assert detector.sample(contended(percent=10.0), float(t)) is None
    for t in range(500, 600):  # older events: no CPU fields at all
        assert detector.sample({"rss": 1}, float(t)) is None


def test_a_new_episode_after_contention_has_gone_warns_again():
    detector = hardware.ContentionDetector()
    times = []
    for t in range(0, 400):
        quiet = 100 <= t < 140 or 200 <= t < 210   # gone 40 s (re-arms), then only 10 s (not)
        if detector.sample(contended(busy=10.0) if quiet else contended(), float(t)):
            times.append(t)
    assert times == [30, 170]


def test_headless_prints_the_contention_warning_readably():
    w = hardware.ContentionDetector()._warning(contended(), 31.0)
    line = human_line({"type": "warning", "t": 0, "attempt": 1, **w})
    assert line.startswith("warning: other processes are taking the CPU this run needs: stress")
    assert "    - stop or pause them" in line and "(--set device.threads=1)" in line
    assert "fall back" not in line


def test_headless_step_lines_carry_cpu_and_gpu_use():
    memory = {"rss": 2 * 10**9, "system_total": 10, "system_used": 5, "pressure": {"level": "normal"},
              "cpu_percent": 190.4, "gpus": [{"util_percent": 97}, {"util_percent": None}]}
    assert memory_text(memory) == "rss 2.0 GB, mem 50%, cpu 190%, gpu 97%, pressure normal"
    memory["gpus"] = [{"util_percent": u} for u in (91, 99, 95)]
    assert "gpu 91-99%" in memory_text(memory)
    assert memory_text({"rss": 10**9}) == "rss 1.0 GB, pressure n/a"  # an event from before


# ---------------------------------------------------------------- GPUs through a fake NVML


class NVMLError(Exception):
    pass


@pytest.fixture(autouse=True)
def nvml_started_afresh():
    """NVML starts once per process (hardware._nvml is cached): each test starts its own."""
    hardware._nvml.cache_clear()
    yield
    hardware._nvml.cache_clear()


def use_nvml(monkeypatch, module) -> None:
    """`import pynvml` gives `module` (None: ImportError), and the next read starts it."""
    monkeypatch.setitem(sys.modules, "pynvml", module)
    hardware._nvml.cache_clear()


def fake_pynvml(count=2, *, init_error=None, no_power=False, util_error_at=None, memory_v2=True):
    mod = types.ModuleType("pynvml")
    mod.NVMLError = NVMLError
    mod.NVML_TEMPERATURE_GPU = 0
    mod.calls = []
    mod.inits = 0

    def init():
        mod.inits += 1
        if init_error:
            raise init_error
    mod.nvmlInit = init
    mod.nvmlDeviceGetCount = lambda: count
    mod.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    mod.nvmlDeviceGetName = lambda h: f"NVIDIA H100 80GB HBM3 #{h[1]}".encode()  # older: bytes
    mod.nvmlDeviceGetUUID = lambda h: f"GPU-{h[1]}a2b3c4d-0000"

    def util(h):
        mod.calls.append(h[1])
        if util_error_at is not None and h[1] == util_error_at:
            raise NVMLError("GPU is lost")
        return SimpleNamespace(gpu=90 + h[1], memory=40)
    mod.nvmlDeviceGetUtilizationRates = util
    reserved = 10**9  # what the driver keeps for itself: v1 counts it as used, v2 does not

    def memory(h, version=None):
        if version is not None and not memory_v2:
            raise NVMLError("Function Not Found")  # a driver before R510
        v1 = version is None
        return SimpleNamespace(used=(30 + h[1]) * 10**9 + (reserved if v1 else 0), total=80 * 10**9,
                               reserved=0 if v1 else reserved, free=(50 - h[1]) * 10**9 - reserved)
    mod.nvmlMemory_v2 = 0x02000028
    mod.nvmlDeviceGetMemoryInfo = memory

    def power(h):
        if no_power:
            raise NVMLError("Not Supported")
        return 287_400 + h[1]  # milliwatts
    mod.nvmlDeviceGetPowerUsage = power

    def temperature(h, sensor):
        assert sensor == mod.NVML_TEMPERATURE_GPU
        return 64 + h[1]
    mod.nvmlDeviceGetTemperature = temperature
    return mod


def test_gpu_figures_through_nvml(monkeypatch):
    use_nvml(monkeypatch, fake_pynvml())
    gpus = hardware.Gpus(None).read()
    assert gpus == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3 #0", "util_percent": 90, "mem_used": 30 * 10**9,
         "mem_total": 80 * 10**9, "power_w": 287.4, "temp_c": 64},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3 #1", "util_percent": 91, "mem_used": 31 * 10**9,
         "mem_total": 80 * 10**9, "power_w": 287.4, "temp_c": 65},
    ]


def test_only_the_gpus_cuda_visible_devices_leaves_to_the_run(monkeypatch):
    use_nvml(monkeypatch, nvml := fake_pynvml(count=4))
    sampler = sysmon.SystemSampler(psutil.Process().pid, pressure=sysmon.NoPressure("test"),
                                   env={"CUDA_VISIBLE_DEVICES": "2,0"})
    assert [g["index"] for g in sampler.sample()["gpus"]] == [2, 0]
    assert [g["index"] for g in hardware.Gpus("GPU-3a2b").read()] == [3]   # a UUID prefix
    assert hardware.Gpus("").read() == []
    assert nvml.inits == 1  # one start for the process, however many attempts sample


@pytest.mark.parametrize("spec, indices", [
    (None, [0, 1, 2, 3]), ("", []), ("-1", []), ("1", [1]), (" 3 , 1", [3, 1]),
    ("0,7,1", [0]),            # like CUDA: the list ends at a device that does not exist
    ("1,1", [1]),              # a device listed twice
    ("GPU-2", [2]), ("GPU-", []),  # a UUID prefix must name exactly one device
    ("MIG-0c1d-aaaa", []),     # a MIG instance: no per-GPU utilisation to report
])
def test_visible_indices_follow_cudas_rules(spec, indices):
    uuids = [f"GPU-{i}f00-0000" for i in range(4)]
    assert hardware.visible_indices(spec, uuids) == indices


def test_absent_or_failing_nvml_shows_no_gpus_and_raises_nothing(monkeypatch):
    use_nvml(monkeypatch, None)  # import pynvml -> ImportError
    gpus = hardware.Gpus(None)
    assert gpus.read() == [] and "pip install nvidia-ml-py" in gpus.why_not
    use_nvml(monkeypatch, fake_pynvml(init_error=NVMLError("Driver Not Loaded")))
    gpus = hardware.Gpus(None)
    assert gpus.read() == [] and gpus.read() == [] and "Driver Not Loaded" in gpus.why_not
    use_nvml(monkeypatch, fake_pynvml(no_power=True, util_error_at=1))
    read = hardware.Gpus(None).read()
    assert [g["power_w"] for g in read] == [None, None]        # a board that reports no power
    assert [g["util_percent"] for g in read] == [90, None]     # one figure failing, not the rest
    assert read[1]["temp_c"] == 65


def test_memory_used_leaves_out_the_drivers_reserve_where_the_driver_can_say(monkeypatch):
    use_nvml(monkeypatch, fake_pynvml(count=1))
    assert hardware.Gpus(None).read()[0]["mem_used"] == 30 * 10**9            # v2, as nvidia-smi
    use_nvml(monkeypatch, fake_pynvml(count=1, memory_v2=False))
    assert hardware.Gpus(None).read()[0]["mem_used"] == 31 * 10**9            # v1: all it has


def test_summary_of_an_older_event_is_empty_and_gpus_read_in_one_line(monkeypatch):
    assert hardware.summary({"rss": 1}) == ""
    use_nvml(monkeypatch, fake_pynvml(count=1))
    text = hardware.summary({"cpu_percent": 190.0, "cpu_count": 2, "gpus": hardware.Gpus(None).read(),
                             "cpu_others": [{"pid": 9, "name": "stress", "cpu_percent": 98.0}]})
    assert text == "cpu 190% of 2 cores, busy: stress 98%, gpu0 90% 30.0/80.0 GB 287 W 64 C"


# ---------------------------------------------------------------- the panel


GB = 10**9


def model(device="cuda:0", gpus=2, others=True, memory=True, device_memory=None, pressure="normal"):
    m = RunModel()
    events = [{"type": "run_started", "t": 0.0, "run": "r", "workload": "w", "device_preset": "p"},
              {"type": "attempt_started", "t": 0.0, "attempt": 1, "preset": "p", "config": {}},
              {"type": "trainer_ready", "t": 1.0, "attempt": 1, "device": device, "precision": "fp32"}]
    if device_memory is not None:
        events.append({"type": "step", "t": 2.0, "attempt": 1, "step": 1, "total": 10, "loss": 1.0,
                       "samples_per_s": 10.0, "steps_per_s": 1.0, "device_memory": device_memory})
    if memory:
        events.append({
            "type": "memory", "t": 3.0, "attempt": 1, "rss": GB, "processes": 1,
            "system_total": 16 * GB, "system_used": 8 * GB, "pressure": {"level": pressure},
            "cpu_percent": 185.3, "cpu_count": 2, "cpu_system_percent": 99.0,
            "cpu_others": [{"pid": 4242, "name": "stress", "cpu_percent": 98.0},
                           {"pid": 17, "name": "python3", "cpu_percent": 41.0}] if others else [],
            "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "util_percent": 90 + i,
                      "mem_used": (30 + i) * GB, "mem_total": 80 * GB, "power_w": 287.0,
                      "temp_c": 64 + 30 * (i == 1)} for i in range(gpus)]})
    m.fold(events)
    return m


def lines(text) -> list[str]:
    return text.plain.splitlines()


@pytest.mark.parametrize("width", [26, 40, 76, 99])
def test_compact_panel_fits_its_width_in_four_lines(width):
    for m in (model(), model(gpus=8), model(device="mps", gpus=0, device_memory={
            "allocated": 2.4 * GB, "driver": 3.1 * GB, "limit": 16 * GB}, pressure="warn")):
        shown = lines(hardware_text(m, width))
        assert 1 <= len(shown) <= 4 and all(len(line) <= width for line in shown), shown
    shown = lines(hardware_text(model(gpus=8), width))
    assert shown[0].startswith("CPU 185% of 2 cores") and shown[1].startswith("others")
    assert shown[2].startswith("8 GPUs") and "max 94°C" in shown[2]
    gpu0 = lines(hardware_text(model(gpus=1), width))[2]
    # from MID columns with short bars; in a side column bare, the temperature still in
    assert gpu0 == ("GPU0 90% 30.0/80.0 GB 64°C" if width < 30 else
                    "GPU0 90% 30.0/80.0 GB 64°C 287 W" if width < panel_module.MID else
                    "GPU0  ████░ 90%  ██░░░ 30.0/80.0 GB  64°C  287 W")


def test_wide_panel_names_each_gpu_with_bars_and_the_neighbours_pids():
    shown = lines(hardware_text(model(gpus=8), 196))
    assert len(shown) == 10
    assert "█" in shown[0] and "machine 99% busy" in shown[0]
    assert shown[1] == "others  stress (pid 4242) 98%  python3 (pid 17) 41%"
    gpu1 = shown[3]
    assert gpu1.startswith("GPU1 NVIDIA H100 80GB HBM3  util ") and "91%" in gpu1
    assert "31.0 GB of 80.0 GB" in gpu1 and "94°C" in gpu1 and "287 W" in gpu1
    crowded = model(gpus=0)
    crowded.memory["cpu_others_percent"] = 1584.0  # more busy neighbours than the two listed
    assert lines(hardware_text(crowded, 76))[1].startswith("others  1,584% in all:  stress 98%")
    # A fixed height folds the GPUs rather than cutting them off.
    short = lines(hardware_text(model(gpus=8), 196, height=3))
    assert [s.split()[0] for s in short] == ["CPU", "others", "8"]


def test_mac_panel_says_metal_and_pressure_in_words():
    m = model(device="mps", gpus=0, others=False, pressure="warn",
              device_memory={"allocated": 2.4 * GB, "driver": 3.1 * GB, "limit": 16 * GB})
    shown = lines(hardware_text(m, 76))
    assert shown[1] == "Metal 3.1 of 16.0 GB recommended (19%)  tensors 2.4 GB"
    assert shown[2] == "memory pressure: warn"
    assert "GPU" not in hardware_text(m, 76).plain


def test_cuda_without_gpu_figures_says_why_cpu_runs_show_no_gpu_line_and_old_events_read():
    assert lines(hardware_text(model(gpus=0), 76))[-1] == "no GPU figures"   # an event before the reason
    cpu_run = hardware_text(model(device="cpu", gpus=0, others=False), 76).plain
    assert cpu_run == "CPU 185% of 2 cores  █████████░  machine 99% busy"   # 185% of 200: 9 of 10 cells
    assert hardware_text(model(memory=False), 76).plain.startswith("no hardware sample yet")
    old = RunModel()
    old.fold([{"type": "memory", "t": 1.0, "rss": GB, "pressure": {"level": "normal"}}])
    assert hardware_text(old, 76).plain == "CPU -"


def _sampled(monkeypatch, module, cuda_visible: str | None = None) -> dict:
    """A memory event as the supervisor writes it, its GPUs read through `module` (None:
    `import pynvml` fails) for a run given `cuda_visible`."""
    use_nvml(monkeypatch, module)
    env = {} if cuda_visible is None else {"CUDA_VISIBLE_DEVICES": cuda_visible}
    sampler = sysmon.SystemSampler(psutil.Process().pid, pressure=sysmon.NoPressure("test"), env=env)
    return {"type": "memory", "t": 3.0, "attempt": 1, **sampler.sample()}


@pytest.mark.parametrize("module, cuda_visible, said", [
    (None, None, "no GPU figures: pynvml not installed (pip install nvidia-ml-py)"),
    (fake_pynvml(init_error=NVMLError("Driver Not Loaded")), None,
     "no GPU figures: NVML: Driver Not Loaded"),
    (fake_pynvml(count=1), "MIG-0c1d-aaaa",
     "no GPU figures: a MIG slice: NVML reports no per-GPU figures"),
    (fake_pynvml(count=0), None, "no GPU figures: NVML sees no GPU"),
])
def test_the_panel_says_why_the_sampler_has_no_gpu_figures(monkeypatch, module, cuda_visible, said):
    """Installing nvidia-ml-py is advised only where the import failed: not where NVML is there
    but failed, nor on a MIG slice, which NVML does not report figures for."""
    event = _sampled(monkeypatch, module, cuda_visible)
    assert event["gpus"] == [] and f"no GPU figures: {event['gpus_why_not']}".startswith(said)
    m = model(gpus=0)
    m.fold([event])
    shown = lines(hardware_text(m, 196))
    assert shown[-1].startswith(said)
    assert ("pip install" in shown[-1]) == (module is None)


def test_a_sample_with_gpu_figures_carries_no_reason(monkeypatch):
    event = _sampled(monkeypatch, fake_pynvml(count=2), "1")
    assert [g["index"] for g in event["gpus"]] == [1] and "gpus_why_not" not in event


class PanelApp(App):
    def compose(self) -> ComposeResult:
        yield HardwarePanel(id="hw")


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
def test_panel_in_an_app_fits_the_terminal_and_refits_when_resized(size):
    async def drive():
        app = PanelApp()
        async with app.run_test(size=size) as pilot:
            panel = app.query_one(HardwarePanel)
            panel.show(model(gpus=4))
            await pilot.pause()
            assert panel.border_title == "hardware"
            shown = str(panel.render()).splitlines()
            if size[0] < 100 + 4:
                assert len(shown) == 3 and shown[2].startswith("4 GPUs")
                assert panel.size.height == 3 and panel.outer_size.height == 5
            else:
                assert len(shown) == 6 and shown[5].startswith("GPU3 NVIDIA H100")
            assert all(len(line) <= panel.size.width for line in shown)
            # A frame with nothing new for the panel repaints nothing; a memory event does.
            painted = []
            panel.update = lambda *a, **k: painted.append(a)
            m = panel._model
            m.fold([{"type": "step", "t": 4.0, "step": 2, "total": 10, "device_memory": {"allocated": 1}}])
            panel.show(m)
            assert painted == []
            m.fold([dict(m.memory, t=5.0, cpu_percent=12.0)])
            panel.show(m)
            assert len(painted) == 1 and "CPU 12%" in painted[0][0].plain
            del panel.update
            other = (200, 50) if size == (80, 24) else (80, 24)
            await pilot.resize_terminal(*other)
            await wait_for(pilot, lambda: (len(str(panel.render()).splitlines()) == 6) == (other[0] == 200),
                           what="the panel to re-fit")
    run(drive())


# ---------------------------------------------------------------- on the dashboard


def hardware_run(home, gpus: int):
    """The recorded finished run, its last memory event given hardware figures."""
    import json

    from ui_support import copy_run

    path = copy_run(home, "finished")
    lines = (path / "events.jsonl").read_text().splitlines()
    at = max(i for i, line in enumerate(lines) if '"type":"memory"' in line.replace(" ", ""))
    event = json.loads(lines[at])
    event.update(model(gpus=gpus).memory | {"t": event["t"], "attempt": event["attempt"]})
    lines[at] = json.dumps(event)
    (path / "events.jsonl").write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("size", [(80, 24), (200, 50)])
def test_dashboard_shows_the_hardware_of_a_recorded_run(home, size):
    from cockpit.app import make_app
    from cockpit.ui.dashboard import DashboardScreen
    from engine.record.rundir import RunDir

    path = hardware_run(home, gpus=2)

    async def drive():
        app = make_app(attach=False)
        async with app.run_test(size=size) as pilot:
            app.push_screen(DashboardScreen(RunDir(path)))
            await wait_for(pilot, lambda: app.screen.model.finished, what="the replay")
            panel = app.screen.query_one(HardwarePanel)
            if size[0] < 120:  # memory and hardware share one slot: h shows this one
                await pilot.press("h")
            await wait_for(pilot, lambda: panel.display and panel.size.width > 0, what="the panel")
            await wait_for(pilot, lambda: "GPU1" in str(panel.render()), what="the figures")
            shown = str(panel.render()).splitlines()
            assert shown[0].startswith("CPU 185% of 2 cores") and shown[1].startswith("others")
            assert all(len(line) <= panel.size.width for line in shown)
            assert len(shown) <= panel.size.height
    run(drive())

"""What the machine does besides memory: the run's CPU, neighbours taking it, and each GPU.

The system sampler (engine.monitor.sysmon) adds these to every `memory` event:
    cpu_percent     CPU of the trainer and its children, % of one core (200 = two cores
                    busy), over the time since the previous sample; None on the first
    cpu_count       logical cores the trainer may run on (its affinity mask where the OS has
                    one, else every core of the machine)
    cpu_system_percent
                    how busy the whole machine was, % of all its cores, over the last scan of
                    other processes (below); None until two scans
    cpu_others      [{pid, name, cpu_percent}] of other processes using at least
                    OTHER_MIN_PERCENT of one core, busiest first, at most OTHERS_SHOWN of them;
                    refreshed every OTHERS_EVERY_S (a scan reads every process's /proc stat,
                    about 3 ms for 90 processes here, 5 ms for 180 on a 16-core GPU host),
                    carried unchanged in between
    cpu_others_percent
                    the CPU of every process over that line together, shown or not (16
                    neighbours at 99% each are 1,584%, where the five shown add up to 495)
    gpus            [{index, name, util_percent, mem_used, mem_total, power_w, temp_c}] per
                    GPU the run can see, through NVIDIA's NVML (`pip install nvidia-ml-py`);
                    [] when NVML is not installed, finds no driver or fails. A figure the GPU
                    does not report (power on some boards) is None.

`ContentionDetector` turns those samples into one `warning` event when other processes keep
the machine's CPU saturated. It is advice only: contention never triggers a fallback, since
no other preset would run faster while a neighbour holds the cores.

Never imports torch or a UI; pynvml is imported on the first GPU read, and only then.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import psutil

from engine.event_types import Advice, WarningFields
from engine.numbers import count

OTHERS_EVERY_S = 5.0
# A quarter of a core: shells, editors and this VM's own daemons stay below it, while anything
# that costs a run a noticeable share of a core (a second training job, a compile, a browser
# tab spinning) is above it.
OTHER_MIN_PERCENT = 25.0
OTHERS_SHOWN = 5

# Contention: others together hold at least half a core while the machine is nearly out of
# idle time. Both, because a neighbour on a machine with idle cores takes nothing from the run,
# and a saturated machine with no neighbour is just the run using what it has.
CONTENTION_OTHERS_PERCENT = 50.0
CONTENTION_BUSY_PERCENT = 90.0
CONTENTION_SUSTAIN_S = 30.0


# ---------------------------------------------------------------- the run's own CPU


def cpu_count(proc: psutil.Process | None) -> int:
    """Cores the process may run on: a run pinned by taskset or a batch scheduler to 4 of 64
    cores can use 4, and "400% of one core" is then all of it."""
    if proc is not None and hasattr(proc, "cpu_affinity"):  # Linux, Windows, FreeBSD
        try:
            return len(proc.cpu_affinity()) or psutil.cpu_count() or 1
        except (psutil.Error, OSError):
            pass
    return psutil.cpu_count() or 1


def _cpu_seconds(proc: psutil.Process) -> float:
    # user + system of the process itself. Not children_user/children_system: those are the
    # reaped children's totals, and the children are counted while alive already.
    t = proc.cpu_times()
    return t.user + t.system


class TreeCpu:
    """CPU % of a set of processes from the growth of their CPU seconds between calls.

    Kept by pid, not through psutil's own cpu_percent(): the sampler re-lists the children
    every few seconds as fresh Process objects, which would restart psutil's count each time.
    A process first seen in this call has no earlier figure and counts from the next call."""

    def __init__(self):
        self._last: dict[int, float] = {}
        self._last_t: float | None = None

    def percent(self, procs: Iterable[psutil.Process], now: float) -> float | None:
        seconds: dict[int, float] = {}
        for proc in procs:
            try:
                seconds[proc.pid] = _cpu_seconds(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        last, last_t = self._last, self._last_t
        self._last, self._last_t = seconds, now
        if last_t is None or now <= last_t:
            return None
        # A pid whose seconds went down was reused by a new process: count it from now.
        used = sum(max(0.0, s - last[pid]) for pid, s in seconds.items() if pid in last)
        return round(100.0 * used / (now - last_t), 1)


# ---------------------------------------------------------------- other processes


def busy_and_total(times) -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine. On Linux guest time is already inside
    user time (psutil's own cpu_percent leaves it out of the total the same way); iowait is
    idle: a core waiting on a disk is free to run the trainer. Of one core's times too: the
    trainer's thread rule reads the cores it may run on (engine.train.threads)."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class OtherProcesses:
    """Every few seconds, which processes outside the run are using a lot of CPU.

    Reads each process's CPU seconds (one /proc/PID/stat on Linux) and asks the name only of
    the busy ones (a name can cost a /proc/PID/cmdline read too). Process objects are kept
    between scans, keyed by pid; a pid reused within one scan interval by a process with fewer
    CPU seconds reads as idle for that interval, never as negative.

    Only processes whose CPU times may be read are seen: on macOS, without root, the user's
    own (a browser, another training job), not the system's daemons. In a container, the
    processes of its pid namespace, while the busy share is the host's (/proc/stat is not
    namespaced)."""

    def __init__(self, *, every_s: float = OTHERS_EVERY_S, min_percent: float = OTHER_MIN_PERCENT,
                 pids: Callable[[], list[int]] = psutil.pids,
                 machine_times: Callable = psutil.cpu_times):
        self.every_s, self.min_percent = every_s, min_percent
        self._pids, self._machine_times = pids, machine_times
        self._procs: dict[int, psutil.Process] = {}
        self._seconds: dict[int, float] = {}
        self._machine: tuple[float, float] | None = None
        self._at: float | None = None
        self.others: list[dict] = []
        self.others_percent = 0.0
        self.system_percent: float | None = None

    def due(self, now: float) -> bool:
        return self._at is None or now - self._at >= self.every_s

    def scan(self, now: float, exclude: set[int]) -> None:
        """Refresh `others` and `system_percent` from the CPU used since the previous scan."""
        busy, total = busy_and_total(self._machine_times())
        seconds: dict[int, float] = {}
        procs: dict[int, psutil.Process] = {}
        for pid in self._pids():
            if pid in exclude:
                continue
            proc = self._procs.get(pid)
            try:
                if proc is None:
                    proc = psutil.Process(pid)
                seconds[pid] = _cpu_seconds(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            procs[pid] = proc
        last, last_at, last_machine = self._seconds, self._at, self._machine
        self._procs, self._seconds, self._at, self._machine = procs, seconds, now, (busy, total)
        if last_at is None or now <= last_at:
            return
        if last_machine is not None and total > last_machine[1]:
            self.system_percent = round(100.0 * (busy - last_machine[0]) / (total - last_machine[1]), 1)
        wall = now - last_at
        busy_pids = sorted(((s - last[pid]) / wall * 100.0, pid) for pid, s in seconds.items()
                           if pid in last and s - last[pid] >= self.min_percent / 100.0 * wall)
        self.others = []
        self.others_percent = round(sum(percent for percent, _ in busy_pids), 1)
        for percent, pid in reversed(busy_pids[-OTHERS_SHOWN:]):
            try:
                name = procs[pid].name()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            self.others.append({"pid": pid, "name": name, "cpu_percent": round(percent, 1)})


# ---------------------------------------------------------------- GPUs through NVML


def visible_indices(spec: str | None, uuids: list[str]) -> list[int]:
    """The NVML indices CUDA_VISIBLE_DEVICES lets the run use, given each device's UUID.

    Unset: all. Like CUDA, the list ends at the first entry that names no device (so "" and
    "-1" hide every GPU); an entry is an index or a prefix of a "GPU-..." UUID. MIG instances
    ("MIG-...") are not GPUs NVML can report utilisation for: they end the list too.
    Indices are taken as NVML's (PCI bus order); CUDA's default order is fastest first, which
    differs only on a machine with GPUs of different kinds (CUDA_DEVICE_ORDER=PCI_BUS_ID
    makes them agree)."""
    count = len(uuids)
    if spec is None:
        return list(range(count))
    out: list[int] = []
    for entry in spec.split(","):
        entry = entry.strip()
        if entry.lstrip("-").isdigit():
            index = int(entry)
            if not 0 <= index < count:
                break
        else:
            matches = [i for i, uuid in enumerate(uuids) if entry and uuid.startswith(entry)]
            if len(matches) != 1:  # unknown, or a prefix too short to name one device
                break
            index = matches[0]
        if index in out:
            break  # CUDA refuses a device listed twice
        out.append(index)
    return out


def _text(value) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 -- one figure the board does not report
        return None


@dataclass(frozen=True)
class _Nvml:
    module: Any = None
    devices: tuple = ()            # (handle, name, uuid) by NVML index
    memory_info: Callable | None = None
    why_not: str | None = None


def _memory_reader(nv, handles: list) -> Callable:
    """nvmlDeviceGetMemoryInfo's v2 where the driver has it (R510 on): its `used` leaves out
    what the driver reserves for itself, as nvidia-smi does (on an idle H100 here v1 said
    1.7 GB used and nvidia-smi 0); else v1. Chosen once, so an old driver does not fail a
    call every second."""
    version = getattr(nv, "nvmlMemory_v2", None)
    if version is not None and handles:
        try:
            nv.nvmlDeviceGetMemoryInfo(handles[0], version=version)
            return lambda handle: nv.nvmlDeviceGetMemoryInfo(handle, version=version)
        except Exception:  # noqa: BLE001 -- a driver without v2: v1 below
            pass
    return nv.nvmlDeviceGetMemoryInfo


@functools.cache
def _nvml() -> _Nvml:
    """NVML, started once per process: a supervisor samples attempt after attempt, and a
    start costs about 100 ms of CPU on the H100 host (import, nvmlInit, the device handles).
    A failed start is not retried for the process's life.

    Any exception counts as failure: NVMLError for no driver or no GPU, OSError from ctypes,
    whatever a broken install raises; none of it may reach the supervisor's sampling loop."""
    try:
        import pynvml
    except ImportError:
        return _Nvml(why_not="pynvml not installed (pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        devices = tuple((h, _text(pynvml.nvmlDeviceGetName(h)), _text(_try(pynvml.nvmlDeviceGetUUID, h) or ""))
                        for h in handles)
        return _Nvml(pynvml, devices, _memory_reader(pynvml, handles))
    except Exception as e:  # noqa: BLE001 -- see above
        return _Nvml(why_not=f"NVML: {e}")


def _none_picked(spec: str | None, count: int) -> str:
    """Why NVML, started, gives the run no GPU (visible_indices said none)."""
    if not count:
        return "NVML sees no GPU"
    first = (spec or "").split(",")[0].strip()
    if first.startswith("MIG-"):
        return "a MIG slice: NVML reports no per-GPU figures for one"
    return f"CUDA_VISIBLE_DEVICES={spec!r} names no GPU that NVML knows"


class Gpus:
    """Per-GPU figures through NVML, for the GPUs `cuda_visible` (the trainer's
    CUDA_VISIBLE_DEVICES) leaves to the run.

    NVML is a monitoring aid, never a reason to fail: a missing module, a machine without the
    driver, or a start that raises makes `read()` return [] (`why_not` says why, as it does
    for a run on a MIG slice or with no GPU NVML knows); a figure whose call raises is None."""

    def __init__(self, cuda_visible: str | None = None):
        self.cuda_visible = cuda_visible
        self._picked: list[tuple[int, object, str]] | None = None  # (index, handle, name)
        self.why_not: str | None = None

    def _devices(self) -> list[tuple[int, object, str]]:
        if self._picked is None:
            nv = _nvml()
            self.why_not = nv.why_not
            uuids = [uuid for _, _, uuid in nv.devices]
            self._picked = [(i, *nv.devices[i][:2]) for i in visible_indices(self.cuda_visible, uuids)]
            if not self._picked and self.why_not is None:
                self.why_not = _none_picked(self.cuda_visible, len(nv.devices))
        return self._picked

    def read(self) -> list[dict]:
        devices = self._devices()
        if not devices:
            return []
        nv = _nvml()
        out = []
        for index, handle, name in devices:
            util = _try(nv.module.nvmlDeviceGetUtilizationRates, handle)
            mem = _try(nv.memory_info, handle)
            power_mw = _try(nv.module.nvmlDeviceGetPowerUsage, handle)
            temp = _try(nv.module.nvmlDeviceGetTemperature, handle, getattr(nv.module, "NVML_TEMPERATURE_GPU", 0))
            out.append({"index": index, "name": name,
                        "util_percent": None if util is None else util.gpu,
                        "mem_used": None if mem is None else mem.used,
                        "mem_total": None if mem is None else mem.total,
                        "power_w": None if power_mw is None else round(power_mw / 1000.0, 1),
                        "temp_c": temp})
        return out


# ---------------------------------------------------------------- contention warning


def _taken(sample: Mapping) -> float:
    """% of one core the other processes use together (the shown ones, for an event that
    predates cpu_others_percent)."""
    shown = sum(o["cpu_percent"] for o in sample.get("cpu_others") or [])
    return max(shown, sample.get("cpu_others_percent") or 0.0)


def _names(others: list[dict], taken: float) -> str:
    """'stress (pid 4242) at 95% of a core, python (pid 17) at 60%', and '..., 1,584% in all'
    when more are busy than are shown."""
    text = ", ".join(f"{o['name']} (pid {o['pid']}) at {o['cpu_percent']:.0f}%" + (" of a core" if i == 0 else "")
                     for i, o in enumerate(others))
    shown = sum(o["cpu_percent"] for o in others)
    return text + (f" and more, {taken:,.0f}% in all" if taken > shown + 1 else "")


class ContentionDetector:
    """Feed each memory sample; returns one `warning` event's fields when other processes
    have kept the machine saturated for `sustain_s`, then stays quiet until contention has
    been gone for `sustain_s` (one warning per episode, not one a minute). Pure: the caller
    passes the time."""

    def __init__(self, *, others_percent: float = CONTENTION_OTHERS_PERCENT,
                 busy_percent: float = CONTENTION_BUSY_PERCENT,
                 sustain_s: float = CONTENTION_SUSTAIN_S):
        self.others_percent, self.busy_percent, self.sustain_s = others_percent, busy_percent, sustain_s
        self.since: float | None = None       # contention seen continuously since
        self.clear_since: float | None = None
        self.warned = False

    def contended(self, sample: Mapping) -> bool:
        busy = sample.get("cpu_system_percent")
        return busy is not None and busy >= self.busy_percent and _taken(sample) >= self.others_percent

    def sample(self, sample: Mapping, t: float) -> WarningFields | None:
        if not self.contended(sample):
            self.since = None
            if self.warned:
                self.clear_since = self.clear_since if self.clear_since is not None else t
                if t - self.clear_since >= self.sustain_s:
                    self.warned, self.clear_since = False, None
            return None
        self.clear_since = None
        if self.since is None:
            self.since = t
        if self.warned or t - self.since < self.sustain_s:
            return None
        self.warned = True
        return self._warning(sample, t - self.since)

    def _warning(self, sample: Mapping, lasted: float) -> WarningFields:
        others = sample["cpu_others"]
        cores = sample.get("cpu_count") or psutil.cpu_count() or 1
        taken = _taken(sample) / 100.0
        message = (f"other processes are taking the CPU this run needs: {_names(others, 100 * taken)}; "
                   f"the machine's {cores} cores have been {sample['cpu_system_percent']:.0f}% busy "
                   f"for {lasted:.0f} s")
        advice: list[Advice] = [{"text": "stop or pause them, or lower their priority: renice -n 19 -p "
                           + " ".join(str(o["pid"]) for o in others), "set": []}]
        left = int(cores - taken)
        if 1 <= left < cores:
            advice.append({"text": f"or give this run the {count(left, 'core')} they "
                                   "leave (next run): threads beyond the free cores wait on each other",
                           "set": [f"device.threads={left}"]})
        return {"kind": "cpu-contention", "message": message, "advice": advice, "fallback": False,
                "cpu_others": list(others), "cpu_others_percent": round(100 * taken, 1),
                "cpu_system_percent": sample["cpu_system_percent"],
                "cpu_percent": sample.get("cpu_percent")}


def summary(sample: Mapping) -> str:
    """'cpu 190% of 2 cores, busy: stress 98%; gpu0 97% 31.2/80.0 GB 287 W 64 C', the
    hardware part of a memory event in one line; '' for an event from before these fields."""
    parts = []
    if sample.get("cpu_percent") is not None:
        parts.append(f"cpu {sample['cpu_percent']:.0f}% of {sample.get('cpu_count') or '?'} cores")
    if sample.get("cpu_others"):
        parts.append("busy: " + ", ".join(f"{o['name']} {o['cpu_percent']:.0f}%" for o in sample["cpu_others"][:2]))
    for g in sample.get("gpus") or []:
        figures = [f"gpu{g['index']}"]
        if g.get("util_percent") is not None:
            figures.append(f"{g['util_percent']}%")
        if g.get("mem_used") is not None and g.get("mem_total"):
            figures.append(f"{g['mem_used'] / 1e9:.1f}/{g['mem_total'] / 1e9:.1f} GB")
        if g.get("power_w") is not None:
            figures.append(f"{g['power_w']:.0f} W")
        if g.get("temp_c") is not None:
            figures.append(f"{g['temp_c']} C")
        parts.append(" ".join(figures))
    return ", ".join(parts)


__all__ = ["TreeCpu", "OtherProcesses", "Gpus", "ContentionDetector", "visible_indices",
           "cpu_count", "summary"]

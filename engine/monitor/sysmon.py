"""The system sampler: what the supervisor records about memory, about once a second.

Note 003's LoRA run took 226 s/it instead of 40-80 with no error at all: unified memory was
swapping. Allocated bytes never showed it; swap traffic and the kernel's memory pressure do.
The supervisor samples (not the trainer), so a trainer stuck in a page fault is still watched.

One `SystemSampler(pid)` per trainer process; `sample()` returns the fields of a `memory`
event:
    rss             bytes resident in the trainer and its children, summed (a page shared by
                    forked DataLoader workers counts once per process, so this can overstate).
                    On macOS each process's physical footprint instead (what Activity Monitor
                    shows as "Memory"): RSS misses Metal/MPS allocations, the footprint counts
                    them (proc_pid_rusage's ri_phys_footprint); RSS for a process whose
                    footprint cannot be read.
    rss_kind        macOS only: "footprint" (every process counted by its footprint),
                    "footprint+rss" (some by RSS, their footprint unreadable) or "rss" (none
                    readable); absent: RSS (Linux and other platforms, as before)
    processes       how many processes that sum covers (0: the trainer is gone; rss is None)
    system_total    physical memory, bytes
    system_used     total - available: what cannot be handed out without reclaim or swap
                    (psutil's own `used` is computed differently per platform)
    system_available
    swap_total, swap_used
    swap_in_per_s, swap_out_per_s
                    bytes/s since the previous sample; None on the first sample and where
                    the OS keeps no counters. macOS counts page-ins/outs, file paging included.
    pressure        {"level": "normal"|"warn"|"critical"|None, "raw": the figure read
                     (PSI: some/full avg10 and avg60 in %; sysctl: 1, 2 or 4), "source":
                     "cgroup"|"psi"|"sysctl"|None, "detail": what was read, or why nothing
                     could be}
    cpu_percent, cpu_count, cpu_system_percent, cpu_others, cpu_others_percent, gpus
                    what the CPUs and GPUs do: see engine.monitor.hardware

A missing source is reported as unavailable (level, raw and source None), never guessed.
Nothing here spawns a process; per sample it reads a few small /proc files (Linux) or makes
one sysctl call (macOS), plus every few seconds one stat file per process on the machine
(for cpu_others) and, on a machine with NVIDIA's driver, a handful of NVML calls per GPU. Readers take `root` so tests run them against fixture trees.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Mapping, Protocol

import psutil

from engine.event_types import MemoryFields
from engine.monitor import hardware

LEVELS = ("normal", "warn", "critical")

# Linux PSI thresholds, on avg10: the share (%) of the last 10 s in which at least one task
# ("some") or every non-idle task at once ("full") was stalled on memory -- direct reclaim,
# swap-in, refaulting evicted pages. A healthy training run reads 0.00 (this VM does).
# - warn at some >= 10: a tenth of wall time lost waiting on memory is already a throughput
#   loss a user would notice, the stage at which macOS reports "warn" (compressor and swap
#   busy, nothing killed yet).
# - critical at full >= 10 or some >= 40: for a tenth of the time nothing ran at all, or
#   stalls dominate the run -- thrashing. Still well below the 60% over 30 s at which
#   systemd-oomd starts killing by default (oomd.conf(5)): we want to advise before that.
# avg10 rather than avg60: at a 1 Hz sampler it reacts within seconds, where avg60 trails a
# swap storm by a minute; the slowdown detector supplies the "sustained" part.
PSI_WARN_SOME = 10.0
PSI_CRITICAL_SOME = 40.0
PSI_CRITICAL_FULL = 10.0

# xnu bsd/kern/kern_memorystatus_notify.c: kVMPressureNormal/Warning/Critical.
SYSCTL_PRESSURE = "kern.memorystatus_vm_pressure_level"
SYSCTL_LEVELS = {1: "normal", 2: "warn", 4: "critical"}

CHILDREN_EVERY_S = 5.0


def _pressure(level=None, raw=None, source=None, detail="") -> dict:
    return {"level": level, "raw": raw, "source": source, "detail": detail}


# ---------------------------------------------------------------- Linux PSI


def parse_psi(text: str) -> dict[str, dict[str, float]]:
    """`some avg10=.. avg60=.. avg300=.. total=..` (and `full ...`) -> {"some": {...}, ...}.

    total is cumulative stall time in microseconds. Raises ValueError on anything else."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        kind, *pairs = line.split() or [""]
        if kind not in ("some", "full"):
            continue
        values: dict[str, float] = {}
        for pair in pairs:
            key, eq, value = pair.partition("=")
            if not eq:
                raise ValueError(f"PSI line {line!r}: {pair!r} is not key=value")
            values[key] = int(value) if key == "total" else float(value)
        out[kind] = values
    if "avg10" not in out.get("some", {}):
        raise ValueError(f"no 'some avg10=' line in PSI text {text[:120]!r}")
    return out


def psi_level(psi: dict[str, dict[str, float]]) -> str:
    some = psi["some"]["avg10"]
    full = psi.get("full", {}).get("avg10", 0.0)  # memory PSI always has it; be lenient
    if full >= PSI_CRITICAL_FULL or some >= PSI_CRITICAL_SOME:
        return "critical"
    if some >= PSI_WARN_SOME:
        return "warn"
    return "normal"


class PressureSource(Protocol):
    @property
    def source(self) -> str | None: ...   # read-only here: a source says what it is

    def read(self) -> dict: ...


class PsiFile:
    """A PSI file read whole each sample (two short lines; reopening also survives a cgroup
    that is removed and recreated, where a kept descriptor would read ENODEV forever)."""

    def __init__(self, path: Path, source: str, detail: str):
        self.path, self.source, self.detail = Path(path), source, detail

    def read(self) -> dict:
        try:
            psi = parse_psi(self.path.read_text())
        except (OSError, ValueError) as e:
            # e.g. EOPNOTSUPP: the file exists but the kernel was booted with psi=0.
            return _pressure(detail=f"cannot read {self.path}: {getattr(e, 'strerror', None) or e}")
        # The raw figure keeps what the level came from plus the minute average (a
        # memory event is written every second: the full four-number lines would bloat it).
        raw = {f"{kind}_{avg}": psi[kind][avg] for kind in ("some", "full") if kind in psi
               for avg in ("avg10", "avg60")}
        return _pressure(psi_level(psi), raw, self.source, self.detail)


def _unescape_mount(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup2_mounts(root: Path) -> list[tuple[str, str]]:
    """(mount root, mount point) of every cgroup2 mount in /proc/self/mountinfo."""
    try:
        text = (root / "proc/self/mountinfo").read_text()
    except OSError:
        return []
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and right.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            mounts.append((_unescape_mount(fields[3]), _unescape_mount(fields[4])))
    return mounts


def cgroup2_path(pid: int | str, root: Path) -> str | None:
    """The process's cgroup v2 path (the `0::/path` line of /proc/PID/cgroup), or None."""
    try:
        text = (root / f"proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            return line[3:] or "/"
    return None


def cgroup_pressure_file(pid: int | str, root: Path) -> Path | None:
    """The memory.pressure file of the process's cgroup v2, where one exists.

    The cgroup2 mount may sit at /sys/fs/cgroup (unified), /sys/fs/cgroup/unified (hybrid,
    as on this VM) or elsewhere, and may mount a subtree: hence mountinfo, not a fixed path."""
    path = cgroup2_path(pid, root)
    if path is None:
        return None
    for mount_root, mount_point in cgroup2_mounts(root):
        if mount_root != "/" and not (path == mount_root or path.startswith(mount_root + "/")):
            continue
        rel = path[len(mount_root):] if mount_root != "/" else path
        candidate = root / mount_point.lstrip("/") / rel.lstrip("/") / "memory.pressure"
        if candidate.is_file():
            return candidate
    return None


# ---------------------------------------------------------------- macOS sysctl


@functools.cache
def _sysctlbyname():
    """libc's sysctlbyname, loaded once per process."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.dylib", use_errno=True)
    fn = libc.sysctlbyname
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                   ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def sysctl_int(name: str, fn=None) -> int | None:
    """An int sysctl by name (no sudo, no subprocess), or None where it does not exist.

    `fn` is the C function; tests hand in a ctypes callback to run this on Linux."""
    if fn is None:
        try:
            fn = _sysctlbyname()
        except (OSError, AttributeError):  # not a BSD libc: no sysctlbyname
            return None
    value = ctypes.c_int(0)
    size = ctypes.c_size_t(ctypes.sizeof(value))
    if fn(name.encode(), ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return None
    if size.value != ctypes.sizeof(value):
        return None  # not an int-sized value: refuse to interpret it
    return value.value


class SysctlPressure:
    """macOS `kern.memorystatus_vm_pressure_level`: 1 normal, 2 warn, 4 critical."""

    source = "sysctl"

    def __init__(self, reader: Callable[[str], int | None] = sysctl_int):
        self.reader = reader

    def read(self) -> dict:
        raw = self.reader(SYSCTL_PRESSURE)
        if raw is None:
            return _pressure(detail=f"sysctl {SYSCTL_PRESSURE} could not be read")
        # A value xnu does not document keeps its raw figure but gets no invented level.
        return _pressure(SYSCTL_LEVELS.get(raw), raw, self.source, SYSCTL_PRESSURE)


# ---------------------------------------------------------------- macOS physical footprint

# <sys/resource.h>: proc_pid_rusage's flavours; V2 is the oldest with ri_phys_footprint (10.9+)
RUSAGE_INFO_V2 = 2


class RusageInfoV2(ctypes.Structure):
    """struct rusage_info_v2 from xnu's <sys/resource.h>, field for field (the call writes the
    whole struct: a short one would be overrun)."""

    _fields_ = [
        ("ri_uuid", ctypes.c_uint8 * 16),
        ("ri_user_time", ctypes.c_uint64),
        ("ri_system_time", ctypes.c_uint64),
        ("ri_pkg_idle_wkups", ctypes.c_uint64),
        ("ri_interrupt_wkups", ctypes.c_uint64),
        ("ri_pageins", ctypes.c_uint64),
        ("ri_wired_size", ctypes.c_uint64),
        ("ri_resident_size", ctypes.c_uint64),
        ("ri_phys_footprint", ctypes.c_uint64),
        ("ri_proc_start_abstime", ctypes.c_uint64),
        ("ri_proc_exit_abstime", ctypes.c_uint64),
        ("ri_child_user_time", ctypes.c_uint64),
        ("ri_child_system_time", ctypes.c_uint64),
        ("ri_child_pkg_idle_wkups", ctypes.c_uint64),
        ("ri_child_interrupt_wkups", ctypes.c_uint64),
        ("ri_child_pageins", ctypes.c_uint64),
        ("ri_child_elapsed_abstime", ctypes.c_uint64),
        ("ri_diskio_bytesread", ctypes.c_uint64),
        ("ri_diskio_byteswritten", ctypes.c_uint64),
    ]


@functools.cache
def _proc_pid_rusage():
    """libproc's `int proc_pid_rusage(int pid, int flavor, rusage_info_t *buffer)`, loaded once
    (libproc is part of libSystem on macOS; find_library finds it by either name)."""
    path = ctypes.util.find_library("proc") or ctypes.util.find_library("System")
    if path is None:
        raise OSError("no libproc or libSystem: not macOS")
    fn = ctypes.CDLL(path, use_errno=True).proc_pid_rusage
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def phys_footprint(pid: int, fn=None) -> int | None:
    """A process's physical footprint in bytes (Activity Monitor's "Memory"), or None where
    it cannot be read (another user's process, one that exited, not macOS).

    `fn` is the C function; tests hand in a ctypes callback to run this on Linux."""
    if fn is None:
        try:
            fn = _proc_pid_rusage()
        except (OSError, AttributeError):
            return None
    info = RusageInfoV2()
    if fn(pid, RUSAGE_INFO_V2, ctypes.byref(info)) != 0:
        return None
    return int(info.ri_phys_footprint)


class NoPressure:
    source = None

    def __init__(self, why: str):
        self.why = why

    def read(self) -> dict:
        return _pressure(detail=self.why)


def pressure_source(pid: int, *, root: Path | str = "/", platform: str = sys.platform,
                    sysctl: Callable[[str], int | None] = sysctl_int) -> PressureSource:
    """The best memory-pressure source for this process, checked once by reading it.

    Linux: the trainer's cgroup v2 memory.pressure first, then /proc/pressure/memory. The
    cgroup's figure is about the trainer's own group: system-wide "some" also counts other
    tenants' stalls (a neighbour thrashing is not our slowdown), and system-wide "full" needs
    every task on the machine stalled at once, which a busy host never shows even while the
    trainer's group, pinned at its memory.max, does nothing but reclaim. For the root cgroup
    the kernel serves the same figures as /proc/pressure/memory, so nothing is lost."""
    root = Path(root)
    if platform == "darwin":
        source = SysctlPressure(sysctl)
        first = source.read()
        return source if first["source"] else NoPressure(first["detail"])
    if platform.startswith("linux"):
        candidates = []
        if (cgroup_file := cgroup_pressure_file(pid, root)) is not None:
            rel = cgroup2_path(pid, root)
            candidates.append(PsiFile(cgroup_file, "cgroup", f"{cgroup_file} (cgroup {rel})"))
        system = root / "proc/pressure/memory"
        if system.is_file():
            candidates.append(PsiFile(system, "psi", str(system)))
        tried = []
        for candidate in candidates:
            first = candidate.read()
            if first["source"]:
                return candidate
            tried.append(first["detail"])
        return NoPressure("; ".join(tried) or "no /proc/pressure/memory (kernel before 4.20 or "
                          "CONFIG_PSI off) and no cgroup v2 memory.pressure for the trainer")
    return NoPressure(f"no memory-pressure source on {platform}")


# ---------------------------------------------------------------- the sampler


def _swap_counters_work(swap_reader) -> bool:
    """psutil sets sin/sout to 0 with a RuntimeWarning when /proc/vmstat is missing, and they
    are always 0 on Windows: a rate from those would be an invented zero. Checked once, at
    construction (catch_warnings is process-wide, so not on every sample from a thread)."""
    if sys.platform == "win32":
        return False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        swap_reader()
    return not any("sin" in str(w.message) for w in caught)


class SystemSampler:
    """Samples one trainer process and the system it runs on; see the module docstring."""

    def __init__(self, pid: int, *, root: Path | str = "/", platform: str = sys.platform,
                 pressure: PressureSource | None = None,
                 swap_reader: Callable = psutil.swap_memory,
                 memory_reader: Callable = psutil.virtual_memory,
                 clock: Callable[[], float] = time.monotonic,
                 children_every_s: float = CHILDREN_EVERY_S,
                 others: hardware.OtherProcesses | None = None,
                 gpus: hardware.Gpus | None = None,
                 env: Mapping[str, str] | None = None,
                 footprint: Callable[[int], int | None] | None = None):
        """`env`: the trainer's environment (its launch env, whose CUDA_VISIBLE_DEVICES may
        differ from ours); None: ours. `footprint`: a process's physical footprint by pid
        (None where unreadable), used in place of RSS; None: phys_footprint on macOS, RSS
        elsewhere."""
        self.pid = pid
        if footprint is None and platform == "darwin":
            footprint = phys_footprint
        self._footprint = footprint
        self.pressure = pressure or pressure_source(pid, root=root, platform=platform)
        self._swap_reader, self._memory_reader, self._clock = swap_reader, memory_reader, clock
        self._swap_counters = _swap_counters_work(swap_reader)
        self._last_swap: tuple[float, int, int] | None = None
        try:
            self._proc: psutil.Process | None = psutil.Process(pid)
        except psutil.NoSuchProcess:
            self._proc = None
        # Listing children walks every process on the machine (~2 ms with 75 of them here),
        # so the list is refreshed every few seconds; each sample reads only their RSS.
        self._children_every_s = children_every_s
        self._children: list[psutil.Process] = []
        self._children_at: float | None = None
        self._tree_cpu = hardware.TreeCpu()
        self._cpu_count = hardware.cpu_count(self._proc)
        self._others = others or hardware.OtherProcesses()
        if gpus is None:
            gpus = hardware.Gpus((os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES"))
        self._gpus = gpus

    def sample(self) -> MemoryFields:
        vm = self._memory_reader()
        swap = self._swap_reader()
        swap_in, swap_out = self._swap_rates(swap)
        rss, processes, rss_kind = self._rss()
        now = self._clock()
        tree = (self._proc, *self._children) if processes else ()
        cpu = self._tree_cpu.percent(tree, now)
        if self._others.due(now):
            self._others.scan(now, exclude={os.getpid(), self.pid, *(p.pid for p in self._children)})
        gpus = self._gpus.read()
        sample: MemoryFields = {
            "rss": rss, "processes": processes,
            "system_total": vm.total, "system_used": vm.total - vm.available,
            "system_available": vm.available,
            "swap_total": swap.total, "swap_used": swap.used,
            "swap_in_per_s": swap_in, "swap_out_per_s": swap_out,
            "pressure": self.pressure.read(),
            "cpu_percent": cpu, "cpu_count": self._cpu_count,
            "cpu_system_percent": self._others.system_percent,
            "cpu_others": self._others.others, "cpu_others_percent": self._others.others_percent,
            "gpus": gpus,
        }
        if rss_kind is not None:  # macOS: say which measure `rss` is (absent, as before: RSS)
            sample["rss_kind"] = rss_kind
        if not gpus and self._gpus.why_not:
            # why there are no GPU figures (NVML missing or failing, a MIG slice), for the panel;
            # absent where there are figures, to keep the second's event small
            sample["gpus_why_not"] = self._gpus.why_not
        return sample

    def _swap_rates(self, swap) -> tuple[float | None, float | None]:
        if not self._swap_counters:
            return None, None
        now = self._clock()
        last, self._last_swap = self._last_swap, (now, swap.sin, swap.sout)
        if last is None:
            return None, None
        dt = now - last[0]
        d_in, d_out = swap.sin - last[1], swap.sout - last[2]
        if dt <= 0 or d_in < 0 or d_out < 0:  # a clock or counter that went back: no figure
            return None, None
        return round(d_in / dt, 1), round(d_out / dt, 1)

    def _rss(self) -> tuple[int | None, int, str | None]:
        """(bytes summed over the tree, processes counted, what they measure: see _kind)."""
        if self._proc is None:
            return None, 0, self._kind(0, 0)
        now = self._clock()
        if self._children_at is None or now - self._children_at >= self._children_every_s:
            self._children_at = now
            try:
                self._children = self._proc.children(recursive=True)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                self._children = []
        total, processes, footprints = 0, 0, 0
        for proc in (self._proc, *self._children):
            try:
                rss = proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue  # a child that exited between listing and reading (ZombieProcess too)
            if rss == 0:
                continue  # exited, not yet reaped: a zombie holds no memory and is not running
            if self._footprint is not None and (footprint := self._footprint(proc.pid)) is not None:
                rss, footprints = footprint, footprints + 1
            total += rss
            processes += 1
        return (total if processes else None), processes, self._kind(processes, footprints)

    def _kind(self, processes: int, footprints: int) -> str | None:
        """None where RSS is the only measure (Linux); else which of them the sum holds."""
        if self._footprint is None:
            return None
        if footprints == 0:
            return "rss"   # not one footprint could be read: RSS throughout, said so
        return "footprint" if footprints == processes else "footprint+rss"


def summary(sample: dict) -> str:
    """One line for logs and the headless front end: 'rss 1.2 GB, ..., pressure warn (psi)'."""
    def gb(n):
        return "?" if n is None else f"{n / 1e9:.1f} GB"

    def rate(n):
        return "n/a" if n is None else f"{n / 1e6:.1f} MB/s"

    p = sample["pressure"]
    level = f"{p['level'] or p['raw']} ({p['source']})" if p["source"] else "unavailable"
    return (f"{sample.get('rss_kind') or 'rss'} {gb(sample['rss'])}, system {gb(sample['system_used'])} of "
            f"{gb(sample['system_total'])}, swap {gb(sample['swap_used'])} "
            f"(in {rate(sample['swap_in_per_s'])}, out {rate(sample['swap_out_per_s'])}), "
            f"pressure {level}")

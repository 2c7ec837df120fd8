"""Threads that fit the machine: torch's intra-op threads lowered while other processes take the
cores a CPU run needs, and raised again when the cores are free.

Why: the intra-op threads of an op meet at a barrier when it ends, so one thread that the
kernel took off its core holds up all the others. On the 2-core machine a matmul run with 2
threads beside two busy processes trained at 178 samples/s, with 1 thread at 735 (issue 40):
more threads than free cores collapse. The supervisor sees contention from outside (the
cpu-contention warning, engine.monitor.hardware) but cannot act on it; the trainer can, so it
decides: torch.set_num_threads is safe between ops, and the trainer calls `Adapter.tick`
between micro-batches (engine.train.trainer's after_micro_batch), not only at its reports: one
step of the `cpu` preset is 64 micro-batches, seconds long while oversubscribed. The probe and
the batch finder train with the trainer's own step, so they follow the same rule.

A reading (`CpuReader`), every READ_EVERY_S: the CPU time of the cores the process may run on
(psutil's per-CPU times, of its affinity's cores) against its own (time.process_time: all of
its threads). The rest ran other processes: the process's children too (a DataLoader worker,
a compile worker), since they take a core as any neighbour does. About 50 us a reading.

What the others need (`Load.others_need`) is more than what they got when the machine was
saturated: then every runnable thread gets about the same share, and the run's threads
squeezed theirs as theirs squeezed the run's. A thread of the run got own/threads of a core;
at that share, the others' use is others / (own/threads) threads' worth of demand. With idle
time left nobody waited, and what they used is what they need.

The rule (`ThreadRule`, fed readings, no clock): the cores left are the cores less the others'
need. Lower to round(left) once it has been below the thread count for LOWER_AFTER readings in
a row; raise to floor(left + RAISE_SLACK) once that has been above it for RAISE_AFTER readings.
The band between the two keeps a neighbour using half a core from flipping the count every few
seconds. Never above the ceiling (the preset's threads, or torch's default where it sets none),
never below 1. Each change is a `threads` event.

On CUDA and MPS the host's threads are not the compute: nothing is adapted there, nor where the
preset turns it off (adapt_threads = false). Under DDP on the CPU each rank fits its own count:
the other ranks are other processes to it, and take cores as any do. A CPU quota (a container's
cgroup cpu.max) is not seen: the cores are the affinity's, the others' time the host's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import psutil
import torch

from engine.emit import Emit
from engine.monitor.hardware import busy_and_total, cpu_count
from engine.preset_types import DevicePreset

# Quick to lower, slow to raise: threads beyond the free cores cost a run 4x (issue 40's 178
# against 735 samples/s) and up to 30x here under a loaded test suite, while one thread too few
# for a few seconds costs at most what that thread would have added.
READ_EVERY_S = 0.25     # a reading's length: 25 of /proc/stat's 10 ms ticks per core
LOWER_AFTER = 2         # readings in a row that say too many threads: half a second
RAISE_AFTER = 20        # readings in a row that say the cores are free: five seconds
RAISE_SLACK = 0.25      # a quarter of a core of daemons and shells does not keep a core taken
# The machine counts as saturated (the others squeezed by the run's threads) below this share of
# its cores idle.
SATURATED_IDLE = 0.1


@dataclass(frozen=True)
class Load:
    """One reading: cores' worth of CPU (1.0 = one core busy throughout) over its time."""

    cores: int          # the cores the process may run on
    others: float       # used by other processes on them
    own: float          # used by this process, every thread of it
    threads: int        # torch's intra-op threads over the reading

    @property
    def idle(self) -> float:
        return max(0.0, self.cores - self.others - self.own)

    @property
    def others_need(self) -> float:
        """What the others would use were the run's threads not squeezing them (see above)."""
        if self.idle >= SATURATED_IDLE * self.cores or self.own <= 0.0:
            return self.others
        return max(self.others, self.others * self.threads / self.own)


class ThreadRule:
    """The thread count the readings call for, with hysteresis: `feed` each reading; it returns
    the new count when one is due, else None. Starts at the ceiling."""

    def __init__(self, ceiling: int, *, lower_after: int = LOWER_AFTER, raise_after: int = RAISE_AFTER):
        self.ceiling = max(1, ceiling)
        self.threads = self.ceiling
        self.lower_after, self.raise_after = lower_after, raise_after
        self._side = 0                  # -1: readings in a row below the count, +1: above it
        self._fits: list[int] = []      # what each of them called for

    def _clamp(self, n: int) -> int:
        return min(self.ceiling, max(1, n))

    def feed(self, load: Load) -> int | None:
        left = load.cores - load.others_need
        down, up = self._clamp(math.floor(left + 0.5)), self._clamp(math.floor(left + RAISE_SLACK))
        if down < self.threads:
            side, fit = -1, down
        elif up > self.threads:
            side, fit = 1, up
        else:
            self._side, self._fits = 0, []
            return None
        if side != self._side:
            self._side, self._fits = side, []
        self._fits.append(fit)
        if len(self._fits) < (self.lower_after if side < 0 else self.raise_after):
            return None
        # The mildest change the run of readings agrees on: lowered no further, raised no
        # higher, than every one of them asked.
        self.threads = max(self._fits) if side < 0 else min(self._fits)
        self._side, self._fits = 0, []
        return self.threads


class CpuReader:
    """CPU used on the process's cores by it and by everything else, between calls."""

    def __init__(self, cores: list[int] | None = None, *,
                 per_cpu: Callable[[], list] = lambda: psutil.cpu_times(percpu=True),
                 own: Callable[[], float] = time.process_time):
        if cores is None:
            me = psutil.Process()
            cores = me.cpu_affinity() if hasattr(me, "cpu_affinity") else []
        # macOS has no affinity: every core
        self.cores = cores or list(range(cpu_count(None)))
        self._per_cpu, self._own = per_cpu, own
        self._last: tuple[float, float, float] | None = None   # busy, total, own seconds

    def restart(self) -> None:
        """The next reading starts at the next call (after a change of the thread count)."""
        self._last = None

    def read(self, threads: int) -> Load | None:
        """The load since the last call (None on the first), `threads` torch's count over it."""
        times = self._per_cpu()
        busy = total = 0.0
        for core in self.cores:
            if core < len(times):
                b, t = busy_and_total(times[core])
                busy, total = busy + b, total + t
        own = self._own()
        last, self._last = self._last, (busy, total, own)
        if last is None or total <= last[1]:
            return None
        wall = (total - last[1]) / len(self.cores)   # seconds, by the kernel's own count
        used, mine = (busy - last[0]) / wall, max(0.0, own - last[2]) / wall
        # Our threads' seconds and the kernel's ticks are counted apart: a rounding may put a
        # little more on us than the cores gave; the others used none of it then.
        return Load(cores=len(self.cores), others=round(max(0.0, used - mine), 3),
                    own=round(mine, 3), threads=threads)


class Adapter:
    """The trainer's: reads the load every `every_s` (from `tick`), feeds the rule and sets
    torch's thread count when it calls for another, saying so with a `threads` event."""

    def __init__(self, ceiling: int, emit: Emit, *, reader: CpuReader | None = None,
                 rule: ThreadRule | None = None, every_s: float = READ_EVERY_S):
        self.rule = rule or ThreadRule(ceiling)
        self.reader = reader or CpuReader()
        self.emit, self.every_s = emit, every_s
        # The first reading runs from here: from the trainer's start-up to its first micro-batch,
        # which can be seconds at too many threads beside busy processes.
        self.reader.read(self.rule.threads)
        self._at: float | None = None

    @classmethod
    def for_run(cls, preset: DevicePreset, device: torch.device, emit: Emit) -> "Adapter | None":
        """The run's adapter, on the CPU where the preset lets it adapt; else None. The ceiling
        is torch's count as the preset set it (its default where threads = 0)."""
        if device.type != "cpu" or not preset.adapt_threads:
            return None
        return cls(torch.get_num_threads(), emit)

    @property
    def threads(self) -> int:
        return self.rule.threads

    def tick(self, now: float, step: int) -> None:
        """Between ops: read the load if a reading is due, and change the thread count if the
        rule says so. The first call after a change only starts the next reading."""
        if self._at is not None and now - self._at < self.every_s:
            return
        self._at = now
        was = self.rule.threads
        load = self.reader.read(was)
        if load is None:
            return
        new = self.rule.feed(load)
        if new is None:
            return
        torch.set_num_threads(new)
        self.reader.restart()   # the next reading at the new count only
        self._at = None
        self.emit("threads", threads=new, was=was, ceiling=self.rule.ceiling, step=step,
                  cores=load.cores, others=round(load.others, 2),
                  others_need=round(load.others_need, 2),
                  reason="contention" if new < was else "free")

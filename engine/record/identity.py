"""A process by identity: its pid and its start time.

A pid alone names whatever process holds that number now: after a supervisor dies, the kernel
hands its pid to the next process that starts, and a bare `kill(pid, 0)` then calls a stranger
alive (and `runs stop` would signal it). The start time, read from the kernel through psutil
(macOS and Linux alike), tells the same process from a later one with the same pid.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

# psutil reports start times to the clock tick (10 ms on Linux) and computes them from the boot
# time, which can be re-read slightly differently: equal within this much is the same process.
_SAME_START_S = 0.05


@dataclass(frozen=True)
class ProcessId:
    pid: int
    start: float   # psutil's create_time(): seconds since the epoch

    @classmethod
    def of(cls, pid: int) -> "ProcessId | None":
        """The process now holding `pid`, or None if there is none."""
        try:
            return cls(pid, psutil.Process(pid).create_time())
        except (psutil.Error, ValueError):
            return None

    @classmethod
    def parse(cls, text: str) -> "ProcessId | None":
        """'PID START' as `str()` writes it; None for anything else (an old file with a bare pid
        cannot be told from a stranger, so it is not trusted)."""
        try:
            pid, start = text.split()
            return cls(int(pid), float(start))
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"{self.pid} {self.start:.3f}"

    def alive(self) -> bool:
        """This very process is still running (a zombie waiting to be reaped is not)."""
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.start) < _SAME_START_S and \
                proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

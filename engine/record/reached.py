"""How far an attempt got, published every optimizer step and readable after a SIGKILL.

Step events come at the reporting interval (half a second), so a crash between two of them
would be counted from the last report: `native-crash@600` told as "died after step 587", the
steps trained again undercounted. So the attempt also publishes each optimizer step, and the
samples seen by then, in a 16-byte file of the run directory mapped into its memory:

    attempt-N.reached    two little-endian int64: the step reached (-1: none yet), the samples
                         seen (-1: not known)

A store into a shared mapping costs what a store into memory does (no system call, no device
sync), and it is the page cache's once made: the kernel keeps it when the process dies of any
signal. The supervisor reads the file every poll and once more when the attempt is gone; the
lifeline reads it when it ends an attempt whose supervisor died.

Written by the built-in trainer (engine.train) and, in a user's command, by cockpit.report and
the framework callbacks, which find the file in COCKPIT_REACHED. Stdlib only: a user's script
loads it.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

ENV = "COCKPIT_REACHED"
_FORMAT = struct.Struct("<qq")


def path_of(run_path: Path, attempt: int) -> Path:
    return Path(run_path) / f"attempt-{attempt}.reached"


class Publisher:
    """The attempt's end: `publish` after each optimizer step. A file that cannot be made or
    mapped leaves the publisher quiet: training never stops for it."""

    def __init__(self, path: str | os.PathLike):
        self._map: mmap.mmap | None = None
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                if os.fstat(fd).st_size < _FORMAT.size:
                    # Nothing published: step -1, written with the file's size in one write.
                    # Zeros would read as step 0 reached, a step done before data and model
                    # are built, and the supervisor would end start-up's allowance there.
                    os.pwrite(fd, _FORMAT.pack(-1, -1), 0)
                self._map = mmap.mmap(fd, _FORMAT.size)
            finally:
                os.close(fd)  # the mapping keeps the file
        except (OSError, ValueError):
            self._map = None

    def publish(self, step: int, samples: int | None = None) -> None:
        if self._map is not None:
            _FORMAT.pack_into(self._map, 0, step, -1 if samples is None else samples)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


class Reader:
    """The supervisor's end: `read` as often as it likes, before the file exists too."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> tuple[int, int | None] | None:
        """(step, samples seen or None) as last published; None before the first."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            data = os.pread(fd, _FORMAT.size, 0)
            for _ in range(3):  # a publish may land mid-read: read until two reads agree
                again = os.pread(fd, _FORMAT.size, 0)
                if again == data:
                    break
                data = again
            else:
                return None
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(data) != _FORMAT.size:
            return None
        step, samples = _FORMAT.unpack(data)
        return None if step < 0 else (step, samples if samples >= 0 else None)

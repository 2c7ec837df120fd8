"""Checkpoints off the training path: the state copied to host memory, written by a thread.

At a checkpoint the trainer copies its state (model, optimizer, scaler and scheduler state, RNG
states, the rest) to host memory (`HostCopy`) and hands it to a `Writer`, whose thread does the
atomic save (engine.record.checkpoint.save: temp file, fsync, rename, then the last K kept)
while the loop trains on. Never two writes in flight: a checkpoint due while the last one is
still being written waits for it first. A write is told (`Written`) only once its file is
complete on disk, from the trainer's thread: when it next looks (`poll`) or when it waits.

The loop's stall is the copy (and any wait): on a GPU the copy goes into pinned host buffers,
queued behind the step's kernels on the same stream (the next step's updates queue behind it,
so it reads this step's weights) and waited for by the writer's thread, not the loop. The host
buffers are kept from one checkpoint to the next (never two in flight: the last write is done
before they are filled again), so a checkpoint allocates, and pins, no memory after the first.

A process killed mid-write leaves the write's temp file, which checkpoint_files does not list:
the previous checkpoint, never pruned before the new one is in place, stays the newest.

BACKGROUND = False writes synchronously, in the loop, from the live state (no copy): what every
checkpoint cost before, for benchmarks/checkpoint_stall.py to compare.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.record import checkpoint

BACKGROUND = True  # False: write in the training loop, as before (for comparison)


@dataclass(frozen=True, slots=True)
class Written:
    """A checkpoint complete on disk."""

    path: Path
    step: int
    samples_seen: int
    stall_s: float     # what the training loop paid: the copy to the host, and any wait
    wait_s: float      # of which waiting for a write: the one before it, or this one at the end
    write_s: float     # the write's own time (in the writer's thread when in the background)


class HostCopy:
    """Copies a state (nested dicts, lists and tuples of tensors and plain values) to host
    memory, into buffers kept for the next copy of a state of the same shapes."""

    def __init__(self) -> None:
        self._buffers: list[tuple[torch.Tensor, bool]] = []  # each tensor's, and whether pinned
        self._pending: torch.cuda.Event | None = None  # the copies queued on a GPU
        self._next = 0                                 # a copy's position in the buffers
        self._memo: dict[int, torch.Tensor] = {}       # a copy's tensors so far, by id
        self._queued = False                           # a copy queued on a GPU
        self._pin = True                               # until pinned memory is refused

    def copy(self, state: Any) -> Any:
        """A host copy of `state`; call `ready()` (any thread) before reading its tensors. The
        buffers of the previous copy are reused: it must no longer be read."""
        self._next, self._memo = 0, {}   # position in the buffers; tensors seen (tied weights)
        self._queued = False
        try:
            copied = self._copy(state)
        finally:
            self._memo = {}
        if self._queued:
            self._pending = torch.cuda.Event()
            self._pending.record()   # on the current stream, behind the copies
        del self._buffers[self._next:]   # a smaller state than last time: let the rest go
        return copied

    def ready(self) -> None:
        """Block until the copies queued on a GPU are done (the writer calls it)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.synchronize()

    def _copy(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, dict):
            items = [(k, self._copy(v)) for k, v in value.items()]
            out = OrderedDict(items) if isinstance(value, OrderedDict) else dict(items)
            if hasattr(value, "_metadata"):   # a module's state_dict: its versions, for loading
                out._metadata = copy.deepcopy(value._metadata)  # type: ignore[attr-defined]
            return out
        if isinstance(value, list):
            return [self._copy(v) for v in value]
        if isinstance(value, tuple):
            items = [self._copy(v) for v in value]
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            return value
        return copy.deepcopy(value)   # anything else a state holds (small): a copy of its own

    def _tensor(self, t: torch.Tensor) -> torch.Tensor:
        key = id(t)
        seen = self._memo.get(key)
        if seen is not None:
            return seen   # the same tensor twice (tied weights) stays one tensor
        t = t.detach()
        gpu = t.device.type == "cuda"
        kept = self._buffers[self._next] if self._next < len(self._buffers) else None
        if kept is None or kept[0].shape != t.shape or kept[0].dtype != t.dtype \
                or (gpu and self._pin and not kept[1]):
            kept = self._host_buffer(t, pin=gpu and self._pin)
            if self._next < len(self._buffers):
                self._buffers[self._next] = kept
            else:
                self._buffers.append(kept)
        self._next += 1
        buffer, pinned = kept
        # A GPU's copy is queued (pinned memory); any other device's is done when this returns.
        queued = gpu and pinned
        buffer.copy_(t, non_blocking=queued)
        self._queued |= queued
        self._memo[key] = buffer
        return buffer

    def _host_buffer(self, t: torch.Tensor, pin: bool) -> tuple[torch.Tensor, bool]:
        if pin:
            try:
                return torch.empty(t.shape, dtype=t.dtype, pin_memory=True), True
            except RuntimeError:
                self._pin = False   # no pinned memory to be had: pageable from now on, copied synchronously
        return torch.empty(t.shape, dtype=t.dtype), False


class Writer:
    """Writes checkpoints to a directory, in the background or (BACKGROUND False, or
    background=False) in the caller's thread; at most one write in flight."""

    def __init__(self, directory: Path, keep: int, background: bool | None = None,
                 keep_before: int = 0):
        """`keep_before`: also keep the newest checkpoint at least that many steps older than
        the newest (engine.record.checkpoint.save): a rewind's target."""
        self.directory, self.keep, self.keep_before = directory, keep, keep_before
        self.background = BACKGROUND if background is None else background
        self._host = HostCopy()
        self._thread: threading.Thread | None = None
        self._job: dict[str, Any] = {}   # the write in flight: its step, stall, result

    @property
    def in_flight(self) -> bool:
        return self._thread is not None

    def save(self, state: dict, stall_from: float | None = None) -> list[Written]:
        """Checkpoint `state` (its tensors where training holds them); `stall_from`: when the
        loop stopped training for it (time.monotonic(); now if None), the start of its stall.
        Returns the writes complete by now, oldest first. Synchronously: this one, written.
        In the background: the one before it, if it was in flight (waited for: never two in
        flight); this one's write is started on a host copy and told later, by `poll` or
        `wait`."""
        started = time.monotonic()
        stall_from = started if stall_from is None else stall_from
        if not self.background:
            path = checkpoint.save(self.directory, state, keep=self.keep, keep_before=self.keep_before)
            done = time.monotonic()
            return [Written(path, int(state["step"]), int(state["samples_seen"]), done - stall_from,
                            0.0, done - started)]
        before = self._join()   # the host buffers are free again after it
        waited = time.monotonic() - started
        host = self._host.copy(state)
        job = self._job = {"step": int(state["step"]), "samples_seen": int(state["samples_seen"]),
                           "stall_s": time.monotonic() - stall_from, "wait_s": waited}
        self._thread = threading.Thread(target=self._write, args=(host, job), daemon=True,
                                        name=f"checkpoint-{job['step']}")
        self._thread.start()
        return [before] if before is not None else []

    def poll(self) -> Written | None:
        """The write in flight, if it has finished (its error raised here, if it failed)."""
        if self._thread is None or self._thread.is_alive():
            return None
        return self._collect()

    def wait(self) -> Written | None:
        """Wait for the write in flight, if any: it, once complete (its error raised here), the
        wait counted in its stall and its wait_s (the loop paid it: an attempt's end)."""
        started = time.monotonic()
        written = self._join()
        if written is None:
            return None
        waited = time.monotonic() - started
        return dataclasses.replace(written, stall_s=written.stall_s + waited, wait_s=written.wait_s + waited)

    def _join(self) -> Written | None:
        if self._thread is None:
            return None
        self._thread.join()
        return self._collect()

    def _collect(self) -> Written:
        job, self._thread, self._job = self._job, None, {}
        if "error" in job:
            raise job["error"]
        return Written(job["path"], job["step"], job["samples_seen"], job["stall_s"], job["wait_s"],
                       job["write_s"])

    def _write(self, host: dict, job: dict) -> None:
        """The writer's thread: the state is its own (a host copy), the loop trains on."""
        started = time.monotonic()
        try:
            self._host.ready()
            job["path"] = checkpoint.save(self.directory, host, keep=self.keep, keep_before=self.keep_before)
        except BaseException as e:   # raised in the trainer's thread when it collects the write
            job["error"] = e
        job["write_s"] = time.monotonic() - started


"""An attempt's health as the supervisor sees it from outside: memory, slowdown, contention.

Sampled about once a second from the supervisor's loop, so it goes on when the attempt is stuck:
the RSS of its process tree, system memory, swap and pressure (engine.monitor.sysmon), each
sample a `memory` event. The slowdown detector (engine.run.slowdown) reads those samples and the
attempt's step rate, and warns, or asks for a fallback where the preset says so; the contention
detector (engine.monitor.hardware) warns when other processes keep the machine saturated. How
full memory was just before a SIGKILL also tells the kernel's OOM killer from a user's kill -9
(engine.run.watch.judge).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Mapping

from engine.monitor.hardware import ContentionDetector
from engine.monitor.sysmon import SystemSampler
from engine.preset_types import DevicePreset, WorkloadPreset
from engine.event_types import MemoryFields, WarningFields
from engine.run.slowdown import Context, SlowdownDetector

MEMORY_EVERY_S = 1.0
SLOWDOWN_SETTINGS: dict = {}  # SlowdownDetector keyword overrides (tests shorten its windows)


class AttemptHealth:
    """One attempt's samples and detectors: the process `pid` leads, with its `env`, running
    `workload` on `preset` (what the slowdown advice is about)."""

    def __init__(self, pid: int, env: Mapping[str, str], workload: WorkloadPreset, preset: DevicePreset):
        self._sampler = SystemSampler(pid, env=env)
        context = Context(workload=workload.workload, params=workload.params, preset=preset)
        self._detector = SlowdownDetector(context, **SLOWDOWN_SETTINGS)
        self._contention = ContentionDetector()  # a warning only: it never asks for a fallback
        self._sampled = 0.0

    def sample(self) -> MemoryFields | None:
        """A memory sample when one is due, else None."""
        now = time.monotonic()
        if now - self._sampled < MEMORY_EVERY_S:
            return None
        self._sampled = now
        return self._sampler.sample()

    def warnings(self, sample: MemoryFields) -> list[WarningFields]:
        """What a sample of the running attempt warns of."""
        found = (self._detector.memory(sample, time.time()), self._contention.sample(sample, time.time()))
        return [w for w in found if w is not None]

    def saw(self, event: dict) -> WarningFields | None:
        """One of the attempt's events: trainer_ready says what it runs on, a step its rate."""
        if event["type"] == "trainer_ready":
            self._detector.context = dataclasses.replace(
                self._detector.context, device=event.get("device"), precision=event.get("precision"))
        elif event["type"] == "step" and event.get("samples_per_s") is not None:
            return self._detector.step(event["samples_per_s"], event["t"], event.get("window_s"))
        return None

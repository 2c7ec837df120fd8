"""One probe worker, watched from outside: its events, memory, pressure and swap, its end.

The readings come from the same SystemSampler the supervisor uses, taken here in the
parent (a worker stuck in a page fault is still measured), four times a second because a
probe is short. How a worker ended is classified by engine.run.crashes like any attempt's; a
worker the probe itself ended (time up, batch too big) is not a crash.

`Worker` runs the probe's trainer (engine.probe.worker); a command workload's worker
(engine.probe.command_worker.CommandWorker) differs only in what it spawns and when, and in
how it reads its events: from the command's output. engine.probe.workers picks the one.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from engine.record.attempt_log import log_tail
from engine.run.crashes import AttemptEnd, Verdict, classify
from engine.record.events import EventFollower
from engine.run.launch import child_env
from engine.run.process import signal_group, spawn
from engine.preset_types import DevicePreset
from engine.probe import TRIAL_S
from engine.record.rundir import RunDir
from engine.runconfig import RunConfig
from engine.schema import to_table
from engine.monitor.sysmon import LEVELS, SystemSampler
from engine.event_types import MemoryFields

SAMPLE_EVERY_S = 0.25
POLL_S = 0.05
# Workers run with a schedule that never ends, no evals and no checkpoints: the probe
# decides when they stop.
PROBE_TRAIN: dict[str, Any] = {"epochs": 1e9, "max_steps": 0, "eval_every_steps": 0,
               "checkpoint_every_steps": 0, "checkpoint_every_minutes": 0.0}


PRESSURE_RANK: dict[str | None, int] = {None: -1, **{level: i for i, level in enumerate(LEVELS)}}


def worse(a: str | None, b: str | None) -> str | None:
    """The worse of two pressure levels (None: unavailable)."""
    return a if PRESSURE_RANK[a] >= PRESSURE_RANK[b] else b


@dataclass(frozen=True)
class MemoryReading:
    """What the samples taken over an interval say."""

    peak_rss: int | None        # bytes, the worker and its children
    pressure: str | None        # the worst level seen; None where no source is available
    pressure_source: str | None
    swap_in: float | None       # bytes swapped in over the interval; None without counters
    swap_growth: int            # swap used at the end minus at the start, bytes
    system_percent: float | None  # system memory in use at the peak
    samples: int

    def to_dict(self) -> dict:
        return dict(peak_rss=self.peak_rss, pressure=self.pressure,
                    pressure_source=self.pressure_source, swap_in=self.swap_in,
                    swap_growth=self.swap_growth, system_percent=self.system_percent)


def read_memory(samples: Sequence[tuple[float, Mapping[str, Any]]]) -> MemoryReading:
    rss = [s["rss"] for _, s in samples if s["rss"] is not None]
    pressure, source, swap_in = None, None, None
    for i, (t, s) in enumerate(samples):
        pressure = worse(s["pressure"]["level"], pressure)
        source = source or s["pressure"]["source"]
        if s["swap_in_per_s"] is not None and i:
            swap_in = (swap_in or 0.0) + s["swap_in_per_s"] * (t - samples[i - 1][0])
    used = [100.0 * s["system_used"] / s["system_total"] for _, s in samples if s["system_total"]]
    growth = samples[-1][1]["swap_used"] - samples[0][1]["swap_used"] if samples else 0
    return MemoryReading(max(rss) if rss else None, pressure, source, swap_in, growth,
                         max(used) if used else None, len(samples))


@dataclass
class WorkerEnd:
    """How a worker ended: by itself (verdict) or because the probe ended it (ended_by)."""

    verdict: Verdict | None
    ended_by: str | None        # "time" or "probe" when the probe killed it
    exit_code: int | None
    signal: str | None
    tail: str
    config_error: str | None = None

    @property
    def crashed(self) -> bool:
        return self.verdict is not None and self.verdict.crashed


@dataclass
class Worker:
    """A probe worker process for one candidate preset."""

    config: RunConfig
    preset: DevicePreset
    scratch: Path
    batches: bool = False
    trial_s: float = TRIAL_S
    parity: str | None = None  # "also": check against the CPU before measuring; "only": just that
    preset_name: str = "probe"  # what the worker's errors call the preset
    events: list[dict] = field(default_factory=list)
    samples: list[tuple[float, MemoryFields]] = field(default_factory=list)

    is_command = False       # CommandWorker: the user's own command instead of a trainer

    @property
    def basis(self) -> str:
        """A command's: how its samples/s was derived, in words."""
        return ""

    @property
    def unit(self) -> str:
        """What its rates count ("steps": a command that takes no batch size)."""
        return "samples"

    def __post_init__(self):
        self.startup_s: float | None = None  # a command's: its last start-up (spawn to first step), s
        workload = self.config.workload
        train = replace(workload.train, **PROBE_TRAIN)
        self._config = replace(self.config, device=self.preset, ladder={},
                               workload=replace(workload, train=train))
        self._new_run()
        self.proc: subprocess.Popen | None = None
        self.started = time.monotonic()  # created; `went` when its turn came (speed mode)
        self.went: float | None = None
        self._sampler: SystemSampler | None = None
        self._sampled = 0.0
        self._ended_by: str | None = None
        self.extra_s = 0.0  # time its slice is lengthened by: the parity check's, which is not speed
        self._start()

    def _new_run(self) -> None:
        """A scratch run directory: where the worker's events and log go."""
        self.run = RunDir.create(self._config, root=self.scratch)
        self.log_path = self.run.attempt_log(1)
        self._follower = EventFollower(self.run.events_path)

    def _start(self) -> None:
        """The trainer worker is spawned at once: it imports torch while the others do."""
        command = [sys.executable, "-P", "-m", "engine.probe.worker", str(self.run.path),
                   "--preset-json", json.dumps(to_table(self.preset))]
        if self.batches:
            command += ["--batches", "--trial-s", str(self.trial_s)]
        if self.parity:
            command += ["--parity", self.parity]
        command += ["--preset-name", self.preset_name]
        self._spawn(command, child_env(dict(self.preset.env)), stdin=subprocess.PIPE)

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: str | None = None,
               stdin=subprocess.DEVNULL) -> None:
        """Start the process in its own session (so the whole group can be ended), its
        output into the log; memory is sampled from its process tree."""
        with open(self.log_path, "ab") as log:
            self.proc = spawn(argv, cwd=cwd, stdin=stdin, stdout=log, stderr=subprocess.STDOUT,
                              env=env, text=True)
        self._sampler = SystemSampler(self.proc.pid)
        self._sampled = 0.0

    # ------------------------------------------------------------ watching

    def poll(self) -> list[dict]:
        """New events since the last call; takes a memory sample when one is due."""
        now = time.monotonic()
        if now - self._sampled >= SAMPLE_EVERY_S and self.alive and self._sampler is not None:
            self._sampled = now
            self.samples.append((now, self._sampler.sample()))
        new = self._new_events()
        for e in new:
            e["_received"] = now
            if e["type"] == "parity":
                self.extra_s += e.get("seconds") or 0.0
        self.events += new
        return new

    def _new_events(self) -> list[dict]:
        return self._follower.poll()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def memory(self, since: float = 0.0, until: float = math.inf) -> MemoryReading:
        return read_memory([(t, s) for t, s in self.samples if since <= t <= until])

    def of_type(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind]

    @property
    def imported(self) -> bool:
        """Done with its imports and waiting for its turn (or gone)."""
        return not self.alive or any(e["type"] == "worker_started" for e in self.events)

    # ------------------------------------------------------------ talking and ending

    def go(self, until: float) -> None:
        """Its turn (speed mode): build the trainer, measure, be done by `until` (time.time())."""
        self.went = time.monotonic()
        self.send(f"go {until!r}")

    def send(self, line: str) -> bool:
        """A line on the worker's stdin (batch mode); False when it is gone."""
        if self.proc is None or self.proc.stdin is None:
            return False   # not started (a command between trials)
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def kill(self, why: str) -> None:
        if self.alive:
            self._ended_by = why
            self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: signal.Signals) -> None:
        """Its process group, and what left it (engine.run.process, as for any attempt)."""
        if self.proc is not None:
            signal_group(self.proc.pid, sig, strays=self.proc.returncode is None)

    def wait(self, deadline: float, on_events=None, cancel: threading.Event | None = None) -> WorkerEnd:
        """Watch until the worker exits, `deadline` (time.time()) passes or `cancel` is set,
        then end it. An exception here (Ctrl-C) ends the worker too: it runs in its own
        session, so nothing else would."""
        try:
            while self.alive and time.time() < deadline + self.extra_s and not (cancel and cancel.is_set()):
                new = self.poll()
                if new and on_events:
                    on_events(new)
                time.sleep(POLL_S)
        finally:
            self.kill("time")
        return self.end()

    def end(self) -> WorkerEnd:
        assert self.proc is not None  # spawned when created (CommandWorker has its own end)
        code = self.proc.wait()
        self._signal_group(signal.SIGKILL)  # what it left behind (DataLoader workers)
        if self.proc.stdin:
            try:
                self.proc.stdin.close()
            except OSError:
                pass  # its reader died with it
        self.poll()
        tail = log_tail(self.log_path)
        sig = signal.Signals(-code).name if code < 0 else None
        if self._ended_by:
            return WorkerEnd(None, self._ended_by, None, sig, tail)
        config_error = next((e["message"] for e in self.of_type("config_error")), None)
        verdict = classify(self._attempt_end(None if sig else code, sig, tail))
        return WorkerEnd(verdict, None, None if sig else code, sig, tail, config_error)

    def _attempt_end(self, code: int | None, sig: str | None, tail: str) -> AttemptEnd:
        """What engine.run.crashes needs to know of how it ended."""
        steps = [e["step"] for e in self.events if e["type"] in ("step", "probe_warmup", "probe_timing")]
        last = self.samples[-1][1] if self.samples else None
        return AttemptEnd(
            exit_code=code, signal=sig, tail=tail,
            exception=next(iter(self.of_type("exception")), None),
            numerical=next(iter(self.of_type("numerical")), None),
            last_step=max(steps) if steps else None,
            memory_percent=100.0 * last["system_used"] / last["system_total"] if last else None,
            device=next((e.get("device") for e in self.of_type("trainer_ready")), None))

"""The supervisor: owns a run's attempts, each a trainer in its own process.

A native crash (SIGABRT from Metal, SIGSEGV) kills only the trainer; the supervisor
records how the attempt ended (exit code or signal, the log's tail, the trainer's own
events), classifies it (engine.crashes), and applies the device preset's rules
(engine.fallback): the next attempt resumes from the last checkpoint on a safer preset, or
the run ends. It runs in the foreground under `cockpit --no-ui`, or detached in its own
session (`python -m engine.supervisor RUN_DIR`) so that a run outlives its terminal.

It also watches for hangs: a trainer that writes no event for max(hang_timeout_s, 10 x the
slowest interval seen) gets a SIGTERM (a slow step could still checkpoint and exit), then
SIGKILL — a wedged kernel answers nothing else.

Stopping: SIGINT/SIGTERM to the supervisor (or `request_stop`) forwards one SIGTERM to the
trainer, which finishes its step, checkpoints and exits; a second request forwards a
second SIGTERM, which the trainer obeys at once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

import engine
from engine import checkpoint, fallback
from engine.crashes import AttemptEnd, Verdict, classify, torchrun_root_cause
from engine.distributed import launch_prefix
from engine.events import EventFollower, EventWriter
from engine.fallback import Decision, Ladder, Step
from engine.rundir import RunDir
from engine.slowdown import Context, SlowdownDetector
from engine.sysmon import SystemSampler
from engine.schema import to_table

TAIL_LINES = 40
MEMORY_EVERY_S = 1.0
SLOWDOWN_SETTINGS: dict = {}  # SlowdownDetector keyword overrides (tests shorten its windows)
HANG_GAP_FACTOR = 10
# Until the trainer says it is ready (torch imported, data built, model on the device), a
# slow start is not a hang: building a 500k-vector bank takes minutes on a laptop.
STARTUP_TIMEOUT_S = 600.0
_PROJECT_ROOT = str(Path(engine.__file__).resolve().parent.parent)


@dataclass
class AttemptWatch:
    """What the supervisor learns about the running attempt from its events."""

    attempt: int
    started: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    last_step: int | None = None
    precision: str | None = None
    device: str | None = None
    resumed_step: int = 0
    exception: dict | None = None
    numerical: dict | None = None
    fired: list[str] = field(default_factory=list)
    exceptions: dict[int, dict] = field(default_factory=dict)   # by rank
    numericals: dict[int, dict] = field(default_factory=dict)   # by rank
    slowdown: dict | None = None   # the warning for which the supervisor stopped it

    def see(self, event: dict, now: float) -> float:
        """Record one of this attempt's events; returns the gap since the previous one."""
        gap, self.last_progress = now - self.last_progress, now
        kind = event["type"]
        if kind == "step":
            self.last_step = event["step"]
        elif kind == "trainer_ready":
            self.precision, self.device = event.get("precision"), event.get("device")
            self.resumed_step = (event.get("resumed_from") or {}).get("step", 0)
        elif kind == "exception":
            self.exceptions.setdefault(event.get("rank", 0), event)
            self.exception = self.exception or event
        elif kind == "numerical":
            self.numericals.setdefault(event.get("rank", 0), event)
            self.numerical = self.numerical or event
        elif kind == "fault_injected":
            self.fired.append(event["spec"])
        return gap


@dataclass(frozen=True)
class AttemptResult:
    attempt: int
    step: Step
    verdict: Verdict
    exit_code: int | None   # set when the trainer exited
    signal: str | None      # set when a signal killed it (SIGABRT, SIGKILL, ...)
    tail: str               # the end of attempt-N.log
    watch: AttemptWatch

    @property
    def outcome(self) -> str:
        return self.verdict.kind


def child_env(extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **extra, "PYTHONUNBUFFERED": "1"}
    # The trainer imports engine from the same place this process did, installed or not,
    # and a custom workload's module from the directory this process imported it from (the
    # children run with -P, so their working directory cannot shadow it).
    from engine.workloads import custom

    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_PROJECT_ROOT, *custom.import_roots(), env.get("PYTHONPATH")) if p)
    return env


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 16384))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


class Supervisor:
    def __init__(self, run: RunDir, on_events: Callable[[list[dict]], None] | None = None,
                 poll_s: float = 0.1):
        self.run = run
        self.config = run.config()
        self.on_events = on_events
        self.poll_s = poll_s
        self.follower = EventFollower(run.events_path)
        self.events = EventWriter(run.events_path, attempt=0)
        self.stop_requests = 0
        self._proc: subprocess.Popen | None = None
        self._forwarded = 0
        self._watch: AttemptWatch | None = None
        self._distributed = False
        self._slowest_gap = 0.0       # the longest quiet interval seen in a healthy attempt
        self._memory_percent: float | None = None
        self._memory_sampled = 0.0
        self._sampler: SystemSampler | None = None
        self._detector: SlowdownDetector | None = None
        self._last_checkpoint: dict | None = None

    # ------------------------------------------------------------ the run

    def supervise(self) -> str:
        """Run attempts until the run ends; returns its status: finished, stopped or failed."""
        self.run.pid_path.write_text(f"{os.getpid()}\n")
        self._install_signal_handlers()
        try:
            self.events.emit("run_started", run=self.run.id, workload=self.config.workload_preset,
                             device_preset=self.config.device_preset, pid=os.getpid(),
                             overrides=list(self.config.overrides))
            status, results = self._attempts()
            self.events.emit("run_finished", status=status, attempts=len(results),
                             summary=run_summary(results))
            self._pump()
            return status
        finally:
            self.events.close()
            self.run.pid_path.unlink(missing_ok=True)

    def _attempts(self) -> tuple[str, list[AttemptResult]]:
        start = Step(self.config.device_preset, self.config.device)
        ladder = Ladder(start, self.config.ladder)
        current, fired, results = start, set(), []
        while True:
            attempt = len(results) + 1
            # A preset's fault fires once per run (unless it ends in '+'), as a real crash does
            # not follow the run onto a safer setting.
            preset = current.preset
            inject = tuple(f for f in preset.inject if (current.name, f) not in fired or f.endswith("+"))
            result = self.run_attempt(attempt, current.name, dataclasses.replace(preset, inject=inject))
            results.append(result)
            fired.update((current.name, spec) for spec in result.watch.fired)
            verdict = result.verdict
            if not verdict.crashed:
                return {"finished": "finished", "stopped": "stopped"}.get(verdict.kind, "failed"), results
            if self.stop_requests:
                return "stopped", results
            decision = fallback.decide(verdict, current, ladder, attempt, start.preset.max_attempts,
                                       precision_used=result.watch.precision)
            if decision.next is None:
                self.events.emit("run_failed", reason=decision.why, kind=verdict.kind)
                return "failed", results
            self._emit_fallback(result, decision)
            current = decision.next

    def _emit_fallback(self, result: AttemptResult, decision: Decision) -> None:
        # The file on disk is the truth (a trainer killed between writing a checkpoint and
        # announcing it resumes from the file); the event adds samples seen when it matches.
        resume = None
        if (latest := checkpoint.latest(self.run.checkpoints)) is not None:
            step, seen = checkpoint.step_of(latest), None
            if self._last_checkpoint and self._last_checkpoint["step"] == step:
                seen = self._last_checkpoint["samples_seen"]
            resume = {"step": step, "samples_seen": seen, "path": str(latest.relative_to(self.run.path))}
        to = decision.next.name + (f" ({fallback.describe_change(decision.changed)})"
                                   if decision.action != "next" and decision.changed else "")
        self.events.emit("fallback", attempt=result.attempt, **{"from": result.step.name}, to=to,
                         to_preset=decision.next.name, action=decision.action,
                         reason=result.verdict.kind, why=decision.why,
                         sentence=result.verdict.sentence, changed=decision.changed,
                         resume=resume, next_attempt=result.attempt + 1)
        self._pump()

    def run_attempt(self, attempt: int, name: str, preset) -> AttemptResult:
        log_path = self.run.attempt_log(attempt)
        trainer = ["-m", "engine.trainer", str(self.run.path), "--attempt", str(attempt),
                   "--preset", name, "--device-json", json.dumps(to_table(preset))]
        # Several processes: torch.distributed's own launcher, supervised like any attempt.
        launcher = launch_prefix(preset.nproc_per_node, preset.nnodes, preset.rdzv_endpoint,
                                 self.run.id, sys.executable)
        command = launcher + trainer if launcher else [sys.executable, "-P", *trainer]
        self._distributed = bool(launcher)
        self.events.emit("attempt_started", attempt=attempt, preset=name, config=to_table(preset),
                         log=log_path.name)
        self._watch = watch = AttemptWatch(attempt)
        with open(log_path, "ab") as log:
            # Its own session: a Ctrl-C in the terminal reaches only the supervisor, which
            # forwards exactly one stop request.
            # torchrun starts its workers itself; PYTHONSAFEPATH is -P for them (the working
            # directory must not shadow engine or the workload).
            env = child_env({**preset.env, **({"PYTHONSAFEPATH": "1"} if launcher else {})})
            self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._forwarded = 0
        self._sampler = SystemSampler(self._proc.pid)
        self._detector = SlowdownDetector(Context(workload=self.config.workload.workload,
                                                  params=self.config.workload.params, preset=preset),
                                          **SLOWDOWN_SETTINGS)
        self._memory_sampled = 0.0
        hung_for = None
        while self._proc.poll() is None:
            self._forward_stop()
            self._pump()
            self._sample_memory(attempt)
            if hung_for is None and (quiet := time.monotonic() - watch.last_progress) > \
                    self._hang_timeout(preset, started=watch.device is not None):
                hung_for = quiet
                self._end_hung_trainer(preset)
            time.sleep(self.poll_s)
        self._pump()
        code = self._proc.returncode
        self._proc = None
        tail = log_tail(log_path, lines=TAIL_LINES * (3 if self._distributed else 1))
        if self._distributed and code > 0 and (cause := torchrun_root_cause(tail)) is not None:
            # How the first failing rank ended, not torchrun's own exit 1; the other ranks'
            # errors are consequences of it.
            rank, code = cause
            watch.exception = watch.exceptions.get(rank)
            watch.numerical = watch.numericals.get(rank)
        sig = signal.Signals(-code).name if code < 0 else None
        verdict = classify(AttemptEnd(
            exit_code=None if sig else code, signal=sig, tail=tail, exception=watch.exception,
            numerical=watch.numerical, last_step=watch.last_step,
            stop_requested=bool(self.stop_requests), hung_for_s=hung_for,
            memory_percent=self._memory_percent, device=watch.device, slowdown=watch.slowdown))
        result = AttemptResult(attempt, Step(name, preset), verdict, None if sig else code, sig, tail, watch)
        if verdict.crashed:
            self.events.emit("crash", attempt=attempt, preset=name, kind=verdict.kind,
                             sentence=verdict.sentence, evidence=verdict.evidence,
                             exception=watch.exception.get("traceback") if watch.exception else None)
        self.events.emit("attempt_ended", attempt=attempt, preset=name, outcome=verdict.kind,
                         exit_code=result.exit_code, signal=sig,
                         exit=sig or f"exit {code}", last_step=watch.last_step, tail=tail)
        self._pump()
        return result

    # ------------------------------------------------------------ hangs and memory

    def _hang_timeout(self, preset, started: bool) -> float:
        floor = preset.hang_timeout_s if started else max(preset.hang_timeout_s, STARTUP_TIMEOUT_S)
        if self._watch.exception or self._watch.numerical:
            floor = max(floor, 60.0)  # it said why it is ending; exiting takes a moment
        return max(floor, HANG_GAP_FACTOR * self._slowest_gap)

    def _end_hung_trainer(self, preset) -> None:
        """SIGTERM first (a slow step can still checkpoint and exit), then SIGKILL."""
        grace = min(10.0, preset.hang_timeout_s)
        self._signal_trainer(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self._proc.poll() is None and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        if self._proc.poll() is None:
            self._signal_trainer(signal.SIGKILL)
            self._proc.wait()

    def _signal_trainer(self, sig: signal.Signals) -> None:
        """SIGTERM reaches the trainer processes themselves (under torchrun, its workers,
        so that every rank checkpoints through the same stop agreement); SIGKILL the whole
        process group."""
        try:
            if sig == signal.SIGKILL:
                os.killpg(self._proc.pid, signal.SIGKILL)
            elif self._distributed:
                for worker in psutil.Process(self._proc.pid).children(recursive=True):
                    worker.send_signal(sig)
            else:
                self._proc.send_signal(sig)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass

    def _sample_memory(self, attempt: int) -> None:
        """A `memory` event about once a second, sampled here so it goes on when the
        trainer is stuck; fed to the slowdown detector. How full memory was just before a
        SIGKILL also tells the kernel's OOM killer from a user's kill -9."""
        now = time.monotonic()
        if now - self._memory_sampled < MEMORY_EVERY_S:
            return
        self._memory_sampled = now
        sample = self._sampler.sample()
        self._memory_percent = 100.0 * sample["system_used"] / sample["system_total"]
        self.events.emit("memory", attempt=attempt, **sample)
        self._on_warning(self._detector.memory(sample, time.time()))

    def _on_warning(self, warning: dict | None) -> None:
        if warning is None:
            return
        self.events.emit("warning", attempt=self._watch.attempt, **warning)
        if warning["fallback"] and self._watch.slowdown is None and not self.stop_requests:
            # The preset asks to fall back: a graceful stop (checkpoint first), then the
            # rule for 'slowdown' picks the next attempt.
            self._watch.slowdown = warning
            self._signal_trainer(signal.SIGTERM)

    # ------------------------------------------------------------ stopping

    def request_stop(self) -> None:
        """Ask the run to stop (thread-safe; signal handlers call this too)."""
        self.stop_requests += 1

    def _forward_stop(self) -> None:
        # First request: stop after a checkpoint; second: stop now; third: the trainer is
        # wedged and answers no signal it can handle.
        if self._proc is not None and self._forwarded < min(self.stop_requests, 3):
            self._signal_trainer(signal.SIGTERM if self._forwarded < 2 else signal.SIGKILL)
            self._forwarded += 1

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # the TUI's worker calls request_stop() instead
        signal.signal(signal.SIGINT, lambda *_: self.request_stop())
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        # A closed terminal or dropped SSH connection must not end the run.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _pump(self) -> None:
        events = self.follower.poll()
        now = time.monotonic()
        for e in events:
            if self._watch and e.get("attempt") == self._watch.attempt and e["type"] not in \
                    ("memory", "warning", "attempt_started", "crash", "attempt_ended"):
                gap = self._watch.see(e, now)
                if e["type"] not in ("trainer_ready",):  # start-up is not a step interval
                    self._slowest_gap = max(self._slowest_gap, gap)
                if e["type"] == "trainer_ready" and self._detector:
                    self._detector.context = dataclasses.replace(
                        self._detector.context, device=e.get("device"), precision=e.get("precision"))
                elif e["type"] == "step" and self._detector:
                    self._on_warning(self._detector.step(e["samples_per_s"], e["t"], e.get("window_s")))
            if e["type"] == "checkpoint":
                self._last_checkpoint = e
        if events and self.on_events:
            self.on_events(events)


def run_summary(results: list[AttemptResult]) -> dict:
    """Attempts, how each ended, where the run finished, and the steps lost to crashes."""
    attempts, lost = [], 0
    for i, r in enumerate(results):
        attempts.append({"attempt": r.attempt, "preset": r.step.name, "device": r.watch.device,
                         "outcome": r.outcome, "last_step": r.watch.last_step,
                         "sentence": r.verdict.sentence if r.verdict.crashed else None})
        if r.verdict.crashed and i + 1 < len(results):
            resumed = results[i + 1].watch.resumed_step
            lost += max(0, (r.watch.last_step or 0) - (resumed or 0))
    last = results[-1] if results else None
    return {"attempts": attempts, "steps_lost": lost,
            "finished_on": last.step.name if last and last.outcome == "finished" else None,
            "final_step": last.watch.last_step if last else None}


# ---------------------------------------------------------------- detached runs


def start_detached(run: RunDir) -> int:
    """Start a supervisor for the run in its own session; returns its pid at once."""
    with open(run.supervisor_log, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-P", "-m", "engine.supervisor", str(run.path)],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=child_env({}), start_new_session=True)
    run.pid_path.write_text(f"{proc.pid}\n")
    return proc.pid


def request_stop(run: RunDir) -> bool:
    """Ask a live run's supervisor to stop it gracefully; False if none is running."""
    pid = run.supervisor_pid()
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m engine.supervisor RUN_DIR", file=sys.stderr)
        return 2
    status = Supervisor(RunDir(Path(argv[0]))).supervise()
    return {"finished": 0, "stopped": 130}.get(status, 1)


if __name__ == "__main__":
    sys.exit(main())

"""What every launcher is: one way a training process starts or is found.

The supervisor (engine.run.supervisor) and its attempt (engine.run.attempt) never ask which
launcher they hold; they ask it. A launcher owns:

- how an attempt's process starts (`launch`, then `start`; a spare started ahead where it can
  serve, `spare`) or is found (an adopted process, already running);
- where its signals go (`deliver`, one of engine.run.process's) and how the lifeline stops it
  should the supervisor die (`lifeline`, `lifeline_plan`; no lifeline for a process that was
  running before us);
- its output, where cockpit does not capture it itself (`collect`: an adopted process's log);
- what cockpit does to it on its own: a hang (`hung`), a non-finite loss (`non_finite`), a
  health warning (`warning`), the supervisor failing (`abandon`); a process it found is
  never signalled but when the user stops the run;
- what its end means (`judge`, by engine.run.crashes' rules, with its `subject`: the sentence's
  words and what its exit codes mean) and what it leaves behind (`exited`);
- its words: what its attempt_started event says of it (`describe`), what a run of it is called
  when it ends (`status`).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Callable, ClassVar

from engine.preset_types import DevicePreset
from engine.record.attempt_log import TAIL_LINES
from engine.emit import Emit
from engine.event_types import WarningFields
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.run.crashes import TRAINER, Subject, Verdict
from engine.run.kinds import TrainerKind
from engine.run.launch import Launch, child_env
from engine.run.lifeline import Lifeline
from engine.run.process import AttemptProcess, to_process
from engine.run.spare import Spare
from engine.run.watch import HANG_GAP_FACTOR, AttemptWatch, judge
from engine.runconfig import RunConfig


class Launcher:
    """The built-in trainer's defaults; each way a process starts or is found overrides what
    differs."""

    name: ClassVar[str] = "trainer"
    subject: ClassVar[Subject] = TRAINER
    tail_lines: ClassVar[int] = TAIL_LINES    # how much of its log is the evidence of its end
    relaunches: ClassVar[bool] = True         # a crash goes down the ladder (from the checkpoint)
    rewinds: ClassVar[bool] = True            # a health finding may go back to a checkpoint
    interrupt: ClassVar[str] = "stop"         # what Ctrl-C to its supervisor means: stop or release
    found: ClassVar[bool] = False             # found running, its log has a past (else started)
    reads: ClassVar[type[TrainerKind]] = TrainerKind   # how its runs' progress and checkpoints are read
    ends: ClassVar[tuple[str, ...]] = ("finished", "stopped")   # the clean ends a run's status is named for

    def __init__(self, run: RunDir, config: RunConfig):
        self.run, self.config = run, config

    @classmethod
    def fits(cls, config: RunConfig, preset: DevicePreset) -> bool:
        """Whether this is how an attempt of `config` on `preset` starts."""
        raise NotImplementedError

    # ------------------------------------------------------------ starting

    def deliver(self, process: AttemptProcess, sig: signal.Signals) -> None:
        """Where its signals go: to the trainer itself (it tells its own children); SIGKILL to
        its whole group."""
        to_process(process, sig)

    def launch(self, attempt: int, name: str, preset: DevicePreset, resume: dict | None) -> Launch:
        """The attempt's argv, environment and how it is read; `resume` ({"path", "step"}) is
        where a command continues (the trainer finds its own)."""
        raise NotImplementedError

    def start(self, launch: Launch, log, events: EventWriter) -> AttemptProcess:
        """Its process, its output into `log` (an open file). OSError if it cannot start."""
        return AttemptProcess.start(launch, log, self.deliver)

    def hand(self, spare: Spare, launch: Launch, log_path: Path) -> AttemptProcess | None:
        """The spare as this attempt's process: it runs the launch's argv in the process started
        for it, its output into `log_path`. None if it cannot (it died, or this launch is not one
        it was started for): discarded, and the attempt is started as usual."""
        popen = spare.take(launch, log_path)
        if popen is None:
            return None
        return AttemptProcess(popen, stop_signals=launch.stop_signals, grace_s=launch.stop_grace_s,
                              deliver=self.deliver)

    def spare(self, attempt: int, name: str, preset: DevicePreset) -> dict | None:
        """How to start a spare for the next attempt on this preset (engine.run.spare.Spare's
        keywords), or None where none can serve."""
        return None

    def lifeline(self, lock: int) -> Lifeline | None:
        """The process that stops the run's attempt should the supervisor die (engine.run.lifeline);
        `lock`, the run's, is shared with it."""
        return Lifeline(self.run.path, self.run.supervisor_log, child_env({}), lock)

    def run_fields(self) -> dict:
        """What its run_started event says of it, beyond the run's presets."""
        return {}

    def describe(self, launch: Launch) -> dict:
        """What its attempt_started event says of the launch, beyond the preset."""
        return {}

    # ------------------------------------------------------------ running

    def collect(self, final: bool = False) -> bool:
        """Its output into attempt-N.log, where the process does not write there itself; returns
        whether there was any (`final`: all of it, the process is gone)."""
        return False

    def lifeline_plan(self, launch: Launch, slowest_gap: float) -> tuple[tuple[signal.Signals, ...], float, bool]:
        """How the lifeline stops it should the supervisor die: its signals, their grace and
        whether they go to its process group. SIGTERM: finish the step, checkpoint, exit; a
        step may take a while."""
        return (signal.SIGTERM, signal.SIGKILL), max(60.0, HANG_GAP_FACTOR * slowest_gap), False

    def hung(self, process: AttemptProcess, preset: DevicePreset, poll_s: float) -> None:
        """It gave no sign of life for its hang timeout: SIGTERM, then SIGKILL."""
        process.end_hung(min(10.0, preset.hang_timeout_s), poll_s)

    def hang_limit(self, launch: Launch, limit: float, quiet_s: float) -> float:
        """How long it may be quiet before it is judged hung, having been quiet `quiet_s`: the
        watch's `limit`, unless the kind knows better (a node whose peer said it was lost)."""
        return limit

    def non_finite(self, stop_now: Callable[[], None]) -> None:
        """Its loss went NaN or infinite (a command's, read from its output): it trains garbage
        for hours with every monitor green, so it is stopped now, without the graceful stop (a
        script saving on Ctrl-C would save the garbage)."""
        stop_now()

    def see(self, event: dict, say: Emit) -> None:
        """One of its attempt's events, read for what it means beyond the watch's reading (a
        node's world re-formed), said with `say` (the run's event writer's emit)."""

    def lose(self, process: AttemptProcess) -> None:
        """`--inject node-lost@N`: its machine lost, everything it runs killed at once."""
        process.kill()

    def away(self) -> Callable[[], bool] | None:
        """After its attempt, before the next: None to go on at once, or what says that it may
        (a rehearsed lost machine stays away until the others trained without it)."""
        return None

    def warning(self, warning: WarningFields) -> WarningFields:
        """A warning of its health, as it is said (and, where `fallback`, acted on)."""
        return warning

    # ------------------------------------------------------------ its end

    def abandon(self, process: AttemptProcess) -> None:
        """The supervisor itself failed (a bug, or KeyboardInterrupt in a thread's host): the
        attempt must not train on unsupervised."""
        process.kill()

    def exited(self, process: AttemptProcess) -> None:
        """It has exited: what it left behind (the trainer's children end with it)."""

    def judge(self, watch: AttemptWatch, launch: Launch, code: int | None, tail: str, *,
              released: bool = False, total: int | None = None,
              **facts) -> tuple[Verdict, int | None, str | None]:
        """How the attempt ended: the verdict, its exit code and the signal that killed it.
        `facts`: engine.run.watch.judge's; `released` (a process cockpit started is never left
        running) and `total` (the steps it said it would train) are for a process found."""
        return judge(watch, launch, code, tail, subject=self.subject, **facts)

    def exit_text(self, code: int | None, sig: str | None, process: AttemptProcess | None) -> str:
        """attempt_ended's `exit`: how the process went."""
        return sig or ("not started" if code is None else f"exit {code}")

    def status(self, verdict: Verdict) -> str:
        """The run's status when this attempt is its last and did not crash."""
        return verdict.kind if verdict.kind in self.ends else "failed"

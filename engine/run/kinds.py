"""The two kinds of attempt as the supervisor reads them: the built-in trainer and the user's command.

The supervisor's loop is the same for both (spawn, watch, stop, classify, fall back); what differs
lives here, so that the loop asks its kind and never branches on it:

- where the next attempt resumes: the trainer's newest intact checkpoint in the run directory;
  a command's newest file its glob matches or it reported, written during this run and, after
  a non-finite loss, before the loss went bad;
- how progress is read: the trainer writes its own events; a command's output is parsed
  (engine.command.progress) or its script reports through cockpit.report, and either becomes
  step events through engine.command.tracker, step numbers the rehearsal's faults wait for;
- which checkpoints there are: the trainer says; a command's glob is watched for new files;
- which settings a fallback may not change (those a command's argv does not use).

How each is started, stopped and judged is its launcher's (engine.run.launchers), which names
the kind its runs are read by (`Launcher.reads`).
"""

from __future__ import annotations

import os
import stat
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from engine import command
from engine.command.progress import OutputParser
from engine.command.tracker import Tracker
from engine.record import checkpoint
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.run.crashes import Verdict
from engine.run.launch import Launch
from engine.run.rehearsal import Rehearsal
from engine.run.resume import History
from engine.run.watch import AttemptWatch
from engine.runconfig import RunConfig

# A checkpoint file written this recently may still be being written (each write() moves its
# mtime): told once it has been still this long, or the script has exited. Looked at mid-write
# and again when done, a loaded machine counted one save twice.
FILE_SETTLE_S = 0.3
STEPS_KEPT = 4096  # steps read since the last checkpoint write: a checkpoint's step is a recent one


class TrainerKind:
    """The built-in trainer (a protocol workload's too): it says everything itself, in events."""

    def __init__(self, run: RunDir, config: RunConfig, events: EventWriter):
        self.run, self.config, self.events = run, config, events
        self.since = time.time()                   # when the run started (its first supervisor)
        self.checkpoints: dict[str, dict] = {}     # every checkpoint event of the run, by path
        self.tracker: Tracker | None = None        # a command's progress, this attempt

    def continue_from(self, history: History) -> None:
        """What earlier supervisors of a continued run recorded."""
        if history.started is not None:   # its run_started: a continued run has one
            self.since = history.started
        self.checkpoints.update(history.checkpoints)

    def fixed_settings(self) -> frozenset[str]:
        """Settings a fallback rule may not change: none, the trainer reads them all."""
        return frozenset()

    def resume_point(self, numerical: dict | None = None) -> dict | None:
        """Where the next attempt continues: {"step", "samples_seen", "path"}, or None.

        The file on disk is the truth (a trainer killed between writing a checkpoint and
        announcing it resumes from the file); an event adds what it knew of it."""
        if (latest := checkpoint.newest_intact(self.run.checkpoints)) is None:
            return None
        path = str(latest.relative_to(self.run.path))
        seen = self.checkpoints.get(path, {}).get("samples_seen")
        return {"step": checkpoint.step_of(latest), "samples_seen": seen, "path": path}

    def unloadable(self, attempt: int, path: str, verdict: Verdict) -> None:
        """A checkpoint the attempt could not load: the trainer's own checkpoints are checked
        by itself (checkpoint.newest_intact), nothing to set aside."""

    def rewind_takes(self) -> tuple[bool, bool]:
        """(skips batches, lowers the learning rate) after a rewind (engine.run.rewind): the
        trainer does both, by sample position and a factor its checkpoints keep."""
        return True, True

    def go_back(self, bound: int, finding: dict) -> tuple[dict | None, list[str]]:
        """A rewind: the newest intact checkpoint at step `bound` or before it (None: none),
        and those after it set aside, renamed *.rewound (so that no resume, a crash's later
        included, finds them; kept to be looked at): their paths."""
        target, after = checkpoint.rewind(self.run.checkpoints, bound)
        aside = [str(p.relative_to(self.run.path)) for p in after]
        if target is None:
            return None, aside
        name = str(target.relative_to(self.run.path))
        return ({"step": checkpoint.step_of(target), "path": name,
                 "samples_seen": self.checkpoints.get(name, {}).get("samples_seen")}, aside)

    # ------------------------------------------------------------ an attempt

    def parser(self, launch: Launch) -> OutputParser | None:
        """What reads the attempt's output for progress (none: the trainer writes events)."""
        return launch.parser()

    def begin(self, launch: Launch, watch: AttemptWatch, name: str, preset, rehearsal: Rehearsal,
              stop_at_once: Callable[[], None]) -> None:
        """A new attempt; `stop_at_once` ends it without the graceful stop."""
        self.tracker = None

    @property
    def reported_steps(self) -> bool:
        """The script reports its steps through cockpit.report."""
        return False

    @property
    def total_known(self) -> int | None:
        """The steps a command's output said it trains (the trainer says it in its events)."""
        return self.tracker.total_known if self.tracker is not None else None

    def progress(self, observations: list, final: bool, written_by: float | None = None) -> None:
        """Progress read from its output (none: the trainer's progress is its events)."""

    def see(self, event: dict) -> None:
        """One of this attempt's events."""

    def look_for_checkpoints(self, final: bool = False) -> None:
        """Checkpoints it wrote and did not say (none: the trainer says); `final`: it has
        exited, so nothing is still being written."""


class CommandKind(TrainerKind):
    """The user's own command: progress from its output or cockpit.report, checkpoints from its
    glob, exit codes its own."""

    def __init__(self, run: RunDir, config: RunConfig, events: EventWriter):
        super().__init__(run, config, events)
        self.spec = config.workload.params
        self.unreadable: set[str] = set()          # its checkpoints that it failed to load
        self._parity_told = False                  # the parity check's warning, once a run
        self._told_no_total = False                # the tracker's no-total warning, likewise
        self._newest_file: tuple[str, int | None] | None = None   # the last checkpoint told
        self._settling: tuple[str, int | None] | None = None      # a directory being written
        self._parser: OutputParser | None = None   # this attempt's, which settles the epoch base
        self._epoch_base: int | None = None        # ... as an earlier supervisor's settled it
        # (when read, step) of this attempt's steps since the last checkpoint write looked at;
        # bounded: a checkpoint's step is among the last steps read before it was written
        self._steps_read: deque[tuple[float, int]] = deque(maxlen=STEPS_KEPT)
        self._reached: int | None = None           # reached by the last write looked at (first: the resume step)
        self._told_steps: dict[str, int | None] = {}  # this attempt's: the step last told for each file
        self._reported_t: float | None = None       # this attempt's newest step reported (the script's clock)
        self._unsettled: dict[str, tuple[int, int | None]] = {}  # a file seen mid-write: (mtime, step then)
        self._unseen: set[str] = set()             # files rewritten with writes untold (a lower bound)

    def parser(self, launch: Launch) -> OutputParser | None:
        base = self._parser.epoch_base if self._parser is not None else self._epoch_base
        self._parser = launch.parser(epoch_base=base)
        return self._parser

    def continue_from(self, history: History) -> None:
        super().continue_from(history)
        self.unreadable = set(history.unreadable)
        # the newest checkpoint an earlier supervisor told is not a new one when seen again
        if history.checkpoints:
            told = max(history.checkpoints.values(), key=lambda e: e.get("t") or 0)["path"]
            self._newest_file = (told, _written(told))
        self._epoch_base = history.epoch_base

    def fixed_settings(self) -> frozenset[str]:
        return command.fixed_settings(self.spec)

    def resume_point(self, numerical: dict | None = None) -> dict | None:
        """A command's checkpoints are the newest file its glob matches or it reported, written
        during this run, and, after a non-finite loss, before the loss went bad (a script that
        saves on the way out would otherwise resume from the garbage)."""
        if not self.spec.resume:
            return None  # it takes no checkpoint: every attempt starts over
        bad = numerical or {}
        excluded = set(self.unreadable)
        while (latest := command.newest_checkpoint(
                self.spec, self.run.path, list(self.checkpoints),
                since=self.since, before=bad.get("t"), exclude=excluded)) is not None:
            said = self.checkpoints.get(str(latest), {})
            step, source = said.get("step"), said.get("step_source", "report")
            # a name's step is the attempt's own count: where that restarts, not the run's
            if step is None and not self.spec.steps_restart \
                    and (step := command.step_in_name(latest)) is not None:
                source = "name"
            if bad.get("step") is None or step is None or step < bad["step"]:
                seen = said.get("samples", said.get("samples_seen"))  # reported, or counted
                return {"step": step, "step_source": source if step is not None else None,
                        "samples_seen": seen, "path": str(latest)}
            excluded.add(str(latest))  # written at or after the step whose loss went bad
        return None

    def rewind_takes(self) -> tuple[bool, bool]:
        """A command skips batches through {skip_batches} or {data_offset} in its argv, and
        lowers its learning rate through {lr_scale}; without them a rewind only goes back."""
        takes = command.used(self.spec) | command.used_in_resume(self.spec)
        return bool({"skip_batches", "data_offset"} & takes), "lr_scale" in takes

    def go_back(self, bound: int, finding: dict) -> tuple[dict | None, list[str]]:
        """A rewind: its newest checkpoint of a step at `bound` or before it, written before the
        finding (one whose step is not known, only before it); those after it are passed over
        from now on (the script's own files: not renamed)."""
        if not self.spec.resume:
            return None, []
        target = self.resume_point({"step": bound + 1, "t": finding.get("t")})
        later = [p for p, e in self.checkpoints.items()
                 if target is None or (p != target["path"] and (e.get("step") is None or target["step"] is None
                                                                 or e["step"] > target["step"]))]
        self.unreadable.update(later)   # never handed to it again, as an unloadable one is not
        return target, sorted(later)

    def unloadable(self, attempt: int, path: str, verdict: Verdict) -> None:
        """A command's checkpoint it could not load: not handed to it again, in this run or a
        resumed one (the warning names it; engine.run.resume.History reads it back)."""
        self.unreadable.add(path)
        self.events.emit("warning", attempt=attempt, kind="checkpoint-unreadable", path=path,
                         error=verdict.evidence.get("message"), advice=[], fallback=False,
                         message=f"checkpoint {path} could not be loaded; the next attempt resumes "
                                 "from the one before it")

    # ------------------------------------------------------------ an attempt

    def begin(self, launch: Launch, watch: AttemptWatch, name: str, preset, rehearsal: Rehearsal,
              stop_at_once: Callable[[], None]) -> None:
        if preset.parity_check and not self._parity_told:
            self._parity_told = True
            self.events.emit("warning", attempt=watch.attempt, kind="parity-not-applicable", advice=[],
                             fallback=False, message=f"device preset {name!r} asks for a parity "
                             "check, which does not apply to a command: cockpit cannot run its "
                             "model on the CPU beside it (a built-in or protocol workload can be "
                             "checked: cockpit check)")
        # what the placeholders said; a command has no trainer_ready to say it
        watch.device, watch.precision = launch.device, launch.precision
        resume = launch.resume or {}
        # a script that counts from 0 again when it resumes (mlx-lm) is where its checkpoint was
        offset = (resume.get("step") or 0) if self.spec.steps_restart else 0
        self.tracker = Tracker(launch.units, launch.total_steps, known=launch.known,
                               resumed_from=resume.get("step"), resumed_samples=resume.get("samples_seen"),
                               step_offset=offset)
        self._watch, self._rehearsal, self._stop_at_once = watch, rehearsal, stop_at_once
        # _newest_file is kept from the attempt before: the file this attempt resumes from is
        # that attempt's checkpoint, already told, not a new one
        self._steps_read.clear()
        self._told_steps.clear()   # a write of the same file at the same step by a new attempt is its own
        self._reported_t = None
        self._reached = (launch.resume or {}).get("step")

    @property
    def reported_steps(self) -> bool:
        return self.tracker is not None and self.tracker.reported_steps

    def progress(self, observations: list, final: bool, written_by: float | None = None) -> None:
        """Progress parsed from new output (the log as of `written_by`, its mtime: a step read
        was printed by then, however late it was read); at the attempt's end, the last window."""
        t, tracker = time.time(), self.tracker
        printed_by = min(t, written_by or t)
        assert tracker is not None  # begin() made it
        for obs in observations:
            before = tracker.step
            if self._parser is not None:
                tracker.epoch_base = self._parser.epoch_base
            self._emit(tracker.parsed(obs, t))
            if obs.kind == "step" and not tracker.reported_steps:
                self._watch.ready = True  # training has begun: the start-up allowance is over
                if tracker.step is not None and tracker.step != before:
                    # the optimizer step, a batch counter's too where its accumulation is known
                    if self.spec.checkpoints:
                        self._steps_read.append((printed_by, tracker.step))
                    self._rehearsal.at_step(tracker.step, tracker.reported_steps)
        if final:
            self._emit(tracker.flush(t))

    def see(self, event: dict) -> None:
        """What the script reported through cockpit.report: its progress, its evals."""
        tracker = self.tracker
        if tracker is None:  # no attempt begun: nothing of it to see
            return
        if event["type"] == "progress":
            self._emit(tracker.reported(event))
            if event.get("step") is not None:
                self._reported_t = event["t"]
                if self.spec.checkpoints:
                    self._steps_read.append((event["t"], event["step"]))
                self._rehearsal.at_step(event["step"], tracker.reported_steps)
        elif event["type"] == "eval" and event.get("source") == "report":
            tracker.saw_reported_eval()

    def _emit(self, produced: list[tuple[str, dict]]) -> None:
        attempt, tracker, watch = self._watch.attempt, self.tracker, self._watch
        assert tracker is not None  # begin() made it
        for kind, fields in produced:
            if kind == "warning" and fields.get("kind") == "no-total":
                if self._told_no_total:
                    continue  # once a run, not once an attempt
                self._told_no_total = True
            # the tracker's step, eval and warning events, as their TypedDicts name the fields
            # (engine.command.tracker builds them); `kind` is a str here, not one literal
            self.events.emit(kind, attempt=attempt, **fields)  # type: ignore[call-overload]
            if kind == "warning" and fields.get("kind") == "no-step-numbers":
                self._rehearsal.stepless(tracker.reported_steps)
        if tracker.non_finite and watch.numerical is None:
            # A NaN loss trains garbage for hours with every monitor green: end the attempt
            # without the graceful stop (a script saving on Ctrl-C would save the garbage).
            bad = tracker.non_finite
            watch.numerical = dict(bad)
            self.events.emit("numerical", attempt=attempt, step=bad["step"], message=bad["message"])
            self._stop_at_once()

    def look_for_checkpoints(self, final: bool = False) -> None:
        """Each write of a file matching the command's checkpoint glob, a new file or the same
        one written again (nanoGPT's one `ckpt.pt`), is a checkpoint event with the step it
        holds, so resumes, retries and the TUI know of it without the script saying so. The
        step is its name's where the name says; else the step the script had reached when the
        file was written: the last step read before its modification time (read, so printed,
        before it: never past the truth), or the step the attempt resumed from. A directory
        (the HF Trainer's checkpoint-500/, accelerate's save_state) is written a file at a
        time: told once it has stayed the same for a look, or the script has exited; seen again,
        one save (its name's step, or no step read between). A script reporting its steps (the
        HF callback) has a save told once it reports a step after the write, by when its own
        report of the save has been read."""
        if not self.spec.checkpoints:
            return
        latest = command.newest_checkpoint(self.spec, self.run.path, (), since=self.since)
        if latest is None:
            return
        stamp = (str(latest), _written(latest))
        if stamp[1] is None or stamp == self._newest_file:
            return
        if not final and latest.is_dir() and stamp != self._settling:
            self._settling = stamp  # look again: it may still be being written
            return
        if not final and not latest.is_dir() and time.time() - stamp[1] / 1e9 < FILE_SETTLE_S:
            # written a moment ago: torch.save may be part way through (look again). Written again
            # since, steps later (a save spans none), the earlier write went untold: a lower bound
            now = self.tracker.step if self.tracker is not None else None
            before = self._unsettled.get(stamp[0])
            if before is not None and before[0] != stamp[1] and before[1] != now:
                self._unseen.add(stamp[0])
            self._unsettled[stamp[0]] = (stamp[1], now)
            return
        written = stamp[1] / 1e9
        if not final and self.reported_steps and (self._reported_t is None or self._reported_t <= written):
            return  # its own report of this save, if it makes one, may not have been read yet
        self._newest_file = stamp
        said = self.checkpoints.get(str(latest), {})
        if said.get("source") == "report" and said.get("attempt") == self._watch.attempt:
            return  # the script reported it itself, with its step
        step, source = command.step_in_name(latest), "name"
        if step is not None and self.tracker is not None:
            step += self.tracker.step_offset  # mlx-lm's 0000010_adapters after a resume at 20: 30
        if step is None:
            step, source = self._step_at(written), "reached"
        if step is not None and self._told_steps.get(str(latest)) == step:
            # the same save seen twice: torch.save rewrites a file in place, and a loaded machine
            # can look at it mid-write and again when it is done (no step between: one checkpoint);
            # checkpoint-20/ at step 20 is one save, though still for a look between two files
            return
        self._told_steps[str(latest)] = step
        self._unsettled.pop(str(latest), None)
        unseen, self._unseen = str(latest) in self._unseen, self._unseen - {str(latest)}
        # the samples seen by its step, where this attempt counts them: the next attempt's
        # count goes on from there, whatever batch it runs at
        seen = self.tracker.samples_at(step) if self.tracker and step is not None else None
        more: dict[str, Any] = {**({"samples_seen": int(seen)} if seen is not None else {}),
                                **({"writes_unseen": True} if unseen else {})}
        self.events.emit("checkpoint", attempt=self._watch.attempt, path=str(latest), step=step,
                         step_source=source if step is not None else None, source="file", **more)

    def _step_at(self, when: float) -> int | None:
        """The step this attempt had reached by `when` (time.time()), as far as was read."""
        reached = [step for t, step in self._steps_read if t <= when]
        if reached:  # what was read before it is not needed again: the next write is later
            while self._steps_read and self._steps_read[0][0] <= when:
                self._steps_read.popleft()
            self._reached = max(reached)
        return self._reached


def _written(path: str | Path) -> int | None:
    """When a checkpoint was last written (ns): a file's mtime; a directory's, or that of the
    newest file in it (a file rewritten in place leaves the directory's own mtime as it was)."""
    try:
        info = os.stat(path)
        if not stat.S_ISDIR(info.st_mode):
            return info.st_mtime_ns
        with os.scandir(path) as entries:
            return max([info.st_mtime_ns] + [e.stat(follow_symlinks=False).st_mtime_ns for e in entries])
    except OSError:
        return None

"""The probe's worker for a command workload: the user's own script, timed from outside.

A command cannot be preloaded (its imports are its own business), so it counts as imported
at once and is spawned when its turn comes (`go`), from engine.run.launchers.command.command_launch in the
worker's scratch run directory (attempt 1, no resume): the argv, environment and working
directory a run's first attempt would get, with the candidate's placeholders filled in.

While it runs, `poll()` follows its output as the supervisor does (an OutputParser over the
log, `progress` events that cockpit.report writes to the scratch events file) and feeds an
engine.command.tracker.Tracker, whose windows give samples/s: steps x the samples per step
(engine.command.units; where those are unknown, its {batch_size}, the one thing the probe varies,
and said so in `basis`, else 1: steps/s), or the samples it reported. From
that it makes the events the trainer's worker gives, so the probe reads both alike:

- `trainer_ready` at the first step seen (device and precision as the placeholders said;
  `startup_s` from spawn to that step: the script's imports, data and model);
- `probe_warmup` windows (`seconds`, `samples`) for a quarter of the time left after it;
- `step` windows (`samples_per_s`) until the candidate's time is up, then `probe_done` and
  its whole process group is killed (it may have DataLoader workers);
- batch mode: each size sent on `send()` is a fresh run of the command with `{batch_size}`
  that size and `{accumulation}` 1, in a fresh scratch run directory; `batch_trial` `start`
  at its first step, `end` once it has trained for the trial's time after that.

How it ended, when the probe did not end it, is classified as a command's
(AttemptEnd(command=True): its exit codes are its own). Signal faults of the preset
(`inject`) are delivered at the step read from its output, as the supervisor delivers them;
cockpit.report raises the others inside the script. Torch-free.
"""

from __future__ import annotations

import dataclasses
import shlex
import signal
import time

from engine import command as commands
from engine import vocabulary
from engine.run import faults
from engine.record.attempt_log import OutputFollower, log_tail
from engine.run.crashes import COMMAND, AttemptEnd, Verdict
from engine.run.launch import Launch
from engine.run.launchers.command import command_launch
from engine.preset_types import DevicePreset
from engine.probe import MIN_WINDOW_S, TRIAL_MIN_STEPS, WARMUP_SHARE, WINDOWS
from engine.probe.measure import Worker, WorkerEnd
from engine.command.tracker import Tracker, Units

SOURCES = {"tqdm": "its tqdm bar", "steps": "its step lines", "keyvalue": "its key=value lines",
           "hf": "its Hugging Face log lines", "regex": "its output (your progress_regex)"}


class CommandWorker(Worker):
    """A probe worker that runs the user's command instead of the trainer."""

    is_command = True

    def _start(self) -> None:
        self._launch: Launch | None = None
        self._unstarted: str | None = None
        self._process_state()

    def _process_state(self) -> None:
        """What one run of the command is followed with."""
        self._output: OutputFollower | None = None
        self._tracker: Tracker | None = None
        self._spawned: float | None = None
        self._ready_at: float | None = None
        self._until: float | None = None           # time.time(), speed mode
        self._warm_until: float | None = None
        self._trial: dict | None = None            # batch mode: {"batch", "t", "step", "samples", "done"}
        self._faults: list[vocabulary.Fault] = []
        self._slowed = False
        self._last_live: tuple[float, int, float] | None = None  # (when, step, samples) read while it ran

    @property
    def imported(self) -> bool:
        return True  # nothing to import before its turn: it starts from scratch then

    # ------------------------------------------------------------ starting

    def go(self, until: float) -> None:
        """Its turn: start the command, measure it, end it at `until` (time.time())."""
        self.went = time.monotonic()
        if self._run_command(self.preset):
            self._until = until

    def send(self, line: str) -> bool:
        """Batch mode: a micro-batch size starts a fresh run of the command at that size
        (ending the one before); 'done' ends it. False when it could not be started."""
        text = line.strip()
        if text == "done" or not text:
            self.kill("probe")
            return True
        if self.alive and self.proc is not None:  # the last trial's run: a fresh one for this size
            self._signal_group(signal.SIGKILL)
            self.proc.wait()
        self.events, self.samples, self._ended_by = [], [], None
        batch = int(text)
        started = self._run_command(dataclasses.replace(self.preset, batch_size=batch, accumulation=1))
        self._trial = {"batch": batch, "done": False}
        return started

    def _run_command(self, preset: DevicePreset) -> bool:
        if self.proc is not None or self._unstarted:
            self._new_run()  # each run of the command gets its own {run_dir}
        self._process_state()
        launch = self._launch = command_launch(self.run, self._config, 1, preset, None)
        self._threads = int(commands.values(preset, self.run.path, 1)["threads"])
        self._unstarted = None
        try:
            self._spawn(launch.argv, launch.env, cwd=launch.cwd)
        except OSError as e:  # the program went away since the preset was checked
            with open(self.log_path, "ab") as log:
                log.write(f"cockpit: cannot start {launch.argv[0]!r}: {e.strerror}\n".encode())
            self.proc, self._unstarted = None, e.strerror or str(e)
            return False
        self._spawned = time.monotonic()
        self._output = OutputFollower(self.log_path, launch.parser())
        # No window closes before its first step: then windows of the measurement's length.
        self._tracker = Tracker(self._units(launch, preset), launch.total_steps, known=launch.known,
                                report_every_s=float("inf"))
        self._faults = [vocabulary.parse(s) for s in launch.signal_faults]
        return True

    # ------------------------------------------------------------ following it

    def _new_events(self) -> list[dict]:
        if self._tracker is None or self._output is None:   # not started
            return []
        now, t = time.monotonic(), time.time()
        # What is read once the process is gone was written some time before: it counts for
        # the last step seen, not for timing.
        gone = not self.alive
        out: list[dict] = []
        for e in self._follower.poll():  # what the script reported through cockpit.report
            if e["type"] == "progress":
                out += self._progressed(self._tracker.reported(e), now, t, gone)
            elif e["type"] == "eval" and e.get("source") == "report":
                self._tracker.saw_reported_eval()
        # read to its end once it is gone: nothing more will be written
        for observation in self._output.observe(to_end=gone)[1]:
            out += self._progressed(self._tracker.parsed(observation, t), now, t, gone)
        return out + self._on_time(now, t, gone)

    def _progressed(self, produced: list[tuple[str, dict]], now: float, t: float,
                    gone: bool = False) -> list[dict]:
        """After each thing the tracker was told: the first step, windows, trials, faults."""
        tracker = self._tracker
        assert tracker is not None  # called with what it produced
        out: list[dict] = []
        step = tracker.step
        if gone:
            return out
        if step is not None and step >= 1 and self._ready_at is None:
            out += self._ready(now, t)
        if step is not None:
            self._last_live = (now, step, tracker.samples_seen or 0.0)  # the probe's units say a step
        for kind, fields in produced:
            if kind != "step" or self._trial is not None:
                continue  # evals are not timed; a batch trial times itself (below)
            if self._ready_at is None or self._warm_until is None \
                    or t - fields["window_s"] < self._warm_until:
                out.append({"type": "probe_warmup", "step": fields["step"], "seconds": fields["window_s"],
                            "samples": round(fields["samples_per_s"] * fields["window_s"], 3)})
            else:
                out.append({"type": "step", **fields})
        trial = self._trial
        if trial and "t" in trial and not trial["done"] and step is not None:
            if step - trial["step"] >= TRIAL_MIN_STEPS and now - trial["t"] >= self.trial_s:
                out.append(self._trial_end())
        if step is not None:
            self._deliver_faults(step)
        return out

    def _ready(self, now: float, t: float) -> list[dict]:
        launch, tracker = self._launch, self._tracker
        assert launch is not None and tracker is not None and self._spawned is not None  # it runs
        self._ready_at = now
        self.startup_s = now - self._spawned
        out = [{"type": "trainer_ready", "device": launch.device, "precision": launch.precision,
                "threads": self._threads, "startup_s": round(self.startup_s, 3),
                "command_line": shlex.join(launch.argv),
                "samples_per_step": tracker.units.samples_per_step}]
        if self._trial is not None:
            self._trial.update(t=now, step=tracker.step, samples=tracker.samples_seen)
            out.append({"type": "batch_trial", "batch": self._trial["batch"], "phase": "start",
                        "step": tracker.step})
        elif self._until is not None:
            left = max(0.0, self._until - t)
            self._warm_until = t + WARMUP_SHARE * left
            tracker.report_every_s = max(MIN_WINDOW_S, (1 - WARMUP_SHARE) * left / WINDOWS)
        return out

    def _trial_end(self) -> dict:
        """The trial measured from its first step to the last step seen while it ran."""
        trial, live = self._trial, self._last_live
        assert trial is not None and live is not None and self._spawned is not None  # in a trial
        trial["done"] = True
        now, step, samples = live
        seconds = max(1e-9, now - trial["t"])
        return {"type": "batch_trial", "batch": trial["batch"], "phase": "end", "step": step,
                "first_step_s": round(trial["t"] - self._spawned, 4),
                "step_s": round(seconds / max(1, step - trial["step"]), 5),
                "samples_per_s": round(max(0.0, samples - trial["samples"]) / seconds, 3),
                # A command's device memory is not visible from here (no torch in its process
                # from our side): the finder judges it from its RSS, pressure, swap and crashes.
                "peak": {}, "device_memory": {}}

    def _on_time(self, now: float, t: float, gone: bool) -> list[dict]:
        """What the clock and the tracker's state decide: a NaN loss, the slow fault, the end
        of its time, a trial cut short by the script finishing."""
        out: list[dict] = []
        tracker, proc = self._tracker, self.proc
        assert tracker is not None and proc is not None  # started
        if tracker.non_finite and not self.of_type("numerical") and not gone:
            # As the supervisor does: a NaN loss ends the run, classified `numerical`.
            bad = tracker.non_finite
            out.append({"type": "numerical", "step": bad["step"], "message": bad["message"]})
            self._signal_group(signal.SIGKILL)
            return out
        if self._slowed and not gone:
            faults.throttle(proc.pid, now)
        if self._until is not None and t >= self._until and not gone:
            out.append({"type": "probe_done", "steps": tracker.step, "peak": {}, "device_memory": {}})
            self.kill("time")
        trial = self._trial
        if gone and trial and "t" in trial and not trial["done"] and proc.returncode == 0 \
                and self._last_live is not None and self._last_live[1] > trial["step"]:
            out.append(self._trial_end())  # it finished before the trial's time was up
        return out

    def _deliver_faults(self, step: int) -> None:
        """The preset's signal faults due at this step, as the supervisor delivers them."""
        for fault in [f for f in self._faults if f.step is not None and f.step <= step]:
            self._faults.remove(fault)
            if self.proc is not None:
                self._slowed |= faults.deliver(fault, self.proc.pid)

    # ------------------------------------------------------------ how it went

    def _units(self, launch, preset: DevicePreset) -> Units:
        """A candidate's samples per step. A run never guesses them; the probe compares
        candidates that differ in {batch_size}, so where nothing else says, a step is taken
        to be its {batch_size} (the basis says so), else one (steps/s)."""
        units = launch.units
        if units.samples_per_step is None:
            guess = preset.batch_size if self._takes("batch_size") else 1
            units = dataclasses.replace(units, samples_per_step=guess, samples_source="placeholders")
        return units

    @property
    def unit(self) -> str:
        tracker = self._tracker
        if tracker is not None and tracker.samples is None and self._launch is not None \
                and tracker.units.samples_per_step == 1 \
                and not self._takes("batch_size", "effective_batch"):
            return "steps"
        return "samples"

    @property
    def basis(self) -> str:
        """How its samples/s was derived, in words (for the probe's sentence and JSON)."""
        tracker = self._tracker
        if tracker is None or tracker.step is None:
            return ""
        if tracker.samples is not None:
            return "samples/s from the samples it reported through cockpit.report"
        source = ("reported through cockpit.report" if tracker.source == "report"
                  else "read from " + SOURCES.get(tracker.source, "its output"))
        if self.unit == "steps":
            return (f"its arguments take no {{batch_size}}, so its figures are steps/s, {source}, "
                    "each step of a batch of its own")
        if self._takes("effective_batch") or self._takes("batch_size") and self._takes("accumulation"):
            return f"samples/s = its steps/s, {source}, x {{batch_size}} x {{accumulation}}"
        return f"samples/s = its steps/s, {source}, x its {{batch_size}}"

    def _takes(self, *names: str) -> bool:
        return bool(commands.used(self.config.workload.params) & set(names))

    def end(self) -> WorkerEnd:
        if self.proc is None:  # its turn never came, or its program could not be started
            tail = log_tail(self.log_path)
            if self._unstarted:
                sentence = f"The command could not be started: {self._unstarted}."
                return WorkerEnd(Verdict("config", sentence, {"message": sentence}), None, None,
                                 None, tail, config_error=sentence)
            return WorkerEnd(None, "probe", None, None, tail)
        return super().end()

    def _attempt_end(self, code: int | None, sig: str | None, tail: str) -> AttemptEnd:
        tracker = self._tracker
        return dataclasses.replace(super()._attempt_end(code, sig, tail), subject=COMMAND,
                                   last_step=tracker.step if tracker else None,
                                   device=self._launch.device if self._launch else None)

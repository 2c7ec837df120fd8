"""The probe's child process: a real Trainer, timed.

    python -m engine.probe.worker RUN_DIR --preset-json '{...}' [--batches --trial-s S]

It starts by importing torch and what a first optimizer pulls in (seconds on a cold machine,
the same for every candidate), says `worker_started`, and waits for its turn on stdin: the
probe starts every candidate's worker at once so that these imports overlap, then measures
one candidate at a time.

Then it builds exactly what a run builds (engine.train.trainer.Trainer: the workload, the model on
the device, autocast, accumulation, the optimizer) and trains with the trainer's own step,
so a probe's samples/s is what a run would report, minus evals and checkpoints.

Speed mode (stdin: `go UNTIL`, UNTIL a time.time()): train with the trainer's own step and
time its micro-batches (forward and backward of one micro-batch) through the trainer's
`micro_batch_hook`, not whole optimizer steps: on a slow CPU one step of the `cpu` preset
(8 x 64 = 512 samples) can outlast the candidate's whole slice, while its micro-batches take
seconds. Each timing ends with a device sync (MicroBatchClock); the optimizer step is timed on
its own where a group completes. The first quarter of the time left is warm-up (the first
steps pay for kernel selection, graph compilation, caches), `probe_warmup` events, so a
candidate too slow to be timed after it still has a rough figure; then `probe_timing` events
until UNTIL, stopping in the middle of a group if need be. engine.probe.timings makes
samples/s and its confidence interval of them.

Batch mode (stdin: one micro-batch size per line, then `done`): a short trial of each
(accumulation 1), answered with `batch_trial` events; the parent decides from its memory
readings whether the batch fits and sends the next size, or kills the process.

A crash is left to happen: the parent classifies it like any attempt's (engine.run.crashes).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time
from pathlib import Path

import psutil
import torch

from engine import presets
from engine.monitor import device as devices
from engine.train import parity
from engine.vocabulary import EXIT_FINISHED
from engine.event_types import ProbeWarmupFields
from engine.record.events import EventWriter
from engine.probe import MAX_TIMINGS, TIMING_S, TRIAL_MIN_STEPS, TRIAL_S, WARMUP_SHARE
from engine.probe.timings import Timing, estimate
from engine.record.rundir import RunDir
from engine.train.failures import NonFiniteLoss, report_failure
from engine.train.trainer import StopRequest, Trainer


def _synced_step(trainer: Trainer) -> float:
    started = time.monotonic()
    trainer.train_step()
    devices.synchronize(trainer.device)
    return time.monotonic() - started


class TimeUp(Exception):
    """The candidate's time is up in the middle of an accumulation group."""


class MicroBatchClock:
    """Times the trainer's micro-batches through its `micro_batch_hook`, as `Timing`s
    (engine.probe.timings): each ends with a device sync, once it has lasted `timing_s`
    (TIMING_S; longer in a long slice, so that there are at most MAX_TIMINGS).

    A long micro-batch is timed alone, and so is the optimizer step that follows a group's last
    one; micro-batches shorter than `timing_s` are timed in runs inside their group, and steps
    shorter than it whole, several to a timing (a sync per micro-batch would stop a GPU's host
    from queueing ahead, which a run's loop does). Warm-up timings (those before `warm_until`,
    and the ones holding the first micro-batch or the first optimizer step: kernel selection,
    caches, the optimizer's state) are `probe_warmup` events, the others `probe_timing`."""

    def __init__(self, trainer: Trainer, warm_until: float, until: float, timing_s: float = TIMING_S):
        self.trainer, self.warm_until, self.until, self.timing_s = trainer, warm_until, until, timing_s
        self.micro = self.steps = 0    # in the open timing
        self.inside = False            # it began inside a group (after a micro-batch)
        self.first_micro = self.first_step = True
        self.timings: list[Timing] = []  # after warm-up
        self.warmup: list[Timing] = []
        self.micro_s = 0.0             # the last micro-batch's duration, roughly (no sync)
        self.done = 0                  # micro-batches so far
        self._last = self.mark = 0.0

    def start(self) -> None:
        devices.synchronize(self.trainer.device)
        self._last = self.mark = time.monotonic()
        self.trainer.micro_batch_hook = self.after_micro_batch

    def after_micro_batch(self, done: int, of: int) -> None:
        now = time.monotonic()
        self.micro_s, self._last = now - self._last, now
        self.micro += 1
        self.done += 1
        if not self.steps and ((self.inside and done == of) or now - self.mark >= self.timing_s):
            self._close()
            self.inside = True  # the next timing is the group's rest, or its optimizer step
        if done < of and self.no_time_left():
            raise TimeUp

    def no_time_left(self) -> bool:
        """Another micro-batch as long as the last would end after `until`. Not judged by the
        first, whose one-time costs (a compile: minutes) the next does not pay."""
        return self.done > 1 and time.time() + self.micro_s > self.until

    def after_step(self) -> None:
        self._last = time.monotonic()
        self.steps += 1
        if not self.micro or (not self.inside and self._last - self.mark >= self.timing_s):
            self._close()
            self.inside = False

    def _close(self) -> None:
        devices.synchronize(self.trainer.device)
        now = time.monotonic()
        timing = Timing(now - self.mark, self.micro, self.steps)
        warm = now < self.warm_until or (self.first_micro and self.micro) or (self.first_step and self.steps)
        self.first_micro = self.first_micro and not self.micro
        self.first_step = self.first_step and not self.steps
        (self.warmup if warm else self.timings).append(timing)
        trainer = self.trainer
        fields = ProbeWarmupFields(step=trainer.step, seconds=round(timing.seconds, 5),
                                   micro_batches=self.micro, steps=self.steps,
                                   samples=self.micro * trainer.preset.batch_size)
        if warm:
            trainer.events.emit("probe_warmup", **fields)
        else:  # the figure so far, for a front end to show while it measures
            so_far = estimate(self.timings, trainer.preset.batch_size, trainer.preset.accumulation)
            trainer.events.emit("probe_timing", **fields,
                                samples_per_s=round(so_far.samples_per_s, 4) if so_far else None)
        self.micro = self.steps = 0
        self.mark = self._last = time.monotonic()


def measure_speed(trainer: Trainer, until: float) -> None:
    """Warm up for a quarter of the time left, then time micro-batches until `until`
    (time.time()): `probe_warmup` and `probe_timing` events (MicroBatchClock)."""
    left = until - time.time()
    # Timings of at least TIMING_S, and no more than MAX_TIMINGS of them in a long slice.
    clock = MicroBatchClock(trainer, time.monotonic() + WARMUP_SHARE * left, until,
                            timing_s=max(TIMING_S, left / MAX_TIMINGS))
    clock.start()
    try:
        while True:
            trainer.train_step()
            clock.after_step()
            trainer.maybe_report()  # the run's loss check (a NaN is a crash here too)
            if clock.no_time_left():
                break
    except TimeUp:
        pass  # in the middle of a group: what was timed is the measurement
    finally:
        trainer.micro_batch_hook = None


def batch_trials(trainer: Trainer, lines, trial_s: float) -> None:
    """One trial per micro-batch size read from `lines`, until the parent says 'done'."""
    emit = trainer.events.emit
    for line in lines:
        text = line.strip()
        if text == "done" or not text:
            return
        batch = int(text)
        if batch > trainer.workload.num_samples:
            emit("batch_trial", batch=batch, phase="skipped", num_samples=trainer.workload.num_samples)
            continue
        trainer.use_micro_batch(batch)
        if trainer.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(trainer.device)
        emit("batch_trial", batch=batch, phase="start")
        first = _synced_step(trainer)
        timed, steps = 0.0, 0
        while steps < TRIAL_MIN_STEPS or timed < trial_s:
            timed += _synced_step(trainer)
            steps += 1
        if not all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters()):
            raise NonFiniteLoss(trainer.step, f"non-finite weights at batch {batch}")
        emit("batch_trial", batch=batch, phase="end", first_step_s=round(first, 4),
             step_s=round(timed / steps, 5), samples_per_s=round(batch * steps / timed, 3),
             threads=torch.get_num_threads(),
             peak=devices.peak_memory_mb(trainer.device), device_memory=devices.memory(trainer.device))


def _preload() -> None:
    """Import what the first optimizer and backward pull in (torch._dynamo and friends:
    seconds, cold), while the other candidates' workers do the same."""
    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.AdamW([weight])
    weight.sum().backward()
    optimizer.step()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.probe.worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--preset-json", required=True)
    parser.add_argument("--batches", action="store_true", help="batch trials, sizes from stdin")
    parser.add_argument("--trial-s", type=float, default=TRIAL_S)
    parser.add_argument("--preset-name", default="probe", help="the preset's name, for its errors")
    parser.add_argument("--parity", choices=("also", "only"),
                        help="check the device against the CPU (engine.train.parity) before "
                             "measuring, or only that (exit 5 when its numbers are wrong)")
    args = parser.parse_args(argv)

    faulthandler.enable()  # a native crash leaves its Python stack as evidence
    run = RunDir(args.run_dir)
    with EventWriter(run.events_path, attempt=1) as events:
        _preload()
        events.emit("worker_started", imports_s=round(time.time() - psutil.Process().create_time(), 3))
        until = None
        if not args.batches and args.parity != "only":
            words = sys.stdin.readline().split()
            if len(words) != 2 or words[0] != "go":
                return EXIT_FINISHED  # the probe ended before this candidate's turn
            until = float(words[1])
        started = time.monotonic()
        trainer = None
        try:
            preset = presets.device_from_table(json.loads(args.preset_json), "probe candidate")
            trainer = Trainer(run, events, args.preset_name, preset, StopRequest())
            ready = trainer.describe()
            ready["startup_s"] = round(time.monotonic() - started, 3)
            events.emit("trainer_ready", **ready)
            trainer.faults.before_step(0)
            if args.parity == "only":
                trainer.check_parity()  # raises ParityFailure: exit 5, the parity event written
                return EXIT_FINISHED
            if args.parity == "also":  # a column of the probe's table: the speed is measured anyway
                checked = parity.check(trainer, perturb=trainer.faults.wrong_grad)
                events.emit("parity", **checked.event())
                if until is not None:
                    until += checked.seconds  # the parent lengthens the slice by as much
            if args.batches:
                batch_trials(trainer, sys.stdin, args.trial_s)
            else:
                assert until is not None  # read from the "go" line above
                measure_speed(trainer, until)
            events.emit("probe_done", steps=trainer.step, peak=devices.peak_memory_mb(trainer.device),
                        device_memory=devices.memory(trainer.device))
        except Exception as e:
            return report_failure(events, e, trainer.step if trainer else None)
    return EXIT_FINISHED


if __name__ == "__main__":
    sys.exit(main())

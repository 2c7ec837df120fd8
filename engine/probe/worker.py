"""The probe's child process: a real Trainer, timed.

    python -m engine.probe.worker RUN_DIR --preset-json '{...}' [--batches --trial-s S]

It starts by importing torch and what a first optimizer pulls in (seconds on a cold machine,
the same for every candidate), says `worker_started`, and waits for its turn on stdin: the
probe starts every candidate's worker at once so that these imports overlap, then measures
one candidate at a time.

Then it builds exactly what a run builds (engine.train.trainer.Trainer: the workload, the model on
the device, autocast, accumulation, the optimizer) and trains with the trainer's own step,
so a probe's samples/s is what a run would report, minus evals and checkpoints.

Speed mode (stdin: `go UNTIL`, UNTIL a time.time()): warm up (the first steps pay for kernel
selection, graph compilation, caches) for a quarter of the time left, then train in timed
windows until UNTIL; each window ends with the trainer's own report (its loss read is the
sync point) and becomes a `step` event. Warm-up steps are synced one by one and reported as
`probe_warmup`, so a candidate too slow to reach a window still has a rough figure.

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
from engine.train import device as devices, parity
from engine.run.crashes import EXIT_FINISHED
from engine.run.events import EventWriter
from engine.probe import MIN_WINDOW_S, TRIAL_MIN_STEPS, TRIAL_S, WARMUP_SHARE, WINDOWS
from engine.run.rundir import RunDir
from engine.train.trainer import NonFiniteLoss, StopRequest, Trainer, report_failure

WARMUP_MIN_STEPS = 2


def _synced_step(trainer: Trainer) -> float:
    started = time.monotonic()
    trainer.train_step()
    devices.synchronize(trainer.device)
    return time.monotonic() - started


def measure_speed(trainer: Trainer, until: float) -> None:
    """Warm up, then timed windows until `until` (time.time()), as `step` events."""
    emit = trainer.events.emit
    ready = time.monotonic()
    left = until - time.time()
    warm_until = ready + WARMUP_SHARE * left
    step_times = []
    while len(step_times) < WARMUP_MIN_STEPS or time.monotonic() < warm_until:
        seconds = _synced_step(trainer)
        step_times.append(seconds)
        emit("probe_warmup", step=trainer.step, seconds=seconds,
             samples=trainer.global_batch)
        if time.time() + seconds > until:
            break
    # Windows of an eighth of what is left; each starts clean (the losses of warm-up are not
    # the measurement's, nor is their time).
    trainer.restart_window(max(MIN_WINDOW_S, (until - time.time()) / WINDOWS))
    typical = sorted(step_times)[len(step_times) // 2]
    while time.time() + typical < until:
        trainer.train_step()
        trainer.maybe_report()
    trainer.report()


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
            events.emit("trainer_ready", **trainer.describe(),
                        startup_s=round(time.monotonic() - started, 3))
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
                measure_speed(trainer, until)
            events.emit("probe_done", steps=trainer.step, peak=devices.peak_memory_mb(trainer.device),
                        device_memory=devices.memory(trainer.device))
        except Exception as e:
            return report_failure(events, e, trainer.step if trainer else None)
    return EXIT_FINISHED


if __name__ == "__main__":
    sys.exit(main())

"""The trainer: one process, one attempt.

    python -m engine.train.trainer RUN_DIR --attempt N --preset NAME --device-json '{...}'

It resolves the device once, resumes from the run's latest checkpoint (by samples seen, so
a different batch size or accumulation continues at the same sample), trains until the
schedule is done or it is asked to stop (SIGTERM/SIGINT: finish the step, checkpoint,
exit), and reports through events.jsonl. The loss stays on the device and is read once per
reporting window: that read is the only host-device sync in the loop.

Failures are reported for the supervisor to classify (engine.run.crashes): a Python exception
becomes an `exception` event and exit 1; a non-finite loss a `numerical` event and exit 4
(no checkpoint is ever written from a non-finite state); a native crash leaves only its
signal and, through faulthandler, the Python stack it happened in.

Exit codes: 0 finished, 1 failed, 2 bad configuration, 3 stopped on request, 4 numerical,
5 wrong numbers in the parity check (the preset's parity_check, engine.train.parity).

The loop is here: set up, train a step, evaluate, prepare an epoch, report, checkpoint. Beside
it: the reporting window and the time that is not training (engine.train.window), when to
checkpoint (engine.train.cadence), resuming from the newest checkpoint that loads
(engine.train.restore), what went wrong and its exit code (engine.train.failures).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import faulthandler
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from engine import presets, workloads
from engine.emit import Emit
from engine.event_types import StepFields, TrainerReadyFields
from engine.monitor import device as devices
from engine.presets import DevicePreset
from engine.record import reached
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.train import cadence, checkpointer, compiling, optim, parity, peaks, startup, threads
from engine.train.cadence import Cadence
from engine.train.data import SampleOrder
from engine.train.distributed import World
from engine.train.failures import (NonFiniteLoss, checked_loss,
                                   refuse_unreachable_faults, report_failure, step_set_by)
from engine.train.faults import DIVERGE, SPIKE, Injector
from engine.train.saving import Saving
from engine.train.window import Window, grad_norm
from engine.vocabulary import EXIT_FINISHED, EXIT_STOPPED
from engine.workloads.builtin import BUILTIN


class StopRequest:
    """Set by SIGTERM/SIGINT; the loop finishes its step, checkpoints and exits."""

    def __init__(self):
        self.requested = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        if self.requested:  # asked twice: stop now, without a checkpoint
            raise KeyboardInterrupt
        self.requested = True


class Trainer(Saving):
    # Measure each step's gradient norm (the step event's grad_norm, grad_norm_max): off only
    # for benchmarks/instruments.py, which times the loop without it.
    grad_norms = True

    def __init__(self, run: RunDir, events: EventWriter, preset_name: str, preset: DevicePreset,
                 stop: StopRequest | None = None, rewind: tuple[int, float] = (0, 1.0)):
        """`rewind`: (batches to skip, a factor of the learning rate) asked of the checkpoint it
        resumes from by the run's rewinds to it (engine.run.rewind)."""
        self.clock = startup.Clock()   # its set-up timed by phase, for trainer_ready
        config = run.config()
        self.stop = stop or StopRequest()
        self.run, self.events = run, events
        self.preset = preset
        self.train = config.workload.train
        self.resolved = devices.resolve(preset, where=f"device preset {preset_name!r}")
        self.device = self.resolved.device
        self.world = World.from_env(self.device.type)
        if self.world.size > 1 and self.device.type == "cuda":
            self.device = torch.device("cuda", self.world.local_rank)
            torch.cuda.set_device(self.device)
        devices.make_ready(self.device)
        # Rank 0 speaks for the run (evals, checkpoints); each machine's local rank 0 for its
        # machine (its start, its steps: the supervisor there reads them); the other ranks only
        # heartbeat (and report their own exceptions, from main()). Injected faults hit rank 0.
        quiet: Emit = lambda *a, **k: None   # noqa: E731
        self.emit: Emit = events.emit if self.world.is_main else quiet
        self.say: Emit = events.emit if self.world.speaks else quiet
        # Each step as it is done, for the supervisor to read after any death (a report is
        # every half second): the machine's speaker's, as its events are.
        self.reached = reached.Publisher(reached.path_of(run.path, events.attempt)) \
            if self.world.speaks else None
        self.faults = Injector(preset.inject if self.world.is_main else (), self.device.type, self.emit)
        self.global_batch = preset.effective_batch * self.world.size
        if preset.threads:
            torch.set_num_threads(preset.threads)
        # On the CPU, fewer threads while other processes hold the cores, as many again once
        # they are free (engine.train.threads); the count just set is the most
        self.threads = threads.Adapter.for_run(preset, self.device, self.say)

        self.clock.lap("device")

        devices.seed_everything(self.train.seed)
        self.name = config.workload.workload
        # what a spare built ahead is taken by this key (engine.train.startup)
        key = startup.workload_key(self.name, config.workload.params, self.train.seed)
        self.workload = self._build_workload(config.workload.params, key)
        workloads.check_batch(preset, self.workload.num_samples, *step_set_by(config.overrides, preset, preset_name))
        self.clock.lap("data")
        self.model, forward = self._build_model(key, preset)
        self.ddp = None
        if self.world.size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        wrapped = self.ddp or self.model
        # the whole model, or each of its repeated blocks where the workload names them
        # (not `forward or ...`: a compiled module's truth is its len(), which most models lack)
        self.forward = forward if forward is not None else compiling.compiled_forward(wrapped, self.workload, preset)
        # The workload's own optimizer (and scheduler), or the one [train] describes.
        own = optim.from_workload(self.workload, config.workload.workload, self.model, self.train)
        self.scheduler: Any
        self.optimizer, self.scheduler = own or (optim.build(self.model, self.train, self.device), None)
        self.peak_lrs = [g["lr"] for g in self.optimizer.param_groups]  # what the schedule scales
        self.lr = self.peak_lrs[0]
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.resolved.precision == "fp16")
        self.clock.lap("model")
        self.order = SampleOrder(self.workload.num_samples, self.train.seed)
        self.total_samples = max(1, round(self.train.epochs * self.workload.num_samples))
        # The first attempt's global batch (kept in every checkpoint, whatever run.toml says by
        # then): max_steps counts steps of it, a budget of samples, so a fallback to another
        # batch trains the same samples, not the same number of steps.
        self.first_global_batch = config.device.effective_batch * config.device.world_size

        self.step = 0
        self.samples_seen = 0      # trained: the schedule, the budget and the ETA count these
        # Where the data is, past what was trained: the batches rewinds skipped (the position
        # in the data is samples_seen + skipped_samples), and the learning rate's factor since
        # lower-lr rewinds; both kept in every checkpoint.
        self.skipped_samples, self.lr_scale = 0, 1.0
        self.resumed_from = self._resume()
        self.clock.lap("resume")
        if rewind != (0, 1.0):
            self._skip(*rewind)
        if self.train.max_steps:
            self.total_samples = min(self.total_samples, self.train.max_steps * self.first_global_batch)
        self.total_steps = self.step + math.ceil(
            max(0, self.total_samples - self.samples_seen) / self.global_batch)
        if events.attempt == 1 and not self.resumed_from:
            refuse_unreachable_faults(config, preset_name, self.faults, self.workload.num_samples)
        # Warmup counts steps of the first attempt's global batch too: the curve is one of samples.
        self.schedule = optim.Schedule.of(self.train, self.first_global_batch, self.total_samples)
        self._saved_step = self.step if self.resumed_from else None  # the step on disk (or being written)
        # Checkpoints are written by a thread of their own from a host copy of the state, one at
        # a time (engine.train.checkpointer); each is told once complete on disk. When: the
        # preset's interval, or with 'auto' the one chosen from the saves measured and the
        # crash rate on this device (engine.train.cadence).
        # With a health rule that rewinds, one checkpoint at least rewind_steps old is kept too,
        # whatever keep_checkpoints prunes: a spike always has one to go back to.
        health = config.device.health   # the run's, as the supervisor's detectors have it
        self.checkpoints = checkpointer.Writer(
            self.run.checkpoints, keep=self.train.keep_checkpoints,
            keep_before=max(1, health.rewind_steps) if health.rewinds else 0)
        self.cadence = Cadence(self.train, cadence.crash_history(self.run, self.device.type)
                               if self.train.checkpoint_every_steps == "auto" else (0, 0.0))
        self._last_checkpoint_t = time.monotonic()
        self._prepared_epoch = -1
        # Rates over training time only: evals, epoch preparation and checkpoints move the
        # window's start past themselves, and are added to the ETA as costs of their own.
        self.window = Window(self.device, self.train.report_every_s, time.monotonic())
        self.peak = peaks.device_peak(self.device, self.resolved.precision)  # (TFLOP/s, GPU) for MFU
        self._last_heartbeat = time.monotonic()
        # called with (done, of) after each micro-batch (the probe)
        self.micro_batch_hook: Callable[[int, int], None] | None = None
        self._first_step_s: float | None = None     # this attempt's first step, timed
        self._first_step_at = 0.0                   # ... when it ended (time.time())
        self._first_told = False                    # ... and said in a step event
        self.stopping = False                        # a stop agreed by every rank (should_continue)

    def _build_workload(self, params: Any, key: str) -> Any:
        """The run's workload, built here or by the spare this process was (seeded as here:
        the model draws from the random state the build left, as it would have)."""
        ahead = startup.take_workload(key)
        if ahead is None:
            return workloads.build(self.name, params, self.train.seed)
        workload, after = ahead
        devices.set_rng_state(after)
        return workload

    def _build_model(self, key: str, preset: DevicePreset) -> tuple[nn.Module, nn.Module | None]:
        """The model on its device, and its compiled forward where the spare this process was
        built and compiled it (engine.train.startup; None: compiled below, if at all)."""
        if self.world.size == 1 and (compiled := startup.take_model(key, preset)) is not None:
            model, forward, after = compiled
            devices.set_rng_state(after)
            return model, forward
        return self.workload.build_model(grad_checkpointing=preset.grad_checkpointing).to(self.device), None

    # ------------------------------------------------------------ the loop

    def fit(self) -> str:
        """Train to the end of the schedule or to a stop request: 'finished' or 'stopped'."""
        self.clock.lap("setup")
        ready = self.describe()
        ready["startup"] = self.clock.fields()
        self.say("trainer_ready", **ready)
        self.faults.before_step(0)
        if self.preset.parity_check:
            self.check_parity()
        self.window.start = time.monotonic()   # training starts here: start-up ends
        while self.should_continue():
            started = time.monotonic() if self._first_step_s is None else None
            self.train_step()
            if started is not None:   # compiling happens in it (host time: the compile's)
                self._first_step_s = time.monotonic() - started
                self._first_step_at = time.time()   # the end of start-up (benchmarks/startup.py)
            self.maybe_report()
            self.maybe_eval()
            self.maybe_checkpoint()
        self.report()
        if self.stopping and self.step < self.total_steps:
            self.save_checkpoint()
            self.finish_checkpoints()
            return "stopped"
        if self.train.eval_every_steps == 0 or self.step % self.train.eval_every_steps:
            self.evaluate()
        self.save_checkpoint()
        self.finish_checkpoints()   # the last one complete on disk before the attempt ends
        return "finished"

    def should_continue(self) -> bool:
        # Every rank must stop at the same step: a stop request reaching one of them is shared
        # over a host-side group (no device sync).
        # What was agreed is kept: a rank whose own signal has not come yet (another machine's
        # stop, or torchrun restarting the others) must take the stop path too, not the end's.
        self.stopping = self.stopping or self.world.any(self.stop.requested)
        return self.step < self.total_steps and not self.stopping

    def train_step(self) -> None:
        """One optimizer step over the global group of samples: `accumulation` micro-batches
        on each rank (fewer at the very end)."""
        if self.checkpoints.in_flight and self.faults.due(self.step + 1):
            # A rehearsed crash (`kind@step`) fires with the checkpoints before it on disk, as
            # when they were written in the loop, whatever the machine's speed: the same
            # resume, the same steps lost. (A real crash mid-write loses the write in flight.)
            self.finish_checkpoints()
        self.faults.before_step(self.step + 1)
        group = min(self.global_batch, self.total_samples - self.samples_seen)
        first, mine = self.world.share(self.data_position, group)
        micro_batches = self.world.micro_batches(group, self.preset.batch_size)
        for m in range(micro_batches):
            start = m * self.preset.batch_size
            n = max(0, min(self.preset.batch_size, mine - start))
            # A rank whose share ran out still takes part in the gradient all-reduce, with a
            # sample weighted zero.
            position = first + start if n else first
            self.maybe_prepare_epoch(self.order.epoch_of(position))
            batch = self.workload.batch(self.order.indices(position, max(n, 1)), self.device)
            sync = self.ddp is None or m == micro_batches - 1
            # A short micro-batch (the data's last) runs eagerly: compiled, its new shape would be
            # compiled again, 85 s for trm-chat-small on the H100, for one micro-batch.
            forward = self.forward if n == self.preset.batch_size else (self.ddp or self.model)
            with self.ddp.no_sync() if self.ddp is not None and not sync else contextlib.nullcontext():
                with self.resolved.autocast():
                    loss = checked_loss(self.workload.loss(forward, batch), self.name, self.workload)
                if self.faults.poison_loss:
                    loss = loss * float("nan")
                elif self.faults.spiking:
                    loss = loss * SPIKE
                # Weight each micro-batch by its share of the group: the step's gradient is the
                # mean over all its samples, whatever the split into micro-batches and ranks
                # (DDP averages over ranks, hence the world size).
                self.scaler.scale(loss * (n / group * self.world.size)).backward()
            if n:
                self.window.keep_loss(loss.detach(), n)
            self.after_micro_batch(m + 1, micro_batches)
        if self.faults.wrong_grad:
            parity.perturb_gradients(self.model)
        norm = self.clip_and_measure()
        self.set_lr(self.samples_seen + group)
        if self.faults.diverging:   # rehearsed: the rate far too high (a scheduler resets it each step)
            for param_group in self.optimizer.param_groups:
                param_group["lr"] *= DIVERGE
        self.lr = self.optimizer.param_groups[0]["lr"]  # this step's, for its report
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.samples_seen += group
        if self.reached is not None:
            self.reached.publish(self.step, self.samples_seen)
        self.window.count(group, norm)

    def clip_and_measure(self) -> torch.Tensor | None:
        """The step's gradient, clipped where train.grad_clip says, and its total L2 norm
        before clipping (unscaled under fp16's GradScaler), a 0-d device tensor that the window
        keeps until its report reads it: no sync. Clipping measures it already (no second
        norm); else it is one foreach norm over the gradients (benchmarks/instruments.py
        measures it), skipped where `grad_norms` is off. Under DDP the gradient is already
        all-reduced: each rank's norm is the global one."""
        if not self.train.grad_clip and not self.grad_norms:
            return None
        # The true gradient: fp16's scaled one unscaled (once: scaler.step does not again)
        self.scaler.unscale_(self.optimizer)
        if self.train.grad_clip:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train.grad_clip)
            return norm if self.grad_norms else None
        return grad_norm(self.model.parameters())

    def after_micro_batch(self, done: int, of: int) -> None:
        """A long accumulation group is still a sign of life: the supervisor's hang watch sees a
        `heartbeat` at most once per report interval while micro-batches complete (no device
        sync: on a GPU it says the host is queueing work, which a wedged kernel stops too). The
        probe replaces `micro_batch_hook` to time micro-batches."""
        if self.micro_batch_hook is not None:
            self.micro_batch_hook(done, of)
        self.faults.check_time()  # a timed fault, mid-group: a long group must not hold it back
        now = time.monotonic()
        if self.threads is not None:  # between ops, where torch's thread count may change
            self.threads.tick(now, self.step)
        if done < of and now - self._last_heartbeat >= self.train.report_every_s:
            self._last_heartbeat = now
            self.say("heartbeat", rank=self.world.rank, step=self.step, micro_batches=done, of=of)

    def check_parity(self) -> parity.Parity:
        """The device against the CPU on the next micro-batch (engine.train.parity); a wrong
        result ends the attempt as a numerical-parity crash, before anything is trained."""
        result = parity.check(self, perturb=self.faults.wrong_grad)
        self.emit("parity", **result.event())
        if not result.ok:
            raise parity.ParityFailure(result)
        return result

    def set_lr(self, samples: int) -> None:
        """The learning rate of the step that ends at `samples` seen: the schedule's factor of
        each group's peak (a workload's own scheduler sets it instead)."""
        if self.scheduler is not None:
            return
        factor = self.schedule.factor(samples) * self.lr_scale
        for group, peak in zip(self.optimizer.param_groups, self.peak_lrs):
            group["lr"] = peak * factor

    def maybe_prepare_epoch(self, epoch: int) -> None:
        """Let the workload prepare an epoch with the current model (e.g. mine negatives)."""
        if epoch == self._prepared_epoch:
            return
        self._prepared_epoch = epoch
        if self.preset.empty_cache == "every-epoch":
            devices.empty_cache(self.device)
        prepare = getattr(self.workload, "prepare_epoch", None)
        if prepare is None:
            return
        if self.preset.empty_cache == "before-mining":
            devices.empty_cache(self.device)
        once = 0.0

        def emit(kind: str, attempt: int | None = None, **fields: Any) -> None:
            nonlocal once
            # twotower's faiss index is built once per attempt: not a cost of every epoch
            once += fields.get("index_build_s") or 0.0
            # a pass-through: the workload's own call is checked, against Emit
            self.emit(kind, attempt, **fields)  # type: ignore[call-overload]

        started = time.monotonic()
        self.model.eval()
        with torch.no_grad(), self.resolved.autocast():
            # the model itself: per rank, outside DDP's collectives, and eagerly (see evaluate)
            prepare(self.model, epoch, self.device, emit)
        self.model.train()
        # not training throughput; the next epochs are expected to cost what this one did
        self.window.prepared(time.monotonic() - started, once)

    def maybe_report(self) -> None:
        if time.monotonic() - self.window.start >= self.train.report_every_s:
            self.report()

    def report(self) -> None:
        """Emit a step event for the window: the loop's one host-device sync."""
        w = self.window
        if not w.steps:
            return
        figures = w.read()  # the sync point
        loss = figures.loss
        if not math.isfinite(loss):
            bad = f", {figures.nonfinite} of them non-finite" if figures.nonfinite else ""
            raise NonFiniteLoss(self.step, f"loss {loss} over the last {w.steps} steps{bad}")
        elapsed = w.measure(time.monotonic())
        steps_per_s = w.steps / elapsed
        samples_per_s = w.samples / elapsed
        event = StepFields(
            step=self.step, from_step=self.step - w.steps, total=self.total_steps,
            samples_seen=self.samples_seen,
            total_samples=self.total_samples, epoch=self.order.epoch_of(max(0, self.data_position - 1)),
            loss=loss, lr=self.lr,
            samples_per_s=round(samples_per_s, 3), steps_per_s=round(steps_per_s, 4),
            window_s=round(elapsed, 4), eta_s=round(self.eta_s(), 1),
            smoothed_samples_per_s=round(w.meter.samples_per_s or 0.0, 3),
            best_samples_per_s=round(w.meter.best_samples_per_s or 0.0, 3),
            device_memory=devices.memory(self.device),
        )
        # The instruments (issue 38): the largest step loss, the gradient norm's mean and
        # largest, the steps that were not finite (an fp16 step the scaler skipped included)
        if figures.loss_max is not None:
            event["loss_max"] = figures.loss_max
        if figures.grad_norm is not None and figures.grad_norm_max is not None:
            event["grad_norm"], event["grad_norm_max"] = figures.grad_norm, figures.grad_norm_max
        if figures.nonfinite:
            event["nonfinite"] = figures.nonfinite
        if self.workload.flops_per_sample:
            event["gflop_s"] = round(samples_per_s * self.workload.flops_per_sample / 1e9, 2)
            if self.peak is not None:  # model FLOP utilisation of every rank's GPU together
                event["mfu"] = round(event["gflop_s"] / (self.peak[0] * 1e3 * self.world.size), 4)
        if not self._first_told and self._first_step_s is not None:
            self._first_told = True
            event["first_step_at"] = round(self._first_step_at, 3)
            if self.preset.compile:
                # What compiling cost: the first step's time beyond a step's (the window's
                # others); the window's rates keep it, the run's goodput moves it to its
                # compile bucket.
                others = (elapsed - self._first_step_s) / (w.steps - 1) if w.steps > 1 else 0.0
                event["compile_s"] = round(max(0.0, self._first_step_s - others), 3)
        if elapsed < self.train.report_every_s:
            # Cut short by a checkpoint or the end: a few steps' rate, too noisy to show or to
            # count as a best (the run's averages still count its samples and time).
            event["partial"] = True
        if self.world.speaks:
            self.events.emit("step", **event)
        else:
            self.events.emit("heartbeat", rank=self.world.rank, step=self.step, pid=os.getpid())
        w.restart(time.monotonic())

    def eta_s(self) -> float:
        """Remaining steps at the smoothed rate of training time (engine.monitor.throughput),
        plus the evals still to come at their average cost so far and the epoch preparations
        (mining) at the last one's. The rate is measured between reports, whose loss read is a
        sync point, so it holds on a GPU with no per-step sync."""
        every = self.train.eval_every_steps
        evals_left = 1 if not every else (self.total_steps // every - self.step // every
                                          + (1 if self.total_steps % every else 0))
        last_epoch = self.order.epoch_of(self.total_samples - 1)
        epochs_left = max(0, last_epoch - self._prepared_epoch)  # each is prepared once
        return self.window.seconds_left(self.total_steps - self.step, evals_left, epochs_left)

    def maybe_eval(self) -> None:
        every = self.train.eval_every_steps
        if every and self.step % every == 0:
            self.evaluate()

    def evaluate(self) -> None:
        # Said before it starts: an eval over a big bank can take minutes with no step.
        self.emit("eval_started", step=self.step)
        started = time.monotonic()
        self.model.eval()
        with torch.no_grad(), self.resolved.autocast():
            # The model itself: per rank, outside DDP's collectives, and eagerly: eval's shapes
            # are not the training step's, so a compiled model compiles them again (85 s for
            # trm-chat-small's first eval on the H100, a second's work eagerly).
            metrics = self.workload.evaluate(self.model, self.device) if self.world.is_main else {}
        self.model.train()
        spent = time.monotonic() - started
        if metrics:
            self.emit("eval", step=self.step, metrics=metrics, eval_s=round(spent, 3))
        self.window.evaluated(spent)  # not training throughput; the ETA counts the evals to come

    # ------------------------------------------------------------ for the probe (engine.probe.worker)

    def restart_window(self, report_every_s: float) -> None:
        """Start a fresh reporting window of this length (the probe's timed windows begin
        after its warm-up, whose losses and time are not the measurement's)."""
        self.train = dataclasses.replace(self.train, report_every_s=report_every_s)
        self.window.resize(report_every_s, time.monotonic())

    def use_micro_batch(self, batch_size: int) -> None:
        """Train on with this micro-batch and no accumulation (the batch finder's trials)."""
        self.preset = dataclasses.replace(self.preset, batch_size=batch_size, accumulation=1)
        self.global_batch = batch_size * self.world.size

    def describe(self) -> TrainerReadyFields:
        return TrainerReadyFields(
            device=str(self.device), precision=self.resolved.precision, reason=self.resolved.reason,
            batch_size=self.preset.batch_size, accumulation=self.preset.accumulation,
            compile=self.preset.compile, grad_checkpointing=self.preset.grad_checkpointing,
            compiled=compiling.mode(self.forward), compiled_blocks=compiling.blocks(self.forward),
            threads=torch.get_num_threads(), total_steps=self.total_steps,
            total_samples=self.total_samples, resumed_from=self.resumed_from,
            parameters=sum(p.numel() for p in self.model.parameters()),
            trainable=sum(p.numel() for p in self.model.parameters() if p.requires_grad),
            pid=os.getpid(), torch=torch.__version__, world_size=self.world.size,
            nodes=self.world.nodes, node_rank=self.world.node_rank, rank=self.world.rank,
            global_batch=self.global_batch,
            optimizer=optim.describe(self.optimizer, self.scheduler, self.train, self.workload),
            peak_tflops=self.peak[0] if self.peak else None,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.train.trainer")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--preset", required=True)
    parser.add_argument("--device-json", required=True)
    # asked by a rewind to the checkpoint it resumes from (engine.run.rewind)
    parser.add_argument("--skip-batches", type=int, default=0)
    parser.add_argument("--lr-scale", type=float, default=1.0)
    args = parser.parse_args(argv)

    # A native crash prints the Python stack it happened in: evidence for the crash panel.
    faulthandler.enable()
    stop = StopRequest()
    stop.install()
    run = RunDir(args.run_dir)
    trainer = None
    with EventWriter(run.events_path, attempt=args.attempt) as events:
        try:
            preset = presets.device_from_table(json.loads(args.device_json), f"attempt {args.attempt}")
            trainer = Trainer(run, events, args.preset, preset, stop, (args.skip_batches, args.lr_scale))
            outcome = trainer.fit()
            trainer.world.close()
        except Exception as e:
            if trainer is not None:
                # The checkpoint being written holds a state checked when it was copied: complete
                # it, so the next attempt resumes from it.
                with contextlib.suppress(Exception):
                    trainer.finish_checkpoints()
            return ending(report_failure(events, e, trainer.step if trainer else None), trainer)
    print(f"attempt {args.attempt}: {outcome} at step {trainer.step}/{trainer.total_steps}", flush=True)
    return ending(EXIT_FINISHED if outcome == "finished" else EXIT_STOPPED, trainer)


def ending(code: int, trainer: Trainer | None) -> int:
    """`code`, the attempt's end decided and written (events with os.write, checkpoints
    finished, the step published through a shared map). A process running only our code leaves
    at once: the interpreter's teardown after torch and torch._dynamo took about a second of
    C-level destructors on the 2-core machine, at every attempt's end, a crash's included, before
    the supervisor could see it; and with torch.distributed's threads it aborted one rank in
    several runs ("terminate called without an active exception", SIGABRT after "finished"),
    which its peers then saw as a machine lost. A workload of the user's own ends as Python
    ends: its threads joined, its files flushed as they are freed."""
    if trainer is not None and (trainer.world.size > 1 or trainer.name in BUILTIN):
        atexit._run_exitfuncs()   # what libraries registered (logging's shutdown)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())

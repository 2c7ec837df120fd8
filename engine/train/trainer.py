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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import faulthandler
import json
import math
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, cast

import torch
from torch import nn

from engine import presets, runconfig, workloads
from engine.monitor import device as devices
from engine.record import checkpoint, interval, reached
from engine.train import checkpointer, optim, parity, peaks
from engine.vocabulary import (CLEAN, EXIT_CONFIG, EXIT_FAILED, EXIT_FINISHED, EXIT_NUMERICAL,
                               EXIT_PARITY, EXIT_STOPPED)
from engine.train.data import SampleOrder
from engine.train.distributed import World
from engine.errors import ConfigError, ProtocolError
from engine.record.event_types import Emit, StepFields, TrainerReadyFields
from engine.record.events import EventWriter
from engine.monitor.throughput import RateMeter
from engine.train.faults import Injector
from engine.presets import DevicePreset
from engine.record.rundir import RunDir
from engine.schema import to_table


# checkpoint_every_steps = 'auto': the first checkpoint after this much training measures a save
AUTO_FIRST_S = 30.0


class NonFiniteLoss(Exception):
    def __init__(self, step: int, what: str):
        self.step = step
        super().__init__(f"{what} at step {step}")


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


class Trainer:
    # the window's losses, kept on the device until a report sums them (_new_window)
    _losses: list[torch.Tensor]
    _loss_counts: list[int]

    def __init__(self, run: RunDir, events: EventWriter, preset_name: str, preset: DevicePreset,
                 stop: StopRequest | None = None):
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
        # Rank 0 speaks for the run; the other ranks only heartbeat (and report their own
        # exceptions, from main()). Injected faults hit rank 0.
        self.emit: Emit = events.emit if self.world.is_main else (lambda *a, **k: None)
        # Each step as it is done, for the supervisor to read after any death (a report is
        # every half second): rank 0's, as its events are.
        self.reached = reached.Publisher(reached.path_of(run.path, events.attempt)) \
            if self.world.is_main else None
        self.faults = Injector(preset.inject if self.world.is_main else (), self.device.type, self.emit)
        self.global_batch = preset.effective_batch * self.world.size
        if preset.threads:
            torch.set_num_threads(preset.threads)

        devices.seed_everything(self.train.seed)
        self.name = config.workload.workload
        self.workload = workloads.build(self.name, config.workload.params, self.train.seed)
        workloads.check_batch(preset, self.workload.num_samples, *_step_set_by(config.overrides, preset, preset_name))
        self.model = self.workload.build_model(grad_checkpointing=preset.grad_checkpointing).to(self.device)
        self.ddp = None
        if self.world.size > 1:
            from torch.nn.parallel import DistributedDataParallel

            self.ddp = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        wrapped = self.ddp or self.model
        # compiling a module gives a module (an OptimizedModule) that forwards to it
        self.forward = cast(nn.Module, torch.compile(wrapped)) if preset.compile else wrapped
        # The workload's own optimizer (and scheduler), or the one [train] describes.
        own = optim.from_workload(self.workload, config.workload.workload, self.model, self.train)
        self.scheduler: Any
        self.optimizer, self.scheduler = own or (optim.build(self.model, self.train, self.device), None)
        self.peak_lrs = [g["lr"] for g in self.optimizer.param_groups]  # what the schedule scales
        self.lr = self.peak_lrs[0]
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.resolved.precision == "fp16")
        self.order = SampleOrder(self.workload.num_samples, self.train.seed)
        self.total_samples = max(1, round(self.train.epochs * self.workload.num_samples))
        # The first attempt's global batch (kept in every checkpoint, whatever run.toml says by
        # then): max_steps counts steps of it, a budget of samples, so a fallback to another
        # batch trains the same samples, not the same number of steps.
        self.first_global_batch = config.device.effective_batch * config.device.world_size

        self.step = 0
        self.samples_seen = 0
        self.resumed_from = self._resume()
        if self.train.max_steps:
            self.total_samples = min(self.total_samples, self.train.max_steps * self.first_global_batch)
        self.total_steps = self.step + math.ceil(
            max(0, self.total_samples - self.samples_seen) / self.global_batch)
        if events.attempt == 1 and not self.resumed_from:
            self._refuse_unreachable_faults(config, preset_name)
        # Warmup counts steps of the first attempt's global batch too: the curve is one of samples.
        self.schedule = optim.Schedule.of(self.train, self.first_global_batch, self.total_samples)
        self._saved_step = self.step if self.resumed_from else None  # the step on disk (or being written)
        # Checkpoints are written by a thread of their own from a host copy of the state, one at
        # a time (engine.train.checkpointer); each is told once complete on disk.
        self.checkpoints = checkpointer.Writer(self.run.checkpoints, keep=self.train.keep_checkpoints)
        # checkpoint_every_steps = 'auto': the saves' stalls and writes measured, and the crash
        # rate on this device, choose the interval (engine.record.interval)
        self._save_stalls: list[float] = []
        self._write_s = 0.0
        self._interval: interval.Interval | None = None
        self._crash_history = self._crash_history_now() if self.train.checkpoint_every_steps == "auto" \
            else (0, 0.0)

        self._last_checkpoint_t = time.monotonic()
        self._prepared_epoch = -1
        # Rates over training time only: evals, epoch preparation and checkpoints move the
        # window's start past themselves, and are added to the ETA as costs of their own.
        self._meter = RateMeter(full_window_s=self.train.report_every_s)
        self.peak = peaks.device_peak(self.device, self.resolved.precision)  # (TFLOP/s, GPU) for MFU
        self._eval_s, self._evals = 0.0, 0          # time spent evaluating, for the ETA
        self._last_heartbeat = time.monotonic()
        # called with (done, of) after each micro-batch (the probe)
        self.micro_batch_hook: Callable[[int, int], None] | None = None
        self._epoch_cost_s: float | None = None     # the last epoch preparation's (mining)
        self._first_step_s: float | None = None     # this attempt's first step, timed
        self._compile_told = not preset.compile     # its compile time said in a step event
        self._new_window()

    # ------------------------------------------------------------ the loop

    def fit(self) -> str:
        """Train to the end of the schedule or to a stop request: 'finished' or 'stopped'."""
        self.emit("trainer_ready", **self.describe())
        self.faults.before_step(0)
        if self.preset.parity_check:
            self.check_parity()
        self._window_start = time.monotonic()   # training starts here: start-up ends
        while self.should_continue():
            started = time.monotonic() if self._first_step_s is None else None
            self.train_step()
            if started is not None:   # compiling happens in it (host time: the compile's)
                self._first_step_s = time.monotonic() - started
            self.maybe_report()
            self.maybe_eval()
            self.maybe_checkpoint()
        self.report()
        if self.stop.requested and self.step < self.total_steps:
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
        return self.step < self.total_steps and not self.world.any(self.stop.requested)

    def train_step(self) -> None:
        """One optimizer step over the global group of samples: `accumulation` micro-batches
        on each rank (fewer at the very end)."""
        if self.checkpoints.in_flight and _fault_due(self.faults, self.step + 1):
            # A rehearsed crash (`kind@step`) fires with the checkpoints before it on disk, as
            # when they were written in the loop, whatever the machine's speed: the same
            # resume, the same steps lost. (A real crash mid-write loses the write in flight.)
            self.finish_checkpoints()
        self.faults.before_step(self.step + 1)
        group = min(self.global_batch, self.total_samples - self.samples_seen)
        first, mine = self.world.share(self.samples_seen, group)
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
                # Weight each micro-batch by its share of the group: the step's gradient is the
                # mean over all its samples, whatever the split into micro-batches and ranks
                # (DDP averages over ranks, hence the world size).
                self.scaler.scale(loss * (n / group * self.world.size)).backward()
            if n:
                self._keep_loss(loss.detach(), n)
            self.after_micro_batch(m + 1, micro_batches)
        if self.faults.wrong_grad:
            parity.perturb_gradients(self.model)
        if self.train.grad_clip:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train.grad_clip)
        self.set_lr(self.samples_seen + group)
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
        self._window_samples += group
        self._window_steps += 1

    def _refuse_unreachable_faults(self, config, preset_name: str) -> None:
        """A step fault past the run's last step would never fire, and the rehearsal would pass
        in silence. engine.runconfig.check_faults refuses it before the run where a workload
        tells its size without building its data; for the others (trm) only the trainer knows
        the run's length, so its first attempt refuses it, with the same line."""
        # counted as runconfig counts, on the ladder's smallest step (a fault may be meant for a
        # fallback's attempt), with the data set's size this process has built
        known = runconfig.last_step(config, [config.device, *config.ladder.values()],
                                    samples=self.workload.num_samples)
        if known is None:  # not for a workload that says its size: it just did
            return
        last, why = known
        for fault in self.faults.faults:  # step faults (timed ones are in .timed)
            if fault.step is not None and fault.step > last:
                raise ConfigError(*runconfig.fault_from(fault.spec, [preset_name], preset_name,
                                                        f"device preset {preset_name!r}", config.overrides),
                                  runconfig.past_last_step(fault, last, why))

    def after_micro_batch(self, done: int, of: int) -> None:
        """A long accumulation group is still a sign of life: the supervisor's hang watch sees a
        `heartbeat` at most once per report interval while micro-batches complete (no device
        sync: on a GPU it says the host is queueing work, which a wedged kernel stops too). The
        probe replaces `micro_batch_hook` to time micro-batches."""
        if self.micro_batch_hook is not None:
            self.micro_batch_hook(done, of)
        self.faults.check_time()  # a timed fault, mid-group: a long group must not hold it back
        now = time.monotonic()
        if done < of and now - self._last_heartbeat >= self.train.report_every_s:
            self._last_heartbeat = now
            self.emit("heartbeat", rank=self.world.rank, step=self.step, micro_batches=done, of=of)

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
        factor = self.schedule.factor(samples)
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
        spent = time.monotonic() - started
        # The next epochs are expected to cost what this one did: a schedule that starts
        # mining at epoch 6 moves the ETA once, at epoch 6, not a little at every epoch after.
        self._epoch_cost_s = max(0.0, spent - once)
        self._window_start += spent  # not training throughput

    def maybe_report(self) -> None:
        if time.monotonic() - self._window_start >= self.train.report_every_s:
            self.report()

    def report(self) -> None:
        """Emit a step event for the window: the loop's one host-device sync."""
        if not self._window_steps:
            return
        self._fold_losses()
        loss = float(self._window_loss) / max(1, self._window_loss_samples)  # the sync point
        if not math.isfinite(loss):
            raise NonFiniteLoss(self.step, f"loss {loss} over the last {self._window_steps} steps")
        elapsed = max(time.monotonic() - self._window_start, 1e-9)
        steps_per_s = self._window_steps / elapsed
        samples_per_s = self._window_samples / elapsed
        self._meter.add(self._window_steps, self._window_samples, elapsed)
        event = StepFields(
            step=self.step, total=self.total_steps, samples_seen=self.samples_seen,
            total_samples=self.total_samples, epoch=self.order.epoch_of(max(0, self.samples_seen - 1)),
            loss=loss, lr=self.lr,
            samples_per_s=round(samples_per_s, 3), steps_per_s=round(steps_per_s, 4),
            window_s=round(elapsed, 4), eta_s=round(self.eta_s(), 1),
            smoothed_samples_per_s=round(self._meter.samples_per_s or 0.0, 3),
            best_samples_per_s=round(self._meter.best_samples_per_s or 0.0, 3),
            device_memory=devices.memory(self.device),
        )
        if self.workload.flops_per_sample:
            event["gflop_s"] = round(samples_per_s * self.workload.flops_per_sample / 1e9, 2)
            if self.peak is not None:  # model FLOP utilisation of every rank's GPU together
                event["mfu"] = round(event["gflop_s"] / (self.peak[0] * 1e3 * self.world.size), 4)
        if not self._compile_told and self._first_step_s is not None:
            # What compiling cost: the first step's time beyond a step's (the window's others);
            # the window's rates keep it, the run's goodput moves it to its compile bucket.
            self._compile_told = True
            others = (elapsed - self._first_step_s) / (self._window_steps - 1) if self._window_steps > 1 else 0.0
            event["compile_s"] = round(max(0.0, self._first_step_s - others), 3)
        if elapsed < self.train.report_every_s:
            # Cut short by a checkpoint or the end: a few steps' rate, too noisy to show or to
            # count as a best (the run's averages still count its samples and time).
            event["partial"] = True
        if self.world.is_main:
            self.events.emit("step", **event)
        else:
            self.events.emit("heartbeat", rank=self.world.rank, step=self.step, pid=os.getpid())
        self._new_window()

    def eta_s(self) -> float:
        """Remaining steps at the smoothed rate of training time (engine.monitor.throughput),
        plus the evals still to come at their average cost so far and the epoch preparations
        (mining) at the last one's. The rate is measured between reports, whose loss read is a
        sync point, so it holds on a GPU with no per-step sync."""
        remaining = self._meter.seconds_for(self.total_steps - self.step) or 0.0
        every = self.train.eval_every_steps
        evals_left = 1 if not every else (self.total_steps // every - self.step // every
                                          + (1 if self.total_steps % every else 0))
        if self._evals:
            remaining += evals_left * self._eval_s / self._evals
        if self._epoch_cost_s:
            last_epoch = self.order.epoch_of(self.total_samples - 1)
            epochs_left = max(0, last_epoch - self._prepared_epoch)  # each is prepared once
            remaining += epochs_left * self._epoch_cost_s
        return remaining

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
        self._eval_s, self._evals = self._eval_s + spent, self._evals + 1
        if metrics:
            self.emit("eval", step=self.step, metrics=metrics, eval_s=round(spent, 3))
        self._window_start += spent  # eval time is not training throughput

    def maybe_checkpoint(self) -> None:
        self._tell_checkpoints(self.checkpoints.poll())   # a background write that has finished
        every_steps, every_s = self._checkpoint_every()
        # 'auto' counts from the last save (its interval may change); a fixed one at multiples
        since = self.step - (self._saved_step or 0) if self._interval is not None else self.step
        if (every_steps and since % every_steps == 0 and since) or \
                (every_s and time.monotonic() - self._last_checkpoint_t >= every_s):
            self.save_checkpoint()

    # ------------------------------------------------------------ state

    def _checkpoint_every(self) -> tuple[int, float]:
        """(steps, seconds) between checkpoints: the preset's, or with checkpoint_every_steps =
        'auto' the interval chosen at the last save (_choose_interval); until one is chosen, a
        save after AUTO_FIRST_S of training (or checkpoint_every_minutes, if sooner) measures one."""
        if self.train.checkpoint_every_steps != "auto":
            return int(self.train.checkpoint_every_steps), self.train.checkpoint_every_minutes * 60
        if self._interval is None:
            minutes = self.train.checkpoint_every_minutes * 60
            return 0, min(AUTO_FIRST_S, minutes) if minutes else AUTO_FIRST_S
        return self._interval.steps, 0.0

    def _choose_interval(self) -> None:
        """'auto': the interval that loses least (engine.record.interval) for the save stalls
        measured so far, the step time and the crash rate on this device, never under a write's
        time (no two in flight); said in an event when it moves by more than a tenth."""
        if self.train.checkpoint_every_steps != "auto" or not self._meter.samples_per_s:
            return
        stalls = sorted(self._save_stalls)
        chosen = interval.choose(stalls[len(stalls) // 2], self.global_batch / self._meter.samples_per_s,
                                 *self._crash_history, floor_s=self._write_s)
        if self._interval is None or abs(chosen.steps - self._interval.steps) > 0.1 * self._interval.steps:
            self._interval = chosen
            self.emit("checkpoint_interval", steps=chosen.steps, seconds=round(chosen.seconds, 2),
                      cost_s=round(chosen.cost_s, 4), mtbf_s=round(chosen.mtbf_s, 1),
                      crashes=chosen.crashes, observed_s=round(chosen.observed_s, 1),
                      reason=chosen.reason)

    def _crash_history_now(self) -> tuple[int, float]:
        """(crashes, seconds trained) on this device: this run's attempts so far and the
        earlier runs' (engine.record.interval.device_history)."""
        from engine.record import stats   # the run's own events, read once at the start

        fold = stats.fold(self.run.events())
        g = fold.goodput()
        crashes = sum(1 for a in fold.attempts if a.outcome is not None and a.outcome not in CLEAN)
        trained = g.productive_s + (g.buckets.get("lost") or 0.0)
        before, seen = interval.device_history(self.device.type, self.run.path.parent, exclude=self.run.id)
        return crashes + before, trained + seen

    def save_checkpoint(self) -> None:
        if self.step == self._saved_step:
            return  # this step is on disk already, or being written (the schedule saved the last step)
        # Never save a non-finite state: the window's loss and the weights are checked first
        # (one sync per checkpoint), so a resume always starts from good weights.
        self.report()
        started = time.monotonic()   # the loop's stall: the check, a wait, the copy to the host
        if not _all_finite(list(self.model.parameters())):
            raise NonFiniteLoss(self.step, "non-finite weights")
        self._saved_step = self.step
        if not self.world.is_main:
            return  # every rank holds the same weights; rank 0 writes them
        done = self.checkpoints.save({
            "step": self.step,
            "samples_seen": self.samples_seen,
            "first_global_batch": self.first_global_batch,
            "model": self.model.state_dict(),  # the uncompiled module's names
            "optimizer": self.optimizer.state_dict(),
            "scheduler": (self.scheduler.state_dict() if self.scheduler is not None
                          else {"schedule": self.schedule.state_dict()}),
            "scaler": self.scaler.state_dict(),
            "rng": devices.rng_state(),
            "config": {"device": to_table(self.preset), "train": to_table(self.train)},
        }, stall_from=started)
        self._last_checkpoint_t = time.monotonic()
        # Only the stall leaves the window: a background write runs alongside training.
        self._window_start += self._last_checkpoint_t - started
        self._tell_checkpoints(*done)

    def finish_checkpoints(self) -> None:
        """Wait for the checkpoint being written, if any, and tell it: the end of an attempt.
        The wait is in its save_s, and out of the reporting window."""
        started = time.monotonic()
        written = self.checkpoints.wait()
        self._window_start += time.monotonic() - started
        self._tell_checkpoints(written)

    def _tell_checkpoints(self, *written: checkpointer.Written | None) -> None:
        """A `checkpoint` event for each write complete on disk: save_s is what the loop paid
        for it (the copy to the host, and any wait for the write before it: wait_s), write_s
        the write's own time (in the background, alongside training)."""
        for w in written:
            if w is None:
                continue
            self._save_stalls.append(w.stall_s)
            self._write_s = w.write_s
            self.events.emit("checkpoint", step=w.step, samples_seen=w.samples_seen,
                             path=str(w.path.relative_to(self.run.path)), save_s=round(w.stall_s, 3),
                             write_s=round(w.write_s, 3), wait_s=round(w.wait_s, 3))
            self._choose_interval()

    def _resume(self) -> dict | None:
        """Continue from the newest checkpoint that loads. One that does not (a torn write, bit
        rot) is reported, set aside and the one before it tried; if none loads, the attempt
        starts from the beginning, with a warning."""
        files = checkpoint.checkpoint_files(self.run.checkpoints)
        if not files:
            return None
        # What a fresh start needs back should a half-restored checkpoint fail (the model is
        # restored last, once everything else has loaded, so it never needs putting back).
        fresh = self.optimizer.state_dict(), self.scaler.state_dict(), devices.rng_state(), \
            self.scheduler.state_dict() if self.scheduler is not None else None
        started = time.monotonic()
        for path in reversed(files):
            name = str(path.relative_to(self.run.path))
            try:
                self._restore(path, checkpoint.load(path))
            except checkpoint.Unreadable as e:
                aside = checkpoint.set_aside(path) if self.world.is_main else None
                self.emit("warning", kind="checkpoint-unreadable", path=name, error=e.problem,
                          message=f"checkpoint {name} cannot be loaded ({e.problem}); "
                                  + (f"set aside as {aside.name}, " if aside else "")
                                  + "trying the one before it", advice=[], fallback=False)
                continue
            return {"path": name, "step": self.step, "samples_seen": self.samples_seen,
                    "load_s": round(time.monotonic() - started, 3)}
        self.optimizer.load_state_dict(fresh[0])
        self.scaler.load_state_dict(fresh[1])
        devices.set_rng_state(fresh[2])
        if fresh[3] is not None:
            self.scheduler.load_state_dict(fresh[3])
        self.emit("warning", kind="checkpoint-unreadable", path=None, error="none loads",
                  message=f"none of the run's {len(files)} checkpoints loads; training starts from "
                          "the beginning", advice=[], fallback=False)
        return None

    def _restore(self, path, state: dict) -> None:
        """Put a loaded checkpoint's state in place; Unreadable if it does not fit this run."""
        try:
            mine = self.model.state_dict()
            theirs = state["model"]
            misfits = [k for k in mine.keys() | theirs.keys()
                       if k not in mine or k not in theirs or mine[k].shape != theirs[k].shape]
            if misfits:
                raise checkpoint.Unreadable(path, "does not fit this run's model ("
                                            + ", ".join(sorted(misfits)[:3]) + ")")
            self.optimizer.load_state_dict(optim.loadable(self.optimizer, state["optimizer"], self.model))
            if self.scheduler is not None and "scheduler" in state:
                self.scheduler.load_state_dict(state["scheduler"])
            self.scaler.load_state_dict(state["scaler"])  # a no-op when the scaler is disabled
            devices.set_rng_state(state["rng"])
            step, samples_seen = int(state["step"]), int(state["samples_seen"])
            first = int(state.get("first_global_batch", self.first_global_batch))
            self.model.load_state_dict(theirs, strict=True)
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:
            raise checkpoint.Unreadable(path, f"{type(e).__name__}: {e}") from None
        self.step, self.samples_seen, self.first_global_batch = step, samples_seen, first

    def _keep_loss(self, loss: torch.Tensor, n: int) -> None:
        # Keeping the device tensor costs no kernel launch; they are summed in batches.
        self._losses.append(loss)
        self._loss_counts.append(n)
        self._window_loss_samples += n
        if len(self._losses) >= 1024:
            self._fold_losses()

    def _fold_losses(self) -> None:
        if self._losses:
            weights = torch.tensor(self._loss_counts, dtype=torch.float32).to(self.device, non_blocking=True)
            self._window_loss += (torch.stack(self._losses).float() * weights).sum()
            self._losses, self._loss_counts = [], []

    # ------------------------------------------------------------ for the probe (engine.probe.worker)

    def restart_window(self, report_every_s: float) -> None:
        """Start a fresh reporting window of this length (the probe's timed windows begin
        after its warm-up, whose losses and time are not the measurement's)."""
        self.train = dataclasses.replace(self.train, report_every_s=report_every_s)
        self._meter.full_window_s = report_every_s
        self._new_window()

    def use_micro_batch(self, batch_size: int) -> None:
        """Train on with this micro-batch and no accumulation (the batch finder's trials)."""
        self.preset = dataclasses.replace(self.preset, batch_size=batch_size, accumulation=1)
        self.global_batch = batch_size * self.world.size

    def _new_window(self) -> None:
        self._window_start = time.monotonic()
        self._window_loss = torch.zeros((), device=self.device)
        self._losses = []
        self._loss_counts = []
        self._window_samples = 0        # global samples trained in the window (throughput)
        self._window_loss_samples = 0   # this rank's samples behind the window's loss
        self._window_steps = 0

    def describe(self) -> TrainerReadyFields:
        return TrainerReadyFields(
            device=str(self.device), precision=self.resolved.precision, reason=self.resolved.reason,
            batch_size=self.preset.batch_size, accumulation=self.preset.accumulation,
            compile=self.preset.compile, grad_checkpointing=self.preset.grad_checkpointing,
            threads=torch.get_num_threads(), total_steps=self.total_steps,
            total_samples=self.total_samples, resumed_from=self.resumed_from,
            parameters=sum(p.numel() for p in self.model.parameters()),
            trainable=sum(p.numel() for p in self.model.parameters() if p.requires_grad),
            pid=os.getpid(), torch=torch.__version__, world_size=self.world.size,
            global_batch=self.global_batch, optimizer=self._optimizer_text(),
            peak_tflops=self.peak[0] if self.peak else None,
        )

    def _optimizer_text(self) -> str:
        """'AdamW (fused), cosine from 0.0006 to 6e-05 after 100 warmup steps', or the workload's."""
        o, t = self.optimizer, self.train
        name = type(o).__name__ + (" (fused)" if o.defaults.get("fused") else "")
        if hasattr(self.workload, "configure_optimizers"):
            name += " from configure_optimizers"
        if self.scheduler is not None:
            return f"{name} and its {type(self.scheduler).__name__}"
        peak = "its lr" if hasattr(self.workload, "configure_optimizers") else f"{t.lr:g}"
        curve = f"constant at {peak}" if t.schedule == "constant" else \
            f"{t.schedule} from {peak} to {t.min_lr / t.lr if t.lr else 0:g}x" \
            if peak == "its lr" else f"{t.schedule} from {peak} to {t.min_lr:g}"
        warm = f" after {t.warmup_steps} warmup steps" if t.warmup_steps else ""
        return f"{name}, {curve}{warm}"


def checked_loss(loss, name: str, workload) -> torch.Tensor:
    """The loss, if it is what the protocol asks for: a scalar floating-point tensor with a
    gradient. Anything else is the workload's bug, named as such (ProtocolError), not a
    confusing error from the trainer's line that first trips over it. Metadata only: no sync."""
    if isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.is_floating_point() \
            and loss.requires_grad:
        return loss
    if isinstance(loss, tuple):
        got = (f"a tuple of {len(loss)} ({', '.join(type(v).__name__ for v in loss)}); return the "
               "loss alone (report other figures from evaluate())")
    elif type(loss).__module__.partition(".")[0] == "numpy":
        got = (f"a numpy {type(loss).__name__}, which has no gradient; return the torch tensor "
               "(no .numpy() or .item())")
    elif isinstance(loss, (int, float)) and not isinstance(loss, bool):
        got = f"a Python {type(loss).__name__} ({loss:g}), which has no gradient; return the tensor, " \
              "not .item()"
    elif loss is None:
        got = "None; return the loss (a missing `return`?)"
    elif isinstance(loss, dict):
        got = (f"a dict ({', '.join(map(str, loss))}); return the loss tensor alone (report "
               "other figures from evaluate())")
    elif not isinstance(loss, torch.Tensor):
        got = f"{_article(type(loss).__name__)} {type(loss).__name__}"
    elif loss.dim() != 0:
        got = (f"a tensor of shape {tuple(loss.shape)}; return the mean over the batch "
               "(.mean()), one number")
    elif not loss.is_floating_point():
        got = f"a tensor of dtype {loss.dtype}; expected a floating-point loss"
    else:
        got = ("a tensor that does not require grad (computed under torch.no_grad(), or "
               "detached): nothing to train")
    raise ProtocolError(name, "loss", f"loss() must return a scalar tensor, got {got}",
                        getattr(workload, "loss", None))


def _fault_due(faults: Injector, step: int) -> bool:
    """Whether a step fault fires as `step` begins (Injector.before_step fires those up to it)."""
    return any(f.step is not None and f.step <= step for f in faults.faults)


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """Whether every element is finite: one host-device sync per device, not per tensor."""
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(torch.isfinite(t.detach()).all())
    return all(bool(torch.stack(flags).all()) for flags in by_device.values())


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _step_set_by(overrides, preset: DevicePreset, preset_name: str) -> tuple[str, str]:
    """(where, key) to blame for an optimizer step larger than the data set: the --set that sized
    the step (carried to every preset of the ladder), else the preset. engine.runconfig blames
    before the run where the data set's size is known without building it; trm's is not."""
    factors = ("batch_size", "accumulation", "nproc_per_node", "nnodes")
    keys = {k.strip(): v.strip() for k, _, v in (item.partition("=") for item in overrides)}
    # a --set whose value this attempt runs (a fallback may have halved it since); of several,
    # the largest factor of the step
    set_here = [k for k in factors if str(getattr(preset, k)) in (keys.get(k), keys.get(f"device.{k}"))]
    if set_here:
        return "--set", "device." + max(set_here, key=lambda k: getattr(preset, k))
    return f"device preset {preset_name!r}", "batch_size"


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def report_failure(events: EventWriter, error: Exception, step: int | None) -> int:
    """Say why this process is failing, the way engine.run.crashes classifies it (an event and the
    log), and return its exit code. Shared by the trainer and the probe's worker."""
    if isinstance(error, ConfigError):
        print(error.line(), file=sys.stderr, flush=True)
        events.emit("config_error", message=error.line())
        return EXIT_CONFIG
    if isinstance(error, ProtocolError):  # the workload's bug, told without the trainer's frames
        text = f"ProtocolError: {error}" + (f"\n  {error.method}() is at {error.where}" if error.where else "")
        events.emit("exception", error="ProtocolError", message=str(error), where=error.where,
                    step=step, rank=_rank(), traceback=text)
        print(text, file=sys.stderr, flush=True)
        return EXIT_FAILED
    if isinstance(error, parity.ParityFailure):  # the parity event, written already, has the figures
        print(f"parity: {error}", file=sys.stderr, flush=True)
        return EXIT_PARITY
    if isinstance(error, NonFiniteLoss):
        events.emit("numerical", step=error.step, message=str(error), rank=_rank())
        print(f"numerical: {error}", file=sys.stderr, flush=True)
        return EXIT_NUMERICAL
    frames = traceback.extract_tb(error.__traceback__)
    events.emit("exception", error=type(error).__name__, message=str(error)[:2000],
                where=f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None,
                step=step, rank=_rank(), traceback=traceback.format_exc()[-8000:])
    traceback.print_exc()
    return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.train.trainer")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--preset", required=True)
    parser.add_argument("--device-json", required=True)
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
            trainer = Trainer(run, events, args.preset, preset, stop)
            outcome = trainer.fit()
            trainer.world.close()
        except Exception as e:
            if trainer is not None:
                # The checkpoint being written holds a state checked when it was copied: complete
                # it, so the next attempt resumes from it.
                with contextlib.suppress(Exception):
                    trainer.finish_checkpoints()
            return report_failure(events, e, trainer.step if trainer else None)
    print(f"attempt {args.attempt}: {outcome} at step {trainer.step}/{trainer.total_steps}", flush=True)
    return EXIT_FINISHED if outcome == "finished" else EXIT_STOPPED


if __name__ == "__main__":
    sys.exit(main())

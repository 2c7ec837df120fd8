"""cockpit's callback for Hugging Face's Trainer (and TRL's trainers, which are Trainers).

    from cockpit.integrations.transformers import CockpitCallback

    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val,
                      callbacks=[CockpitCallback()])
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)

Under cockpit (`cockpit run -- python train.py ...`) it reports:
- steps: the Trainer's global step of its `max_steps` (the ETA), the samples seen (global step
  x the Trainer's batch size x its accumulation x the world size), the epoch, and at each of
  its logging steps the loss, learning rate and grad norm it logs;
- evaluations: the metrics `evaluate()` returns (its timings left out);
- checkpoints: each `checkpoint-N` directory the Trainer saves, so a crash or a fallback
  resumes from it with the command's `resume` arguments (`--resume_from_checkpoint
  {checkpoint}`) through the Trainer's own `resume_from_checkpoint`, and how long the save
  held training up (from the hook before it: the step's end, its log or its evaluation).
Outside cockpit it does nothing; nor on any process but the first of a multi-process job, nor
in a second copy given to the same Trainer; and nothing in it can stop training (a failure in
a hook is one line on stderr and the callback goes quiet). Without it, cockpit still reads the
Trainer's progress bar and log lines from its output; the callback makes it exact and adds
checkpoints and samples. A checkpoint saved with `save_only_model` is not reported: it has no
optimizer or schedule to resume.
"""

from __future__ import annotations

import math
import os
import time

from cockpit import report
from cockpit.integrations._common import (Owners, Throttle, guarded, needs_framework,
                                          samples_seen, scalars)

try:
    from transformers import TrainerCallback
except ImportError as e:
    raise needs_framework(__name__, "Hugging Face transformers", "transformers",
                          {"transformers": e})

__all__ = ["CockpitCallback"]

# What the Trainer logs that is not a metric of the model: timings, rates, its own counters.
_NOT_METRICS = ("epoch", "step", "total_flos")
_owners = Owners()


def _timing(name: str) -> bool:
    return name in _NOT_METRICS or name.endswith(("_runtime", "_per_second"))


class CockpitCallback(TrainerCallback):
    """Reports the Trainer's steps, evaluations and checkpoints to cockpit; a no-op outside it,
    on every process but the first, and in a second copy given to the same Trainer."""

    def __init__(self):
        self._throttle = Throttle()
        self._reported_step = None
        self._broken = False      # something went wrong in a hook: quiet from then on
        self._speaks = False      # under cockpit, the first process, this Trainer's only copy
        # when the Trainer last came back from a hook of ours: a save starts after the step's
        # end, its log and its evaluation (_maybe_log_save_evaluate), and on_save follows it
        self._handed_back: float | None = None

    @guarded
    def on_train_begin(self, args, state, control, **kwargs):
        self._speaks = report.active and state.is_world_process_zero and \
            _owners.claim(state, self)

    @guarded
    def on_train_end(self, args, state, control, **kwargs):
        if self._speaks and self._reported_step != state.global_step:
            self._step(args, state)  # the last step, which the throttle may have skipped
        _owners.release(state, self)

    # ------------------------------------------------------------ steps

    @guarded
    def on_step_end(self, args, state, control, **kwargs):
        # Every step: reached (a store into memory), so a crash is told at its step. Between
        # logging steps: where it is (no loss: that would wait for the device). At a logging
        # step on_log follows with the loss.
        if not self._speaks:
            return
        report.reached(state.global_step, samples=self._samples(args, state))
        if not _logging_step(args, state) and self._throttle.due(final=state.global_step >= state.max_steps):
            self._step(args, state)
        self._handed_back = time.monotonic()

    @guarded
    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if not self._speaks or "loss" not in logs or "train_runtime" in logs:
            return  # an evaluation's log (on_evaluate has it) or the end-of-training summary
        loss = logs["loss"]
        values = scalars(logs, drop=lambda name: name == "loss" or _timing(name))
        if "learning_rate" in values:
            values["lr"] = values.pop("learning_rate")
        self._throttle.reported()
        self._step(args, state, loss=loss, **values)
        self._handed_back = time.monotonic()

    def _step(self, args, state, loss=None, **metrics):
        if state.epoch is not None:
            metrics["epoch"] = float(state.epoch)
        report.step(state.global_step, total=state.max_steps or None, loss=loss,
                    samples=self._samples(args, state), **metrics)
        self._reported_step = state.global_step

    def _samples(self, args, state) -> int:
        # auto_find_batch_size may train with less than it was given (state.train_batch_size
        # says); otherwise the state's figure can be a resumed checkpoint's, of another batch
        batch = args.train_batch_size
        if args.auto_find_batch_size and state.train_batch_size:
            batch = state.train_batch_size
        return samples_seen(state.global_step,
                            batch * args.gradient_accumulation_steps * args.world_size)

    # ------------------------------------------------------------ evaluations and checkpoints

    @guarded
    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        values = scalars(metrics or {}, drop=_timing)
        if self._speaks and values:
            if self._reported_step != state.global_step:
                self._step(args, state)  # an evaluation is recorded at the last step reported
            report.eval(**values)
        self._handed_back = time.monotonic()

    @guarded
    def on_save(self, args, state, control, **kwargs):
        # The Trainer has written output_dir/checkpoint-<global step> when it calls this. One
        # saved with save_only_model has no optimizer or schedule: not a place to resume from.
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if self._speaks and not args.save_only_model and os.path.isdir(path):
            took = None if self._handed_back is None else time.monotonic() - self._handed_back
            report.checkpoint(path, state.global_step, samples=self._samples(args, state), save_s=took)


def _logging_step(args, state) -> bool:
    """Whether the Trainer logs at this step (and so calls on_log with the loss)."""
    every = args.logging_steps
    if str(getattr(args.logging_strategy, "value", args.logging_strategy)) != "steps":
        return False
    if 0 < every < 1:  # a fraction of the run, as the Trainer reads it
        every = math.ceil(state.max_steps * every)
    return every >= 1 and state.global_step % int(every) == 0

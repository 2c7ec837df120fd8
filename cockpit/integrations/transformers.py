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
  {checkpoint}`) through the Trainer's own `resume_from_checkpoint`.
Outside cockpit it does nothing. Without it, cockpit still reads the Trainer's progress bar
and log lines from its output; the callback makes it exact and adds checkpoints and samples.
"""

from __future__ import annotations

import os

from cockpit import report
from cockpit.integrations._common import Throttle, needs_framework, scalars

try:
    from transformers import TrainerCallback
except ImportError:
    raise needs_framework(__name__, "Hugging Face transformers", "transformers") from None

__all__ = ["CockpitCallback"]

# What the Trainer logs that is not a metric of the model: timings, rates, its own counters.
_NOT_METRICS = ("epoch", "step", "total_flos")


def _timing(name: str) -> bool:
    return name in _NOT_METRICS or name.endswith(("_runtime", "_per_second"))


class CockpitCallback(TrainerCallback):
    """Reports the Trainer's steps, evaluations and checkpoints to cockpit; a no-op outside it."""

    def __init__(self):
        self._throttle = Throttle()
        self._reported_step = None

    # ------------------------------------------------------------ steps

    def on_step_end(self, args, state, control, **kwargs):
        # Between logging steps: where it is (no loss: that would wait for the device).
        if report.active and self._throttle.due(final=state.global_step >= state.max_steps):
            self._step(args, state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if not report.active or "loss" not in logs or "train_runtime" in logs:
            return  # an evaluation's log (on_evaluate has it) or the end-of-training summary
        values = scalars(logs, drop=_timing)
        loss = values.pop("loss")
        if "learning_rate" in values:
            values["lr"] = values.pop("learning_rate")
        self._throttle.reported()
        self._step(args, state, loss=loss, **values)

    def _step(self, args, state, loss=None, **metrics):
        # auto_find_batch_size may train with less than it was given (state.train_batch_size
        # says); otherwise the state's figure can be a resumed checkpoint's, of another batch
        batch = args.train_batch_size
        if args.auto_find_batch_size and state.train_batch_size:
            batch = state.train_batch_size
        per_step = batch * args.gradient_accumulation_steps * args.world_size
        if state.epoch is not None:
            metrics["epoch"] = float(state.epoch)
        report.step(state.global_step, total=state.max_steps or None, loss=loss,
                    samples=state.global_step * per_step, **metrics)
        self._reported_step = state.global_step

    # ------------------------------------------------------------ evaluations and checkpoints

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        values = scalars(metrics or {}, drop=_timing)
        if report.active and values:
            if self._reported_step != state.global_step:
                self._step(args, state)  # an evaluation is recorded at the last step reported
            report.eval(**values)

    def on_save(self, args, state, control, **kwargs):
        # The Trainer has written output_dir/checkpoint-<global step> when it calls this.
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if report.active and state.is_world_process_zero and os.path.isdir(path):
            report.checkpoint(path, state.global_step)

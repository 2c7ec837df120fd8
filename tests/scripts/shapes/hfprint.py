"""What Hugging Face's Trainer prints, as it prints it, for run_clm.py and grpo.py beside it: its
logger's lines in run_clm's explicit format (`[INFO|trainer.py:2314] <time> >> message`, on
stderr), the `***** Running training *****` block, and `trainer.log_metrics()`'s tables
(print, on stdout, values formatted by `metrics_format`). Stdlib only."""

from __future__ import annotations

import datetime
import sys


def info(message: str, where: str = "trainer.py:2314") -> None:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    print(f"[INFO|{where}] {stamp} >> {message}", file=sys.stderr, flush=True)


def running_training(*, examples: int, epochs: int, batch: int, accumulation: int, total: int,
                     params: int, resumed: tuple[int, int, int] | None) -> None:
    """The block Trainer._inner_training_loop logs; `resumed`: (global step, epochs trained,
    batches to skip in the first epoch) when it continues from a checkpoint."""
    info("***** Running training *****")
    info(f"  Num examples = {examples:,}")
    info(f"  Num Epochs = {epochs:,}")
    info(f"  Instantaneous batch size per device = {batch:,}")
    info(f"  Total train batch size (w. parallel, distributed & accumulation) = {batch * accumulation:,}")
    info(f"  Gradient Accumulation steps = {accumulation}")
    info(f"  Total optimization steps = {total:,}")
    info(f"  Number of trainable parameters = {params:,}")
    if resumed:
        step, epochs_trained, skip = resumed
        info("  Continuing training from checkpoint, will skip to saved global_step")
        info(f"  Continuing training from epoch {epochs_trained}")
        info(f"  Continuing training from global step {step}")
        info(f"  Will skip the first {epochs_trained} epochs then the first {skip} batches in the first epoch.")


def metrics_format(metrics: dict) -> dict:
    """Trainer.metrics_format: runtimes as h:mm:ss.ss, FLOPs in GF, floats to 4 digits."""
    out = {}
    for k, v in metrics.items():
        if "_mem_" in k:
            out[k] = f"{v >> 20}MB"
        elif "_runtime" in k:
            out[k] = str(datetime.timedelta(seconds=int(v))) + f"{v - int(v):.2f}"[1:]
        elif k == "total_flos":
            out[k] = f"{int(v) >> 30}GF"
        elif isinstance(v, float):
            out[k] = round(v, 4)
        else:
            out[k] = v
    return out


def log_metrics(split: str, metrics: dict) -> None:
    print(f"***** {split} metrics *****", flush=True)
    formatted = metrics_format(metrics)
    k_width = max(len(str(x)) for x in formatted)
    v_width = max(len(str(x)) for x in formatted.values())
    for key in sorted(formatted):
        print(f"  {key: <{k_width}} = {formatted[key]:>{v_width}}", flush=True)



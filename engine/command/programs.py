"""What cockpit knows of a few training programs, so their commands need no preset to resume.

`conventions(argv)` gives the workload settings a known program's command implies, for an
ad-hoc `cockpit run -- ...` (a workload preset says them itself, and the user's --set wins):

- mlx-lm's LoRA trainer (`python -m mlx_lm lora`, `python -m mlx_lm.lora`, `mlx_lm.lora`, or
  through cockpit.integrations.mlx): it saves `NNNNNNN_adapters.safetensors` every
  --save-every steps into --adapter-path (default `adapters`), resumes with
  --resume-adapter-file, and then counts its steps, and its --iters, from 0 again; so a resume
  asks for the steps left and cockpit counts on from the checkpoint's step. It restores the
  adapter weights only. (A `-c config.yaml` that sets adapter_path or iters is not read.)
  Its iterations are micro-batches: with --grad-accumulation-steps k it updates every k of
  them, and --iters, its table and its bar all count iterations. So cockpit counts them as its
  steps, and a step is --batch-size samples (`steps_are_micro_batches`), not batch x accumulation.

Torch-free.
"""

from __future__ import annotations

import os

MLX_LM_ITERS = 1000   # mlx-lm's default --iters (mlx_lm/lora.py CONFIG_DEFAULTS)
MLX_LM_RESTORES = ("mlx-lm restores the adapter weights only, not the optimizer's state, the "
                   "learning-rate schedule's place or the data order")


def conventions(argv: list[str]) -> dict:
    """The workload table entries a known program's argv implies; {} for any other."""
    if not _is_mlx_lm_lora(argv):
        return {}
    adapters = _option(argv, "--adapter-path") or "adapters"
    table: dict = {
        "resume": ["--resume-adapter-file", "{checkpoint}", "--iters", "{steps_left}"],
        "checkpoints": os.path.join(adapters, "*_adapters.safetensors"),
        "steps_restart": True,
        "steps_are_micro_batches": True,
        "resume_restores": MLX_LM_RESTORES,
    }
    if _option(argv, "--iters") is None:
        table["total_steps"] = MLX_LM_ITERS
    return table


def _is_mlx_lm_lora(argv: list[str]) -> bool:
    words = [os.path.basename(w) if i == 0 else w for i, w in enumerate(argv)]
    if "mlx_lm.lora" in words[:1]:
        return True
    for i, word in enumerate(words[:-1]):
        if word == "-m" and (words[i + 1] == "mlx_lm.lora"
                             or words[i + 1] == "mlx_lm" and words[i + 2:i + 3] == ["lora"]):
            return True
    return False


def _option(argv: list[str], name: str) -> str | None:
    """The value of `--name value` or `--name=value`, the last one given (as argparse takes it)."""
    found = None
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            found = argv[i + 1]
        elif word.startswith(name + "="):
            found = word.split("=", 1)[1]
    return found

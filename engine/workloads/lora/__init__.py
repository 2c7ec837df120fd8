"""lora: note 003's memory-lean fine-tune, LoRA adapters on a frozen trm model.

The base is a trm run's last checkpoint (`base_run`: the run's id, a unique prefix of it, or
its absolute path; its [params] give the architecture) or, when `base_run` is "", a freshly
initialised trm of the size given here: that tries the settings and measures memory, but a
real fine-tune names a base run. Every base weight is frozen; the `target_modules` linear
layers get a low-rank update B·A·(alpha/rank) (A random, B zero, so training starts at the
base model exactly), and only those adapters reach the optimizer.

Note 003's levers against swapping on unified memory map to `max_seq_len` (it cut 512 to 128),
`grad_checkpointing` (on here or in the device preset, either turns it on) and the device
preset's batch 1 x accumulation 2. The loss is next-byte cross-entropy on the fine-tuning
text (engine.workloads.trm.corpus), not the note's GRPO reward. Evaluation reports held-out
bits per byte, the trainable parameter count and the process's peak memory.
"""

from __future__ import annotations

from engine.workloads.lora.params import Params


def most_samples(params: Params) -> int:
    """The most training windows the text can give, known before it is read: its training
    text is at most corpus_bytes long, and a window starts every max_seq_len bytes (the trainer
    counts the real number once the text is read)."""
    return max(0, (params.corpus_bytes - 1) // params.max_seq_len)


def build(params: Params, seed: int):
    # deferred: workload.py imports torch, which the card keeps out of presets and --help
    from engine.workloads.lora.workload import LoraWorkload

    return LoraWorkload(params, seed)

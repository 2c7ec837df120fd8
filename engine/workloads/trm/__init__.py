"""trm: note 002's small recursive transformer language model, byte-level.

The TinyRecursiveModels shape (Jolicoeur-Martineau, 2025): one small stack of `L_layers`
post-norm transformer blocks (RoPE attention, SwiGLU, RMSNorm) applied again and again to two
latent states, z_H (the answer) and z_L (the reasoning). One forward pass runs `H_cycles`
cycles; each updates z_L `L_cycles` times from (z_L, z_H + input) and then z_H once from
(z_H, z_L). As in TRM, only the last cycle is differentiated (the earlier ones run under
no_grad), and the logits come from z_H. Attention is causal here, since this model predicts
the next byte; TRM's ACT halting and deep supervision are left out (one supervision step per
window), which keeps a training step an ordinary forward and backward.

Data: bytes (vocabulary 256) from the Python standard library's sources by default, or the
user's .txt / .jsonl chat file (engine.workloads.trm.corpus). A sample is a window of
`seq_len + 1` bytes; sample i starts at byte i * seq_len. Evaluation reports the mean
cross-entropy on the held-out text and bits per byte (= nats / ln 2; a uniform guess scores 8).

Sizes from note 002: Tiny ~7M (hidden 512, L_layers 2, heads 8: TRM's own size) and Small
~30M (hidden 768, L_layers 4, heads 12). `cockpit sample RUN --prompt TEXT` continues a
prompt from a run's last checkpoint.
"""

from __future__ import annotations

from engine.workloads.trm.params import Params


def most_samples(params: Params) -> int:
    """The most training windows the text can give, known before it is read: its training
    text is at most corpus_bytes long, and a window starts every seq_len bytes (the trainer
    counts the real number once the text is read)."""
    return max(0, (params.corpus_bytes - 1) // params.seq_len)


def build(params: Params, seed: int):
    # deferred: workload.py imports torch, which the card keeps out of presets and --help
    from engine.workloads.trm.workload import TrmWorkload

    return TrmWorkload(params, seed)

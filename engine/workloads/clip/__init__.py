"""clip: note 004's image/text dual encoder, on pictures it draws itself.

Each sample is a small picture of one shape in one colour at one place and size, and its
caption as token ids ("a large red circle at top left"). A ViT image tower and a
transformer text tower map both into one space; the loss is CLIP's symmetric contrastive
loss with a learnable temperature. Pictures are rendered with torch ops from a few seeded
numbers per sample (position and size jitter, colour jitter, a background noise texture),
so nothing is downloaded and a sample index always gives the same picture.

The metric is image->text top-1 on held-out pictures: each held-out picture is scored
against every distinct caption (shapes x colours x grid^2 x sizes of them) and counts when
its own caption scores highest. Chance is 1 / number of captions, reported beside it as
`chance_top1`.
"""

from __future__ import annotations

from engine.workloads.clip.params import Params


def num_samples(params: Params) -> int:
    """Training samples per epoch, known before the data is built (for the batch check)."""
    return params.samples


def build(params: Params, seed: int):
    # deferred: workload.py imports torch, which the card keeps out of presets and --help
    from engine.workloads.clip.workload import ClipWorkload

    return ClipWorkload(params, seed)

"""Which of a run's metrics are shown, and which one it is judged by besides its loss.

The front ends (headless lines, `runs show`, the TUI, compare) all ask here, so that an eval
shows its held-out loss first and never its timings (HF's eval_runtime, its *_per_second and
total_flos: engine.command.statements.is_timing, the rule the output parser keeps them out of
evals by), and a run's main metric is the same figure everywhere.
"""

from __future__ import annotations

import re
from typing import Iterable

from engine.command.statements import is_timing

_REWARD_MEAN = re.compile(r"^rewards[/_].+[/_]mean$")
_SPREAD = re.compile(r"(?:^|[/_])(?:std|min|max|var)$")
# Recall- and accuracy-like words, each a whole word of the name: val_acc, eval_recall@10.
_JUDGED = frozenset(("recall", "accuracy", "acc", "ndcg", "mrr", "f1", "precision"))


def shown_metrics(metrics: dict) -> dict:
    """An eval's metrics as the front ends show them: its losses first, the held-out one before
    the training one (eval_loss, val_loss, then nanoGPT's train_loss measured beside it: the
    eval shown is the held-out loss where it has one), then the others in their order; timings
    left out."""
    kept = {k: v for k, v in metrics.items() if not is_timing(k)}
    losses = sorted((k for k in kept if "loss" in _words(k)), key=lambda k: _words(k)[0] == "train")
    return {**{k: kept[k] for k in losses}, **{k: v for k, v in kept.items() if k not in losses}}


def _words(name: str) -> list[str]:
    return re.split(r"[^a-z0-9]+", name.lower())


def choose_main_metric(names: Iterable[str], named: str = "") -> str | None:
    """The one metric a run is judged by besides its loss, among `names` (those its steps and
    evals reported, in the order they first came): the preset's `main_metric` when it names one
    (even before it is reported; 'rewards/x/mean' and 'rewards_x_mean' are the same name),
    else a reward (`reward`, then `rewards/<name>/mean`, then any other reward but a spread),
    else a recall or accuracy; None when there is none."""
    names = [n for n in names if not is_timing(n)]
    if named:
        flat = re.sub(r"[/.]", "_", named)
        return next((n for n in names if n in (named, flat) or re.sub(r"[/.]", "_", n) == flat), named)
    rewards = [n for n in names if "reward" in n.lower() and not _SPREAD.search(n.lower())]
    for n in rewards:
        if n.lower() == "reward":
            return n
    for n in rewards:
        if _REWARD_MEAN.match(n.lower()):
            return n
    if rewards:
        return rewards[0]
    return next((n for n in names if _JUDGED.intersection(_words(n))), None)

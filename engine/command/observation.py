"""What a line of a command's output says (`Observation`), and the named values it says it with.

engine.command.progress reads a command's output a line at a time; each format it knows
(engine.command.progress_lines, engine.command.progress_bars) finds the named numbers on its
line here (`pairs`) and sorts them into an observation (`classify`): a training step or an
evaluation. Facts about the run (kind "facts") are the parser's own.

Named values: ``key=value`` or ``key: value`` pairs anywhere on a line (format 6 alone on a
line; after a step count, a per-epoch counter or a bar's rate, that format's values):
       ``loss=0.12 lr=3e-4``, ``epoch: 1, loss: 0.12, acc: 0.9`` -> step (needs a loss
       or a ``step``/``iter`` key)
       ``val_loss: 2.3, val_acc: 0.61`` -> eval
   A name is one word (``recall@10``, ``hits@1``: at k), or two where the first names a
   split and the second what is measured on it: ``train``, ``val``, ``valid``,
   ``validation``, ``eval`` or ``test``, then a metric's name (loss, acc, accuracy, ppl,
   recall, precision, mrr, ndcg, map, auc, f1, bleu, rouge, topK, hits, iou, dice, wer,
   cer, error, score, reward; ``val loss``, ``test top1``) or any name at k (``val
   recall@10``); ``eval mode: 0`` is prose. ``=``, ``:`` (spaces around either) or, for
   the names below, a space alone separates the value: ``epoch 3 done: train loss 0.41,
   val recall@10 0.7800`` -> eval of train_loss 0.41 and val_recall@10 0.78. With a space
   alone only loss, lr, learning_rate, train_loss, the two-word names, an evaluation's
   one-word names (``val_acc 0.9``) and names at k (``recall@10 0.78``) are read: prose
   has too many ``word 3``s. A unit or a
   percent sign right after a number is dropped (``time=45.67ms`` -> time 45.67), but
   a value in a unit per something (``3.2it/s``) is a rate and is left out, as is
   tqdm's own rate: the caller measures speed itself. Settings that merely name an
   evaluation (``eval_steps=500``, ``eval_interval = 250``) are not evaluations.

In an observation ``loss`` is the training loss (``loss``, else ``train_loss``); an eval
keeps every value under its name in ``metrics`` and leaves ``loss`` empty.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from engine.command.statements import is_setting

_LOSS_NAMES = ("loss", "train_loss", "train_loss_step")
_LR_NAMES = ("lr", "learning_rate")
_STEP_NAMES = ("step", "global_step", "iter", "iteration")
_EVAL_PREFIXES = ("val_", "eval_", "valid", "test_")
# An eval-prefixed name ending in one of these is a setting (eval_steps=500), not a value.
_SETTING_SUFFIXES = frozenset(
    "steps step iters iter interval every freq frequency delay size batches epochs "
    "samples split strategy workers".split())
# A bar's description or a table row's label that names an evaluation, not training.
EVAL_DESC = re.compile(r"(?:val|valid|validation|validating|eval|evaluation|evaluating|"
                       r"test|testing|sanity|predict|predicting)\b", re.IGNORECASE)

_NUMBER = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?:nan|inf(?:inity)?)\b)"
_UNIT = r"(?P<unit>%|[A-Za-zµ]+(?:/[A-Za-z]+)?)?"
_AT_K = r"@\d+"   # `recall@10`, `hits@1`
# Two-word names only for a split and what is measured on it (`val loss: 2.3`, `val recall@10
# 0.78`, `test top1 = 0.9`), not for prose (`eval mode: 0`): the second word a metric's name,
# or any name at k.
_METRIC_WORD = (r"(?:loss|acc|accuracy|ppl|perplexity|recall|precision|mrr|ndcg|map|auc|f1|"
                r"bleu|rouge\w*|top\d+|hits|iou|dice|wer|cer|error|err|score|reward)")
_TWO_WORDS = (rf"(?:train|val|valid|validation|eval|test)\s+"
              rf"(?:{_METRIC_WORD}(?:{_AT_K})?(?![\w@])|[A-Za-z_]\w*{_AT_K})")
_NAME = rf"{_TWO_WORDS}|[A-Za-z_][\w/]*(?:{_AT_K})?"
_PAIR = re.compile(rf"(?<![\w/.\-@])(?P<name>{_NAME})\s*[:=]\s*(?P<value>{_NUMBER}){_UNIT}(?![\w.])",
                   re.IGNORECASE)
# A name after a qualifier is a summary, not the current value: `best loss: inf`.
_QUALIFIED = re.compile(r"(?:best|min|minimum|max|maximum|lowest|highest|prev|previous|"
                        r"target|init|initial)[\s_]+$", re.IGNORECASE)
# With a space alone before the value: the usual names, an evaluation's (`val recall@10 0.78`,
# `val_acc 0.9`) and any name at k (`recall@10 0.78`); prose has too many `word 3`s for more.
_SPACED = re.compile(rf"(?<![\w/.\-@])(?P<name>{_TWO_WORDS}|train_loss|learning_rate|loss|lr"
                     rf"|(?:val|valid|validation|eval|test)_\w*(?:{_AT_K})?|[A-Za-z_]\w*{_AT_K})"
                     rf"\s+(?P<value>{_NUMBER}){_UNIT}(?![\w.])", re.IGNORECASE)
_VALUE = re.compile(rf"\s*(?P<value>{_NUMBER}){_UNIT}\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Observation:
    """One thing a line says: a training step, an evaluation, or facts about the run."""

    kind: str                 # "step", "eval" or "facts"
    step: int | None = None   # the counter, global: see `unit`
    total: int | None = None  # the counter's total, when the output says it
    loss: float | None = None
    lr: float | None = None
    epoch: float | None = None
    metrics: dict = field(default_factory=dict)  # other values by name (rates left out)
    source: str = ""          # "tqdm" | "rich" | "steps" | "epochs" | "keyvalue" | "hf" | "regex" | "stated"
    # "step": `step` is the script's optimizer step / iteration; "batch": it counts batches,
    # `step` = epoch_index x batches + batch, `total` = epochs x batches where both are known
    unit: str = "step"
    epoch_index: int | None = None  # "batch": epochs done before this one, from 0
    batch: int | None = None        # "batch": the count within the epoch, as printed
    batches: int | None = None      # "batch": batches per epoch, None if unknown
    # "facts": any of total, samples_per_step, tokens_per_step, accumulation, epochs
    facts: dict = field(default_factory=dict)
    said: str = ""            # "facts": the line that stated them, stripped (progress.SAID_MAX)


class PerEpoch(NamedTuple):
    """A count within an epoch, before the parser composes it into a global batch count
    (which needs what it has seen: the epoch numbering's base, the number of epochs)."""

    epoch: int | None         # as printed
    epochs: int | None        # the epochs the line itself states (`epoch 1/3`), else None
    batch: int
    batches: int | None
    values: dict
    source: str
    zero_based: bool          # a Lightning bar: epochs count from 0, whatever was seen
    evals: bool = True        # its values may be an evaluation (not a bar's)


def classify(values: dict, source: str, *, step: int | None = None, total: int | None = None,
             loss_names=_LOSS_NAMES, always: bool = False, evals: bool = True,
             normalise: bool = True) -> Observation | None:
    """Sort named values into an Observation; None when they say nothing about training.

    always: make a step observation even with neither a loss nor a step.
    evals: may be an eval (not for progress bars, whose values are the training's)."""
    values = dict(values)
    for name in _STEP_NAMES if normalise else ():
        found = integer(values.pop(name, None))
        step = step if step is not None else found
    epoch = values.pop("epoch", None)
    lr = _pop_first(values, _LR_NAMES)
    eval_names = [n for n in values if is_eval(n)]
    # Beside an eval value and no plain loss, a value is the evaluation's too: nanoGPT's
    # `train loss` measured at its eval, `epoch 1 val_loss: 2.3 recall@10: 0.25`.
    if evals and eval_names and "loss" not in values:
        return Observation("eval", step, total, None, lr, epoch, values, source)
    loss = _pop_first(values, loss_names)
    if loss is None and step is None and not always:
        return None
    return Observation("step", step, total, loss, lr, epoch, values, source)


def pairs(text: str) -> dict[str, float]:
    """The named numbers in `text` (`name=1`, `name: 1`, and `loss 1` for a few names)."""
    found: list[tuple[int, str, float]] = []
    taken: list[tuple[int, int]] = []   # spans read: `recall@10 0.78` inside `val recall@10 0.78`
    for pattern in (_PAIR, _SPACED):
        for m in pattern.finditer(text):
            if any(m.start() < end and start < m.end() for start, end in taken):
                continue
            taken.append(m.span())
            if "/" in (m["unit"] or ""):  # a rate: 3.2it/s
                continue
            if _QUALIFIED.search(text[max(0, m.start() - 12):m.start()]):
                continue  # `best loss: inf` is not the loss
            name = normalise(m["name"])
            if is_setting(name):
                continue  # `max_steps=300`, `batch_size: 8`: how the run is set, not a value
            found.append((m.start(), name, float(m["value"])))
    values: dict[str, float] = {}
    for _, name, value in sorted(found, key=lambda f: f[0]):
        values.setdefault(name, value)
    return values


def parse_number(text: str) -> float | None:
    """A number with an optional unit (`0.5`, `45.67ms`, `12%`, `nan`), else None."""
    m = _VALUE.fullmatch(str(text).replace(",", ""))
    if not m or "/" in (m["unit"] or ""):
        return None
    return float(m["value"])


def parse_count(text: str | None) -> int | None:
    """tqdm's count: `45`, or with unit_scale `1.20k`; None for `?` (Rich's `--`)."""
    if not text or text in ("?", "--"):
        return None
    scale = 1
    if text[-1] in "kMGTPEZY":
        scale, text = 1000 ** ("kMGTPEZY".index(text[-1]) + 1), text[:-1]
    return int(round(float(text) * scale))


def integer(value: float | None) -> int | None:
    return int(value) if value is not None and math.isfinite(value) else None


def _pop_first(values: dict, names) -> float | None:
    for name in names:
        if name in values:
            return values.pop(name)
    return None


def normalise(name: str) -> str:
    return re.sub(r"[\s/\-]+", "_", name.strip().lower())


def is_eval(name: str) -> bool:
    return name.startswith(_EVAL_PREFIXES) and name.rsplit("_", 1)[-1] not in _SETTING_SUFFIXES

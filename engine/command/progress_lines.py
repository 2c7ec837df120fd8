"""Printed lines of a command's output: your own regex, a logged dict, a table, a per-epoch or a
step counter, named values alone.

Formats 1, 2, 3b, 4, 5 and 6 of engine.command.progress: each function takes a line and gives
None when the line is not its format, else what it found (a table's row: of the header the
parser remembered; a per-epoch count: for the parser to compose into a global count). The
logging prefix a line may carry (`without_prefix`) is read here too.

1. Your own regex (``progress_regex``), with named groups ``step``, ``total``, ``loss``,
   ``lr``, ``epoch``; any other group name is a metric. When it matches, the line is
   its alone: it gives an observation if at least one group captured a number, else nothing.
       ``(?P<step>\\d+) \\| loss (?P<loss>\\S+)``
   With a ``batch`` group it counts batches (unit "batch"): ``epoch`` is then the epoch's
   number as printed, ``batches`` the batches per epoch, ``epochs`` the number of epochs.
       ``epoch (?P<epoch>\\d+) it (?P<batch>\\d+)/(?P<batches>\\d+) loss (?P<loss>\\S+)``

2. A Python dict or JSON object alone on a line, as Hugging Face Trainer prints its logs
   (values may be numbers, numeric strings, ``nan``, ``inf`` or ``np.float64(0.5)``):
       ``{'loss': 2.3456, 'grad_norm': 1.23, 'learning_rate': 4.5e-05, 'epoch': 0.12}``
       -> step (its number comes from the Trainer's tqdm bar in the same output)
       ``{'eval_loss': 2.1, 'eval_runtime': 0.5, 'epoch': 1.0}`` -> eval (eval_loss: the
       Trainer's timings, ``*_runtime`` and ``*_per_second``, and ``total_flos`` are not
       metrics of the model and are left out, as the callback leaves them out)
   The end-of-training summary (``{'train_runtime': ..., 'train_loss': ...}``) gives
   nothing: its train_loss is an average over the whole run, not a point on the curve.

3b. A table: a header of column names whose first is a step's (``iter``, ``step``,
   ``iteration``) and one of which is a loss, then rows that start with that count (source
   "table"), as mlx-lm prints:
       ``iter   train_loss     tok/s     tokens``   (the header: remembered, gives nothing)
       ``  10    6.739 ▼    168    3.9k``          -> step 10, loss 6.739 (glyphs are dropped,
                                                      ``3.9k`` is 3,900; a ``/s`` column is a
                                                      rate, left out)
       ``   1    val 6.795    1.54s``              -> eval at step 1: val_loss 6.795 (a row
                                                      labelled val, eval, test... gives that
                                                      label's value of the first column:
                                                      train_loss -> val_loss)
   A ``tokens`` column counts the tokens trained so far: with the row's step it states
   tokens_per_step (tokens / step), so throughput is in tokens/s. Another header takes the
   table's place; a line that does not fit it is read as any other line.

4. A per-epoch counter (unit "batch", source "epochs"), followed by values as in 6:
       ``epoch 1 batch 927/2244 loss 0.51``, ``Epoch 2 | batch 30/200 | loss=0.4``,
       ``epoch 1/3 batch 927/2244 ...`` (of three epochs), ``Epoch [1/5], Step [100/600],
       Loss: 0.2174`` (a step or iteration within an epoch needs its ``/N``: ``epoch 2
       step 500`` may count globally)

5. A line that starts with a step count, followed by values as in 6:
       ``step 120/5000 loss=2.31``, ``Step 3 of 10: loss: 0.5``, ``iter 10: loss 3.1234,
       time 45.67ms, mfu 12.34%`` (nanoGPT), ``iteration 7 ...``, ``[120/5000] ...``
   A line with evaluation values (named ``val_*``, ``eval_*``, ``valid*``, ``test_*``)
   and no plain ``loss`` is an eval, whose values are all the evaluation's: nanoGPT's ``step 250: train loss 2.1, val loss 2.3``, ``epoch 1
   val_loss: 2.3 recall@10: 0.25``; any other is a step.

6. Named values alone on a line (engine.command.observation tells how they are read):
       ``loss=0.12 lr=3e-4``, ``epoch: 1, loss: 0.12, acc: 0.9`` -> step (needs a loss
       or a ``step``/``iter`` key)
       ``val_loss: 2.3, val_acc: 0.61`` -> eval
"""

from __future__ import annotations

import ast
import re
import warnings
from typing import NamedTuple

from engine.command.observation import (EVAL_DESC, Observation, PerEpoch, classify, integer,
                                        normalise, pairs, parse_count, parse_number)
from engine.command.statements import is_setting, is_timing

# A table's header (its first column a step's) and its rows (`  10    6.739 ▼    168    3.9k`).
_TABLE_HEAD = re.compile(r"(?:iter|iteration|step|it)(?:\s+[A-Za-z_][\w/@%.()-]*){2,}", re.IGNORECASE)
_TABLE_ROW = re.compile(r"(?P<step>\d+)\s+(?P<rest>\S.*)")
_TABLE_GLYPH = re.compile(r"[^\w.%+-]+")  # ▼ ▲ ↑ ✓: a row's decoration, not a value
_CUMULATIVE_TOKENS = ("tokens", "trained_tokens", "tokens_seen", "num_tokens")

# A logging prefix may come first: `2026-05-09 07:35:25,101 INFO `, `INFO:__main__:`.
_LOG_PREFIX = (r"(?:[\[(]?\d{4}-\d\d-\d\d[ T][\d:.,]+[\])]?\s*(?:[-|:]\s*)?)?"
               r"(?:[\[(]?(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)[\])]?(?::[\w.]+:|\s*[-|:]?)\s*)?")
# A per-epoch counter: `epoch 1 batch 927/2244`, `Epoch 2 | batch 30/200`, `epoch 1/3 batch ..`,
# `Epoch [1/5], Step [100/600]` (a step or iteration of N within the epoch: with its `/N` only,
# since `epoch 2 step 500` may count globally).
_EPOCH_LINE = re.compile(_LOG_PREFIX + r"epoch\b\s*[:#=]?\s*\[?\s*(?P<epoch>\d+)"
                         r"(?:\s*(?:/|\bof\b)\s*(?P<epochs>\d+))?\s*\]?\s*[,|:;\-]?\s*"
                         r"(?P<word>batch|step|iteration|iter)\b\s*[:#=]?\s*\[?\s*(?P<batch>\d+)"
                         r"(?:\s*(?:/|\bof\b)\s*(?P<batches>\d+))?\s*\]?(?![\d.])", re.IGNORECASE)

# What a logging setup puts before a message: the HF Trainer's explicit format
# (`[INFO|trainer.py:2314] 2026-01-01 10:00:00,000 >> `), the examples' basicConfig
# (`01/01/2026 10:00:00 - INFO - transformers.trainer - `), or _LOG_PREFIX's.
_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)"
_MESSAGE_PREFIX = re.compile(
    rf"\[{_LEVEL}\|[^\]]*\]\s*(?:[^>]*>>\s*)?"
    rf"|(?:[\d/\-]+[ T][\d:,.]+\s+-\s+)?{_LEVEL}\s+-\s+[\w.]+\s+-\s*"
    rf"|{_LOG_PREFIX}")
_STEP_LINE = re.compile(_LOG_PREFIX + r"(?:(?:step|iteration|iter)\b\s*[:#=]?\s*\[?\s*(?P<step>\d+)"
                        r"(?:\s*(?:/|\bof\b)\s*(?P<total>\d+))?\s*\]?"
                        r"|\[\s*(?P<bstep>\d+)\s*/\s*(?P<btotal>\d+)\s*\])(?![\d.])",
                        re.IGNORECASE)


def without_prefix(line: str) -> str:
    """A line without its logging prefix, stripped."""
    m = _MESSAGE_PREFIX.match(line)
    return line[m.end():].strip() if m else line


def from_regex(m: re.Match) -> list:
    values = {}
    for name, text in m.groupdict().items():
        number = parse_number(text) if text is not None else None
        if number is not None:
            values[name] = number
    if not values:
        return []
    batch = integer(values.pop("batch", None))
    if batch is not None:  # a count within the epoch
        epoch, epochs = integer(values.pop("epoch", None)), integer(values.pop("epochs", None))
        batches = integer(values.pop("batches", None))
        return [PerEpoch(epoch, epochs or None, batch, batches or None, values, "regex",
                         zero_based=False)]
    step, total = integer(values.pop("step", None)), integer(values.pop("total", None))
    obs = classify(values, "regex", step=step, total=total, loss_names=("loss",),
                   always=True, normalise=False)
    return [obs] if obs else []


def hf_dict(line: str, nested: bool = False) -> list[Observation] | None:
    if not (line.startswith("{") and line.endswith("}")):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(line, mode="eval").body
    except Exception:
        return None
    if not isinstance(tree, ast.Dict):
        return None
    values: dict[str, float] = {}
    for key, node in zip(tree.keys, tree.values):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            number = _literal(node)
            if number is not None:
                values.setdefault(normalise(key.value), number)
    if "train_runtime" in values:  # the end-of-training summary
        return []
    values = {name: value for name, value in values.items()
              if not is_timing(name) and not is_setting(name)}
    obs = classify(values, "hf")
    return [obs] if obs else []


class TableRow(NamedTuple):
    """A row of a table: its observations, and the tokens per step its tokens column states."""

    observations: list[Observation]
    tokens_per_step: int | None = None


def table_head(line: str) -> list[str] | None:
    """A table's header (its first column a step's, one a loss): its column names."""
    return line.lower().split() if _TABLE_HEAD.fullmatch(line) and "loss" in line.lower() else None


def table_row(columns: list[str], line: str) -> TableRow | None:
    """A row of the table whose header is `columns`: None when the line is not one."""
    m = _TABLE_ROW.fullmatch(line)
    if not m:
        return None
    words = [w for w in _TABLE_GLYPH.sub(" ", m["rest"]).split() if w]
    step = int(m["step"])
    if words and EVAL_DESC.fullmatch(words[0]) and len(columns) > 1:
        # `1  val 6.795  1.54s`: the label's value of the first column (train_loss -> val_loss)
        value = _count_value(words[1]) if len(words) > 1 else None
        if value is None:
            return TableRow([])
        first, label = normalise(columns[1]), words[0].lower()
        name = first.replace("train", label, 1) if "train" in first else f"{label}_{first}"
        return TableRow([Observation("eval", step=step, metrics={name: value}, source="table")])
    values = {}
    for name, word in zip(columns[1:], words):
        value = _count_value(word)
        if value is None:
            return None  # not a row of this table
        if "/" not in name and not is_setting(normalise(name)):  # tok/s: a rate, measured here
            values[normalise(name)] = value
    tokens = next((values.pop(n) for n in _CUMULATIVE_TOKENS if n in values), None)
    obs = classify(values, "table", step=step, always=True, evals=False)
    return TableRow([obs] if obs is not None else [],
                    max(1, round(tokens / step)) if tokens and step > 0 else None)


def epoch_line(line: str, nested: bool = False) -> list | None:
    m = _EPOCH_LINE.match(line)
    if not m or (m["word"].lower() != "batch" and m["batches"] is None):
        return None
    epochs, batches = int(m["epochs"] or 0), int(m["batches"] or 0)
    return [PerEpoch(int(m["epoch"]), epochs or None, int(m["batch"]), batches or None,
                     pairs(line[m.end():]), "epochs", zero_based=False)]


def step_line(line: str, nested: bool = False) -> list[Observation] | None:
    m = _STEP_LINE.match(line)
    if not m:
        return None
    step = int(m["step"] or m["bstep"])
    total = m["total"] or m["btotal"]
    values = pairs(line[m.end():])
    obs = classify(values, "steps", step=step, total=int(total) if total else None, always=True)
    return [obs] if obs is not None else []   # always: never None


def key_values(line: str, nested: bool = False) -> list[Observation]:
    obs = classify(pairs(line), "keyvalue")
    return [obs] if obs else []


def _literal(node: ast.AST) -> float | None:
    """The number a dict value's syntax tree spells, without evaluating anything."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or node.value is None:
            return None
        if isinstance(node.value, (int, float)):
            return float(node.value)
        return parse_number(node.value) if isinstance(node.value, str) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        return None if value is None else (-value if isinstance(node.op, ast.USub) else value)
    if isinstance(node, ast.Name) and node.id.lower() in ("nan", "inf", "infinity"):
        return float(node.id)
    if isinstance(node, ast.Call) and len(node.args) == 1:  # np.float64(0.5), tensor(0.5)
        return _literal(node.args[0])
    return None


def _count_value(word: str) -> float | None:
    """A table cell: `3.9k` (3,900), `6.739`, `1.54s`; None for a word."""
    if re.fullmatch(r"\d+(?:\.\d+)?[kMGT]", word):
        return float(parse_count(word) or 0)
    return parse_number(word)



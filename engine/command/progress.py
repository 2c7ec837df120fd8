"""Read training progress from a command's own output (stdout and stderr), torch-free.

A command workload is the user's unmodified script; cockpit only sees what it prints.
`OutputParser` takes that output in chunks of any size and turns each line it understands
into an `Observation` (a training step or an evaluation). A line it does not understand
gives nothing, and no input makes it raise.

Lines end at a newline or a carriage return (tqdm redraws its bar with ``\\r``); ANSI escape
sequences are removed first. A line longer than 64 KiB (65,536 characters) is dropped.
Names are lowercased, with spaces, ``/`` and ``-`` turned into ``_`` (``val loss`` ->
``val_loss``, ``train/loss`` -> ``train_loss``).

Understood formats, tried in this order on each line:

1. Your own regex (``progress_regex``), with named groups ``step``, ``total``, ``loss``,
   ``lr``, ``epoch``; any other group name is a metric. When it matches, the line is
   its alone: it gives an observation if at least one group captured a number, else nothing.
       ``(?P<step>\\d+) \\| loss (?P<loss>\\S+)``

2. A Python dict or JSON object alone on a line, as Hugging Face Trainer prints its logs
   (values may be numbers, numeric strings, ``nan``, ``inf`` or ``np.float64(0.5)``):
       ``{'loss': 2.3456, 'grad_norm': 1.23, 'learning_rate': 4.5e-05, 'epoch': 0.12}``
       -> step (its number comes from the Trainer's tqdm bar in the same output)
       ``{'eval_loss': 2.1, 'eval_runtime': 0.5, 'epoch': 1.0}`` -> eval (eval_loss: the
       Trainer's timings, ``*_runtime`` and ``*_per_second``, and ``total_flos`` are not
       metrics of the model and are left out, as the callback leaves them out)
   The end-of-training summary (``{'train_runtime': ..., 'train_loss': ...}``) gives
   nothing: its train_loss is an average over the whole run, not a point on the curve.

3. A tqdm progress bar; ``key=value`` pairs after the rate become loss, lr and metrics:
       ``train:  45%|████▌     | 45/100 [00:12<00:15,  3.61it/s, loss=0.123, lr=1e-3]``
       ``45it [00:12, 3.61it/s]``  (no total)
   A bar described ``Epoch E`` (PyTorch Lightning's, or your own) counts batches within
   the epoch: step = E x batches per epoch + N (epochs counted from 0, as Lightning
   does), total unknown, epoch = E + N/M. Lightning's ``v_num`` is dropped. Bars
   described as validation, evaluation, testing, sanity checking or prediction, and bars
   drawn below another one (tqdm's nested bars, e.g. the Trainer's evaluation bar) give
   nothing, as does an epoch bar at 0. Once a loss has been read beside a bar (on it, or
   on a log line while it counts), a bar of another total is another loop and gives
   nothing: the Trainer's `evaluate()` after training draws a plain bar of its own.

4. A line that starts with a step count, followed by values as in 5:
       ``step 120/5000 loss=2.31``, ``Step 3 of 10: loss: 0.5``, ``iter 10: loss 3.1234,
       time 45.67ms, mfu 12.34%`` (nanoGPT), ``iteration 7 ...``, ``[120/5000] ...``
   A line whose values are all evaluation ones (named ``val_*``, ``eval_*``, ``valid*``,
   ``test_*``, next to which only ``train_*`` ones may stand, as in nanoGPT's
   ``step 250: train loss 2.1, val loss 2.3``) is an eval; any other is a step.

5. ``key=value`` or ``key: value`` pairs anywhere on a line, alone:
       ``loss=0.12 lr=3e-4``, ``epoch: 1, loss: 0.12, acc: 0.9`` -> step (needs a loss
       or a ``step``/``iter`` key)
       ``val_loss: 2.3, val_acc: 0.61`` -> eval
   Only a few names are read with a space and no ``=``/``:`` before the value: loss,
   lr, learning_rate, train_loss, val_loss, ``train loss``, ``val loss``. A unit or a
   percent sign right after a number is dropped (``time=45.67ms`` -> time 45.67), but
   a value in a unit per something (``3.2it/s``) is a rate and is left out, as is
   tqdm's own rate: the caller measures speed itself. Settings that merely name an
   evaluation (``eval_steps=500``, ``eval_interval = 250``) are not evaluations.

In an observation ``loss`` is the training loss (``loss``, else ``train_loss``); an eval
keeps every value under its name in ``metrics`` and leaves ``loss`` empty.
"""

from __future__ import annotations

import ast
import math
import re
import warnings
from dataclasses import dataclass, field

MAX_LINE = 64 * 1024  # characters; a longer line is dropped

_FIELDS = ("step", "total", "loss", "lr", "epoch")
_LOSS_NAMES = ("loss", "train_loss", "train_loss_step")
_LR_NAMES = ("lr", "learning_rate")
_STEP_NAMES = ("step", "global_step", "iter", "iteration")
_EVAL_PREFIXES = ("val_", "eval_", "valid", "test_")
# An eval-prefixed name ending in one of these is a setting (eval_steps=500), not a value.
_SETTING_SUFFIXES = frozenset(
    "steps step iters iter interval every freq frequency delay size batches epochs "
    "samples split strategy workers".split())

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CURSOR_UP = "\x1b[A"  # tqdm draws a nested bar one line down, then moves back up
_LINE_END = re.compile(r"[\r\n]")

_NUMBER = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?:nan|inf(?:inity)?)\b)"
_UNIT = r"(?P<unit>%|[A-Za-zµ]+(?:/[A-Za-z]+)?)?"
# Two-word names only for the usual ones (`val loss: 2.3`), not for prose (`eval mode: 0`).
_NAME = (r"(?:train|val|valid|validation|eval|test)\s+(?:loss|acc|accuracy|ppl|perplexity)\b"
         r"|[A-Za-z_][\w/]*")
_PAIR = re.compile(rf"(?<![\w/.\-])(?P<name>{_NAME})\s*[:=]\s*(?P<value>{_NUMBER}){_UNIT}(?![\w.])",
                   re.IGNORECASE)
# A name after a qualifier is a summary, not the current value: `best loss: inf`.
_QUALIFIED = re.compile(r"(?:best|min|minimum|max|maximum|lowest|highest|prev|previous|"
                        r"target|init|initial)[\s_]+$", re.IGNORECASE)
_SPACED = re.compile(r"(?<![\w/.\-])(?P<name>train loss|val loss|train_loss|val_loss|"
                     rf"learning_rate|loss|lr)\s+(?P<value>{_NUMBER}){_UNIT}(?![\w.])",
                     re.IGNORECASE)
_VALUE = re.compile(rf"\s*(?P<value>{_NUMBER}){_UNIT}\s*", re.IGNORECASE)

_COUNT = r"\d+(?:\.\d+)?[kMGTPEZY]?"
_TQDM_BAR = re.compile(rf"(?:(?P<desc>.*?):\s*)?(?:\d{{1,3}}%)?\|[^|]*\|\s*"
                       rf"(?P<n>{_COUNT})/(?P<total>{_COUNT}|\?)\s*\[(?P<inner>[^\]]*)\]")
_TQDM_COUNT = re.compile(rf"(?:(?P<desc>.*?):\s*)?(?P<n>{_COUNT})[A-Za-z]*\s*"
                         r"\[(?P<inner>(?:\d+:)?\d+:\d+[^\]]*)\]")
_EPOCH_DESC = re.compile(r"epoch\s+(\d+)(?:\s*/\s*-?\d+)?", re.IGNORECASE)  # Rich's "0/-2"
# Rich's progress bar (Lightning's default where rich is installed): description, bar,
# done/total (`--`: unknown), elapsed • remaining (blank in the last frame), rate, then
# `name: value` metrics.
_RICH_BAR = re.compile(r"(?P<desc>.*?)\s+[━╸╺╾╼─\s]*?(?P<n>\d+)/(?P<total>\d+|--)\s+"
                       r"(?:\d+:)?\d+:\d\d\s+•(?:\s+(?:-:--:--|(?:\d+:)?\d+:\d\d))?"
                       r"(?:\s+[\d.]+(?:it/s|s/it))?\s*(?P<post>.*)")
# Once Rich has drawn a frame, a row indented this far continues its live display (a second
# row of metrics, redrawn with every frame): not a line of its own.
_CONTINUATION = " " * 20
_EVAL_DESC = re.compile(r"(?:val|valid|validation|validating|eval|evaluation|evaluating|"
                        r"test|testing|sanity|predict|predicting)\b", re.IGNORECASE)
# Bars of the work around training, not training steps: datasets' `Map: 1000/1000`,
# `Resolving data files`, `Loading checkpoint shards`, downloads, tokenisation.
_PREP_DESC = re.compile(r"(?:map|filter|tokeniz|tokenis|load|download|fetch|resolv|generat|"
                        r"preprocess|process|prepar|build|convert|extract|shard|saving|writing|"
                        r"reading|copying|uploading)", re.IGNORECASE)

# A logging prefix may come first: `2026-05-09 07:35:25,101 INFO `, `INFO:__main__:`.
_LOG_PREFIX = (r"(?:[\[(]?\d{4}-\d\d-\d\d[ T][\d:.,]+[\])]?\s*(?:[-|:]\s*)?)?"
               r"(?:[\[(]?(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)[\])]?(?::[\w.]+:|\s*[-|:]?)\s*)?")
_STEP_LINE = re.compile(_LOG_PREFIX + r"(?:(?:step|iteration|iter)\b\s*[:#=]?\s*\[?\s*(?P<step>\d+)"
                        r"(?:\s*(?:/|\bof\b)\s*(?P<total>\d+))?\s*\]?"
                        r"|\[\s*(?P<bstep>\d+)\s*/\s*(?P<btotal>\d+)\s*\])(?![\d.])",
                        re.IGNORECASE)


@dataclass(frozen=True)
class Observation:
    """One thing a line says: a training step, or an evaluation."""

    kind: str                 # "step" or "eval"
    step: int | None = None   # optimizer step / iteration as the script counts it (global)
    total: int | None = None  # total steps, when the output says it
    loss: float | None = None
    lr: float | None = None
    epoch: float | None = None
    metrics: dict = field(default_factory=dict)  # other values by name (rates left out)
    source: str = ""          # "tqdm" | "steps" | "keyvalue" | "hf" | "regex"


def compile_regex(text: str) -> re.Pattern:
    """Compile a user's progress regex; ValueError with a one-line reason if unusable."""
    try:
        pattern = re.compile(text)
    except (re.error, TypeError) as e:
        pos = getattr(e, "pos", None)   # re.error's; a TypeError has none
        where = f" at position {pos}" if pos is not None else ""
        raise ValueError(f"invalid progress regex {text!r}: {getattr(e, 'msg', e)}{where}") from None
    if not {"step", "loss"} & set(pattern.groupindex):
        raise ValueError(
            f"progress regex {text!r} needs a named group (?P<step>...) or (?P<loss>...); "
            f"understood names: {', '.join(_FIELDS)}, any other name is a metric")
    return pattern


class OutputParser:
    """Turns a command's output, fed in chunks of any size, into observations."""

    def __init__(self, regex: str | re.Pattern | None = None):
        self._regex = regex if isinstance(regex, re.Pattern) or regex is None \
            else compile_regex(regex)
        self._partial = ""
        self._skipping = False  # inside a line already dropped for its length
        self._bar_total: int | None = None       # the total of the bar drawn last
        self._training_total: int | None = None  # that of the bar known to be training
        self._live = False                       # Rich's live display has drawn a frame

    def feed(self, text: str) -> list[Observation]:
        """Parse the complete lines in `text`; a trailing partial line waits for more."""
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", "replace")
        pieces = _LINE_END.split(str(text))
        out: list[Observation] = []
        for piece in pieces[:-1]:
            line, self._partial = self._partial + piece, ""
            if self._skipping:
                self._skipping = False
            else:
                out.extend(self._parse(line))
        self._partial += pieces[-1]
        if len(self._partial) > MAX_LINE:
            self._partial, self._skipping = "", True
        return out

    def flush(self) -> list[Observation]:
        """Parse what is left at the end of the output."""
        line, skipping = self._partial, self._skipping
        self._partial, self._skipping = "", False
        return [] if skipping else self._parse(line)

    def _parse(self, raw: str) -> list[Observation]:
        if len(raw) > MAX_LINE:
            return []
        try:
            if not self._live and "━" in raw and _RICH_BAR.search(_ANSI.sub("", raw)):
                self._live = True
            return [o for o in _parse_line(raw, self._regex, self._live) if self._training(o)]
        except Exception:  # a line we misread is a line we skip, never a crash
            return []

    def _training(self, o: Observation) -> bool:
        """Whether an observation belongs to the training loop. A bar is known to be the
        training loop's once a loss is read beside it (on the bar, or on a log line while it
        is the bar drawn last); after that a bar of another total with no loss on it is
        another loop — the Trainer's `evaluate()` after training draws a plain bar, no
        description, of its own — until a loss is read beside it (a second `train()`)."""
        if o.kind != "step":
            return True
        if o.source in ("tqdm", "rich") and o.total is not None:
            self._bar_total = o.total
            if self._training_total not in (None, o.total) and o.loss is None:
                return False
        if o.loss is not None and self._bar_total is not None:
            self._training_total = self._bar_total
        return True


def _parse_line(raw: str, regex: re.Pattern | None = None, live: bool = False) -> list[Observation]:
    """The observations in one line of output (raw: ANSI sequences still in it); `live`: a
    Rich live display has drawn in this output, so deeply indented rows are its own."""
    line = _ANSI.sub("", raw)
    if live and line.startswith(_CONTINUATION):
        return []
    line = line.strip()
    if not line:
        return []
    if regex is not None:
        m = regex.search(line)
        if m:
            return _from_regex(m)
    for parse in (_hf_dict, _tqdm_bar, _rich_bar, _step_line, _key_values):
        found = parse(line, nested=_CURSOR_UP in raw)
        if found is not None:  # the line is this format's, whatever it gave
            return found
    return []


# -- formats: each returns None when the line is not its format, else what it found --

def _from_regex(m: re.Match) -> list[Observation]:
    values = {}
    for name, text in m.groupdict().items():
        number = _number(text) if text is not None else None
        if number is not None:
            values[name] = number
    if not values:
        return []
    step, total = _integer(values.pop("step", None)), _integer(values.pop("total", None))
    obs = _classify(values, "regex", step=step, total=total, loss_names=("loss",),
                    always=True, normalise=False)
    return [obs] if obs else []


def _hf_dict(line: str, nested: bool = False) -> list[Observation] | None:
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
                values.setdefault(_normalise(key.value), number)
    if "train_runtime" in values:  # the end-of-training summary
        return []
    values = {name: value for name, value in values.items() if not _hf_timing(name)}
    obs = _classify(values, "hf")
    return [obs] if obs else []


def _hf_timing(name: str) -> bool:
    """A figure the Trainer logs about its own speed (eval_runtime, eval_samples_per_second,
    total_flos), not about the model."""
    return name == "total_flos" or name.endswith(("_runtime", "_per_second"))


def _tqdm_bar(line: str, nested: bool = False) -> list[Observation] | None:
    m = _TQDM_BAR.match(line) or _TQDM_COUNT.match(line)
    if not m:
        return None
    parts = m["inner"].split(",", 2)  # elapsed<remaining, rate, postfix
    values = _pairs(parts[2]) if len(parts) > 2 else {}
    return _bar(m["desc"], m["n"], m.groupdict().get("total"), values, nested, "tqdm")


def _rich_bar(line: str, nested: bool = False) -> list[Observation] | None:
    m = _RICH_BAR.fullmatch(line)
    if not m:
        return None
    return _bar(m["desc"], m["n"], m["total"], _pairs(m["post"]), nested, "rich")


def _bar(desc: str | None, n: str, total: str | None, values: dict, nested: bool,
         source: str) -> list[Observation]:
    """What a progress bar's line says: its count as the step, unless it counts something
    other than training (an evaluation, the work around training, a nested bar)."""
    desc = (desc or "").strip()
    if nested or _EVAL_DESC.match(desc) or _PREP_DESC.match(desc):
        return []
    count, of = _count(n), _count(total)
    values.pop("v_num", None)
    epoch_desc = _EPOCH_DESC.fullmatch(desc)
    if epoch_desc:  # counts batches within the epoch
        if count == 0:
            return []
        epoch = int(epoch_desc[1])
        values["epoch"] = epoch + count / of if of and count is not None else float(epoch)
        # an unknown total (an iterable dataset): the count is the step only in epoch 0
        step = epoch * of + count if of and count is not None else (count if epoch == 0 else None)
        of = None
    else:
        if count == 0 and of is None:
            return []
        step = count
    obs = _classify(values, source, step=step, total=of, always=True, evals=False)
    return [obs] if obs is not None else []   # always: never None


def _step_line(line: str, nested: bool = False) -> list[Observation] | None:
    m = _STEP_LINE.match(line)
    if not m:
        return None
    step = int(m["step"] or m["bstep"])
    total = m["total"] or m["btotal"]
    values = _pairs(line[m.end():])
    obs = _classify(values, "steps", step=step, total=int(total) if total else None, always=True)
    return [obs] if obs is not None else []   # always: never None


def _key_values(line: str, nested: bool = False) -> list[Observation]:
    obs = _classify(_pairs(line), "keyvalue")
    return [obs] if obs else []


# -- helpers --

def _classify(values: dict, source: str, *, step: int | None = None, total: int | None = None,
              loss_names=_LOSS_NAMES, always: bool = False, evals: bool = True,
              normalise: bool = True) -> Observation | None:
    """Sort named values into an Observation; None when they say nothing about training.

    always: make a step observation even with neither a loss nor a step.
    evals: may be an eval (not for progress bars, whose values are the training's)."""
    values = dict(values)
    for name in _STEP_NAMES if normalise else ():
        found = _integer(values.pop(name, None))
        step = step if step is not None else found
    epoch = values.pop("epoch", None)
    lr = _pop_first(values, _LR_NAMES)
    eval_names = [n for n in values if _is_eval(n)]
    others = [n for n in values if n not in eval_names and not n.startswith("train_")]
    if evals and eval_names and not others:
        return Observation("eval", step, total, None, lr, epoch, values, source)
    loss = _pop_first(values, loss_names)
    if loss is None and step is None and not always:
        return None
    return Observation("step", step, total, loss, lr, epoch, values, source)


def _pairs(text: str) -> dict[str, float]:
    """The named numbers in `text` (`name=1`, `name: 1`, and `loss 1` for a few names)."""
    found: list[tuple[int, str, float]] = []
    for pattern in (_PAIR, _SPACED):
        for m in pattern.finditer(text):
            if "/" in (m["unit"] or ""):  # a rate: 3.2it/s
                continue
            if _QUALIFIED.search(text[max(0, m.start() - 12):m.start()]):
                continue  # `best loss: inf` is not the loss
            found.append((m.start(), _normalise(m["name"]), float(m["value"])))
    values: dict[str, float] = {}
    for _, name, value in sorted(found, key=lambda f: f[0]):
        values.setdefault(name, value)
    return values


def _literal(node: ast.AST) -> float | None:
    """The number a dict value's syntax tree spells, without evaluating anything."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or node.value is None:
            return None
        if isinstance(node.value, (int, float)):
            return float(node.value)
        return _number(node.value) if isinstance(node.value, str) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand)
        return None if value is None else (-value if isinstance(node.op, ast.USub) else value)
    if isinstance(node, ast.Name) and node.id.lower() in ("nan", "inf", "infinity"):
        return float(node.id)
    if isinstance(node, ast.Call) and len(node.args) == 1:  # np.float64(0.5), tensor(0.5)
        return _literal(node.args[0])
    return None


def _number(text: str) -> float | None:
    """A number with an optional unit (`0.5`, `45.67ms`, `12%`, `nan`), else None."""
    m = _VALUE.fullmatch(str(text).replace(",", ""))
    if not m or "/" in (m["unit"] or ""):
        return None
    return float(m["value"])


def _count(text: str | None) -> int | None:
    """tqdm's count: `45`, or with unit_scale `1.20k`; None for `?` (Rich's `--`)."""
    if not text or text in ("?", "--"):
        return None
    scale = 1
    if text[-1] in "kMGTPEZY":
        scale, text = 1000 ** ("kMGTPEZY".index(text[-1]) + 1), text[:-1]
    return int(round(float(text) * scale))


def _integer(value: float | None) -> int | None:
    return int(value) if value is not None and math.isfinite(value) else None


def _pop_first(values: dict, names) -> float | None:
    for name in names:
        if name in values:
            return values.pop(name)
    return None


def _normalise(name: str) -> str:
    return re.sub(r"[\s/\-]+", "_", name.strip().lower())


def _is_eval(name: str) -> bool:
    return name.startswith(_EVAL_PREFIXES) and name.rsplit("_", 1)[-1] not in _SETTING_SUFFIXES

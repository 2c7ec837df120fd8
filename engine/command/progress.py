"""Read training progress from a command's own output (stdout and stderr), torch-free.

A command workload is the user's unmodified script; cockpit only sees what it prints.
`OutputParser` takes that output in chunks of any size and turns each line it understands
into an `Observation`: a training step, an evaluation, or facts the script states about
its run (kind "facts"). A line it does not understand gives nothing, and no input makes it
raise.

A step's counter has a unit. ``"step"``: it is the script's optimizer step or iteration
(``iter N``, ``step N``, HF's bar). ``"batch"``: it counts batches within epochs (a bar
described ``Epoch E``, ``epoch E batch B/N`` lines, a regex with a ``batch`` group); then
``step`` is the global batch count E' x N + B (E' the epochs done, from 0), with
``epoch_index`` (E'), ``batch`` (B) and ``batches`` (N, None if unknown), and ``total`` is
epochs x N where the epochs are known: from the line (``epoch 1/3``, Rich's ``Epoch 1/9``:
ten), else from a fact stated earlier, else from the argv's facts given to the parser
(``OutputParser(known=statements.from_argv(argv))``). Without N, the count is the step in
the first epoch only. Lightning's bars count epochs from 0; printed lines from the base
the parser settles on (``OutputParser.epoch_base``): 0 once it has seen an epoch 0, else 1
once the first epoch it sees is 1 (or the last, ``epoch 3/3``); a resumed attempt, whose
first epoch may be 3, is given the run's base (``OutputParser(epoch_base=1)``); unsettled,
it counts from 1.

Settings are never values: names ``max_*``, ``num_*``, ``*_steps``, ``*_iters``,
``*_epochs``, ``*_batches``, ``batch_size`` and accumulation names
(engine.command.statements.is_setting) are left out wherever values are read.

Lines end at a newline or a carriage return (tqdm redraws its bar with ``\\r``); ANSI escape
sequences are removed first. A line longer than 64 KiB (65,536 characters) is dropped.
Names are lowercased, with spaces, ``/`` and ``-`` turned into ``_`` (``val loss`` ->
``val_loss``, ``train/loss`` -> ``train_loss``).

Understood formats, tried in this order on each line:

0. Statements (kind "facts", source "stated"; engine.command.statements reads them; each fact
   once, again only when its value changes; ``said`` quotes the line without its logging
   prefix, at most 120 characters):
       ``tokens per iteration will be: 491,520`` (nanoGPT) -> tokens_per_step
       ``Overriding: max_iters = 200`` (nanoGPT's configurator) -> total; a setting that is
       not a fact (``Overriding: batch_size = 12``) gives nothing
       a config line alone, ``max_iters = 200``, ``max_steps: 300``, ``num_train_steps=500``,
       ``trainer.max_epochs: 3  # ...`` -> total, epochs or accumulation by its name (see
       engine.command.statements; ``steps = 100`` alone may be a count, and gives nothing)
       "`Trainer.fit` stopped: `max_steps=300` reached." (Lightning, anywhere on a line)
       a config printed whole, ``Namespace(max_steps=300, ...)``, ``config: {'max_iters':
       5000, ...}`` -> its settings' facts (the line may be a step besides)
       the HF Trainer's ``***** Running training *****`` rows, with or without a logging
       prefix (``[INFO|trainer.py:2314] 2026-01-01 10:00:00,000 >>``):
       ``  Num Epochs = 3`` -> epochs,
       ``  Total train batch size (w. parallel, distributed & accumulation) = 32`` ->
       samples_per_step, ``  Gradient Accumulation steps = 4`` -> accumulation,
       ``  Total optimization steps = 189`` -> total; its other rows give nothing.
   Any other ``***** ... *****`` block gives nothing: ``trainer.log_metrics()``'s tables
   (``***** train metrics *****`` then ``  train_loss = 5.0598`` rows) are a summary, and
   ``***** Running Evaluation *****``'s rows are settings. A block ends at the first line
   that is not a ``  name = value`` row.

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

3. A tqdm progress bar; ``key=value`` pairs after the rate become loss, lr and metrics:
       ``train:  45%|████▌     | 45/100 [00:12<00:15,  3.61it/s, loss=0.123, lr=1e-3]``
       ``45it [00:12, 3.61it/s]``  (no total)
   A bar described ``Epoch E`` (PyTorch Lightning's, or your own) counts batches within
   the epoch (unit "batch"): step = E x batches per epoch + N (epochs counted from 0, as
   Lightning does), epoch = E + N/M. Lightning's ``v_num`` is dropped. Evaluation values
   on a training bar (Lightning's ``val_loss``, also on the row Rich draws under its bar)
   are an eval at the bar's step, each time they change, not on every redraw. Bars
   described as validation, evaluation, testing, sanity checking or prediction, and bars
   drawn below another one (tqdm's nested bars, e.g. the Trainer's evaluation bar) give
   nothing, as does an epoch bar at 0. Once a loss has been read beside a bar (on it, or
   on a log line while it counts), a bar of another total is another loop and gives
   nothing: the Trainer's `evaluate()` after training draws a plain bar of its own.

3a. A bar drawn as ``DESC ███▌░░  92% ·    11/12`` (mlx-lm's, Rich with a percentage and a
   count): its count as the step, with the same rules as 3 (a ``val`` bar gives nothing).

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

6. ``key=value`` or ``key: value`` pairs anywhere on a line, alone:
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
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from engine.command import statements
from engine.command.statements import is_setting, is_timing
from engine.text import strip_ansi

MAX_LINE = 64 * 1024  # characters; a longer line is dropped
SAID_MAX = 120        # characters of a stating line kept in Observation.said

_FIELDS = ("step", "total", "loss", "lr", "epoch", "batch", "batches", "epochs")
_LOSS_NAMES = ("loss", "train_loss", "train_loss_step")
_LR_NAMES = ("lr", "learning_rate")
_STEP_NAMES = ("step", "global_step", "iter", "iteration")
_EVAL_PREFIXES = ("val_", "eval_", "valid", "test_")
# An eval-prefixed name ending in one of these is a setting (eval_steps=500), not a value.
_SETTING_SUFFIXES = frozenset(
    "steps step iters iter interval every freq frequency delay size batches epochs "
    "samples split strategy workers".split())

_CURSOR_UP = "\x1b[A"  # tqdm draws a nested bar one line down, then moves back up
_LINE_END = re.compile(r"[\r\n]")

_NUMBER = r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|(?:nan|inf(?:inity)?)\b)"
_UNIT = r"(?P<unit>%|[A-Za-zµ]+(?:/[A-Za-z]+)?)?"
# Two-word names only for the usual ones (`val loss: 2.3`), not for prose (`eval mode: 0`).
_NAME = (r"(?:train|val|valid|validation|eval|test)\s+(?:loss|acc|accuracy|ppl|perplexity)\b"
         r"|[A-Za-z_][\w/]*(?:@\d+)?")  # `recall@10`, `hits@1`
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
_EPOCH_DESC = re.compile(r"epoch\s+(\d+)(?:\s*/\s*(-?\d+))?", re.IGNORECASE)  # Rich's "0/-2"
# Rich's progress bar (Lightning's default where rich is installed): description, bar,
# done/total (`--`: unknown), elapsed • remaining (blank in the last frame), rate, then
# `name: value` metrics.
_RICH_BAR = re.compile(r"(?P<desc>.*?)\s+[━╸╺╾╼─\s]*?(?P<n>\d+)/(?P<total>\d+|--)\s+"
                       r"(?:\d+:)?\d+:\d\d\s+•(?:\s+(?:-:--:--|(?:\d+:)?\d+:\d\d))?"
                       r"(?:\s+[\d.]+(?:it/s|s/it))?\s*(?P<post>.*)")
# A bar of block glyphs, a percentage, then `· done/total` (mlx-lm's Rich bar).
_PERCENT_BAR = re.compile(r"(?P<desc>\S.*?)\s+[█▉▊▋▌▍▎▏▐░▒▓━╸╺ ]+\s*\d{1,3}%\s+·\s+(?P<n>\d+)/(?P<total>\d+)\s*")
# A table's header (its first column a step's) and its rows (`  10    6.739 ▼    168    3.9k`).
_TABLE_HEAD = re.compile(r"(?:iter|iteration|step|it)(?:\s+[A-Za-z_][\w/@%.()-]*){2,}", re.IGNORECASE)
_TABLE_ROW = re.compile(r"(?P<step>\d+)\s+(?P<rest>\S.*)")
_TABLE_GLYPH = re.compile(r"[^\w.%+-]+")  # ▼ ▲ ↑ ✓: a row's decoration, not a value
_CUMULATIVE_TOKENS = ("tokens", "trained_tokens", "tokens_seen", "num_tokens")
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
# The HF Trainer's blocks: `***** Running training *****` then `  Num examples = 2,000` rows;
# `***** train metrics *****` (trainer.log_metrics) then `  train_loss = 5.0598` rows.
_BLOCK_HEAD = re.compile(r"\*{3,}\s*(?P<title>[^*\s][^*]*?)\s*\*{3,}")
_BLOCK_ROW = re.compile(r"[A-Za-z][\w .,&()'/\-]*?(?:\s+=\s+\S+|:\s*Unknown)")
_STEP_LINE = re.compile(_LOG_PREFIX + r"(?:(?:step|iteration|iter)\b\s*[:#=]?\s*\[?\s*(?P<step>\d+)"
                        r"(?:\s*(?:/|\bof\b)\s*(?P<total>\d+))?\s*\]?"
                        r"|\[\s*(?P<bstep>\d+)\s*/\s*(?P<btotal>\d+)\s*\])(?![\d.])",
                        re.IGNORECASE)


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
    said: str = ""            # "facts": the line that stated them, stripped, at most SAID_MAX


class _PerEpoch(NamedTuple):
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


def compile_regex(text: str) -> re.Pattern:
    """Compile a user's progress regex; ValueError with a one-line reason if unusable."""
    try:
        pattern = re.compile(text)
    except (re.error, TypeError) as e:
        pos = getattr(e, "pos", None)   # re.error's; a TypeError has none
        where = f" at position {pos}" if pos is not None else ""
        raise ValueError(f"invalid progress regex {text!r}: {getattr(e, 'msg', e)}{where}") from None
    if not {"step", "loss", "batch"} & set(pattern.groupindex):
        raise ValueError(
            f"progress regex {text!r} needs a named group (?P<step>...), (?P<batch>...) "
            f"or (?P<loss>...); "
            f"understood names: {', '.join(_FIELDS)}, any other name is a metric")
    return pattern


class OutputParser:
    """Turns a command's output, fed in chunks of any size, into observations.

    known: the facts the command's argv states (engine.command.statements.from_argv: values,
    or (value, words) pairs), for a total of epochs x batches per epoch.
    epoch_base: the first epoch's number in printed per-epoch lines (0 or 1), when an earlier
    attempt of the run settled it; else the parser settles it (see `epoch_base`)."""

    def __init__(self, regex: str | re.Pattern | None = None, *, known: dict | None = None,
                 epoch_base: int | None = None):
        self._regex = regex if isinstance(regex, re.Pattern) or regex is None \
            else compile_regex(regex)
        self._partial = ""
        self._skipping = False  # inside a line already dropped for its length
        self._bar_total: int | None = None       # the total of the bar drawn last
        self._training_total: int | None = None  # that of the bar known to be training
        self._live = False                       # Rich's live display has drawn a frame
        self._known = _fact_values(known)
        self._facts: dict[str, int] = {}         # stated in the output so far
        self._base_given = epoch_base in (0, 1)
        # The number printed per-epoch lines give the first epoch: 0 once an epoch 0 is
        # seen, else 1 once the first epoch seen is 1 (or `epoch 3/3`); None until then.
        self.epoch_base: int | None = epoch_base if self._base_given else None
        self._block: str | None = None           # inside an HF `***** ... *****` block
        self._table: list[str] | None = None     # a table's column names, its header read
        self._last_bar: Observation | None = None  # the training bar's last step
        self._bar_evals: dict = {}               # the eval values last read on that bar
        # For per-epoch counts that never say their epoch's size (`epoch 2 batch 30`): the
        # highest batch of the epoch being counted, and of whole epochs counted before it.
        self._epoch_counted: tuple[int, int] | None = None   # (epoch, highest batch)
        self._learnt_batches: int | None = None

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
            if not self._live and "━" in raw and _RICH_BAR.search(strip_ansi(raw)):
                self._live = True
            out = []
            for o in self._line(raw):
                o = self._compose(o) if isinstance(o, _PerEpoch) else o
                o = self._settle(o) if o is not None else None
                if o is not None:
                    out.append(o)
            return out
        except Exception:  # a line we misread is a line we skip, never a crash
            return []

    def _line(self, raw: str) -> list:
        """What one line says (raw: ANSI sequences still in it), per-epoch counts still to
        be composed."""
        line = strip_ansi(raw)
        if self._live and line.startswith(_CONTINUATION):
            # a row of Rich's live display under the bar (metrics that did not fit on it)
            evals = {n: v for n, v in _pairs(line).items() if _is_eval(n)}
            return [Observation("eval", metrics=evals, source="rich")] if evals else []
        line = line.strip()
        message = _message(line)
        if self._block is not None:
            if _BLOCK_ROW.fullmatch(message):  # a row: a fact, or a summary's figure
                return (self._stated(message) or []) if self._block == "training" else []
            self._block = None
        if not line:
            return []
        head = _BLOCK_HEAD.fullmatch(message)
        if head:
            self._block = "training" if head["title"].lower() == "running training" else "other"
            return []
        stated = self._stated(message)
        if stated is not None:
            return stated
        found = []
        if (stopped := statements.fit_stopped(line)) is not None:
            found += self._facts_of(*stopped)
        # a config printed whole (argparse's Namespace(...), a dict): its settings, and
        # whatever else the line is (a log dict with a loss is still a step)
        found += self._facts_of(message, statements.dumped_in(message))
        if self._regex is not None:
            m = self._regex.search(line)
            if m:
                return found + _from_regex(m)
        if _TABLE_HEAD.fullmatch(line) and "loss" in line.lower():
            self._table = line.lower().split()
            return found
        if self._table is not None and (row := self._table_row(line)) is not None:
            return found + row
        for parse in (_hf_dict, _tqdm_bar, _rich_bar, _percent_bar, _epoch_line, _step_line, _key_values):
            said = parse(line, nested=_CURSOR_UP in raw)
            if said is not None:  # the line is this format's, whatever it gave
                return found + said
        return found

    def _stated(self, message: str) -> list[Observation] | None:
        """A line that states a unit or a total: its facts (new ones only); None when the
        line states nothing. `message`: the line without its logging prefix, which is what
        the facts' `said` quotes."""
        facts = statements.stated_in(message)
        if facts is None:
            return [] if self._block == "training" else None
        return self._facts_of(message, facts)

    def _table_row(self, line: str) -> list[Observation] | None:
        """A row of the table whose header was read: None when the line is not one."""
        m = _TABLE_ROW.fullmatch(line)
        columns = self._table or []
        if not m:
            return None
        words = [w for w in _TABLE_GLYPH.sub(" ", m["rest"]).split() if w]
        step = int(m["step"])
        if words and _EVAL_DESC.fullmatch(words[0]) and len(columns) > 1:
            # `1  val 6.795  1.54s`: the label's value of the first column (train_loss -> val_loss)
            value = _count_value(words[1]) if len(words) > 1 else None
            if value is None:
                return []
            first, label = _normalise(columns[1]), words[0].lower()
            name = first.replace("train", label, 1) if "train" in first else f"{label}_{first}"
            return [Observation("eval", step=step, metrics={name: value}, source="table")]
        values = {}
        for name, word in zip(columns[1:], words):
            value = _count_value(word)
            if value is None:
                return None  # not a row of this table
            if "/" not in name and not is_setting(_normalise(name)):  # tok/s: a rate, measured here
                values[_normalise(name)] = value
        tokens = next((values.pop(n) for n in _CUMULATIVE_TOKENS if n in values), None)
        found = []
        if tokens and step > 0:
            found += self._facts_of(line, {"tokens_per_step": max(1, round(tokens / step))})
        obs = _classify(values, "table", step=step, always=True, evals=False)
        return found + ([obs] if obs is not None else [])

    def _facts_of(self, said: str, facts: dict) -> list[Observation]:
        """A facts observation of those that are new (a restatement says nothing)."""
        facts = {k: v for k, v in facts.items()
                 if k is not None and v is not None and self._facts.get(k) != v}
        if not facts:
            return []
        self._facts.update(facts)
        return [Observation("facts", facts=facts, said=said.strip()[:SAID_MAX], source="stated")]

    def _compose(self, c: _PerEpoch) -> Observation | None:
        """A count within an epoch as a global batch count: E' x N + B, E' the epochs done."""
        if c.zero_based or c.epoch is None:
            base = 0
        else:
            base = self._settle_base(c.epoch, c.epochs)
        done = None if c.epoch is None else c.epoch - base
        if done is not None and done < 0:
            done = None  # an epoch before the run's first: nothing to compose
        n = c.batches or self._learn_batches(c)
        if done is None:
            step = c.batch if c.epoch is None else None
        else:
            step = done * n + c.batch if n else (c.batch if done == 0 else None)
        epochs = c.epochs or self._facts.get("epochs") or self._known.get("epochs")
        values = dict(c.values)
        if done is not None:
            values["epoch"] = done + c.batch / n if n else float(done)
        o = _classify(values, c.source, step=step, total=epochs * n if epochs and n else None,
                      always=True, evals=c.evals)
        assert o is not None  # always=True: an observation, whatever the values
        return replace(o, unit="batch", epoch_index=done, batch=c.batch, batches=n)

    def _learn_batches(self, c: _PerEpoch) -> int | None:
        """An epoch's batches where its lines do not say them: the highest batch counted in
        the epochs before (a script that prints every k batches makes this at most k - 1
        short an epoch), so the global count goes on past the first epoch."""
        if c.epoch is None or c.batch is None:
            return self._learnt_batches
        counted = self._epoch_counted
        if counted is not None and c.epoch > counted[0]:
            self._learnt_batches = max(self._learnt_batches or 0, counted[1])
            counted = None
        self._epoch_counted = (c.epoch, max(c.batch, counted[1] if counted else 0))
        return self._learnt_batches

    def _settle_base(self, epoch: int, epochs: int | None) -> int:
        if not self._base_given:
            if epoch == 0:
                self.epoch_base = 0
            elif self.epoch_base is None and (epoch == 1 or epoch == epochs):
                self.epoch_base = 1  # `epoch 3/3` is the last of three counted from 1
        # Unsettled (the first epoch seen is 2 or more, and no earlier attempt said): a
        # counter from 0 would have shown its 0, so count from 1.
        return self.epoch_base if self.epoch_base is not None else 1

    def _settle(self, o: Observation) -> Observation | None:
        """Keep an observation if it belongs to the training loop; a bar's eval values are
        kept when they change (a bar redraws them with every frame), at the bar's step."""
        if o.kind == "eval" and o.source in ("tqdm", "rich") and o.step is None:
            if o.metrics == self._bar_evals or self._last_bar is None:
                return None
            self._bar_evals = dict(o.metrics)
            bar = self._last_bar
            return replace(o, step=bar.step, epoch=bar.epoch, unit=bar.unit, epoch_index=bar.epoch_index,
                           batch=bar.batch, batches=bar.batches)
        if not self._training(o):
            return None
        if o.kind == "step" and o.source in ("tqdm", "rich"):
            self._last_bar = o
        return o

    def _training(self, o: Observation) -> bool:
        """Whether an observation belongs to the training loop. A bar is known to be the
        training loop's once a loss is read beside it (on the bar, or on a log line while it
        is the bar drawn last); after that a bar of another total with no loss on it is
        another loop — the Trainer's `evaluate()` after training draws a plain bar, no
        description, of its own — until a loss is read beside it (a second `train()`)."""
        if o.kind != "step":
            return True
        if o.source in ("tqdm", "rich") and o.unit == "step" and o.total is not None:
            self._bar_total = o.total
            if self._training_total not in (None, o.total) and o.loss is None:
                return False
        if o.loss is not None and self._bar_total is not None:
            self._training_total = self._bar_total
        return True


def _fact_values(known) -> dict[str, int]:
    """{key: value} from statements.from_argv's {key: (value, words)} or plain values."""
    out = {}
    for key, value in (known or {}).items() if isinstance(known, dict) else ():
        value = value[0] if isinstance(value, (tuple, list)) and value else value
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out[str(key)] = value
    return out


def _message(line: str) -> str:
    """A line without its logging prefix, stripped."""
    m = _MESSAGE_PREFIX.match(line)
    return line[m.end():].strip() if m else line


# -- formats: each returns None when the line is not its format, else what it found --

def _from_regex(m: re.Match) -> list:
    values = {}
    for name, text in m.groupdict().items():
        number = _number(text) if text is not None else None
        if number is not None:
            values[name] = number
    if not values:
        return []
    batch = _integer(values.pop("batch", None))
    if batch is not None:  # a count within the epoch
        epoch, epochs = _integer(values.pop("epoch", None)), _integer(values.pop("epochs", None))
        batches = _integer(values.pop("batches", None))
        return [_PerEpoch(epoch, epochs or None, batch, batches or None, values, "regex",
                          zero_based=False)]
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
    values = {name: value for name, value in values.items()
              if not is_timing(name) and not is_setting(name)}
    obs = _classify(values, "hf")
    return [obs] if obs else []


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


def _percent_bar(line: str, nested: bool = False) -> list[Observation] | None:
    m = _PERCENT_BAR.fullmatch(line)
    if not m:
        return None
    return _bar(m["desc"], m["n"], m["total"], {}, nested, "rich")


def _bar(desc: str | None, n: str, total: str | None, values: dict, nested: bool,
         source: str) -> list:
    """What a progress bar's line says: its count as the step, unless it counts something
    other than training (an evaluation, the work around training, a nested bar). Eval
    values on it (Lightning's val_loss) are an eval of their own, kept by the parser when
    they change."""
    desc = (desc or "").strip()
    if nested or _EVAL_DESC.match(desc) or _PREP_DESC.match(desc):
        return []
    count, of = _count(n), _count(total)
    values.pop("v_num", None)
    evals = {name: values.pop(name) for name in [n for n in values if _is_eval(n)]}
    found: list = []
    epoch_desc = _EPOCH_DESC.fullmatch(desc)
    if epoch_desc:  # counts batches within the epoch, epochs from 0 as Lightning counts
        if count == 0 or count is None:
            return []
        # Rich's `Epoch 2/9`: the last epoch's number (max_epochs - 1; `-2`: no limit)
        last = int(epoch_desc[2]) if epoch_desc[2] else -1
        found.append(_PerEpoch(int(epoch_desc[1]), last + 1 if last >= 0 else None, count,
                               of or None, values, source, zero_based=True, evals=False))
    else:
        if count == 0 and of is None:
            return []
        obs = _classify(values, source, step=count, total=of, always=True, evals=False)
        found.append(obs)
    if evals:
        found.append(Observation("eval", metrics=evals, source=source))
    return found


def _epoch_line(line: str, nested: bool = False) -> list | None:
    m = _EPOCH_LINE.match(line)
    if not m or (m["word"].lower() != "batch" and m["batches"] is None):
        return None
    epochs, batches = int(m["epochs"] or 0), int(m["batches"] or 0)
    return [_PerEpoch(int(m["epoch"]), epochs or None, int(m["batch"]), batches or None,
                      _pairs(line[m.end():]), "epochs", zero_based=False)]


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
    # Beside an eval value and no plain loss, a value is the evaluation's too: nanoGPT's
    # `train loss` measured at its eval, `epoch 1 val_loss: 2.3 recall@10: 0.25`.
    if evals and eval_names and "loss" not in values:
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
            name = _normalise(m["name"])
            if is_setting(name):
                continue  # `max_steps=300`, `batch_size: 8`: how the run is set, not a value
            found.append((m.start(), name, float(m["value"])))
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


def _count_value(word: str) -> float | None:
    """A table cell: `3.9k` (3,900), `6.739`, `1.54s`; None for a word."""
    if re.fullmatch(r"\d+(?:\.\d+)?[kMGT]", word):
        return float(_count(word) or 0)
    return _number(word)


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

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

The step never goes back on a stale bar frame: a bar (3, 3a) whose count is below the step
the last printed line or table row said (4, 5, 6, 3b, 2, 1: in the same unit) is a frame
drawn before that step and printed after it, as mlx-lm prints iteration 25's row and then
its bar's last frame ``24/60``; the frame gives nothing. A printed line that goes back
(a script that starts counting again) is read as it says.

Lines end at a newline or a carriage return (tqdm redraws its bar with ``\\r``); ANSI escape
sequences are removed first. A line longer than 64 KiB (65,536 characters) is dropped.
Names are lowercased, with spaces, ``/`` and ``-`` turned into ``_`` (``val loss`` ->
``val_loss``, ``train/loss`` -> ``train_loss``).

Understood formats, tried in this order on each line; the first whose line it is gives what
the line says (each is told in full, with examples, where it is read):

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

1. Your own regex (``progress_regex``), its named groups as fields, any other a metric
   (engine.command.progress_lines, as are 2, 3b, 4, 5 and 6).
2. A Python dict or JSON object alone on a line, as the Hugging Face Trainer logs.
3. A tqdm progress bar, Rich's (Lightning's), and 3a. mlx-lm's ``DESC ███░  92% · 11/12``
   (engine.command.progress_bars).
3b. A table: a header whose first column is a step's and one a loss, then its rows (mlx-lm).
4. A per-epoch counter: ``epoch 1 batch 927/2244 loss 0.51`` (unit "batch").
5. A line that starts with a step count: ``step 120/5000 loss=2.31``, nanoGPT's ``iter 10:``.
6. ``key=value`` or ``key: value`` pairs anywhere on a line, alone (engine.command.observation
   tells how named values are read, here and after 3, 4 and 5).
"""

from __future__ import annotations

import re
from dataclasses import replace

from engine.command import statements
from engine.command.observation import Observation, PerEpoch, classify, is_eval, pairs
from engine.command.progress_bars import RICH_BAR, percent_bar, rich_bar, tqdm_bar
from engine.command.progress_lines import (epoch_line, from_regex, hf_dict, key_values, step_line,
                                           table_head, table_row, without_prefix)
from engine.text import strip_ansi

MAX_LINE = 64 * 1024  # characters; a longer line is dropped
SAID_MAX = 120        # characters of a stating line kept in Observation.said

_FIELDS = ("step", "total", "loss", "lr", "epoch", "batch", "batches", "epochs")

_CURSOR_UP = "\x1b[A"  # tqdm draws a nested bar one line down, then moves back up
_LINE_END = re.compile(r"[\r\n]")
# Once Rich has drawn a frame, a row indented this far continues its live display (a second
# row of metrics, redrawn with every frame): not a line of its own.
_CONTINUATION = " " * 20
# The HF Trainer's blocks: `***** Running training *****` then `  Num examples = 2,000` rows;
# `***** train metrics *****` (trainer.log_metrics) then `  train_loss = 5.0598` rows.
_BLOCK_HEAD = re.compile(r"\*{3,}\s*(?P<title>[^*\s][^*]*?)\s*\*{3,}")
_BLOCK_ROW = re.compile(r"[A-Za-z][\w .,&()'/\-]*?(?:\s+=\s+\S+|:\s*Unknown)")


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
        # The step the last printed step line or row said, and its unit: a bar frame behind it
        # is one drawn before that step and printed after it (mlx-lm's last frame `24/60`
        # after its row for iteration 25), not the loop going back.
        self._printed: tuple[str, int] | None = None
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
            if not self._live and "━" in raw and RICH_BAR.search(strip_ansi(raw)):
                self._live = True
            out = []
            for o in self._line(raw):
                o = self._compose(o) if isinstance(o, PerEpoch) else o
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
            evals = {n: v for n, v in pairs(line).items() if is_eval(n)}
            return [Observation("eval", metrics=evals, source="rich")] if evals else []
        line = line.strip()
        message = without_prefix(line)
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
                return found + from_regex(m)
        if (columns := table_head(line)) is not None:
            self._table = columns
            return found
        if self._table is not None and (row := table_row(self._table, line)) is not None:
            return found + self._facts_of(line, {"tokens_per_step": row.tokens_per_step}) \
                + row.observations
        for parse in (hf_dict, tqdm_bar, rich_bar, percent_bar, epoch_line, step_line, key_values):
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

    def _facts_of(self, said: str, facts: dict) -> list[Observation]:
        """A facts observation of those that are new (a restatement says nothing)."""
        facts = {k: v for k, v in facts.items()
                 if k is not None and v is not None and self._facts.get(k) != v}
        if not facts:
            return []
        self._facts.update(facts)
        return [Observation("facts", facts=facts, said=said.strip()[:SAID_MAX], source="stated")]

    def _compose(self, c: PerEpoch) -> Observation | None:
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
        o = classify(values, c.source, step=step, total=epochs * n if epochs and n else None,
                     always=True, evals=c.evals)
        assert o is not None  # always=True: an observation, whatever the values
        return replace(o, unit="batch", epoch_index=done, batch=c.batch, batches=n)

    def _learn_batches(self, c: PerEpoch) -> int | None:
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
        if o.kind == "step" and o.step is not None:
            if o.source not in ("tqdm", "rich"):
                self._printed = (o.unit, o.step)
            elif self._printed is not None and self._printed[0] == o.unit and o.step < self._printed[1]:
                return None  # a frame drawn before the printed row's step: stale, not a step back
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


"""Progress bars in a command's output, read as training steps: tqdm's, Rich's, mlx-lm's.

Formats 3 and 3a of engine.command.progress: each function takes a line (and whether tqdm drew
it below another bar) and gives None when the line is not its format, else what it found;
the parser decides which bar is the training loop's and keeps a bar's eval values when they
change.

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

"""

from __future__ import annotations

import re

from engine.command.observation import EVAL_DESC, Observation, PerEpoch, classify, is_eval, pairs, parse_count

_COUNT = r"\d+(?:\.\d+)?[kMGTPEZY]?"
_TQDM_BAR = re.compile(rf"(?:(?P<desc>.*?):\s*)?(?:\d{{1,3}}%)?\|[^|]*\|\s*"
                       rf"(?P<n>{_COUNT})/(?P<total>{_COUNT}|\?)\s*\[(?P<inner>[^\]]*)\]")
_TQDM_COUNT = re.compile(rf"(?:(?P<desc>.*?):\s*)?(?P<n>{_COUNT})[A-Za-z]*\s*"
                         r"\[(?P<inner>(?:\d+:)?\d+:\d+[^\]]*)\]")
_EPOCH_DESC = re.compile(r"epoch\s+(\d+)(?:\s*/\s*(-?\d+))?", re.IGNORECASE)  # Rich's "0/-2"
# Rich's progress bar (Lightning's default where rich is installed): description, bar,
# done/total (`--`: unknown), elapsed • remaining (blank in the last frame), rate, then
# `name: value` metrics.
RICH_BAR = re.compile(r"(?P<desc>.*?)\s+[━╸╺╾╼─\s]*?(?P<n>\d+)/(?P<total>\d+|--)\s+"
                      r"(?:\d+:)?\d+:\d\d\s+•(?:\s+(?:-:--:--|(?:\d+:)?\d+:\d\d))?"
                      r"(?:\s+[\d.]+(?:it/s|s/it))?\s*(?P<post>.*)")
# A bar of block glyphs, a percentage, then `· done/total` (mlx-lm's Rich bar).
# The spaces before the bar belong to \s+ alone (the bar starts at a glyph): three quantifiers
# that could each take them cost seconds a line on a Rich panel's padded rows (mlx-lm's
# banner: 1.5 s for one 235-character line, the supervisor stalled meanwhile).
_BAR_GLYPHS = "█▉▊▋▌▍▎▏▐░▒▓━╸╺"
_PERCENT_BAR = re.compile(rf"(?P<desc>\S.*?)\s+[{_BAR_GLYPHS}][{_BAR_GLYPHS} ]*?\s*\d{{1,3}}%\s+·\s+"
                          r"(?P<n>\d+)/(?P<total>\d+)\s*")
# Bars of the work around training, not training steps: datasets' `Map: 1000/1000`,
# `Resolving data files`, `Loading checkpoint shards`, downloads, tokenisation.
_PREP_DESC = re.compile(r"(?:map|filter|tokeniz|tokenis|load|download|fetch|resolv|generat|"
                        r"preprocess|process|prepar|build|convert|extract|shard|saving|writing|"
                        r"reading|copying|uploading)", re.IGNORECASE)


def tqdm_bar(line: str, nested: bool = False) -> list[Observation] | None:
    m = _TQDM_BAR.match(line) or _TQDM_COUNT.match(line)
    if not m:
        return None
    parts = m["inner"].split(",", 2)  # elapsed<remaining, rate, postfix
    values = pairs(parts[2]) if len(parts) > 2 else {}
    return _bar(m["desc"], m["n"], m.groupdict().get("total"), values, nested, "tqdm")


def rich_bar(line: str, nested: bool = False) -> list[Observation] | None:
    if "•" not in line or "/" not in line:
        return None   # no Rich bar without its elapsed-time bullet and its done/total
    m = RICH_BAR.fullmatch(line)
    if not m:
        return None
    return _bar(m["desc"], m["n"], m["total"], pairs(m["post"]), nested, "rich")


def percent_bar(line: str, nested: bool = False) -> list[Observation] | None:
    if "%" not in line or "·" not in line:
        return None   # most lines: no regex at all
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
    if nested or EVAL_DESC.match(desc) or _PREP_DESC.match(desc):
        return []
    count, of = parse_count(n), parse_count(total)
    values.pop("v_num", None)
    evals = {name: values.pop(name) for name in [n for n in values if is_eval(n)]}
    found: list = []
    epoch_desc = _EPOCH_DESC.fullmatch(desc)
    if epoch_desc:  # counts batches within the epoch, epochs from 0 as Lightning counts
        if count == 0 or count is None:
            return []
        # Rich's `Epoch 2/9`: the last epoch's number (max_epochs - 1; `-2`: no limit)
        last = int(epoch_desc[2]) if epoch_desc[2] else -1
        found.append(PerEpoch(int(epoch_desc[1]), last + 1 if last >= 0 else None, count,
                              of or None, values, source, zero_based=True, evals=False))
    else:
        if count == 0 and of is None:
            return []
        obs = classify(values, source, step=count, total=of, always=True, evals=False)
        found.append(obs)
    if evals:
        found.append(Observation("eval", metrics=evals, source=source))
    return found


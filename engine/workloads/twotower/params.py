"""twotower's settings, the preset's [params] table, and its mining schedule: the
schedule's grammar is in the package's docstring. Neither torch nor faiss: the card and
workload.py both import it.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Literal

from engine.schema import FieldError, setting

EXAMPLE = "'0-5:none,6-30:faiss@64'"
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_FAISS = re.compile(r"^faiss@(\d+)$")


@dataclass(frozen=True, slots=True)
class Phase:
    """Epochs first..last (inclusive, from 0) mine with `negatives` hard negatives (0: none)."""

    first: int
    last: int
    negatives: int

    @property
    def mode(self) -> str:
        return f"faiss@{self.negatives}" if self.negatives else "none"


def parse_schedule(text: str) -> tuple[Phase, ...]:
    """'0-5:none,6-30:faiss@64' -> phases; ValueError says what is wrong and what was expected."""
    if not text.strip():
        raise ValueError(f"is empty; expected ranges like {EXAMPLE}")
    if ";" in text:
        raise ValueError(f"got {text!r}; separate ranges with ',' not ';' (e.g. {EXAMPLE})")
    phases: list[Phase] = []
    for part in text.split(","):
        span, colon, mode = (s.strip() for s in part.partition(":"))
        if not colon:
            raise ValueError(f"range {part.strip()!r} has no ':MODE'; expected FIRST-LAST:MODE "
                             f"(e.g. {EXAMPLE})")
        m = _RANGE.match(span)
        if not m:
            raise ValueError(f"{span!r} is not an epoch range; expected FIRST-LAST or one epoch, "
                             f"counted from 0 (e.g. {EXAMPLE})")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        if last < first:
            raise ValueError(f"range {span!r} runs backwards; expected FIRST <= LAST")
        if mode == "none":
            negatives = 0
        elif (f := _FAISS.match(mode)) and int(f.group(1)) >= 1:
            negatives = int(f.group(1))
        else:
            raise ValueError(f"mode {mode!r} in {part.strip()!r} is not a mining mode; expected "
                             "'none' or 'faiss@K' with K >= 1 hard negatives per pair (e.g. faiss@64)")
        expected_first = phases[-1].last + 1 if phases else 0
        if first != expected_first:
            if not phases:
                why = "the first range must start at epoch 0"
            elif first <= phases[-1].last:
                why = f"it overlaps {phases[-1].first}-{phases[-1].last}"
            else:
                why = f"epochs {expected_first}-{first - 1} are in no range"
            raise ValueError(f"range {span!r} should start at epoch {expected_first}: {why}; "
                             "expected ranges in order, with no gap or overlap")
        phases.append(Phase(first, last, negatives))
    return tuple(phases)


def negatives_at(phases: tuple[Phase, ...], epoch: int) -> int:
    """Hard negatives per pair in this epoch (0 = no mining; also after the last range)."""
    for phase in phases:
        if phase.first <= epoch <= phase.last:
            return phase.negatives
    return 0


def valid_positions(bank: int, article_len: int, context_len: int) -> int:
    """How many synthetic chunks have `context_len` earlier chunks in their own article."""
    full, rest = divmod(bank, article_len)
    return full * (article_len - context_len) + max(0, rest - context_len)


def _data_path(key: str, value: str) -> None:
    if value and not (os.path.isabs(value) or value.startswith("~")):
        raise FieldError(key, f"got {value!r}, expected an absolute path or one starting with "
                              "'~' (a run re-reads its settings in another process, so a "
                              "relative path would depend on where cockpit was started)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Params:
    # data: the user's files, or the synthetic corpus
    pairs_file: str = setting("", "the user's pairs.npz: contexts [N,L,D] float32, targets [N] "
                                  "int64 (bank rows); absolute or ~ path; '' = synthetic data")
    bank_file: str = setting("", "the user's bank.npz: vectors [M,D]; set with pairs_file")
    eval_pairs: int = setting(2000, "held-out pairs for Recall@K (taken from pairs_file when given)",
                              min=1)
    data_seed: int = setting(0, "seeds the synthetic corpus and the held-out split", min=0,
                             max=2**64 - 1)
    pairs: int = setting(35901, "synthetic: training pairs", min=1)
    bank: int = setting(500_000, "synthetic: bank vectors M", min=2)
    dim: int = setting(768, "synthetic: vector size D", min=2)
    context_len: int = setting(100, "synthetic: context vectors L per pair", min=1)
    article_len: int = setting(128, "synthetic: chunks per article (contexts stay in one article)",
                               min=2)
    # the query tower and the loss
    rnn: Literal["gru", "lstm"] = setting("lstm", "query tower cell (note 000 moved to LSTM for MPS)")
    hidden: int = setting(512, "recurrent hidden size", min=1)
    layers: int = setting(1, "recurrent layers", min=1)
    temperature: float = setting(0.05, "InfoNCE temperature tau", above=0.0)
    # mining
    schedule: str = setting("0-30:none", "mining schedule, e.g. '0-5:none,6-30:faiss@64' (epochs "
                                         "from 0, ranges inclusive; later epochs do not mine)")
    index: Literal["auto", "flat", "ivf", "hnsw"] = setting(
        "auto", "mining index: auto = exact below exact_below bank vectors, IVF from there")
    exact_below: int = setting(50_000, "auto: banks smaller than this are searched exactly", min=1)
    ivf_lists: int = setting(0, "IVF lists; 0 = about 2 x sqrt(M) (fewer than faiss's usual "
                                "4-16 x sqrt(M): cheaper to build on a laptop; recall is reported)",
                             min=0)
    ivf_probe: int = setting(8, "IVF lists visited per query", min=1)
    ivf_train: int = setting(40, "IVF k-means trains on this many vectors per list (faiss "
                                 "wants 39 or more)", min=39)
    hnsw_ef: int = setting(128, "HNSW efSearch", min=1)
    recall_sample: int = setting(1000, "queries re-searched exactly to report an approximate "
                                       "index's recall in each mining event; 0 = skip", min=0)
    faiss_threads: int = setting(0, "faiss OpenMP threads; 0 = torch's count (1 on macOS, where "
                                    "torch and faiss each load their own libomp)", min=0)
    # evaluation
    eval_k: int = setting(500, "Recall@K on held-out pairs (note 001's gate is Recall@500)", min=1)

    def __post_init__(self):
        try:
            phases = parse_schedule(self.schedule)
        except ValueError as e:
            raise FieldError("schedule", str(e)) from None
        _data_path("pairs_file", self.pairs_file)
        _data_path("bank_file", self.bank_file)
        if bool(self.pairs_file) != bool(self.bank_file):
            missing = "bank_file" if self.pairs_file else "pairs_file"
            raise FieldError(missing, "is empty while the other data file is set; expected both "
                                      "files or neither (synthetic data)")
        if self.synthetic:
            if self.article_len <= self.context_len:
                raise FieldError("article_len", f"got {self.article_len}, expected more than "
                                 f"context_len ({self.context_len}): a context and its next "
                                 "chunk come from one article")
            have = valid_positions(self.bank, self.article_len, self.context_len)
            if self.pairs + self.eval_pairs > have:
                raise FieldError("pairs", f"got {self.pairs} (+ {self.eval_pairs} held out), "
                                 f"expected at most {have} in total: a bank of {self.bank} in "
                                 f"articles of {self.article_len} has that many chunks with "
                                 f"{self.context_len} earlier ones")
            most = max((p.negatives for p in phases), default=0)
            if most >= self.bank:
                raise FieldError("schedule", f"asks for {most} hard negatives, expected fewer "
                                             f"than the bank's {self.bank} vectors")
            if self.eval_k > self.bank:
                raise FieldError("eval_k", f"got {self.eval_k}, expected at most the bank's "
                                           f"{self.bank} vectors")

    @property
    def synthetic(self) -> bool:
        return not self.pairs_file

    @property
    def phases(self) -> tuple[Phase, ...]:
        return parse_schedule(self.schedule)

    def lists_for(self, bank: int) -> int:
        """IVF lists for a bank of this size (ivf_lists, or about 2 x sqrt(M))."""
        return self.ivf_lists or max(1, min(bank // 39, round(2 * math.sqrt(bank))))

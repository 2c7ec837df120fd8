"""The two-tower data: the user's npz files, or a seeded synthetic corpus.

Synthetic corpus. `bank` chunk vectors in D dimensions, cut into articles of `article_len`
chunks (the last one may be shorter). Each article belongs to one of about M/(4 x
article_len) topics with a unit centre c, and carries a state s that moves by one fixed
hidden rotation R per chunk, with fresh noise:

    s[j+1] = rho * R s[j] + sqrt(1 - rho^2) * e,   chunk[j] = normalise(c + s[j])

So the next chunk is c + rho R s[j] plus noise: predictable from the context (the topic
from the context's average, s from its last vector, R learned once for all), while the
bank is clustered by topic, which makes same-topic chunks the hard negatives. A pair is a
chunk with its `context_len` predecessors in the same article; contexts are kept as bank
rows, not copies (35,901 x 100 x 768 floats would be 11 GB, the notes' pairs file).

The bank (500k x 768 = 1.5 GB) is filled in place, a block of articles at a time, from one
seeded generator: about 10 s and no second copy at that size on a 2-core VM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.errors import ConfigError

RHO = 0.9              # how much of the state carries over to the next chunk
ARTICLES_PER_TOPIC = 4
BLOCK_ARTICLES = 2048  # articles advanced together: big enough for an efficient matmul


@dataclass
class Split:
    """Pairs: contexts as bank rows [N, L] (synthetic), or rows `select` of the user's
    [N_all, L, D] contexts (shared by both splits, not copied: the notes' file was 11 GB)."""

    targets: torch.Tensor                   # [N] int64 bank rows
    context_rows: torch.Tensor | None = None
    context_vectors: torch.Tensor | None = None
    select: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.targets)

    def contexts(self, indices: torch.Tensor, bank: torch.Tensor) -> torch.Tensor:
        """[B, L, D] float32 context vectors for these pairs (on the CPU)."""
        if self.context_rows is not None:
            return bank[self.context_rows[indices]]
        assert self.context_vectors is not None and self.select is not None  # the user's contexts
        return self.context_vectors[self.select[indices]]

    @property
    def context_len(self) -> int:
        rows = self.context_rows if self.context_rows is not None else self.context_vectors
        assert rows is not None  # one or the other
        return rows.shape[1]


@dataclass
class Data:
    bank: torch.Tensor   # [M, D] float32, rows L2-normalised: the identity item tower's output
    train: Split
    held_out: Split

    @property
    def dim(self) -> int:
        return self.bank.shape[1]


def synthetic(*, bank: int, dim: int, context_len: int, article_len: int, pairs: int,
              eval_pairs: int, seed: int, oracle: bool = False) -> tuple[Data, torch.Tensor | None]:
    """The seeded corpus, and with `oracle` the noiseless next-chunk direction for every
    training pair (what a perfect query tower would output; used by benchmarks/mining.py)."""
    g = torch.Generator().manual_seed(seed)
    n_articles = math.ceil(bank / article_len)
    n_topics = max(1, n_articles // ARTICLES_PER_TOPIC)
    rotation, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g))
    centres = torch.nn.functional.normalize(torch.randn(n_topics, dim, generator=g), dim=1)
    topic_of = torch.randint(0, n_topics, (n_articles,), generator=g)

    # Which chunks become pairs is decided first, so the oracle can be kept for them only.
    position = torch.arange(bank) % article_len
    candidates = torch.nonzero(position >= context_len).squeeze(1)
    chosen = candidates[torch.randperm(len(candidates), generator=g)[:pairs + eval_pairs]]
    if len(chosen) < pairs + eval_pairs:
        raise ConfigError("params", "pairs", f"the synthetic bank has only {len(candidates)} "
                          f"chunks with {context_len} predecessors, expected {pairs + eval_pairs}")
    slot = torch.full((bank,), -1, dtype=torch.int64)
    slot[chosen[:pairs]] = torch.arange(pairs)
    predicted = torch.empty(pairs, dim) if oracle else None

    # Padded to whole articles so that article a, chunk j is simply vectors[a, j]; the bank
    # is a view of the first `bank` rows (the padding is under one article).
    vectors = torch.empty(n_articles, article_len, dim)
    noise = math.sqrt(1 - RHO * RHO) / math.sqrt(dim)
    for a0 in range(0, n_articles, BLOCK_ARTICLES):
        a1 = min(n_articles, a0 + BLOCK_ARTICLES)
        centre = centres[topic_of[a0:a1]]                                   # [n, D]
        state = torch.randn(a1 - a0, dim, generator=g) / math.sqrt(dim)
        for j in range(article_len):
            if j:
                mean = RHO * state @ rotation.T
                if predicted is not None:
                    rows = torch.arange(a0, a1) * article_len + j
                    keep = (rows < bank) & (slot[rows.clamp(max=bank - 1)] >= 0)
                    if keep.any():
                        predicted[slot[rows[keep]]] = torch.nn.functional.normalize(
                            centre[keep] + mean[keep], dim=1)
                state = mean + noise * torch.randn(a1 - a0, dim, generator=g)
            torch.add(centre, state, out=vectors[a0:a1, j])
        block = vectors[a0:a1]
        block.div_(block.norm(dim=2, keepdim=True))  # in place: the bank is never held twice
    vectors = vectors.view(-1, dim)[:bank]

    offsets = torch.arange(-context_len, 0)
    def split(rows: torch.Tensor) -> Split:
        return Split(targets=rows.clone(), context_rows=rows[:, None] + offsets)
    data = Data(bank=vectors, train=split(chosen[:pairs]), held_out=split(chosen[pairs:]))
    return data, predicted


def _load(path_text: str, key: str) -> dict[str, np.ndarray]:
    path = Path(path_text).expanduser()
    try:
        with np.load(path, allow_pickle=False) as f:
            return {name: f[name] for name in f.files}
    except FileNotFoundError:
        raise ConfigError(f"params.{key}", None, f"{str(path)!r} does not exist; expected an .npz "
                          "file") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"params.{key}", None, f"{str(path)!r} is not a readable .npz file "
                          f"({e})") from None


def _array(arrays: dict, name: str, where: str, ndim: int, what: str) -> np.ndarray:
    if name not in arrays:
        raise ConfigError(where, name, f"missing; the file has {sorted(arrays) or 'no arrays'}, "
                          f"expected {what}")
    value = arrays[name]
    if value.ndim != ndim or not (np.issubdtype(value.dtype, np.number)):
        raise ConfigError(where, name, f"has shape {value.shape} and dtype {value.dtype}, "
                          f"expected {what}")
    return value


def from_files(*, pairs_file: str, bank_file: str, eval_pairs: int, seed: int) -> Data:
    """The user's files, checked: shapes agree, targets index the bank, enough pairs to split."""
    bank_where, pairs_where = str(Path(bank_file).expanduser()), str(Path(pairs_file).expanduser())
    vectors = _array(_load(bank_file, "bank_file"), "vectors", bank_where, 2, "[M, D] floats")
    arrays = _load(pairs_file, "pairs_file")
    contexts = _array(arrays, "contexts", pairs_where, 3, "[N, L, D] float32")
    targets = _array(arrays, "targets", pairs_where, 1, "[N] int64 rows of the bank")
    m, d = vectors.shape
    if contexts.shape[2] != d:
        raise ConfigError(pairs_where, "contexts", f"has vectors of size {contexts.shape[2]}, "
                          f"expected {d} like the bank's vectors")
    if len(targets) != len(contexts):
        raise ConfigError(pairs_where, "targets", f"has {len(targets)} entries, expected one per "
                          f"context ({len(contexts)})")
    if not np.issubdtype(targets.dtype, np.integer):
        raise ConfigError(pairs_where, "targets", f"has dtype {targets.dtype}, expected integers")
    if len(targets) and (targets.min() < 0 or targets.max() >= m):
        raise ConfigError(pairs_where, "targets", f"ranges over {targets.min()}..{targets.max()}, "
                          f"expected rows of the bank, 0..{m - 1}")
    if len(targets) <= eval_pairs:
        raise ConfigError(pairs_where, "targets", f"has {len(targets)} pairs, expected more than "
                          f"params.eval_pairs ({eval_pairs}) so that some are left to train on")
    bank = torch.nn.functional.normalize(torch.from_numpy(np.ascontiguousarray(vectors, np.float32)),
                                         dim=1)
    contexts_t = torch.from_numpy(np.ascontiguousarray(contexts, np.float32))
    targets_t = torch.from_numpy(targets.astype(np.int64))
    order = torch.randperm(len(targets_t), generator=torch.Generator().manual_seed(seed))
    held, train = order[:eval_pairs], order[eval_pairs:].sort().values
    return Data(bank=bank,
                train=Split(targets=targets_t[train], context_vectors=contexts_t, select=train),
                held_out=Split(targets=targets_t[held], context_vectors=contexts_t, select=held))

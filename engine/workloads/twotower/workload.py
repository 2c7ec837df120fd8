from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from engine.emit import Emit
from engine.errors import ConfigError
from engine.event_types import MiningFields
from engine.workloads.twotower import data as datasets, mining
from engine.workloads.twotower.params import Params, negatives_at

EMBED_BATCH = 1024  # pairs per forward pass when embedding queries for mining and eval


class QueryTower(nn.Module):
    """A GRU/LSTM over the context vectors -> a unit query vector in the bank's space.

    The query is read from the last step's output plus a linear path from the last context
    vector (the next chunk is close to a map of the last one). The output sequence is used,
    not h_n: MPS's LSTM backward has failed when only the hidden state was used (#96416).
    """

    def __init__(self, rnn: str, dim: int, hidden: int, layers: int, grad_checkpointing: bool):
        super().__init__()
        cell = nn.LSTM if rnn == "lstm" else nn.GRU
        self.rnn = cell(dim, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, dim)
        self.skip = nn.Linear(dim, dim, bias=False)
        self.grad_checkpointing = grad_checkpointing

    def _sequence(self, contexts: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(contexts)
        return out[:, -1]

    def forward(self, contexts: torch.Tensor) -> torch.Tensor:
        if self.grad_checkpointing and torch.is_grad_enabled():
            last = checkpoint(self._sequence, contexts, use_reentrant=False)
        else:
            last = self._sequence(contexts)
        return F.normalize(self.head(last) + self.skip(contexts[:, -1]), dim=-1)


class TwoTowerWorkload:
    def __init__(self, params: Params, seed: int):
        self.params = params  # train.seed seeds the model and the order; data_seed the data
        if params.synthetic:
            self.data, _ = datasets.synthetic(
                bank=params.bank, dim=params.dim, context_len=params.context_len,
                article_len=params.article_len, pairs=params.pairs, eval_pairs=params.eval_pairs,
                seed=params.data_seed)
        else:
            self.data = datasets.from_files(pairs_file=params.pairs_file, bank_file=params.bank_file,
                                            eval_pairs=params.eval_pairs, seed=params.data_seed)
        m = len(self.data.bank)
        most = max((p.negatives for p in params.phases), default=0)
        if most >= m:
            raise ConfigError("params.schedule", None, f"asks for {most} hard negatives, expected "
                              f"fewer than the bank's {m} vectors")
        if params.eval_k > m:
            raise ConfigError("params.eval_k", None, f"got {params.eval_k}, expected at most the "
                              f"bank's {m} vectors")
        self.num_samples = len(self.data.train)
        self.negatives: torch.Tensor | None = None   # [N, K] bank rows, set by prepare_epoch
        self._faiss = None
        self._index: mining.Index | None = None
        self._bank_cache: tuple[torch.device, torch.Tensor] | None = None
        self.flops_per_sample = self._flops()

    def _flops(self) -> float:
        # Recurrent matmuls per step and layer, the two heads; training ~ 3 x forward.
        p, d, length = self.params, self.data.dim, self.data.train.context_len
        gates = 4 if p.rnn == "lstm" else 3
        rnn = sum(2 * gates * (i + p.hidden) * p.hidden for i in [d] + [p.hidden] * (p.layers - 1))
        return 3.0 * (length * rnn + 2 * p.hidden * d + 2 * d * d)

    # ------------------------------------------------------------ training

    def build_model(self, *, grad_checkpointing: bool) -> nn.Module:
        p = self.params
        return QueryTower(p.rnn, self.data.dim, p.hidden, p.layers, grad_checkpointing)

    def _bank_on(self, device: torch.device) -> torch.Tensor:
        # On CUDA the bank is copied to the device once and gathered there; on MPS it stays on
        # the host (a second 1.5 GB copy in unified memory is what pushes a Mac into swap) and
        # each batch's rows are copied over.
        if device.type != "cuda":
            return self.data.bank
        if self._bank_cache is None or self._bank_cache[0] != device:
            self._bank_cache = (device, self.data.bank.to(device))
        return self._bank_cache[1]

    def batch(self, indices: torch.Tensor, device: torch.device):
        bank = self._bank_on(device)
        here, split = bank.device, self.data.train
        targets = split.targets[indices].to(here)
        if split.context_rows is not None:
            contexts = bank[split.context_rows[indices].to(here)]
        else:
            contexts = split.contexts(indices, self.data.bank)
        negatives = None if self.negatives is None else bank[self.negatives[indices].to(here)]
        move = lambda t: None if t is None else t.to(device, non_blocking=True)  # noqa: E731
        return move(contexts), move(targets), move(bank[targets]), move(negatives)

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        """InfoNCE: each query against its positive, the batch's other positives and, in a
        mining epoch, its own K hard negatives."""
        contexts, targets, positives, negatives = batch
        query = model(contexts).float()
        logits = query @ positives.T                                    # [B, B]
        # Two pairs of one batch can share a target: that is not a negative for either.
        same = targets[:, None] == targets[None, :]
        same.fill_diagonal_(False)
        logits = logits.masked_fill(same, float("-inf"))
        if negatives is not None:
            logits = torch.cat([logits, torch.einsum("bd,bkd->bk", query, negatives.float())], 1)
        labels = torch.arange(len(query), device=query.device)
        return F.cross_entropy(logits / self.params.temperature, labels)

    # ------------------------------------------------------------ mining

    def _embed(self, model: nn.Module, split: datasets.Split, device: torch.device) -> np.ndarray:
        out = []
        for start in range(0, len(split), EMBED_BATCH):
            idx = torch.arange(start, min(len(split), start + EMBED_BATCH))
            contexts = split.contexts(idx, self.data.bank).to(device, non_blocking=True)
            out.append(model(contexts).float().cpu())
        return F.normalize(torch.cat(out), dim=-1).numpy()

    def _faiss_module(self):
        if self._faiss is None:
            self._faiss = mining.import_faiss()
        return self._faiss

    def prepare_epoch(self, model: nn.Module, epoch: int, device: torch.device, emit: Emit) -> None:
        """Mine K hard negatives per training pair with the current query tower, per the
        schedule; emit a "mining" event either way."""
        k = negatives_at(self.params.phases, epoch)
        if not k:
            self.negatives = None
            emit("mining", epoch=epoch, mode="none")
            return
        # Said before it starts: a pass can take minutes with no step, and the screens say
        # why the throughput fell to nothing until the "mining" event below ends it.
        emit("mining_started", epoch=epoch, negatives=k)
        started = time.perf_counter()
        faiss = self._faiss_module()
        threads = mining.coordinate_threads(faiss, self.params.faiss_threads)
        queries = self._embed(model, self.data.train, device)
        encoded = time.perf_counter()
        bank = self.data.bank.numpy()
        index = self._index
        built_now = index is None
        if index is None:
            index = self._index = mining.build_index(faiss, self.params, bank, self.params.data_seed)
        searched_from = time.perf_counter()
        rows = index.search(faiss, queries, k + 1)
        search_s = time.perf_counter() - searched_from
        rng = np.random.default_rng((self.params.data_seed, epoch))
        negatives, positive_found, filled = mining.exclude_positive(
            rows, self.data.train.targets.numpy(), k, len(bank), rng)
        self.negatives = torch.from_numpy(negatives)
        checked_from = time.perf_counter()
        recall, sampled = mining.recall_against_exact(
            faiss, index, queries, rows, self.params.recall_sample, k + 1, rng)
        recall_s = time.perf_counter() - checked_from
        event: MiningFields = dict(
            epoch=epoch, mode=f"faiss@{k}", negatives=k, queries=len(queries), bank=len(bank),
            index=index.describe, exact=index.exact,
            encode_s=round(encoded - started, 3), search_s=round(search_s, 3),
            recall_vs_exact=None if recall is None else round(recall, 4), recall_sample=sampled,
            recall_s=round(recall_s, 3),
            # training Recall@(K+1) as a by-product: how often the positive had to be dropped
            positive_in_top=round(positive_found / len(queries), 4), filled=filled,
            faiss_threads=threads, torch_threads=torch.get_num_threads(),
        )
        if built_now:
            event["index_build_s"] = round(index.build_s, 3)
        event["mining_s"] = round(time.perf_counter() - started, 3)
        emit("mining", **event)

    # ------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        """Recall@K over the whole bank for the held-out pairs, by exact faiss search."""
        faiss = self._faiss_module()
        mining.coordinate_threads(faiss, self.params.faiss_threads)
        k = self.params.eval_k
        queries = self._embed(model, self.data.held_out, device)
        rows = mining.exact_search(faiss, queries, self.data.bank.numpy(), k)
        hit_rank = rows == self.data.held_out.targets.numpy()[:, None]
        metrics = {f"recall@{k}": float(hit_rank.any(axis=1).mean())}
        if k > 10:
            metrics["recall@10"] = float(hit_rank[:, :10].any(axis=1).mean())
        return metrics

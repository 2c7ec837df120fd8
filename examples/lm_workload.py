"""A small GPT trained on a memory-mapped token file: the shape of a real language-model run.

    python examples/lm_prepare.py                                       # writes examples/lm_data/
    COCKPIT_CONFIG_DIR=examples cockpit --no-ui --workload lm --device cpu

The preset examples/presets/workloads/lm.toml names this file by its path, relative to the
preset (`workload = "../../lm_workload.py:build"`): no PYTHONPATH, from any directory.

- Data: `data_dir` holds train.bin and val.bin, flat arrays of token ids as numpy writes them
  (`np.array(ids, dtype=np.uint16).tofile(...)`, the files nanoGPT's prepare scripts make),
  read through np.memmap, so a file far larger than memory trains the same. Sample i is the
  i-th window of block_size + 1 tokens; cockpit owns the order (a seeded permutation per
  epoch), so a fallback to another batch size continues at the same window.
- Model: a GPT-2-style decoder (pre-norm blocks, causal flash attention through
  F.scaled_dot_product_attention, a GELU MLP, the output layer tied to the token embedding),
  written out below in about 80 lines.
- Schedule: the preset's [train] (AdamW with beta2 0.99, weight decay on matrices only, linear
  warmup then cosine to min_lr), counted in samples, so it survives a fallback or a resume.
- Eval: the held-out loss (and perplexity) on evenly spaced windows of val.bin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from engine.errors import ConfigError
from engine.schema import FieldError, setting

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True, kw_only=True, slots=True)
class Params:
    data_dir: str = setting("lm_data", "train.bin and val.bin (uint16 tokens); a relative path "
                                       "starts at this file's directory")
    vocab_size: int = setting(256, "token ids run below this (256: bytes; 50304: GPT-2 BPE)", min=2)
    block_size: int = setting(128, "context length: tokens per sample", min=2)
    n_layer: int = setting(4, "transformer blocks", min=1)
    n_head: int = setting(4, "attention heads", min=1)
    n_embd: int = setting(128, "model width", min=1)
    dropout: float = setting(0.0, "dropout in attention and MLP (0 for short runs)", min=0.0)
    eval_windows: int = setting(64, "held-out windows of val.bin for val_loss", min=1)

    def __post_init__(self):
        if self.n_embd % self.n_head:
            raise FieldError("n_head", f"{self.n_head} does not divide n_embd {self.n_embd}")
        if self.dropout >= 1:
            raise FieldError("dropout", f"got {self.dropout}, expected below 1")
        # Whether data_dir holds the files is checked when the workload is built, not here:
        # the preset's own value is checked before a --set can replace it.


def data_path(data_dir: str) -> Path:
    path = Path(data_dir).expanduser()
    return path if path.is_absolute() else HERE / path


# ---------------------------------------------------------------- the model


class SelfAttention(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        self.n_head, self.dropout = p.n_head, p.dropout
        self.qkv = nn.Linear(p.n_embd, 3 * p.n_embd, bias=False)
        self.proj = nn.Linear(p.n_embd, p.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(p.n_embd), nn.LayerNorm(p.n_embd)
        self.attn = SelfAttention(p)
        self.mlp = nn.Sequential(nn.Linear(p.n_embd, 4 * p.n_embd, bias=False), nn.GELU(),
                                 nn.Linear(4 * p.n_embd, p.n_embd, bias=False), nn.Dropout(p.dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, p: Params, grad_checkpointing: bool):
        super().__init__()
        self.grad_checkpointing = grad_checkpointing
        self.tokens = nn.Embedding(p.vocab_size, p.n_embd)
        self.positions = nn.Embedding(p.block_size, p.n_embd)
        self.drop = nn.Dropout(p.dropout)
        self.blocks = nn.ModuleList(Block(p) for _ in range(p.n_layer))
        self.ln = nn.LayerNorm(p.n_embd)
        self.head = nn.Linear(p.n_embd, p.vocab_size, bias=False)
        self.head.weight = self.tokens.weight  # tied, as GPT-2
        for name, w in self.named_parameters():
            if w.dim() == 2:  # GPT-2's init; residual projections scaled down by depth
                std = 0.02 / math.sqrt(2 * p.n_layer) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                nn.init.normal_(w, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.drop(self.tokens(idx) + self.positions(torch.arange(t, device=idx.device)))
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(self.ln(x))


# ---------------------------------------------------------------- the workload


class LMWorkload:
    def __init__(self, params: Params, seed: int):
        self.params = params
        folder = data_path(params.data_dir)
        for name in ("train.bin", "val.bin"):
            if not (folder / name).is_file():  # a bad setting: the run stops as bad input (exit 2)
                raise ConfigError(str(Path(__file__).name), "params.data_dir", (
                    f"{folder} has no {name}; write them with python examples/lm_prepare.py "
                    "(from any text), or point data_dir at your own"))
        # Memory-mapped: nothing is read until a batch asks for its windows.
        self.train = np.memmap(folder / "train.bin", dtype=np.uint16, mode="r")
        self.val = np.memmap(folder / "val.bin", dtype=np.uint16, mode="r")
        t = params.block_size
        self.num_samples = (len(self.train) - 1) // t
        if self.num_samples < 1 or len(self.val) <= t:
            raise ConfigError(str(Path(__file__).name), "params.block_size", (
                f"{t}, but {folder}'s train.bin has {len(self.train)} tokens and val.bin "
                f"{len(self.val)}; expected more than block_size tokens in each"))
        # Held-out windows, evenly spaced over val.bin.
        self.val_starts = np.linspace(0, len(self.val) - t - 1, min(params.eval_windows, len(self.val) - t))
        # Training FLOPs per sample (PaLM's estimate, as nanoGPT): 6 per parameter per token
        # plus attention's 12 * layers * width * context per token.
        n = 12 * params.n_layer * params.n_embd ** 2 + params.vocab_size * params.n_embd
        self.flops_per_sample = (6 * n + 12 * params.n_layer * params.n_embd * t) * t

    def build_model(self, *, grad_checkpointing: bool) -> nn.Module:
        return GPT(self.params, grad_checkpointing)

    def _windows(self, data: np.memmap, starts, device: torch.device):
        t = self.params.block_size
        rows = np.stack([data[int(s):int(s) + t + 1] for s in starts]).astype(np.int64)
        if rows.max() >= self.params.vocab_size:  # the setting, not the code: bad input (exit 2)
            raise ConfigError(str(Path(__file__).name), "params.vocab_size", (
                f"{self.params.vocab_size}, but the data has token id {rows.max()}; expected "
                "a vocab_size above every id in train.bin and val.bin"))
        rows = torch.from_numpy(rows)
        if device.type == "cuda":  # pinned, so the copy overlaps the step before it
            rows = rows.pin_memory().to(device, non_blocking=True)
        else:
            rows = rows.to(device)
        return rows[:, :-1], rows[:, 1:]

    def batch(self, indices: torch.Tensor, device: torch.device):
        return self._windows(self.train, (indices * self.params.block_size).tolist(), device)

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))

    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        total, count = torch.zeros((), device=device), 0
        for chunk in np.array_split(self.val_starts, max(1, len(self.val_starts) // 16)):
            total += self.loss(model, self._windows(self.val, chunk, device)) * len(chunk)
            count += len(chunk)
        val_loss = float(total) / count
        return {"val_loss": round(val_loss, 4), "val_ppl": round(math.exp(min(val_loss, 50.0)), 3)}


def build(params: Params, seed: int) -> LMWorkload:
    """The factory the preset names: `workload = "../../lm_workload.py:build"`."""
    return LMWorkload(params, seed)

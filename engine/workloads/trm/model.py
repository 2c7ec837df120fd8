"""The recursive byte-level language model (see engine/workloads/trm/__init__.py for the idea).

Written from the TinyRecursiveModels paper and its public config (trm.yaml: H_cycles 3,
L_cycles 6, L_layers 2, hidden 512, heads 8, expansion 4, RoPE, post-norm, forward in bf16),
with causal attention because this model predicts the next byte.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

VOCAB = 256  # bytes
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Arch:
    """The shape of the model: what a checkpoint's weights need to be loaded into."""

    hidden_size: int
    L_layers: int
    num_heads: int
    expansion: float
    H_cycles: int
    L_cycles: int
    forward_dtype: str = "fp32"

    @classmethod
    def of(cls, params) -> "Arch":
        return cls(hidden_size=params.hidden_size, L_layers=params.L_layers,
                   num_heads=params.num_heads, expansion=params.expansion,
                   H_cycles=params.H_cycles, L_cycles=params.L_cycles,
                   forward_dtype=params.forward_dtype)

    @property
    def intermediate(self) -> int:
        # SwiGLU at 2/3 of expansion x hidden keeps the parameter count of a plain MLP of that
        # width; rounded up to a multiple of 256 like TRM's layers.
        return -(-round(self.expansion * self.hidden_size * 2 / 3) // 256) * 256

    @property
    def stack_params(self) -> int:
        h = self.hidden_size
        return self.L_layers * (4 * h * h + 3 * h * self.intermediate)

    def flops_per_token(self, seq_len: int, weight_grads: bool = True) -> float:
        """Training FLOPs per predicted byte: every stack application forward, the last cycle's
        (L_cycles + 1) applications backward at twice the cost (once, input gradients only,
        when the weights are frozen as under LoRA), plus the output head."""
        per_application = 2 * self.stack_params + 4 * seq_len * self.hidden_size * self.L_layers
        forward = self.H_cycles * (self.L_cycles + 1)
        backward = (2 if weight_grads else 1) * (self.L_cycles + 1)
        return per_application * (forward + backward) + 3 * 2 * self.hidden_size * VOCAB


def _trunc_normal_(tensor: torch.Tensor, std: float) -> torch.Tensor:
    return nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std)


def rms_norm(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    # In fp32 whatever the forward dtype: bf16 sums of squares lose too much.
    dtype = x.dtype
    x = x.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


class CastedLinear(nn.Linear):
    """A bias-free linear layer whose fp32 weight is cast to the input's dtype (bf16 forward
    without autocast, which not every backend has for bf16)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__(in_features, out_features, bias=False)
        with torch.no_grad():
            _trunc_normal_(self.weight, 1.0 / math.sqrt(in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.qkv = CastedLinear(hidden, 3 * hidden)
        self.out = CastedLinear(hidden, hidden)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv: tuple[torch.Tensor, torch.Tensor] | None = None, past: int = 0) -> torch.Tensor:
        """x: [B, T, hidden]. With `kv` (decoding), x holds positions past..past+T-1: their keys
        and values are written into kv's [B, heads, capacity, head_dim] buffers, and they attend
        to everything the buffers hold up to themselves."""
        b, t, h = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).unbind(2)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if kv is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            keys, values = kv
            keys[:, :, past:past + t], values[:, :, past:past + t] = k, v
            k, v = keys[:, :, :past + t], values[:, :, :past + t]
            # One new position sees all of them; several (a prompt read at once) see the past
            # and themselves causally. is_causal would align the triangle top-left, which is
            # wrong once there is a past.
            mask = None if t == 1 else torch.ones(t, past + t, dtype=torch.bool,
                                                   device=x.device).tril(past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, t, h))


class SwiGLU(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up = CastedLinear(hidden, 2 * intermediate)
        self.down = CastedLinear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    """Post-norm, as TRM: normalise after each residual sum."""

    def __init__(self, arch: Arch):
        super().__init__()
        self.attn = Attention(arch.hidden_size, arch.num_heads)
        self.mlp = SwiGLU(arch.hidden_size, arch.intermediate)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                kv: tuple[torch.Tensor, torch.Tensor] | None = None, past: int = 0) -> torch.Tensor:
        x = rms_norm(x + self.attn(x, cos, sin, kv, past))
        return rms_norm(x + self.mlp(x))


class Stack(nn.Module):
    """The one network TRM reuses for both latent updates: state + injection -> blocks."""

    def __init__(self, arch: Arch):
        super().__init__()
        self.layers = nn.ModuleList(Block(arch) for _ in range(arch.L_layers))

    def forward(self, state, injection, cos, sin, kv=None, past: int = 0):
        """kv (decoding only): one (keys, values) pair of buffers per layer."""
        x = state + injection
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if kv is None else kv[i], past)
        return x


class RecursiveLM(nn.Module):
    """bytes [B, T] -> next-byte logits [B, T, 256] (fp32)."""

    # The buffers (register_buffer), as the type checker should see them.
    H_init: torch.Tensor
    L_init: torch.Tensor
    inv_freq: torch.Tensor
    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, arch: Arch, grad_checkpointing: bool = False, positions: int = 1024):
        super().__init__()
        self.arch = arch
        self.grad_checkpointing = grad_checkpointing
        self.dtype = DTYPES[arch.forward_dtype]
        h = arch.hidden_size
        self.embed_scale = math.sqrt(h)
        self.embed = nn.Embedding(VOCAB, h)
        with torch.no_grad():
            _trunc_normal_(self.embed.weight, 1.0 / self.embed_scale)
        self.stack = Stack(arch)
        self.lm_head = CastedLinear(h, VOCAB)
        # The latent states' starting values: fixed random vectors, saved with the weights.
        self.register_buffer("H_init", _trunc_normal_(torch.empty(h), 1.0))
        self.register_buffer("L_init", _trunc_normal_(torch.empty(h), 1.0))
        head_dim = h // arch.num_heads
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        # RoPE's tables for the first `positions` positions (the training window), computed once:
        # computed in the forward pass instead, torch.compile inlines the cos and sin into every
        # kernel that rotates q and k, and on an H100 those kernels took 15% of a step
        # (benchmarks/mfu.py). Not saved with the weights: they follow from the shape.
        cos, sin = self._angles(positions, inv_freq.device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def _angles(self, t: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.outer(torch.arange(t, device=device, dtype=torch.float32), self.inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, head_dim]
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def _rope(self, t: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        if t <= self.rope_cos.shape[0]:
            # in the forward dtype even where the module was converted (the parity check's
            # fp32 copy of a bf16 model): q and k must meet v in one dtype
            return self.rope_cos[:t].to(self.dtype), self.rope_sin[:t].to(self.dtype)
        return self._angles(t, device)  # a longer window than the tables (generating past it)

    def _apply_stack(self, state, injection, cos, sin):
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(self.stack, state, injection, cos, sin, use_reentrant=False)
        return self.stack(state, injection, cos, sin)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        b, t = tokens.shape
        x = (self.embed(tokens) * self.embed_scale).to(self.dtype)
        cos, sin = self._rope(t, tokens.device)
        z_h = self.H_init.to(self.dtype).expand(b, t, -1)
        z_l = self.L_init.to(self.dtype).expand(b, t, -1)
        # TRM's gradient approximation: all cycles but the last refine the latents without a
        # graph, so memory does not grow with H_cycles.
        with torch.no_grad():
            for _ in range(self.arch.H_cycles - 1):
                for _ in range(self.arch.L_cycles):
                    z_l = self.stack(z_l, z_h + x, cos, sin)
                z_h = self.stack(z_h, z_l, cos, sin)
        for _ in range(self.arch.L_cycles):
            z_l = self._apply_stack(z_l, z_h + x, cos, sin)
        z_h = self._apply_stack(z_h, z_l, cos, sin)
        return self.lm_head(z_h).float()

    @torch.no_grad()
    def decode(self, tokens: torch.Tensor, cache: "DecodeCache") -> torch.Tensor:
        """forward()'s logits for the window positions cache.length.. (`tokens`, [B, T]), the
        earlier positions' keys and values read from `cache` instead of recomputed; the new
        ones are added to it. The same recursion as forward(), application for application."""
        b, t = tokens.shape
        past = cache.length
        if past + t > cache.capacity:
            raise ValueError(f"{past} + {t} positions do not fit a cache of {cache.capacity}")
        x = (self.embed(tokens) * self.embed_scale).to(self.dtype)
        cos, sin = self._rope(past + t, tokens.device)
        cos, sin = cos[past:], sin[past:]
        z_h = self.H_init.to(self.dtype).expand(b, t, -1)
        z_l = self.L_init.to(self.dtype).expand(b, t, -1)
        applications = iter(range(cache.applications))
        for _ in range(self.arch.H_cycles):
            for _ in range(self.arch.L_cycles):
                z_l = self.stack(z_l, z_h + x, cos, sin, cache.buffers(next(applications)), past)
            z_h = self.stack(z_h, z_l, cos, sin, cache.buffers(next(applications)), past)
        cache.length = past + t
        return self.lm_head(z_h).float()


class DecodeCache:
    """Keys and values of a window's positions so far, for every block the recursion runs.

    Why the recursion can be cached: every application of the stack is causal, and the rest of
    the recursion (the starting latents, the injection z_H + x) is position by position, so
    after any application a position's latents depend only on the window up to it. Unrolled,
    one forward pass is a causal transformer H_cycles x (L_cycles + 1) x L_layers blocks deep
    that shares its weights; adding a byte at the end changes nothing before it, so each of
    those blocks keeps its keys and values here and a new byte costs one position's pass
    through the unrolled stack instead of the whole window's. What cannot be kept: dropping
    the window's first byte changes every latent after it, so a window that moves is read
    again from its start (engine.workloads.trm.decoding.NextByte).
    """

    def __init__(self, model: RecursiveLM, batch: int, capacity: int, device: torch.device):
        arch = model.arch
        self.layers = arch.L_layers
        self.applications = arch.H_cycles * (arch.L_cycles + 1)
        head_dim = arch.hidden_size // arch.num_heads
        # Preallocated: appending by concatenation would copy the whole cache at every byte.
        shape = (self.applications * self.layers, batch, arch.num_heads, capacity, head_dim)
        self.keys = torch.empty(shape, dtype=model.dtype, device=device)
        self.values = torch.empty(shape, dtype=model.dtype, device=device)
        self.capacity, self.length = capacity, 0

    def buffers(self, application: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The (keys, values) of each layer of the stack, in its `application`-th run."""
        first = application * self.layers
        return [(self.keys[i], self.values[i]) for i in range(first, first + self.layers)]

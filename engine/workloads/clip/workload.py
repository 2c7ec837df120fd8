from __future__ import annotations

import math
from typing import Iterable, cast

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from engine.workloads.clip.params import COLOURS, SHAPES, SIZES, Params

RGB = {"red": (0.90, 0.15, 0.15), "green": (0.15, 0.80, 0.20), "blue": (0.20, 0.35, 0.95),
       "yellow": (0.95, 0.90, 0.15), "magenta": (0.90, 0.20, 0.85), "cyan": (0.15, 0.85, 0.90),
       "white": (0.95, 0.95, 0.95), "orange": (0.95, 0.55, 0.10)}
ROWS = {1: ("middle",), 2: ("top", "bottom"), 3: ("top", "middle", "bottom")}
COLS = {1: ("center",), 2: ("left", "right"), 3: ("left", "center", "right")}
VOCAB = ("a", "at", *SIZES, *COLOURS, *SHAPES, "top", "middle", "bottom", "left", "center", "right")
CAPTION_LEN = 7  # a <size> <colour> <shape> at <row> <col>
RADIUS = {"small": 0.24, "large": 0.40}  # of a grid cell's side
NOISE_TEXTURES = 64


def captions(p: Params) -> list[str]:
    """Every distinct caption, in caption-id order (the order `combo` ids count in)."""
    out = []
    for shape in SHAPES[:p.shapes]:
        for colour in COLOURS[:p.colours]:
            for row in ROWS[p.grid]:
                for col in COLS[p.grid]:
                    for size in SIZES[:p.sizes]:
                        out.append(f"a {size} {colour} {shape} at {row} {col}")
    return out


def _split(combo: torch.Tensor, p: Params) -> dict[str, torch.Tensor]:
    """Caption id -> its shape, colour, row, col and size indices (mixed radix, as captions())."""
    size = combo % p.sizes
    rest = combo // p.sizes
    col = rest % p.grid
    rest = rest // p.grid
    row = rest % p.grid
    rest = rest // p.grid
    return {"shape": rest // p.colours, "colour": rest % p.colours, "row": row, "col": col, "size": size}


class Pictures:
    """A set of pictures, each drawn on demand from a few seeded numbers per sample."""

    def __init__(self, p: Params, count: int, generator: torch.Generator):
        self.p = p
        self.combo = torch.randint(p.captions, (count,), generator=generator)
        self.offset = torch.rand(count, 2, generator=generator) * 2 - 1     # position jitter
        self.scale = torch.rand(count, generator=generator) * 2 - 1         # size jitter
        self.tint = torch.rand(count, 3, generator=generator) * 2 - 1       # colour jitter
        self.noise = torch.randint(NOISE_TEXTURES, (count,), generator=generator)
        self.textures = torch.rand(NOISE_TEXTURES, 3, p.image_size, p.image_size, generator=generator)
        self._on: dict[torch.device, dict[str, torch.Tensor]] = {}

    def _tensors(self, device: torch.device) -> dict[str, torch.Tensor]:
        # Small (a few numbers per sample): one copy per device, so drawing happens there.
        if device not in self._on:
            self._on[device] = {name: getattr(self, name).to(device) for name in
                                ("combo", "offset", "scale", "tint", "noise", "textures")} | {
                "rgb": torch.tensor([RGB[c] for c in COLOURS], device=device)}
        return self._on[device]

    def draw(self, indices: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(pictures normalised to about [-2, 2], caption ids) for these samples."""
        p, t = self.p, self._tensors(device)
        indices = indices.to(device, non_blocking=True)
        combo = t["combo"][indices]
        parts = _split(combo, p)
        cell = 1.0 / p.grid
        radius = torch.where(parts["size"] == 0, RADIUS[SIZES[0]], RADIUS[SIZES[1]]) * cell
        radius = radius * (1 + 0.12 * t["scale"][indices])
        # The shape moves within its cell but never out of it.
        room = (cell / 2 - radius).clamp(min=0) * 0.6
        offset = t["offset"][indices]
        cx = (parts["col"] + 0.5) * cell + offset[:, 0] * room
        cy = (parts["row"] + 0.5) * cell + offset[:, 1] * room
        s = p.image_size
        coords = (torch.arange(s, device=device, dtype=torch.float32) + 0.5) / s
        dx = coords.view(1, 1, s) - cx.view(-1, 1, 1)
        dy = coords.view(1, s, 1) - cy.view(-1, 1, 1)
        r = radius.view(-1, 1, 1)
        sdf = self._signed_distance(dx, dy, r, parts["shape"])
        mask = (0.5 - sdf * s).clamp(0, 1).unsqueeze(1)  # one pixel of anti-aliasing
        colour = (t["rgb"][parts["colour"]] + 0.08 * t["tint"][indices]).clamp(0, 1)
        background = 0.1 + 0.1 * t["textures"][t["noise"][indices]]
        image = background * (1 - mask) + colour.view(-1, 3, 1, 1) * mask
        return (image - 0.45) / 0.3, combo

    def _signed_distance(self, dx, dy, r, shape):
        """Distance outside the shape's edge (negative inside), in units of the picture side."""
        ax, ay = dx.abs(), dy.abs()
        dist = torch.sqrt(dx * dx + dy * dy)
        arm = 0.33 * r
        every = {
            "circle": lambda: dist - r,
            "square": lambda: torch.maximum(ax, ay) - 0.82 * r,
            # apex up: base at dy = 0.7r, sides through (0, -r) and (+-0.95r, 0.7r)
            "triangle": lambda: torch.maximum(dy - 0.7 * r, (1.7 * ax - 0.95 * (dy + r)) / 1.947),
            "cross": lambda: torch.minimum(torch.maximum(ax - arm, ay - r), torch.maximum(ay - arm, ax - r)),
            "ring": lambda: (dist - 0.7 * r).abs() - 0.3 * r,
            "diamond": lambda: (ax + ay - 1.15 * r) / math.sqrt(2),
        }
        # Every shape's distance, then each sample's pick: no host sync, so batches can be
        # drawn on an accelerator inside the training step.
        names = SHAPES[:self.p.shapes]
        out = every[names[0]]()
        for k, name in enumerate(names[1:], start=1):
            out = torch.where(shape.view(-1, 1, 1) == k, every[name](), out)
        return out


class Block(nn.Module):
    """Pre-norm transformer block: attention then a 4x MLP, each residual."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Tower(nn.Module):
    """Learned positions, `layers` blocks, a final norm."""

    def __init__(self, width: int, layers: int, heads: int, tokens: int, grad_checkpointing: bool):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(tokens, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)
        self.grad_checkpointing = grad_checkpointing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.pos
        for block in self.blocks:
            if self.grad_checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.ln(x)


class DualEncoder(nn.Module):
    """ViT image tower + transformer text tower, projected into one normalised space."""

    def __init__(self, p: Params, grad_checkpointing: bool):
        super().__init__()
        patches = (p.image_size // p.patch) ** 2
        self.patch = nn.Conv2d(3, p.width, p.patch, stride=p.patch)
        self.cls = nn.Parameter(torch.zeros(p.width))
        self.vision = Tower(p.width, p.layers, p.heads, patches + 1, grad_checkpointing)
        self.image_proj = nn.Linear(p.width, p.embed_dim, bias=False)
        self.token = nn.Embedding(len(VOCAB), p.text_width)
        self.text = Tower(p.text_width, p.text_layers, p.text_heads, CAPTION_LEN, grad_checkpointing)
        self.text_proj = nn.Linear(p.text_width, p.embed_dim, bias=False)
        # CLIP's learnable temperature, as log(1/T), starting at T = 0.07.
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.apply(self._init)
        for tower, layers in ((self.vision, p.layers), (self.text, p.text_layers)):
            for block in cast("Iterable[Block]", tower.blocks):
                # residual branches scaled down with depth, as GPT-2 does, so 12 layers start stable
                nn.init.normal_(block.proj.weight, std=0.02 / math.sqrt(2 * layers))
                nn.init.normal_(block.fc2.weight, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.to(x.dtype).expand(x.shape[0], 1, -1), x], dim=1)
        return F.normalize(self.image_proj(self.vision(x)[:, 0]).float(), dim=-1)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.text(self.token(tokens)).mean(dim=1)
        return F.normalize(self.text_proj(x).float(), dim=-1)

    def forward(self, images: torch.Tensor, tokens: torch.Tensor):
        """(image embeddings, text embeddings, logit scale); one call, so compile covers both."""
        scale = self.logit_scale.clamp(max=math.log(100)).exp()  # CLIP caps the scale at 100
        return self.encode_image(images), self.encode_text(tokens), scale


def _tower_flops(width: int, layers: int, tokens: int) -> float:
    # Per layer forward: 2 * tokens * 12 width^2 for the matmuls, 4 * tokens^2 * width for attention.
    return layers * (24 * tokens * width * width + 4 * tokens * tokens * width)


class ClipWorkload:
    def __init__(self, params: Params, seed: int):
        self.params = params
        g = torch.Generator().manual_seed(seed)
        self.train = Pictures(params, params.samples, g)
        self.held_out = Pictures(params, params.eval_samples, g)
        self.captions = captions(params)
        index = {w: i for i, w in enumerate(VOCAB)}
        self.tokens = torch.tensor([[index[w] for w in c.split()] for c in self.captions])
        self._tokens_on: dict[torch.device, torch.Tensor] = {}
        self.num_samples = params.samples
        p = params
        patches = (p.image_size // p.patch) ** 2
        forward = (_tower_flops(p.width, p.layers, patches + 1)
                   + 2 * patches * 3 * p.patch * p.patch * p.width
                   + _tower_flops(p.text_width, p.text_layers, CAPTION_LEN)
                   + 2 * (p.width + p.text_width) * p.embed_dim)
        self.flops_per_sample = 3.0 * forward  # backward costs about twice the forward

    def build_model(self, *, grad_checkpointing: bool) -> nn.Module:
        return DualEncoder(self.params, grad_checkpointing)

    def repeated_blocks(self, model: nn.Module) -> list[nn.Module]:
        """Each tower's blocks: compiled one by one, a compiled block serves its tower's others
        (engine.train.compiling)."""
        encoder = cast(DualEncoder, model)
        return [*encoder.vision.blocks, *encoder.text.blocks]

    def _caption_tokens(self, device: torch.device) -> torch.Tensor:
        if device not in self._tokens_on:
            self._tokens_on[device] = self.tokens.to(device)
        return self._tokens_on[device]

    def batch(self, indices: torch.Tensor, device: torch.device):
        images, combo = self.train.draw(indices, device)
        return images, self._caption_tokens(device)[combo], combo

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        images, tokens, combo = batch
        image_emb, text_emb, scale = model(images, tokens)
        logits = scale * image_emb @ text_emb.T
        # Two pictures with one caption are both right for it: the target spreads over every
        # pair in the batch that shares a caption, instead of calling the twin a negative.
        same = (combo[:, None] == combo[None, :]).float()
        target = same / same.sum(dim=1, keepdim=True)
        return (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target)) / 2

    @torch.no_grad()
    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        tokens = self._caption_tokens(device)
        total = self.params.eval_samples
        top1 = top5 = 0
        k = min(5, len(self.captions))
        for start in range(0, total, 256):
            indices = torch.arange(start, min(total, start + 256))
            images, truth = self.held_out.draw(indices, device)
            image_emb, text_emb, _ = model(images, tokens)
            best = (image_emb @ text_emb.T).topk(k, dim=1).indices
            top1 += int((best[:, 0] == truth).sum())
            top5 += int((best == truth[:, None]).any(dim=1).sum())
        return {"i2t_top1": top1 / total, "i2t_top5": top5 / total,
                "chance_top1": 1 / len(self.captions)}

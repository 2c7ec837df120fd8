"""clip's settings, the preset's [params] table, and the shapes, colours and sizes its
pictures and captions are made of. No torch: the card and workload.py both import it.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.schema import FieldError, setting

SHAPES = ("circle", "square", "triangle", "cross", "ring", "diamond")
COLOURS = ("red", "green", "blue", "yellow", "magenta", "cyan", "white", "orange")
SIZES = ("large", "small")  # sizes = 1 draws every shape large


@dataclass(frozen=True, kw_only=True, slots=True)
class Params:
    # The defaults are note 004's model: 76M parameters (two 12-layer, 512-wide towers).
    image_size: int = setting(32, "picture side in pixels", min=8)
    patch: int = setting(4, "ViT patch side in pixels; divides image_size", min=1)
    shapes: int = setting(6, "how many shapes are drawn: " + ", ".join(SHAPES), min=1, max=len(SHAPES))
    colours: int = setting(8, "how many colours: " + ", ".join(COLOURS), min=1, max=len(COLOURS))
    grid: int = setting(3, "positions per side (3: top/middle/bottom x left/center/right)", min=1, max=3)
    sizes: int = setting(2, "1: every shape large; 2: large or small", min=1, max=2)
    width: int = setting(512, "image tower width", min=8)
    layers: int = setting(12, "image tower transformer layers", min=1)
    heads: int = setting(8, "image tower attention heads; divides width", min=1)
    text_width: int = setting(512, "text tower width", min=8)
    text_layers: int = setting(12, "text tower transformer layers", min=1)
    text_heads: int = setting(8, "text tower attention heads; divides text_width", min=1)
    embed_dim: int = setting(512, "width of the shared image/text space", min=2)
    samples: int = setting(2048, "training pictures per epoch", min=2)
    eval_samples: int = setting(512, "held-out pictures for image->text top-1", min=1)

    def __post_init__(self):
        if self.image_size % self.patch:
            raise FieldError("patch", f"got {self.patch}, expected a divisor of image_size "
                                      f"({self.image_size})")
        if self.width % self.heads:
            raise FieldError("heads", f"got {self.heads}, expected a divisor of width ({self.width})")
        if self.text_width % self.text_heads:
            raise FieldError("text_heads", f"got {self.text_heads}, expected a divisor of "
                                           f"text_width ({self.text_width})")

    @property
    def captions(self) -> int:
        """How many distinct captions there are: 1/captions is the chance of top-1."""
        return self.shapes * self.colours * self.grid * self.grid * self.sizes

"""trm's settings, the preset's [params] table, and the architecture and data checks lora's
settings share. No torch: the card, workload.py and lora import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.schema import FieldError, setting

DATA_SUFFIXES = (".txt", ".jsonl")


def check_architecture(params) -> None:
    """Shared by trm and lora Params: heads must split the hidden size into even halves."""
    if params.hidden_size % params.num_heads:
        raise FieldError("hidden_size", f"got {params.hidden_size}, expected a multiple of "
                                        f"num_heads ({params.num_heads})")
    if (params.hidden_size // params.num_heads) % 2:
        raise FieldError("num_heads", f"got {params.num_heads}: head size "
                                      f"{params.hidden_size // params.num_heads} is odd, expected "
                                      "an even head size (RoPE rotates pairs)")


def check_data_path(data_path: str) -> None:
    if data_path and not data_path.endswith(DATA_SUFFIXES):
        raise FieldError("data_path", f"got {data_path!r}, expected a .txt or .jsonl file, or \"\" "
                                      "for the Python standard library's sources")


@dataclass(frozen=True, kw_only=True, slots=True)
class Params:
    hidden_size: int = setting(512, "width of the block stack", min=8)
    L_layers: int = setting(2, "transformer blocks in the stack", min=1)
    num_heads: int = setting(8, "attention heads", min=1)
    expansion: float = setting(4.0, "SwiGLU width as a multiple of hidden_size", above=0.0)
    H_cycles: int = setting(3, "recursion cycles per forward pass (only the last one "
                               "is differentiated)", min=1)
    L_cycles: int = setting(6, "z_L updates per cycle", min=1)
    seq_len: int = setting(256, "bytes of context per training window", min=2)
    forward_dtype: Literal["fp32", "bf16"] = setting("fp32", "dtype the forward pass computes in "
                                                             "(weights stay fp32)")
    data_path: str = setting("", "a .txt or .jsonl chat file; \"\" = the Python standard "
                                 "library's .py sources")
    corpus_bytes: int = setting(4_000_000, "at most this many bytes of training text", min=64)
    eval_bytes: int = setting(65_536, "bytes of held-out text for loss and bits per byte", min=64)

    def __post_init__(self):
        check_architecture(self)
        check_data_path(self.data_path)

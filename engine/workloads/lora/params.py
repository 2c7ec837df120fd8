"""lora's settings, the preset's [params] table, and the layers adapters can go on. No
torch: the card and workload.py both import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from engine.schema import FieldError, setting
from engine.workloads.trm.params import check_architecture, check_data_path

TARGETS = ("qkv", "out", "gate_up", "down")


@dataclass(frozen=True, kw_only=True, slots=True)
class Params:
    base_run: str = setting("", "trm run to fine-tune (id, unique prefix or absolute path); "
                                "\"\" = a fresh trm of the size below")
    rank: int = setting(16, "LoRA rank r", min=1)
    alpha: float = setting(32.0, "LoRA alpha: the update is scaled by alpha / rank", above=0.0)
    dropout: float = setting(0.0, "dropout on the adapters' input", min=0.0, max=0.9)
    target_modules: tuple[str, ...] = setting(["qkv", "out"], "linear layers that get adapters: "
                                                              + ", ".join(TARGETS))
    max_seq_len: int = setting(128, "bytes per fine-tuning window (note 003: 512 -> 128)", min=2)
    grad_checkpointing: bool = setting(False, "recompute activations in backward; the device "
                                              "preset's switch turns it on too")
    forward_dtype: Literal["fp32", "bf16"] = setting("fp32", "dtype the forward pass computes in")
    hidden_size: int = setting(512, "width, when base_run is \"\" (else the base run's)", min=8)
    L_layers: int = setting(2, "blocks, when base_run is \"\"", min=1)
    num_heads: int = setting(8, "attention heads, when base_run is \"\"", min=1)
    expansion: float = setting(4.0, "SwiGLU width / hidden_size, when base_run is \"\"", above=0.0)
    H_cycles: int = setting(3, "recursion cycles, when base_run is \"\"", min=1)
    L_cycles: int = setting(6, "z_L updates per cycle, when base_run is \"\"", min=1)
    data_path: str = setting("", "fine-tuning text, .txt or .jsonl chat; \"\" = the Python "
                                 "standard library's .py sources")
    corpus_bytes: int = setting(4_000_000, "at most this many bytes of training text", min=64)
    eval_bytes: int = setting(65_536, "bytes of held-out text for bits per byte", min=64)

    def __post_init__(self):
        check_architecture(self)
        check_data_path(self.data_path)
        if not self.target_modules:
            raise FieldError("target_modules", "is empty; expected some of " + ", ".join(TARGETS))
        for name in self.target_modules:
            if name not in TARGETS:
                raise FieldError("target_modules", f"got {name!r}, expected names from "
                                 + ", ".join(TARGETS))
        if self.base_run == "last":
            raise FieldError("base_run", "got 'last', which would name this run itself once it "
                                         "starts; expected the base run's id or absolute path")
        if "/" in self.base_run and not self.base_run.startswith("/"):
            raise FieldError("base_run", f"got {self.base_run!r}, expected a run id or an "
                                         "absolute path (the trainer runs elsewhere)")

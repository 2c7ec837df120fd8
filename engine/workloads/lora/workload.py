from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from torch.nn import functional as F

from engine.record import checkpoint
from engine.errors import ConfigError
from engine.record.rundir import RunDir, find_run
from engine.workloads.lora.params import Params
from engine.workloads.trm.model import Arch, RecursiveLM
from engine.workloads.trm.workload import ByteLM

WHERE = "params.base_run"


class LoRALinear(nn.Module):
    """base(x) + (alpha / rank) * B(A(dropout(x))), with the base layer frozen."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float):
        super().__init__()
        self.base = base
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))  # zero: starts at base
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scaling = alpha / rank
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = F.linear(F.linear(self.dropout(x), self.lora_a.to(x.dtype)), self.lora_b.to(x.dtype))
        return self.base(x) + update * self.scaling


def add_adapters(model: nn.Module, targets: tuple[str, ...], rank: int, alpha: float,
                 dropout: float) -> int:
    """Freeze every weight, then wrap each nn.Linear named in `targets`; returns how many."""
    for p in model.parameters():
        p.requires_grad_(False)
    wrapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if name in targets and isinstance(child, nn.Linear):
                setattr(module, name, LoRALinear(child, rank, alpha, dropout))
                wrapped += 1
    return wrapped


class LoraWorkload(ByteLM):
    def __init__(self, params: Params, seed: int):
        self.params = params
        self.base_run = self._find_base()
        self.arch = self._arch()
        super().__init__(seq_len=params.max_seq_len, data_path=params.data_path,
                         corpus_bytes=params.corpus_bytes, eval_bytes=params.eval_bytes,
                         flops_per_sample=params.max_seq_len * self.arch.flops_per_token(
                             params.max_seq_len, weight_grads=False))

    def _find_base(self) -> RunDir | None:
        if not self.params.base_run:
            return None
        try:
            run = find_run(self.params.base_run)
        except ConfigError as e:
            raise ConfigError(WHERE, None, f"{self.params.base_run!r}: {e.problem}") from None
        workload = run.config().workload.workload
        if workload != "trm":
            raise ConfigError(WHERE, None, f"run {run.id} trained {workload!r}; expected a trm run")
        return run

    def _arch(self) -> Arch:
        if self.base_run is None:
            return Arch.of(self.params)
        # The base's shape, but the forward dtype is how to run, so it is this run's choice.
        return dataclasses.replace(Arch.of(self.base_run.config().workload.params),
                                   forward_dtype=self.params.forward_dtype)

    def _wrap(self, model: nn.Module) -> nn.Module:
        p = self.params
        if not add_adapters(model, p.target_modules, p.rank, p.alpha, p.dropout):
            raise ConfigError("params.target_modules", None, f"{list(p.target_modules)} matched "
                              "no linear layer of the model")
        return model

    def build_model(self, *, grad_checkpointing: bool) -> nn.Module:
        model = RecursiveLM(self.arch, grad_checkpointing or self.params.grad_checkpointing,
                            positions=self.seq_len)
        if self.base_run is not None:
            path = checkpoint.newest_intact(self.base_run.checkpoints)
            if path is None:
                raise ConfigError(WHERE, None, f"run {self.base_run.id} has no checkpoint yet; "
                                               "expected a trm run that has saved one")
            model.load_state_dict(checkpoint.load(path)["model"], strict=True)
            # The attempt's log says which weights it started from.
            print(f"lora: base weights from {path}", flush=True)
        return self._wrap(model)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        metrics = super().evaluate(model, device)
        metrics["trainable_params"] = float(sum(p.numel() for p in model.parameters() if p.requires_grad))
        metrics["total_params"] = float(sum(p.numel() for p in model.parameters()))
        return metrics

    def continue_text(self, model_state: dict, prompt: str, *, tokens: int, temperature: float,
                      seed: int, on_text=None) -> str:
        """Continue `prompt` with a checkpoint's weights (base and adapters), on the CPU."""
        model = self._wrap(RecursiveLM(self.arch, positions=self.seq_len))  # the checkpoint holds the base weights too
        model.load_state_dict(model_state, strict=True)
        return self.continue_model(model, prompt, tokens=tokens, temperature=temperature, seed=seed,
                                   on_text=on_text)

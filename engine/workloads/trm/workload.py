from __future__ import annotations

import codecs
import math
from typing import Any, Callable, cast

import torch
from torch import nn
from torch.nn import functional as F

from engine.monitor import device as devices
from engine.workloads.trm import corpus
from engine.workloads.trm.decoding import FasterThreads, stream
from engine.workloads.trm.model import VOCAB, Arch, RecursiveLM
from engine.workloads.trm.params import Params

EVAL_BATCH = 16  # held-out windows per forward pass in evaluate()


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


class ByteLM:
    """Windows of bytes -> next-byte loss, held-out bits per byte, text continuation.
    Shared by trm and lora (which differ only in the model they build)."""

    def __init__(self, *, seq_len: int, data_path: str, corpus_bytes: int, eval_bytes: int,
                 flops_per_sample: float | None):
        self.seq_len = seq_len
        self._data: dict[str, Any] = dict(data_path=data_path, corpus_bytes=corpus_bytes,
                                          eval_bytes=eval_bytes)
        self._corpus: corpus.Corpus | None = None
        self._train: torch.Tensor | None = None
        self._data_device: torch.device | None = None
        self.flops_per_sample = flops_per_sample

    @property
    def corpus(self) -> corpus.Corpus:
        # Loaded on first use: sampling from a checkpoint needs the model, not the text.
        if self._corpus is None:
            self._corpus = corpus.load(**self._data, min_bytes=self.seq_len + 1)
        return self._corpus

    @property
    def num_samples(self) -> int:
        return (len(self.corpus.train) - 1) // self.seq_len

    def batch(self, indices: torch.Tensor, device: torch.device):
        # The text is a few MB of bytes: keep one copy on the device and cut windows there.
        train = self._train
        if train is None or self._data_device != device:
            train = self._train = _bytes_tensor(self.corpus.train).to(device)
            self._data_device = device
        starts = indices.to(device, non_blocking=True) * self.seq_len
        windows = train[starts[:, None] + torch.arange(self.seq_len + 1, device=device)].long()
        return windows[:, :-1], windows[:, 1:]

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        inputs, targets = batch
        return F.cross_entropy(model(inputs).reshape(-1, VOCAB).float(), targets.reshape(-1))

    def repeated_blocks(self, model: nn.Module) -> list[nn.Module]:
        """The stack's layers, applied H_cycles x (L_cycles + 1) times a forward: compiled one
        by one, one compiled block serves them all (engine.train.compiling)."""
        return list(cast(RecursiveLM, model).stack.layers)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, device: torch.device) -> dict[str, float]:
        held = _bytes_tensor(self.corpus.held_out)
        count = (len(held) - 1) // self.seq_len
        windows = held[:count * self.seq_len + 1]
        total, predicted = torch.zeros((), dtype=torch.float64, device=device), 0
        for start in range(0, count, EVAL_BATCH):
            n = min(EVAL_BATCH, count - start)
            starts = torch.arange(start, start + n) * self.seq_len
            chunk = windows[starts[:, None] + torch.arange(self.seq_len + 1)].long().to(device)
            logits = model(chunk[:, :-1]).reshape(-1, VOCAB).float()
            total += F.cross_entropy(logits, chunk[:, 1:].reshape(-1), reduction="sum").double()
            predicted += chunk[:, 1:].numel()
        nats = float(total) / predicted
        # Named apart from the step events' training loss, which it sits beside in summaries.
        return {"held_out_loss": nats, "bits_per_byte": nats / math.log(2),
                **devices.peak_memory_mb(device)}

    def continue_model(self, model: nn.Module, prompt: str, *, tokens: int, temperature: float,
                       seed: int, on_text: Callable[[str], None] | None = None) -> str:
        """The continuation as text; `on_text` gets it piece by piece as it is written (a byte
        that ends a character, or a replacement for bytes that are not UTF-8)."""
        model.eval()
        # Incremental, so a character written in several bytes is passed on whole; the pieces
        # join to exactly what decoding all the bytes at once gives.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pieces = []
        threads = FasterThreads()
        try:
            # build_model makes a RecursiveLM, in trm and in lora (with adapters inside)
            for byte in threads.timed(stream(cast(RecursiveLM, model), prompt.encode("utf-8"),
                                             tokens=tokens, temperature=temperature,
                                             context=self.seq_len, seed=seed)):
                pieces.append(decoder.decode(bytes((byte,))))
                if pieces[-1] and on_text is not None:
                    on_text(pieces[-1])
        finally:
            threads.restore()
        pieces.append(decoder.decode(b"", final=True))
        if pieces[-1] and on_text is not None:
            on_text(pieces[-1])
        return "".join(pieces)


class TrmWorkload(ByteLM):
    def __init__(self, params: Params, seed: int):
        self.params = params
        self.arch = Arch.of(params)
        super().__init__(seq_len=params.seq_len, data_path=params.data_path,
                         corpus_bytes=params.corpus_bytes, eval_bytes=params.eval_bytes,
                         flops_per_sample=params.seq_len * self.arch.flops_per_token(params.seq_len))

    def build_model(self, *, grad_checkpointing: bool) -> nn.Module:
        return RecursiveLM(self.arch, grad_checkpointing, positions=self.seq_len)

    def continue_text(self, model_state: dict, prompt: str, *, tokens: int, temperature: float,
                      seed: int, on_text: Callable[[str], None] | None = None) -> str:
        """Continue `prompt` with the weights of a checkpoint, on the CPU."""
        model = self.build_model(grad_checkpointing=False)
        model.load_state_dict(model_state, strict=True)
        return self.continue_model(model, prompt, tokens=tokens, temperature=temperature, seed=seed,
                                   on_text=on_text)

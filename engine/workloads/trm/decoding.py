"""Writing text with a RecursiveLM: the window each byte sees, the cache that makes a byte
cost one position's pass (model.DecodeCache), sampling, and the CPU thread count to do it with.
"""

from __future__ import annotations

import copy
import time
from typing import Callable, Iterator

import torch

from engine.workloads.trm.model import DecodeCache, RecursiveLM


def weights_cast(model: RecursiveLM) -> RecursiveLM:
    """A copy of `model` whose weights are kept in its forward dtype: every weight but the
    embedding's is cast to it at each use (CastedLinear, LoRA's adapters), the same numbers
    either way, and for one position at a time that cast was most of a byte's time (64% of
    trm-chat-small's in bf16: each of its 84 block runs converted 7M weights)."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name != "embed.weight":
                p.data = p.data.to(model.dtype)
    return model


class NextByte:
    """Next-byte logits for a text that grows a byte at a time, seeing at most `context` bytes.

    The window: the text's last `context` bytes to start with, growing with each byte; when it
    would pass `context`, its older half is dropped and the rest read again from position 0,
    so each prediction sees between context/2 and context bytes. Cached (DecodeCache), a byte
    costs one position's pass through the recursion and a move of the window one pass of
    context/2 positions; `cached=False` runs the whole window through forward() for every byte
    (the reference the cached path is tested and timed against: the same windows, the same
    logits up to floating-point rounding)."""

    def __init__(self, model: RecursiveLM, context: int, *, cached: bool = True):
        self.device = next(model.parameters()).device
        if cached and model.dtype != torch.float32:
            model = weights_cast(model)
        self.model, self.context = model, context
        self.cache = DecodeCache(model, 1, context, self.device) if cached else None
        self.start: int | None = None  # where the window begins in the text

    @torch.no_grad()
    def __call__(self, ids: list[int]) -> torch.Tensor:
        """Logits [256] (fp32, CPU) of the byte after `ids`: the text so far, which each call
        must extend by bytes appended at its end (with at least one byte to begin with)."""
        if self.start is None:
            self.start = max(0, len(ids) - self.context)
        elif len(ids) - self.start > self.context:
            self.start = len(ids) - (self.context + 1) // 2
            if self.cache is not None:
                self.cache.length = 0
        if self.cache is None:
            window = torch.tensor([ids[self.start:]], device=self.device)
            return self.model(window)[0, -1].float().cpu()
        unread = torch.tensor([ids[self.start + self.cache.length:]], device=self.device)
        return self.model.decode(unread, self.cache)[0, -1].float().cpu()


def stream(model: RecursiveLM, prompt: bytes, *, tokens: int, temperature: float, context: int,
           seed: int = 0, cached: bool = True) -> Iterator[int]:
    """Continue `prompt` by `tokens` bytes, one at a time, seeing at most `context` bytes
    (NextByte's window). temperature 0 picks the likeliest byte; above 0 samples (seeded, so
    repeatable)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    ids = list(prompt) or [ord("\n")]
    next_byte = NextByte(model, context, cached=cached)
    for _ in range(tokens):
        logits = next_byte(ids)
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = int(torch.multinomial(probs, 1, generator=generator))
        ids.append(nxt)
        yield nxt


def generate(model: RecursiveLM, prompt: bytes, *, tokens: int, temperature: float, context: int,
             seed: int = 0, cached: bool = True) -> bytes:
    """stream()'s bytes, all at once."""
    return bytes(stream(model, prompt, tokens=tokens, temperature=temperature, context=context,
                        seed=seed, cached=cached))


class FasterThreads:
    """Which CPU thread count writes bytes faster: torch's (one per core) or one.

    A byte is a chain of a few hundred small operations, matrix-vector products the largest.
    Split across threads, each ends at a barrier that waits for the slowest thread, and on a
    machine whose cores are busy (a run training beside the sampler) the scheduler delays one
    at almost every barrier: on a 2-core VM under load, 2 threads wrote a byte 6x slower than
    one (benchmarks/sample.py --threads). On idle cores, more threads read the weights faster.
    So the first bytes alternate between the two counts, timed (the very first is not: it
    reads the prompt too), and the rest are written with the count of the faster median.
    restore() puts torch's count back."""

    TRIES = 3  # bytes timed with each count

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock, self.default = clock, torch.get_num_threads()
        self.times: dict[int, list[float]] = {self.default: [], 1: []}
        self.chosen: int | None = self.default if self.default == 1 else None

    def timed(self, written: Iterator[int]) -> Iterator[int]:
        """`written`'s bytes, each timed from asking for it to getting it (not the time the
        caller spends with it), the thread count set for the next."""
        first = True
        while True:
            start = self.clock()
            try:
                byte = next(written)
            except StopIteration:
                return
            if self.chosen is None:
                if not first:
                    self.times[torch.get_num_threads()].append(self.clock() - start)
                self._next()
            first = False
            yield byte

    def _next(self) -> None:
        if all(len(t) >= self.TRIES for t in self.times.values()):
            self.chosen = min(self.times, key=lambda n: sorted(self.times[n])[self.TRIES // 2])
            torch.set_num_threads(self.chosen)
        else:
            torch.set_num_threads(1 if torch.get_num_threads() != 1 else self.default)

    def restore(self) -> None:
        torch.set_num_threads(self.default)

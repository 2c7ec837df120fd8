"""Sampling with a cache: the recursion's keys and values kept from byte to byte give the logits
the whole window through forward() gives, before and past the window's end, for trm and
lora models; `cockpit sample` streams its text and refuses bad arguments in one line."""

from __future__ import annotations

import pytest
import torch

from engine.workloads.trm.decoding import NextByte
from engine.workloads.trm.model import Arch, DecodeCache, RecursiveLM

# Every part of the recursion that decoding repeats: several layers, cycles and heads.
ARCH = Arch(hidden_size=32, L_layers=2, num_heads=4, expansion=2.0, H_cycles=2, L_cycles=2)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: a second thread only adds barrier waits on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def model(forward_dtype: str = "fp32", positions: int = 64) -> RecursiveLM:
    torch.manual_seed(0)
    arch = Arch(**{**ARCH.__dict__, "forward_dtype": forward_dtype})
    return RecursiveLM(arch, positions=positions).eval()


def text(n: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(1)).tolist()


def scale(logits: torch.Tensor) -> float:
    return float(logits.abs().max())


@pytest.mark.parametrize("forward_dtype, tolerance", [("fp32", 1e-4), ("bf16", 0.1)])
def test_the_cache_gives_the_whole_windows_logits(forward_dtype, tolerance):
    """Read in pieces (a prompt, then three bytes at once, then byte by byte), every position's
    logits match one forward() of the whole window, to rounding (bf16's is coarser: a tolerance
    relative to the logits' size, far below what a wrong position or mask gives)."""
    lm, ids = model(forward_dtype), torch.tensor([text(40)])
    with torch.no_grad():
        whole = lm(ids)[0]
    cache = DecodeCache(lm, 1, 40, torch.device("cpu"))
    pieces = [lm.decode(ids[:, :10], cache), lm.decode(ids[:, 10:13], cache)]
    pieces += [lm.decode(ids[:, i:i + 1], cache) for i in range(13, 40)]
    assert cache.length == 40
    cached = torch.cat(pieces, dim=1)[0]
    assert (cached - whole).abs().max() <= tolerance * scale(whole)


@pytest.mark.parametrize("prompt_bytes, forward_dtype, tolerance", [
    (5, "fp32", 1e-3), (30, "fp32", 1e-3),  # a prompt shorter and one longer than the window
    (5, "bf16", 0.1),  # decoded with a copy of the weights kept in bf16
])
def test_next_byte_agrees_cached_and_not_past_the_window(prompt_bytes, forward_dtype, tolerance):
    """A text three times the window, fed a byte at a time: cached and uncached see the same
    windows (moved twice or more) and give the same next-byte logits at every step."""
    lm, ids = model(forward_dtype), text(prompt_bytes + 60)
    context = 16
    cached, uncached = NextByte(lm, context), NextByte(lm, context, cached=False)
    for n in range(prompt_bytes, len(ids) + 1):
        a, b = cached(ids[:n]), uncached(ids[:n])
        assert a.shape == (256,) and cached.start == uncached.start
        assert n - cached.start <= context
        assert (a - b).abs().max() <= tolerance * scale(b), n
    assert cached.start > 2 * context  # the window moved on more than once
    assert all(p.dtype == torch.float32 for p in lm.parameters())  # the caller's model as it was


def test_weights_kept_in_bf16_give_the_same_numbers():
    """The cached path decodes a bf16 model with a copy of its weights already cast (they
    were cast at every use): the same forward pass to within far less than bf16's rounding."""
    from engine.workloads.trm.decoding import weights_cast

    lm, ids = model("bf16"), torch.tensor([text(24)])
    cast = weights_cast(lm)
    assert cast.lm_head.weight.dtype == torch.bfloat16 and cast.embed.weight.dtype == torch.float32
    with torch.no_grad():
        before, after = lm(ids), cast(ids)
    assert (after - before).abs().max() <= 1e-5 * scale(before)


def test_sampling_past_the_window_writes_every_byte():
    from engine.workloads.trm.decoding import generate

    lm = model()
    for cached in (True, False):
        out = generate(lm, b"def ", tokens=50, temperature=0.8, context=8, seed=3, cached=cached)
        assert len(out) == 50


def test_the_cache_serves_lora_adapters_too():
    from engine.workloads.lora.workload import add_adapters

    lm = model()
    add_adapters(lm, ("qkv", "out", "gate_up", "down"), rank=4, alpha=8.0, dropout=0.0)
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if name.endswith("lora_b"):
                p.normal_(0, 0.5)  # adapters that change the base's output
    ids = text(30)
    cached, uncached = NextByte(lm, 12), NextByte(lm, 12, cached=False)
    for n in range(1, len(ids) + 1):
        b = uncached(ids[:n])
        assert (cached(ids[:n]) - b).abs().max() <= 1e-3 * scale(b)


@pytest.mark.parametrize("one_thread_costs, rest_on", [(1.0, 1), (9.0, 2)])
def test_the_faster_thread_count_writes_the_rest(one_thread_costs, rest_on):
    """The first bytes alternate between torch's thread count and one, timed; the rest are
    written with the faster; torch's count comes back at the end. (A stand-in clock: bytes
    take 5 s on 2 threads and one_thread_costs on one.)"""
    from engine.workloads.trm.decoding import FasterThreads

    torch.set_num_threads(2)
    now, used = [0.0], []

    def written():
        for i in range(12):
            used.append(torch.get_num_threads())
            now[0] += one_thread_costs if used[-1] == 1 else 5.0
            yield i

    threads = FasterThreads(clock=lambda: now[0])
    assert list(threads.timed(written())) == list(range(12))
    # the first byte (it reads the prompt) untimed, then three bytes with each count
    assert used[:7] == [2, 1, 2, 1, 2, 1, 2]
    assert used[7:] == [rest_on] * 5 and threads.chosen == rest_on
    threads.restore()
    assert torch.get_num_threads() == 2


def test_sample_streams_the_text_after_naming_the_checkpoint(home):
    from test_trm import trained_run
    from engine.train.sampling import continue_prompt

    run = trained_run(steps=5)
    seen = []
    out = continue_prompt(run, "def ", tokens=40, temperature=0.8, seed=1,
                          on_start=lambda path, step: seen.append(("start", path, step)),
                          on_text=seen.append)
    assert seen[0] == ("start", out.checkpoint, 5)
    assert len(seen) > 2 and "".join(seen[1:]) == out.text


@pytest.mark.parametrize("flag, value, expected", [
    ("--tokens", "0", "expected a positive whole number of bytes"),
    ("--tokens", "many", "expected a positive whole number of bytes"),
    ("--temperature", "-1", "expected a finite number >= 0"),
    ("--temperature", "nan", "expected a finite number >= 0"),
    ("--temperature", "inf", "expected a finite number >= 0"),
    ("--seed", "many", "expected a whole number of at most 64 bits"),
    ("--seed", str(2**64), "expected a whole number of at most 64 bits"),
])
def test_bad_arguments_are_one_line_and_exit_2(home, capsys, flag, value, expected):
    from cockpit.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["sample", "last", "--prompt", "x", flag, value])
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"cockpit sample: argument {flag}: got '{value}', {expected}")


def test_bad_numbers_from_python_are_refused_too(home):
    from engine.errors import ConfigError
    from engine.train.sampling import continue_prompt
    from test_trm import new_run

    run = new_run()
    with pytest.raises(ConfigError, match="--temperature: nan: expected a finite number >= 0"):
        continue_prompt(run, "x", temperature=float("nan"))

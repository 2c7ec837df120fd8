# Fixtures in tests/fixtures/outputs/, stdout+stderr byte-exact (\r and ANSI included):
#   tqdm_postfix.txt, tqdm_slow.txt, tqdm_nototal.txt: real tqdm 4.70.1 writing to a file
#     (not a tty), with its clock replaced by a fake one so the rates are stable.
#   hf_trainer.txt: a real transformers 5.23.0 Trainer run (GPT2Config(n_layer=1, n_embd=32,
#     n_head=2, vocab_size=64), random token ids, 20 steps, logging every 2, eval every 10).
#   lightning.txt: a real lightning 2.6.6 run (2-layer MLP, 2 epochs of 10 batches,
#     TQDMProgressBar, train_loss and val_loss on the bar).
#   lightning_rich.txt: examples/lightning/train.py (lightning 2.6.6, rich 15.0.0: its default
#     RichProgressBar), 20 steps, TTY_COMPATIBLE=1 TTY_INTERACTIVE=1 as cockpit runs commands.
#   nanogpt.txt, keyvalue.txt: hand-written (generated) in the exact print formats of
#     nanoGPT's train.py (config echo, `step N: train loss .., val loss ..`,
#     `iter N: loss .., time ..ms, mfu ..%`) and of a plain logging script.
from __future__ import annotations

import math
import random
import re

import subprocess
import sys

import pytest
from conftest import FIXTURES, ROOT, child_env

from engine.command.observation import Observation
from engine.command.progress import MAX_LINE, OutputParser, compile_regex

OUTPUTS = FIXTURES / "outputs"


def read(name: str) -> str:
    return (OUTPUTS / name).read_bytes().decode("utf-8")


def parse(text: str, regex: str | None = None) -> list[Observation]:
    parser = OutputParser(regex)
    return parser.feed(text) + parser.flush()


def one(line: str, regex: str | None = None) -> Observation:
    found = parse(line + "\n", regex)
    assert len(found) == 1, found
    return found[0]


def steps_of(observations) -> list[int]:
    return [o.step for o in observations if o.kind == "step" and o.step is not None]


def assert_increasing(steps):
    assert steps == sorted(steps), steps


# -- fixtures --

@pytest.mark.parametrize("name, last, total", [
    ("tqdm_postfix.txt", 20, 20), ("tqdm_slow.txt", 12, 12), ("tqdm_nototal.txt", 15, None)])
def test_tqdm_fixtures(name, last, total):
    text = read(name)
    found = parse(text)
    assert {o.source for o in found} == {"tqdm"} and {o.kind for o in found} == {"step"}
    assert_increasing(steps_of(found))
    assert found[-1].step == last and found[-1].total == total
    printed = [float(v) for v in re.findall(r"loss=([^,\]]+)", text)]
    assert [o.loss for o in found if o.loss is not None] == printed
    if printed:
        assert found[-1].lr == 0.001
    assert all(o.metrics == {} for o in found)  # the rate is not a metric


def test_tqdm_without_total():
    found = parse(read("tqdm_nototal.txt"))
    assert steps_of(found)[:3] == [1, 2, 3]  # "0it [00:00, ?it/s]" says nothing


def test_hf_trainer_fixture():
    text = read("hf_trainer.txt")
    found = parse(text)
    bar = [o for o in found if o.source == "tqdm"]
    assert_increasing(steps_of(bar))
    assert bar[-1].step == 20 and {o.total for o in bar} == {20}  # the eval bar (of 4) is skipped
    logs = [o for o in found if o.source == "hf" and o.kind == "step"]
    assert [o.loss for o in logs] == [float(v) for v in re.findall(r"'loss': '([^']+)'", text)]
    assert len(logs) == 10 and all(o.step is None for o in logs)
    assert logs[0].lr == 0.000475 and logs[0].epoch == 0.1 and logs[0].metrics == {"grad_norm": 0.85}
    evals = [o for o in found if o.kind == "eval"]
    assert [o.epoch for o in evals] == [0.5, 1.0]
    assert set(evals[0].metrics) == {"eval_loss"}  # the Trainer's timings are not metrics
    assert evals[0].metrics["eval_loss"] == 3.909
    # the train_runtime summary gives nothing: after the last eval only bar redraws follow
    after = found[found.index(evals[-1]) + 1:]
    assert after and all(o.source == "tqdm" for o in after)


def test_lightning_fixture():
    text = read("lightning.txt")
    found = parse(text)
    train = [o for o in found if o.kind == "step"]
    assert {o.source for o in train} == {"tqdm"} and {o.unit for o in train} == {"batch"}
    steps = steps_of(train)
    assert_increasing(steps)  # validation and sanity-check bars are skipped
    assert steps[0] == 1 and steps[-1] == 20
    assert train[-1].epoch == 2.0 and train[-1].loss == 0.191
    assert train[-1].metrics == {}  # no v_num; val_loss is an eval
    assert (train[-1].epoch_index, train[-1].batch, train[-1].batches) == (1, 10, 10)
    epoch_one = [o for o in train if o.step == 13]
    assert epoch_one and all(o.epoch == pytest.approx(1.3) for o in epoch_one)
    assert all((o.epoch_index, o.batch) == (1, 3) for o in epoch_one)
    printed = {float(v) for v in re.findall(r"train_loss=([\d.]+)", text)}
    assert {o.loss for o in train if o.loss is not None} == printed
    # val_loss, redrawn on every frame of the bar, is an eval each time it changes
    evals = [o for o in found if o.kind == "eval"]
    assert [(o.step, o.metrics) for o in evals] == [(10, {"val_loss": 2.06}), (20, {"val_loss": 0.407})]
    # `Trainer.fit` stopped: `max_epochs=2` reached: the epochs, and then the total
    (facts,) = [o for o in found if o.kind == "facts"]
    assert facts.facts == {"epochs": 2} and facts.source == "stated"
    assert facts.said == "`Trainer.fit` stopped: `max_epochs=2` reached."
    at = found.index(facts)
    assert {o.total for o in found[:at] if o.kind == "step"} == {None}
    assert {o.total for o in found[at:] if o.kind == "step"} == {20}


def test_nanogpt_fixture():
    text = read("nanogpt.txt")
    found = parse(text)
    # the config echo gives only what it states about the run's length and units
    facts = [o for o in found if o.kind == "facts"]
    assert [(o.facts, o.said) for o in facts] == [
        ({"accumulation": 1}, "gradient_accumulation_steps = 1"),
        ({"total": 5000}, "max_iters = 5000"),          # the config file's
        ({"total": 500}, "Overriding: max_iters = 500"),  # then the command line's
        ({"tokens_per_step": 16384}, "tokens per iteration will be: 16,384")]
    assert {o.source for o in facts} == {"stated"}
    assert {o.source for o in found if o not in facts} == {"steps"}
    train = [o for o in found if o.kind == "step"]
    assert {o.unit for o in train} == {"step"}
    assert steps_of(train) == list(range(0, 501, 10))
    assert [o.loss for o in train] == [float(v) for v in re.findall(r"iter \d+: loss ([\d.]+)", text)]
    assert all(o.metrics == {} for o in train)  # `time 45.67ms` and `mfu 5.3%` are not read
    evals = [o for o in found if o.kind == "eval"]
    assert [o.step for o in evals] == [0, 250, 500]
    assert evals[-1].metrics == {"train_loss": 1.489, "val_loss": 1.5845}
    assert evals[-1].loss is None


def test_keyvalue_fixture():
    found = parse(read("keyvalue.txt"))
    logged = [o for o in found if o.source == "steps"]
    assert steps_of(logged) == list(range(10, 101, 10))  # after the logging prefix
    assert {o.total for o in logged} == {100}
    assert logged[0].loss == 1.9513 and logged[0].lr == 1e-4
    assert logged[0].metrics == {"grad_norm": 0.75, "time": 46.0}
    summaries = [o for o in found if o.source == "keyvalue" and o.kind == "step"]
    assert [(o.epoch, o.loss, o.metrics) for o in summaries] == [
        (1.0, 0.973, {"acc": 0.4}), (2.0, 0.5642, {"acc": 0.6})]
    evals = [o for o in found if o.kind == "eval"]
    assert [o.metrics for o in evals] == [{"val_loss": 1.073, "val_acc": 0.38},
                                          {"val_loss": 0.6642, "val_acc": 0.58}]
    assert len(found) == 14


# -- line splitting --

FIXTURE_NAMES = sorted(p.name for p in OUTPUTS.glob("*.txt"))


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_chunks_give_the_same_as_one_feed(name):
    text = read(name)
    whole = parse(text)
    rnd = random.Random(name)
    for _ in range(3):
        cuts = sorted(rnd.sample(range(1, len(text)), min(200, len(text) - 1)))
        parser = OutputParser()
        found = []
        for a, b in zip([0, *cuts], [*cuts, len(text)]):
            found += parser.feed(text[a:b])
        assert found + parser.flush() == whole


def test_one_character_at_a_time():
    text = read("tqdm_postfix.txt") + read("nanogpt.txt")[-600:]
    parser = OutputParser()
    found = [o for ch in text for o in parser.feed(ch)] + parser.flush()
    assert found == parse(text)


def test_carriage_return_ends_a_line():
    found = parse("step 1 loss=1.5\rstep 2 loss=1.25\r\nstep 3 loss=1\n")
    assert [(o.step, o.loss) for o in found] == [(1, 1.5), (2, 1.25), (3, 1.0)]


def test_partial_line_waits_for_the_rest():
    parser = OutputParser()
    assert parser.feed("step 5 loss=0.") == []
    assert parser.feed("25") == []
    assert [o.loss for o in parser.feed("\rstep 6 loss=0.5")] == [0.25]
    assert [o.step for o in parser.flush()] == [6]
    assert parser.flush() == []


def test_ansi_sequences_are_stripped():
    o = one("\x1b[32mstep 3\x1b[0m: \x1b[1mloss\x1b[0m=\x1b[33m0.5\x1b[0m \x1b]0;title\x07")
    assert (o.step, o.loss) == (3, 0.5)
    assert one("\x1b[2K\x1b[1;34m{'loss': 1.5}\x1b[0m").loss == 1.5


def test_long_partial_line_is_dropped():
    parser = OutputParser()
    assert parser.feed("x" * (MAX_LINE + 1)) == []
    assert len(parser._partial) <= MAX_LINE
    for _ in range(5):  # the same line goes on: still bounded, still dropped
        parser.feed("loss=1 " * 20000)
        assert len(parser._partial) <= MAX_LINE
    assert parser.feed(" loss=0.5\nstep 7 loss=0.25\n") == [
        Observation("step", 7, loss=0.25, source="steps")]
    assert parse("loss=1 " * 10000 + "\n") == []  # a complete line too long: dropped as well
    assert len(parse("step 1 " + " " * (MAX_LINE - 10) + "\n")) == 1  # just under: read


# -- formats --

def test_unknown_lines_give_nothing():
    lines = ["", "   ", "Using device: cuda", "Epoch 3", "Saving checkpoint to out/ckpt.pt",
             "number of parameters: 10.65M", "lr=3e-4", "eval_steps=500", "eval_interval = 250",
             "Modules in eval mode: 0", "Traceback (most recent call last):", "{'a': 'b'}",
             "{not a dict}", "Namespace(lr=0.001, eval_iters=200, batch_size=64)",
             "steps 5 to go", "the loss is low", "Validation DataLoader 0: 100%|█| 4/4 [00:00<00:00]",
             "  0%|          | 0/? [00:00<?, ?it/s]", "time 45.67ms", "speed=3.2it/s"]
    assert parse("\n".join(lines) + "\n") == []


@pytest.mark.parametrize("line, step, total, loss", [
    ("step 120/5000 loss=2.31", 120, 5000, 2.31),
    ("Step 3 of 10: loss: 0.5", 3, 10, 0.5),
    ("step 42", 42, None, None),
    ("iter 10: loss 3.1234, time 45.67ms, mfu 12.34%", 10, None, 3.1234),
    ("Iteration 7 | Loss 1.5e-2", 7, None, 0.015),
    ("[120/5000] loss=2.31 lr=1e-4", 120, 5000, 2.31),
    ("[ 12/100 ] train_loss: 0.7", 12, 100, 0.7),
    ("INFO:__main__:step 9: loss=0.3", 9, None, 0.3),
    ("[2026-05-09 07:35:25] step 9/10 loss=0.3", 9, 10, 0.3),
])
def test_step_lines(line, step, total, loss):
    o = one(line)
    assert (o.kind, o.step, o.total, o.loss, o.source) == ("step", step, total, loss, "steps")


def test_values_on_a_step_line():
    o = one("step 5/10 loss=0.5 lr=3e-4 epoch=1.5 acc=90% time=45.67ms tput=3.2it/s "
            "train/ppl=12 nan_count=nan")
    assert (o.loss, o.lr, o.epoch) == (0.5, 3e-4, 1.5)
    assert o.metrics.keys() == {"acc", "time", "train_ppl", "nan_count"}
    assert o.metrics["acc"] == 90 and o.metrics["time"] == 45.67 and math.isnan(o.metrics["nan_count"])


def test_nanogpt_eval_line():
    o = one("step 250: train loss 2.1000, val loss 2.3000")
    assert (o.kind, o.step, o.loss, o.metrics) == (
        "eval", 250, None, {"train_loss": 2.1, "val_loss": 2.3})


@pytest.mark.parametrize("line, kind, loss, metrics", [
    ("loss=0.12 lr=3e-4", "step", 0.12, {}),
    ("loss: 0.12, acc: 0.9", "step", 0.12, {"acc": 0.9}),
    ("train_loss=0.4 val_loss=0.5", "eval", None, {"train_loss": 0.4, "val_loss": 0.5}),
    ("val_loss: 2.3, val_acc: 0.61", "eval", None, {"val_loss": 2.3, "val_acc": 0.61}),
    ("Val Loss: 2.3 | Test Acc: 0.5", "eval", None, {"val_loss": 2.3, "test_acc": 0.5}),
    ("eval/loss=1.5 eval/bleu=20.1", "eval", None, {"eval_loss": 1.5, "eval_bleu": 20.1}),
    ("validation_loss = 0.7", "eval", None, {"validation_loss": 0.7}),
    # beside an eval value and no plain loss, a value is the evaluation's
    ("epoch 1 val_loss: 5.5522 recall@10: 0.2500", "eval", None, {"val_loss": 5.5522, "recall@10": 0.25}),
    ("loss=0.5 val_loss=0.6 hits@1=0.2", "step", 0.5, {"val_loss": 0.6, "hits@1": 0.2}),
    ("loss=nan grad_norm=inf", "step", math.nan, {"grad_norm": math.inf}),
])
def test_key_value_lines(line, kind, loss, metrics):
    o = one(line)
    assert (o.kind, o.step, o.source, o.metrics) == (kind, None, "keyvalue", metrics)
    assert o.loss == loss or (math.isnan(loss) and math.isnan(o.loss))


@pytest.mark.parametrize("line, metrics", [
    # as people write their loops: names with spaces, at k, and `=`, `:` or a space before the value
    ("epoch 3 done: train loss 0.4123, val recall@10 0.7800", {"train_loss": 0.4123, "val_recall@10": 0.78}),
    ("val recall@10: 0.78", {"val_recall@10": 0.78}),
    ("val recall@10 = 0.78 | test top1 0.5", {"val_recall@10": 0.78, "test_top1": 0.5}),
    ("eval mrr 0.31 ndcg@10 0.42", {"eval_mrr": 0.31, "ndcg@10": 0.42}),
    ("val_acc 0.91 val_f1 0.88", {"val_acc": 0.91, "val_f1": 0.88}),
    ("Validation Accuracy: 0.91", {"validation_accuracy": 0.91}),
])
def test_evals_as_hand_written_loops_print_them(line, metrics):
    o = one(line)
    assert (o.kind, o.metrics) == ("eval", metrics)


@pytest.mark.parametrize("line", ["eval mode: 0", "saving 3 files to disk", "val split 3 ways",
                                  "test the 2 models"])
def test_prose_with_a_split_and_a_number_is_no_eval(line):
    assert OutputParser().feed(line + "\n") == []


def test_key_value_step_key():
    o = one("global_step=300, loss=1.1")
    assert (o.step, o.loss) == (300, 1.1)


@pytest.mark.parametrize("line, expected", [
    ("{'loss': 2.3456, 'grad_norm': 1.23, 'learning_rate': 4.5e-05, 'epoch': 0.12}",
     ("step", 2.3456, 4.5e-05, 0.12, {"grad_norm": 1.23})),
    ("{'loss': '2.3456', 'grad_norm': '1.23', 'learning_rate': '4.5e-05', 'epoch': '0.12'}",
     ("step", 2.3456, 4.5e-05, 0.12, {"grad_norm": 1.23})),
    ("{'loss': np.float64(0.5), 'grad_norm': tensor(3.0, device='cuda:0'), 'epoch': -0.0}",
     ("step", 0.5, None, 0.0, {"grad_norm": 3.0})),
    ("{'eval_loss': 2.1, 'eval_runtime': 0.5, 'eval_samples_per_second': 10.0, "
     "'eval_steps_per_second': 1.0, 'epoch': 1.0}",
     ("eval", None, None, 1.0, {"eval_loss": 2.1})),
    ("{'eval_loss': 2.1, 'eval_accuracy': 0.5, 'eval_runtime': 0.5, 'total_flos': 3e12, "
     "'epoch': 1.0}", ("eval", None, None, 1.0, {"eval_loss": 2.1, "eval_accuracy": 0.5})),
    ('{"step": 40, "loss": 0.75, "ok": true, "note": "x"}', ("step", 0.75, None, None, {})),
])
def test_hf_dicts(line, expected):
    o = one(line)
    assert (o.kind, o.loss, o.lr, o.epoch, o.metrics) == expected
    assert o.source == "hf"


def test_hf_dict_nan_and_inf():
    o = one("{'loss': nan, 'grad_norm': inf, 'learning_rate': np.float32(-inf), 'epoch': 0.5}")
    assert math.isnan(o.loss) and o.metrics == {"grad_norm": math.inf} and o.lr == -math.inf


def test_hf_summary_gives_nothing():
    assert parse("{'train_runtime': 12.5, 'train_samples_per_second': 100.0, "
                 "'train_steps_per_second': 2.0, 'train_loss': 2.5, 'epoch': 3.0}\n") == []


def test_hf_dict_is_never_evaluated(tmp_path):
    marker = tmp_path / "evaluated"
    line = f"{{'loss': __import__('pathlib').Path({str(marker)!r}).touch()}}"
    assert parse(line + "\n") == [] and not marker.exists()


@pytest.mark.parametrize("line, step, total, loss, epoch", [
    ("train:  45%|████▌     | 45/100 [00:12<00:15,  3.61it/s, loss=0.123, lr=1e-3]",
     45, 100, 0.123, None),
    ("45%|####5     | 45/100 [00:12<00:15,  3.61s/it]", 45, 100, None, None),
    ("45it [00:12, 3.61it/s, loss=0.5]", 45, None, 0.5, None),
    ("train: 12batch [01:02:03, 3.61batch/s]", 12, None, None, None),
    (" 12%|█▏        | 1.20k/10.0k [00:12<01:30, 99.1it/s]", 1200, 10000, None, None),
    ("Epoch 2:  45%|████▌| 45/100 [00:12<00:15, 3.61it/s, v_num=0, train_loss=0.123]",
     245, None, 0.123, 2.45),
    ("Epoch 3: |          | 7/? [00:01<00:00, 6.0it/s, v_num=1, loss=0.5]", None, None, 0.5, 3.0),
])
def test_tqdm_lines(line, step, total, loss, epoch):
    o = one(line)
    assert (o.kind, o.step, o.total, o.loss, o.epoch, o.source) == (
        "step", step, total, loss, epoch, "tqdm")
    assert "v_num" not in o.metrics and all("it" not in k for k in o.metrics)


def test_tqdm_bars_that_are_not_training():
    lines = ["Validation DataLoader 0:  50%|█████     | 1/2 [00:00<00:00, 74.55it/s]",
             "Sanity Checking DataLoader 0:  50%|█████     | 1/2 [00:00<00:00, 74.55it/s]",
             "eval: 3it [00:00, 12.0it/s, loss=0.3]",
             "Epoch 1:   0%|          | 0/10 [00:00<?, ?it/s, v_num=0, train_loss=1.270]",
             # a bar tqdm draws below another one (the HF Trainer's evaluation bar)
             "\n  0%|          | 0/4 [00:00<?, ?it/s]\x1b[A"]
    assert parse("\n".join(lines) + "\n") == []


# -- user regex --

def test_user_regex_wins_over_built_in_formats():
    regex = r"score (?P<loss>\d+)"
    o = one("iter 7: loss 0.5, score 9", regex)
    assert (o.source, o.loss, o.step) == ("regex", 9.0, None)
    assert one("iter 7: loss 0.5", regex).source == "steps"  # no match: built-ins


def test_user_regex_groups():
    regex = (r"^(?P<step>\d+)/(?P<total>\d+) \| loss (?P<loss>\S+) \| lr (?P<lr>\S+)"
             r"(?: \| ep (?P<epoch>\S+))?(?: \| top1 (?P<top1>\S+))?")
    o = one("120/500 | loss 0.25 | lr 1e-4 | ep 1.5 | top1 91.2%", regex)
    assert (o.kind, o.step, o.total, o.loss, o.lr, o.epoch, o.metrics) == (
        "step", 120, 500, 0.25, 1e-4, 1.5, {"top1": 91.2})
    o = one("120/500 | loss nan | lr 1e-4", regex)
    assert math.isnan(o.loss) and o.epoch is None and o.metrics == {}


def test_user_regex_eval_metrics():
    o = one("after 300 steps: val_loss=1.25", r"after (?P<step>\d+) steps: val_loss=(?P<val_loss>\S+)")
    assert (o.kind, o.step, o.metrics) == ("eval", 300, {"val_loss": 1.25})


def test_user_regex_match_without_numbers_gives_nothing():
    regex = r"step (?P<step>[a-z]+) loss=(?P<loss>[a-z]+)"
    assert parse("step five loss=x loss=0.5\n", regex) == []  # the line is the regex's
    assert parse("step five loss=x loss=0.5\n") != []


@pytest.mark.parametrize("regex, says", [
    (r"step (?P<step>\d+", "missing ), unterminated subpattern at position 5"),
    (r"(?P<1step>\d+)", "bad character in group name"),
    (r"loss (\S+)", "needs a named group (?P<step>...), (?P<batch>...) or (?P<loss>...)"),
    (r"(?P<acc>\S+)", "understood names: step, total, loss, lr, epoch"),
])
def test_bad_regex(regex, says):
    with pytest.raises(ValueError) as err:
        compile_regex(regex)
    assert says in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError):
        OutputParser(regex)


def test_compile_regex_returns_a_pattern():
    assert compile_regex(r"loss=(?P<loss>\S+)").search("loss=1")["loss"] == "1"


# -- never raises --

def test_fuzz_random_bytes():
    rnd = random.Random(1234)
    for _ in range(200):
        data = bytes(rnd.randrange(256) for _ in range(rnd.randrange(400)))
        parser = OutputParser()
        for chunk in re.findall(rb".{1,37}", data, re.S):
            assert isinstance(parser.feed(chunk.decode("utf-8", "replace")), list)
        parser.flush()


def test_fuzz_format_fragments():
    pieces = ["step", "iter ", " 12", "/", "100", "[", "]", "{", "}", "'loss'", ": ", "=", "loss",
              "val_loss", "nan", "-inf", "1e-3", "%|", "█", "| ", "it/s", "s/it", " [00:12<00:15, ",
              "Epoch 2: ", ", ", "\r", "\n", "\x1b[A", "\x1b[3", "np.float64(", ")", "v_num=0",
              "Validation", "?", "k", "train loss ", "(", "'", '"', "\t", "\x00", "é",
              "epoch ", "batch ", "Epoch 1/3 ", "***** ", "train metrics", " = ", "max_iters",
              "Overriding: ", "tokens per iteration will be: ", "Total optimization steps = ",
              "`Trainer.fit` stopped: `max_steps=", "` reached.", "  ", ",", "━", "•", "0:00:01"]
    rnd = random.Random(99)
    for _ in range(500):
        text = "".join(rnd.choice(pieces) for _ in range(rnd.randrange(40)))
        found = parse(text)
        assert all(o.kind in ("step", "eval", "facts") for o in found)
        assert all(o.step is None or isinstance(o.step, int) for o in found)
        assert all(o.unit in ("step", "batch") for o in found)
        assert all(isinstance(v, int) and v > 0 for o in found for v in o.facts.values())


def test_odd_inputs():
    parser = OutputParser(r"(?P<step>\d+)")
    assert parser.feed(b"step 5 loss=1\n") == [Observation("step", 5, source="regex")]
    assert parser.feed("") == [] and parser.flush() == []
    assert parse("step 99999999999999999999999999 loss=1e999\n")[0].loss == math.inf
    assert parse("{'a': " * 300 + "\n") == []


def test_stdlib_only():
    out = subprocess.run([sys.executable, "-c", "import engine.command.progress, sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, env=child_env(), check=True, cwd=ROOT)
    assert not {"torch", "textual", "numpy"} & set(out.stdout.split())


def test_bars_around_training_and_qualified_values_are_not_steps_or_losses():
    parser = OutputParser()
    lines = ["Map: 100%|██████████| 1000/1000 [00:01<00:00, 900.00 examples/s]",
             "Loading checkpoint shards: 100%|██████████| 2/2 [00:01<00:00,  1.20it/s]",
             "Resolving data files: 100%|██████████| 18/18 [00:00<00:00, 10.00it/s]",
             "best loss: inf"]
    assert parser.feed("\n".join(lines) + "\n") == []
    (obs,) = parser.feed("Epoch 1: train loss 0.5, best loss inf\n")
    assert obs.loss == 0.5


def test_a_bar_of_another_total_after_training_is_not_training():
    """hf_trainer_then_evaluate.txt: a real transformers 5.23.0 run of examples/hf/train_lm.py
    (12 steps, logging every 4, eval every 8) whose script calls trainer.evaluate() after
    training: that evaluation draws a plain top-level bar of 17 batches, no description."""
    found = parse(read("hf_trainer_then_evaluate.txt"))
    bar = [o for o in found if o.source == "tqdm"]
    assert bar and {o.total for o in bar} == {12} and bar[-1].step == 12
    assert_increasing(steps_of(bar))
    # Before a loss is read, nothing says which bar trains: a second bar still counts.
    text = "train: 50%|#  | 5/10 [00:01<00:01, 5it/s]\nother: 20%|#  | 1/5 [00:01<00:01, 5it/s]\n"
    assert [o.total for o in parse(text)] == [10, 5]


def test_lightning_rich_bar():
    """Rich's live frames: the epoch bar's count and train_loss; its second row (val_loss,
    indented under the bar and redrawn every frame) is an evaluation each time it changes."""
    found = parse(read("lightning_rich.txt"))
    bar = [o for o in found if o.source == "rich" and o.kind == "step"]
    assert_increasing(steps_of(bar))
    assert bar[0].step == 1 and bar[-1].step == 20 and bar[-1].epoch == 1.0
    assert all(o.loss is not None for o in bar) and bar[-1].loss == 4.69
    assert {o.unit for o in bar} == {"batch"} and (bar[-1].epoch_index, bar[-1].batches) == (0, 20)
    # the bar's val_loss at the step it was drawn beside (the sanity check's, at 0/20, is
    # not), then the script's own last line, `done: step 20 val_loss ...`
    evals = [o for o in found if o.kind == "eval"]
    assert [(o.source, o.step, o.metrics) for o in evals] == [
        ("rich", 10, {"val_loss": 4.5}), ("rich", 20, {"val_loss": 3.857}),
        ("keyvalue", None, {"val_loss": 3.8569})]
    # `Trainer.fit` stopped: `max_steps=20` reached., drawn after a Validation bar
    assert [o.facts for o in found if o.kind == "facts"] == [{"total": 20}]


@pytest.mark.parametrize("line, step, loss", [
    ("Epoch 2/9 ━━━━━━━╸━━━━━━━━━━ 45/100 0:00:12 • 0:00:15 3.61it/s train_loss: 0.123", 245, 0.123),
    ("Epoch 0/-2                     1/60 0:00:00 • -:--:-- 0.00it/s train_loss: 5.638", 1, 5.638),
    ("train ━━━━━━━━━━━━━━━━━━━━━━ 7/10 0:01:02 • 0:00:20 loss: 2.5", 7, 2.5),
    # the last frame: nothing remains, so the remaining time is blank
    ("Epoch 0/-2 ━━━━━━━━━━━━━━━━ 100/100 0:00:08 •        12.00it/s train_loss: 3.348", 100, 3.348),
])
def test_rich_bar_lines(line, step, loss):
    o = one(line)
    assert (o.source, o.step, o.loss) == ("rich", step, loss)


def test_rich_bars_that_are_not_training():
    for line in ("Validation ━━━━━━━━━━━━━━━━━━━━━━ 2/4 0:00:00 • 0:00:01 28.90it/s",
                 "Sanity Checking ━━━━━━━━━━━━━━━━━━━━━━ 1/2 0:00:00 • -:--:-- 0.00it/s"):
        assert parse(line + "\n") == []
    # a second row under a Rich frame is the frame's: its eval values count once, at the
    # frame's step; an indented line in other output is a line of its own
    frame = "Epoch 0/-2 ━━━━━━━━━ 7/60 0:00:00 • 0:00:04 16.87it/s train_loss: 5.294\n"
    indented = " " * 40 + "val_loss: 3.628\n"
    found = parse(frame + indented + frame + indented)
    assert [(o.kind, o.step) for o in found] == [("step", 7), ("eval", 7), ("step", 7)]
    assert [o.kind for o in parse(indented)] == ["eval"]
    # metrics other than evals on that row are not an evaluation
    assert [o.kind for o in parse(frame + " " * 40 + "train_loss_epoch: 3.1\n")] == ["step"]


def test_rich_bar_of_unknown_total():
    o = one("Epoch 0/-2 ━━━━━━━━━━━━━ 12/-- 0:00:03 • -:--:-- 4.01it/s train_loss: 2.5")
    assert (o.step, o.total, o.loss) == (12, None, 2.5)


def test_a_second_training_loop_with_a_loss_beside_its_bar_is_read():
    """SFT then DPO, two phases, a retry: a new bar of another total counts once a loss is
    read beside it; before that it is taken for another loop, as evaluate()'s bar is."""
    first = "".join(f" {n}%|#| {n}/10 [00:01<00:01, 5it/s, loss={1 / n:.3f}]\n" for n in range(1, 11))
    evaluation = " 50%|#| 2/4 [00:01<00:01, 5it/s]\n"
    second = "".join(f" {n}%|#| {n}/30 [00:01<00:01, 5it/s, loss={2 / n:.3f}]\n" for n in range(1, 4))
    steps = [(o.step, o.total) for o in parse(first + evaluation + second)]
    assert steps[-3:] == [(1, 30), (2, 30), (3, 30)] and (2, 4) not in steps


# -- facts: lines that state a unit or a total --

def facts_of(found) -> list[dict]:
    return [o.facts for o in found if o.kind == "facts"]


HF_PREFIX = "[INFO|trainer.py:2314] 2026-01-01 10:00:00,000 >> "
HF_RUNNING = [
    "***** Running training *****",
    "  Num examples = 2,000",
    "  Num Epochs = 3",
    "  Instantaneous batch size per device = 8",
    "  Total train batch size (w. parallel, distributed & accumulation) = 32",
    "  Gradient Accumulation steps = 4",
    "  Total optimization steps = 189",
    "  Number of trainable parameters = 124,439,808",
]


@pytest.mark.parametrize("prefix", ["", HF_PREFIX, "01/01/2026 10:00:00 - INFO - transformers.trainer - "])
def test_hf_running_training_block(prefix):
    found = parse("".join(prefix + row + "\n" for row in HF_RUNNING))
    assert {o.kind for o in found} == {"facts"} and {o.source for o in found} == {"stated"}
    assert facts_of(found) == [{"epochs": 3}, {"samples_per_step": 32}, {"accumulation": 4},
                               {"total": 189}]
    # `said` quotes the statement, without the logging prefix
    assert [o.said for o in found] == [row.strip() for row in HF_RUNNING[2:3] + HF_RUNNING[4:7]]


def test_hf_log_metrics_tables_give_nothing():
    text = "\n".join([
        " 100%|##########| 189/189 [00:20<00:00, 9.1it/s]",
        "{'loss': 4.8123, 'grad_norm': 1.2, 'learning_rate': 1e-06, 'epoch': 3.0}",
        "{'train_runtime': 2.11, 'train_samples_per_second': 250.2, 'train_loss': 5.0598, 'epoch': 3.0}",
        "***** train metrics *****",
        "  epoch                    =        3.0",
        "  total_flos               =     1234GF",
        "  train_loss               =     5.0598",
        "  train_runtime            = 0:00:02.11",
        "  train_samples_per_second =    250.2",
        "***** Running Evaluation *****",
        "  Num examples = 100",
        "  Batch size = 8",
        "***** eval metrics *****",
        "  epoch                   =        3.0",
        "  eval_loss               =        4.9",
        "  eval_runtime            = 0:00:00.11",
        "  eval_samples_per_second =    250.2",
        "  eval_steps_per_second   =     31.3",
        "  perplexity              =   134.2898",
        HF_PREFIX + "***** predict metrics *****",
        HF_PREFIX + "  predict_loss = 4.9",
        "***** Running Prediction *****",
        "  Num examples: Unknown",
        "  Batch size = 8",
        # the table ends at the first line that is not one of its rows
        "step 190 loss=0.5",
        "  eval_loss = 4.9",
    ]) + "\n"
    found = parse(text)
    assert [(o.kind, o.step, o.loss) for o in found] == [
        ("step", 189, None), ("step", None, 4.8123), ("step", 190, 0.5), ("eval", None, None)]
    assert found[-1].metrics == {"eval_loss": 4.9}


@pytest.mark.parametrize("line, facts", [
    ("tokens per iteration will be: 491,520", {"tokens_per_step": 491520}),
    ("Overriding: max_iters = 200", {"total": 200}),
    ("Overriding: gradient_accumulation_steps = 4", {"accumulation": 4}),
    ("Overriding: batch_size = 12", None),
    ("Overriding: max_iters = 5 * 40", None),
    ("max_iters = 200", {"total": 200}),
    ("max_steps: 300", {"total": 300}),
    ("num_train_steps=500", {"total": 500}),
    ("  trainer.max_steps=300  # a comment", {"total": 300}),
    ("INFO:__main__:max_epochs: 4", {"epochs": 4}),
    ("num_train_epochs = 3.0", {"epochs": 3}),
    ("accumulate_grad_batches: 2", {"accumulation": 2}),
    ("lr_decay_iters = 5000 # make equal to max_iters usually", None),
    ("max_steps = -1", None),
    ("steps = 100", None),   # alone it may count the steps done so far
    ("batch_size = 12", None),
    ("`Trainer.fit` stopped: `max_steps=300` reached.", {"total": 300}),
    ("`Trainer.fit` stopped: `max_epochs=3` reached.", {"epochs": 3}),
])
def test_stating_lines(line, facts):
    found = parse(line + "\n")
    assert facts_of(found) == ([facts] if facts else [])
    assert all(o.kind == "facts" for o in found)  # never a metric, never a step
    if facts:
        assert found[0].said == line.strip().removeprefix("INFO:__main__:")


def test_a_restated_fact_is_not_repeated_and_a_changed_one_is():
    found = parse("max_iters = 5000\nmax_iters = 5000\nOverriding: max_iters = 200\n")
    assert facts_of(found) == [{"total": 5000}, {"total": 200}]


def test_said_is_bounded():
    line = "Overriding: max_iters = 200" + " " * 200
    assert parse(line + "\n")[0].said == "Overriding: max_iters = 200"
    long = HF_PREFIX + "  Total train batch size (w. parallel, distributed & accumulation) = " + "9" * 200
    assert len(parse(long + "\n")[0].said) == 120


@pytest.mark.parametrize("line, loss, metrics", [
    ("loss=0.5 max_steps=300 batch_size=8 eval_steps=50", 0.5, {}),
    ("step 5: loss 0.5, num_epochs: 3, grad_accum: 4, max_lr: 0.1", 0.5, {}),
    ("Epoch 2: 45%|####5| 45/100 [00:12<00:15, 3.61it/s, train_loss=0.1, max_steps=300]", 0.1, {}),
    ("{'loss': 0.5, 'max_steps': 300, 'num_input_tokens_seen': 1024}", 0.5,
     {"num_input_tokens_seen": 1024}),
])
def test_settings_are_never_metrics(line, loss, metrics):
    (o,) = [o for o in parse(line + "\n") if o.kind != "facts"]
    assert (o.kind, o.loss, o.metrics) == ("step", loss, metrics)


def test_settings_are_never_evals():
    assert parse("val_batch_size=8 eval_max_steps: 40\n") == []


# -- per-epoch counters: unit "batch" --

@pytest.mark.parametrize("line, epoch, epochs, batch, batches, loss", [
    ("epoch 1 batch 927/2244 loss 0.51", 1, None, 927, 2244, 0.51),
    ("Epoch 1 | batch 30/200 | loss=0.4", 1, None, 30, 200, 0.4),
    ("epoch 1/3 batch 927/2244 loss 0.51", 1, 3, 927, 2244, 0.51),
    ("Epoch [1/5], Step [100/600], Loss: 0.2174", 1, 5, 100, 600, 0.2174),
    ("2026-05-09 07:35:25,101 INFO epoch: 1, batch: 7 of 10, loss: 0.3", 1, None, 7, 10, 0.3),
    ("epoch 1 batch 12 loss 0.5", 1, None, 12, None, 0.5),
])
def test_epoch_lines(line, epoch, epochs, batch, batches, loss):
    parser = OutputParser()
    (o,) = parser.feed(line + "\n")
    assert parser.epoch_base == 1  # the first epoch seen is 1
    assert (o.kind, o.unit, o.source, o.loss) == ("step", "batch", "epochs", loss)
    assert (o.epoch_index, o.batch, o.batches) == (epoch - 1, batch, batches)
    assert o.step == (epoch - 1) * batches + batch if batches else o.step == batch
    assert o.total == (epochs * batches if epochs else None)


def test_steps_in_an_epoch_line_need_their_count_per_epoch():
    # `epoch 2 step 500` may count steps globally: not a per-epoch counter
    o = one("epoch 2 step 500: loss=0.4")
    assert (o.unit, o.step, o.source) == ("step", None, "keyvalue")


def test_the_global_count_goes_on_across_epochs():
    lines = [f"epoch {e} batch {b}/4 loss {1 / (e * 4 + b):.3f}" for e in range(1, 4) for b in range(1, 5)]
    found = parse("\n".join(lines) + "\n")
    assert steps_of(found) == list(range(1, 13))
    assert [o.epoch_index for o in found] == [0] * 4 + [1] * 4 + [2] * 4


@pytest.mark.parametrize("first, base", [(0, 0), (1, 1)])
def test_epoch_base_from_the_first_epoch_seen(first, base):
    parser = OutputParser()
    found = parser.feed(f"epoch {first} batch 5/10 loss 1\nepoch {first + 1} batch 5/10 loss 1\n")
    assert parser.epoch_base == base and steps_of(found) == [5, 15]


def test_an_epoch_zero_makes_the_base_zero():
    parser = OutputParser()
    parser.feed("epoch 0 batch 5/10 loss 1\n")
    (o,) = parser.feed("epoch 1 batch 5/10 loss 1\n")
    assert parser.epoch_base == 0 and (o.step, o.epoch_index) == (15, 1)


def test_a_resumed_attempt_takes_the_runs_epoch_base():
    for base, step in ((0, 35), (1, 25)):
        parser = OutputParser(epoch_base=base)
        (o,) = parser.feed("epoch 3 batch 5/10 loss 1\n")
        assert parser.epoch_base == base and (o.step, o.epoch_index) == (step, 3 - base)
    # unsettled, the first epoch 3: counted from 1, and the base stays open
    parser = OutputParser()
    assert parser.feed("epoch 3 batch 5/10 loss 1\n")[0].step == 25 and parser.epoch_base is None
    # `epoch 3/3` is the last of three counted from 1
    parser = OutputParser()
    assert parser.feed("epoch 3/3 batch 5/10 loss 1\n")[0].step == 25 and parser.epoch_base == 1


def test_the_total_from_known_epochs():
    line = "epoch 1 batch 5/10 loss 1\n"
    assert parse(line)[0].total is None
    for known in ({"epochs": (3, "--epochs 3")}, {"epochs": 3}):
        assert OutputParser(known=known).feed(line)[0].total == 30
    # a stated fact, seen earlier, says it too; the line's own `1/4` wins over both
    parser = OutputParser(known={"epochs": 3})
    assert [o.total for o in parser.feed("num_epochs = 5\n" + line)] == [None, 50]
    assert parser.feed("epoch 1/4 batch 5/10 loss 1\n")[0].total == 40
    assert OutputParser(known={"epochs": "x", "total": None}).feed(line)[0].total is None


def test_lightning_bars_count_from_epoch_zero_whatever_was_seen():
    parser = OutputParser(epoch_base=1, known={"epochs": (2, "--max_epochs 2")})
    o = parser.feed("Epoch 1:  50%|#####| 5/10 [00:01<00:01, 5it/s, v_num=0, train_loss=0.5]\n")[0]
    assert (o.unit, o.step, o.epoch_index, o.batch, o.batches, o.total) == ("batch", 15, 1, 5, 10, 20)
    # Rich says the last epoch's number: `Epoch 1/9` is of ten
    o = one("Epoch 1/9 ━━━━━━━╸━━━━━━━━━━ 5/10 0:00:12 • 0:00:15 3.61it/s train_loss: 0.123")
    assert (o.step, o.total) == (15, 100)


def test_bar_evals_are_kept_when_they_change():
    frame = "Epoch 0:  {n}0%|#| {n}/10 [00:01<00:01, 5it/s, v_num=0, train_loss=0.5{extra}]\n"
    text = (frame.format(n=1, extra="") + frame.format(n=2, extra=", val_loss=2.0, val_acc=0.5")
            + frame.format(n=3, extra=", val_loss=2.0, val_acc=0.5")
            + frame.format(n=4, extra=", val_loss=1.5, val_acc=0.5"))
    found = parse(text)
    assert [(o.kind, o.step) for o in found] == [
        ("step", 1), ("step", 2), ("eval", 2), ("step", 3), ("step", 4), ("eval", 4)]
    assert [o.metrics for o in found if o.kind == "eval"] == [
        {"val_loss": 2.0, "val_acc": 0.5}, {"val_loss": 1.5, "val_acc": 0.5}]
    assert all(o.metrics == {} for o in found if o.kind == "step")
    # train_loss_step / train_loss_epoch stay the step's
    o = one("Epoch 0:  10%|#| 1/10 [00:01<00:01, 5it/s, train_loss_step=0.5, train_loss_epoch=0.6]")
    assert (o.loss, o.metrics) == (0.5, {"train_loss_epoch": 0.6})


# -- the user's regex with per-epoch groups --

def test_user_regex_with_epoch_and_batch_groups():
    regex = r"E(?P<epoch>\d+)/(?P<epochs>\d+) B(?P<batch>\d+)/(?P<batches>\d+) L(?P<loss>\S+)"
    parser = OutputParser(regex)
    found = parser.feed("E0/2 B5/10 L0.5\nE1/2 B5/10 L0.25\n")
    assert [(o.unit, o.step, o.total, o.epoch_index, o.batch, o.loss, o.source) for o in found] == [
        ("batch", 5, 20, 0, 5, 0.5, "regex"), ("batch", 15, 20, 1, 5, 0.25, "regex")]
    assert parser.epoch_base == 0
    # a batch count alone is the step as it is
    o = one("batch 7 loss 0.5", r"batch (?P<batch>\d+) loss (?P<loss>\S+)")
    assert (o.unit, o.step, o.epoch_index, o.batch) == ("batch", 7, None, 7)


def test_compile_regex_accepts_a_batch_group():
    assert compile_regex(r"epoch (?P<epoch>\d+) batch (?P<batch>\d+)").groupindex.keys() == {"epoch", "batch"}


def test_a_banner_of_stars_is_not_a_block():
    found = parse("*" * 40 + "\nloss = 0.5\n")
    assert [(o.kind, o.loss) for o in found] == [("step", 0.5)]


def test_epoch_lines_that_never_say_their_size_count_on_past_the_first_epoch():
    """`epoch E batch B` with no /N: the highest batch of the epochs before is the size, so
    the count goes on in epochs 2 and 3 rather than stopping where epoch 1 ended."""
    parser = OutputParser()
    steps = [o.step for e in (1, 2, 3) for b in range(1, 6)
             for o in parser.feed(f"epoch {e} batch {b} loss 0.5\n")]
    assert steps == list(range(1, 16))


def test_a_config_printed_whole_states_its_total_epochs_and_accumulation():
    lines = {"Namespace(batch_size=8, lr=0.001, max_steps=300, num_train_epochs=3, out='x')":
             {"total": 300, "epochs": 3},
             "args: Namespace(epochs=3, bs=32)": {"epochs": 3},
             "config: {'max_iters': 5000, 'gradient_accumulation_steps': 4, 'lr': 0.1}":
             {"total": 5000, "accumulation": 4}}
    for line, facts in lines.items():
        (o,) = OutputParser().feed(line + "\n")
        assert o.kind == "facts" and o.facts == facts and o.said == line
    # a log dict states nothing: it is a step, as before
    (step,) = OutputParser().feed("{'loss': 2.3, 'learning_rate': 5e-05, 'epoch': 0.12}\n")
    assert step.kind == "step" and step.loss == 2.3

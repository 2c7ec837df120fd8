"""The two-tower workload: schedule parsing, data, mining that never returns the positive,
and a tiny run whose Recall@K rises far above chance."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from conftest import user_preset
from engine import presets, runconfig
from engine.errors import ConfigError
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.schema import FieldError
from engine.train.trainer import Trainer
from engine.workloads.twotower import data, mining
from engine.workloads.twotower.params import Params, negatives_at, parse_schedule
from engine.workloads.twotower.workload import TwoTowerWorkload

# A 4,000-vector bank of 32-d chunks; Recall@20 by chance is 20 / 4000 = 0.005.
TINY = ["params.bank=4000", "params.dim=32", "params.context_len=4", "params.article_len=16",
        "params.pairs=1500", "params.eval_pairs=300", "params.hidden=64", "params.eval_k=20",
        "params.schedule=0:none,1-2:faiss@8", "params.index=ivf", "params.ivf_lists=16",
        "params.ivf_probe=4", "train.epochs=2", "train.lr=0.003", "train.report_every_s=0.05",
        "train.checkpoint_every_minutes=0", "threads=1", "batch_size=32", "accumulation=1"]
CHANCE = 20 / 4000


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: a second thread only adds barrier waits on this shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_params(**changes) -> Params:
    base = dict(bank=4000, dim=32, context_len=4, article_len=16, pairs=1500, eval_pairs=300,
                hidden=64, eval_k=20)
    return Params(**{**base, **changes})


# ---------------------------------------------------------------- the schedule


def test_schedule_ranges_are_inclusive_from_epoch_zero():
    phases = parse_schedule("0-5:none,6-30:faiss@64")
    assert [(p.first, p.last, p.negatives) for p in phases] == [(0, 5, 0), (6, 30, 64)]
    assert [negatives_at(phases, e) for e in (0, 5, 6, 30)] == [0, 0, 64, 64]
    assert negatives_at(phases, 31) == 0  # after the last range: no mining
    assert [p.mode for p in phases] == ["none", "faiss@64"]


def test_schedule_accepts_the_notes_string_single_epochs_and_spaces():
    assert parse_schedule("0-30:none")[0].last == 30
    phases = parse_schedule(" 0 : none , 1-2 : faiss@8 ,3:faiss@16")
    assert [negatives_at(phases, e) for e in range(5)] == [0, 8, 8, 16, 0]


@pytest.mark.parametrize("text, words", [
    ("", "is empty; expected ranges like '0-5:none,6-30:faiss@64'"),
    ("0-5:none;6-30:faiss@64", "separate ranges with ',' not ';'"),
    ("0-5none", "range '0-5none' has no ':MODE'"),
    ("a-b:none", "'a-b' is not an epoch range"),
    ("5-3:none", "range '5-3' runs backwards"),
    ("1-5:none", "the first range must start at epoch 0"),
    ("0-5:none,7-30:faiss@64", "epochs 6-6 are in no range"),
    ("0-5:none,5-30:faiss@64", "overlaps 0-5"),
    ("0-5:faiss", "mode 'faiss' in '0-5:faiss' is not a mining mode"),
    ("0-5:faiss@0", "expected 'none' or 'faiss@K' with K >= 1"),
    ("0-5:hnsw@8", "mode 'hnsw@8'"),
])
def test_bad_schedules_are_clear_errors(text, words):
    with pytest.raises(ValueError) as caught:
        parse_schedule(text)
    assert words in str(caught.value)
    with pytest.raises(FieldError) as field:
        Params(schedule=text)
    assert field.value.key == "schedule" and words in field.value.problem


def test_a_bad_schedule_names_the_file_or_the_override(home):
    path = user_preset(home, "workloads", "tt", 'workload = "twotower"\n[params]\n'
                                                 'schedule = "0-5:none,6-30:faiss"\n')
    with pytest.raises(ConfigError) as caught:
        presets.load_workload("tt")
    assert caught.value.line().startswith(f"{path}: params.schedule: mode 'faiss'")
    with pytest.raises(ConfigError) as caught:
        runconfig.resolve("twotower-small", "cpu", ["params.schedule=0-2:none,4-6:faiss@8"])
    assert caught.value.line().startswith("--set: params.schedule: range '4-6' should start at "
                                          "epoch 3: epochs 3-3 are in no range")


def test_the_schedule_cannot_ask_for_more_negatives_than_the_bank_has():
    with pytest.raises(FieldError, match="asks for 4000 hard negatives, expected fewer than the "
                                         "bank's 4000 vectors"):
        tiny_params(schedule="0-1:faiss@4000")


# ---------------------------------------------------------------- params and presets


def test_data_paths_must_be_absolute_and_come_in_pairs(tmp_path):
    with pytest.raises(FieldError, match="expected an absolute path or one starting with '~'"):
        Params(pairs_file="data/pairs.npz", bank_file=str(tmp_path / "bank.npz"))
    with pytest.raises(FieldError) as caught:
        Params(pairs_file=str(tmp_path / "pairs.npz"))
    assert caught.value.key == "bank_file" and "expected both files or neither" in caught.value.problem


def test_synthetic_sizes_are_checked_up_front():
    with pytest.raises(FieldError, match="expected more than context_len"):
        tiny_params(article_len=4)
    # 4000 chunks in articles of 16 with 4 predecessors: 250 x 12 = 3000 usable pairs
    with pytest.raises(FieldError, match=r"got 2800 \(\+ 300 held out\), expected at most 3000"):
        tiny_params(pairs=2800)


def test_the_shipped_presets_reproduce_the_notes_and_a_small_run(home):
    v4 = presets.load_workload("twotower-v4")
    p = v4.params
    assert (p.pairs, p.bank, p.dim, p.context_len) == (35901, 500_000, 768, 100)
    assert (p.rnn, p.schedule, p.eval_k, p.temperature) == ("lstm", "0-30:none", 500, 0.05)
    assert (v4.train.epochs, v4.train.lr, v4.train.weight_decay) == (30, 5e-5, 0.01)
    small = presets.load_workload("twotower-small").params
    assert [negatives_at(small.phases, e) for e in range(4)] == [0, 0, 16, 16]
    assert mining.choose(small, small.bank) == "ivf"  # the small run shows the approximate path


# ---------------------------------------------------------------- data


def test_synthetic_data_is_seeded_and_contexts_precede_their_target_in_one_article():
    a, _ = data.synthetic(bank=4000, dim=32, context_len=4, article_len=16, pairs=100,
                          eval_pairs=20, seed=3)
    b, _ = data.synthetic(bank=4000, dim=32, context_len=4, article_len=16, pairs=100,
                          eval_pairs=20, seed=3)
    c, _ = data.synthetic(bank=4000, dim=32, context_len=4, article_len=16, pairs=100,
                          eval_pairs=20, seed=4)
    assert torch.equal(a.bank, b.bank) and torch.equal(a.train.targets, b.train.targets)
    assert not torch.equal(a.bank, c.bank)
    rows, targets = a.train.context_rows, a.train.targets
    assert torch.equal(rows, targets[:, None] + torch.arange(-4, 0))
    assert bool((rows // 16 == targets[:, None] // 16).all())  # same article
    assert not set(a.train.targets.tolist()) & set(a.held_out.targets.tolist())
    assert torch.allclose(a.bank.norm(dim=1), torch.ones(4000), atol=1e-5)


def test_the_synthetic_next_chunk_is_predictable():
    """The oracle (noiseless next direction) finds its target among 4000 far above chance: the
    structure a query tower can learn is really there."""
    corpus, oracle = data.synthetic(bank=4000, dim=32, context_len=4, article_len=16, pairs=500,
                                    eval_pairs=0, seed=0, oracle=True)
    rank1 = (oracle @ corpus.bank.T).argmax(dim=1)
    assert (rank1 == corpus.train.targets).float().mean() > 0.5
    last = corpus.bank[corpus.train.context_rows[:, -1]]
    assert ((last @ corpus.bank.T).argmax(dim=1) == corpus.train.targets).float().mean() < 0.05


def write_files(tmp_path, contexts, targets, vectors):
    pairs, bank = tmp_path / "pairs.npz", tmp_path / "bank.npz"
    np.savez(pairs, contexts=contexts, targets=targets)
    np.savez(bank, vectors=vectors)
    return str(pairs), str(bank)


def test_user_files_are_checked_with_the_file_and_key_named(tmp_path):
    vectors = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    pairs, bank = write_files(tmp_path, np.zeros((20, 3, 8), np.float32), np.arange(20), vectors)
    loaded = data.from_files(pairs_file=pairs, bank_file=bank, eval_pairs=5, seed=0)
    assert len(loaded.train) == 15 and len(loaded.held_out) == 5
    assert loaded.train.contexts(torch.arange(2), loaded.bank).shape == (2, 3, 8)

    pairs, _ = write_files(tmp_path, np.zeros((20, 3, 8), np.float32), np.arange(20) + 40, vectors)
    with pytest.raises(ConfigError) as caught:
        data.from_files(pairs_file=pairs, bank_file=bank, eval_pairs=5, seed=0)
    assert caught.value.line() == f"{pairs}: targets: ranges over 40..59, expected rows of the bank, 0..49"

    pairs, _ = write_files(tmp_path, np.zeros((20, 3, 6), np.float32), np.arange(20), vectors)
    with pytest.raises(ConfigError, match="contexts: has vectors of size 6, expected 8"):
        data.from_files(pairs_file=pairs, bank_file=bank, eval_pairs=5, seed=0)

    np.savez(tmp_path / "bank.npz", embeddings=vectors)
    with pytest.raises(ConfigError, match=r"bank.npz: vectors: missing; the file has \['embeddings'\]"):
        data.from_files(pairs_file=pairs, bank_file=bank, eval_pairs=5, seed=0)
    np.savez(tmp_path / "bank.npz", vectors=vectors)
    with pytest.raises(ConfigError) as caught:
        data.from_files(pairs_file=str(tmp_path / "nope.npz"), bank_file=bank, eval_pairs=5, seed=0)
    assert caught.value.line().startswith("params.pairs_file: ") and "does not exist" in str(caught.value)


# ---------------------------------------------------------------- mining


class LastVector(torch.nn.Module):
    """A 'query tower' that returns the last context vector: its positive is its top-1."""

    def forward(self, contexts):
        return torch.nn.functional.normalize(contexts[:, -1], dim=-1)


@pytest.mark.parametrize("index", ["flat", "ivf", "hnsw"])
def test_mined_negatives_never_include_the_positive(tmp_path, index):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3000, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    targets = rng.choice(3000, 600, replace=False)
    contexts = np.stack([rng.standard_normal((600, 16)), rng.standard_normal((600, 16)),
                         vectors[targets]], axis=1).astype(np.float32)
    pairs, bank = write_files(tmp_path, contexts, targets, vectors)
    params = Params(pairs_file=pairs, bank_file=bank, eval_pairs=100, schedule="0:faiss@12",
                    index=index, ivf_lists=16, ivf_probe=4, eval_k=10)
    workload = TwoTowerWorkload(params, seed=0)
    events = []
    kinds = []
    workload.prepare_epoch(LastVector(), 0, torch.device("cpu"),
                           lambda t, **f: (kinds.append(t), events.append(f)))
    assert kinds == ["mining_started", "mining"]   # the screens say a pass is under way
    events = events[1:]
    negatives, train_targets = workload.negatives, workload.data.train.targets
    assert negatives.shape == (500, 12)
    assert not bool((negatives == train_targets[:, None]).any())
    (event,) = events
    # the positive was every query's nearest row, so it really had to be dropped
    assert event["positive_in_top"] > 0.95 and event["mode"] == "faiss@12"
    assert event["exact"] == (index == "flat") and 0.0 < event["recall_vs_exact"] <= 1.0
    assert event["mining_s"] >= event["search_s"] > 0 and "index_build_s" in event
    # batches carry the mined rows: the positive's vector is never among a pair's negatives
    _, batch_targets, positives, hard = workload.batch(torch.arange(8), torch.device("cpu"))
    assert hard.shape == (8, 12, 16)
    assert not bool(torch.isclose(hard, positives[:, None]).all(dim=2).any())


def test_exclusion_fills_short_rows_without_the_positive():
    rows = np.array([[5, 7, 9], [-1, 3, -1], [4, -1, -1]])
    targets = np.array([7, 3, 2])
    negatives, found, filled = mining.exclude_positive(rows, targets, 2, 10, np.random.default_rng(0))
    assert negatives[0].tolist() == [5, 9]           # rank order kept, positive dropped
    assert found == 2 and filled == 3                # row 1: nothing usable, row 2: one short
    assert negatives[2, 0] == 4
    assert not (negatives == targets[:, None]).any() and ((negatives >= 0) & (negatives < 10)).all()


def test_faiss_gets_torch_s_thread_count_and_one_thread_on_macos(monkeypatch):
    faiss = mining.import_faiss()
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert mining.coordinate_threads(faiss, 0) == 1 and faiss.omp_get_max_threads() == 1
        assert mining.coordinate_threads(faiss, 2) == 2 and faiss.omp_get_max_threads() == 2
        monkeypatch.setattr(sys, "platform", "darwin")
        torch.set_num_threads(2)
        assert mining.coordinate_threads(faiss, 0) == 1
        monkeypatch.delenv("KMP_DUPLICATE_LIB_OK", raising=False)
        mining.import_faiss()
        import os
        assert os.environ["KMP_DUPLICATE_LIB_OK"] == "TRUE"
        monkeypatch.setenv("KMP_DUPLICATE_LIB_OK", "FALSE")
        mining.import_faiss()
        assert os.environ["KMP_DUPLICATE_LIB_OK"] == "FALSE"  # the user's choice stands
    finally:
        torch.set_num_threads(before)
        faiss.omp_set_num_threads(before)


# ---------------------------------------------------------------- training


def test_a_tiny_run_mines_by_schedule_and_recall_rises_far_above_chance(home):
    run = RunDir.create(runconfig.resolve("twotower-small", "cpu", TINY))
    config = run.config()
    trainer = Trainer(run, EventWriter(run.events_path, attempt=1), "cpu", config.device)

    untrained = trainer.workload.evaluate(trainer.model.eval(), torch.device("cpu"))
    assert untrained["recall@20"] < 5 * CHANCE
    trainer.model.train()

    assert trainer.fit() == "finished"
    events = run.events()
    mined = [e for e in events if e["type"] == "mining"]
    assert [(e["epoch"], e["mode"]) for e in mined] == [(0, "none"), (1, "faiss@8")]
    assert mined[1]["index"] == "ivf16,probe4" and mined[1]["recall_sample"] == 1000
    assert 0.5 < mined[1]["recall_vs_exact"] <= 1.0
    (evaluation,) = [e for e in events if e["type"] == "eval"]
    recall = evaluation["metrics"]["recall@20"]
    assert recall > 0.5 and recall > 100 * CHANCE, evaluation["metrics"]

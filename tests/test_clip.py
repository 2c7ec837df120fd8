"""The clip workload: drawn pictures match their captions, a tiny CLIP learns well past chance,
and the clip-m1 preset is note 004's 76M-parameter model."""

from __future__ import annotations

import pytest
import torch

from engine import presets, runconfig
from engine.errors import ConfigError
from engine.record.events import EventWriter
from engine.record.rundir import RunDir
from engine.train.trainer import Trainer
from engine.workloads import build
from engine.workloads.clip.params import COLOURS, SHAPES
from engine.workloads.clip.workload import COLS, RGB, ROWS

# 3 shapes x 3 colours x 4 places x 1 size = 36 captions: chance top-1 is 1/36.
FAST = ["params.shapes=3", "params.colours=3", "params.samples=2048", "params.eval_samples=256",
        "train.epochs=2.5", "batch_size=32", "accumulation=1", "threads=1",
        "checkpoint_every_minutes=0"]
# A step event's loss is its window's mean, and how many steps a window holds depends on the
# machine's speed: one step per window makes the first and last losses the same on any machine.
EVERY_STEP = "train.report_every_s=1e-9"


def tiny_workload(*overrides: str):
    config = runconfig.resolve("clip-tiny", "cpu", list(overrides))
    return build("clip", config.workload.params, config.workload.train.seed), config.workload.params


def test_a_tiny_clip_learns_image_to_text_well_past_chance(home):
    run = RunDir.create(runconfig.resolve("clip-tiny", "cpu", [*FAST, EVERY_STEP]))
    config = run.config()
    trainer = Trainer(run, EventWriter(run.events_path, attempt=1), "cpu", config.device)
    assert trainer.fit() == "finished"
    events = run.events()
    losses = [e["loss"] for e in events if e["type"] == "step"]
    (evaluation,) = [e["metrics"] for e in events if e["type"] == "eval"]
    assert evaluation["chance_top1"] == pytest.approx(1 / 36)
    # Measured 0.20 top-1 (0.76 top-5) after 160 steps, and a loss from 3.66 down to 1.88.
    assert evaluation["i2t_top1"] > 5 * evaluation["chance_top1"]
    assert evaluation["i2t_top5"] > 0.5
    assert len(losses) == 160
    last = sum(losses[-16:]) / 16
    assert last < 0.6 * losses[0], (losses[0], last)  # starts near ln(32), the batch size


def test_each_picture_shows_what_its_caption_says(home):
    workload, params = tiny_workload("params.image_size=32", "params.patch=4", "params.grid=3",
                                     "params.colours=8", "params.shapes=6", "params.sizes=2")
    images, tokens, combo = workload.batch(torch.arange(64), torch.device("cpu"))
    assert images.shape == (64, 3, 32, 32) and tokens.shape == (64, 7)
    pixels = images * 0.3 + 0.45  # undo the normalisation
    for i in range(64):
        words = workload.captions[int(combo[i])].split()
        _, size, colour, shape, _, row, col = words
        assert shape in SHAPES and colour in COLOURS
        # The shape is where the brightness stands out from the dark textured background.
        fg = (pixels[i].max(dim=0).values > 0.35)
        assert fg.sum() >= (6 if size == "small" else 20), words
        ys, xs = fg.nonzero(as_tuple=True)
        cell = 32 / 3
        assert int(ys.float().mean() // cell) == ROWS[3].index(row), words
        assert int(xs.float().mean() // cell) == COLS[3].index(col), words
        # Its colour, read where it is solid (edges are blended with the background).
        brightness = pixels[i].max(dim=0).values
        mean_colour = pixels[i][:, brightness >= 0.9 * brightness.max()].mean(dim=1)
        nearest = min(RGB, key=lambda c: float(((torch.tensor(RGB[c]) - mean_colour) ** 2).sum()))
        assert nearest == colour, words


def test_a_sample_index_always_draws_the_same_picture(home):
    workload, _ = tiny_workload()
    cpu = torch.device("cpu")
    alone, _, _ = workload.batch(torch.tensor([5]), cpu)
    among, _, _ = workload.batch(torch.tensor([9, 5, 2]), cpu)
    assert torch.equal(alone[0], among[1])  # resume by sample index depends on this
    again, _ = tiny_workload()
    assert torch.equal(again.batch(torch.tensor([5]), cpu)[0], alone)


def test_gradient_checkpointing_gives_the_same_gradients(home):
    workload, _ = tiny_workload()
    grads = []
    for flag in (False, True):
        torch.manual_seed(0)
        model = workload.build_model(grad_checkpointing=flag)
        workload.loss(model, workload.batch(torch.arange(16), torch.device("cpu"))).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_clip_m1_is_note_004s_76m_parameter_model(home):
    preset = presets.load_workload("clip-m1")
    workload = build("clip", preset.params, 0)
    with torch.device("meta"):  # counts parameters without allocating or training them
        model = workload.build_model(grad_checkpointing=False)
    count = sum(p.numel() for p in model.parameters())
    assert 75_000_000 < count < 78_000_000, count  # the note: 76.7M
    assert preset.params.captions == 864 and preset.train.epochs == 15  # the note ran 15 epochs


def test_bad_clip_params_name_the_key(home):
    with pytest.raises(ConfigError, match=r"params\.patch: got 5, expected a divisor of image_size \(16\)"):
        runconfig.resolve("clip-tiny", "cpu", ["params.patch=5"])
    with pytest.raises(ConfigError, match=r"params\.shapes: got 7, expected a positive integer up to 6"):
        runconfig.resolve("clip-tiny", "cpu", ["params.shapes=7"])

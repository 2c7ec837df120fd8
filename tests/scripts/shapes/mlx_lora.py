"""mlx-lm's LoRA fine-tune (`python -m mlx_lm lora`), unchanged, run in-process on the tiny Llama
of examples/mlx/tiny_model.py (built into DIR/tiny on the first attempt), with steps of a Mac's
pace: each iteration takes at least --step_s (a sleep inside mlx-lm's own timed step, so its
`tok/s` column counts it; its evaluations keep this machine's pace). Its live output as mlx-lm draws it: a table row every
--steps-per-report iterations, its Rich bar redrawn under it (the frame drawn with a row is the
one rendered before that row's step: `24/60` after the row for 25). Its adapters every
--save-every iterations; `--resume-adapter-file DIR/adapters/000000N_adapters.safetensors`
goes on for the iterations left, counting from 1 again as mlx-lm does. Every example is longer
than --max-seq-length, so a step is batch x (max-seq-length - 1) tokens (4 x 25 = 100: the
`tokens` column's 0.1k is exact). Writes what it did to OUT/truth.json (shapetruth), watching
mlx-lm's own bar, rows and saves.

    python mlx_lora.py --out DIR --iters 10 --batch-size 4 --step_s 2.5
"""

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

from shapetruth import Truth

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "examples" / "mlx"))

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--iters", type=int, default=10)
p.add_argument("--batch-size", type=int, default=4)
p.add_argument("--grad-accumulation-steps", type=int, default=1)
p.add_argument("--max-seq-length", type=int, default=26)
p.add_argument("--steps-per-report", type=int, default=2)
p.add_argument("--save-every", type=int, default=4)
p.add_argument("--step_s", type=float, default=2.5)
p.add_argument("--resume-adapter-file")
args = p.parse_args()

import mlx_lm.cli_ui as cli_ui          # noqa: E402  (after the argv: a bad one fails fast)
import mlx_lm.tuner.trainer as trainer  # noqa: E402
from mlx_lm import lora                 # noqa: E402

out = Path(args.out)
tiny = out / "tiny"
if not (tiny / "model" / "config.json").exists():
    import tiny_model

    (tiny / "model").mkdir(parents=True, exist_ok=True)
    (tiny / "data").mkdir(parents=True, exist_ok=True)
    texts = tiny_model.corpus()
    tiny_model.model(tiny / "model", tiny_model.tokenizer(texts, tiny / "model"))
    # each example long enough to be cut at --max-seq-length: every step the same tokens
    long = [" ".join([t] * 8) for t in texts]
    tiny_model.data(long, tiny / "data")
    # two batches of validation, no more: mlx-lm measures every example's length before an
    # evaluation, and a pause of seconds at the last iteration is time no ETA can foresee
    valid = tiny / "data" / "valid.jsonl"
    valid.write_text("".join(valid.read_text().splitlines(keepends=True)[:8]))

done = 0
if args.resume_adapter_file:
    # its name says the iteration of the attempt that wrote it (mlx-lm counts from 1 again
    # after a resume): the run's step is the one the truth wrote down for its newest write
    written = json.loads((out / "truth.json").read_text())["attempts"]
    done = [c["step"] for a in written for c in a["checkpoints"]
            if c["path"] == os.path.abspath(args.resume_adapter_file)][-1]
tokens_per_step = args.batch_size * (args.max_seq_length - 1)
truth = Truth(str(out), "mlx_lora", total=args.iters, samples_per_step=args.batch_size,
              tokens_per_step=tokens_per_step, first_index=1, resumed_from=done,
              eval_name="val_loss")

ui_advance, ui_train, ui_val, ui_save = (cli_ui.TrainUI.advance, cli_ui.TrainUI.report_train,
                                         cli_ui.TrainUI.report_val, cli_ui.TrainUI.report_save)
reached = [done]


def advance(ui):
    with truth.shown(reached[0] + 1):
        reached[0] += 1
        ui_advance(ui)


def report_train(ui, it, train_loss, tokens_sec, trained_tokens):
    with truth.shown(loss=float(f"{train_loss:.3f}")):   # as its row prints it
        ui_train(ui, it, train_loss, tokens_sec, trained_tokens)


def report_val(ui, it, val_loss, val_time):
    with truth.shown(eval=float(f"{val_loss:.3f}")):
        ui_val(ui, it, val_loss, val_time)


def report_save(ui, checkpoint):
    truth.checkpoint(str(checkpoint), done + int(re.match(r"(\d+)_adapters", Path(checkpoint).name)[1]))
    ui_save(ui, checkpoint)


clear_cache, evaluate = trainer._clear_cache, trainer.evaluate
evaluating = [False]


def paced(threshold):
    """Inside mlx-lm's timed step (between its tic and train_time): the step of a slower machine.
    Its evaluations keep this machine's pace: a pause at the last iteration no ETA foresees."""
    if not evaluating[0]:
        time.sleep(args.step_s)
    clear_cache(threshold)


def unpaced(*a, **k):
    evaluating[0] = True
    try:
        return evaluate(*a, **k)
    finally:
        evaluating[0] = False


cli_ui.TrainUI.advance, cli_ui.TrainUI.report_train = advance, report_train
cli_ui.TrainUI.report_val, cli_ui.TrainUI.report_save = report_val, report_save
trainer._clear_cache, trainer.evaluate = paced, unpaced

adapters = out / "adapters"
sys.argv = ["mlx_lm.lora", "--model", str(tiny / "model"), "--train", "--data", str(tiny / "data"),
            "--iters", str(args.iters - done), "--batch-size", str(args.batch_size),
            "--grad-accumulation-steps", str(args.grad_accumulation_steps),
            "--max-seq-length", str(args.max_seq_length), "--steps-per-report", str(args.steps_per_report),
            "--steps-per-eval", str(args.iters), "--save-every", str(args.save_every),
            "--val-batches", "2", "--learning-rate", "1e-3", "--adapter-path", str(adapters),
            *(["--resume-adapter-file", args.resume_adapter_file] if args.resume_adapter_file else [])]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
lora.main()
truth.finished()

"""A tiny Llama for mlx-lm, built here: no download, no Hugging Face account.

    python examples/mlx/tiny_model.py DIR        # DIR/model (config, weights, tokenizer)
                                                 # and DIR/data (train/valid/test.jsonl)

The model is 16 layers (as many as mlx-lm fine-tunes by default) of width 64 with random weights, and a byte-level BPE tokenizer
trained on text in this checkout (the README, the docs, the field notes: whatever .md files it
finds). It learns nothing worth keeping; it makes `python -m mlx_lm lora` train for real in
seconds on a laptop's CPU, which is what the README's MLX section and cockpit's tests need.
Needs mlx and mlx-lm (`pip install "mlx[cpu]" mlx-lm` on Linux, `pip install mlx-lm` on a Mac).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 16, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": True, "max_position_embeddings": 256,
}
VOCAB = 512


def corpus() -> list[str]:
    """Paragraphs of prose from this checkout's markdown (the source of the tokenizer and data)."""
    paragraphs = []
    for path in sorted([*ROOT.glob("*.md"), *ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/**/*.md")]):
        for block in path.read_text(errors="replace").split("\n\n"):
            text = " ".join(block.split())
            if 40 <= len(text) <= 400 and not text.startswith(("```", "|", "<")):
                paragraphs.append(text)
    if len(paragraphs) < 64:  # a checkout without its docs still gives a corpus
        words = "the run crashed on the device and resumed from its checkpoint on the next preset".split()
        rng = random.Random(0)
        paragraphs += [" ".join(rng.choice(words) for _ in range(30)) for _ in range(256)]
    return paragraphs


def tokenizer(texts: list[str], out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(out)
    return bpe.get_vocab_size()


def model(out: Path, vocab: int) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    config = {**CONFIG, "vocab_size": vocab}
    mx.random.seed(0)
    weights = dict(tree_flatten(llama.Model(llama.ModelArgs.from_dict(config)).parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=1))


def data(texts: list[str], out: Path) -> None:
    rng = random.Random(0)
    texts = texts[:]
    rng.shuffle(texts)
    cut = max(8, len(texts) // 10)
    for name, rows in (("valid", texts[:cut]), ("test", texts[cut:2 * cut]), ("train", texts[2 * cut:])):
        (out / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in rows))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="where to write model/ and data/")
    args = parser.parse_args(argv)
    import importlib.util

    if importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx_lm") is None:
        print('tiny_model: needs mlx and mlx-lm: pip install "mlx[cpu]" mlx-lm (Linux) or mlx-lm (Mac)',
              file=sys.stderr)
        return 2
    texts = corpus()
    (args.dir / "model").mkdir(parents=True, exist_ok=True)
    (args.dir / "data").mkdir(parents=True, exist_ok=True)
    model(args.dir / "model", tokenizer(texts, args.dir / "model"))
    data(texts, args.dir / "data")
    print(f"tiny_model: {args.dir / 'model'} (Llama, 16 layers, vocab {VOCAB}) and {args.dir / 'data'} "
          f"({len(texts)} paragraphs)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

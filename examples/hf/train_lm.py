"""A tiny causal language model trained with Hugging Face's Trainer: the shape of run_clm.py.

The model is a Llama built from a config with random weights and a byte-level vocabulary, so
nothing is downloaded; it trains on a local text file (this repository's README by default).
Every flag of TrainingArguments works (--per_device_train_batch_size, --bf16, --use_cpu,
--max_steps, --save_steps, --eval_steps, --resume_from_checkpoint, ...), plus the few below.
`--lora` trains LoRA adapters through peft on the frozen model instead of all of it.

On its own:
    python examples/hf/train_lm.py --output_dir /tmp/lm --max_steps 200

Under cockpit (the device preset fills batch, accumulation, precision and device):
    cockpit run -d cpu -- python examples/hf/train_lm.py --output_dir {run_dir}/out \\
        --per_device_train_batch_size {batch_size} --gradient_accumulation_steps {accumulation} \\
        {hf_precision_flag} {hf_device_flag} --max_steps 200

`CockpitCallback` reports steps, evaluations and checkpoints to cockpit and does nothing
outside it; `--no_callback` leaves it out (cockpit then reads the Trainer's output).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer,
                          TrainingArguments)

README = Path(__file__).resolve().parents[2] / "README.md"


@dataclass
class ScriptArguments:
    text_file: str = field(default=str(README), metadata={"help": "the text to learn"})
    block_size: int = field(default=64, metadata={"help": "bytes per training sequence"})
    hidden: int = field(default=64, metadata={"help": "model width"})
    layers: int = field(default=2, metadata={"help": "transformer layers"})
    heads: int = field(default=4, metadata={"help": "attention heads"})
    lora: bool = field(default=False, metadata={"help": "train LoRA adapters (peft) only"})
    callback: bool = field(default=True, metadata={"help": "report to cockpit (--no_callback: don't)"})
    seed_model: int = field(default=0, metadata={"help": "seed of the initial weights"})


class Blocks(torch.utils.data.Dataset):
    """Consecutive byte blocks of a text, as causal-LM examples (the model shifts the labels)."""

    def __init__(self, data: bytes, block: int):
        usable = len(data) // block * block
        self.ids = torch.tensor(list(data[:usable]), dtype=torch.long).view(-1, block)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build_model(script: ScriptArguments) -> torch.nn.Module:
    torch.manual_seed(script.seed_model)
    config = LlamaConfig(vocab_size=256, hidden_size=script.hidden,
                         intermediate_size=4 * script.hidden, num_hidden_layers=script.layers,
                         num_attention_heads=script.heads, num_key_value_heads=script.heads,
                         max_position_embeddings=script.block_size)
    model = LlamaForCausalLM(config)
    if script.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                 target_modules=["q_proj", "v_proj"],
                                                 task_type="CAUSAL_LM"))
    return model


def main() -> None:
    script, args = HfArgumentParser((ScriptArguments, TrainingArguments)).parse_args_into_dataclasses()
    data = Path(script.text_file).read_bytes()
    split = len(data) * 9 // 10
    callbacks = []
    if script.callback:
        from cockpit.integrations.transformers import CockpitCallback

        callbacks.append(CockpitCallback())
    trainer = Trainer(model=build_model(script), args=args,
                      train_dataset=Blocks(data[:split], script.block_size),
                      eval_dataset=Blocks(data[split:], script.block_size), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
    print(f"done: step {trainer.state.global_step} eval_loss {trainer.evaluate()['eval_loss']:.4f}")


if __name__ == "__main__":
    main()

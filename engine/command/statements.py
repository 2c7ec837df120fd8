"""What a command's own words state about its training: the total, epochs, accumulation.

A script says how long it trains and how many micro-batches make an optimizer step in its
argv (``--max_iters=200``, ``--num_train_epochs 3``, ``trainer.max_steps=300``) and in what
it prints (engine.command.progress reads those lines). This module holds the names both
read, and reads the argv. Torch-free, stdlib only.

Fact keys (the contract of issue 26): ``total`` (optimizer steps in the run), ``epochs``,
``accumulation`` (micro-batches per optimizer step); progress.py adds ``samples_per_step``
and ``tokens_per_step`` from printed lines, which an argv does not state alone.
"""

from __future__ import annotations

import re

# Names as normalised by `normalise`: lowercase, dashes to underscores, a dotted prefix
# (hydra's `trainer.max_steps`) dropped.
TOTAL_NAMES = frozenset(
    "max_iters max_iter max_iterations max_steps max_train_steps num_train_steps "
    "num_training_steps total_steps total_iters train_steps training_steps num_steps "
    "num_iters num_iterations n_steps n_iters steps iters max_update max_updates".split())
EPOCH_NAMES = frozenset(
    "epochs num_epochs num_train_epochs max_epochs max_epoch n_epochs nepochs "
    "train_epochs".split())
ACCUMULATION_NAMES = frozenset(
    "gradient_accumulation_steps gradient_accumulation grad_accum grad_accum_steps "
    "grad_accumulation_steps grad_acc grad_acc_steps accumulation accumulation_steps "
    "accum accum_steps accum_iter accumulate_grad_batches".split())

_FACT_OF = {**{n: "total" for n in TOTAL_NAMES}, **{n: "epochs" for n in EPOCH_NAMES},
            **{n: "accumulation" for n in ACCUMULATION_NAMES}}

# `200`, `600_000`, `3.0` (HF's examples write `--num_train_epochs 3.0`): a whole number
# as written, never an expression; a sign is not allowed, as -1 means "unset" (HF's max_steps).
_WHOLE = re.compile(r"(?P<digits>\d+(?:_\d+)*)(?:\.0+)?")


def normalise(name: str) -> str:
    """`--Max-Steps` -> `max_steps`; `+trainer.max_steps` -> `max_steps`."""
    name = name.strip().lstrip("-+").lower().replace("-", "_")
    return name.rsplit(".", 1)[-1]


def fact_of(name: str) -> str | None:
    """The fact key a setting's name states (`max_iters` -> "total"), else None."""
    return _FACT_OF.get(normalise(name))


def is_setting(name: str) -> bool:
    """Whether a name is a setting of the run (how long, how big a batch), which is never a
    metric: max_*, num_*, *_steps, *_iters, *_epochs, batch sizes, accumulation names
    (`num_input_tokens_seen`, a count of what the run has done, is not one)."""
    name = normalise(name)
    if name.endswith("_seen"):  # HF's num_input_tokens_seen: a count of the run, not a setting
        return False
    return (name in _FACT_OF or name.startswith(("max_", "num_"))
            or name.endswith(("_steps", "_iters", "_epochs", "_batches"))
            or name == "batch_size" or name.endswith("_batch_size"))


def is_timing(name: str) -> bool:
    """Whether a name is a figure of a run's speed that a framework logs beside its metrics
    (HF's eval_runtime, train_samples_per_second, total_flos), never a metric of the model."""
    name = normalise(name)
    return name == "total_flos" or name.endswith(("runtime", "_per_second"))


def whole_number(text: str) -> int | None:
    """A positive whole number as written (`200`, `600_000`, `3.0`), else None."""
    m = _WHOLE.fullmatch(str(text).strip())
    if not m:
        return None
    value = int(m["digits"].replace("_", ""))
    return value if value > 0 else None


def from_argv(argv: list[str]) -> dict[str, tuple[int, str]]:
    """The facts an argv (placeholders already filled) states, each with the words it came
    from: `["train.py", "--max_iters=200"]` -> `{"total": (200, "--max_iters=200")}`.

    Forms: `--name=value`, `--name value`, and `name=value` (nanoGPT's configurator, hydra's
    overrides, dotted or not). A later statement of a fact wins, as argparse's does. Never
    raises."""
    found: dict[str, tuple[int, str]] = {}
    try:
        words = [str(w) for w in argv]
    except Exception:
        return found
    for i, word in enumerate(words):
        if "=" in word:
            name, _, text = word.partition("=")
            said = word
        elif word.startswith("-") and i + 1 < len(words):
            name, text = word, words[i + 1]
            said = f"{word} {text}"
        else:
            continue
        if not name.strip("-+"):
            continue
        key = fact_of(name)
        value = whole_number(text) if key else None
        if key and value is not None:
            found[key] = (value, said)
    return found
